"""Why threads and workers are priced as whole runs (tui_trainer/pricing.py,
CONCURRENCY_KNOBS): a knob's price in turns taken in slices against its price in whole runs,
in one run on one machine.

    python benchmarks/turns_bias.py [--knobs num_threads=1,num_workers=2] [--windows 3]
                                    [--set KEY=VALUE ...]

For each knob: `--windows` prices in windows (pricing.price, as `ab --decide` priced every
knob paid in steps before: two new processes a pair, slices taken in turns), then one
`ab --decide --whole-runs` (every arm a whole run, one at a time), then the step of a fresh
process of each arm timed alone (200 steps after 5, in turns, 4 each). Then, for the first
knob, each arm's steps by their place in a turn of 4 one-step slices, against the same
arm's steps run on without a turn between them: where the arm with more threads starts a
turn slower, the windows read its price nearer 1 than a run pays it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from tui_trainer import pricing
from tui_trainer.core.processes import supervisor
from tui_trainer.core.settings import config, hardware
from tui_trainer.launcher.client import WarmLauncher

# the ready determinism study's base (its loader reads batches in the loop: 4 ms of a
# 9 ms step here), where the gap between the two showed first
BASE = {"seed": 1, "deterministic": "on", "cudnn_deterministic": True, "loader": "torchvision",
        "augment": "torch", "num_workers": 0, "batch_size": 64, "model": "grokking",
        "dataset": "mnist-sample", "device": "cpu"}

STEP = r'''
import json, sys, time
from tui_trainer import pricing
from tui_trainer.core.settings import config
from tui_trainer.engine.train import Trainer
t = Trainer(pricing.arm_config(config.from_dict(json.loads(sys.argv[1]))))
t.setup(); t.attach(None, 0, None); t.model.train()
batches = t.steps()
for _ in range(5):
    t.step(next(batches))
w = time.perf_counter()
for _ in range(200):
    t.step(next(batches))
print(json.dumps({"ms": (time.perf_counter() - w) / 200 * 1000}))
del batches     # (its DataLoader's workers shut down now: at exit they left /tmp/pymp-*)
'''


def whole_runs(base: dict, key: str, value: str) -> tuple[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        args = [sys.executable, "-m", "tui_trainer", "ab", "--session", tmp, "--json",
                "--vary", f"{key}={value}", "--decide", "--whole-runs"]
        for k, v in base.items():
            args += ["--set", f"{k}={json.dumps(v) if isinstance(v, bool) else v}"]
        t0 = time.monotonic()
        p = subprocess.run(args, capture_output=True, text=True, timeout=1800,
                           stdin=subprocess.DEVNULL)
        if p.returncode not in (0, 3):
            raise SystemExit(p.stderr[-2000:])
        row = json.loads(p.stdout.strip().splitlines()[-1])["rows"][1]
        iv = row["intervals"]["samples_per_s"]
        return (f"{iv['ratio']:.2f}x [{iv['low']:.2f}-{iv['high']:.2f}] "
                f"{row['verdicts']['samples_per_s']}"), time.monotonic() - t0


def fresh(base: dict, variant: dict) -> tuple[float, float]:
    ms: dict[str, list[float]] = {"base": [], "variant": []}
    for _ in range(4):
        for name, values in (("base", base), ("variant", variant)):
            p = subprocess.run([sys.executable, "-c", STEP, json.dumps(values)],
                               capture_output=True, text=True, timeout=600)
            if p.returncode:
                raise SystemExit(p.stderr[-2000:])
            ms[name].append(json.loads(p.stdout.strip().splitlines()[-1])["ms"])
    return statistics.median(ms["base"]), statistics.median(ms["variant"])


def places(base: dict, variant: dict, warm: WarmLauncher) -> dict[str, list[float]]:
    """Each arm's step ms by its place in a turn of 4 one-step slices (then "on": the same
    arm's steps run on, one slice after another, no turn between)."""
    seen: dict[str, list[list[float]]] = {"base": [[] for _ in range(5)],
                                          "variant": [[] for _ in range(5)]}
    for _ in range(4):
        arms = pricing._ready_pair(config.from_dict(base), config.from_dict(variant), warm)
        try:
            for arm in arms:
                arm.warm_up()
                arm.warm_up()
            for turn in range(30):
                for arm in arms if turn % 2 == 0 else arms[::-1]:
                    for k in range(4):
                        seen[arm.label][k].append(arm.ask(1)["s"] * 1000)
            for arm in arms:
                for k in range(40):
                    if k >= 10:
                        seen[arm.label][4].append(arm.ask(1)["s"] * 1000)
                    else:
                        arm.ask(1)
        finally:
            for arm in arms:
                arm.close()
    return {label: [statistics.median(v) for v in by] for label, by in seen.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--knobs", default="num_threads=1,num_workers=2")
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    os.environ.update(supervisor.thread_wait_env())      # as every process the tool starts
    base = {**BASE, **config.parse_overrides(args.set)}
    print(f"machine: {hardware.this_cpu().describe()}")
    print("| knob | windows (each a price) | whole runs (`--decide --whole-runs`) | "
          "fresh processes, ms a step (base, variant: ratio) |")
    print("| --- | --- | --- | --- |", flush=True)
    warm = WarmLauncher.shared()
    try:
        warm.wait_ready(timeout=120)
        knobs = [kv.split("=", 1) for kv in args.knobs.split(",")]
        for key, value in knobs:
            variant = {**base, **config.parse_overrides([f"{key}={value}"])}
            words = []
            for _ in range(args.windows):
                p = pricing.price(config.from_dict(base), config.from_dict(variant), warm=warm)
                words.append(f"{p.decision.interval.ratio:.2f}x {p.decision.verdict} "
                             f"({len(p.pairs)} pairs)")
            runs, seconds = whole_runs(base, key, value)
            b, v = fresh(base, variant)
            print(f"| {key}={value} | {'; '.join(words)} | {runs} in {seconds:.0f} s | "
                  f"{b:.2f}, {v:.2f}: {b / v:.2f}x |", flush=True)
        key, value = knobs[0]
        by = places(base, {**base, **config.parse_overrides([f"{key}={value}"])}, warm)
        print(f"\n{key}={value}, ms a step by its place in a turn of 4 one-step slices, "
              "and run on:")
        for label, ms in by.items():
            print(f"  {label}: " + " ".join(f"{x:.2f}" for x in ms[:4])
                  + f"; run on {ms[4]:.2f}")
    finally:
        warm.close()


if __name__ == "__main__":
    main()
