"""The memory a run's training holds, read at every log point (`Meter.read`):
- `rss_bytes`: the process's resident set now;
- `peak_rss`: its high-water mark since the last log point (Linux: VmHWM, reset through
  /proc/self/clear_refs each time; elsewhere none). It includes everything the process
  holds: the Python heap, the interpreter and libraries, the dataset, the allocator's free
  lists, and the tensors of the step's peak;
- `workers_uss`: what its DataLoader workers hold alone (their USS);
- `own_uss`: what it holds alone (a data-parallel run adds its other ranks' to the lead's);
- `tensor_bytes`: the bytes of the training state's tensors now: parameters, buffers,
  gradients and the optimizer's state;
- on CUDA, `cuda_peak`: the allocator's peak since the last log point (reset each time),
  and `cuda_reserved`, the peak reserved by its cache in the interval (`cuda_alloc`: now).

core.analysis.figures makes the run's figures of them (one definition). On demand,
engine.probes.memory breaks one step down by category and module.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import nn

from ..core.processes.cuda_checkpoint import Helper

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


# USS is read from /proc/PID/smaps_rollup: about 17 ms for a process that imported torch
# (thousands of mappings) on this VM, against a step of a few ms: read at most this often,
# the last reading kept for the log points in between.
USS_EVERY_S = 5.0


class Meter:
    """The memory figures of one training process, read at log points. `rank`: a process
    of a data-parallel run (its own USS is read too)."""

    def __init__(self, device: torch.device, rank: bool = False) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.rank = rank
        self.process = psutil.Process()
        self._uss_at: float | None = None
        self._uss: tuple[float | None, float | None] = (None, None)

    def _unique(self) -> tuple[float | None, float | None]:
        """(workers_uss, own_uss), read again once USS_EVERY_S has passed."""
        now = time.monotonic()
        if self._uss_at is None or now - self._uss_at >= USS_EVERY_S:
            self._uss_at = now
            self._uss = (self.workers_uss(), self.own_uss() if self.rank else None)
        return self._uss

    def start(self) -> None:
        """The first interval starts now (not at the imports and the dataset's loading)."""
        _peak_rss()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def read(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, float | None]:
        mem: dict[str, float | None] = {
            "rss_bytes": float(self.process.memory_info().rss), "peak_rss": _peak_rss(),
            "tensor_bytes": float(state_bytes(model, optimizer)),
            **dict(zip(("workers_uss", "own_uss"), self._unique())),
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
            if child.pid in Helper.pids:
                continue        # a suspended spare's checkpoint helper: no worker (engine/cuda_start.py)
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
