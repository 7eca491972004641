"""Confidence intervals for repeated measurements: is a difference more than noise?

An A/B study with repeats trains the base and each variant once per round, the rounds
interleaved (never all of A, then all of B), and the base and a variant of one round with the
same seed. Each round gives one paired ratio variant/base, taken on the log scale (timing
noise is multiplicative: a busy core slows a run by a factor, not by an amount).

This machine's noise is heavy-tailed: most rounds within 2%, some 10 to 30% off when another
process takes the core (docs/benchmarks.md). A Student-t interval assumes normal noise, and
one such round moves its mean and widens or shifts it. So the ratio and its interval are
rank-based instead (Hodges-Lehmann, with the Wilcoxon signed-rank interval):

    ratio    = exp(median of the Walsh averages (x_i + x_j) / 2, i <= j)
    interval = exp([w_(k), w_(M+1-k)])   (the M sorted Walsh averages)

with k the largest count for which P(W+ < k) <= (1 - level) / 2 under the signed-rank
statistic's exact distribution (a normal approximation above EXACT_UP_TO rounds). It assumes
only that the log ratios are independent and spread symmetrically around the true one (a
busy core hits the base or the variant alike: the rounds are interleaved), and it covers at
least `level` whatever the tails. The price: n rounds give at most 1 - 2 / 2^n, so a 95%
interval needs 6 rounds (min_pairs), 90% 5, 80% 4. With fewer there is no interval and no
verdict, and the per-round ratios are shown instead.

A figure is "higher" (or "faster") only when the whole interval lies above 1, "lower" when it
lies below, and otherwise within noise at that level. The seeds differ from round to round,
so for accuracy and loss the spread between rounds is seed noise.

The Student-t interval of the geometric mean (`t_interval`) is kept to compare against
(benchmarks/ab_noise.py, tests/test_ab.py's coverage test).

Core layer: standard library only.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

DEFAULT_LEVEL = 0.95
EXACT_UP_TO = 60    # rounds up to which the signed-rank distribution is counted exactly


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
    return _invert(lambda t: t_cdf(t, df), p)


def _invert(cdf: Callable[[float], float], p: float) -> float:
    """The x >= 0 at which an increasing `cdf` reaches p (bisection)."""
    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if cdf(mid) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def _gammainc(a: float, x: float) -> float:
    """The regularized lower incomplete gamma function P(a, x) (a series below a + 1, a
    continued fraction above it, as the incomplete beta's)."""
    if x <= 0.0:
        return 0.0
    front = math.exp(-x + a * math.log(x) - math.lgamma(a))
    if x < a + 1.0:
        term = total = 1.0 / a
        for n in range(1, 500):
            term *= x / (a + n)
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return front * total
    tiny = 1e-300
    b, c, d = x + 1.0 - a, 1.0 / tiny, 1.0 / (x + 1.0 - a)
    h = d
    for i in range(1, 500):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return 1.0 - front * h


@functools.lru_cache(maxsize=1024)
def chi2_quantile(p: float, df: float) -> float:
    """The chi-square value (df degrees of freedom) below which a fraction p lies."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    return _invert(lambda x: _gammainc(df / 2.0, x / 2.0), p)


def signed_rank_cdf(n: int) -> list[float]:
    """P(W+ <= w) for w = 0 .. n(n+1)/2: the exact null distribution of the Wilcoxon
    signed-rank statistic of n pairs (each of the 2^n sign patterns equally likely)."""
    top = n * (n + 1) // 2
    counts = [1] + [0] * top
    for rank in range(1, n + 1):
        for w in range(top, rank - 1, -1):
            counts[w] += counts[w - rank]
    total, acc, out = float(2 ** n), 0, []
    for c in counts:
        acc += c
        out.append(acc / total)
    return out


@functools.lru_cache(maxsize=256)
def _rank_cut(n: int, level: float) -> tuple[int, float]:
    """(k, coverage): the interval runs from the k-th smallest to the k-th largest Walsh
    average and covers `coverage` >= level; k = 0 when n pairs cannot reach `level`."""
    alpha = (1.0 - level) / 2.0
    if n <= EXACT_UP_TO:
        cdf = signed_rank_cdf(n)
        k = 0
        while k < len(cdf) and cdf[k] <= alpha + 1e-12:   # P(W+ <= k) = P(W+ < k + 1)
            k += 1
        return k, (1.0 - 2.0 * cdf[k - 1]) if k else 0.0
    from statistics import NormalDist
    mean, sd = n * (n + 1) / 4.0, math.sqrt(n * (n + 1) * (2 * n + 1) / 24.0)
    k = max(1, int(math.floor(mean - NormalDist().inv_cdf(1.0 - alpha) * sd - 0.5)) + 1)
    return k, level


def min_pairs(level: float = DEFAULT_LEVEL) -> int:
    """The fewest rounds that give an interval at `level` (6 at 95%)."""
    n = 1
    while 2.0 / 2 ** n > 1.0 - level + 1e-12:
        n += 1
    return n


MIN_PAIRS = min_pairs(DEFAULT_LEVEL)


@dataclass(frozen=True)
class Interval:
    """A ratio (geometric mean of paired ratios) with its confidence interval."""
    ratio: float
    low: float | None         # None with fewer than MIN_PAIRS pairs: no interval
    high: float | None
    n: int
    level: float
    ratios: tuple[float, ...] = ()     # each round's ratio, in round order
    coverage: float | None = None      # what the interval covers (>= level; rank-based)
    method: str = "signed-rank"         # or "t" (t_interval, kept to compare against)

    @property
    def width(self) -> float | None:
        """How wide the interval is, as high / low - 1 (0.10: the ratio is known to 10%)."""
        if self.low is None or self.high is None or self.low <= 0:
            return None
        return self.high / self.low - 1.0

    def verdict(self, up: str = "higher", down: str = "lower",
                same: str = "within noise") -> str:
        if self.low is None or self.high is None:
            return no_interval(self.n, self.level)
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


def _logs(pairs: Iterable[tuple[float | None, float | None]]) -> list[float]:
    return [math.log(v / b) for b, v in pairs
            if b is not None and v is not None and math.isfinite(b) and math.isfinite(v)
            and b > 0 and v > 0]


def ratio_interval(pairs: Iterable[tuple[float | None, float | None]],
                   level: float = DEFAULT_LEVEL) -> Interval | None:
    """The paired ratio variant/base over rounds (Hodges-Lehmann) with its signed-rank
    interval at `level`; pairs with a missing, non-finite or non-positive value are left
    out. None without a usable pair; no interval (low = high = None) with fewer than
    min_pairs(level) pairs."""
    logs = _logs(pairs)
    n = len(logs)
    if n == 0:
        return None
    ratios = tuple(math.exp(x) for x in logs)
    walsh = sorted((logs[i] + logs[j]) / 2.0 for i in range(n) for j in range(i, n))
    m = len(walsh)
    middle = walsh[m // 2] if m % 2 else (walsh[m // 2 - 1] + walsh[m // 2]) / 2.0
    k, coverage = _rank_cut(n, level)
    if k == 0:
        return Interval(math.exp(middle), None, None, n, level, ratios)
    return Interval(math.exp(middle), math.exp(walsh[k - 1]), math.exp(walsh[m - k]), n, level,
                    ratios, coverage)


def t_interval(pairs: Iterable[tuple[float | None, float | None]],
               level: float = DEFAULT_LEVEL) -> Interval | None:
    """The Student-t interval of the geometric mean of the paired ratios (what studies used
    before the rank-based interval; assumes normal log-ratio noise). Kept to compare."""
    logs = _logs(pairs)
    n = len(logs)
    if n == 0:
        return None
    mean = sum(logs) / n
    ratios = tuple(math.exp(x) for x in logs)
    if n < 3:
        return Interval(math.exp(mean), None, None, n, level, ratios, method="t")
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = t_quantile(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    return Interval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n, level,
                    ratios, level, "t")


def no_interval(n: int, level: float = DEFAULT_LEVEL) -> str:
    """What a ratio from too few rounds is, in words."""
    return (f"no verdict: {n} round{'s' if n != 1 else ''}, a {level:.0%} interval needs "
            f"{min_pairs(level)} or more")


def mean_sd(values: Sequence[float | None]) -> tuple[float | None, float | None, int]:
    """Mean and sample standard deviation of the finite values, and how many there were."""
    xs = [v for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return None, None, 0
    mean = sum(xs) / len(xs)
    if len(xs) < 2:
        return mean, None, len(xs)
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)), len(xs)


def sd_interval(values: Sequence[float | None], level: float = DEFAULT_LEVEL
                ) -> Interval | None:
    """The standard deviation of the finite values (`ratio`: the sample sd) with its
    chi-square interval at `level`: (n - 1) s^2 / sigma^2 is chi-square with n - 1 degrees
    of freedom where the values are normal (a seed sweep's accuracies). None below 2."""
    _, sd, n = mean_sd(values)
    if sd is None:
        return None
    tail = (1.0 - level) / 2.0
    df = n - 1
    return Interval(sd, sd * math.sqrt(df / chi2_quantile(1.0 - tail, df)),
                    sd * math.sqrt(df / chi2_quantile(tail, df)), n, level,
                    method="chi-square")


def pairs_needed(sd_log: float, effect: float, level: float = DEFAULT_LEVEL,
                 power: float = 0.9) -> int:
    """How many paired rounds make an effect of `effect` (e.g. 1.15) come out with its
    interval clear of 1 with probability about `power`, for paired log-ratio noise
    `sd_log` (a normal approximation of the t-test's power; the signed-rank interval is
    about as sharp on normal noise and sharper on heavy tails), and never fewer than an
    interval at `level` needs."""
    from statistics import NormalDist
    z_power = NormalDist().inv_cdf(power)
    target = abs(math.log(effect))
    for n in range(max(2, min_pairs(level)), 1000):
        t = t_quantile(0.5 + level / 2.0, n - 1)
        if (t + z_power) * sd_log / math.sqrt(n) <= target:
            return n
    return 1000
