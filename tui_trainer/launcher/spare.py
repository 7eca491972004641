"""The spare's policy: a process forked before anyone asks, that has started what every
run on CUDA starts (engine/cuda_start.py does the torch and driver work) and waits to be given
a run (`spare_process`); which spare is made (`spare_mode`), which run it may take, and when
the next is made (`SparePolicy`, mixed into the launcher's loop: launcher/server.py).
"""

from __future__ import annotations

import functools
import json
import os
import select
import signal
import socket
import sys
import time
import traceback
from typing import Any

from ..core.settings.machine import CUBLAS_DETERMINISTIC, FIRST_DEVICES, SPARE_ENV
from ..engine import cuda_start
from .child import die_alone, run_request
from .client import MAX_REQUEST, SPARE_LINE

# The spare: a process forked before anyone asks, that has started what every run on CUDA starts
# and that holds no GPU memory (`start_cuda`), and waits; a request for a run that starts CUDA
# (core.settings.machine.cuda_device) is given to it instead of a new fork, and a new spare is
# made SPARE_AFTER_S later (not at once: the run it was given starts CUDA now). SPARE_ENV (the
# launcher's environment) says which spare: "suspended" (the default since issue 34: what cudnn
# makes, below, then moved out of the GPU into the spare's host memory by CUDA's checkpoint API,
# and restored when it is given a run: no GPU memory held while it waits; where the driver has
# no checkpoint API or it refuses the spare, the next spares are "driver" ones), "driver" (the
# driver started and cuDNN's libraries loaded, no context: no GPU memory held, less of CUDA's
# start done), "context" (also CUDA's context on the first visible device, which holds GPU
# memory while it waits: only where the user asks; given only runs on that device), "cudnn" (the
# context, cuBLAS's and cuDNN's handles, of this thread and of autograd's, by a matrix product
# and a convolution of constants: more memory held, more of CUDA's start done before Start;
# given runs of any cuBLAS workspace where torch can set the workspace's size, else only runs of
# the workspace it made its handles with: `cublas_size_settable`) or "0" (none). The cudnn and
# suspended spares also load the kernels of the last CUDA run's shapes (`_load_kernels`; the
# default config's before any), which caches cuDNN's heuristic choice of an engine for them:
# such a spare is not given a run that asks cuDNN to benchmark its engines instead
# (`Launcher._same_plans`).
SPARE_MODES = ("0", "driver", "context", "cudnn", "suspended")

DEFAULT_SPARE = "suspended"

HOLDS_CONTEXT = ("context", "cudnn")            # GPU memory held while the spare waits

ON_FIRST_DEVICE = (*HOLDS_CONTEXT, "suspended")  # a context made: runs on that device only

MAKES_CUBLAS = ("cudnn", "suspended")           # cuBLAS's handles made: one workspace only

FIRST_DEVICE = FIRST_DEVICES                    # device settings that mean the first device

SPARE_AFTER_S = 2.0

SPARE_LOSSES = 3        # spares that end before they are given a run: after that, no more

# What CUDA's start reads from the environment (the driver: CUDA_VISIBLE_DEVICES and the
# like; torch: its allocator's and cuBLAS's settings; the loader: the libraries). A spare
# started CUDA under the launcher's; a request whose environment differs in any of these
# gets a new fork.
CUDA_READS = ("CUDA_", "NVIDIA_", "PYTORCH_CUDA_", "PYTORCH_NVML_", "PYTORCH_NO_CUDA_",
              "CUBLAS", "TORCH_CUBLAS", "LD_LIBRARY_PATH", "LD_PRELOAD")


def cuda_reads(env: dict[str, str] | os._Environ) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(CUDA_READS)}


def cublas_used(env: dict[str, str] | os._Environ | None = None,
                own: str | None = CUBLAS_DETERMINISTIC) -> str | None:
    """The cuBLAS workspace a process uses: its environment's CUBLAS_WORKSPACE_CONFIG, else
    the one it sets for itself (`own`, core.settings.machine.cublas_workspace; None: torch's
    default). Without arguments: the one the launcher's first spare makes cuBLAS's handles
    with, the launcher's environment's or else the default config's (deterministic:
    CUBLAS_DETERMINISTIC). torch reads it when it sizes a handle's workspace, and some
    versions only once in a process (torch 2.15's getChosenWorkspaceSize keeps it in a
    static; 2.11 reads it each time): see `cublas_size_settable`."""
    env = os.environ if env is None else env
    return env.get("CUBLAS_WORKSPACE_CONFIG") or own


