"""A tab's background command, one at a time: `TabJob` starts it (through the supervisor, in
the writer's thread), says for how long it has run, and after each tick lets it go once
its answer is in the session, or says it failed when its process ended without one.

Each panel that runs commands for runs owns one (explain: Divergence; the memory breakdown:
Plots; the profile: Profile; what the net sees: Model), with its keys and dialogs; the App
calls `settle(snap)` on every mounted panel that has one after each tick.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..core.errors import BadInput, SessionError
from ..core.text import shown

# How long after its process ended a background command's answer is waited for in the
# session (the tick read before the process wrote it does not hold it yet).
JOB_SETTLE_S = 3.0


def job_said(log: Path) -> str:
    """The last line a background command wrote (its refusal, when it refused), shown as
    text."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            tail = f.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return "its output cannot be read"
    return shown(tail[-1], 300) if tail else "it wrote nothing"


@dataclass
class Job:
    """A background command this dashboard started for runs: its runs and process (None
    while it starts)."""
    runs: tuple[int, ...]
    job: Any
    started: float                  # monotonic
    wall: float                     # time.time() then: the session's events are after it
    ended: float | None = None

    def gave_up(self) -> bool:
        """Its process ended more than JOB_SETTLE_S ago (its answer, had it written one,
        would be in the tick by now)."""
        if self.job is None:
            return False            # still starting
        if self.ended is None and self.job.poll() is not None:
            self.ended = time.monotonic()
        return self.ended is not None and time.monotonic() - self.ended > JOB_SETTLE_S


class TabJob:
    """At most one background command of a panel at a time (`job`: None when none runs)."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner              # the panel (a widget: its app writes and notifies)
        self.job: Job | None = None

    @property
    def busy(self) -> bool:
        return self.job is not None

    def start(self, runs: tuple[int, ...], launch: Callable[[Any], Any],
              refused: str) -> None:
        """Starts `launch(supervisor)` for `runs` in the writer's thread; said at once (the
        job exists before its process does), and its answer is one kept after now. Where it
        cannot start, the job is let go and the user told `refused` and why."""
        app = self.owner.app
        job = self.job = Job(runs, None, time.monotonic(), time.time())

        def start(_: Any, sup: Any) -> Any:
            try:
                return launch(sup)
            except (SessionError, OSError, BadInput) as e:
                return e
            except Exception as e:  # noqa: BLE001 - a fault of ours: said, and the tab let go
                return RuntimeError(f"{type(e).__name__}: {shown(e, 200)}")

        def started(proc: Any) -> None:
            if isinstance(proc, Exception):
                if self.job is job:
                    self.job = None
                app.notify(f"{refused}: {proc}", severity="error", timeout=12)
            else:
                job.job = proc
            app.draw_tab()

        app.write(start, started)

    def now(self) -> tuple[tuple[int, ...], float] | None:
        """Its runs and the seconds since it started, while it runs."""
        job = self.job
        return None if job is None else (job.runs, time.monotonic() - job.started)

    def settle(self, answer: Callable[[Job], Any],
               landed: Callable[[Job, Any], None] | None,
               failed: Callable[[Job], None]) -> None:
        """After each tick: `answer(job)` (None while none is in the session) lets the job go
        and is handed to `landed`; a job whose process ended without one goes to `failed`."""
        job = self.job
        if job is None:
            return
        found = answer(job)
        if found is not None:
            self.job = None
            if landed is not None:
                landed(job, found)
        elif job.gave_up():
            self.job = None
            failed(job)
