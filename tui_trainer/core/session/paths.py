"""Where tui-trainer keeps things by default, per platform (platformdirs)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "tui-trainer"


def user_data_dir() -> Path:
    # TUI_TRAINER_HOME moves everything at once (handy for tests and for a scratch setup).
    home = os.environ.get("TUI_TRAINER_HOME")
    return Path(home) if home else Path(platformdirs.user_data_dir(APP, appauthor=False))


def sessions_dir() -> Path:
    return user_data_dir() / "sessions"


def default_session_dir() -> Path:
    return sessions_dir() / "default"


def default_data_dir() -> Path:
    home = os.environ.get("TUI_TRAINER_HOME")
    if home:
        return Path(home) / "datasets"
    return Path(platformdirs.user_cache_dir(APP, appauthor=False)) / "datasets"


def cache_dir() -> Path:
    """Caches tui-trainer may rebuild (compiled kernels): TUI_TRAINER_HOME/cache, else the
    user's cache folder; never the shared temporary folder."""
    home = os.environ.get("TUI_TRAINER_HOME")
    return Path(home) / "cache" if home else \
        Path(platformdirs.user_cache_dir(APP, appauthor=False))


def config_dir() -> Path:
    """The user's own settings (what this user trusts: core/settings/user_models.py):
    TUI_TRAINER_HOME/config, else the user's config folder; never inside a session."""
    home = os.environ.get("TUI_TRAINER_HOME")
    return Path(home) / "config" if home else \
        Path(platformdirs.user_config_dir(APP, appauthor=False))
