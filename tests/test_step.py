"""What a step computes is defined once (engine/step.py, issue 57): the batch's memory format,
the forward under the run's autocast, and the loss. No other module writes a loss or an
autocast, and a change made in engine/step.py is seen by every path that computes a step:
the eager loop, evaluation, CUDA's warm-up, explain's sums and the CUDA-graph capture."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

from conftest import QUICK
from tui_trainer.core.settings import config
from tui_trainer.engine import step

PACKAGE = Path(__file__).resolve().parent.parent / "tui_trainer"
ONE_PLACE = PACKAGE / "engine" / "step.py"
# What computes a loss or enters autocast (what a step computes): written in step.py alone.
STEP_CALLS = {"nll_loss", "cross_entropy", "autocast"}


def test_the_loss_and_autocast_are_written_in_one_place():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == ONE_PLACE:
            continue
        tree = ast.parse(path.read_text(), str(path))
        # names brought in from engine/step.py are the one place's own
        own = {a.asname or a.name for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom) and node.module == "step"
               for a in node.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else \
                    f.id if isinstance(f, ast.Name) and f.id not in own else None
                if name in STEP_CALLS:
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {name}")
    assert found == [], "a step's computation written outside engine/step.py: " + \
        ", ".join(found)


@pytest.fixture
def smoothed(monkeypatch):
    """engine/step.py's loss changed in its one place (as a knob would: a tenth more of
    it), whatever its signature: each call says which function computed a step with it."""
    callers: list[str] = []
    real = step.loss

    def loss(*args, **kwargs):
        callers.append(sys._getframe(2).f_code.co_name)
        return real(*args, **kwargs) * 1.1
    monkeypatch.setattr(step, "loss", loss)
    return callers


def test_a_change_in_the_one_place_is_seen_by_the_loop_evaluation_and_warm_up(
        tmp_path, smoothed, monkeypatch):
    """device=cpu: the eager step, the evaluation and the warm-up of CUDA's kernels (run on
    the CPU here) all take the changed loss, and the run trains on it."""
    from tui_trainer.engine.cuda_start import warm_shapes
    from tui_trainer.engine.host import run_training
    from tui_trainer.engine.optim import make_optimizer
    cfg = config.load(overrides=[*QUICK, "max_steps=4", "eval_every=4", "device=cpu"])
    changed = run_training(cfg, tmp_path / "a", echo=None)
    assert {"_step", "_evaluate"} <= set(smoothed)
    smoothed.clear()
    warm_shapes(cfg, torch.device("cpu"), 1, make_optimizer)
    assert set(smoothed) == {"warm_shapes"}
    monkeypatch.undo()                          # the loss as it is
    plain = run_training(cfg, tmp_path / "b", echo=None)
    assert changed.param_sha256 != plain.param_sha256 and changed.final_loss != plain.final_loss


def test_a_change_in_the_one_place_is_seen_by_explains_sums(smoothed):
    """explain's sums over a data-parallel step take the step's loss (device=cpu)."""
    from types import SimpleNamespace

    from tui_trainer.engine.probes import explain
    from tui_trainer.engine.models import build_model
    cfg = config.load(overrides=[*QUICK, "device=cpu"])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    parts = [(torch.rand(4, 1, 28, 28), torch.randint(0, 10, (4,))) for _ in range(2)]
    capture = SimpleNamespace(model=model, micro=[[p] for p in parts])
    explain.sums(capture, SimpleNamespace(cfg=cfg))
    assert set(smoothed) == {"grads"}


@pytest.mark.gpu
def test_a_change_in_the_one_place_is_seen_by_the_cuda_graph_capture(tmp_path, smoothed):
    """CUDA: a cuda_graph = step run captures the changed loss into its graphs."""
    from tui_trainer.engine.host import run_training
    cfg = config.load(overrides=[*QUICK, "max_steps=8", "device=cuda", "cuda_graph=step"])
    run_training(cfg, tmp_path / "a", echo=None)
    assert "_capture" in smoothed and "_step" in smoothed
