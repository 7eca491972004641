"""Comparing two runs: divergence over steps, config differences, summaries; and reducing a
long series to a panel's width. Core layer: numbers in, numbers out."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Sequence

from .figures import hashes, identity
from .stats import mean_sd
from ..settings.recorded import BIT_RELEVANT_SETTINGS

def reduce_minmax(xs: Sequence[float], ys: Sequence[float | None], width: int
                  ) -> tuple[list[float], list[float]]:
    """At most about 2*width points that keep each column's extremes: a curve reduced this
    way looks like the full one at that width (spikes stay visible)."""
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None and math.isfinite(y)]
    if len(pts) <= 2 * width or width <= 0:
        return [p[0] for p in pts], [p[1] for p in pts]
    per = len(pts) / width
    out_x: list[float] = []
    out_y: list[float] = []
    for i in range(width):
        chunk = pts[int(i * per):int((i + 1) * per)]
        if not chunk:
            continue
        lo = min(chunk, key=lambda p: p[1])
        hi = max(chunk, key=lambda p: p[1])
        for p in sorted({lo, hi}):
            out_x.append(p[0])
            out_y.append(p[1])
    return out_x, out_y


def sketch_distance(a: bytes | None, b: bytes | None) -> float | None:
    if not a or not b or len(a) != len(b):
        return None
    n = len(a) // 8
    va, vb = struct.unpack(f"{n}d", a), struct.unpack(f"{n}d", b)
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(va, vb, strict=True)))


@dataclass
class Divergence:
    steps: list[int]                  # logged steps both runs have
    loss_delta: list[float]           # |loss A - loss B| at those steps
    fp_steps: list[int]               # fingerprint steps both runs have
    param_distance: list[float | None]
    identical: bool | None            # hashes equal at every common fingerprint (None: none yet)
    first_difference: int | None      # first fingerprint step whose hashes differ


def divergence(steps_a: list[dict], steps_b: list[dict], fps_a: list[dict],
               fps_b: list[dict]) -> Divergence:
    la = {r["step"]: r["loss"] for r in steps_a if r["loss"] is not None}
    lb = {r["step"]: r["loss"] for r in steps_b if r["loss"] is not None}
    common = sorted(la.keys() & lb.keys())
    fa = {r["step"]: r for r in fps_a}
    fb = {r["step"]: r for r in fps_b}
    same = identity(hashes(fps_a), hashes(fps_b))
    return Divergence(
        steps=common, loss_delta=[abs(la[s] - lb[s]) for s in common],
        fp_steps=same.compared,
        param_distance=[sketch_distance(fa[s].get("sketch"), fb[s].get("sketch"))
                        for s in same.compared],
        identical=same.identical, first_difference=same.first_difference)


def config_diff(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    return [(k, a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


def settings_diff(a: dict[str, Any] | None, b: dict[str, Any] | None
                     ) -> list[tuple[str, Any, Any, bool]]:
    """Differences in effective settings; the flag marks those that can break bit-equality."""
    a, b = a or {}, b or {}
    out = []
    for k in sorted(a.keys() | b.keys()):
        if a.get(k) != b.get(k):
            out.append((k, a.get(k), b.get(k), k in BIT_RELEVANT_SETTINGS))
    return out


# --- seed noise: several runs of one config, one seed each -----------------------------------

@dataclass
class SeedSpread:
    """How far the runs of a seed sweep spread at each step: the noise a knob's effect has to
    beat. The loss is smoothed per run (EMA, as plotted) before the spread is taken."""
    runs: int
    steps: list[int]                  # logged steps every run has
    loss_mean: list[float]
    loss_sd: list[float]              # sample sd over the seeds
    loss_min: list[float]
    loss_max: list[float]
    fp_steps: list[int]               # fingerprint steps every run has
    param_spread: list[float | None]  # mean distance of a run's parameters from the centroid
    eval_steps: list[int]
    accuracy_mean: list[float]        # percent
    accuracy_sd: list[float]


def seed_spread(series: Sequence[Any], smoothing: float = 0.8) -> SeedSpread:
    """The spread of runs (each with .steps, .evals and .fingerprints rows) over steps."""
    from .figures import smooth
    losses = []
    for s in series:
        rows = [r for r in s.steps if r["loss"] is not None]
        losses.append(dict(zip((r["step"] for r in rows),
                               smooth([r["loss"] for r in rows], smoothing), strict=True)))
    common = sorted(set.intersection(*(set(d) for d in losses))) if losses else []
    common = [s for s in common if all(d[s] is not None and math.isfinite(d[s])
                                       for d in losses)]
    mean, sd, lo, hi = [], [], [], []
    for step in common:
        vals = [d[step] for d in losses]
        m, s, _ = mean_sd(vals)
        mean.append(m)
        sd.append(s or 0.0)
        lo.append(min(vals))
        hi.append(max(vals))
    sketches = [{r["step"]: r.get("sketch") for r in s.fingerprints} for s in series]
    fp_common = sorted(set.intersection(*(set(d) for d in sketches))) if sketches else []
    spread = []
    for step in fp_common:
        vecs = [struct.unpack(f"{len(d[step]) // 8}d", d[step]) if d[step] else None
                for d in sketches]
        if any(v is None for v in vecs) or len({len(v) for v in vecs}) != 1:
            spread.append(None)
            continue
        centre = [sum(col) / len(vecs) for col in zip(*vecs, strict=True)]
        spread.append(sum(math.sqrt(sum((x - c) ** 2 for x, c in zip(v, centre, strict=True)))
                          for v in vecs) / len(vecs))
    # The spread of accuracy is said in percentage points (a figure shown, not kept).
    accs = [{e["step"]: 100 * e["accuracy"] for e in s.evals if e.get("accuracy") is not None}
            for s in series]
    ev_common = sorted(set.intersection(*(set(d) for d in accs))) if accs else []
    acc_mean, acc_sd = [], []
    for step in ev_common:
        m, s, _ = mean_sd([d[step] for d in accs])
        acc_mean.append(m)
        acc_sd.append(s or 0.0)
    return SeedSpread(len(series), common, mean, sd, lo, hi, fp_common, spread, ev_common,
                      acc_mean, acc_sd)


def spread_text(sp: SeedSpread, names: str) -> str:
    """The seed noise in words: how the spread grows from the first steps to the last."""
    if sp.runs < 2 or not sp.steps:
        return f"Seed sweep ({names}): not enough shared steps yet."
    def at(i: int) -> str:
        return f"step {sp.steps[i]}: loss {sp.loss_mean[i]:.4f} ±{sp.loss_sd[i]:.4f} (sd)"
    parts = [f"Seed sweep, {sp.runs} seeds ({names}). Seed-to-seed spread of the smoothed "
             f"training loss, {at(0)} -> {at(len(sp.steps) - 1)}."]
    grown = [v for v in sp.param_spread if v is not None]
    if len(grown) >= 2:
        parts.append(f"Parameters: mean distance from the seeds' centroid {grown[0]:.3g} at "
                     f"step {sp.fp_steps[0]} -> {grown[-1]:.3g} at step {sp.fp_steps[-1]}.")
    if sp.eval_steps:
        parts.append(f"Accuracy at step {sp.eval_steps[-1]}: {sp.accuracy_mean[-1]:.2f}% "
                     f"±{sp.accuracy_sd[-1]:.2f} (sd): a knob's effect on accuracy smaller "
                     "than this is within seed noise.")
    return " ".join(parts)
