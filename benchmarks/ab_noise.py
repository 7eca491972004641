"""How far from 1.00 must an A/B ratio be to mean something? And does running first cost?

Runs two A/B studies whose variant cannot change the training speed (eval_batch_size only
changes evaluation, which the samples/s figure leaves out), once in each order:

    study 1: base eval_batch_size=1000, variant 500
    study 2: base eval_batch_size=500,  variant 1000

Their samples/s ratios should both be 1.00. The geometric mean of the two ratios is the
order effect (above 1: the run that trains second is faster whatever its config); the
spread of the ratios around 1 is the noise floor of one A/B comparison on this machine.

    .venv/bin/python benchmarks/ab_noise.py [--steps 300] [--repeats 2]

With --rounds N it instead runs one study the way `ab --repeats N` does (the arms
interleaved, round r with seed + r) and reports what the rounds give: each round's ratio, the
spread of their logs (the noise of one paired comparison, sd), the interval and verdict (must
be "within noise"), and from that sd the smallest speed effect the default number of rounds
finds with 90% probability at the 95% level: the figure that decides the default.

    .venv/bin/python benchmarks/ab_noise.py --rounds 8 [--steps 200]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile


def study(session: str, base: int, variant: int, steps: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "tui_trainer", "ab", "--session", session, "--json",
         "--set", f"eval_batch_size={base}", "--vary", f"eval_batch_size={variant}",
         "--steps", str(steps), "--repeats", "1"], check=True, capture_output=True,
        text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


VARY = "eval_batch_size=500"


def rounds(n: int, steps: int) -> None:
    from statistics import NormalDist

    from tui_trainer.core.analysis import stats
    from tui_trainer.core.analysis.study import DEFAULT_REPEATS
    with tempfile.TemporaryDirectory() as session:
        out = subprocess.run(
            [sys.executable, "-m", "tui_trainer", "ab", "--session", session, "--json",
             "--set", "eval_batch_size=1000", "--vary", VARY,
             "--steps", str(steps), "--repeats", str(n)],
            check=True, capture_output=True, text=True).stdout
        study = json.loads(out.strip().splitlines()[-1])
        base, variant = study["rows"]
        from tui_trainer.core.analysis.figures import run_figures
        from tui_trainer.core.session.store import SessionStore
        with SessionStore(session, create=False, readonly=True) as store:
            speed = {r: run_figures(store, r)["samples_per_s"]
                     for r in base["runs"] + variant["runs"]}
    logs = []
    for i, (b, v) in enumerate(zip(base["runs"], variant["runs"], strict=True)):
        r = speed[v] / speed[b]
        logs.append(math.log(r))
        print(f"round {i + 1}: base {speed[b]:,.0f} samples/s, variant {speed[v]:,.0f}, "
              f"ratio {r:.3f}", flush=True)
    sd = stats.mean_sd(logs)[1] or 0.0
    iv = variant["intervals"]["samples_per_s"]
    print("reference: every ratio is 1.000 (the variant cannot change training speed)")
    print(f"{n} rounds: ratio {iv['ratio']:.3f} [{iv['low']:.3f}-{iv['high']:.3f}] (95%), "
          f"verdict: {variant['verdicts']['samples_per_s']}")
    print(f"noise of one paired comparison: sd of log ratio {sd:.4f}")
    z = NormalDist().inv_cdf(0.9)
    for k in sorted({3, DEFAULT_REPEATS, 8}):
        t = stats.t_quantile(0.975, k - 1)
        effect = math.exp((t + z) * sd / math.sqrt(k))
        print(f"{k} rounds: a speed effect of {100 * (effect - 1):.1f}% or more is found "
              "(interval clear of 1) with 90% probability")
    print(f"rounds needed for a 15% effect at 90% power: {stats.pairs_needed(sd, 1.15)} "
          f"(default: {DEFAULT_REPEATS})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=0)
    args = ap.parse_args()
    if args.rounds:
        rounds(args.rounds, args.steps)
        return
    ratios = []
    with tempfile.TemporaryDirectory() as session:
        for i in range(args.repeats):
            for base, variant in ((1000, 500), (500, 1000)):
                rows = study(session, base, variant, args.steps)["rows"]
                r = rows[1]["ratios"]["samples_per_s"]
                ratios.append(r)
                print(f"repeat {i + 1}: base eval_batch_size={base}: "
                      f"{rows[0]['samples_per_s']:,.0f} samples/s, variant {variant}: "
                      f"{rows[1]['samples_per_s']:,.0f} samples/s, ratio {r:.3f}", flush=True)
    order = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    spread = max(abs(r - 1) for r in ratios)
    print("reference: every ratio is 1.000 (the variant cannot change training speed)")
    print(f"order effect (geometric mean of the ratios): {order:.3f}")
    print(f"noise floor (largest |ratio - 1| seen): {spread:.3f}")


if __name__ == "__main__":
    main()
