"""What glibc's malloc costs a CPU step, and what malloc = keep saves (the knob, in
core/settings/config.py; applied by engine/knobs.py's set_malloc), per model, in one run.

    python benchmarks/malloc_cost.py [--models grokking,fast,examples,resnet] [--rounds 2]
                                     [--steps 20] [--set KEY=VALUE ...]

Each measurement is a fresh process that builds the run as a run does (Trainer.setup: the
knob applied there), trains 5 steps, then times --steps more: wall ms a step, the kernel's
CPU ms a step (sys: faulting pages in, zeroing them), and minor page faults a step. The two
values take turns, process by process, --rounds times each, so both see the same machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from tui_trainer.core.settings import config, hardware

CHILD = r'''
import json, resource, sys, time
from tui_trainer import pricing
from tui_trainer.core.settings import config
from tui_trainer.engine.train import Trainer
values = json.loads(sys.argv[1])
t = Trainer(pricing.arm_config(config.from_dict(values)))
t.setup()
t.attach(None, 0, None)
t.model.train()
batches = t.steps()
for _ in range(5):
    t.step(next(batches))
n = int(sys.argv[2])
r0, w = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
for _ in range(n):
    t.step(next(batches))
wall, r1 = time.perf_counter() - w, resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"ms": wall / n * 1000, "sys_ms": (r1.ru_stime - r0.ru_stime) / n * 1000,
                  "faults": (r1.ru_minflt - r0.ru_minflt) / n, "malloc": t.settings["malloc"]}))
'''


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="grokking,fast,examples,resnet")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    sets = config.parse_overrides(args.set)
    print(f"machine: {hardware.this_cpu().describe()}")
    print("| model | malloc | ms a step | sys ms a step | faults a step | keep's speed |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for model in args.models.split(","):
        seen: dict[str, list[dict]] = {"system": [], "keep": []}
        for _ in range(args.rounds):
            for value in seen:
                values = {"dataset": "mnist-sample", "device": "cpu", **sets,
                          "model": model, "malloc": value}
                p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(values),
                                    str(args.steps)], capture_output=True, text=True,
                                   timeout=600)
                if p.returncode:
                    raise SystemExit(p.stderr[-2000:])
                seen[value].append(json.loads(p.stdout.strip().splitlines()[-1]))
        ms = {v: statistics.median(r["ms"] for r in rows) for v, rows in seen.items()}
        for value, rows in seen.items():
            print(f"| {model} | {value} ({rows[0]['malloc']}) | {ms[value]:.1f} | "
                  f"{statistics.median(r['sys_ms'] for r in rows):.1f} | "
                  f"{statistics.median(r['faults'] for r in rows):.0f} | "
                  + (f"{ms['system'] / ms['keep']:.2f}x |" if value == "keep" else "|"))


if __name__ == "__main__":
    main()
