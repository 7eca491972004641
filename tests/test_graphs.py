"""The learning rate of a cuda_graph run's optimizer (engine/graphs.py:DeviceRates): every
update, eager or captured, reads it from one float32 tensor, so that the eager steps after a
resume compute what the replayed steps did. The capture itself is CUDA's (tests/test_gpu.py);
what is asserted here holds on any device and runs on this one's tensors."""

from __future__ import annotations

import copy

import torch
from torch import nn

from tui_trainer.engine.graphs import DeviceRates


def _optimizer() -> tuple[nn.Module, torch.optim.Optimizer, DeviceRates]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.7, 0.9), foreach=False)
    return model, optimizer, DeviceRates(optimizer, torch.device("cpu"))


def _step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.ones(3, 4)).square().sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def test_every_update_reads_the_rate_the_schedule_set_from_one_float32_tensor():
    model, optimizer, rates = _optimizer()
    seen: list[tuple[type, float]] = []
    optimizer.register_step_pre_hook(
        lambda o, *_: seen.append((type(o.param_groups[0]["lr"]),
                                   float(o.param_groups[0]["lr"]))))
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.01, total_steps=6,
                                                   cycle_momentum=False)
    floats = []
    for _ in range(4):
        floats.append(optimizer.param_groups[0]["lr"])
        _step(model, optimizer)
        schedule.step()
        # outside an update the group holds the schedule's float (what checkpoints keep)
        assert type(optimizer.param_groups[0]["lr"]) is float
    assert [t for t, _ in seen] == [torch.Tensor] * 4
    # the tensor held each step's float, rounded to float32, and stayed the one tensor
    assert [v for _, v in seen] == [float(torch.tensor(f, dtype=torch.float32)) for f in floats]
    assert len({id(t) for t in rates.tensors}) == 1 and rates.tensors[0].dtype == torch.float32
    held = optimizer.state_dict()["param_groups"][0]["lr"]
    assert type(held) is float and held == optimizer.param_groups[0]["lr"]


def test_a_resumed_optimizer_still_reads_its_rate_from_the_tensor_and_updates_alike():
    """A resume loads the optimizer's state (a new list of groups): its updates still read
    the tensor, and give the bits of the optimizer that never stopped."""
    straight, opt_a, _ = _optimizer()
    for _ in range(3):
        _step(straight, opt_a)
    saved_model = {k: v.clone() for k, v in straight.state_dict().items()}
    saved_opt = copy.deepcopy(opt_a.state_dict())      # (its tensors move on in place)
    for _ in range(2):
        _step(straight, opt_a)

    resumed, opt_b, _ = _optimizer()
    resumed.load_state_dict(saved_model)
    opt_b.load_state_dict(saved_opt)
    kinds: list[type] = []
    opt_b.register_step_pre_hook(lambda o, *_: kinds.append(type(o.param_groups[0]["lr"])))
    for _ in range(2):
        _step(resumed, opt_b)
    assert kinds == [torch.Tensor, torch.Tensor]
    assert all(torch.equal(a, b) for a, b in zip(straight.parameters(), resumed.parameters()))
    assert type(opt_b.param_groups[0]["lr"]) is float
