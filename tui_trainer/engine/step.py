"""What a step computes, defined once: the batch in the run's memory format, the forward under
its autocast, and the loss.

Every path that computes a step or an evaluation batch calls these: the eager loop
(engine/train.py `Trainer._step`), evaluation (`Trainer._evaluate`), the CUDA-graph capture
(engine/graphs.py), explain's sums over a data-parallel step (engine/probes/explain.py) and CUDA's
warm-up (engine/cuda_start.py), which loads the kernels the run will use. A knob that
changes what a step computes lives in RunConfig and here; the loop's bookkeeping (micro-
batches, gradient scaling, clocks) stays in the loop. tests/test_step.py checks that a change
made here is seen by every path.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..core.settings.config import RunConfig, is_file_model

# autocast's dtype of each `amp` value ("off": none)
AMP = {"fp16": torch.float16, "bf16": torch.bfloat16}


def amp_dtype(cfg: RunConfig) -> torch.dtype | None:
    return AMP.get(cfg.amp)


def autocast(cfg: RunConfig, device_type: str, cache: bool = True) -> Any:
    """The run's autocast, for the forward pass only (backward runs outside it); `cache`
    off where its cache cannot span what is recorded (CUDA graphs)."""
    dtype = amp_dtype(cfg)
    if dtype is None:
        return nullcontext()
    return torch.autocast(device_type, dtype=dtype, cache_enabled=cache)


def batch_in(cfg: RunConfig, x: torch.Tensor) -> torch.Tensor:
    """A batch already on its device, in the run's memory format."""
    return x.contiguous(memory_format=torch.channels_last) if cfg.channels_last else x


def loss(out: torch.Tensor, y: torch.Tensor, reduction: str = "mean",
         logits: bool = False) -> torch.Tensor:
    """The loss of a batch: the negative log-likelihood of the labels under the net's
    log-probabilities (every net of engine/models.py ends in log_softmax), or, for a net of
    the user's own file, which returns one score per class (`logits`), the cross-entropy of
    those scores as they come."""
    if logits:
        return F.cross_entropy(out, y, reduction=reduction)
    return F.nll_loss(out, y, reduction=reduction)


def forward_loss(cfg: RunConfig, forward: Callable[[torch.Tensor], torch.Tensor],
                 x: torch.Tensor, y: torch.Tensor, cache: bool = True) -> torch.Tensor:
    """A training batch's forward and loss under the run's autocast: what backward starts
    from."""
    with autocast(cfg, x.device.type, cache):
        return loss(forward(x), y, logits=is_file_model(cfg.model))


def eval_sums(cfg: RunConfig, forward: Callable[[torch.Tensor], torch.Tensor],
              x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An evaluation batch: its summed loss (in float32, outside autocast) and how many of
    its labels the net got right."""
    with autocast(cfg, x.device.type):
        out = forward(x)
    return loss(out.float(), y, reduction="sum", logits=is_file_model(cfg.model)), \
        (out.argmax(dim=1) == y).sum()
