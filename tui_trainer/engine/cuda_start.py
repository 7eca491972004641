"""CUDA's start, beside a run's setup: asked for, not the default.

A run's first use of CUDA pays for more than its computation: the context, cuBLAS's and
cuDNN's handles, and each kernel's first load (CUDA loads a kernel module when it is first
launched), cuDNN's choice of an engine for each new shape, the fused optimizer's kernels. On
an H100 that was 0.45 s of a 0.65 s race to 98% (the first 20 steps; the later epochs took
0.05 s each). `CudaStart` can do that work in a thread while the run's own thread loads the
data and builds the model, and the run joins it before it starts training:

- `TUI_TRAINER_CUDA_START=handles`: the context, cuBLAS's handle (a matmul of constants)
  and cuDNN's (a convolution of constants, forward and backward);
- `TUI_TRAINER_CUDA_START=shapes`: those, then the run's own shapes (`warm_shapes`): one
  training step (forward, loss, backward, gradient norm, the run's optimizer) and one
  evaluation batch, on a net of the run's architecture whose weights are constants, with
  the run's batch sizes, autocast and memory format, on a stream of its own.

(`warm_shapes` is also what the launcher's cudnn and suspended spares run before Start, for
the last CUDA run's config: `load_kernels`, below.)

Unset (or `0`), the run starts CUDA in its own thread as its setup and first steps reach
it. That is the default because it came first from Start on an H200 (docs/benchmarks.md,
2026-11-26: the first step 0.57 s after Start against 0.65 s with the handles' thread and
0.66 s with the shapes'; 98% 0.82 s after Start against 0.94 and 0.89 s): the thread moves
CUDA's start before the training's clock, but the setup it overlaps is short, and its own
kernels (the handles' matmul and convolution, the shapes' step of constants) are more to
load than the run would have loaded.

Neither draws a random number: the net is built on the meta device (no initialisation runs)
and kept in eval mode (dropout draws nothing there), so no generator the run draws from is
touched, whenever the thread runs (the kernels of dropout and of BatchNorm's training mode
still load at the run's first step). Neither leaves memory the run did not make: the shapes'
blocks are on their own stream (the caching allocator gives them to nothing else) and go
back to the device at the join, with the cuBLAS workspaces (the run's first matmul makes its
own, as it would have).

The launcher's spare (launcher/spare.py decides when and for which run) starts CUDA before
Start with the functions below `CudaStart`: the driver and cuDNN's libraries (`start_cuda`),
the first device's primary context, cuBLAS's and cuDNN's handles (`_start_handles`), the
kernels of the last CUDA run's shapes (`load_kernels`, by `warm_shapes`), and the move of all
of it out of the GPU into the spare's host memory by CUDA's checkpoint API (`suspend`),
restored at Start. Nothing there draws a random number either, and what it allocated goes
back to the device before a run is given the process.
"""

from __future__ import annotations

import ctypes
import gc
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..core.settings.config import RunConfig
from ..core.settings.machine import (CUBLAS_DETERMINISTIC, CUDA_START_ENV, CUDA_STARTS,
                                     SPARE_ENV)
from ..core.text import shown
from .models import MODELS
from .step import batch_in, eval_sums, forward_loss

CUDA_START_WAIT_S = 60.0
# The shapes' tensors live beside the run's while it sets up: below this much free device
# memory they are left out (a net of this project's at its largest batches needs far less).
SHAPES_MIN_FREE_BYTES = 4 << 30


def _constant_net(cfg: RunConfig, device: torch.device) -> nn.Module:
    """A net of the run's architecture, every parameter and buffer a constant: built on the
    meta device (no initialisation runs, nothing drawn), then given memory on `device`."""
    with torch.device("meta"):
        net = MODELS[cfg.model]()
    net = net.to_empty(device=device)
    with torch.no_grad():
        for t in [*net.parameters(), *net.buffers()]:
            t.fill_(0.01) if t.is_floating_point() else t.zero_()
    if cfg.channels_last:
        net = net.to(memory_format=torch.channels_last)
    return net


def warm_shapes(cfg: RunConfig, device: torch.device, world: int,
                make_optimizer: Callable[[RunConfig, nn.Module], torch.optim.Optimizer]
                ) -> tuple[int, int]:
    """One training step and one evaluation batch as the run will make them (its net, batch
    sizes, autocast, memory format, eval_mode, optimizer), on a net of constants in eval
    mode: each kernel they launch is loaded, and cuDNN has chosen its engines for these
    shapes. Draws no random number. Returns (train batch, eval batch)."""
    train_batch = cfg.batch_size // world
    if cfg.train_samples:
        train_batch = min(train_batch, cfg.train_samples)
    eval_batch = min(cfg.eval_batch_size, cfg.eval_samples or cfg.eval_batch_size)
    net = _constant_net(cfg, device).eval()      # eval mode: no dropout mask drawn
    x = batch_in(cfg, torch.full((train_batch, 1, 28, 28), 0.5, device=device))
    y = torch.zeros(train_batch, dtype=torch.long, device=device)
    loss = forward_loss(cfg, net, x, y)
    loss.backward()
    grads = [p.grad for p in net.parameters() if p.grad is not None]
    nn.utils.get_total_norm(grads)                  # the norm of log points and clipping
    optimizer = make_optimizer(cfg, net)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    grad_off = torch.inference_mode() if cfg.eval_mode == "inference_mode" else torch.no_grad()
    xe = batch_in(cfg, torch.full((eval_batch, 1, 28, 28), 0.5, device=device))
    ye = torch.zeros(eval_batch, dtype=torch.long, device=device)
    with grad_off:
        eval_sums(cfg, net, xe, ye)
    return train_batch, eval_batch


