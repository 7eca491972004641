"""The memory training needs: a figure at every log point, and on demand a breakdown.

At each log point (`Meter.read`):
- `rss_bytes`: the process's resident set now;
- `peak_rss`: its high-water mark since the last log point (Linux: VmHWM, reset through
  /proc/self/clear_refs each time; elsewhere none). It includes everything the process
  holds: the Python heap, the interpreter and libraries, the dataset, the allocator's free
  lists, and the tensors of the step's peak;
- `tensor_bytes`: the bytes of the training state's tensors now: parameters, buffers,
  gradients and the optimizer's state;
- on CUDA, `cuda_peak`: the allocator's peak since the last log point (reset each time),
  and `cuda_reserved`, the peak reserved by its cache in the interval (`cuda_alloc`: now).

`breakdown` (the `memory` command, the dashboard's key): one training step of a copy of the
run under torch's MemTracker, which accounts every tensor to a category (parameters,
gradients, optimizer state, activations, temporaries) and to the module it was made in.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import nn

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def _peak_rss() -> float | None:
    """VmHWM in bytes, then reset to the resident set now (None where Linux does not say)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        found = re.search(r"^VmHWM:\s+(\d+) kB", STATUS.read_text(), re.M)
        CLEAR_REFS.write_text("5")
    except OSError:
        return None
    return float(found.group(1)) * 1024 if found else None


def _bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Parameters, buffers, gradients and optimizer state, each storage once."""
    seen: set[int] = set()

    def once(tensors: Any) -> list[torch.Tensor]:
        out = []
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.numel():
                ptr = t.untyped_storage().data_ptr()
                if ptr not in seen:
                    seen.add(ptr)
                    out.append(t)
        return out
    params = list(model.parameters())
    return (_bytes(once(params)) + _bytes(once(model.buffers()))
            + _bytes(once(p.grad for p in params if p.grad is not None))
            + _bytes(once(v for s in optimizer.state.values() for v in s.values())))


class Meter:
    """The memory figures of one training process, read at log points."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.process = psutil.Process()

    def start(self) -> None:
        """The first interval starts now (not at the imports and the dataset's loading)."""
        _peak_rss()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def read(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, float | None]:
        mem: dict[str, float | None] = {
            "rss_bytes": float(self.process.memory_info().rss), "peak_rss": _peak_rss(),
            "tensor_bytes": float(state_bytes(model, optimizer)),
            "workers_uss": self.workers_uss(), "own_uss": self.own_uss(),
            "cuda_alloc": None, "cuda_reserved": None, "cuda_peak": None}
        if self.cuda:
            mem["cuda_alloc"] = float(torch.cuda.memory_allocated(self.device))
            mem["cuda_reserved"] = float(torch.cuda.max_memory_reserved(self.device))
            mem["cuda_peak"] = float(torch.cuda.max_memory_allocated(self.device))
            torch.cuda.reset_peak_memory_stats(self.device)
        return mem


    def workers_uss(self) -> float | None:
        """The memory of this process's children (its DataLoader workers) that is theirs
        alone (USS: the pages they do not share, with this process or anyone): what the
        workers add. The pages a forked worker still shares with this process are in this
        process's RSS already. 0 without workers; None where the system does not tell."""
        total = 0
        for child in self.process.children(recursive=True):
            try:
                total += child.memory_full_info().uss
            except psutil.NoSuchProcess:
                continue                        # a worker that just ended
            except (psutil.AccessDenied, AttributeError):
                return None
        return float(total)

    def own_uss(self) -> float | None:
        """This process's memory that is its alone (USS): what another rank of a
        data-parallel run adds beside the first (libraries shared between them counted once,
        in the first's RSS)."""
        try:
            return float(self.process.memory_full_info().uss)
        except (psutil.AccessDenied, AttributeError, psutil.NoSuchProcess):
            return None


# --- on demand: one step, accounted by category and module ------------------------------------

CATEGORIES = {"PARAM": "parameters", "BUFFER": "buffers", "GRAD": "gradients",
              "OPT": "optimizer state", "ACT": "activations (kept for backward)",
              "TEMP": "temporaries", "OTH": "other"}


def copy_of(cfg: Any, state: dict[str, Any] | None, steps: int, **changes: Any
            ) -> tuple[Any, int]:
    """A trainer of a copy of a run, set up from `state` (its checkpoint) or its config, in
    this process, with room for `steps` more steps and nothing recorded; a data-parallel
    run as one of its ranks (its share of the batch). (trainer, the run's world size)."""
    from .train import Trainer
    world = cfg.nproc * cfg.nnodes
    # (epochs beyond the run's: a run copied at its end has steps left to take)
    from ..core.config import FIELDS
    epochs = min(cfg.epochs + 2 + steps, FIELDS["epochs"].metadata["hi"])
    one = cfg.replace(nproc=1, nnodes=1, batch_size=cfg.batch_size // world, max_steps=0,
                      eval_every=0, rdzv_endpoint="", epochs=epochs, **changes)
    if state is not None and world > 1:
        state = {**state, "world_size": 1, **state["ranks"][0]}
    trainer = Trainer(one, checkpoint=state)
    trainer.setup()
    trainer.model.train()
    return trainer, world


def breakdown(cfg: Any, state: dict[str, Any] | None) -> dict[str, Any]:
    """One step of a copy of the run (from `state`, its checkpoint, or as its config starts
    it), after one step of warm-up, under MemTracker: the memory at the step's peak by
    category, and each module's own peak with its parameters and outputs. A data-parallel
    run is measured as one of its ranks (its share of the batch, without DDP's buckets)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    trainer, world = copy_of(cfg, state, steps=2, compile="off")
    steps = trainer.steps()
    trainer.step(next(steps))                     # warm-up: optimizer state, allocators
    batch = next(steps)
    tracker = MemTracker()
    tracker.track_external(trainer.model, trainer.optimizer)
    with tracker:
        trainer.step(batch)
    peak = tracker.get_tracker_snapshot("peak")
    device = next(iter(peak), trainer.device)
    cats = {CATEGORIES.get(str(k).rsplit(".", 1)[-1].split(":")[0].strip(), str(k)): v
            for k, v in peak.get(device, {}).items() if "Total" not in str(k)}
    total = next((v for k, v in peak.get(device, {}).items() if "Total" in str(k)), None)
    modules = []
    for stats in tracker.memory_tracking.values():
        modules.append({"module": stats.mod_fqn, "parameters": stats.parameter_mem,
                        "outputs": stats.output_mem,
                        "peak": max(stats.local_peak.values(), default=0)})
    return {"device": str(trainer.device), "batch": trainer.cfg.batch_size, "world": world,
            "step": trainer.pos.step, "checkpointing": cfg.activation_checkpointing,
            "categories": cats, "total": total, "modules": modules,
            "from_checkpoint": state is not None}
