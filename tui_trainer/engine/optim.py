"""The optimizer and the learning-rate schedules a run's config asks for."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..core.settings.config import RunConfig, graph_step
from .graphs import DeviceRates


def make_optimizer(cfg: RunConfig, model: nn.Module) -> torch.optim.Optimizer:
    if cfg.no_decay_bias and cfg.weight_decay > 0:
        decay = [p for p in model.parameters() if p.ndim > 1]
        no_decay = [p for p in model.parameters() if p.ndim <= 1]   # biases, norm weights
        params: Any = [{"params": decay, "weight_decay": cfg.weight_decay},
                       {"params": no_decay, "weight_decay": 0.0}]
    else:
        params = model.parameters()
    # auto leaves the choice to PyTorch (foreach=None, fused=None), as it always was
    impl = {"auto": {}, "for-loop": {"foreach": False}, "foreach": {"foreach": True},
            "fused": {"fused": True}}[cfg.optimizer_impl]
    if graph_step(cfg, next(model.parameters()).is_cuda):
        impl["capturable"] = True       # its step count on the device: an update to capture
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum,
                               weight_decay=cfg.weight_decay, **impl)
    if cfg.optimizer == "adadelta":
        return torch.optim.Adadelta(params, lr=cfg.lr, weight_decay=cfg.weight_decay, **impl)
    betas = (cfg.adam_beta1, cfg.adam_beta2)
    adam = torch.optim.Adam if cfg.optimizer == "adam" else torch.optim.AdamW
    optimizer = adam(params, lr=cfg.lr, betas=betas, weight_decay=cfg.weight_decay, **impl)
    if impl.get("capturable"):      # every update reads its rate as the captured one does
        optimizer.rates = DeviceRates(optimizer, next(model.parameters()).device)
    return optimizer


def make_scheduler(cfg: RunConfig, optimizer: torch.optim.Optimizer, total_steps: int
                   ) -> torch.optim.lr_scheduler.LRScheduler:
    """The `lr_schedule` knob. step moves at each epoch's end; onecycle and cosine at every
    optimizer step, over `total_steps` (the run's steps: epochs x steps an epoch, or
    max_steps). Its state is in every checkpoint."""
    sched = torch.optim.lr_scheduler
    if cfg.lr_schedule == "onecycle":
        # Adam's betas and SGD's momentum stay as set (the speed record's cycle_momentum off)
        return sched.OneCycleLR(optimizer, max_lr=cfg.lr, total_steps=total_steps,
                                cycle_momentum=False)
    if cfg.lr_schedule == "cosine":
        warm = min(cfg.warmup_steps, total_steps - 1)
        cosine = sched.CosineAnnealingLR(optimizer, T_max=max(1, total_steps - warm))
        if not warm:
            return cosine
        ramp = sched.LinearLR(optimizer, start_factor=1 / (warm + 1), total_iters=warm)
        return sched.SequentialLR(optimizer, [ramp, cosine], milestones=[warm])
    return sched.StepLR(optimizer, step_size=1, gamma=cfg.lr_step_gamma)


def schedule_end(scheduler: Any) -> int | float:
    """The step a per-step schedule ends at, from its own state (a checkpoint's, when the
    run was continued with more epochs: the schedule it started keeps its length)."""
    if hasattr(scheduler, "total_steps"):                         # OneCycleLR
        return scheduler.total_steps
    if hasattr(scheduler, "T_max"):                               # CosineAnnealingLR
        return scheduler.T_max
    parts = getattr(scheduler, "_schedulers", None)               # SequentialLR
    if parts:
        return scheduler._milestones[-1] + schedule_end(parts[-1])
    return math.inf
