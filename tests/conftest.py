"""Shared helpers: every test runs the real `tui-trainer` command in a real process, against
a real session directory under tmp_path, on the MNIST sample shipped with the package."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

# Short runs: 10 steps an epoch on 640 of the shipped training digits.
QUICK = ["dataset=mnist-sample", "train_samples=640", "eval_samples=200", "batch_size=64",
         "log_every=2", "fingerprint_every=3"]


@dataclass
class Result:
    rc: int
    out: str
    err: str

    @property
    def json(self) -> dict:
        return json.loads(self.out.strip().splitlines()[-1])


# Dashboard tests: most never start a run, and a warm launcher (one torch import, ~5 s of
# CPU) per app would only slow the rest of the suite; tests marked `warm` keep it.
COLD_DASHBOARD = ("test_ui", "test_snapshots", "test_terminal")


@pytest.fixture(autouse=True)
def isolated_home(tmp_path_factory, monkeypatch, request):
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("TUI_TRAINER_HOME", str(home))
    # Launcher sockets in a runtime folder of the test's own (short: a socket path has about
    # 100 bytes), looked at by the tests and removed after them.
    runtime = tempfile.mkdtemp(prefix="ttrun-")
    monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
    request.addfinalizer(lambda: shutil.rmtree(runtime, ignore_errors=True))
    monkeypatch.setenv("TUI_TRAINER_OFFLINE", "1")
    if request.module.__name__.startswith(COLD_DASHBOARD) \
            and request.node.get_closest_marker("warm") is None:
        monkeypatch.setenv("TUI_TRAINER_WARM", "0")
    return home


def sets(*pairs: str) -> list[str]:
    out: list[str] = []
    for p in pairs:
        out += ["--set", p]
    return out


def tt(*args: str, timeout: float = 300) -> Result:
    """Runs `python -m tui_trainer ARGS` and returns its exit status and output."""
    proc = subprocess.run([sys.executable, "-m", "tui_trainer", *args], capture_output=True,
                          text=True, timeout=timeout, env=os.environ.copy())
    return Result(proc.returncode, proc.stdout, proc.stderr)


def tt_popen(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tui_trainer", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=os.environ.copy())


def db_rows(session: Path, sql: str, args: tuple = ()) -> list[tuple]:
    conn = sqlite3.connect(session / "session.sqlite")
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def fingerprints(session: Path, run_id: int) -> dict[int, str]:
    return dict(db_rows(session, "SELECT step, sha256 FROM fingerprints WHERE run_id = ? "
                                 "ORDER BY step", (run_id,)))


def wait_until(condition, timeout: float = 60) -> bool:
    """Polls `condition()` until it holds (True) or `timeout` seconds pass (False): a wait
    for a condition with a generous bound, never a fixed time."""
    import time
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def wait_for_row(session: Path, sql: str, timeout: float = 120) -> None:
    """Polls the session until `sql` returns a row (the training process is that far)."""
    if not wait_until(lambda: (session / "session.sqlite").exists()
                      and bool(db_rows(session, sql)), timeout):
        raise AssertionError(f"timed out waiting for: {sql}")


def in_private_mount(script: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs a bash script as root of a private mount namespace (`unshare -rm`: a tmpfs or a
    read-only remount stays inside it, no real root needed), with this Python on PATH as
    `python`: a real full or read-only disk for the tests that need one."""
    import shutil
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed for the full-disk and read-only tests")
    bindir = Path(sys.executable).parent
    return subprocess.run(["unshare", "-rm", "bash", "-uc", script], capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"})


async def click(pilot, selector: str, timeout: float = 30.0) -> None:
    """Clicks a widget once it is on the screen and laid out: on a loaded machine a dialog
    or a tab's panel is mounted a moment before it has a place, and a click at an empty
    region lands nowhere (the quit test failed so)."""
    import time
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = pilot.app.screen.query(selector)
        # A button ignores clicks while it still shows its last press ("-active", a timer
        # that runs late on a loaded machine): the A/B test's second click was lost so.
        if found and found.first().region.area > 0 and not found.first().has_class("-active"):
            assert await pilot.click(selector), f"the click on {selector} did not land"
            return
        await pilot.pause(0.05)
    raise AssertionError(f"{selector} never showed")
