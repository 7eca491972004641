"""What the plot panels draw, computed from the runs' series: per panel, a few lines already
reduced to about the panel's width, with the user's smoothing, x axis and window applied.

Computed in the dashboard's polling thread (never on the UI thread), only for the tab that is
shown and only when a plotted run got new rows or the options changed. Core layer: numbers in,
numbers out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .divergence import reduce_minmax
from .figures import PHASES, memory_lines, smooth

X_AXES = {"step": "optimizer step", "samples": "samples (steps x batch)",
          "time": "training time s"}
SMOOTHING_CHOICES = (0.0, 0.6, 0.8, 0.9, 0.95, 0.99)

# (panel id, title, y label): the panels of the Plots tab, in order.
PANELS = (("plot-loss", "train loss (raw faint, smoothed bold)", "loss"),
          ("plot-eval", "evaluation loss", "loss"),
          ("plot-accuracy", "evaluation accuracy", "%"),
          ("plot-throughput", "throughput", "samples/s"),
          ("plot-memory", "memory", "MiB"),
          ("plot-timing", "where a step's time goes (phases stacked)", "ms per step"),
          ("plot-lr", "learning rate", "lr"),
          ("plot-grad", "gradient norm", "L2"))


@dataclass(frozen=True)
class PlotOptions:
    x: str = "step"
    smoothing: float = 0.8      # EMA weight; 0 = none
    last: int = 0               # only the last N steps (0: all)
    log_y: bool = False
    width: int = 60             # points per line after reduction: about the panel's columns


@dataclass(frozen=True)
class Line:
    label: str
    xs: list[float]
    ys: list[float]
    colour: int                 # index of the run's colour
    faint: bool = False


def _x(rows: Sequence[Mapping[str, Any]], axis: str, config: Mapping[str, Any]) -> list[float]:
    if axis == "time":
        return [r.get("elapsed") or 0.0 for r in rows]
    if axis == "samples":
        per = (config.get("batch_size") or 1) * (config.get("grad_accum_steps") or 1)
        return [r["step"] * per for r in rows]
    return [r["step"] for r in rows]


def _line(label: str, xs: list[float], ys: Sequence[Any], colour: int, opts: PlotOptions,
          faint: bool = False) -> Line:
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if isinstance(y, (int, float))]
    if opts.log_y:
        pts = [(x, math.log10(y)) for x, y in pts if y > 0 and math.isfinite(y)]
    rx, ry = reduce_minmax([p[0] for p in pts], [p[1] for p in pts], opts.width)
    # reduce_minmax drops NaN/inf: a diverged run's last point is kept as NaN, so the line
    # shows where it ends and a reader of the data sees it.
    if pts and not (isinstance(pts[-1][1], float) and math.isfinite(pts[-1][1])):
        rx.append(pts[-1][0])
        ry.append(pts[-1][1])
    return Line(label, rx, ry, colour, faint)


def _band(label: str, per_run: list[dict[float, float]], colour: int, opts: PlotOptions
          ) -> list[Line]:
    """Mean line and faint min/max lines over runs, at the x values every run has."""
    common = sorted(set.intersection(*(set(d) for d in per_run))) if per_run else []
    mean = [sum(d[x] for d in per_run) / len(per_run) for x in common]
    return [_line(f"{label} min", common, [min(d[x] for d in per_run) for x in common],
                  colour, opts, faint=True),
            _line(f"{label} max", common, [max(d[x] for d in per_run) for x in common],
                  colour, opts, faint=True),
            _line(f"{label} mean", common, mean, colour, opts)]


def band_lines(series: Sequence[Any], label: str, colour: int, opts: PlotOptions
               ) -> dict[str, list[Line]]:
    """A seed sweep's runs as one band per panel: the mean over the seeds and the min-max
    spread (the loss smoothed per run first, as a single run's line is)."""
    out: dict[str, list[Line]] = {pid: [] for pid, _, _ in PANELS}
    if not series:
        return out
    loss, acc, ev, thr = [], [], [], []
    for s in series:
        rows = [r for r in s.steps if isinstance(r.get("loss"), (int, float))]
        if opts.last and rows:
            first = rows[-1]["step"] - opts.last
            rows = [r for r in rows if r["step"] > first]
        ys = [r["loss"] for r in rows]
        ys = smooth(ys, opts.smoothing) if opts.smoothing else ys
        loss.append({r["step"]: y for r, y in zip(rows, ys, strict=True) if y is not None})
        thr.append({r["step"]: r["samples_per_s"] for r in rows
                    if isinstance(r.get("samples_per_s"), (int, float))})
        acc.append({e["step"]: 100 * e["accuracy"] for e in s.evals
                    if e.get("accuracy") is not None})
        ev.append({e["step"]: e["loss"] for e in s.evals if e.get("loss") is not None})
    out["plot-loss"] = _band(label, loss, colour, opts)
    out["plot-accuracy"] = _band(label, acc, colour, opts)
    out["plot-eval"] = _band(label, ev, colour, opts)
    out["plot-throughput"] = _band(label, thr, colour, opts)
    return out


def plot_lines(series: Mapping[int, Any], runs: Sequence[int], configs: Mapping[int, Any],
               opts: PlotOptions, groups: Sequence[tuple[str, Sequence[int]]] = ()
               ) -> dict[str, list[Line]]:
    """{panel id: lines} for the runs (in their colour order). Runs in one of `groups` (a
    seed sweep: label, its runs) are drawn together as the group's mean and min-max band
    (on the step axis) instead of one line each."""
    out: dict[str, list[Line]] = {pid: [] for pid, _, _ in PANELS}
    banded: set[int] = set()
    if opts.x == "step":
        for label, members in groups:
            got = [series[r] for r in members if r in runs and r in series]
            if len(got) < 2:
                continue
            colour = min(runs.index(r) for r in members if r in runs)
            for pid, lines in band_lines(got, label, colour, opts).items():
                out[pid].extend(lines)
            banded.update(members)
    for i, rid in enumerate(runs):
        s = series.get(rid)
        if s is None or rid in banded:
            continue
        cfg = configs.get(rid) or {}
        rows = s.steps
        evals = s.evals
        if opts.last and rows:
            first = rows[-1]["step"] - opts.last
            rows = [r for r in rows if r["step"] > first]
            evals = [e for e in evals if e["step"] > first]
        xs = _x(rows, opts.x, cfg)
        exs = _x(evals, opts.x, cfg) if opts.x != "time" else \
            _eval_times(evals, s.steps)

        def col(k: str, rows: Sequence[Mapping[str, Any]] = rows) -> list[Any]:
            return [r.get(k) for r in rows]

        name = str(rid)
        loss = col("loss")
        if opts.smoothing:
            out["plot-loss"].append(_line(f"{name} raw", xs, loss, i, opts, faint=True))
            out["plot-loss"].append(_line(f"{name} smoothed", xs,
                                          smooth(loss, opts.smoothing), i, opts))
        else:
            out["plot-loss"].append(_line(name, xs, loss, i, opts))
        out["plot-eval"].append(_line(name, exs, [e.get("loss") for e in evals], i, opts))
        out["plot-accuracy"].append(_line(
            name, exs, [None if e.get("accuracy") is None else 100 * e["accuracy"]
                        for e in evals], i, opts))
        out["plot-throughput"].append(_line(name, xs, col("samples_per_s"), i, opts))
        out["plot-memory"] += [_line(f"{name} {what}", xs, ys, i, opts, faint=faint)
                               for what, ys, faint in memory_lines(rows)]
        out["plot-timing"].extend(_phase_lines(name, rows, xs, i, opts))
        out["plot-lr"].append(_line(name, xs, col("lr"), i, opts))
        out["plot-grad"].append(_line(name, xs, col("grad_norm"), i, opts))
    return out


def _phase_lines(name: str, rows: Sequence[Mapping[str, Any]], xs: list[float], colour: int,
                 opts: PlotOptions, least_share: float = 0.02) -> list[Line]:
    """A run's step time by phase (figures.PHASES), in ms per step, stacked: each line is
    the sum of its phase and those before it, drawn for the phases that take at least
    `least_share` of the time (the smaller ones are in the next line's sum). Rows from
    before phases were recorded: data and compute instead, also in ms per step."""
    # the steps each row covers (the first: as many as the next row, its interval's length,
    # or all steps from 0 when it is alone)
    steps = [r["step"] - rows[k - 1]["step"] if k else
             (rows[1]["step"] - r["step"] if len(rows) > 1 else r["step"])
             for k, r in enumerate(rows)]
    if not rows or not all(isinstance(r.get("forward_s"), (int, float)) for r in rows):
        per = [{"data": r.get("data_s"), "compute": r.get("compute_s")} for r in rows]
        keys: tuple[str, ...] = ("data", "compute")
    else:
        per = [{k: r.get(f"{k}_s") for k in PHASES} for r in rows]
        keys = PHASES
    totals = {k: sum(v[k] or 0.0 for v in per) for k in keys}
    whole = sum(totals.values()) or 1.0
    lines, below = [], [0.0] * len(rows)
    for n, k in enumerate(keys):
        below = [b + (v[k] or 0.0) * 1000 / max(1, c) for b, v, c in zip(below, per, steps)]
        if totals[k] >= least_share * whole or n == len(keys) - 1:
            lines.append(_line(f"{name} {'+' if lines else ''}{k}", xs, list(below), colour,
                               opts, faint=n < len(keys) - 1))
    return lines


def _eval_times(evals: Sequence[Mapping[str, Any]], steps: Sequence[Mapping[str, Any]]
                ) -> list[float]:
    """An evaluation's x on the time axis: the elapsed time of the step row it follows."""
    at = {r["step"]: r.get("elapsed") or 0.0 for r in steps}
    last = 0.0
    out = []
    for e in evals:
        last = at.get(e["step"], last)
        out.append(last)
    return out
