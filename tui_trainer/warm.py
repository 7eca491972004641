"""The warm launcher: one process that has imported torch, torchvision and the engine once,
and forks a ready process for each run, so a run's first step comes within a second of
Start instead of after five seconds of imports.

`python -m tui_trainer.warm SOCKET` (started by core.processes.supervisor.WarmLauncher, never by
hand; not a command of the CLI, which this module uses and which does not import it) imports
what training needs, without running any torch op (no thread pool, no CUDA: a fork after
either is unsafe), then listens on a Unix socket. A request carries a command line, its
environment and working directory, and the file descriptors for its stdout and stderr and
the read end of a go-ahead pipe (passed over the socket, SCM_RIGHTS); the launcher forks,
answers the child's pid, and when the child ends, its exit status (as Popen gives it:
negative for a signal). The child runs its command only once the client, having believed
the answer, says go; without it (the client gave up and starts the run cold) it ends
without a word. The child is what a cold
`python -m tui_trainer ARGS` would be: its own process session (it outlives the dashboard),
stdin from /dev/null, output unbuffered, numpy's and torch's global RNGs seeded from the OS
as at interpreter start (Python's hash seed alone is the launcher's, shared by its forks);
tests/test_warm.py checks that a forked run is bit-identical to a cold-started one.

Single-threaded by design (a select loop and SIGCHLD through a wake-up pipe): forking a
process with threads could copy a held lock. It refuses to serve when importing left a
thread running, and the caller then starts runs cold. What the imports made is put out of
the garbage collector's reach before the first fork (`settle`).
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import gc
import json
import os
import re
import select
import selectors
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from .core.settings.machine import CUBLAS_DETERMINISTIC
from .core.processes.supervisor import SPARE_LINE, WARM_LINE
from .core.processes.trust import Untrusted, check_peer, leave_base

MAX_REQUEST = 1 << 20
MAX_PENDING = 32        # connections whose request is not read yet
REQUEST_S = 5.0         # how long a connection may take to send its request
GO_AHEAD_S = 60.0       # how long a forked child waits for its client's go-ahead

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
SPARE_ENV = "TUI_TRAINER_SPARE"
SPARE_MODES = ("0", "driver", "context", "cudnn", "suspended")
DEFAULT_SPARE = "suspended"
HOLDS_CONTEXT = ("context", "cudnn")            # GPU memory held while the spare waits
ON_FIRST_DEVICE = (*HOLDS_CONTEXT, "suspended")  # a context made: runs on that device only
MAKES_CUBLAS = ("cudnn", "suspended")           # cuBLAS's handles made: one workspace only
FIRST_DEVICE = ("auto", "cuda", "cuda:0")       # device settings that mean the first device
SPARE_AFTER_S = 2.0
SPARE_LOSSES = 3        # spares that end before they are given a run: after that, no more
# What CUDA's start reads from the environment (the driver: CUDA_VISIBLE_DEVICES and the
# like; torch: its allocator's and cuBLAS's settings; the loader: the libraries). A spare
# started CUDA under the launcher's; a request whose environment differs in any of these
# gets a new fork.
CUDA_READS = ("CUDA_", "NVIDIA_", "PYTORCH_CUDA_", "PYTORCH_NVML_", "PYTORCH_NO_CUDA_",
              "CUBLAS", "TORCH_CUBLAS", "LD_LIBRARY_PATH", "LD_PRELOAD")


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def warm_up() -> None:
    """Imports what a run needs (the same modules a cold `run` imports), nothing more."""
    from . import engine  # noqa: F401  (first: it keeps torch's caches out of /tmp)
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import torchvision  # noqa: F401

    from . import cli, lifecycle, runner  # noqa: F401
    from .engine import checkpoint, data, distributed, host, models, knobs, train  # noqa
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


def cublas_size_settable() -> bool:
    """Whether this torch lets a process set its cuBLAS workspace's size over what
    CUBLAS_WORKSPACE_CONFIG says, and let it go again (torch 2.15:
    torch.backends.cuda.cublas_workspace_size, and the reset beside it). The size set is
    returned before the variable is ever read (checked here: set, it is answered without
    CUDA; let go, the next answer reads the variable and the device). So a spare that made
    cuBLAS's handles under a set size, and lets it go at Start, leaves the run to read its
    own variable once, as a fresh process does: it may be given a run of any workspace.
    Without it (torch 2.11, the leased GPUs') a spare is given only runs of the workspace
    it made its handles with (Launcher._fits)."""
    import torch
    return all(hasattr(torch._C, name) for name in ("_cuda_setCublasWorkspaceSize",
                                                   "_cuda_resetCublasWorkspaceSize"))


def _workspace_bytes(config: str) -> int:
    """The bytes a CUBLAS_WORKSPACE_CONFIG asks for (":SIZE_KIB:COUNT", repeated), as torch
    sums them; 32 MiB (CUBLAS_DETERMINISTIC's) for one it cannot read."""
    pairs = re.findall(r":([0-9]+):([0-9]+)", config)
    return sum(int(size) * 1024 * int(count) for size, count in pairs) or 4096 * 1024 * 8


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


def start_cuda(context: bool = False, cudnn: bool = False, suspend: bool = False,
               workspace: str | None = CUBLAS_DETERMINISTIC) -> str | None:
    """What the spare starts of CUDA before Start, where there is a CUDA device: the driver
    (`torch.cuda.init()`: cuInit and the device count, no context, so no GPU memory) and
    cuDNN's libraries (host work: 0.30 s here, 125 MiB of the spare's own memory, file pages
    of the libraries), and with `context` the first visible device's primary context (the
    runtime's own way, a device synchronisation: no allocation, so the run's memory figures
    start where a fresh process's do; it holds GPU memory while it waits). What it did, for
    the run's log; None where there is no CUDA device. Raises RuntimeError where a context
    was made without `context` (it would hold GPU memory while nothing trains), or none with
    it. With `cudnn` (and `context`) also cuBLAS's and cuDNN's handles, by a matrix product
    and a convolution of constants forward and backward (`_start_handles`, cuBLAS's under
    `workspace`: a CUBLAS_WORKSPACE_CONFIG, None for torch's default). With `suspend`
    (and both) the caller moves the whole of it out of the GPU next (`_suspend`): the line
    then says what was made only."""
    import torch
    if not torch.cuda.is_available():
        return None
    t = time.perf_counter()
    torch.cuda.init()
    libraries = _load_cudnn()
    if context:
        torch.cuda.synchronize(0)
        if not _primary_contexts():
            raise RuntimeError("the driver reports no CUDA context after a synchronisation")
        if cudnn:
            sized = _start_handles(workspace)
            made = (f"CUDA's driver started, {libraries} cuDNN libraries loaded, a CUDA "
                    f"context, cuBLAS's ({sized}) and cuDNN's handles made")
            if suspend:
                return f"{made} ({time.perf_counter() - t:.2f} s)"
            return (f"{made} before Start ({time.perf_counter() - t:.2f} s; they held GPU "
                    f"memory while they waited, as {SPARE_ENV}=cudnn asks)")
        return (f"CUDA's driver started, {libraries} cuDNN libraries loaded and a CUDA context "
                f"made before Start ({time.perf_counter() - t:.2f} s; the context held GPU "
                f"memory while it waited, as {SPARE_ENV}=context asks)")
    if _primary_contexts():
        raise RuntimeError("starting CUDA's driver made a CUDA context, which holds GPU "
                           "memory; no spare is kept")
    return (f"CUDA's driver started and {libraries} cuDNN libraries loaded before Start "
            f"({time.perf_counter() - t:.2f} s; no CUDA context, no GPU memory held)")


def _start_handles(workspace: str | None) -> str:
    """cuBLAS's and cuDNN's handles of this thread (the run's, which makes its forward
    passes) and of autograd's device thread (its backward passes), by a matrix product and a
    convolution of constants forward and backward on the first device, under the default
    flags; what sized cuBLAS's workspace. Where torch can set that size
    (`cublas_size_settable`) it is set (`workspace`'s bytes), never read from the
    environment, and let go at Start (`_let_cublas_size_go`); elsewhere this process's
    CUBLAS_WORKSPACE_CONFIG is made `workspace` (None: unset, torch's default). Its shapes
    are none a run of this project makes (a plan cuDNN keeps for a shape is never one a run
    asks for), no random number is drawn, and what it allocated goes back to the device with
    cuBLAS's workspaces and the allocator's peaks reset: the run's first matrix product
    allocates its own workspace, as in a fresh process, and its memory figures start where
    a fresh process's do."""
    import torch
    import torch.nn.functional as F
    if cublas_size_settable():
        size = _workspace_bytes(workspace or CUBLAS_DETERMINISTIC)
        torch._C._cuda_setCublasWorkspaceSize(size)
        sized = f"workspace size set to {size // 1024} KiB until Start, then the run's own"
    elif workspace is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        sized = "torch's default workspace"
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = workspace
        sized = f"workspace {workspace}"
    a = torch.full((3, 17), 0.5, device="cuda:0")
    b = torch.full((17, 5), 0.5, device="cuda:0", requires_grad=True)
    (a @ b).sum().backward()
    x = torch.full((3, 1, 17, 17), 0.5, device="cuda:0")
    w = torch.full((5, 1, 2, 2), 0.5, device="cuda:0", requires_grad=True)
    F.conv2d(x, w).sum().backward()
    torch.cuda.synchronize(0)
    del a, b, x, w
    _give_memory_back()
    return sized


def _give_memory_back() -> None:
    """What a spare's CUDA made before Start gives its memory back: cuBLAS's workspaces,
    the allocator's cache, its peaks (a run's first matrix product makes its own workspace,
    and its memory figures start where a fresh process's do)."""
    import torch
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(0)


def _let_cublas_size_go() -> None:
    """At Start, in a spare whose cuBLAS's workspace size was set (`_start_handles`): the
    run's first matrix product reads its own CUBLAS_WORKSPACE_CONFIG, as a fresh process's
    does. Nothing where torch cannot set it."""
    import torch
    if cublas_size_settable():
        torch._C._cuda_resetCublasWorkspaceSize()


def loads_kernels(values: dict[str, Any] | None) -> bool:
    """Whether a cudnn or suspended spare made for a run of this config (a config's dict;
    None: the default config) loads its kernels before Start (`_load_kernels`): unless the
    run asks cuDNN to benchmark its engines (cudnn_benchmark), whose choices the spare must
    not make for it."""
    from .core.settings import config
    if values is None:
        return not config.DEFAULTS.cudnn_benchmark
    return values.get("cudnn_benchmark") is False


def _load_kernels(values: dict[str, Any] | None, workspace: str | None) -> str:
    """In a cudnn or suspended spare, after `_start_handles`: the kernels of a run of this
    config loaded (CUDA loads a kernel's module when it is first launched: on an H100 that
    was 0.12-0.15 s of a first step), by engine.cuda_start's `warm_shapes` (one training step
    and one evaluation batch of the config's net, batch sizes, autocast, memory format and
    optimizer, on a net of constants: no random number drawn) under the config's
    deterministic, cuDNN and float32 matmul settings, with cuDNN choosing engines by its
    heuristics, as the run will (`loads_kernels`: not for a run that benchmarks them). Those
    settings go back to what they were, and so does the memory (cuBLAS's workspaces, the
    allocator's cache and peaks): the run sets its own and its figures start where a fresh
    process's do. Where less of the GPU's memory is free than the shapes may take
    (engine.cuda_start's SHAPES_MIN_FREE_BYTES: other runs train on it), nothing is loaded.
    What was done, for the spare's line ("" without CUDA here)."""
    import torch
    from .core.settings import config
    from .core.text import shown
    if not torch.cuda.is_initialized() or not loads_kernels(values):
        return ""
    try:
        cfg = config.DEFAULTS if values is None else config.from_dict(values)
    except Exception as e:  # noqa: BLE001 - a config this torch cannot read: none loaded
        return f"; no run's kernels loaded ({shown(e, 120)})"
    from .engine.cuda_start import SHAPES_MIN_FREE_BYTES, warm_shapes
    from .engine.knobs import algorithms_of
    from .engine.optim import make_optimizer
    try:
        free = torch.cuda.mem_get_info(0)[0]
    except RuntimeError as e:       # the run meets what CUDA says itself
        return f"; no run's kernels loaded ({shown(e, 120)})"
    if free < SHAPES_MIN_FREE_BYTES:        # other runs train on it: theirs comes first
        return (f"; the kernels of a run of {cfg.model} left to it ({free / 2**30:.1f} GiB of "
                f"the GPU's memory free, under the {SHAPES_MIN_FREE_BYTES / 2**30:.0f} GiB "
                "its shapes may take)")
    env = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    t = time.perf_counter()
    try:
        if workspace is not None:       # what deterministic algorithms check cuBLAS with
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = workspace
        with algorithms_of(cfg, cudnn_benchmark=False):
            train, ev = warm_shapes(cfg, torch.device("cuda:0"), 1, make_optimizer)
            torch.cuda.synchronize(0)
        said = (f"; the kernels of a run of {cfg.model} loaded (a training step of "
                f"{train:,} and an evaluation batch of {ev:,} on a net of constants, "
                f"{time.perf_counter() - t:.2f} s)")
    except Exception as e:  # noqa: BLE001 - the run's first step loads the rest
        said = f"; the kernels of a run of {cfg.model} not all loaded ({shown(e, 120)})"
    finally:
        if env is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = env
        gc.collect()    # a capturable optimizer and its rates refer to each other
        _give_memory_back()
    return said


CU_LIMIT_STACK_SIZE = 0


def _stack_limit(value: int | None = None) -> int:
    """The stack limit (bytes a GPU thread's stack) of this thread's CUDA context, set first
    to `value` where given (cuCtxSetLimit: the driver sizes the local memory it keeps for
    every thread the GPU can hold by it). RuntimeError where the driver refuses."""
    driver = ctypes.CDLL("libcuda.so.1")
    if value is not None:
        code = driver.cuCtxSetLimit(ctypes.c_int(CU_LIMIT_STACK_SIZE), ctypes.c_size_t(value))
        if code != 0:
            raise RuntimeError(f"cuCtxSetLimit(CU_LIMIT_STACK_SIZE, {value}) returned {code}")
    got = ctypes.c_size_t()
    code = driver.cuCtxGetLimit(ctypes.byref(got), ctypes.c_int(CU_LIMIT_STACK_SIZE))
    if code != 0:
        raise RuntimeError(f"cuCtxGetLimit(CU_LIMIT_STACK_SIZE) returned {code}")
    return got.value


def _load_cudnn() -> int:
    """Loads cuDNN and the libraries it would load at a run's first convolution (cuDNN 9
    opens its engines, heuristics and ops libraries by name on first use: loaded here, the
    dynamic loader hands the same ones back). How many were loaded."""
    import torch
    if not torch.backends.cudnn.is_available():
        return 0
    torch.backends.cudnn.version()                 # libcudnn itself
    with open("/proc/self/maps") as maps:
        where = next((Path(line.split()[-1]).parent for line in maps
                      if "/libcudnn.so" in line), None)
    loaded = 0
    for path in sorted(where.glob("libcudnn_*.so*")) if where is not None else ():
        try:
            ctypes.CDLL(str(path))
            loaded += 1
        except OSError:
            pass
    return loaded


def _primary_contexts() -> int:
    """How many devices have a CUDA primary context in this process (the driver's own
    answer, cuDevicePrimaryCtxGetState); 0 where the driver cannot be asked."""
    import torch
    try:
        driver = ctypes.CDLL("libcuda.so.1")
        get, state = driver.cuDeviceGet, driver.cuDevicePrimaryCtxGetState
    except (OSError, AttributeError):
        return 0
    active = 0
    for i in range(torch.cuda.device_count()):
        dev, flags, on = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        if get(ctypes.byref(dev), i) == 0 and \
                state(dev, ctypes.byref(flags), ctypes.byref(on)) == 0:
            active += int(on.value != 0)
    return active


def prepare() -> str | None:
    """What the launcher does before it serves: the imports, the check that they left no
    thread running, and `settle`. Why it cannot serve, or None."""
    warm_up()
    if _threads() > 1:
        return f"{_threads()} threads after importing torch; forking is not safe, runs start cold"
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
    from .engine.distributed import die_with_parent
    target = Path(path)
    if os.path.lexists(target):
        # It makes its own socket; a file (or anything) already there is not replaced.
        print(f"tui_trainer.warm: {target} exists; the launcher makes its socket itself, at "
              "a path where nothing is", file=sys.stderr)
        return 2
    # It ends with the dashboard (or study) that started it, and cleans up after itself; a
    # child forked a moment ago ends as SIGTERM's default would end it.
    me = os.getpid()
    signal.signal(signal.SIGTERM, lambda *_: _leave(target) if os.getpid() == me
                  else os._exit(128 + signal.SIGTERM))
    die_with_parent(signal.SIGTERM)
    why = prepare()
    if why:
        print(f"tui_trainer.warm: {why}", file=sys.stderr)
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


class Launcher:
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
        # The spare (its pid and the launcher's end of its socket pair), when one waits; when
        # the next is due (None: never, spares are off or kept failing); how many were lost.
        self.spare: tuple[int, socket.socket] | None = None
        self.spare_mode, wrong = spare_mode()
        if wrong:
            print(f"tui_trainer.warm: {wrong}", file=sys.stderr, flush=True)
        self.spare_due = None if self.spare_mode is None else time.monotonic()
        self.spares_lost = 0
        # The cuBLAS workspace the next spare makes its handles with, and whether a spare
        # may be given a run of any (`cublas_size_settable`; else the workspace of the last
        # CUDA run the waiting spare did not fit: `_replace`).
        self.spare_cublas = cublas_used()
        self.any_cublas = cublas_size_settable()
        self.made_with: str | None = None       # the waiting spare's
        # The config (a dict) whose kernels the next cudnn or suspended spare loads: the last
        # CUDA run's that said it (None: the default config's), and the waiting spare's.
        self.spare_config: dict[str, Any] | None = None
        self.made_for: dict[str, Any] | None = None

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

    def _make_spare(self) -> None:
        self.spare_due = None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        launcher = os.getpid()
        pid = os.fork()
        if pid == 0:
            ours.close()
            self._forget()
            _spare(theirs, launcher, self.spare_mode, self.spare_cublas,
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
            print(f"tui_trainer.warm: {SPARE_ENV}=suspended: the spare could not be "
                  "suspended (above); the next spares start CUDA's driver only, holding no "
                  "GPU memory", file=sys.stderr, flush=True)
            self.spare_due = time.monotonic() + SPARE_AFTER_S
        elif self.spares_lost >= SPARE_LOSSES or code == SPARE_REFUSED:
            print(f"tui_trainer.warm: no more spares ({self.spares_lost} ended before they "
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
        return self.spare_mode not in MAKES_CUBLAS or not loads_kernels(self.made_for) or \
            loads_kernels(request.get("config") or {})

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
        print(f"tui_trainer.warm: {why}", file=sys.stderr, flush=True)

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
            _child(request, fds)          # never returns
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


def ready_line(pid: int) -> str:
    """How a spare's line in the launcher's log starts once it waits ready (what it did
    follows): what a benchmark waits for before it times a run given a spare."""
    return f"tui_trainer.warm: spare {pid} ready"


SPARE_REFUSED = 3       # a spare's exit: it cannot be one here (its CUDA start failed)
SUSPEND_REFUSED = 4     # a suspended spare's: its CUDA started, but could not be suspended


def _spare(conn: socket.socket, launcher: int, mode: str,
           workspace: str | None = CUBLAS_DETERMINISTIC,
           values: dict[str, Any] | None = None) -> None:
    """The spare: starts CUDA's driver where there is a CUDA device (a cudnn or suspended
    one: also cuBLAS's handles under `workspace` and the kernels of a run of config
    `values`), then waits for the launcher to hand it a request (as it reached the
    launcher, with its descriptors) and runs it as a child forked for it would. It ends with
    the launcher: at its end of the pair closing, or by SIGTERM when the launcher dies
    (PR_SET_PDEATHSIG). Never returns."""
    from .engine.distributed import die_with_parent
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
            did = start_cuda(mode in ON_FIRST_DEVICE, mode in MAKES_CUBLAS, suspended,
                             workspace)
            if did is not None and mode in MAKES_CUBLAS:
                did += _load_kernels(values, workspace)
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
                    helper, did, stack = _suspend(did)
                    if _asked(conn) == "ended":     # replaced while it was suspended
                        helper.close()
                        os._exit(0)
            print(f"{ready_line(os.getpid())}: {did or 'no CUDA device here'}",
                  file=sys.stderr, flush=True)
        except Exception as e:          # torch's CUDA errors, a context made, ...
            print(f"tui_trainer.warm: the spare cannot be one: {e}", file=sys.stderr,
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
                        _stack_limit(stack)
                        did += f", its stack limit set back to {stack} bytes"
                    except (OSError, AttributeError, RuntimeError) as e:
                        did += f"; its stack limit was not set back: {str(e)[:120]}"
                did += ")"
                before_exit = functools.partial(_suspend_before_exit, helper)
            except RuntimeError as e:
                helper.close()
                cold = f"a spare could not restore its CUDA at Start ({str(e)[:200]})"
        if cold is None:
            _let_cublas_size_go()
        _die_alone()        # given a run: it outlives the launcher, as a forked one does
        _child(json.loads(data), fds,
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


def _die_alone() -> None:
    """Undoes die_with_parent (PR_SET_PDEATHSIG 0)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, 0)       # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _child(request: dict[str, Any], fds: list[int], spare: str | None = None,
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
        from .cli import main
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


def _suspend(did: str) -> tuple[Any, str, int | None]:
    """The spare's CUDA (what `did` says was made) moved out of the GPU into its host memory
    by a helper process (cuda_checkpoint: the checkpoint API acts from outside the process it
    moves): the helper, kept to restore it, the line that says what was done, and the stack
    limit to set back at Start (None: left as it was). Before the suspension the context's
    stack limit is made 0: the driver then drops the local memory it keeps for every thread
    the GPU can hold (on an H100 264 MiB of the 630 MiB moved, and 0.06 s of a 0.27 s
    restore; benchmarks/suspend_cost.py), which it makes again when the limit is set back.
    A limit left low changes no result: the driver raises it for each kernel launch as
    needed (cuCtxSetLimit's documentation). RuntimeError where that failed (the helper is
    ended; the context may still be held)."""
    import torch
    from .core.processes.cuda_checkpoint import Helper
    helper = Helper()
    stack = None
    if torch.cuda.is_initialized():
        try:
            was = _stack_limit()
            _stack_limit(0)
            stack = was
        except (OSError, AttributeError, RuntimeError):
            pass                        # suspended as it is
    try:
        seconds, moved = helper.suspend()
    except RuntimeError:
        helper.close()
        if stack is not None:
            try:
                _stack_limit(stack)
            except (OSError, AttributeError, RuntimeError):
                pass                    # (the suspension's error is the one to say)
        raise
    return helper, (f"{did}, then suspended by CUDA's checkpoint API ({seconds:.2f} s, by a "
                    f"helper process of {helper.memory() / 2**20:,.0f} MiB; the spare's host "
                    f"memory grew by {moved / 2**20:,.0f} MiB to hold them"
                    f"{'' if stack is None else ', its stack limit lowered first'}; no GPU "
                    "memory held while it waited)"), stack


def _suspend_before_exit(helper: Any) -> None:
    """A run given a suspended spare has its CUDA suspended again by its helper just before
    its process ends, ends the helper, and says so in its log. Ending a restored CUDA
    context that is live hung whole machines on some drivers: NVIDIA/cuda-checkpoint issue
    #53 (the open kernel module 595.71.05; ending a process after a kill). Ending a
    checkpointed one did not, which is the workaround given there. Nothing calls CUDA after
    it: the process ends at once. A run killed by SIGKILL ends without it (its helper ends
    when its pipe closes)."""
    try:
        import torch
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        seconds, moved = helper.suspend()
    except Exception as e:  # noqa: BLE001 - a CUDA that fails here ends as it is
        said = f"its CUDA was not suspended again before it ended: {str(e)[:200]}"
    else:
        said = (f"its CUDA suspended again before it ended ({seconds:.2f} s, "
                f"{moved / 2**20:,.0f} MiB to host memory; NVIDIA/cuda-checkpoint issue #53)")
    finally:
        helper.close()
    os.write(2, f"{time.strftime('%H:%M:%S')} {said}\n".encode())


def main(argv: list[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="python -m tui_trainer.warm",
                                     description="The warm launcher (started by the dashboard "
                                     "and by studies; not for direct use).")
    parser.add_argument("socket", help="the Unix socket to listen on (made here)")
    try:
        return serve(parser.parse_args(argv).socket)
    finally:
        gc.unfreeze()       # an ending other than _leave's: torn down at exit as usual


if __name__ == "__main__":
    sys.exit(main())