def spare_mode() -> tuple[str | None, str | None]:
    """The spare SPARE_ENV asks for ("driver", "context", "cudnn", "suspended", or None for
    none; unset or empty: DEFAULT_SPARE), and a line saying what was wrong with its value
    (then: DEFAULT_SPARE)."""
    value = os.environ.get(SPARE_ENV, "") or DEFAULT_SPARE
    if value in SPARE_MODES:
        return (None if value == "0" else value), None
    return DEFAULT_SPARE, (f"{SPARE_ENV}: {value[:40]!r} is not one of "
                           f"{', '.join(SPARE_MODES)}; the default spare ({DEFAULT_SPARE}) "
                           "is made")


def ready_line(pid: int) -> str:
    """How a spare's line in the launcher's log starts once it waits ready (what it did
    follows): what a benchmark waits for before it times a run given a spare."""
    return f"tui_trainer.launcher: spare {pid} ready"


SPARE_REFUSED = 3       # a spare's exit: it cannot be one here (its CUDA start failed)
SUSPEND_REFUSED = 4     # a suspended spare's: its CUDA started, but could not be suspended


class SparePolicy:
    """The launcher's spare: when one is made (`_make_spare`), which request it may take
    (`_fits`), what a request it did not fit changes (`_replace`), and what a lost one
    does to the next (`_spare_lost`). Mixed into launcher.server.Launcher, whose `_forget`
    a forked spare calls first."""

    def _init_spares(self) -> None:
        # The spare (its pid and the launcher's end of its socket pair), when one waits; when
        # the next is due (None: never, spares are off or kept failing); how many were lost.
        self.spare: tuple[int, socket.socket] | None = None
        self.spare_mode, wrong = spare_mode()
        if wrong:
            print(f"tui_trainer.launcher: {wrong}", file=sys.stderr, flush=True)
        self.spare_due = None if self.spare_mode is None else time.monotonic()
        self.spares_lost = 0
        # The cuBLAS workspace the next spare makes its handles with, and whether a spare
        # may be given a run of any (`cublas_size_settable`; else the workspace of the last
        # CUDA run the waiting spare did not fit: `_replace`).
        self.spare_cublas = cublas_used()
        self.any_cublas = cuda_start.cublas_size_settable()
        self.made_with: str | None = None       # the waiting spare's
        # The config (a dict) whose kernels the next cudnn or suspended spare loads: the last
        # CUDA run's that said it (None: the default config's), and the waiting spare's.
        self.spare_config: dict[str, Any] | None = None
        self.made_for: dict[str, Any] | None = None

    def _make_spare(self) -> None:
        self.spare_due = None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        launcher = os.getpid()
        pid = os.fork()
        if pid == 0:
            ours.close()
            self._forget()
            spare_process(theirs, launcher, self.spare_mode, self.spare_cublas,
                   self.spare_config)                                   # never returns
        theirs.close()
        self.spare, self.made_with = (pid, ours), self.spare_cublas
        self.made_for = self.spare_config

    def _spare_lost(self, code: int) -> None:
        """The spare ended before it was given a run (it says why in launcher.log)."""
        assert self.spare is not None
        self.spare[1].close()
        self.spare = None
        self.spares_lost += 1
        if code == SUSPEND_REFUSED and self.spare_mode == "suspended":
            # Its CUDA started, but the checkpoint API did not take it (no API in this
            # driver, a helper refused): the next spares start the driver only.
            self.spare_mode = "driver"
            print(f"tui_trainer.launcher: {SPARE_ENV}=suspended: the spare could not be "
                  "suspended (above); the next spares start CUDA's driver only, holding no "
                  "GPU memory", file=sys.stderr, flush=True)
            self.spare_due = time.monotonic() + SPARE_AFTER_S
        elif self.spares_lost >= SPARE_LOSSES or code == SPARE_REFUSED:
            print(f"tui_trainer.launcher: no more spares ({self.spares_lost} ended before they "
                  f"were given a run; the last with exit {code}): runs are forked when "
                  "asked for", file=sys.stderr, flush=True)
        else:
            self.spare_due = time.monotonic() + SPARE_AFTER_S

    def _fits(self, request: dict[str, Any]) -> bool:
        """Whether the spare waiting (if one does) may take this request: a run that starts
        CUDA (its device setting in "spare"), on the device whose context a "context" spare
        made, whose environment agrees with the launcher's in what CUDA's start reads;
        where the spare made cuBLAS's handles and torch cannot set its workspace's size,
        that uses the workspace they were made with (`_same_cublas`); where it loaded a
        run's kernels, one that lets cuDNN's heuristics choose its engines (`_same_plans`)."""
        return self._takes(request) and self._same_cublas(request) and \
            self._same_plans(request)

    def _takes(self, request: dict[str, Any]) -> bool:
        """`_fits` but for the cuBLAS workspace and cuDNN's engines."""
        device = request.get("spare")
        return self.spare is not None and device is not None and \
            (self.spare_mode not in ON_FIRST_DEVICE or device in FIRST_DEVICE) and \
            cuda_reads(request["env"]) == cuda_reads(os.environ)

    def _same_cublas(self, request: dict[str, Any]) -> bool:
        """Whether the waiting spare's cuBLAS handles suit the request's run: always, unless
        it made them (MAKES_CUBLAS) where torch reads the workspace's size once and cannot
        set it (`cublas_size_settable`); then only for the run's own workspace (`cublas_used`:
        its environment's, else the one it sets for itself, in "cublas")."""
        return self.spare_mode not in MAKES_CUBLAS or self.any_cublas or \
            cublas_used(request["env"], request.get("cublas")) == self.made_with

    def _same_plans(self, request: dict[str, Any]) -> bool:
        """Whether the waiting spare's cuDNN suits the request's run: always, unless it
        loaded a run's kernels (`loads_kernels`), which left cuDNN's heuristic choices of
        engines cached for those shapes; then only for a run that says (its config, in
        "config") that it lets the heuristics choose, as a run asking cuDNN to benchmark
        would find them chosen and benchmark nothing."""
        return self.spare_mode not in MAKES_CUBLAS or \
            not cuda_start.loads_kernels(self.made_for) or \
            cuda_start.loads_kernels(request.get("config") or {})

    def _replace(self, request: dict[str, Any]) -> None:
        """A run on CUDA that the waiting spare did not take only for its cuBLAS workspace
        (`_same_cublas`) or its cuDNN's cached choices (`_same_plans`): that spare ends (its
        end of the pair closed: it leaves without a word, its helper with it), and the next
        is made, SPARE_AFTER_S later, for the run (its workspace, its config): a user who
        changed them (deterministic off: torch's default workspace; cudnn_benchmark on: no
        kernels loaded) gets spares again from the next Start on. The launcher's log says
        so. A run that does not say its config is forked and the spare kept: the next would
        be made for the same config."""
        assert self.spare is not None
        wanted = cublas_used(request["env"], request.get("cublas"))
        if self._same_cublas(request) and request.get("config") is None:
            return
        if not self._same_cublas(request):
            why = (f"a run of cuBLAS workspace {wanted or 'default'} was forked: the spare "
                   f"had made cuBLAS's handles with {self.made_with or 'default'}, which "
                   "this torch reads once in a process; the next spares make them with the "
                   "run's")
        else:
            why = ("a run that asks cuDNN to benchmark its engines (cudnn_benchmark) was "
                   "forked: the spare had loaded another run's kernels, its engines chosen "
                   "by cuDNN's heuristics; the next spares load none")
        self.spare[1].close()
        self.spare = None
        self.spare_cublas = wanted
        self.spare_due = time.monotonic() + SPARE_AFTER_S
        print(f"tui_trainer.launcher: {why}", file=sys.stderr, flush=True)

    def _give(self, request: dict[str, Any], fds: list[int]) -> int | None:
        """Hands a request to the spare; its pid, or None when it is gone (then the request
        gets a new fork, and the spare's end is reaped as a loss)."""
        assert self.spare is not None
        pid, conn = self.spare
        try:
            socket.send_fds(conn, [json.dumps(request).encode()], fds)
        except OSError:
            return None
        self.spare = None
        conn.close()
        self.spare_due = time.monotonic() + SPARE_AFTER_S
        return pid


