"""A folder of the user's own images (`dataset = "folder:PATH"`) named by a session is read
only where this user named that folder on this machine.

A session is data and may come from someone else; the folder it names lies outside it, on
this machine. Training on it, replaying a run of it or drawing one of its images in the
Model tab would read this user's files, and could keep class names or an image of them in
the session, which may be shared back. So a folder is read only once this user has named
it: on the command line or in a TOML file given there, in the dashboard's form (Start, a
study), or with `tui-trainer trust FOLDER`. What is named lives in the user's config
folder (core.session.paths.config_dir), by the folder's resolved path, never in the
session. A session's folder that was never named here is refused in one line that says how
to name it, before anything is read (engine/data.py, and the dashboard's keys before a
process starts).

Core layer: imports neither torch nor textual.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .config import ConfigError, is_folder_dataset
from .machine import folder_root
from .user_models import load_store, save_store
from ..text import shown

TRUST_FILE = "trusted-folders.json"


def named() -> dict[str, dict[str, Any]]:
    """{resolved path: {"at"}} of every folder this user named (read as untrusted)."""
    return {k: v for k, v in load_store(TRUST_FILE).items()
            if isinstance(k, str) and k.startswith("/") and isinstance(v, dict)}


def name(root: Path) -> None:
    """This user names the folder `root` (resolved): its images may be read."""
    known = named()
    known[str(root)] = {"at": time.time()}
    save_store(TRUST_FILE, known)


def refusal(root: Path) -> str:
    return (f"{shown(root, 200)} was named by a session, not by you on this machine: its "
            "images are read once you name it yourself (`tui-trainer trust "
            f"{shown(root, 200)}`, or give it on the command line)")


def check(root: Path) -> None:
    """ConfigError naming `dataset` where this user never named the folder `root`."""
    if str(root) not in named():
        raise ConfigError("dataset", refusal(root))


def _folders(configs: tuple[Any, ...]) -> list[Path]:
    """The folders of images these configs (dicts or RunConfigs; a session's are read as
    untrusted: one that is no table names none) name."""
    values = [c.get("dataset") if isinstance(c, dict) else getattr(c, "dataset", None)
              for c in configs]
    return [folder_root(v) for v in values if is_folder_dataset(v)]


def name_in(*configs: Any) -> None:
    """The folders these configs name, named by this user: they came from this command
    line, a TOML file given on it, or the form. A missing folder is left to the run's own
    check."""
    for root in _folders(configs):
        if root.is_dir():
            name(root)


def check_in(*configs: Any) -> None:
    """`check` for each folder these configs (a session's) name."""
    for root in _folders(configs):
        check(root)
