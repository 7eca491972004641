"""When an A/B study has seen enough: a three-way answer (faster, slower, the same within a
margin) as soon as the rounds support one, "unknown" at a cap, and an error rate kept at
its level however often the study looks.

A study that decides over whole runs (`ab --decide --whole-runs`) trains rounds as usual
(every arm once a round, interleaved, round r with seed + r) and looks at its paired ratios
only at fixed round counts, LOOKS: 8, 10, 12, 15 and 20 (the cap). At each look every
variant's samples/s is judged with the rank-based interval of core.analysis.stats
(Hodges-Lehmann with the signed-rank interval) at a level corrected for the looks
(`one_sided`):

- **faster / slower** when the corrected interval lies wholly above or below 1: each side a
  one-sided signed-rank test at a level c such that the chance that any of the looks says
  so of two equal arms is at most alpha / 2 a side, alpha in all;
- **the same within ±margin** when the interval of level 1 - 2c' lies wholly inside
  [1/(1+margin), 1+margin]: two one-sided tests (TOST) at c' each, c' such that a price of
  more than the margin is called "the same" at most alpha of the time over all the looks;
- **unknown** at the cap when neither holds (the noise was too wide for the margin, or the
  price sits on the margin): more rounds or a quieter machine would tell.

The levels c and c' are calibrated to the looks (CALIBRATED; a constant level at every
look, Pocock's design): the signed-rank statistics of one study at its looks are drawn
exactly from their joint law where the arms are equal (or the price sits on the margin),
which is the same whatever the noise's distribution so long as it is symmetric (the ranks
of |x| are a random order and the signs fair coins: `null_statistics`), and c is the
largest level at which the simulated studies reject at any look at most alpha of the time
(less two standard errors of the simulation). Where the looks are not those of a calibrated
schedule (a cap of the user's), the level is Bonferroni's alpha / L, which holds by the
union bound whatever the looks' correlation, but is stricter than it needs: the looks of one
study share most of their rounds.

A round counts only where both arms finished. Rounds that shared the CPU with another
process are re-run as in every study (runner's rerun_loaded); a verdict reached with loaded
rounds says so. Pinpoint's (Chromium) three answers and tachometer's stop-when-clear rule,
with the error rate of a fixed design (docs/benchmarks.md measures it over A/A studies).

A seed sweep that decides (`sweep --decide`) is the same rule on one arm: its looks are
SEED_LOOKS seeds, and what it judges is the sd of the seeds' accuracy, under or over a
margin in points, or unknown at its cap (decide_spread). One engine answers the A/B tab,
`ab`, `sweep` and the machine fit; a price in windows (tui_trainer/pricing.py) calls
decide() with its own looks.

Core layer: standard library only.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from . import stats

LOOKS = (8, 10, 12, 15, 20)      # the rounds at which a deciding study looks; the last: its cap
DEFAULT_MARGIN = 0.05            # "the same" means within ±5%
ALPHA = 0.05                     # the error rate over all looks, of each kind
# A seed sweep that decides (`sweep --decide`) looks at its accuracies' spread at these
# seed counts (the last: its cap unless given): is the seed noise under the margin?
SEED_LOOKS = (5, 8, 12, 16, 20)
DEFAULT_SPREAD = 0.005           # accuracy's sd over seeds: 0.5 points
# Each look's one-sided level for a schedule of looks, by the error rate it keeps over all
# of them: calibrated by `calibrate` over 200,000 simulated studies (null_statistics)
# (benchmarks/look_levels.py prints them again; tests/test_decide.py checks them). Bonferroni
# would give 0.005 and 0.01 at five looks, 0.0036 and 0.0071 at seven.
CALIBRATED: dict[tuple[int, ...], dict[float, float]] = {
    (8, 10, 12, 15, 20): {0.025: 0.0097, 0.05: 0.0205},
    (8, 12, 16, 20, 24, 28, 32): {0.025: 0.0077, 0.05: 0.0167},
}
# The same for a seed sweep's sd at SEED_LOOKS (its chi-square interval, both tails at this
# level; the "under" side is the binding one): Bonferroni would give 0.01.
CALIBRATED_SPREAD: dict[tuple[int, ...], dict[float, float]] = {
    (5, 8, 12, 16, 20): {0.05: 0.0147},
}


@dataclass(frozen=True)
class Decision:
    verdict: str                 # faster, slower, the same, unknown, or "" (look again later)
    rounds: int                  # paired rounds judged
    interval: stats.Interval | None   # the corrected interval the verdict rests on
    level: float                 # that interval's level (corrected for the looks)
    next_look: int | None        # the round count of the next look (None: decided or capped)
    words: str                   # the verdict with its figures, one line

    @property
    def decided(self) -> bool:
        return bool(self.verdict)


def looks(cap: int | None = None, planned: tuple[int, ...] = LOOKS) -> tuple[int, ...]:
    """The looks of a study capped at `cap` rounds (the cap is always a look)."""
    if cap is None:
        return planned
    return tuple(n for n in planned if n < cap) + (cap,)


def _where(seen: tuple[int, ...], n: int) -> tuple[int | None, int | None]:
    """(the look reached with n rounds or None, the next look or None past the cap)."""
    return (max((x for x in seen if x <= n), default=None),
            next((x for x in seen if x > n), None))


def decide(pairs: Iterable[tuple[float | None, float | None]], margin: float = DEFAULT_MARGIN,
           cap: int | None = None, alpha: float = ALPHA,
           up: str = "faster", down: str = "slower",
           looks_at: tuple[int, ...] | None = None, unit: str = "rounds",
           noise: float = 0.0) -> Decision:
    """The answer so far for (base, variant) samples/s pairs in round order (`looks_at`:
    the looks, the last the cap, where not LOOKS: a windowed price's, tui_trainer/pricing.py,
    whose pairs are cheap; `noise`: a difference no larger is no difference, criterion.rs's
    noise threshold: "faster" and "slower" need the interval clear of 1 ± noise)."""
    pairs = list(pairs)
    seen = looks_at or looks(cap)
    n = len(stats._logs(pairs))
    differ, alike = levels(seen, alpha)
    at, next_look = _where(seen, n)
    if at is None or n != at and next_look is not None:
        # between looks: nothing is judged (an answer here would be one more look)
        iv = stats.ratio_interval(pairs, differ)
        return Decision("", n, iv, differ, next_look,
                        f"{n} of {next_look} {unit} before the next look")
    diff = stats.ratio_interval(pairs, differ)
    same = stats.ratio_interval(pairs, alike)
    hi_margin, lo_margin = 1 + margin, 1 / (1 + margin)
    if diff is not None and diff.low is not None and diff.low > 1 + noise:
        return Decision(up, n, diff, differ, None,
                        f"{diff.text()} {up} ({diff.level:.1%} interval, {n} {unit})")
    if diff is not None and diff.high is not None and diff.high < 1 / (1 + noise):
        return Decision(down, n, diff, differ, None,
                        f"{diff.text()} {down} ({diff.level:.1%} interval, {n} {unit})")
    if same is not None and same.low is not None and same.high is not None and \
            same.low >= lo_margin and same.high <= hi_margin:
        return Decision("the same", n, same, alike, None,
                        f"{same.text()} the same within ±{margin:.0%} ({same.level:.1%} "
                        f"interval, {n} {unit})")
    if next_look is None:
        iv = same or diff
        clear = f"1 ± {noise:.0%}" if noise else "1"
        return Decision("unknown", n, iv, alike, None,
                        f"unknown after {n} {unit}: {iv.text() if iv else 'no ratio'} is "
                        f"neither clear of {clear} nor within ±{margin:.0%}")
    return Decision("", n, diff, differ, next_look,
                    f"{diff.text() if diff else 'no ratio yet'} after {n} {unit}: "
                    f"the next look at {next_look}")


def one_sided(seen: tuple[int, ...], alpha: float,
              table: dict[tuple[int, ...], dict[float, float]] | None = None) -> float:
    """Each look's one-sided level for the looks `seen`, such that a true null is rejected
    at any of them at most `alpha` of the time: calibrated where every look of `seen` is a
    look of a schedule in `table` (CALIBRATED unless given; fewer looks reject no more often
    at the same level), Bonferroni's alpha / L otherwise, whichever is larger (each holds on
    its own)."""
    table = CALIBRATED if table is None else table
    return max([alpha / len(seen)] + [calibrated[alpha] for full, calibrated in table.items()
                                      if alpha in calibrated and set(seen) <= set(full)])


def levels(seen: tuple[int, ...], alpha: float = ALPHA) -> tuple[float, float]:
    """The two intervals' levels at each look of `seen`: (faster or slower: alpha / 2 a
    side, the same within the margin: alpha at each margin)."""
    return 1 - 2 * one_sided(seen, alpha / 2), 1 - 2 * one_sided(seen, alpha)


def null_statistics(seen: tuple[int, ...], trials: int, seed: int = 1
                    ) -> list[tuple[int, ...]]:
    """Simulated studies where the null holds (log ratios symmetric about the value
    tested): each one's signed-rank statistic T- (the sum of the ranks of |x| of its
    negative values) among its first n values, at each look n. The law does not depend on
    the noise: the ranks of |x| are a random order and the signs fair coins."""
    rng = random.Random(seed)
    out = []
    for _ in range(trials):
        size = [rng.random() for _ in range(seen[-1])]
        negative = [rng.random() < 0.5 for _ in range(seen[-1])]
        row = []
        for n in seen:
            order = sorted(range(n), key=size.__getitem__)
            row.append(sum(rank for rank, i in enumerate(order, 1) if negative[i]))
        out.append(tuple(row))
    return out


def family_error(drawn: list[tuple[int, ...]], seen: tuple[int, ...], level: float) -> float:
    """How often the one-sided signed-rank test at `level` rejects at any look, over studies
    drawn by null_statistics (the interval's low end is above the value tested exactly
    when T- is under the interval's cut k)."""
    cuts = [stats._rank_cut(n, 1 - 2 * level)[0] for n in seen]
    return sum(any(t < k for t, k in zip(row, cuts)) for row in drawn) / len(drawn)


def null_spreads(seen: tuple[int, ...], trials: int, seed: int = 1
                 ) -> list[tuple[float, ...]]:
    """Simulated seed sweeps whose accuracies are normal with sd 1 (the margin): each one's
    (n - 1) s^2 among its first n seeds, at each look n (chi-square with n - 1 degrees of
    freedom at each, and nested)."""
    rng = random.Random(seed)
    out = []
    for _ in range(trials):
        xs = [rng.gauss(0.0, 1.0) for _ in range(seen[-1])]
        row = []
        for n in seen:
            mean = sum(xs[:n]) / n
            row.append(sum((x - mean) ** 2 for x in xs[:n]))
        out.append(tuple(row))
    return out


def spread_family_error(drawn: list[tuple[float, ...]], seen: tuple[int, ...],
                        level: float) -> float:
    """How often a sweep whose seeds' sd sits on the margin is called "under" at any look,
    or "over" at any look (the larger), with both tails of the chi-square interval at
    `level`, over sweeps drawn by null_spreads."""
    under = [stats.chi2_quantile(level, n - 1) for n in seen]
    over = [stats.chi2_quantile(1 - level, n - 1) for n in seen]
    return max(sum(any(x <= q for x, q in zip(row, under)) for row in drawn),
               sum(any(x > q for x, q in zip(row, over)) for row in drawn)) / len(drawn)


def calibrate(seen: tuple[int, ...], alpha: float, error: Callable[[float], float],
              trials: int) -> float:
    """The largest one-sided level (to 4 decimals) whose error over all the looks (`error`,
    from `trials` simulated studies: family_error or spread_family_error) is at most alpha
    less two of the simulation's standard errors."""
    target = alpha - 2 * math.sqrt(alpha * (1 - alpha) / trials)
    low, high = alpha / len(seen), alpha
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if error(mid) <= target else (low, mid)
    return math.floor(low * 1e4) / 1e4


def decide_spread(values: Iterable[float | None], margin: float = DEFAULT_SPREAD,
                  cap: int | None = None, alpha: float = ALPHA) -> Decision:
    """A deciding seed sweep's answer so far, for its seeds' accuracies (fractions) in seed
    order: whether the seed moves accuracy by less than `margin` (its sd over seeds), by
    more, or unknown at the cap. Looks at SEED_LOOKS seeds at a level corrected for the
    looks, as decide() does; at each, the sd's chi-square interval at 1 - 2c: "under" when
    wholly at or below the margin, "over" when wholly above (one-sided tests at c each, c
    calibrated to the looks, CALIBRATED_SPREAD, so that each wrong answer comes at most
    alpha of the time over all the looks, where the seeds' accuracies are normal;
    spread_error_rate checks it)."""
    xs = [v for v in values if v is not None and math.isfinite(v)]
    seen = looks(cap, SEED_LOOKS)
    n = len(xs)
    level = spread_level(seen, alpha)
    at, next_look = _where(seen, n)
    iv = stats.sd_interval(xs, level)
    if at is None or n != at and next_look is not None:
        return Decision("", n, iv, level, next_look,
                        f"{n} of {next_look} seeds before the next look")
    assert iv is not None                # (every look is at 2 seeds or more)
    def pts(x: float | None) -> str:
        return f"{x * 100:.2f}" if x is not None else "?"

    said = (f"seed noise {pts(iv.ratio)} points sd [{pts(iv.low)}-{pts(iv.high)}] of "
            f"accuracy ({level:.1%} interval, {n} seeds)")
    if iv.high is not None and iv.high <= margin:
        return Decision("under", n, iv, level, None, f"{said}: under {pts(margin)} points")
    if iv.low is not None and iv.low > margin:
        return Decision("over", n, iv, level, None, f"{said}: over {pts(margin)} points")
    if next_look is None:
        return Decision("unknown", n, iv, level, None, f"unknown after {n} seeds: {said}, "
                        f"neither under nor over {pts(margin)} points")
    return Decision("", n, iv, level, next_look, f"{said}: the next look at {next_look}")


def spread_level(seen: tuple[int, ...], alpha: float = ALPHA) -> float:
    """The level of a deciding sweep's sd interval at each look of `seen`."""
    return 1 - 2 * one_sided(seen, alpha, CALIBRATED_SPREAD)


def spread_error_rate(trials: int, sd: float, margin: float = DEFAULT_SPREAD,
                      cap: int | None = None, seed: int = 1) -> dict[str, float]:
    """How often each answer of decide_spread comes out for seeds whose accuracies are
    normal with standard deviation `sd`, over `trials` simulated sweeps (its own check, for
    the tests and docs/benchmarks.md)."""
    import random
    rng = random.Random(seed)
    shares, mean = _simulate(trials, lambda: 0.97 + rng.gauss(0.0, sd),
                             lambda xs: decide_spread(xs, margin, cap),
                             ("under", "over", "unknown"))
    return {**shares, "mean_seeds": mean}


def _simulate(trials: int, draw: Callable[[], Any], judge: Callable[[list[Any]], Decision],
              answers: tuple[str, ...]) -> tuple[dict[str, float], float]:
    """Simulated studies, each drawn until `judge` decides: each answer's share and the
    mean count of draws it took."""
    out = dict.fromkeys(answers, 0)
    used = 0
    for _ in range(trials):
        seen: list[Any] = []
        while True:
            seen.append(draw())
            d = judge(seen)
            if d.decided:
                out[d.verdict] += 1
                used += d.rounds
                break
    return {k: v / trials for k, v in out.items()}, used / trials


def rounds_left(decisions: Iterable[Decision]) -> int | None:
    """How many more rounds the undecided variants need before their next look."""
    waits = [d.next_look - d.rounds for d in decisions
             if not d.decided and d.next_look is not None]
    return max(waits) if waits else None


def error_rate(trials: int, rounds_noise: float, seed: int = 1, margin: float = DEFAULT_MARGIN,
               cap: int | None = None, effect: float = 1.0, heavy: float = 0.1
               ) -> dict[str, float]:
    """How often each verdict comes out for arms whose true ratio is `effect`, over
    `trials` simulated studies: each round's log ratio normal with sd `rounds_noise`, and
    one round in ten slowed by 10-30% on one side (a busy core; `heavy`). The rule's own
    check, for the tests and docs/benchmarks.md."""
    import random
    rng = random.Random(seed)

    def draw() -> tuple[float, float]:
        x = math.log(effect) + rng.gauss(0.0, rounds_noise)
        if rng.random() < heavy:
            x += rng.choice((-1, 1)) * math.log(1 + rng.uniform(0.1, 0.3))
        return 1.0, math.exp(x)

    shares, mean = _simulate(trials, draw, lambda pairs: decide(pairs, margin, cap),
                             ("faster", "slower", "the same", "unknown"))
    return {**shares, "mean_rounds": mean}
