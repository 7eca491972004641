"""Whether a run's process is alive: the supervisor's policy, in one place.

A run stored as running is alive while its heartbeat is fresh (the training process beats
every HEARTBEAT_S from a thread of its own) and, on this machine, while the process that
wrote its pid still runs (a reused pid belongs to a process started later). A run stored as
created is alive while the process started for it is. A live run whose step has not moved
for STALL_S reads as stalled. The store applies this when it reads a run (its effective
status) and when a writer reconciles (`SessionStore.reconcile` stores what it decides); the
supervisor, the runner and the commands ask it before they stop, continue or delete a run.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import psutil

HEARTBEAT_S = 2.0
# A run whose heartbeat is older than this is dead, whatever its pid says.
STALE_S = 30.0
# A live run (fresh heartbeat) whose step has not moved for its stall window reads as
# stalled: a data-parallel rank hung or stopped, a collective waiting for it (see
# dist_timeout), a loop stuck. The window follows the run's own pace: STALL_STEPS of its
# steps, never less than STALL_FLOOR_S (two and a half heartbeats: a beat that comes late
# is not a stall). While the run does something other than stepping (evaluating, writing a
# checkpoint, starting its data loader), or before its pace is known, it is STALL_S.
STALL_S = 60.0
STALL_FLOOR_S = 5.0
STALL_STEPS = 20


def process_start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def process_alive(pid: int | None, started: float | None) -> bool:
    """True while the process that wrote `pid` (started at `started`) still runs here."""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        # A reused pid belongs to a process started later than the one we recorded.
        return started is None or abs(proc.create_time() - started) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def is_live(run: dict[str, Any]) -> bool:
    """A run stored as running whose process still trains it."""
    if run["status"] != "running":
        return False
    if run["heartbeat"] is None or time.time() - run["heartbeat"] > STALE_S:
        return False
    if run["host"] == socket.gethostname():
        return process_alive(run["pid"], run["pid_started"])
    return True


def starting(run: dict[str, Any]) -> bool:
    """A run stored as created whose process, started for it on this machine, still runs."""
    return run["status"] == "created" and bool(run["pid"]) and \
        run["host"] in (None, socket.gethostname()) and \
        process_alive(run["pid"], run["pid_started"])


def dead_reason(run: dict[str, Any]) -> str | None:
    """Why a run that says 'created' or 'running' has no live process, or None."""
    if run["status"] == "running" and not is_live(run):
        return ("the training process is gone (no heartbeat, no process): continue it "
                "from its newest checkpoint")
    if run["status"] == "created" and run["pid"] and not starting(run):
        return ("the process that was to train it ended before training started; its log "
                "says why")
    return None


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) \
        and x == x and x >= 0 else None


def stall_window(run: dict[str, Any]) -> float:
    """How long a live run's step may stand still before it reads stalled: STALL_STEPS of
    its own steps (at least STALL_FLOOR_S) while it trains steps; STALL_S while it is busy
    with something else or its pace is not known yet (an older session)."""
    pace = _number(run.get("pace_s"))
    if run.get("busy") or pace is None:
        return STALL_S
    return max(STALL_FLOOR_S, STALL_STEPS * pace)


def stalled_for(run: dict[str, Any]) -> float | None:
    """How long a live run's step has not moved, when that is its stall window or more (its
    process beats, but does not train); else None."""
    progressed = _number(run.get("progressed"))
    if run["status"] != "running" or progressed is None:
        return None
    idle = time.time() - progressed
    return idle if idle >= stall_window(run) else None
