"""The client side of the warm launcher's protocol: the process that starts runs (the
dashboard, a study, a `run` with twins) asks the launcher (launcher/server.py) to fork each
one, and holds what it forked as it would hold a cold start's subprocess.Popen (`WarmChild`).
core.processes.supervisor.launch() takes a `WarmLauncher` as any launcher of its Forker
kind, and starts the run cold when it is missing, not ready or refuses.

Imports neither torch nor textual: the dashboard starts its launcher from here.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..core.processes import trust
from ..core.processes.supervisor import niced, thread_wait_env

# A request's largest size (bytes): its command line, environment and config.
MAX_REQUEST = 1 << 20


class WarmChild:
    """A run forked by the warm launcher, used like the subprocess.Popen of a cold start:
    pid, poll, wait, send_signal, communicate. Its exit status comes over the socket (the
    launcher is its parent); should the launcher be gone, the process is watched by its pid
    and start time (a reused pid is never taken for it, nor signalled)."""

    def __init__(self, pid: int, conn: socket.socket, out: int | None,
                 started: int | None = None) -> None:
        self.pid, self._conn, self._out, self._started = pid, conn, out, started
        self.returncode: int | None = None

    def _alive(self) -> bool:
        return trust.same_process(self.pid, self._started)

    def _read(self, timeout: float | None) -> None:
        if self.returncode is not None or self._conn.fileno() < 0:
            return
        ready, _, _ = select.select([self._conn], [], [], timeout)
        if not ready:
            return
        try:
            data = self._conn.recv(4096)
        except OSError:
            data = b""
        self._conn.close()          # an answer, or the launcher went away: no more to read
        try:
            code = json.loads(data)["exit"] if data else None
        except (ValueError, TypeError, KeyError):
            code = None
        if isinstance(code, int) and not isinstance(code, bool):
            self.returncode = code
        elif not self._alive():
            self.returncode = UNKNOWN_EXIT      # gone, and nobody can say how

    def poll(self) -> int | None:
        self._read(0)
        if self.returncode is None and self._conn.fileno() < 0 and not self._alive():
            self.returncode = UNKNOWN_EXIT
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"run process {self.pid}", timeout or 0)
            if self._conn.fileno() >= 0:
                self._read(0.5 if left is None else min(0.5, left))
            else:
                time.sleep(0.1 if left is None else min(0.1, left))
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None and self._alive():
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str | None, None]:
        """Reads the captured stdout to its end, then waits (as Popen.communicate)."""
        out = None
        if self._out is not None:
            with os.fdopen(self._out, "rb") as f:
                out = f.read().decode("utf-8", errors="replace")
            self._out = None
        self.wait(timeout)
        return out, None


UNKNOWN_EXIT = 255

WARM_LINE = "forked from the warm launcher (torch imported already)"

# Added to it by a run the launcher gave its spare (made before Start: launcher/spare.py).
SPARE_LINE = "a spare made before Start"


class WarmLauncher:
    """A `python -m tui_trainer.launcher` process (launcher/server.py) that has imported torch
    once and forks each run; started by the dashboard when it opens, and by a study for its
    runs. Until it is ready (about as long as one cold start) or if it fails, runs start
    cold."""

    # A launcher's socket, handed to the jobs it starts; "0" turns warm starts off.
    ENV = "TUI_TRAINER_WARM"

    def __init__(self, attach: str | None = None, nice: int = 0) -> None:
        self._proc: subprocess.Popen | None = None
        self._dir: Path | None = None
        self._attached = Path(attach) if attach else None
        # the nice value of this launcher's own process, so of the runs it forks and of
        # those started cold in its place (the dashboard's: dashboard_nice())
        self.nice = 0 if attach else nice

    @classmethod
    def from_env(cls, nice: int = 0) -> "WarmLauncher | None":
        """None where warm starts are turned off (ENV is "0"); the launcher ENV names, when
        its socket is this user's and private (a launcher this one did not start is only
        used, never closed); else one of this process's own at `nice`, not started yet."""
        attach = os.environ.get(cls.ENV)
        if attach == "0":
            return None
        if attach:
            try:
                trust.check_socket(Path(attach))      # ours and private, or not used
                return cls(attach)
            except (OSError, trust.Untrusted):
                pass
        return cls(nice=nice)

    @classmethod
    def shared(cls) -> "WarmLauncher":
        """The launcher of the dashboard that started this process, if it is still there;
        else one of this process's own, started now (turned off: never ready, every run
        starts cold)."""
        launcher = cls.from_env()
        if launcher is None:
            return cls()
        launcher.start()                # nothing to start for an attached one
        return launcher

    @property
    def path(self) -> Path | None:
        if self._attached is not None:
            return self._attached
        return None if self._dir is None else self._dir / "launcher.sock"

    def env(self) -> dict[str, str]:
        """What a child needs to use this launcher too."""
        return {self.ENV: str(self.path)} if self.path is not None else {}

    def start(self) -> None:
        """Starts the launcher, its socket in a folder of its own in this user's private
        runtime folder (core/processes/trust.py); folders of launchers that died unannounced (a
        killed dashboard) are swept first. Runs start cold when that folder is not ours."""
        if self._proc is not None or self._attached is not None:
            return
        for _ in range(3):
            try:
                base = trust.runtime_base()
                trust.sweep_stale(base)
                self._dir = Path(tempfile.mkdtemp(prefix=trust.WARM_PREFIX, dir=base))  # 0700
                break
            except trust.Untrusted:
                return
            except FileNotFoundError:   # another launcher's close just removed it (empty)
                continue
        else:
            return
        # AF_UNIX takes a path of at most 107 bytes (a long TMPDIR makes a longer one): a
        # launcher that could never bind its socket is not started at all
        if len(os.fsencode(self._dir / "launcher.sock.binding")) > trust.SOCKET_PATH_MAX:
            self.close()
            return
        # numpy's OpenBLAS starts a thread pool when imported: one thread here keeps the
        # launcher single-threaded, so that it can fork (training does not use numpy's BLAS;
        # each run gets the environment it was asked with). A process group of its own in
        # this process's session: out of the terminal's signals, in its scheduling group.
        with open(self._dir / "launcher.log", "ab") as log:
            self._proc = subprocess.Popen(
                [*niced(self.nice), sys.executable, "-m", "tui_trainer.launcher",
                 str(self.path)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                process_group=0, env={**os.environ, **thread_wait_env(),
                                      "OPENBLAS_NUM_THREADS": "1"})
        # Whose folder this is: a later sweep removes it once that process is gone.
        (self._dir / "owner.pid").write_text(
            f"{self._proc.pid} {trust.start_time(self._proc.pid) or 0}\n")

    def ready(self) -> bool:
        if self._attached is not None:
            return self._attached.exists()
        return self._proc is not None and self._proc.poll() is None and \
            self.path is not None and self.path.exists()

    def starting(self) -> bool:
        """Started here and still importing torch: ready soon (not failed, not off)."""
        return self._attached is None and self._proc is not None and \
            self._proc.poll() is None and not self.ready()

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self._attached is not None or self._proc is None \
                    or self._proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def spawn(self, args: list[str], stdout: int, stderr: int, detach: bool,
              env: dict[str, str], out: int | None = None,
              spare: str | None = None, cublas: str | None = None,
              config: dict[str, Any] | None = None) -> WarmChild | None:
        """Forks `tui-trainer ARGS` with these stdout/stderr; None when the launcher cannot
        (not ready, gone): the caller then starts the run cold. `spare`: the device setting
        of a run that starts CUDA (core.settings.machine.cuda_device), which the launcher may give
        the spare it made before Start (it has started CUDA's driver where there is a CUDA
        device); `cublas`: the cuBLAS workspace the run sets for itself
        (core.settings.machine.cublas_workspace), which a spare that made cuBLAS's handles must
        share where torch cannot set the workspace's size (engine.cuda_start's
        cublas_size_settable);
        `config`: the run's config (a dict), for which the launcher makes its next spares
        and by which it decides whether one that loaded kernels suits it (launcher/spare.py)."""
        if not self.ready() or self.path is None:
            return None
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # The child it forks waits for a go-ahead on this pipe, given once its pid is
        # believed; given up (closed unsaid), it ends without a word while the run starts
        # cold: never two processes for one run, and the log says which one trains it.
        go_r, go_w = os.pipe()
        try:
            # Nothing (the environment, the log descriptors) goes to a socket or a process
            # that is not this user's own (core/processes/trust.py); every answer is checked.
            trust.check_socket(self.path)
            conn.settimeout(10)
            conn.connect(str(self.path))
            launcher = trust.check_peer(conn)
            try:
                json.dumps(config)
            except (TypeError, ValueError):     # not JSON: the launcher does without it
                config = None
            request = {"args": args, "env": env, "cwd": os.getcwd(), "detach": detach,
                       "spare": spare, "cublas": cublas, "config": config}
            socket.send_fds(conn, [json.dumps(request).encode()], [stdout, stderr, go_r])
            pid, started = trust.check_child(json.loads(conn.recv(4096) or b"{}"), launcher)
            conn.settimeout(None)
        except (OSError, ValueError, trust.Untrusted) as e:
            conn.close()
            os.close(go_w)
            try:        # into the run's log, where its cold start follows
                os.write(stderr, f"tui-trainer: the warm launcher was not used ({e}); "
                                 "starting cold\n".encode(errors="replace"))
            except OSError:
                pass
            return None
        finally:
            os.close(go_r)
        os.write(go_w, b"1")
        os.close(go_w)
        return WarmChild(pid, conn, out, started)

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            trust.leave_base(self._dir)     # and theirs, when no other launcher has one there
            self._dir = None
