"""The session's one writable connection and the supervisor, for the dashboard's worker
threads: every write (start, stop, continue, delete, rename, the saved screen state,
reconciling statuses) goes through one `Writer`, one call at a time. None of it runs on the
UI thread: the Writer itself is opened in a worker (TrainerApp._open)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

from ..core.errors import ReadOnlySession
from ..core.store import SessionStore
from ..core.supervisor import Supervisor, WarmLauncher

STATE_KEY = "ui_state"          # the screen state, in the session's meta table


class Writer:
    def __init__(self, directory: Path, warm: WarmLauncher | None = None):
        """Opens (or creates) the session: SessionError for a damaged one. A session on a
        read-only disk opens for viewing (`readonly`)."""
        store = None
        try:
            store = SessionStore(directory)
            store.touch()
            self.readonly = False
        except ReadOnlySession:
            if store is not None:
                store.close()
            store = SessionStore(directory, create=False, readonly=True)
            self.readonly = True
        self.store = store
        self.supervisor = Supervisor(store, warm)
        self.lock = threading.Lock()

    def __call__(self, fn: Callable[[SessionStore, Supervisor], Any]) -> Any:
        with self.lock:
            return fn(self.store, self.supervisor)

    def opened(self) -> tuple[str | None, set[int], list[int]]:
        """What the app needs once the session is open: the saved screen state, the run
        ids and the study ids it can restore against."""
        return self(lambda s, _: (s.meta(STATE_KEY), {r["id"] for r in s.runs()},
                                  [x["id"] for x in s.studies()]))

    def save_state(self, text: str) -> None:
        if not self.readonly:
            self(lambda s, _: s.set_meta(STATE_KEY, text))

    def close(self) -> None:
        with self.lock:
            self.store.close()
