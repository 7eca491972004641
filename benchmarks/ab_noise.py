"""How far from 1.00 must an A/B ratio be to mean something? And does running first cost?

Runs two A/B studies whose variant cannot change the training speed (eval_batch_size only
changes evaluation, which the samples/s figure leaves out), once in each order:

    study 1: base eval_batch_size=1000, variant 500
    study 2: base eval_batch_size=500,  variant 1000

Their samples/s ratios should both be 1.00. The geometric mean of the two ratios is the
order effect (above 1: the run that trains second is faster whatever its config); the
spread of the ratios around 1 is the noise floor of one A/B comparison on this machine.

    .venv/bin/python benchmarks/ab_noise.py [--steps 300] [--repeats 2]
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
         "--steps", str(steps)], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
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
