"""What a process forked by the warm launcher does with its request: runs it as a cold
`python -m tui_trainer ARGS` would, in this process, once its client says go
(`run_request`); a spare (launcher/spare.py) does the same once it is given a run.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import select
import signal
import sys
import time
import traceback
from typing import Any, Callable

from .client import WARM_LINE

GO_AHEAD_S = 60.0       # how long a forked child waits for its client's go-ahead


def die_alone() -> None:
    """Undoes die_with_parent (PR_SET_PDEATHSIG 0)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, 0)       # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_request(request: dict[str, Any], fds: list[int], spare: str | None = None,
           cold: str | None = None, before_exit: Callable[[], None] | None = None) -> None:
    """Runs a request as a cold `python -m tui_trainer ARGS` would, in this process. With
    `cold` (why: a spare whose CUDA cannot be used) it becomes that cold process: the same
    pid (the one its client was told), its command executed anew. `before_exit` runs last,
    after the exit functions, just before the process ends."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)    # the launcher's clean-up is not its
        # The client checks the answer (the pid is the launcher's child, and its own) and
        # only then says go; a client that gave up (a time-out, an answer it could not
        # believe) starts the run cold instead and closes the pipe: this process ends
        # without a word, so that one process trains the run and its log says which.
        go = fds.pop()
        ready, _, _ = select.select([go], [], [], GO_AHEAD_S)
        told = os.read(go, 1) if ready else b""
        os.close(go)
        if told != b"1":
            for fd in fds:
                os.close(fd)
            os._exit(0)
        if request.get("detach", True):
            # A process group of its own (a signal to the launcher's group is not its), in
            # the launcher's session (the dashboard's, or the shell's) and so in its
            # scheduling group (core/processes/supervisor.py says why not a session of its own).
            os.setpgid(0, 0)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in (null, *fds):
            if fd > 2:
                os.close(fd)
        if cold is not None:
            os.write(2, f"{time.strftime('%H:%M:%S')} {cold}: the run starts cold in its "
                        "process\n".encode())
            os.chdir(request["cwd"])
            os.execve(sys.executable, [sys.executable, "-m", "tui_trainer",
                                       *map(str, request["args"])], request["env"])
        # Said by the forked process itself: a run that started cold never says it.
        said = WARM_LINE + (f"; {spare}" if spare else "")
        os.write(2, f"{time.strftime('%H:%M:%S')} {said}\n".encode())
        sys.stdout.reconfigure(line_buffering=True, write_through=True)
        sys.stderr.reconfigure(line_buffering=True, write_through=True)
        os.chdir(request["cwd"])
        # How idle OpenMP threads wait is what libgomp read in this launcher, whatever the
        # request's environment says: the run's record (its settings) tells the truth.
        waits = {k: os.environ.get(k) for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
        os.environ.clear()
        os.environ.update(request["env"])
        for key, value in waits.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        # As a fresh interpreter: numpy's and torch's global RNGs from the OS (Python's
        # `random` reseeds itself after a fork). Without this every forked run with
        # seed = none would draw the same numbers.
        import numpy as np
        import torch
        np.random.seed()
        torch.seed()
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:
            # OpenMP read its thread count when the launcher loaded it; a cold process
            # would read this one.
            torch.set_num_threads(int(threads))
        from ..cli import main
        args = [str(a) for a in request["args"]]
        sys.argv = ["tui-trainer", *args]
        try:
            code = main(args)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:             # noqa: BLE001 - the child must never return
        traceback.print_exc()
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()
            if before_exit is not None:
                before_exit()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)
