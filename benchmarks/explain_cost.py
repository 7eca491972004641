"""What `tui-trainer explain A B` costs for each case it must explain (issue 21).

For each case two runs of one config are trained (the shipped MNIST sample, batch 64, the
knob named), then `explain` is timed from the command line: the explanation's own time
(`cost_s`, what the answer says) and the whole command (start-up included: importing torch
when a replay is needed). Compared in the same run against the reference of training run
A itself (the same steps, the same machine): replaying costs a few steps' worth of training.
Goal: a few seconds per explanation for the shipped nets at fingerprint_every 5 to 50.

    python benchmarks/explain_cost.py [--every 5] [--model grokking] [--cases seed,threads]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASE = ["dataset=mnist-sample", "train_samples=640", "eval_samples=200", "batch_size=64",
        "log_every=2"]
CASES = {
    "identical": ([], []),
    "seed": (["seed=1"], ["seed=2"]),
    "threads": (["num_threads=1"], ["num_threads=2"]),
    "seed_workers": (["num_workers=2", "augment=numpy", "seed_workers=true"],
                     ["num_workers=2", "augment=numpy", "seed_workers=false"]),
    "amp": ([], ["amp=bf16"]),
    "channels_last": ([], ["channels_last=true"]),
    "nproc": ([], ["nproc=2"]),
    # One config, different bits (issue 35): the op this machine computes two ways.
    # planted: the test-only op of tests/plant (a sum in an order drawn from os.urandom).
    "planted": (["model=planted", "device=cpu", "deterministic=off"],
                ["model=planted", "device=cpu", "deterministic=off"]),
    # On a GPU: the residual net with deterministic and cuDNN's deterministic choice off and
    # its autotuner on (needs CUDA).
    "gpu_resnet": (["model=resnet", "device=cuda", "deterministic=off",
                    "cudnn_deterministic=false", "cudnn_benchmark=true"],
                   ["model=resnet", "device=cuda", "deterministic=off",
                    "cudnn_deterministic=false", "cudnn_benchmark=true"]),
}
PLANT = Path(__file__).resolve().parent.parent / "tests" / "plant"


def tui(*args: str, plant: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if plant:       # the planted model in this process and the ones it starts
        env.update(PYTHONPATH=os.pathsep.join(p for p in (str(PLANT), env.get("PYTHONPATH"))
                                              if p), TUI_TRAINER_WARM="0")
    return subprocess.run([sys.executable, "-m", "tui_trainer", *args], capture_output=True,
                          text=True, timeout=900, env=env)


def sets(values: list[str]) -> list[str]:
    return [x for v in values for x in ("--set", v)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--every", type=int, default=5, help="fingerprint_every of both runs")
    ap.add_argument("--model", default="grokking")
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    steps = 2 * args.every + 2
    common = [*BASE, f"model={args.model}", f"max_steps={steps}",
              f"fingerprint_every={args.every}"]
    print(f"{args.model}, fingerprints every {args.every} steps, {steps} steps a run")
    print(f"{'case':<14} {'verdict':<16} {'step':>5} {'cost_s':>7} {'command_s':>10} "
          f"{'train A s':>10}")
    for name in args.cases.split(","):
        a, b = CASES[name]
        plant = name == "planted"
        with tempfile.TemporaryDirectory() as tmp:
            session = str(Path(tmp) / "s")
            t0 = time.perf_counter()
            r = tui("run", "--session", session, *sets([*common, *a]), plant=plant)
            train_s = time.perf_counter() - t0
            r2 = tui("run", "--session", session, *sets([*common, *b]), plant=plant)
            if r.returncode or r2.returncode:
                print(f"{name:<14} training failed: {(r.stderr or r2.stderr)[-300:]}")
                continue
            t0 = time.perf_counter()
            e = tui("explain", "1", "2", "--session", session, "--json", plant=plant)
            command_s = time.perf_counter() - t0
            if e.returncode not in (0, 3):
                print(f"{name:<14} explain failed: {e.stderr[-300:]}")
                continue
            result = json.loads(e.stdout)
            cost = result.get("cost_s")
            step = result.get("step", (result.get("hunt") or {}).get("step", "-"))
            print(f"{name:<14} {result['verdict']:<16} {str(step):>5} "
                  f"{cost if cost is not None else float('nan'):>7.2f} {command_s:>10.2f} "
                  f"{train_s:>10.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
