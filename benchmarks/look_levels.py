"""The levels a deciding study judges at, calibrated to its looks (issue 67): how often a
study of equal arms would be called different at any of its looks, at Bonferroni's level and
at the calibrated one (core/analysis/sequential.py, CALIBRATED), and the calibration done
again; then the same for a deciding seed sweep's sd (CALIBRATED_SPREAD: how often a sweep
whose seeds' sd sits on the margin is called under, or over, at any look).

    python benchmarks/look_levels.py [--trials 200000] [--seed 1]

The statistics are drawn exactly from their joint law under the null (the ranks' whatever
the noise, so long as it is symmetric; the sweep's where the seeds' accuracies are normal),
so no machine is measured here: what this prints holds on
every CPU. Then each schedule's studies are bootstrapped from recorded A/A window pairs
(`--pairs FILE`, one JSON list of log ratios a line, as `benchmarks/ab_decide.py --windows
--aa N --record FILE` writes them) to show what the calibration saves in pairs and seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time

from tui_trainer.core.analysis import sequential


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pairs", help="recorded A/A pairs' log ratios (JSON lists, a line each)")
    ap.add_argument("--pair-s", type=float, default=0.63, help="seconds a pair, for the bootstrap")
    ap.add_argument("--start-s", type=float, default=3.0, help="seconds before the first pair")
    args = ap.parse_args()
    print(f"{args.trials} simulated studies a schedule (seed {args.seed})\n")
    print("| looks | error rate | Bonferroni's level: family error | calibrated "
          "level: family error | calibrated again |")
    print("| --- | --- | --- | --- | --- |")
    for seen, table in sequential.CALIBRATED.items():
        t = time.monotonic()
        drawn = sequential.null_statistics(seen, args.trials, args.seed)
        for alpha, level in table.items():
            line(seen, alpha, level, lambda c: sequential.family_error(drawn, seen, c),
                 args.trials, t)
    for seen, table in sequential.CALIBRATED_SPREAD.items():
        t = time.monotonic()
        spreads = sequential.null_spreads(seen, args.trials, args.seed)
        for alpha, level in table.items():
            line(seen, alpha, level,
                 lambda c: sequential.spread_family_error(spreads, seen, c), args.trials, t,
                 " seeds (sd)")
    if args.pairs:
        bootstrap(args)
    return 0


def line(seen: tuple[int, ...], alpha: float, level: float, error, trials: int, t: float,
         what: str = "") -> None:
    bonf = alpha / len(seen)
    again = sequential.calibrate(seen, alpha, error, trials)
    print(f"| {', '.join(map(str, seen))}{what} | {alpha} | {bonf:.4f}: {error(bonf):.4f} | "
          f"{level:.4f}: {error(level):.4f} | {again:.4f} ({time.monotonic() - t:.0f} s) |")


def bootstrap(args: argparse.Namespace) -> None:
    logs = [x for line in open(args.pairs) for x in json.loads(line)]
    print(f"\nA/A studies bootstrapped from {len(logs)} recorded pairs (log sd "
          f"{statistics.stdev(logs):.4f}), {args.start_s} s + {args.pair_s} s a pair:\n")
    print("| looks | levels | the same | unknown | faster or slower | mean | past 20 s | "
          "past 22 s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    from tui_trainer import pricing
    for seen, how in (((8, 12, 16, 20, 32), "Bonferroni"), ((8, 12, 16, 20, 32), "calibrated"),
                      ((8, 12, 16, 20, 24, 32), "calibrated"), (pricing.LOOKS, "calibrated")):
        saved = dict(sequential.CALIBRATED)
        if how == "Bonferroni":
            sequential.CALIBRATED.clear()
        rng = random.Random(args.seed)
        out: dict[str, int] = {}
        seconds = []
        for _ in range(2000):
            pairs: list[tuple[float, float]] = []
            while True:
                pairs.append((1.0, math.exp(rng.choice(logs))))
                d = sequential.decide(pairs, looks_at=seen, noise=pricing.NOISE)
                if d.decided:
                    out[d.verdict] = out.get(d.verdict, 0) + 1
                    seconds.append(args.start_s + args.pair_s * len(pairs))
                    break
        sequential.CALIBRATED.update(saved)
        share = {k: v / 2000 for k, v in out.items()}
        print(f"| {', '.join(map(str, seen))} | {how} | {share.get('the same', 0):.1%} | "
              f"{share.get('unknown', 0):.1%} | "
              f"{share.get('faster', 0) + share.get('slower', 0):.1%} | "
              f"{statistics.mean(seconds):.1f} s | "
              f"{sum(s > 20 for s in seconds) / len(seconds):.1%} | "
              f"{sum(s > 22 for s in seconds) / len(seconds):.1%} |")


if __name__ == "__main__":
    raise SystemExit(main())
