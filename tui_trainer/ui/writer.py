"""The session's one writable connection and the supervisor: every write (start, stop,
continue, delete, rename, the saved screen state, reconciling statuses) goes through one
`Writer`, one call at a time, in its own thread (`submit`) or the polling thread (`__call__`
under its lock). None of it runs on the UI thread: the Writer itself is opened in a worker
(TrainerApp._open), and closed in a thread after the writes asked before it (`close`)."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable

from ..core.errors import ReadOnlySession
from ..core.session.store import SessionStore
from ..core.processes.supervisor import Supervisor
from ..launcher.client import WarmLauncher

STATE_KEY = "ui_state"          # the screen state, in the session's meta table
CLOSE_WAIT_S = 30.0             # how long closing waits for the writes asked before it


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
        self._jobs = ThreadPoolExecutor(max_workers=1, thread_name_prefix="session-writer")
        self._pending: set[Future] = set()
        self.closed = False

    def submit(self, job: Callable[[SessionStore, Supervisor], Any]) -> None:
        """Runs `job(store, supervisor)` in the writer's thread, after the jobs before it.
        A job that fails is the job's to report (TrainerApp.write does)."""
        if self.closed:
            return          # the app is closing: its last screen state went with close()
        future = self._jobs.submit(self, job)
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)

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

    def close(self, last_state: str | None = None) -> None:
        """Blocks: the writes asked before (CLOSE_WAIT_S at most; one still running holds
        the lock, which closing takes), the last screen state, then the connection."""
        self.closed = True
        self._jobs.shutdown(wait=False)
        wait(list(self._pending), CLOSE_WAIT_S)
        if last_state is not None:
            self.save_state(last_state)
        with self.lock:
            self.store.close()
