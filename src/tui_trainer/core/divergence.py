"""Comparing two runs: divergence over steps, config differences, summaries; and reducing a
long series to a panel's width. Core layer: numbers in, numbers out."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Sequence

from .figures import hashes, identity

# Settings that can change the bits of a run when they differ between two runs.
BIT_RELEVANT_SETTINGS = (
    "seed", "deterministic_algorithms", "cudnn_deterministic", "cudnn_benchmark",
    "num_threads", "loader", "augment", "num_workers", "seed_workers", "amp", "channels_last",
    "compile", "model", "device", "device_name", "torch", "cuda", "cudnn",
    "cublas_workspace_config", "data", "world_size", "dist_backend",
)
# What a setting reads as for a run recorded before it existed.
SETTING_DEFAULTS = {"world_size": 1}


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
