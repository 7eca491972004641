"""The polling thread: reads the session, computes what the visible tab draws, posts it.

One thread with its own read-only connection (core.session.reader: only what changed since the last
tick). Twice a second, or at once when woken, it reads what the app's `Request` names and
posts one replaceable `Polled` message; the Log tab's new lines come as `LogLines` (never
replaced: each carries lines the panel has not seen). The UI thread never runs SQLite.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from textual.app import App
from textual.message import Message
from textual.worker import get_current_worker

from ..core.analysis.study import sweep_groups
from ..core.analysis.plotdata import PlotOptions, plot_lines
from ..core.session.reader import SessionReader, Snapshot
from ..core.errors import DiskFull, SessionError
from ..core.session.store import SessionStore
from .panels.log import LogPanel, LogTail
from .panels.plots import PlotsPanel

POLL_S = 0.5            # the session is read, and the visible tab redrawn, twice a second


@dataclass(frozen=True)
class Request:
    """What the polling thread reads for the screen, set by the UI thread."""
    watched: tuple[int, ...] = ()
    plotted: tuple[int, ...] = ()
    tab: str = PlotsPanel.TAB
    study: int | None = None
    checks_for: tuple[int, ...] = ()
    log_run: int | None = None
    options: PlotOptions = field(default_factory=PlotOptions)


class Polled(Message):
    """One tick's snapshot; a newer one replaces it if the app has not handled it yet."""

    def __init__(self, snap: Snapshot, lines: dict | None, seq: int) -> None:
        self.snap, self.lines, self.seq = snap, lines, seq
        super().__init__()

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, Polled)


class LogLines(Message):
    def __init__(self, run_id: int | None, reset: bool, lines: list[str]) -> None:
        self.run_id, self.reset, self.lines = run_id, reset, lines
        super().__init__()


class Poller:
    """The app's reading thread. `request` says what to read; `wake()` asks for a tick now;
    `drawn(seq)` is told by the app when a tick is on the screen (for `tick_drawn`)."""

    def __init__(self, app: App, enabled: bool, quiet: Callable[[float], None]) -> None:
        self.app, self.enabled, self.quiet = app, enabled, quiet
        self.request = Request()
        self.seq = 0                    # ticks read
        self.applied = 0                # the newest tick drawn
        self._wake = threading.Event()
        self._reread = False            # the next tick re-reads the runs table
        self._log_again = False         # the Log tab missed lines: tail its log from the start

    def start(self, directory: Path, write: Callable[[Callable], Any] | None) -> None:
        """Reads `directory` from now on (one loop at a time: a new one cancels the old).
        `write`, when the session is writable, runs the reconcile each tick."""
        self.app.run_worker(lambda: self._loop(directory, write), thread=True,
                            exclusive=True, group="poll", name="poll")

    def stop(self) -> None:
        self.app.workers.cancel_group(self.app, "poll")
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def reread(self) -> None:
        """The runs table changed beyond what reading the changes sees (a rename, a
        delete): the next tick reads it whole."""
        self._reread = True
        self._wake.set()

    def log_missed(self) -> None:
        self._log_again = True
        self._wake.set()

    def drawn(self, seq: int) -> None:
        self.applied = max(self.applied, seq)

    async def tick_drawn(self, timeout: float) -> None:
        """Waits until a tick that started after this call has been drawn."""
        target = self.seq + 1
        self._wake.set()
        deadline = time.monotonic() + timeout
        while self.applied < target and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            if self.applied < target:
                self._wake.set()

    def _loop(self, directory: Path, write: Callable[[Callable], Any] | None) -> None:
        worker = get_current_worker()
        store = SessionStore(directory, create=False, readonly=True, verify=False)
        reader = SessionReader(store)
        tail = LogTail()
        plot_key: Any = None
        lines: dict | None = None
        try:
            first, said = True, None
            while not worker.is_cancelled:
                if not first:
                    woke = self._wake.wait(POLL_S)
                    self._wake.clear()
                    if worker.is_cancelled:
                        break
                    if not woke and not self.enabled:
                        continue
                first = False
                self.quiet(0.5)         # the read and the plot lines wait for a pause in keys
                self.seq += 1
                seq, req = self.seq, self.request
                try:
                    if write is not None:
                        # The explicit write that reading leaves out: runs whose process is
                        # gone are stored as crashed, with how their process ended.
                        write(lambda s, sup: (sup.reap(), s.reconcile()))
                    if self._reread:
                        self._reread = False
                        reader.invalidate()
                    snap = reader.tick(req.watched, req.study, req.checks_for)
                    if reader.unkept:
                        # Ended runs of a session from before figures were kept: computed once
                        # from their rows by this tick, kept now for every later reader.
                        unkept, reader.unkept = reader.unkept, []
                        if write is not None:
                            write(lambda s, _: s.keep_figures(unkept))
                    if req.tab == PlotsPanel.TAB:
                        groups = sweep_groups(snap.studies)
                        key = (req.plotted, req.options, tuple(groups),
                               tuple(snap.series[r].version for r in req.plotted
                                     if r in snap.series))
                        if key != plot_key:
                            plot_key = key
                            configs = {r.id: r.config for r in snap.runs}
                            lines = plot_lines(snap.series, req.plotted, configs, req.options,
                                               groups)
                    else:
                        plot_key = lines = None
                    # Every snapshot carries the current lines (the same object while nothing
                    # changed): a snapshot that replaces an unhandled one loses nothing.
                    self.app.post_message(Polled(snap, lines, seq))
                    if req.tab == LogPanel.TAB:
                        if self._log_again:     # the panel missed lines: read it all again
                            self._log_again = False
                            tail.path = None
                        reset, new = tail.read(store.log_path(req.log_run)
                                               if req.log_run is not None else None)
                        if reset or new:
                            self.app.post_message(LogLines(req.log_run, reset, new))
                    else:
                        tail.path = None
                except (SessionError, DiskFull) as e:
                    # A damaged page of old rows (the open checks the tables that grow
                    # with the runs, not every row: core.session.schema.CHECKED), a full disk:
                    # said once, the screen kept as last read, the next tick tries again.
                    if str(e) != said:
                        said = str(e)
                        self.app.call_from_thread(self.app.notify, said, severity="error",
                                                  timeout=30)
                else:
                    said = None
        finally:
            store.close()
