"""The warm launcher's fork server: `python -m tui_trainer.launcher SOCKET` imports what
training needs once (`prepare`), then listens on a Unix socket and forks a ready process for
each request (`Launcher`), or hands it to the spare made before Start (launcher/spare.py).
The package's docstring (launcher/__init__.py) says the protocol and why it is safe.
"""

from __future__ import annotations

import gc
import json
import os
import selectors
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from ..core.processes.trust import Untrusted, check_peer, leave_base
from .child import run_request
from .client import MAX_REQUEST
from .spare import SparePolicy

MAX_PENDING = 32        # connections whose request is not read yet
REQUEST_S = 5.0         # how long a connection may take to send its request


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def warm_up() -> None:
    """Imports what a run needs (the same modules a cold `run` imports), nothing more."""
    from .. import engine  # noqa: F401  (first: it keeps torch's caches out of /tmp)
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import torchvision  # noqa: F401

    from .. import cli, lifecycle, runner  # noqa: F401
    from ..engine import checkpoint, data, distributed, host, models, knobs, train  # noqa
    try:    # setproctitle finds the memory it rewrites on its first call: here, while this
        # process's environment is its own (a child that replaced it first could not name
        # itself; core/processes/proctitle.py)
        from setproctitle import getproctitle
        getproctitle()
    except ImportError:
        pass


def settle() -> None:
    """Puts what the imports made out of the garbage collector's reach (`gc.freeze`, after a
    last collection), as Python's documentation advises before forking without exec: a
    full collection in a forked process walks every object it tracks, and writing their
    headers copies each page they share with the launcher. Measured here (this 2-core VM,
    torch 2.15): without it a forked process's full collection took about 0.2 s and grew
    its own memory (USS) by 85 MiB (346,000 objects); after it, 0 ms and nothing. The
    launcher ends with os._exit (`_leave`); its other endings unfreeze first (`main`), so
    that the interpreter tears everything down as usual."""
    gc.collect()
    gc.freeze()


def prepare() -> str | None:
    """What the launcher does before it serves: the imports, the check that they left no
    thread running, and `settle`. Why it cannot serve, or None."""
    warm_up()
    if _threads() > 1:
        return (f"{_threads()} threads after importing torch; forking is not safe, runs start "
                "cold")
    settle()
    return None


def _leave(target: Path) -> None:
    """Ends the launcher, its socket and its folder removed: the dashboard (or study) that
    made the folder may have died without closing it (a terminal closed: SIGHUP), and
    nothing is left behind in /tmp. Only the launcher's own files go; rmdir removes the
    folder, and then the runtime folder that holds it, only when nothing else is in it."""
    for name in (target.name, target.name + ".binding", "launcher.log", "owner.pid"):
        try:
            (target.parent / name).unlink()
        except OSError:
            pass
    try:
        target.parent.rmdir()
    except OSError:
        pass
    leave_base(target.parent)
    os._exit(0)


def serve(path: str) -> int:
    from ..engine.distributed import die_with_parent
    target = Path(path)
    if os.path.lexists(target):
        # It makes its own socket; a file (or anything) already there is not replaced.
        print(f"tui_trainer.launcher: {target} exists; the launcher makes its socket itself, "
              "at a path where nothing is", file=sys.stderr)
        return 2
    # It ends with the dashboard (or study) that started it, and cleans up after itself; a
    # child forked a moment ago ends as SIGTERM's default would end it.
    me = os.getpid()
    signal.signal(signal.SIGTERM, lambda *_: _leave(target) if os.getpid() == me
                  else os._exit(128 + signal.SIGTERM))
    die_with_parent(signal.SIGTERM)
    why = prepare()
    if why:
        print(f"tui_trainer.launcher: {why}", file=sys.stderr)
        return 1
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    partial = target.with_name(target.name + ".binding")
    sock.bind(str(partial))
    sock.listen(16)
    os.replace(partial, target)       # the socket appears only once it accepts: ready
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    Launcher(sock, wake_r, wake_w).loop()
    return 0


