"""What one tick of the dashboard's reader costs, and the first screen, as the session grows.

Builds sessions of 4 and 200 finished runs with 100 steps each, and 4 runs with 100,000
steps each, plus one live run that gets 5 new rows before each tick, and times
SessionReader.tick() (the polling thread's read) on a warm reader; then the first screen:
TrainerApp headless until its first snapshot is drawn, on an empty session and with 200 runs.

    python benchmarks/ui_tick.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tui_trainer.core import config as C
from tui_trainer.core.reader import SessionReader
from tui_trainer.core.store import SessionStore


def rows(first: int, n: int) -> list[dict]:
    return [{"step": s, "epoch": s / 100, "elapsed": s * 0.01, "loss": 1.0 / s,
             "samples_per_s": 1000.0 + s, "rss_bytes": 1e8, "data_s": 0.01,
             "compute_s": 0.1, "lr": 0.01} for s in range(first, first + n)]


def build(path: Path, runs: int, steps: int) -> SessionStore:
    w = SessionStore(path)
    for i in range(runs):
        rid = w.create_run(C.DEFAULTS.to_dict(), name=f"r{i}")
        for start in range(1, steps + 1, 10_000):
            w.add_rows(steps=rows(start, min(10_000, steps - start + 1)), run_id=rid)
        w.end_run(rid, "finished", {"elapsed_s": 1.0})
    return w


def tick_cost(path: Path, w: SessionStore, n: int = 40) -> tuple[float, float]:
    live = w.create_run(C.DEFAULTS.to_dict(), name="live")
    reader = SessionReader(SessionStore(path, readonly=True, create=False))
    t = time.perf_counter()
    reader.tick(watched=(live,))
    first = time.perf_counter() - t
    times = []
    for i in range(n):
        w.add_rows(steps=rows(1 + 5 * i, 5), run_id=live)
        t = time.perf_counter()
        reader.tick(watched=(live,))
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000, first * 1000


async def first_screen(path: Path) -> float:
    from tui_trainer.ui.app import TrainerApp
    t = time.perf_counter()
    app = TrainerApp(path, poll=False)
    async with app.run_test(size=(180, 50)):
        while app.snapshot is None:
            await asyncio.sleep(0.005)
        return time.perf_counter() - t


def main() -> int:
    print(f"{'session':<30} {'tick median ms':>15} {'first tick ms':>14}")
    for runs, steps in ((4, 100), (200, 100), (4, 100_000)):
        with tempfile.TemporaryDirectory() as tmp:
            w = build(Path(tmp), runs, steps)
            med, first = tick_cost(Path(tmp), w)
            print(f"{f'{runs} runs x {steps:,} steps':<30} {med:15.2f} {first:14.0f}")
    import tui_trainer.ui.app  # noqa: F401  (imported once, as the command does)
    for runs in (0, 200):
        with tempfile.TemporaryDirectory() as tmp:
            build(Path(tmp), runs, 100).close()
            s = asyncio.run(first_screen(Path(tmp)))
            print(f"first screen, {runs} runs x 100 steps: {s:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
