"""What a net sees in one digit (`tui-trainer activations`, the dashboard's Model tab): a
run's model restored from one of its checkpoints, in evaluation mode and fp32 on the CPU
(the GPU stays free for what trains), fed one digit of its evaluation set; every
convolution's output (its feature maps, one per channel) caught by a forward hook, and the
ten class probabilities. core.analysis.activations draws and keeps it."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from torch import nn

from ...core.settings.config import RunConfig
from ...core.errors import BadInput
from ..data import _base, _mean_std, _resident_tensors, load_datasets
from ..models import build_model

HOW = ("index", "random", "worst")


class EvalSet:
    """A run's evaluation digits as its model sees them (normalised) and as a person does
    (0 to 1), loaded once for every run that shares the dataset."""

    def __init__(self, cfg: RunConfig) -> None:
        _, eval_ds, self.info = load_datasets(cfg)
        self.x, self.y = _resident_tensors(eval_ds, self.info, torch.device("cpu"))
        mean, std = _mean_std(self.info)
        self.raw = (self.x * std + mean).clamp(0, 1)
        # the classes' names where they are not the digits (Fashion-MNIST's clothes, the
        # folders of the user's images, CIFAR-10's, ...)
        names = list(getattr(_base(eval_ds), "classes", []) or [])
        self.classes = [str(n) for n in names] if self.info.name not in \
            ("mnist", "mnist-sample", "synthetic") and len(names) == self.info.classes \
            else None

    def __len__(self) -> int:
        return len(self.y)

    def image(self, index: int) -> np.ndarray:
        """Image `index` as a person sees it: grey H x W, or colour H x W x 3; 0 to 1."""
        x = self.raw[index]
        return (x[0] if x.shape[0] == 1 else x.permute(1, 2, 0)).numpy()

    def check(self, index: int) -> int:
        if not 0 <= index < len(self):
            raise BadInput(f"--digit {index} is out of range: the evaluation set of "
                           f"{self.info.name} has {len(self):,} digits, 0 to {len(self) - 1}")
        return index


def restore(cfg: RunConfig, state: dict[str, Any], recorded: dict[str, Any] | None = None,
            info: Any = None) -> nn.Module:
    """The run's model with the weights (and BatchNorm's statistics) of a checkpoint (a net
    of the user's own file: from the file and content its run recorded, for the images of
    `info`, the evaluation set's DataInfo)."""
    extra = {} if info is None else {"shape": info.shape, "classes": info.classes}
    model = build_model(cfg.model, recorded=recorded, **extra)
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, KeyError) as e:
        raise BadInput(f"the checkpoint does not fit model {cfg.model} "
                       f"({str(e).splitlines()[0]})") from None
    return model.eval()


@torch.no_grad()
def worst(model: nn.Module, data: EvalSet) -> int:
    """The digit the model gets wrong with the highest confidence (refused when it gets
    every one right)."""
    probs = torch.cat([model(x).float().softmax(1) for x in data.x.split(500)])
    top, pred = probs.max(1)
    wrong = pred != data.y
    if not bool(wrong.any()):
        raise BadInput("--digit worst: this checkpoint classifies every one of the "
                       f"{len(data):,} evaluation digits right; pick one by index")
    return int(torch.where(wrong, top, torch.full_like(top, -1.0)).argmax())


def pick(how: str, index: int | None, model: nn.Module, data: EvalSet) -> int:
    if how == "index":
        return data.check(int(index or 0))
    if how == "random":
        return random.SystemRandom().randrange(len(data))
    return worst(model, data)


@torch.no_grad()
def seen(model: nn.Module, data: EvalSet, index: int) -> dict[str, Any]:
    """One digit through the model: each convolution's output for it (C x H x W, float32,
    by the convolution's name in the model) and the class probabilities."""
    maps: dict[str, np.ndarray] = {}
    hooks = [m.register_forward_hook(
        lambda _m, _i, out, name=name: maps.__setitem__(name, out[0].float().numpy().copy()))
        for name, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    try:
        probs = model(data.x[index:index + 1]).float().softmax(1)[0]
    finally:
        for h in hooks:
            h.remove()
    return {"maps": maps, "probs": [float(p) for p in probs],
            "predicted": int(probs.argmax())}
