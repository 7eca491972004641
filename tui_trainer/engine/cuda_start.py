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
the last CUDA run's config: tui_trainer/warm.py, `_load_kernels`.)

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
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..core.settings.config import RunConfig
from ..core.settings.machine import CUDA_START_ENV, CUDA_STARTS
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
