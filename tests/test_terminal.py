"""End to end in a real terminal: tmux runs `tui-trainer`, keys start a run, capture-pane
reads the screen; then the terminal is killed and the app reopens the same session."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
import uuid

import pytest

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (scripts/test installs it)")

BRAILLE = {chr(c) for c in range(0x2801, 0x2900)}   # what plotext draws lines with


class Terminal:
    def __init__(self, home, session) -> None:
        self.socket = f"tt-{uuid.uuid4().hex[:8]}"
        self.home, self.session = home, session

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True,
                              text=True, check=True).stdout

    def start_app(self) -> None:
        # COLUMNS/LINES can reach tmux from the test run (80x24) and would win over the
        # pane's real size in shutil.get_terminal_size().
        cmd = (f"env -u COLUMNS -u LINES TUI_TRAINER_HOME={shlex.quote(str(self.home))} "
               f"TUI_TRAINER_OFFLINE=1 "
               f"{shlex.quote(sys.executable)} -m tui_trainer --session "
               f"{shlex.quote(str(self.session))}")
        self.tmux("new-session", "-d", "-x", "200", "-y", "55", cmd)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p")

    def wait_for(self, predicate, timeout: float = 120) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            text = self.screen()
            if predicate(text):
                return text
            time.sleep(0.3)
        raise AssertionError("screen never showed it; last screen:\n" + self.screen())

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


STATUSES = {"starting", "created", "running", "finished", "stopped", "crashed"}


def _run_row(text: str) -> list[str] | None:
    """The run table's row of run 1: its id, name and a status, side by side."""
    for line in text.splitlines():
        cells = line.replace("▕", " ").split()
        for i in range(len(cells) - 2):
            if cells[i:i + 2] == ["1", "run-1"] and cells[i + 2] in STATUSES:
                return cells[i:]
    return None


def test_start_a_run_in_a_real_terminal_then_reopen_the_session(tmp_path, isolated_home):
    session = tmp_path / "session"
    term = Terminal(isolated_home, session)
    try:
        term.start_app()
        term.wait_for(lambda t: "Start (F2)" in t and "Reproducibility" in t)
        term.tmux("send-keys", "F2")
        text = term.wait_for(lambda t: (_run_row(t) or ["", "", ""])[2] == "finished")
        row = _run_row(text)
        assert "250" in row[3:6]              # 2 epochs of the sample (after the progress)
        # A plotted loss: the loss panel shows braille line drawing.
        assert "train loss (raw faint, smoothed bold)" in text
        assert BRAILLE & set(text)
        term.kill()                                       # the terminal goes away
        time.sleep(0.5)
        term.start_app()
        text = term.wait_for(lambda t: _run_row(t) is not None)
        assert _run_row(text)[2] == "finished"
    finally:
        term.kill()