class Launcher(SparePolicy):
    """The select loop. A connection is first `pending` (its request not read yet: at most
    MAX_PENDING of them, each dropped after REQUEST_S, so a silent client blocks nobody),
    then `waiting` for the exit of the child forked for it. Every descriptor a request
    passed is closed here, whatever became of the request; a forked child keeps none of the
    launcher's own (its socket, the selector, the other clients' connections)."""

    def __init__(self, sock: socket.socket, wake_r: int, wake_w: int) -> None:
        self.sock, self.wake_r, self.wake_w = sock, wake_r, wake_w
        self.pending: dict[socket.socket, float] = {}
        self.waiting: dict[int, socket.socket] = {}
        self.sel = selectors.DefaultSelector()
        self.sel.register(sock, selectors.EVENT_READ)
        self.sel.register(wake_r, selectors.EVENT_READ)
        self._init_spares()

    def loop(self) -> None:
        while True:
            if self.spare is None and self.spare_due is not None \
                    and time.monotonic() >= self.spare_due:
                self._make_spare()
            for key, _ in self.sel.select(timeout=1.0):
                if key.fileobj is self.sock:
                    self._accept()
                elif key.fileobj == self.wake_r:
                    try:
                        while os.read(self.wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                else:
                    conn = key.fileobj
                    self.sel.unregister(conn)
                    del self.pending[conn]
                    pid = self._handle(conn)
                    if pid is not None:
                        self.waiting[pid] = conn
                    else:
                        conn.close()
            now = time.monotonic()
            for conn, deadline in list(self.pending.items()):
                if now > deadline:           # connected and said nothing: dropped
                    self._drop(conn)
            for pid, code in _reap(self.waiting):
                if self.spare is not None and pid == self.spare[0]:
                    self._spare_lost(code)

    def _forget(self) -> None:
        """In a forked child: closes everything of the launcher's (its socket, the
        selector's epoll descriptor, the wake-up pipe, every client's connection, the
        spare's socket)."""
        self.sel.close()
        for thing in (self.sock, *self.pending, *self.waiting.values()):
            thing.close()
        if self.spare is not None:
            self.spare[1].close()
        for fd in (self.wake_r, self.wake_w):
            os.close(fd)

    def _accept(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        try:
            check_peer(conn)                 # only this user's processes are served
        except (OSError, Untrusted):
            conn.close()
            return
        if len(self.pending) >= MAX_PENDING:
            conn.close()
            return
        self.pending[conn] = time.monotonic() + REQUEST_S
        self.sel.register(conn, selectors.EVENT_READ)

    def _drop(self, conn: socket.socket) -> None:
        self.sel.unregister(conn)
        del self.pending[conn]
        conn.close()

    def _handle(self, conn: socket.socket) -> int | None:
        fds: list[int] = []
        try:
            conn.setblocking(False)
            data, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
            request = _valid(json.loads(data))
            if len(fds) != 3:
                raise ValueError("a request passes three file descriptors (stdout, stderr, "
                                 "the read end of the client's go-ahead pipe)")
        except (OSError, ValueError, TypeError) as e:
            for fd in fds:
                os.close(fd)
            try:
                conn.send(json.dumps({"error": str(e)[:200]}).encode())
            except OSError:
                pass
            return None
        pid = None
        if self._fits(request):
            pid = self._give(request, fds)
        elif self._takes(request):          # but not its cuBLAS workspace or cuDNN's choices
            self._replace(request)
        if request.get("spare") is not None and request.get("config") is not None:
            self.spare_config = request["config"]       # the next spare: for this run
        if pid is None:
            pid = os.fork()
        if pid == 0:
            # The child keeps nothing of the launcher's.
            self._forget()
            conn.close()
            run_request(request, fds)          # never returns
        for fd in fds:
            os.close(fd)
        try:
            conn.send(json.dumps({"pid": pid}).encode())
        except OSError:
            pass
        return pid


# Commands that are never forked from here: a rank (torchrun starts it, and `worker` refuses
# to run except as a child of its group's agent), and `join` (it quietens
# torch's C++ logging before importing torch, which a fork cannot do).
NOT_FORKED = ("worker", "join")


def _command(args: list[str]) -> str | None:
    """The command of a command line (after the top-level --session DIR)."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] == "--session" else 1
    return args[i] if i < len(args) else None


def _valid(request: Any) -> dict[str, Any]:
    """A request's shape, checked before anything is forked for it."""
    if not isinstance(request, dict):
        raise ValueError("a request is a JSON object")
    args, env, cwd = request.get("args"), request.get("env"), request.get("cwd")
    if not (isinstance(args, list) and all(isinstance(a, str) for a in args)):
        raise ValueError("args: a list of strings")
    if _command(args) in NOT_FORKED:
        raise ValueError(f"`{_command(args)}` is not forked by the warm launcher; start it "
                         "as a process of its own")
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str)
                                          for k, v in env.items())):
        raise ValueError("env: an object of strings")
    if not isinstance(cwd, str) or not isinstance(request.get("detach", True), bool):
        raise ValueError("cwd: a string; detach: true or false")
    spare = request.get("spare")
    if spare is not None and not (isinstance(spare, str) and len(spare) <= 40):
        raise ValueError("spare: the device setting of a run that starts CUDA, or null")
    cublas = request.get("cublas")
    if cublas is not None and not (isinstance(cublas, str) and len(cublas) <= 40):
        raise ValueError("cublas: the cuBLAS workspace a run sets for itself, or null")
    values = request.get("config")
    if values is not None and not (isinstance(values, dict) and
                                   all(isinstance(k, str) for k in values)):
        raise ValueError("config: the run's config (an object), or null")
    return request


def _reap(waiting: dict[int, socket.socket]) -> list[tuple[int, int]]:
    """Reaps ended children and tells their clients; the ones no client waited for (a
    spare), with their exit status."""
    unclaimed = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return unclaimed
        if pid == 0:
            return unclaimed
        code = os.waitstatus_to_exitcode(status)
        conn = waiting.pop(pid, None)
        if conn is None:
            unclaimed.append((pid, code))
            continue
        try:
            conn.send(json.dumps({"exit": code}).encode())
        except OSError:
            pass
        conn.close()


def main(argv: list[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="python -m tui_trainer.launcher",
                                     description="The warm launcher (started by the dashboard "
                                     "and by studies; not for direct use).")
    parser.add_argument("socket", help="the Unix socket to listen on (made here)")
    try:
        return serve(parser.parse_args(argv).socket)
    finally:
        gc.unfreeze()       # an ending other than _leave's: torn down at exit as usual
