"""Makes the README's screenshots: real runs in a scratch session, then the app saves SVGs
of its own screens into assets/.

    .venv/bin/python scripts/screenshots.py
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZE = (180, 50)


def tt(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "tui_trainer", *args], check=True,
                   capture_output=True)


async def settle(app, pilot) -> None:
    """The first screen, the form and the machine line, then every visible chart built."""
    from tui_trainer.ui.widgets.plots import MetricPlot

    await app.ready(machine=True)
    await app.poll_now()
    await pilot.pause(0.3)
    for _ in range(100):
        if all(p.drawn for p in app.query(MetricPlot)):
            break
        await pilot.pause(0.05)
    await pilot.pause(0.2)


async def shoot(session: Path) -> None:
    from textual.widgets import DataTable

    from tui_trainer.ui.app import TrainerApp

    app = TrainerApp(session, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)

        async def save(name: str) -> None:
            app.sub_title = "~/.local/share/tui-trainer/sessions/tour"
            await settle(app, pilot)
            app.save_screenshot(str(ROOT / "assets" / f"{name}.svg"))

        table = app.query_one("#runs", DataTable)
        table.focus()
        await pilot.press("space", "down", "space")           # mark runs 1 and 2
        app.query_one("#tabs").active = "tab-plots"
        await save("watch")
        app.query_one("#tabs").active = "tab-compare"
        await pilot.press("f6")
        await save("compare")
        await pilot.press("space", "up", "space", "down", "down", "space")   # runs 1 and 3
        app.pair = [1, 3]
        app.query_one("#tabs").active = "tab-divergence"
        await save("divergence")
        await pilot.press("ctrl+o")
        await pilot.pause(0.3)
        app.save_screenshot(str(ROOT / "assets" / "open.svg"))


async def shoot_study(session: Path) -> None:
    from tui_trainer.ui.app import TrainerApp

    app = TrainerApp(session, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        app.query_one("#tabs").active = "tab-ab"
        app.sub_title = "~/.local/share/tui-trainer/sessions/knobs"
        await settle(app, pilot)
        app.save_screenshot(str(ROOT / "assets" / "ab.svg"))


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TUI_TRAINER_HOME"] = tmp
        session = Path(tmp) / "sessions" / "tour"
        base = ["--session", str(session), "--set", "epochs=2"]
        tt("run", *base, "--name", "baseline")
        tt("run", *base, "--name", "seed-2", "--set", "seed=2")
        tt("run", *base, "--name", "baseline-twin")
        tt("run", "--session", str(Path(tmp) / "sessions" / "fast-cpu"), "--config",
           str(ROOT / "experiments" / "fastest-cpu.toml"), "--set", "epochs=1")
        (ROOT / "assets").mkdir(exist_ok=True)
        knobs = Path(tmp) / "sessions" / "knobs"
        tt("ab", "--session", str(knobs), "--config",
           str(ROOT / "experiments" / "ab" / "determinism.toml"))
        asyncio.run(shoot(session))
        asyncio.run(shoot_study(knobs))
    print("wrote", ", ".join(p.name for p in sorted((ROOT / "assets").glob("*.svg"))))


if __name__ == "__main__":
    main()
