"""From Start to the first logged step: a run forked by the warm launcher against one
started cold, side by side in one session, and whether they train the same bits.

Start is what the dashboard's F2 does (core.supervisor.Supervisor.start: create the run,
launch its process); the first step is the moment its first step row is in the session
store, where the dashboard reads it. Cold and warm launches alternate (cold, warm, warm,
cold, ...) so that neither always goes first. Every run trains the same config (seed 1), so
all their fingerprints must be equal. Goal: warm under 1 s on this machine.

    python benchmarks/first_step.py [--repeats 5] [--steps 20]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from tui_trainer.core import config
from tui_trainer.core.store import SessionStore
from tui_trainer.core.supervisor import Supervisor, WarmLauncher


def first_step_s(session: Path, sup: Supervisor, cfg: dict) -> tuple[int, float, float]:
    t0 = time.time()
    run_id = sup.start(cfg)
    db = sqlite3.connect(session / "session.sqlite")
    try:
        while True:
            row = db.execute("SELECT min(t) FROM steps WHERE run_id = ?", (run_id,)).fetchone()
            if row[0] is not None:
                first = row[0] - t0
                break
            time.sleep(0.005)
        while db.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()[0] \
                in ("created", "running"):
            time.sleep(0.05)
        whole = time.time() - t0
    finally:
        db.close()
    return run_id, first, whole


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    cfg = config.DEFAULTS.replace(dataset="mnist-sample", max_steps=args.steps, log_every=1,
                                  fingerprint_every=5).to_dict()
    warm = WarmLauncher()
    t0 = time.time()
    warm.start()
    if not warm.wait_ready(120):
        raise SystemExit("the warm launcher did not come up")
    print(f"warm launcher ready after {time.time() - t0:.2f} s (its one-time import cost)")
    results: dict[str, list[tuple[float, float]]] = {"cold": [], "warm": []}
    ids: list[int] = []
    with tempfile.TemporaryDirectory() as tmp:
        session = Path(tmp)
        with SessionStore(session) as store:
            cold, hot = Supervisor(store), Supervisor(store, warm)
            for i in range(args.repeats):
                order = ("cold", "warm") if i % 2 == 0 else ("warm", "cold")
                for how in order:
                    run_id, first, whole = first_step_s(session, cold if how == "cold" else hot,
                                                        cfg)
                    ids.append(run_id)
                    results[how].append((first, whole))
                    print(f"{how}: run {run_id}: first step after {first:.2f} s, "
                          f"{args.steps}-step run done after {whole:.2f} s", flush=True)
            prints = [tuple(r["sha256"] for r in store.fingerprints(i)) for i in ids]
    warm.close()
    print()
    for how in ("cold", "warm"):
        firsts = [f for f, _ in results[how]]
        wholes = [w for _, w in results[how]]
        print(f"{how}: first step median {statistics.median(firsts):.2f} s "
              f"(min {min(firsts):.2f}, max {max(firsts):.2f}); whole run median "
              f"{statistics.median(wholes):.2f} s")
    ratio = statistics.median(f for f, _ in results["cold"]) / \
        statistics.median(f for f, _ in results["warm"])
    print(f"reference: cold start; warm is {ratio:.1f}x sooner to the first step")
    same = len(set(prints)) == 1 and len(prints[0]) > 1
    print(f"all {len(ids)} runs bit-identical (every fingerprint): {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
