"""Data-parallel runs (torchrun, DDP) against one process: determinism, speed, start-up.

Three measurements, each against its reference in the same run:

1. Determinism: the same nproc = 2 config twice (identical or not), and nproc = 1 against
   nproc = 2 at the same global batch: the first differing parameter hash and the settings
   the verdict names (core.analysis.verdicts, as `repro` and the Divergence tab say it).
2. Speed: an A/B study `--vary nproc=1,2` (samples/s of training, summed over the ranks,
   each as a ratio to nproc = 1), `--repeats` times.
3. Start-up: wall time from the command to the first recorded step, and in all, for a
   20-step run with nproc = 1 and nproc = 2.

    .venv/bin/python benchmarks/parallel.py [--steps 300] [--repeats 2] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tui_trainer.core.analysis.verdicts import verdict
from tui_trainer.core.session.store import SessionStore

BASE = ["dataset=mnist-sample", "log_every=10", "fingerprint_every=10", "eval_every=0"]


def tt(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "tui_trainer", *args, "--json"],
                         capture_output=True, text=True)
    if out.returncode not in (0, 3):
        raise SystemExit(f"tui-trainer {' '.join(args)} failed ({out.returncode}):\n"
                         f"{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def sets(pairs: list[str]) -> list[str]:
    return [a for p in pairs for a in ("--set", p)]


def startup(session: Path, nproc: int, extra: list[str]) -> tuple[float, float]:
    """(seconds to the first step row, seconds in all) of a 20-step run."""
    db = session / "session.sqlite"
    before = 0
    if db.exists():
        with sqlite3.connect(db) as c:
            before = c.execute("SELECT COALESCE(MAX(id), 0) FROM runs").fetchone()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "tui_trainer", "run", "--session",
                             str(session), *sets([*BASE, *extra, f"nproc={nproc}",
                                                  "max_steps=20", "log_every=1"])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = None
    while proc.poll() is None or first is None:
        if db.exists():
            try:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
                    row = c.execute("SELECT 1 FROM steps WHERE run_id > ? LIMIT 1",
                                    (before,)).fetchone()
            except sqlite3.Error:
                row = None
            if row and first is None:
                first = time.perf_counter() - t0
        if proc.poll() is not None and first is None:
            break
        time.sleep(0.02)
    proc.wait()
    return first or float("nan"), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    args = ap.parse_args()
    extra = args.sets
    with tempfile.TemporaryDirectory() as tmp:
        s = Path(tmp)
        print("== determinism (steps: 60, fingerprint every 10)")
        cfg = [*BASE, *extra, "max_steps=60"]
        r = tt("repro", "--session", str(s / "det"), *sets([*cfg, "nproc=2"]))
        print(f"nproc=2 twice: {'BIT-IDENTICAL' if r['identical'] else 'NOT identical'} "
              f"({r['fingerprints_compared']} fingerprints compared)")
        one = tt("run", "--session", str(s / "det"), *sets([*cfg, "nproc=1"]))
        with SessionStore(s / "det", create=False) as store:
            v = verdict(store, [one["run_id"], r["runs"][0]])
        print(f"nproc=1 vs nproc=2: {'identical' if v.identical else 'NOT identical'}; "
              f"first differing step {v.first_difference} (identical at "
              f"{v.last_identical})")
        for reason in v.explanations:
            print(f"  - {reason}")

        print(f"\n== speed: ab --vary nproc=1,2, {args.steps} steps, x{args.repeats}")
        ratios = []
        for i in range(args.repeats):
            study = tt("ab", "--session", str(s / "ab"), *sets([*BASE, *extra]),
                       "--vary", "nproc=2", "--steps", str(args.steps))
            rows = {row["label"]: row for row in study["rows"]}
            base, two = rows["base"], next(r for k, r in rows.items() if k != "base")
            ratio = two["samples_per_s"] / base["samples_per_s"]
            ratios.append(ratio)
            print(f"repeat {i + 1}: nproc=1 {base['samples_per_s']:,.0f} samples/s, "
                  f"nproc=2 {two['samples_per_s']:,.0f} samples/s (ratio {ratio:.2f}), "
                  f"bit-identical to base: {two.get('bit_identical')}")
        print(f"ratio nproc=2 / nproc=1: median {statistics.median(ratios):.2f}")

        print("\n== start-up (20-step run): to first step / in all")
        for nproc in (1, 2, 1, 2):
            first, total = startup(s / "start", nproc, extra)
            print(f"nproc={nproc}: {first:.2f} s to the first step, {total:.2f} s in all")


if __name__ == "__main__":
    main()
