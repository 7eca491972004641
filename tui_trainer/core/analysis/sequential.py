"""When an A/B study has seen enough: a three-way answer (faster, slower, the same within a
margin) as soon as the rounds support one, "unknown" at a cap, and an error rate kept at
its level however often the study looks.

A study that decides (`ab --decide`) trains rounds as usual (every arm once a round,
interleaved, round r with seed + r) and looks at its paired ratios only at fixed round
counts, LOOKS: 8, 10, 12, 15 and 20 (the cap). At each look every variant's samples/s is
judged with the rank-based interval of core.analysis.stats (Hodges-Lehmann with the
signed-rank interval) at a level corrected for the looks (Bonferroni: the error rate
split evenly over them, alpha / 5 at each):

- **faster / slower** when the corrected (1 - alpha/L) interval lies wholly above or below 1:
  the chance that any of the L looks says so of two equal arms is at most L x alpha/L =
  alpha, whatever the looks' correlation (the union bound), and the signed-rank interval
  holds its level on heavy-tailed noise;
- **the same within ±margin** when the (1 - 2 alpha/L) interval lies wholly inside
  [1/(1+margin), 1+margin]: two one-sided tests at alpha/L each (TOST), so a price of more
  than the margin is called "the same" at most alpha of the time over all looks;
- **unknown** at the cap when neither holds (the noise was too wide for the margin, or the
  price sits on the margin): more rounds or a quieter machine would tell.

A round counts only where both arms finished. Rounds that shared the CPU with another
process are re-run as in every study (runner's rerun_loaded); a verdict reached with loaded
rounds says so. Pinpoint's (Chromium) three answers and tachometer's stop-when-clear rule,
with the error rate of a fixed design (docs/benchmarks.md measures it over A/A studies).

Core layer: standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from . import stats

LOOKS = (8, 10, 12, 15, 20)      # the rounds at which a deciding study looks; the last: its cap
DEFAULT_MARGIN = 0.05            # "the same" means within ±5%
ALPHA = 0.05                     # the error rate over all looks, of each kind


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


def looks(cap: int | None = None) -> tuple[int, ...]:
    """The looks of a study capped at `cap` rounds (the cap is always a look)."""
    if cap is None:
        return LOOKS
    return tuple(n for n in LOOKS if n < cap) + (cap,)


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
    each = alpha / len(seen)
    at = max((x for x in seen if x <= n), default=None)
    next_look = next((x for x in seen if x > n), None)
    if at is None or n != at and next_look is not None:
        # between looks: nothing is judged (an answer here would be one more look)
        iv = stats.ratio_interval(pairs, 1 - each)
        return Decision("", n, iv, 1 - each, next_look,
                        f"{n} of {next_look} {unit} before the next look")
    diff = stats.ratio_interval(pairs, 1 - each)
    same = stats.ratio_interval(pairs, 1 - 2 * each)
    hi_margin, lo_margin = 1 + margin, 1 / (1 + margin)
    if diff is not None and diff.low is not None and diff.low > 1 + noise:
        return Decision(up, n, diff, 1 - each, None,
                        f"{diff.text()} {up} ({diff.level:.1%} interval, {n} {unit})")
    if diff is not None and diff.high is not None and diff.high < 1 / (1 + noise):
        return Decision(down, n, diff, 1 - each, None,
                        f"{diff.text()} {down} ({diff.level:.1%} interval, {n} {unit})")
    if same is not None and same.low is not None and same.high is not None and \
            same.low >= lo_margin and same.high <= hi_margin:
        return Decision("the same", n, same, 1 - 2 * each, None,
                        f"{same.text()} the same within ±{margin:.0%} ({same.level:.1%} "
                        f"interval, {n} {unit})")
    if next_look is None:
        iv = same or diff
        clear = f"1 ± {noise:.0%}" if noise else "1"
        return Decision("unknown", n, iv, 1 - 2 * each, None,
                        f"unknown after {n} {unit}: {iv.text() if iv else 'no ratio'} is "
                        f"neither clear of {clear} nor within ±{margin:.0%}")
    return Decision("", n, diff, 1 - each, next_look,
                    f"{diff.text() if diff else 'no ratio yet'} after {n} {unit}: "
                    f"the next look at {next_look}")


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
    out = {"faster": 0, "slower": 0, "the same": 0, "unknown": 0}
    rounds = 0
    for _ in range(trials):
        pairs: list[tuple[float, float]] = []
        while True:
            x = math.log(effect) + rng.gauss(0.0, rounds_noise)
            if rng.random() < heavy:
                x += rng.choice((-1, 1)) * math.log(1 + rng.uniform(0.1, 0.3))
            pairs.append((1.0, math.exp(x)))
            d = decide(pairs, margin, cap)
            if d.decided:
                out[d.verdict] += 1
                rounds += d.rounds
                break
    return {**{k: v / trials for k, v in out.items()}, "mean_rounds": rounds / trials}
