"""The `cuda_graph` knob: one training step captured as CUDA graphs and replayed for every
later step (the speed records' static graph, without torch.compile; PyTorch's "whole
network capture", docs/notes/cuda.html#cuda-graphs).

- The first WARMUP steps of a run (and of a resumed run) are the loop's own eager steps,
  run on a stream of their own: the optimizer's state, cuBLAS's and cuDNN's handles and
  workspaces for that stream and every kernel are made there, outside any capture.
- The next step is captured on that stream as three graphs sharing one memory pool, so
  that the clock still times each phase: forward and loss; backward; the gradient norm,
  the optimizer's update and the NaN watch. Graphs that share a pool are replayed in the
  order they were captured, always all three.
- From then on a step copies its batch into the graphs' static inputs and replays them:
  no kernel launched one by one from Python, no sync. The loss and the norm stay on the
  device until a log point reads them, as in an eager step.
- The optimizer was made with capturable=True (its step count on the device) and with
  DeviceRates: during every update, eager or captured, each parameter group's learning
  rate is a float32 tensor on the device; the group keeps its float otherwise (what the
  schedule moves, what checkpoints hold), and that float is copied into the tensor before
  each update (before each replay). The fused update reads a rate given as a tensor in
  float32 and one given as a float in double: every step of such a run reads the tensor,
  so that the eager steps after a resume compute the bits the replayed ones did.

What needs one shape per step, an adam/adamw update and one process is refused in
core.settings.config (graph_problem) and at set-up (a last batch of another size).

First run on an H100 on 2026-11-26: tests/test_gpu.py's first test passed (bit-exact resume
across a re-capture, learning as eager steps do), and fastest-gpu's steps ran at 410k
samples/s against 144k op by op (docs/benchmarks.md).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from .step import batch_in, forward_loss

WARMUP = 3          # eager steps before the capture (PyTorch's examples use 3)


class DeviceRates:
    """Each parameter group's learning rate as a float32 tensor on the device, during every
    update of a cuda_graph = step run's optimizer (its step's pre- and post-hooks): eager
    steps (the warm-up, a resumed run's first ones, explain's copies) and the captured one
    read the rate alike. Outside the update the group holds its float."""

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.optimizer = optimizer      # (its param_groups: a new list after a resume's load)
        self.tensors = [torch.zeros((), dtype=torch.float32, device=device)
                        for _ in optimizer.param_groups]
        self.held: list[float | None] = [None] * len(self.tensors)   # what each tensor holds
        self.floats: list[Any] = []
        optimizer.register_step_pre_hook(lambda *_: self._swap_in())
        optimizer.register_step_post_hook(lambda *_: self.swap_out())
        # The eager steps of a capturable optimizer are on purpose: not to be warned of
        optimizer._warned_capturable_if_run_uncaptured = True

    def refresh(self) -> None:
        """Each group's float copied into its tensor where it moved (a fill on the current
        stream: outside a capture, before the update that reads it)."""
        groups = self.optimizer.param_groups
        for i, (group, tensor) in enumerate(zip(groups, self.tensors, strict=True)):
            if group["lr"] != self.held[i]:
                tensor.fill_(group["lr"])
                self.held[i] = group["lr"]

    def _swap_in(self) -> None:
        capturing = self.cuda and torch.cuda.is_current_stream_capturing()
        if not capturing:                   # (a captured update's fill is the replay's)
            self.refresh()
        self.floats = [g["lr"] for g in self.optimizer.param_groups]
        for group, tensor in zip(self.optimizer.param_groups, self.tensors, strict=True):
            group["lr"] = tensor

    def swap_out(self) -> None:
        """The floats back (after each update; after a capture that failed inside one)."""
        if self.floats:
            for group, value in zip(self.optimizer.param_groups, self.floats, strict=True):
                group["lr"] = value
            self.floats = []


class StepGraph:
    """One run's captured step (its Trainer's, which it reads and moves on)."""

    def __init__(self, trainer: Any) -> None:
        self.t = trainer
        self.stream = torch.cuda.Stream(trainer.device)
        self.eager_left = WARMUP
        self.graphs: tuple[torch.cuda.CUDAGraph, ...] | None = None
        # made at the capture: the static batch, outputs, step count and learning rates
        self.x = self.y = self.loss = self.norm = self.step_count = None
        self.rates: DeviceRates = trainer.optimizer.rates      # (made by make_optimizer)

    @property
    def warm(self) -> bool:
        """Whether the next step is replayed (the capture first, where not made yet)."""
        return self.eager_left <= 0

    @contextmanager
    def warming(self) -> Iterator[None]:
        """One of the eager steps before the capture, on the capture's stream: it waits for
        the batch made on the current stream, and the current stream waits for it."""
        here = torch.cuda.current_stream(self.t.device)
        self.stream.wait_stream(here)
        with torch.cuda.stream(self.stream):
            yield
        here.wait_stream(self.stream)
        self.eager_left -= 1

    def replay(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The step, replayed: its loss and gradient norm, on the device."""
        t, clock = self.t, self.t.clock
        x, y = next(batch.micro_batches)        # (one: grad_accum_steps = 1)
        if self.graphs is None:
            self._capture(x, y)
        clock.start()
        self.x.copy_(x, non_blocking=t.non_blocking)
        self.y.copy_(y, non_blocking=t.non_blocking)
        clock.done("copy")
        forward, backward, update = self.graphs
        forward.replay()
        clock.done("forward")
        backward.replay()
        clock.done("backward")
        self.rates.refresh()        # the rate the schedule set, into the captured update
        update.replay()
        t.pos.batch += 1
        t.pos.samples += len(y)
        t.pos.step += 1
        t.advance_schedule()
        clock.done("optimizer")
        return self.loss, self.norm

    def _capture(self, x: torch.Tensor, y: torch.Tensor) -> None:
        t = self.t
        began = time.perf_counter()
        x = batch_in(t.cfg, x.to(t.device))
        self.x, self.y = x.clone(memory_format=torch.preserve_format), y.to(t.device).clone()
        self.step_count = torch.full((), t.pos.step, dtype=torch.long, device=t.device)
        # backward makes the gradients in the graphs' pool; each replay writes them anew
        t.optimizer.zero_grad(set_to_none=True)
        # One pool, one stream (the warm-up's); thread_local: other threads (a loader's
        # pin-memory thread) may go on allocating while this one captures
        capture = {"pool": torch.cuda.graph_pool_handle(), "stream": self.stream,
                   "capture_error_mode": "thread_local"}
        graphs = (torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph())
        try:
            with torch.cuda.graph(graphs[0], **capture):
                # (autocast's cache cannot span graphs)
                loss = forward_loss(t.cfg, t.forward, self.x, self.y, cache=False)
            with torch.cuda.graph(graphs[1], **capture):
                loss.backward()
            with torch.cuda.graph(graphs[2], **capture):
                self.norm = t.grad_norm()
                t.optimizer.step()
                self.step_count += 1
                t.first_bad_step.copy_(t.nan_watch(loss, self.step_count))
        except RuntimeError as e:
            raise RuntimeError(f"cuda_graph = step could not capture step {t.pos.step + 1} "
                               f"on this machine ({str(e).splitlines()[0]}); set cuda_graph "
                               "= off to train it step by step") from e
        finally:
            self.rates.swap_out()
        self.loss = loss.detach()
        self.graphs = graphs
        t.log(f"cuda_graph = step: step {t.pos.step + 1} captured as CUDA graphs (forward, "
              f"backward, optimizer) in {time.perf_counter() - began:.2f} s after "
              f"{WARMUP} eager steps; every later step replays them")