class CudaStart:
    """CUDA's start for a run on `device`, in a thread beside the run's setup (the module's
    docstring says what and why). Started after the knobs are set (cuBLAS reads
    CUBLAS_WORKSPACE_CONFIG when it makes its workspace; cuDNN's flags and the
    deterministic-algorithms switch decide which engines are chosen). A failure here is left
    to the run's own first use of CUDA to say."""

    def __init__(self, device: torch.device, cfg: RunConfig, world: int,
                 make_optimizer: Callable[[RunConfig, nn.Module], torch.optim.Optimizer]
                 ) -> None:
        self.device = device
        self.seconds: float | None = None
        self.shapes: tuple[int, int] | None = None     # (train batch, eval batch) warmed
        self.thread: threading.Thread | None = None
        self.late = False            # still going when the run stopped waiting for it
        self.handles_s: float | None = None     # the context and the handles, of `seconds`
        self._side = False           # the shapes' stream was made
        mode = os.environ.get(CUDA_START_ENV, "") or "0"
        self.unknown = mode if mode not in CUDA_STARTS.values() else None
        if mode not in ("shapes", "handles"):
            return
        # torch.compile makes kernels of its own, in the run's thread
        self._shapes = mode == "shapes" and cfg.compile == "off"
        self._cfg, self._world, self._make_optimizer = cfg, world, make_optimizer
        self._t0 = time.perf_counter()
        self.thread = threading.Thread(target=self._run, name="cuda-start", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with torch.cuda.device(self.device):
                a = torch.ones(64, 64, device=self.device)
                (a @ a).sum().item()
                x = torch.ones(8, 1, 28, 28, device=self.device)
                w = torch.ones(8, 1, 3, 3, device=self.device, requires_grad=True)
                F.conv2d(x, w).sum().backward()
                torch.cuda.synchronize(self.device)
                del a, x, w
                self.handles_s = time.perf_counter() - self._t0
                if self._shapes and \
                        torch.cuda.mem_get_info(self.device)[0] >= SHAPES_MIN_FREE_BYTES:
                    self._side = True
                    stream = torch.cuda.Stream(self.device)
                    try:
                        with torch.cuda.stream(stream):
                            self.shapes = warm_shapes(self._cfg, self.device, self._world,
                                                      self._make_optimizer)
                    except Exception:  # noqa: BLE001 - the run's first step loads them
                        pass
                    stream.synchronize()
            self.seconds = time.perf_counter() - self._t0
        except Exception:  # noqa: BLE001 - the run's own first use of CUDA says it
            pass

    def join(self) -> None:
        """Waits (at most CUDA_START_WAIT_S) for the thread (`said()` then tells what it did
        and how long it took). What its tensors left in the allocator's cache goes back to
        the device, and so do the cuBLAS workspaces after the shapes (their stream had one of
        its own): the run's memory figures are those of a run that started CUDA itself."""
        if self.thread is not None:
            self.thread.join(CUDA_START_WAIT_S)
            self.late = self.thread.is_alive()
            if self.seconds is not None:
                if self._side:
                    torch._C._cuda_clearCublasWorkspaces()
                torch.cuda.empty_cache()

    def said(self) -> str | None:
        """The run log's line about it, or None."""
        if self.unknown is not None:
            return (f"{CUDA_START_ENV}={shown(self.unknown, 40)} is not one of "
                    f"{', '.join(CUDA_STARTS.values())}: the run starts CUDA in its own thread")
        if self.late:
            return (f"CUDA's start beside the setup had not ended after {CUDA_START_WAIT_S:.0f} "
                    "s: the run goes on, its thread beside it")
        if self.seconds is None:
            return None
        if self.shapes is None:
            return ("CUDA's context, cuBLAS and cuDNN started beside the data's loading and "
                    f"the model's building ({self.seconds:.2f} s)")
        train, ev = self.shapes
        return ("CUDA's context, cuBLAS, cuDNN and the run's kernels (a training step of "
                f"{train:,} and an evaluation batch of {ev:,} on a net of constants) started "
                f"beside the data's loading and the model's building ({self.seconds:.2f} s; "
                f"the kernels {self.seconds - (self.handles_s or 0.0):.2f} s of it)")


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
    return all(hasattr(torch._C, name) for name in ("_cuda_setCublasWorkspaceSize",
                                                   "_cuda_resetCublasWorkspaceSize"))


def _workspace_bytes(config: str) -> int:
    """The bytes a CUBLAS_WORKSPACE_CONFIG asks for (":SIZE_KIB:COUNT", repeated), as torch
    sums them; 32 MiB (CUBLAS_DETERMINISTIC's) for one it cannot read."""
    pairs = re.findall(r":([0-9]+):([0-9]+)", config)
    return sum(int(size) * 1024 * int(count) for size, count in pairs) or 4096 * 1024 * 8


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
    (and both) the caller moves the whole of it out of the GPU next (`suspend`): the line
    then says what was made only."""
    if not torch.cuda.is_available():
        return None
    t = time.perf_counter()
    torch.cuda.init()
    libraries = load_cudnn()
    if context:
        torch.cuda.synchronize(0)
        if not primary_contexts():
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
    if primary_contexts():
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
    environment, and let go at Start (`let_cublas_size_go`); elsewhere this process's
    CUBLAS_WORKSPACE_CONFIG is made `workspace` (None: unset, torch's default). Its shapes
    are none a run of this project makes (a plan cuDNN keeps for a shape is never one a run
    asks for), no random number is drawn, and what it allocated goes back to the device with
    cuBLAS's workspaces and the allocator's peaks reset: the run's first matrix product
    allocates its own workspace, as in a fresh process, and its memory figures start where
    a fresh process's do."""
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
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(0)


def let_cublas_size_go() -> None:
    """At Start, in a spare whose cuBLAS's workspace size was set (`_start_handles`): the
    run's first matrix product reads its own CUBLAS_WORKSPACE_CONFIG, as a fresh process's
    does. Nothing where torch cannot set it."""
    if cublas_size_settable():
        torch._C._cuda_resetCublasWorkspaceSize()


def loads_kernels(values: dict[str, Any] | None) -> bool:
    """Whether a cudnn or suspended spare made for a run of this config (a config's dict;
    None: the default config) loads its kernels before Start (`load_kernels`): unless the
    run asks cuDNN to benchmark its engines (cudnn_benchmark), whose choices the spare must
    not make for it."""
    from ..core.settings import config
    if values is None:
        return not config.DEFAULTS.cudnn_benchmark
    return values.get("cudnn_benchmark") is False


def load_kernels(values: dict[str, Any] | None, workspace: str | None) -> str:
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
    from ..core.settings import config
    if not torch.cuda.is_initialized() or not loads_kernels(values):
        return ""
    try:
        cfg = config.DEFAULTS if values is None else config.from_dict(values)
    except Exception as e:  # noqa: BLE001 - a config this torch cannot read: none loaded
        return f"; no run's kernels loaded ({shown(e, 120)})"
    from .knobs import algorithms_of
    from .optim import make_optimizer
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


def stack_limit(value: int | None = None) -> int:
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


def load_cudnn() -> int:
    """Loads cuDNN and the libraries it would load at a run's first convolution (cuDNN 9
    opens its engines, heuristics and ops libraries by name on first use: loaded here, the
    dynamic loader hands the same ones back). How many were loaded."""
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


def primary_contexts() -> int:
    """How many devices have a CUDA primary context in this process (the driver's own
    answer, cuDevicePrimaryCtxGetState); 0 where the driver cannot be asked."""
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


def suspend(did: str) -> tuple[Any, str, int | None]:
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
    from ..core.processes.cuda_checkpoint import Helper
    helper = Helper()
    stack = None
    if torch.cuda.is_initialized():
        try:
            was = stack_limit()
            stack_limit(0)
            stack = was
        except (OSError, AttributeError, RuntimeError):
            pass                        # suspended as it is
    try:
        seconds, moved = helper.suspend()
    except RuntimeError:
        helper.close()
        if stack is not None:
            try:
                stack_limit(stack)
            except (OSError, AttributeError, RuntimeError):
                pass                    # (the suspension's error is the one to say)
        raise
    return helper, (f"{did}, then suspended by CUDA's checkpoint API ({seconds:.2f} s, by a "
                    f"helper process of {helper.memory() / 2**20:,.0f} MiB; the spare's host "
                    f"memory grew by {moved / 2**20:,.0f} MiB to hold them"
                    f"{'' if stack is None else ', its stack limit lowered first'}; no GPU "
                    "memory held while it waited)"), stack


def suspend_before_exit(helper: Any) -> None:
    """A run given a suspended spare has its CUDA suspended again by its helper just before
    its process ends, ends the helper, and says so in its log. Ending a restored CUDA
    context that is live hung whole machines on some drivers: NVIDIA/cuda-checkpoint issue
    #53 (the open kernel module 595.71.05; ending a process after a kill). Ending a
    checkpointed one did not, which is the workaround given there. Nothing calls CUDA after
    it: the process ends at once. A run killed by SIGKILL ends without it (its helper ends
    when its pipe closes)."""
    try:
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
