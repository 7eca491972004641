"""Every expected failure, and the exit status the `tui-trainer` command gives for it.

    0  ok
    1  failed: training (or an export, a study) could not finish, e.g. no space left
    2  bad input: a config value, a command-line argument, a checkpoint that does not fit
    3  not identical: a determinism or resume check found the runs differ
    4  session unusable: damaged, not a session, read-only where a write is needed, or the
       run is being trained by another process
    5  diverged: the run's loss or parameters became NaN/inf; every row and the last finite
       checkpoint are kept
  130  stopped: the run was stopped before its end (Ctrl-C, a stop from the dashboard, a
       SIGTERM); it wrote a checkpoint and `tui-trainer resume` continues it. 130 is the
       shell's status for a command ended by Ctrl-C.

Each of these is printed as one line that says what to fix. Core layer: no torch, no textual.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_NOT_IDENTICAL, EXIT_SESSION, EXIT_DIVERGED = \
    0, 1, 2, 3, 4, 5
EXIT_STOPPED = 130


def exit_for(status: str) -> int:
    """The exit status of a training command whose run ended with `status` (a summary's)."""
    return {"diverged": EXIT_DIVERGED, "stopped": EXIT_STOPPED}.get(status, EXIT_OK)


class BadInput(Exception):
    """Input the user can fix; printed as one message, exit status 2."""


class CheckpointError(Exception):
    """A checkpoint file that cannot be used; the message says which file and why."""


class SessionError(Exception):
    """The session directory or its database cannot be used; the message says why."""


class RunBusy(SessionError):
    """The run is being trained by another live process (one writer per run)."""


class DiskFull(Exception):
    """No space left where tui-trainer had to write; the message names the path."""

    def __init__(self, path: str | Path, detail: str = ""):
        self.path = Path(path)
        free = free_bytes(self.path)
        where = f" ({_size(free)} free there)" if free is not None else ""
        super().__init__(f"no space left on device while writing {self.path}{where}"
                         + (f": {detail}" if detail else "")
                         + "; free some space and try again (what was written before is "
                         "intact; a run continues with `tui-trainer resume`)")


def free_bytes(path: Path) -> int | None:
    for p in (path, *path.parents):
        try:
            return shutil.disk_usage(p).free
        except OSError:
            continue
    return None


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def is_disk_full(e: BaseException) -> bool:
    """ENOSPC as an OSError, or SQLite's 'database or disk is full'."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return "database or disk is full" in str(e).lower()


class ReadOnlySession(SessionError):
    """The session is on a read-only disk or file: it can be listed, viewed and exported."""


class NotFound(BadInput):
    """No such run or study in the session: the id given is wrong (exit status 2)."""


class ExportFailed(Exception):
    """An export could not be written; exit status 1."""


def _exit_for_errors() -> tuple[tuple[type[Exception], int, str], ...]:
    from .settings.config import ConfigError  # config defines it beside the knobs
    # Most specific first: printed as one line (with the prefix), with this exit status.
    return ((ConfigError, EXIT_BAD_INPUT, "bad config: "),
            (CheckpointError, EXIT_BAD_INPUT, ""),
            (BadInput, EXIT_BAD_INPUT, ""),
            (SessionError, EXIT_SESSION, ""),
            (DiskFull, EXIT_FAILED, ""),
            (ExportFailed, EXIT_FAILED, ""))


EXIT_FOR = _exit_for_errors()
EXPECTED = tuple(kind for kind, _, _ in EXIT_FOR)


def expected(e: BaseException) -> tuple[int, str]:
    """An expected failure's exit status and the prefix of its one line."""
    return next((code, prefix) for kind, code, prefix in EXIT_FOR if isinstance(e, kind))
