"""Where a run's data come from, made ready on disk, without torch or torchvision.

Which dataset a run trains on (`dataset = auto` falls back to the shipped sample where full
MNIST is neither on disk nor downloadable) and its IDX files unpacked where torchvision's
dataset classes read them. `engine.data` loads them from there; a data-parallel run's
process checks and prepares them once before its ranks start (lifecycle.preflight), and
imports torchvision only where full MNIST must be downloaded first.
"""

from __future__ import annotations

import gzip
import os
import shutil
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterator

from . import user_data
from .config import ConfigError, is_folder_dataset
from ..errors import DiskFull, is_disk_full
from .machine import (IDX_FILES, ON_DISK, data_root, fashion_missing, fashion_source,
                      folder_missing, folder_root, mnist_missing, mnist_on_disk, offline,
                      on_disk_missing)


class DataUnavailable(ConfigError):
    """The dataset asked for is not on disk and cannot be fetched."""


def sample_gz_dir() -> Path:
    """The shipped sample's four IDX .gz files."""
    return Path(str(resources.files("tui_trainer") / "assets" / "mnist-sample"))


def extract_idx(gz_dir: Path, raw_dir: Path) -> None:
    """Decompresses the four IDX .gz files into raw_dir, where torchvision reads them.
    Each file is written beside its target and moved into place, so runs starting at the
    same moment never read half a file."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    for name in IDX_FILES:
        target = raw_dir / name
        if target.exists():
            continue
        tmp = raw_dir / f".{name}.{os.getpid()}.tmp"
        with gzip.open(gz_dir / f"{name}.gz", "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(tmp, target)


def prepare(config: dict[str, Any], download: Callable[[Path], bool] | None = None
            ) -> tuple[str, Path, str] | None:
    """The run's dataset made ready on disk: (its name, the folder torchvision reads it
    from, a note on why `auto` fell back to the sample, or ""). Full MNIST missing from
    data_dir is fetched with `download` (which says whether it could) where the machine is
    online; without `download`, None is returned there instead (the caller leaves the
    download to engine.data). A data_dir that cannot be used (a file, a name too long, no
    permission, a full disk) and data that cannot be had are refused naming the key."""
    with refusing(config) as (root, key):
        if root.exists() and not root.is_dir():
            raise ConfigError(key, f"{root} is a file, not a folder; give a folder for the "
                              "datasets (empty means the user's cache folder)")
        return _prepare(config, root, download)


@contextmanager
def refusing(config: dict[str, Any]) -> Iterator[tuple[Path, str]]:
    """The run's data folder and the key that names it (data_root); an OSError while it is
    used becomes a refusal naming that key (a full disk: DiskFull, naming the path)."""
    root, key = data_root(config)
    try:
        yield root, key
    except OSError as e:
        if is_disk_full(e):
            raise DiskFull(e.filename or root) from None
        what = e.strerror or type(e).__name__
        where = f" ({e.filename})" if e.filename and str(e.filename) != str(root) else ""
        raise ConfigError(key, f"{str(root)[:120]} cannot be used: {what}{where}; give a "
                          "folder that can be created and written") from None


def _prepare(config: dict[str, Any], root: Path, download: Callable[[Path], bool] | None
             ) -> tuple[str, Path, str] | None:
    name = str(config.get("dataset", "auto"))
    fallback = ""
    if is_folder_dataset(name):         # the user's own images: read where they are
        folder = folder_root(name)
        if not folder.is_dir():
            raise DataUnavailable("dataset", folder_missing(folder))
        user_data.check(folder)         # named by this user, not only by a session
        return "folder", folder, ""
    if name in ON_DISK:             # torchvision's layout, in data_dir: never downloaded
        why = on_disk_missing(name, root)
        if why is not None:
            raise DataUnavailable("dataset", why)
        return name, root, ""
    if name in ("auto", "mnist"):
        if mnist_on_disk(root):
            raw = root / "MNIST" / "raw"
            if not all((raw / n).exists() for n in IDX_FILES):
                extract_idx(raw, raw)
            name = "mnist"
        elif download is None and not offline():
            return None                     # a download first: engine.data does it
        elif download is not None and download(root):
            name = "mnist"
        elif name == "mnist":
            raise DataUnavailable("dataset", mnist_missing(root))
        else:
            name = "mnist-sample"
            fallback = (f" (dataset = auto: full MNIST is not in {root / 'MNIST' / 'raw'} and "
                        "could not be downloaded)")
    if name == "mnist-sample":
        root = root / "mnist-sample"
        extract_idx(sample_gz_dir(), root / "MNIST" / "raw")
    elif name == "fashion-mnist":
        raw = root / "FashionMNIST" / "raw"
        source = fashion_source(root)
        if source is None:
            raise DataUnavailable("dataset", fashion_missing(root))
        if source != raw:
            extract_idx(source, raw)
    elif name == "synthetic":
        root = Path("-")
    return name, root, fallback
