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
# A live run (fresh heartbeat) whose step has not moved for this long reads as stalled: a
# data-parallel rank hung or stopped, a collective waiting for it (see dist_timeout).
STALL_S = 60.0


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


def stalled_for(run: dict[str, Any]) -> float | None:
    """How long a live run's step has not moved, when that is STALL_S or more (its
    process beats, but does not train); else None."""
    progressed = run.get("progressed")
    if run["status"] != "running" or not isinstance(progressed, (int, float)) \
            or isinstance(progressed, bool):
        return None
    idle = time.time() - progressed
    return idle if idle >= STALL_S else None
