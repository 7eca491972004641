"""Is the dashboard responsive while four runs stream into it?

Headless (App.run_test), 180x50, Plots tab with all runs marked. Measures, first with nothing
training (the reference), then with four real runs training in background processes and
logging every step: how long each poll-and-redraw tick takes (`refresh_all`, run twice a
second by the app's timer), and the round trip of a key press (cursor down/up in the run
table) until the app has handled it.

    python benchmarks/ui_streaming.py [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tui_trainer.core import config as C
from tui_trainer.ui.app import TrainerApp

STREAM = C.DEFAULTS.replace(dataset="mnist-sample", train_samples=2000, epochs=1000,
                            log_every=1, fingerprint_every=10, checkpoint_every=0)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def measure(app: TrainerApp, pilot, seconds: float) -> dict[str, list[float]]:
    ticks: list[float] = []
    original = app.refresh_all

    def timed() -> None:
        t = time.perf_counter()
        original()
        ticks.append(time.perf_counter() - t)

    app.refresh_all = timed                     # the app's own timer calls this
    timer = app.set_interval(0.5, timed)
    keys: list[float] = []
    table = app.query_one("#runs")
    table.focus()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for key in ("down", "up"):
            t = time.perf_counter()
            await pilot.press(key)
            keys.append(time.perf_counter() - t)
        await asyncio.sleep(0.25)
    timer.stop()
    app.refresh_all = original
    return {"tick": ticks, "key": keys}


async def main_async(seconds: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        app = TrainerApp(Path(tmp), poll=False)
        async with app.run_test(size=(180, 50)) as pilot:
            idle = await measure(app, pilot, seconds)
            ids = [app.supervisor.start(STREAM.to_dict(), name=f"stream-{i}") for i in range(4)]
            app.marked = ids
            deadline = time.time() + 120
            while time.time() < deadline and any(
                    app.store.run(i)["step"] < 20 for i in ids):
                await asyncio.sleep(0.5)
            streaming = await measure(app, pilot, seconds)
            rows = sum(len(app.store.steps(i)) for i in ids)
            for i in ids:
                app.supervisor.stop(i)
            while app.supervisor.live_runs():
                await asyncio.sleep(0.5)
    print(f"{seconds:.0f} s each; 4 runs logging every step ({rows} step rows by the end)")
    print(f"{'':<28} {'median':>8} {'p95':>8} {'max':>8}   (ms)")
    for label, data in (("idle", idle), ("4 runs streaming", streaming)):
        for what in ("tick", "key"):
            xs = [1000 * x for x in data[what]]
            name = f"{label}: {'poll+redraw' if what == 'tick' else 'key round trip'}"
            print(f"{name:<28} {statistics.median(xs):8.1f} {pct(xs, .95):8.1f} "
                  f"{max(xs):8.1f}   n={len(xs)}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20)
    args = ap.parse_args()
    asyncio.run(main_async(args.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
