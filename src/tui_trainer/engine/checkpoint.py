"""Checkpoints: one plain dict of state, written atomically, read with weights_only=True.

A checkpoint holds everything needed to continue bit-for-bit: model, optimizer, scheduler,
GradScaler, the position (epoch, batches consumed in it, optimizer steps), and the RNG states
of torch, CUDA, numpy, Python and the loader's generator, both now and at the start of the
current epoch (the data iterator is rebuilt from the latter and fast-forwarded).
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from ..core.errors import CheckpointError

FORMAT = "tui-trainer-checkpoint"
VERSION = 1
REQUIRED = ("format", "version", "config", "step", "epoch", "batch_in_epoch", "model",
            "optimizer", "scheduler", "scaler", "rng", "rng_epoch_start", "rng_first_epoch",
            "elapsed", "samples_seen")


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Writes to a temporary file beside `path`, syncs it, then renames it into place: a
    crash at any moment leaves either the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save({"format": FORMAT, "version": VERSION, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Reads and checks a checkpoint. weights_only=True: the unpickler accepts tensors and
    plain containers only, so a file from elsewhere can never run code."""
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"checkpoint {p} does not exist")
    corrupt = f"checkpoint {p} is truncated or corrupt and cannot be read"
    if not zipfile.is_zipfile(p):
        # torch.save always writes a zip archive; a cut-off file loses its central directory.
        raise CheckpointError(f"{corrupt} (not a complete torch.save archive)")
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        text = str(e)
        if "global" in text.lower():
            found = next((line.strip() for line in text.splitlines()
                          if "global" in line.lower()), "")
            raise CheckpointError(
                f"checkpoint {p} was refused: it holds objects other than tensors and plain "
                f"data, which could run code when loaded, so nothing of it was loaded ({found})"
            ) from None
        raise CheckpointError(f"{corrupt} ({_first_line(e)})") from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile, KeyError) as e:
        raise CheckpointError(f"{corrupt} ({_first_line(e)})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = f"a dict with keys {sorted(map(str, state))[:6]}" if isinstance(state, dict) \
            else f"a {type(state).__name__}"
        raise CheckpointError(f"{p} is not a tui-trainer checkpoint (it holds {found})")
    if not isinstance(state.get("version"), int) or state["version"] > VERSION:
        raise CheckpointError(f"checkpoint {p} has format version {state.get('version')!r}; "
                              f"this tui-trainer reads version {VERSION} and older")
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        raise CheckpointError(f"checkpoint {p} is incomplete: it lacks {', '.join(missing)}")
    return state


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
