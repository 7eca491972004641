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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tui_trainer.core.settings import config
from tui_trainer.core.analysis import figures
from tui_trainer.core.session.reader import SessionReader
from tui_trainer.core.session.store import SessionStore


def rows(first: int, n: int) -> list[dict]:
    return [{"step": s, "epoch": s / 100, "elapsed": s * 0.01, "loss": 1.0 / s,
             "samples_per_s": 1000.0 + s, "rss_bytes": 1e8, "data_s": 0.01,
             "compute_s": 0.1, "lr": 0.01} for s in range(first, first + n)]


def build(path: Path, runs: int, steps: int) -> SessionStore:
    w = SessionStore(path)
    for i in range(runs):
        rid = w.create_run(config.DEFAULTS.to_dict(), name=f"r{i}")
        for start in range(1, steps + 1, 10_000):
            w.add_rows(steps=rows(start, min(10_000, steps - start + 1)), run_id=rid)
        w.set_progress(rid, steps, steps / 100)
        # As the engine ends a run: its summary holds its figures (core.analysis.figures).
        w.end_run(rid, "finished", {"elapsed_s": 1.0,
                                    "figures": figures.figures(w.steps(rid)).state()})
    return w


def tick_cost(path: Path, w: SessionStore, n: int = 40) -> tuple[float, float]:
    live = w.create_run(config.DEFAULTS.to_dict(), name="live")
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


async def first_screen(path: Path | None) -> tuple[float, float]:
    """Seconds until the first snapshot is drawn, and until the form is mounted too. With
    no path: a bare Textual app with one Static (the floor, measured the same way)."""
    from textual.app import App
    from textual.widgets import Static

    from tui_trainer.ui.app import TrainerApp
    from tui_trainer.ui.widgets.config_form import ConfigForm

    class Bare(App):
        def compose(self):
            yield Static("x")

    t = time.perf_counter()
    app = TrainerApp(path, poll=False) if path else Bare()
    async with app.run_test(size=(180, 50)) as pilot:
        if path is None:
            return time.perf_counter() - t, 0.0
        while app.snapshot is None:
            await asyncio.sleep(0.005)
        shown = time.perf_counter() - t
        while not app.query(ConfigForm) or not app.query_one(ConfigForm).ready:
            await pilot.pause(0.005)
        return shown, time.perf_counter() - t


def cold(path: Path | None, repeats: int = 5) -> tuple[float, float, float]:
    """Median over fresh processes (as a user starts the app): import seconds, first
    screen, form ready."""
    out = []
    for _ in range(repeats):
        p = subprocess.run([sys.executable, __file__, "--first-screen", str(path or "")],
                           capture_output=True, text=True, check=True)
        out.append(tuple(map(float, p.stdout.split())))
    return tuple(statistics.median(x[i] for x in out) for i in range(3))


def main() -> int:
    print(f"{'session':<30} {'tick median ms':>15} {'first tick ms':>14}")
    for runs, steps in ((4, 100), (200, 100), (4, 100_000)):
        with tempfile.TemporaryDirectory() as tmp:
            w = build(Path(tmp), runs, steps)
            med, first = tick_cost(Path(tmp), w)
            print(f"{f'{runs} runs x {steps:,} steps':<30} {med:15.2f} {first:14.0f}")
    imp, bare, _ = cold(None)
    print(f"\nfirst screen, median of 5 fresh processes (import of the app {imp:.2f} s not "
          "counted)")
    print(f"{'bare Textual app, one Static':<34} {bare:6.2f} s  (the floor)")
    for runs in (0, 200):
        with tempfile.TemporaryDirectory() as tmp:
            build(Path(tmp), runs, 100).close()
            _, shown, ready = cold(Path(tmp))
            print(f"{f'{runs} runs x 100 steps':<34} {shown:6.2f} s  ({shown / bare:.1f}x the "
                  f"floor; the form ready at {ready:.2f} s)")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--first-screen"]:
        t0 = time.perf_counter()
        import tui_trainer.ui.app  # noqa: F401  (imported first, as the command does)
        imported = time.perf_counter() - t0
        where = Path(sys.argv[2]) if sys.argv[2] else None
        print(imported, *asyncio.run(first_screen(where)))
        sys.exit(0)
    sys.exit(main())
