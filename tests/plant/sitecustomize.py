"""Planted in every Python process started with this folder on PYTHONPATH (tests/test_explain.py
does so for its own processes only): a model, `planted`, with one op that is nondeterministic
on purpose, so that explain's search for the nondeterministic op has one to find on a CPU.

`plant::shuffled_sum` sums each row in an order drawn from the operating system's entropy
(os.urandom), outside every generator a seed sets: float addition is not associative, so two
calls on the same inputs give sums that differ in their last bits. Its backward is exact
(every element gets the gradient), so only the forward is nondeterministic.
"""

from __future__ import annotations

import os
import types

import numpy as np
import torch
import torch.nn.functional as F

from tui_trainer.core.settings import config
from tui_trainer.engine import models


@torch.library.custom_op("plant::shuffled_sum", mutates_args=())
def shuffled_sum(x: torch.Tensor) -> torch.Tensor:
    order = np.random.default_rng(int.from_bytes(os.urandom(8), "little")).permutation(
        x.shape[-1])
    total = torch.zeros(x.shape[:-1], dtype=x.dtype)
    for i in order:                     # one float32 rounding after each addition
        total = total + x[..., int(i)]
    return total


@shuffled_sum.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[:-1])


def _setup(ctx, inputs, output) -> None:
    ctx.shape = inputs[0].shape


def _backward(ctx, grad: torch.Tensor) -> torch.Tensor:
    return grad.unsqueeze(-1).expand(ctx.shape).contiguous()


shuffled_sum.register_autograd(_backward, setup_context=_setup)


class PlantedNet(models.GrokkingNet):
    """GrokkingNet with the planted op in its classifier: the hidden units are scaled by
    their row's mean (so that the sum's last bits reach every unit)."""

    def classifier(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        x = x * (shuffled_sum(x) / x.shape[-1]).unsqueeze(-1)  # the planted op
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


models.MODELS["planted"] = PlantedNet
_field = config.FIELDS["model"]
_field.metadata = types.MappingProxyType(
    {**_field.metadata, "choices": (*_field.metadata["choices"], "planted")})
