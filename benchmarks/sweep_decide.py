"""A seed sweep that decides (`sweep --decide`, issue 67 point 5): how often its rule is
wrong, and how long a person waits for its answer, against fixed sweeps in the same run.

    python benchmarks/sweep_decide.py [--steps 100] [--trials 2000] [--margin 0.5] [--hog]

First the rule alone (core/analysis/sequential.py, decide_spread): simulated sweeps whose
seeds' accuracies are normal with a known sd, each ended as the rule ends it; how often it
says "under", "over" or "unknown", and after how many seeds. At the margin itself both
"under" and "over" are wrong.

Then real sweeps on this machine, the shipped sample's default config for `--steps`, each
timed from the command to its last line: `sweep --decide MARGIN` against the fixed
`sweep --seeds 5` (the default) and `sweep --seeds 20` (the most the deciding sweep takes).
The 20 seeds' accuracies are also judged at the deciding sweep's looks, to show where it
would have stopped on them. `--hog` runs them all beside one CPU hog (a busy loop).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tui_trainer.core.analysis import sequential
from tui_trainer.core.processes import contention
from tui_trainer.core.settings import hardware


def sweep(session: Path, steps: int, *more: str) -> dict:
    """One `sweep`, timed from the command to its last line, its JSON and its wall time."""
    args = [sys.executable, "-m", "tui_trainer", "sweep", "--session", str(session), "--json",
            "--set", "dataset=mnist-sample", "--steps", str(steps), *more]
    before = contention.snapshot()
    t0 = time.monotonic()
    p = subprocess.run(args, capture_output=True, text=True, timeout=3600,
                       stdin=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"sweep failed ({p.returncode}): {p.stderr[-2000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["wall"] = wall
    out["load"] = contention.between(before, contention.snapshot())
    return out


def accuracies(session: Path) -> list[float]:
    from tui_trainer.core.analysis import figures
    from tui_trainer.core.session.store import SessionStore
    with SessionStore(session, create=False, readonly=True) as store:
        return [figures.run_figures(store, r["id"])["accuracy"] for r in store.runs()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--margin", type=float, default=sequential.DEFAULT_SPREAD * 100,
                    help="points of accuracy")
    ap.add_argument("--hog", action="store_true")
    ap.add_argument("--simulated-only", action="store_true")
    args = ap.parse_args()
    margin = args.margin / 100
    print(f"CPU: {hardware.this_cpu().describe()}; margin {args.margin:g} points, looks at "
          f"{', '.join(map(str, sequential.SEED_LOOKS))} seeds")
    print("\nsimulated sweeps (normal seeds), true sd -> answers, mean seeds")
    for factor in (0.25, 0.5, 0.75, 1.0, 1.5, 2.0):
        r = sequential.spread_error_rate(args.trials, margin * factor, margin, seed=11)
        print(f"  sd {margin * factor * 100:.3f} points ({factor:g}x the margin): under "
              f"{r['under']:.1%}, over {r['over']:.1%}, unknown {r['unknown']:.1%}; "
              f"{r['mean_seeds']:.1f} seeds")
    if args.simulated_only:
        return
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.hog else None
    try:
        print(f"\nreal sweeps, {args.steps} steps each" + (" beside one CPU hog" if hog else ""))
        with tempfile.TemporaryDirectory(prefix="sweep-decide-") as tmp:
            for name, more in (("sweep --decide", ["--decide", f"{args.margin:g}"]),
                               ("sweep --seeds 5", ["--seeds", "5"]),
                               ("sweep --seeds 20", ["--seeds", "20"])):
                session = Path(tmp) / name.replace(" ", "_")
                out = sweep(session, args.steps, *more)
                row = out["rows"][0]
                d = row.get("decision") or {}
                said = f"{d['verdict']}: {d['words']}" if d else \
                    f"accuracy {row['accuracy'] * 100:.2f} ±{row['spread']['accuracy'] * 100:.2f}"
                print(f"  {name:<18} {out['repeats']:>2} seeds {out['wall']:6.1f} s  {said}"
                      f"  [{contention.text(out['load'])}]")
                if name == "sweep --seeds 20":
                    accs = accuracies(session)
                    for n in sequential.SEED_LOOKS:
                        judged = sequential.decide_spread(accs[:n], margin)
                        if judged.decided:
                            print(f"  (its 20 seeds judged at the looks: {judged.verdict} at "
                                  f"{n} seeds: {judged.words})")
                            break
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()


if __name__ == "__main__":
    main()
