"""Confidence intervals for repeated measurements: is a difference more than noise?

An A/B study with repeats trains the base and each variant once per round, the rounds
interleaved (never all of A, then all of B), and the base and a variant of one round with the
same seed. Each round gives one paired ratio variant/base. On the log scale these ratios are
treated as a sample from a normal distribution (timing noise is multiplicative: a busy core
slows a run by a factor, not by an amount), so

    ratio = exp(mean(log r_i)),   interval = exp(mean ± t(level, n-1) * sd / sqrt(n))

a Student-t interval of the geometric mean. A figure is "higher" (or "faster") only when the
whole interval lies above 1, "lower" when it lies below, and otherwise within noise at that
level. The seeds differ from round to round, so for accuracy and loss the spread between
rounds is seed noise: a variant whose accuracy interval includes 1 is within seed noise.

Below MIN_PAIRS rounds there is no interval and no verdict: with two pairs the t quantile is
12.7 (one degree of freedom) and the interval spans everything from 0 to thousands, which
says nothing. The per-round ratios are shown instead.

Core layer: standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

DEFAULT_LEVEL = 0.95
MIN_PAIRS = 3       # the fewest rounds that give an interval (two degrees of freedom)


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t value below which a fraction p lies (0 < p < 1)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Interval:
    """A ratio (geometric mean of paired ratios) with its confidence interval."""
    ratio: float
    low: float | None         # None with fewer than MIN_PAIRS pairs: no interval
    high: float | None
    n: int
    level: float
    ratios: tuple[float, ...] = ()     # each round's ratio, in round order

    def verdict(self, up: str = "higher", down: str = "lower",
                same: str = "within noise") -> str:
        if self.low is None or self.high is None:
            return no_interval(self.n)
        if self.low > 1.0:
            return up
        if self.high < 1.0:
            return down
        return same

    def text(self) -> str:
        if self.low is None or self.high is None:
            if len(self.ratios) > 1:
                return f"{self.ratio:.2f}x; rounds {' '.join(f'{r:.2f}' for r in self.ratios)}"
            return f"{self.ratio:.2f}x"
        return f"{self.ratio:.2f}x [{self.low:.2f}-{self.high:.2f}]"


def ratio_interval(pairs: Iterable[tuple[float | None, float | None]],
                   level: float = DEFAULT_LEVEL) -> Interval | None:
    """The paired ratio variant/base over rounds with its `level` interval; pairs with a
    missing, non-finite or non-positive value are left out. None without a usable pair."""
    logs = [math.log(v / b) for b, v in pairs
            if b is not None and v is not None and math.isfinite(b) and math.isfinite(v)
            and b > 0 and v > 0]
    n = len(logs)
    if n == 0:
        return None
    mean = sum(logs) / n
    ratios = tuple(math.exp(x) for x in logs)
    if n < MIN_PAIRS:
        return Interval(math.exp(mean), None, None, n, level, ratios)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = t_quantile(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    return Interval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n, level,
                    ratios)


def no_interval(n: int) -> str:
    """What a ratio from too few rounds is, in words."""
    return (f"no verdict: {n} round{'s' if n != 1 else ''}, an interval needs {MIN_PAIRS} "
            "or more")


def mean_sd(values: Sequence[float | None]) -> tuple[float | None, float | None, int]:
    """Mean and sample standard deviation of the finite values, and how many there were."""
    xs = [v for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return None, None, 0
    mean = sum(xs) / len(xs)
    if len(xs) < 2:
        return mean, None, len(xs)
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)), len(xs)


def pairs_needed(sd_log: float, effect: float, level: float = DEFAULT_LEVEL,
                 power: float = 0.9) -> int:
    """How many paired rounds make an effect of `effect` (e.g. 1.15) come out with its
    interval clear of 1 with probability about `power`, for paired log-ratio noise
    `sd_log` (a normal approximation of the t-test's power)."""
    from statistics import NormalDist
    z_power = NormalDist().inv_cdf(power)
    target = abs(math.log(effect))
    for n in range(2, 1000):
        t = t_quantile(0.5 + level / 2.0, n - 1)
        if (t + z_power) * sd_log / math.sqrt(n) <= target:
            return n
    return 1000
