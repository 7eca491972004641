"""What the pictures of issue 37 cost, in what a person waits for.

1. `memory`'s timeline: one step of a copy of a run under MemTracker, with the timeline
   (the memory by category noted after every operator) against MemTracker alone (the
   breakdown before issue 37), interleaved in one process, on this machine. Goal: the
   timeline adds at most a second to what `memory` (b) takes.
2. The Model tab: from g to the picture. The command (`activations RUN RUN_B`, a process
   like the one the dashboard starts) and the drawing of its answer at 80x24 and 200x50
   (core.analysis.activations.load + the tab's compose, in a thread: the screen is never blocked).

    python benchmarks/pictures_cost.py [--model examples] [--repeats 5]
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

BASE = ["dataset=mnist-sample", "train_samples=640", "eval_samples=200", "batch_size=64",
        "max_steps=6", "checkpoint_every=3", "device=cpu"]


def tt(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tui_trainer", *args], env=env,
                          capture_output=True, text=True, check=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="examples")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tt-pictures-") as tmp:
        env = {**os.environ, "TUI_TRAINER_HOME": str(Path(tmp) / "home"),
               "TUI_TRAINER_OFFLINE": "1"}
        os.environ.update(env)
        session = Path(tmp) / "s"
        for seed in (1, 2):
            sets = [x for kv in [*BASE, f"model={a.model}", f"seed={seed}"]
                    for x in ("--set", kv)]
            tt("run", "--session", str(session), *sets, env=env)
        timeline(session, a.repeats)
        model_tab(session, env, a.repeats)


def timeline(session: Path, repeats: int) -> None:
    from torch.distributed._tools.mem_tracker import MemTracker
    from tui_trainer.core.settings.config import from_dict
    from tui_trainer.core.session.store import SessionStore
    from tui_trainer.engine.probes import memory
    from tui_trainer.engine.checkpoint import load_checkpoint
    store = SessionStore(session, create=False, readonly=True)
    run = store.run(1)
    cfg = from_dict(run["config"])
    state = load_checkpoint(store.usable_checkpoints(1)[0]["path"])
    plain_tracker = memory._timeline_tracker
    times: dict[str, list[float]] = {"MemTracker alone": [], "with the timeline": []}
    points = 0
    for _ in range(repeats):
        for name in times:
            if name == "MemTracker alone":
                class Plain(MemTracker):
                    points: list = []
                    where = __import__("contextlib").nullcontext()
                    in_optimizer = stepped = False

                    def note(self, op: str) -> None:
                        pass
                memory._timeline_tracker = Plain
            else:
                memory._timeline_tracker = plain_tracker
            t0 = time.perf_counter()
            result = memory.breakdown(cfg, state)
            times[name].append(time.perf_counter() - t0)
            if name == "with the timeline":
                points = len(result["timeline"]["points"])
    memory._timeline_tracker = plain_tracker
    base = statistics.median(times["MemTracker alone"])
    print(f"memory of run 1 ({cfg.model}, batch {cfg.batch_size}, {repeats} repeats, "
          "interleaved; a copy's setup, a warm-up step and the measured step):")
    for name, ts in times.items():
        print(f"  {name:<20} median {statistics.median(ts):.3f} s "
              f"(each: {', '.join(f'{t:.3f}' for t in ts)})")
    extra = statistics.median(times["with the timeline"]) - base
    print(f"  the timeline ({points} operators) adds {extra:+.3f} s "
          f"-> {'MET' if extra <= 1.0 else 'NOT MET'} (goal: at most 1 s)")


def model_tab(session: Path, env: dict, repeats: int) -> None:
    from tui_trainer.core.analysis import activations
    from tui_trainer.ui.panels.model import ZOOM, ZOOMS, compose
    from rich.console import Console
    waits = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = tt("activations", "1", "2", "--session", str(session), "--json", env=env)
        waits.append(time.perf_counter() - t0)
    meta = json.loads(r.stdout)
    print(f"`activations 1 2` (a cold process: torch imported, both checkpoints restored, "
          f"the PNG drawn), {repeats} times: median {statistics.median(waits):.2f} s "
          f"(each: {', '.join(f'{t:.2f}' for t in waits)})")
    for width, height in ((80, 24), (200, 50)):
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            arrays = activations.load(session, meta)
            drawn = compose(meta, arrays, width - 2, ZOOMS[ZOOM], None)
            Console(width=width - 2, file=open(os.devnull, "w")).print(drawn)
            ts.append(time.perf_counter() - t0)
        print(f"  the Model tab draws it at {width}x{height} (load, compose, render; a "
              f"thread): median {1000 * statistics.median(ts):.0f} ms")


if __name__ == "__main__":
    main()