def spare_process(conn: socket.socket, launcher: int, mode: str,
           workspace: str | None = CUBLAS_DETERMINISTIC,
           values: dict[str, Any] | None = None) -> None:
    """The spare: starts CUDA's driver where there is a CUDA device (a cudnn or suspended
    one: also cuBLAS's handles under `workspace` and the kernels of a run of config
    `values`), then waits for the launcher to hand it a request (as it reached the
    launcher, with its descriptors) and runs it as a child forked for it would. It ends with
    the launcher: at its end of the pair closing, or by SIGTERM when the launcher dies
    (PR_SET_PDEATHSIG). Never returns."""
    from ..engine.distributed import die_with_parent
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        die_with_parent(signal.SIGTERM)           # the launcher's handler: os._exit here
        if os.getppid() != launcher:
            os._exit(0)
        suspended = mode == "suspended"
        cold = None           # why the run it is given must start cold, in this process
        helper = None         # the process that suspended it (suspended), to restore it
        stack = None          # its CUDA's stack limit before the suspension, set back at Start
        refused = SPARE_REFUSED
        try:
            did = cuda_start.start_cuda(mode in ON_FIRST_DEVICE, mode in MAKES_CUBLAS,
                                        suspended, workspace)
            if did is not None and mode in MAKES_CUBLAS:
                did += cuda_start.load_kernels(values, workspace)
            asked = _asked(conn)
            if asked == "ended":        # replaced (Launcher._replace) or the launcher ended
                os._exit(0)
            if suspended and did is not None:       # (None: no CUDA device here)
                if asked == "run":
                    # A run was handed to it while its CUDA started: suspended now, it would
                    # be restored at once, and that run would wait for both.
                    did += " (not suspended: a run was already waiting for it)"
                else:
                    refused = SUSPEND_REFUSED
                    helper, did, stack = cuda_start.suspend(did)
                    if _asked(conn) == "ended":     # replaced while it was suspended
                        helper.close()
                        os._exit(0)
            print(f"{ready_line(os.getpid())}: {did or 'no CUDA device here'}",
                  file=sys.stderr, flush=True)
        except Exception as e:          # torch's CUDA errors, a context made, ...
            print(f"tui_trainer.launcher: the spare cannot be one: {e}", file=sys.stderr,
                  flush=True)
            if not select.select([conn], [], [], 0)[0]:
                os._exit(refused)
            # A run was handed to it meanwhile: it runs, and meets CUDA's problem itself
            # as a process forked for it would, its log saying what the spare met; after a
            # suspension that failed, its CUDA may not be usable: the run starts cold.
            did = f"CUDA's start failed before Start: {str(e)[:200]}"
            if suspended:
                cold = f"a spare's suspension failed before Start ({str(e)[:200]})"
        # Bounded by the launcher's life: its end closing reads as an empty message.
        select.select([conn], [], [])
        data, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
        conn.close()
        if not data or len(fds) != 3:
            if helper is not None:
                helper.close()
            os._exit(0)
        before_exit = None
        if helper is not None:
            try:
                t = time.perf_counter()
                helper.restore()
                did += f"; restored at Start ({time.perf_counter() - t:.2f} s"
                if stack is not None:
                    try:
                        cuda_start.stack_limit(stack)
                        did += f", its stack limit set back to {stack} bytes"
                    except (OSError, AttributeError, RuntimeError) as e:
                        did += f"; its stack limit was not set back: {str(e)[:120]}"
                did += ")"
                before_exit = functools.partial(cuda_start.suspend_before_exit, helper)
            except RuntimeError as e:
                helper.close()
                cold = f"a spare could not restore its CUDA at Start ({str(e)[:200]})"
        if cold is None:
            cuda_start.let_cublas_size_go()
        die_alone()        # given a run: it outlives the launcher, as a forked one does
        run_request(json.loads(data), fds,
               SPARE_LINE + (f": {did}" if did else " (no CUDA here)"), cold, before_exit)
    except BaseException:             # noqa: BLE001 - a forked process never returns
        traceback.print_exc()
        os._exit(1)


def _asked(conn: socket.socket) -> str | None:
    """What waits on the spare's end of its pair: "run" (a request, left there), "ended"
    (the launcher closed its end), or None (nothing yet)."""
    if not select.select([conn], [], [], 0)[0]:
        return None
    try:
        return "run" if conn.recv(1, socket.MSG_PEEK) else "ended"
    except OSError:
        return "ended"
