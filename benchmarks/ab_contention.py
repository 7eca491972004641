"""Do A/B verdicts survive a noisy machine? One A/A study, quiet and beside a CPU hog.

The variant is cudnn_benchmark=on on a CPU: it cannot change anything (an A/A study), so
every speed verdict must read "within noise". Three studies of the same plan:

    quiet    nothing else running
    hog      a busy loop pinned to one core during the whole study, re-runs off: what the
             marks and the verdict say when nothing can be done about it
    hog+     the same hog during the planned rounds, then stopped: the study trains the
             marked rounds again once the machine is quiet (the default)

For each: every round's ratio and whether the round was marked, the rank-based interval
(what studies print) beside the Student-t interval of the same ratios (what they printed
before), the verdict, the contention figures of the runs.

    .venv/bin/python benchmarks/ab_contention.py [--rounds 6] [--steps 200]
        [--eval-samples 10000] [--only quiet|hog|hog+]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tui_trainer.core.processes import contention
from tui_trainer.core.analysis import stats  # noqa: E402


def hog() -> subprocess.Popen:
    code = "import os\nos.sched_setaffinity(0, {os.cpu_count() - 1})\nwhile True: pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


def finished(session: Path) -> int:
    if not (session / "session.sqlite").exists():
        return 0
    try:
        with sqlite3.connect(session / "session.sqlite") as c:
            return c.execute("SELECT COUNT(*) FROM runs WHERE status = 'finished'").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def study(session: Path, rounds: int, steps: int, eval_samples: int, extra: list[str],
          hog_until: int | None = None) -> dict:
    cmd = [sys.executable, "-m", "tui_trainer", "ab", "--session", str(session), "--json",
           "--vary", "cudnn_benchmark=on", "--steps", str(steps), "--repeats", str(rounds),
           "--set", "dataset=mnist-sample", "--set", f"eval_samples={eval_samples}", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    h = hog() if hog_until is not None else None
    try:
        while h is not None and proc.poll() is None and finished(session) < hog_until:
            time.sleep(0.2)
    finally:
        if h is not None:
            h.kill()
            h.wait()
    out, _ = proc.communicate()
    return json.loads(out)


def report(name: str, session: Path, result: dict) -> None:
    base, variant = result["rows"][0], result["rows"][1]
    with sqlite3.connect(session / "session.sqlite") as c:
        per_run = {i: json.loads(s) for i, s in c.execute("SELECT id, summary FROM runs")}
    pairs, marks = [], []
    for r, (b, v) in enumerate(zip(base["runs"], variant["runs"], strict=True)):
        sb, sv = per_run[b], per_run[v]
        pairs.append((sb["samples_per_s"], sv["samples_per_s"]))
        cb, cv = contention.read(sb.get("contention")), contention.read(sv.get("contention"))
        marks.append("*" if contention.loaded(cb) or contention.loaded(cv) else "")
        print(f"  round {r + 1}: {sv['samples_per_s'] / sb['samples_per_s']:.3f}{marks[-1]:1}  "
              f"base: {contention.text(cb)} | variant: {contention.text(cv)}")
    rank, t = stats.ratio_interval(pairs), stats.t_interval(pairs)
    print(f"  {name}: rank {rank.text()} -> {rank.verdict('faster', 'slower')}; "
          f"t {t.text()} -> {t.verdict('faster', 'slower')}; marked rounds "
          f"{marks.count('*')} of {len(marks)} (table: {len(variant['loaded_rounds'])}); "
          f"re-runs {len(result['reruns'])}; notes: {result['notes'][1:] or '-'}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--eval-samples", type=int, default=10000,
                    help="the final evaluation's size (beside a hog it is most of a run)")
    ap.add_argument("--only", choices=("quiet", "hog", "hog+"))
    args = ap.parse_args()
    runs = 2 * args.rounds
    plans = {"quiet": ([], None), "hog": (["--rerun-loaded", "0"], 10 ** 6),
             "hog+": ([], runs)}
    print(f"{os.cpu_count()} cores; A/A study cudnn_benchmark=on vs off on the CPU, "
          f"{args.rounds} rounds of {args.steps} steps; * = the round shared the CPU")
    for name, (extra, hog_until) in plans.items():
        if args.only and name != args.only:
            continue
        with tempfile.TemporaryDirectory(prefix="ttbench-") as d:
            t0 = time.monotonic()
            result = study(Path(d), args.rounds, args.steps, args.eval_samples, extra,
                           hog_until)
            print(f"{name} ({time.monotonic() - t0:.0f} s):")
            report(name, Path(d), result)


if __name__ == "__main__":
    main()
