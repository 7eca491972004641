"""CUDA's checkpoint API (the driver's cuCheckpointProcess* calls: Linux, driver 550 and
newer), called from another process than the one it moves. The launcher's suspended spare
(launcher/spare.py, TUI_TRAINER_SPARE=suspended) has its CUDA moved out of the GPU while it waits and
back when it is given a run.

Why another process: the API is made for a controller outside the process it acts on. The
`cuda-checkpoint --pid` tool is one, and NVIDIA's own tests of the API run a coordinator
beside their target. A locked process's further CUDA calls block until it is unlocked, and
a process that locked itself would make its checkpoint by such a call. So the spare starts
a helper, `python -m tui_trainer.core.processes.cuda_checkpoint PID` (`Helper`). The helper
is its child, loads only the driver (cuInit: no context, no GPU memory), acts on its parent
only, and does what the spare asks through a pipe:
- "suspend": lock, then checkpoint;
- "restore": restore, then unlock;
- "bye": end.
Each request gets one line of JSON in answer. Every wait for an answer is bounded; a helper
that does not answer in time is killed and the caller is told why. The helper ends when it
is told to or when its spare ends (its pipe closes).
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

START_S = 30.0      # the helper's start: an interpreter, then the driver's (cuInit)
SUSPEND_S = 60.0    # the lock (LOCK_MS at most), then the copy of the GPU state to the host
RESTORE_S = 30.0    # the copy back, then the unlock
CLOSE_S = 5.0       # the helper's end once it is told
PR_SET_PTRACER = 0x59616D61


class CudaCheckpoint:
    """The driver's checkpoint calls on one process (`pid`), made from this one. Checkpointed,
    that process holds no GPU memory and no device handle: the driver has copied its
    allocations, loaded kernels and handles into its host memory. Restored, they are back
    at the same addresses and it goes on. It must make no CUDA call in between: a
    synchronize while checkpointed crashes inside the driver (VivianSobers/gpunap,
    validation/FINDINGS.md, drivers 580 and 595)."""

    STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed",
              4: "checkpointing", 5: "restoring"}
    # The codes these calls return (cuda.h), named here, without asking the driver.
    ERRORS = {1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
              3: "CUDA_ERROR_NOT_INITIALIZED", 4: "CUDA_ERROR_DEINITIALIZED",
              100: "CUDA_ERROR_NO_DEVICE", 304: "CUDA_ERROR_OPERATING_SYSTEM",
              401: "CUDA_ERROR_ILLEGAL_STATE", 600: "CUDA_ERROR_NOT_READY",
              801: "CUDA_ERROR_NOT_SUPPORTED", 909: "CUDA_ERROR_TIMEOUT",
              999: "CUDA_ERROR_UNKNOWN"}
    LOCK_MS = 10_000        # the lock waits at most this long for the process's work in flight

    class _LockArgs(ctypes.Structure):
        _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint),
                    ("reserved1", ctypes.c_uint64 * 7)]

    def __init__(self, pid: int) -> None:
        """Starts this process's driver (cuInit, which makes no context). RuntimeError where
        there is no driver, no device, or no checkpoint API."""
        self.pid = pid
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            self._fn = {name: getattr(lib, "cuCheckpointProcess" + name) for name in
                        ("Lock", "Checkpoint", "Restore", "Unlock", "GetState")}
            init = lib.cuInit
        except (OSError, AttributeError) as e:
            raise RuntimeError(f"this CUDA driver has no checkpoint API (it needs driver 550 "
                               f"or newer on Linux): {str(e)[:120]}") from None
        init.restype = ctypes.c_int
        init.argtypes = [ctypes.c_uint]
        for fn in self._fn.values():
            fn.restype = ctypes.c_int
        self._fn["Lock"].argtypes = [ctypes.c_int, ctypes.POINTER(self._LockArgs)]
        for name in ("Checkpoint", "Restore", "Unlock"):
            self._fn[name].argtypes = [ctypes.c_int, ctypes.c_void_p]
        self._fn["GetState"].argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        self._check("cuInit", init(0))

    def _check(self, name: str, code: int) -> None:
        if code != 0:
            raise RuntimeError(f"{name} returned {self.ERRORS.get(code, 'error')} ({code})")

    def _call(self, name: str, args: Any = None) -> None:
        self._check("cuCheckpointProcess" + name, self._fn[name](self.pid, args))

    def state(self) -> str:
        value = ctypes.c_int(-1)
        code = self._fn["GetState"](self.pid, ctypes.byref(value))
        return self.STATES.get(value.value, f"unknown ({value.value})") if code == 0 \
            else f"not known (error {code})"

    def suspend(self) -> int:
        """Lock, then checkpoint: how many bytes the process's resident memory grew by (the
        GPU state it now holds on the host). Where the checkpoint fails, the process is
        unlocked again (its CUDA goes on as it was) and RuntimeError says why."""
        import psutil
        before = psutil.Process(self.pid).memory_info().rss
        self._call("Lock", ctypes.byref(self._LockArgs(timeoutMs=self.LOCK_MS)))
        try:
            self._call("Checkpoint")
        except RuntimeError:
            if self.state() == "locked":
                self._call("Unlock")
            raise
        if self.state() != "checkpointed":
            raise RuntimeError(f"after its checkpoint the process is {self.state()}")
        return max(0, psutil.Process(self.pid).memory_info().rss - before)

    def restore(self) -> None:
        """Restore, then unlock. RuntimeError where the process's CUDA did not come back
        (it cannot be used for CUDA then)."""
        self._call("Restore")
        self._call("Unlock")
        if self.state() != "running":
            raise RuntimeError(f"after its restore the process is {self.state()}")


def _say(out: Any, **answer: Any) -> None:
    out.write(json.dumps(answer) + "\n")
    out.flush()


def serve(pid: int, inp: Any = None, out: Any = None) -> int:
    """The helper: answers its spare's requests on `inp` (a line each) on `out` until "bye"
    or the end of `inp`. Its first line says whether it is ready."""
    inp, out = inp or sys.stdin, out or sys.stdout
    if pid != os.getppid():
        _say(out, error=f"the helper acts on its parent only (asked for {pid}, its parent "
                        f"is {os.getppid()})")
        return 2
    try:
        driver = CudaCheckpoint(pid)
    except RuntimeError as e:
        _say(out, error=str(e)[:300])
        return 1
    _say(out, ready=True)
    for line in inp:
        verb = line.strip()
        if verb == "bye":
            break
        t = time.perf_counter()
        try:
            if verb == "suspend":
                moved = driver.suspend()
                _say(out, seconds=time.perf_counter() - t, moved=moved)
            elif verb == "restore":
                driver.restore()
                _say(out, seconds=time.perf_counter() - t)
            else:
                _say(out, error=f"{verb[:40]!r} is not a request: suspend, restore or bye")
        except RuntimeError as e:
            _say(out, error=str(e)[:300])
    return 0


class Helper:
    """The spare's end of its helper (started here, a child of this process). Each call
    waits for the helper's answer at most as long as the request may take (START_S,
    SUSPEND_S, RESTORE_S), then ends the helper and raises RuntimeError saying what it
    waited for; the driver's refusals come as RuntimeError with the driver's words."""

    COMMAND = [sys.executable, "-m", "tui_trainer.core.processes.cuda_checkpoint"]
    pids: set[int] = set()          # this process's helpers that have not ended

    def __init__(self) -> None:
        # The helper imports this package from where this process did (a relative
        # PYTHONPATH, as a checkout run from its tree has, would not find it elsewhere).
        where = str(Path(__file__).resolve().parents[3])     # (core/processes/ in the package)
        path = os.pathsep.join(p for p in (where, os.environ.get("PYTHONPATH")) if p)
        # In a process session of its own: no signal meant for the launcher's group (which
        # the spare was in when it started it) reaches the helper of the run it became.
        self.proc = subprocess.Popen([*self.COMMAND, str(os.getpid())], bufsize=0,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env={**os.environ, "PYTHONPATH": path},
                                     start_new_session=True)
        Helper.pids.add(self.proc.pid)
        self._buf = b""
        try:
            # Where the kernel lets a process trace only its descendants (Yama's
            # ptrace_scope 1), this lets the helper act on its parent.
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PTRACER, self.proc.pid, 0, 0, 0)
        except (OSError, AttributeError):
            pass
        try:
            self._answer(START_S, "its start")
        except RuntimeError:
            self.close()
            raise

    def _answer(self, timeout: float, what: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.close(kill=True)
                raise RuntimeError(f"CUDA's checkpoint helper did not answer {what} within "
                                   f"{timeout:.0f} s, and was ended")
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError(f"CUDA's checkpoint helper ended (exit {self.close()}) "
                                   f"before it answered {what}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            answer = json.loads(line)
        except ValueError:
            answer = {"error": f"its answer is not JSON: {line[:80]!r}"}
        if not isinstance(answer, dict) or "error" in answer:
            error = answer.get("error") if isinstance(answer, dict) else answer
            raise RuntimeError(str(error)[:300])
        return answer

    def _ask(self, verb: str, timeout: float, what: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(verb.encode() + b"\n")
        except (OSError, ValueError):
            raise RuntimeError(f"CUDA's checkpoint helper ended (exit {self.close()}) before "
                               f"it was asked {what}") from None
        return self._answer(timeout, what)

    def suspend(self) -> tuple[float, int]:
        """Its parent's CUDA moved to the host: the seconds it took and the bytes the
        parent's memory grew by."""
        got = self._ask("suspend", SUSPEND_S, "a suspension")
        return float(got["seconds"]), int(got["moved"])

    def restore(self) -> float:
        """Its parent's CUDA back on the GPU: the seconds it took."""
        return float(self._ask("restore", RESTORE_S, "a restore")["seconds"])

    def memory(self) -> int:
        """The helper's resident memory, in bytes (0 where it cannot be read)."""
        import psutil
        try:
            return psutil.Process(self.proc.pid).memory_info().rss
        except psutil.Error:
            return 0

    def close(self, kill: bool = False) -> int | None:
        """Ends the helper (told to, or killed after CLOSE_S; at once with `kill`) and reaps
        it: its exit status."""
        if self.proc.returncode is None:
            if not kill:
                try:
                    assert self.proc.stdin is not None
                    self.proc.stdin.write(b"bye\n")
                except (OSError, ValueError):
                    pass
                try:
                    self.proc.wait(timeout=CLOSE_S)
                except subprocess.TimeoutExpired:
                    kill = True
            if kill:
                self.proc.kill()
                self.proc.wait(timeout=CLOSE_S)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        Helper.pids.discard(self.proc.pid)
        return self.proc.returncode


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python -m tui_trainer.core.processes.cuda_checkpoint PID (started by the "
              "launcher's suspended spare, PID being the spare's: not for direct use)",
              file=sys.stderr)
        return 2
    return serve(int(argv[0]))


if __name__ == "__main__":
    sys.exit(main())
