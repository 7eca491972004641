"""Where a study's time goes: its runs' training, and everything around it.

Runs `tui-trainer ab --config STUDY` in a fresh session (the warm launcher, as from the
dashboard or the command line) and splits the command's wall time, run by run, from the
session's own timestamps:

- before: from the command's start to its first run's creation (imports, the launcher's
  one torch import, planning);
- start: a run's creation to its first recorded progress (fork, data, model, the device's
  start: CUDA's context on a GPU);
- train: first progress to its end (steps, evaluations, checkpoints, the summary);
- between: a run's end to the next one's creation (the study's own bookkeeping, and the
  waits for a machine with room, which it says it took);
- after: the last run's end to the command's end.

The study's cost per run is everything but `train`, over the runs. Compare it between
machines (a GPU machine against this CPU) for the same study file and arguments.

    .venv/bin/python benchmarks/study_cost.py [--config determinism] [--steps 300] [--repeats 6]
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tui_trainer.core.processes import contention  # noqa: E402
from tui_trainer.core.session.store import SessionStore  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="determinism")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="study-cost-") as tmp:
        session = Path(tmp) / "s"
        env = {**os.environ, "TUI_TRAINER_HOME": str(Path(tmp) / "home")}
        cmd = [sys.executable, "-m", "tui_trainer", "ab", "--session", str(session),
               "--config", args.config, "--steps", str(args.steps), "--repeats",
               str(args.repeats), "--json", *[x for s in args.set for x in ("--set", s)]]
        t0 = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        t1 = time.time()
        if p.returncode != 0:
            sys.exit(p.stderr[-2000:])
        result = json.loads(p.stdout.strip().splitlines()[-1])
        store = SessionStore(session, create=False, readonly=True)
        runs = sorted(store.runs(), key=lambda r: r["id"])
        start, train, between, loaded = [], [], [], 0
        for i, r in enumerate(runs):
            start.append(r["started"] - r["created"])
            train.append(r["ended"] - r["started"])
            if i + 1 < len(runs):
                between.append(runs[i + 1]["created"] - r["ended"])
            summary = r["summary"] if isinstance(r["summary"], dict) else {}
            loaded += contention.loaded(contention.read(summary.get("contention")))
        settings = runs[0]["settings"] or {}
        wall = t1 - t0
        before, after = runs[0]["created"] - t0, t1 - runs[-1]["ended"]
        print(f"{args.config}: {len(runs)} runs of {args.steps} steps ({args.repeats} rounds) "
              f"on {settings.get('device')} ({settings.get('device_name')}), "
              f"{os.cpu_count()} CPUs: the command took {wall:.1f} s")
        print("| part | total s | per run: median (min-max) s |")
        print("| --- | ---: | ---: |")
        print(f"| before the first run | {before:.1f} | |")
        for name, xs in (("start: created to first progress", start),
                         ("train: first progress to end", train),
                         ("between runs", between)):
            print(f"| {name} | {sum(xs):.1f} | {statistics.median(xs):.2f} "
                  f"({min(xs):.2f}-{max(xs):.2f}) |")
        print(f"| after the last run | {after:.1f} | |")
        cost = (wall - sum(train)) / len(runs)
        print(f"\nstudy cost per run beside its training: {cost:.2f} s "
              f"({wall - sum(train):.1f} s of {wall:.1f} s); runs marked loaded: {loaded}; "
              f"re-runs: {len(result.get('reruns', []))}; notes: {result.get('notes')}")


if __name__ == "__main__":
    main()
