"""Is the dashboard responsive while four runs stream into it?

Headless (App.run_test), 180x50, Plots tab with all runs marked. First with nothing training
(the reference), then with four real runs training in background processes and logging every
step, it measures:

- key round trip (Pilot): a key press (cursor down in the run table) through Pilot, which
  includes Pilot's own waiting: a callback through every widget, and `wait_for_idle`, which
  waits (up to 1 s, twice per key) until the whole process uses under 1 ms of CPU in 20 ms,
  so it also waits for the app's background threads (chart builds, the session read);
- key to cursor moved, and to the screen painted: a key put in as a person types (cursor
  up or down, `simulate_key`, nothing waits for idle) until the app has moved its cursor,
  and until the next screen update after that has been written (the round trip a person
  sees);
- the app's own handling of a key: the UI thread's time on the key event and what it causes
  (the cursor, the highlighted row, the state);
- ui handling: how long the UI thread is busy with each message it handles;
- Polled: the UI thread's share of a tick (drawing the snapshot);
- read: the polling thread's read of the session per tick (core.session.reader, off the UI thread).

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

from textual.message_pump import MessagePump
from textual.screen import Screen

from tui_trainer.core.settings import config
from tui_trainer.core.session.store import SessionStore
from tui_trainer.core.processes.supervisor import Supervisor
from tui_trainer.ui.app import TrainerApp

STREAM = config.DEFAULTS.replace(dataset="mnist-sample", train_samples=2000, epochs=1000,
                            log_every=1, fingerprint_every=10, checkpoint_every=0)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


HANDLED: list[tuple[str, float]] = []
VERBOSE = "--verbose" in sys.argv
KEY_WORK = {"Key", "CursorMoved", "RowHighlighted", "CellHighlighted", "StateChanged"}
_original = MessagePump._dispatch_message
_paint = Screen._compositor_refresh
PAINTED: list = [0.0, None]     # when the last screen update ended, and the table's cursor row
TABLE: list = [None]


def _painted(self) -> None:                    # every screen update written to the terminal
    cursor = TABLE[0].cursor_row if TABLE[0] is not None else None
    try:
        return _paint(self)
    finally:
        PAINTED[:] = [time.perf_counter(), cursor]


async def _timed(self, message):                # every message the app's widgets handle
    t = time.perf_counter()
    try:
        return await _original(self, message)
    finally:
        HANDLED.append((type(message).__name__, time.perf_counter() - t))


async def measure(app: TrainerApp, pilot, seconds: float) -> dict[str, list[float]]:
    HANDLED.clear()
    reads: list[float] = []
    keys: list[float] = []
    table = TABLE[0] = app.query_one("#runs")
    table.focus()
    end = time.perf_counter() + seconds
    per_key: list[float] = []
    typed: list[float] = []
    painted: list[float] = []
    while time.perf_counter() < end:
        for how in ("pilot", "typed"):
            t = time.perf_counter()
            start = len(HANDLED)
            key = "down" if table.cursor_row == 0 else "up"
            if how == "pilot":
                await pilot.press(key)
                keys.append(time.perf_counter() - t)
            elif table.row_count > 1:
                # As a person types: the key goes in, nothing waits for the app to be idle;
                # measured until the app has moved its cursor (its state, not the paint).
                before, row = app.cursor_run, table.cursor_row
                app.simulate_key(key)
                while app.cursor_run == before and time.perf_counter() - t < 5:
                    await asyncio.sleep(0.0005)
                typed.append(time.perf_counter() - t)
                # ... and until a screen update that began after the move has been written.
                while (PAINTED[0] < t or PAINTED[1] == row) \
                        and time.perf_counter() - t < 5:
                    await asyncio.sleep(0.0005)
                painted.append(time.perf_counter() - t)
            if how != "pilot":
                continue
            # The app's own handling of the key: the key event and what it caused (the
            # cursor, the highlighted row, the state), on the UI thread (counted for the
            # Pilot keys: Pilot waits until all of it is done).
            per_key.append(sum(d for name, d in HANDLED[start:] if name in KEY_WORK))
            if VERBOSE and per_key[-1] > 0.02:
                print("  slow key:", [(n, round(d * 1000, 1)) for n, d in HANDLED[start:]
                                      if d > 0.002])
        if app.snapshot is not None:
            reads.append(app.snapshot.read_ms / 1000)
        await asyncio.sleep(0.25)
    handled = [d for name, d in HANDLED if name not in ("Polled",)]
    polled = [d for name, d in HANDLED if name == "Polled"]
    by: dict[str, list[float]] = {}
    for name, d in HANDLED:
        by.setdefault(name, []).append(d)
    top = sorted(by.items(), key=lambda kv: -sum(kv[1]))[:8]
    print("  busiest message types (total ms, p95 ms, n):",
          ", ".join(f"{k} {1000 * sum(v):.0f}/{1000 * pct(v, .95):.1f}/{len(v)}"
                    for k, v in top))
    return {"key": keys, "typed": typed, "painted": painted, "ui": handled, "polled": polled,
            "read": reads, "keyh": per_key}


async def main_async(seconds: float) -> None:
    MessagePump._dispatch_message = _timed
    Screen._compositor_refresh = _painted
    with tempfile.TemporaryDirectory() as tmp:
        app = TrainerApp(Path(tmp), poll=True)
        async with app.run_test(size=(180, 50)) as pilot:
            await app.ready()
            await app.poll_now()
            idle = await measure(app, pilot, seconds)
            store = SessionStore(Path(tmp))
            sup = Supervisor(store)
            ids = [sup.start(STREAM.to_dict(), name=f"stream-{i}") for i in range(4)]
            app.marked = ids
            deadline = time.time() + 120
            while time.time() < deadline and any(store.run(i)["step"] < 20 for i in ids):
                await asyncio.sleep(0.5)
            streaming = await measure(app, pilot, seconds)
            rows = sum(len(store.steps(i)) for i in ids)
            for i in ids:
                sup.stop(i)
            while sup.live_runs():
                await asyncio.sleep(0.5)
            store.close()
    print(f"{seconds:.0f} s each; 4 runs logging every step ({rows} step rows by the end)")
    print(f"{'':<34} {'median':>8} {'p95':>8} {'max':>8}   (ms)")
    for label, data in (("idle", idle), ("4 runs streaming", streaming)):
        for what, name in (("key", "key round trip (Pilot)"),
                           ("typed", "key to cursor moved (no Pilot)"),
                           ("painted", "key to screen painted (no Pilot)"),
                           ("keyh", "app's own handling of a key"),
                           ("ui", "UI thread per message"),
                           ("polled", "UI thread per snapshot"),
                           ("read", "poll thread: session read")):
            xs = [1000 * x for x in data[what]]
            if xs:
                print(f"{label + ': ' + name:<34} {statistics.median(xs):8.1f} "
                      f"{pct(xs, .95):8.1f} {max(xs):8.1f}   n={len(xs)}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--verbose", action="store_true", help="print the slow keys' messages")
    args = ap.parse_args()
    asyncio.run(main_async(args.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
