"""Series reduction and run comparison (core, pure functions)."""

from __future__ import annotations

import math
import random
import struct

from tui_trainer.core.analysis.divergence import (config_diff, divergence, settings_diff,
                                                  reduce_minmax, sketch_distance)
from tui_trainer.core.analysis.figures import smooth


def test_reduce_keeps_each_columns_extremes_and_bounds_the_size():
    rng = random.Random(0)
    xs = list(range(100_000))
    ys = [rng.random() for _ in xs]
    ys[31_337] = 50.0                         # a spike must survive reduction
    ys[77_777] = -50.0
    rx, ry = reduce_minmax(xs, ys, 80)
    assert len(rx) <= 160
    assert max(ry) == 50.0 and min(ry) == -50.0
    assert rx == sorted(rx)
    # Short series pass through untouched; missing values are dropped.
    assert reduce_minmax([1, 2, 3], [1.0, None, 3.0], 80) == ([1, 3], [1.0, 3.0])


def test_smooth_is_a_debiased_moving_average():
    assert smooth([2.0, 2.0, 2.0]) == [2.0, 2.0, 2.0]
    out = smooth([0.0, 10.0], weight=0.5)
    assert out[0] == 0.0 and math.isclose(out[1], 10 * 0.5 / 0.75)


def _sketch(values):
    return struct.pack(f"{len(values)}d", *values)


def test_divergence_of_two_runs():
    steps_a = [{"step": s, "loss": 1.0 / s} for s in (1, 2, 3)]
    steps_b = [{"step": s, "loss": 1.0 / s + (0.5 if s == 3 else 0)} for s in (1, 2, 3, 4)]
    fps_a = [{"step": s, "sha256": f"h{s}", "sketch": _sketch([0, 0])} for s in (0, 2, 4)]
    fps_b = [{"step": 0, "sha256": "h0", "sketch": _sketch([0, 0])},
             {"step": 2, "sha256": "other", "sketch": _sketch([3, 4])},
             {"step": 4, "sha256": "x", "sketch": _sketch([6, 8])}]
    d = divergence(steps_a, steps_b, fps_a, fps_b)
    assert d.steps == [1, 2, 3]
    assert d.loss_delta[:2] == [0.0, 0.0] and math.isclose(d.loss_delta[2], 0.5)
    assert d.fp_steps == [0, 2, 4] and d.param_distance == [0.0, 5.0, 10.0]
    assert d.identical is False and d.first_difference == 2
    same = divergence(steps_a, steps_a, fps_a, fps_a)
    assert same.identical is True and same.first_difference is None
    assert divergence([], [], [], []).identical is None


def test_sketch_distance_and_config_differences():
    assert sketch_distance(_sketch([1, 1]), _sketch([4, 5])) == 5.0
    assert sketch_distance(None, _sketch([1])) is None
    assert config_diff({"a": 1, "b": 2}, {"a": 1, "b": 3}) == [("b", 2, 3)]
    flagged = settings_diff({"num_threads": 2, "platform": "x"},
                               {"num_threads": 1, "platform": "y"})
    assert flagged == [("num_threads", 2, 1, True), ("platform", "x", "y", False)]


def test_a_captured_step_is_named_among_the_settings_that_change_bits():
    """Two runs whose only difference is cuda_graph: the verdict names it and why; a run
    recorded before the setting existed reads as off, so it is no difference."""
    from tui_trainer.core.analysis.verdicts import explain
    old = {"config": {"seed": 1}, "settings": {"device": "cuda:0"}}
    off = {"config": {"seed": 1}, "settings": {"device": "cuda:0", "cuda_graph": "off"}}
    step = {"config": {"seed": 1}, "settings": {"device": "cuda:0", "cuda_graph": "step"}}
    named = [r for r in explain([off, step]) if r.startswith("cuda_graph")]
    assert named == ["cuda_graph differs between the runs: 'off', 'step' (a captured step "
                     "updates with the capturable optimizer, its learning rate a float32 "
                     "tensor on the device: it may round otherwise than the step launched op "
                     "by op)"]
    assert not [r for r in explain([old, off]) if r.startswith("cuda_graph")]
