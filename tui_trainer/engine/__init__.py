"""The engine layer: the training process. Imports torch, never textual."""

import os

from ..core.session import paths

# Importing torchvision makes torch create its inductor cache folder (torch.compile's kernels)
# in the shared temporary folder, /tmp/torchinductor_<user>, where it stays. Ours goes to the
# user's cache (TUI_TRAINER_HOME/cache under a scratch home) unless the user chose one.
# Set before any engine module imports torch or torchvision.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(paths.cache_dir() / "torchinductor"))
