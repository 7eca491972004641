"""How long torch's idle OpenMP threads spin before they sleep, quiet and beside a busy
program (issue 54).

torch's CPU ops run on GNU OpenMP (libgomp). Between parallel regions its idle threads spin
(GOMP_SPINCOUNT iterations, 300,000 by default) before they sleep. Beside another busy
program that spinning thread holds its core while the thread it waits for shares the other
core with that program: the run crawls. The spin count decides only how a thread waits,
never which thread computes what, so the bits are the same whatever it is
(tests/test_contention.py checks this).

Each arm is `tui-trainer run` in the foreground (the default config on mnist-sample, --steps
steps, torch's default threads) with GOMP_SPINCOUNT set to the arm's value, interleaved
--repeats times: first on a quiet machine, then beside one CPU hog in a process session of
its own (a program of another terminal), then beside one in this script's session (a
background job of the same shell). Reported: the median samples/s of each arm and its ratio
to libgomp's default (300000).

    .venv/bin/python benchmarks/omp_wait.py [--spins 300000 10000 1000 0] [--steps 150]
        [--repeats 4] [--hog-repeats 2]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT = "300000"      # libgomp's own spin count


def one(session: Path, steps: int, spin: str) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY",)}
    env["GOMP_SPINCOUNT"] = spin
    out = subprocess.run(
        [sys.executable, "-m", "tui_trainer", "run", "--session", str(session), "--set",
         "dataset=mnist-sample", "--set", f"max_steps={steps}", "--set", "eval_samples=1000",
         "--set", "eval_every=0"], env=env, capture_output=True, text=True, check=True).stdout
    return float(re.findall(r"([\d,]+) samples/s \(training\)", out)[-1].replace(",", ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spins", nargs="+", default=[DEFAULT, "10000", "1000", "0"])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--hog-repeats", type=int, default=2)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="tui-trainer-omp-"))
    os.environ["TUI_TRAINER_HOME"] = str(home)
    results: dict[str, dict[str, list[float]]] = {}
    try:
        for where, repeats in (("quiet", args.repeats), ("hog, own session", args.hog_repeats),
                               ("hog, same session", args.hog_repeats)):
            hog = None if where == "quiet" else subprocess.Popen(
                [sys.executable, "-c", "while True: pass"],
                start_new_session=where == "hog, own session")
            time.sleep(1)
            got = results[where] = {s: [] for s in args.spins}
            try:
                for _ in range(repeats):
                    for spin in args.spins:
                        got[spin].append(one(home / "session", args.steps, spin))
                        print(f"{where:18} GOMP_SPINCOUNT={spin:>7}: {got[spin][-1]:7.0f} "
                              "samples/s", flush=True)
            finally:
                if hog is not None:
                    hog.kill()
                    hog.wait()
    finally:
        import shutil
        shutil.rmtree(home, ignore_errors=True)
    print(f"\nsamples/s, median (min-max) of the repeats, {args.steps} steps, "
          f"{os.cpu_count()} cores")
    for where, got in results.items():
        base = statistics.median(got[args.spins[0]])
        for spin, values in got.items():
            med = statistics.median(values)
            print(f"{where:18} {spin:>7}  {med:7.0f}  ({min(values):.0f}-{max(values):.0f})  "
                  f"{med / base:.2f}x {args.spins[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
