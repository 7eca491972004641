"""End to end in a real terminal: tmux runs `tui-trainer`, keys start a run, capture-pane
reads the screen; then the terminal is killed and the app reopens the same session."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from tui_trainer.core.settings import config
from tui_trainer.core.session.store import SessionStore

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

    def start_app(self, size: tuple[int, int] = (200, 55)) -> None:
        # COLUMNS/LINES can reach tmux from the test run (80x24) and would win over the
        # pane's real size in shutil.get_terminal_size().
        cmd = (f"env -u COLUMNS -u LINES TUI_TRAINER_HOME={shlex.quote(str(self.home))} "
               f"TUI_TRAINER_OFFLINE=1 "
               f"{shlex.quote(sys.executable)} -m tui_trainer --session "
               f"{shlex.quote(str(self.session))}")
        self.tmux("new-session", "-d", "-x", str(size[0]), "-y", str(size[1]), cmd)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p")

    def wait_for(self, predicate, timeout: float = 300) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            text = self.screen()
            if predicate(text):
                return text
            time.sleep(0.3)
        raise AssertionError("screen never showed it; last screen:\n" + self.screen())

    def mouse(self, x: int, y: int, button: int, times: int = 1) -> None:
        """A mouse event at column x, row y (0-based) as an xterm sends it (SGR): button 0 a
        click (press and release), 64 and 65 the wheel up and down."""
        for _ in range(times):
            press = f"\x1b[<{button};{x + 1};{y + 1}M"
            self.tmux("send-keys", "-l", press + (f"\x1b[<0;{x + 1};{y + 1}m"
                                                   if button == 0 else ""))

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


STATUSES = {"starting", "created", "running", "finished", "stopped", "crashed"}
# The A/B table's headings of a one-round study (core.analysis.study_text.headings)
AB_HEADINGS = ("variant", "bit-identical to base", "samples/s", "accuracy %", "eval loss",
               "train loss", "peak mem MiB", "data wait s", "run")


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
    # The form as the user left it last time (the session's saved screen state): 2 epochs of
    # 1,280 samples of the sample, 40 steps, so that the run ends soon.
    form = config.DEFAULTS.replace(train_samples=1280, eval_samples=200, log_every=2)
    with SessionStore(session) as store:
        store.set_meta("ui_state", json.dumps({"form": form.to_dict()}))
    steps = form.epochs * -(-form.train_samples // form.batch_size)
    term = Terminal(isolated_home, session)
    try:
        term.start_app()
        term.wait_for(lambda t: "Start (F2)" in t and "Reproducibility" in t)
        term.tmux("send-keys", "F2")
        # Finished, and its loss drawn (the charts are built after the table, in a thread).
        text = term.wait_for(lambda t: (_run_row(t) or ["", "", ""])[2] == "finished"
                             and bool(BRAILLE & set(t)))
        row = _run_row(text)
        assert str(steps) in row[3:6]         # the form's 2 epochs (after the progress)
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


def test_every_tab_is_usable_in_an_80x24_terminal(tmp_path, isolated_home):
    """At 80x24: the footer keeps the way to the rest (F1, F9, the palette); ctrl+t walks
    every tab and each shows its main content; F9 opens the form as a drawer; F1 the help."""
    from test_snapshots import _fill
    session = tmp_path / "session"
    session.mkdir()
    _fill(session, tab="tab-plots")
    (session / "logs").mkdir(exist_ok=True)
    (session / "logs" / "run-2.log").write_text("epoch 1/2 done\nhello from run 2\n")
    term = Terminal(isolated_home, session)
    try:
        term.start_app(size=(80, 24))
        text = term.wait_for(lambda t: "train loss (raw faint" in t and "seed-2" in t
                             and "^p palette" in t)
        footer = text.rstrip("\n").splitlines()[-1]
        assert "f1 Help" in footer and "f9 Form" in footer and "^p palette" in footer
        for tab, content in (("Divergence", ("|Δloss| per step", "not identical")),
                             ("Compare", ("B/A", "samples/s (training)", "0.95x")),
                             ("A/B", ("bit-identical to base", "seed=2", "samples/s")),
                             ("Profile", ("p: profile the run under the cursor",)),
                             ("Model", ("g: what the net sees in a digit",)),
                             ("Log", ("hello from run 2",)),
                             ("Plots", ("train loss (raw faint",))):
            term.tmux("send-keys", "C-t")
            text = term.wait_for(lambda t, c=content: all(x in t for x in c), timeout=120)
            assert all(len(line) <= 80 for line in text.splitlines()), tab
            if tab in ("Divergence", "Compare"):
                # Every chart draws: scrolled into view by the wheel, each shows its lines
                # (Compare's held a "…" for minutes, issue 55).
                term.mouse(40, 18, 65, times=12)
                text = term.wait_for(lambda t: "train loss, smoothed" in t and
                                     bool(BRAILLE & set(t)) if tab == "Compare"
                                     else bool(BRAILLE & set(t)), timeout=60)
                term.mouse(40, 18, 64, times=12)
            if tab == "A/B":
                # Every column of the table within 8 Right presses (the variant's stays).
                row = next(i for i, line in enumerate(text.splitlines())
                           if line.lstrip().startswith("seed=2"))
                term.mouse(4, row, 0)
                heads = set()
                for _ in range(9):
                    text = term.screen()
                    heads |= {h for h in AB_HEADINGS if h in text}
                    term.tmux("send-keys", "Right")
                    time.sleep(0.3)
                assert heads == set(AB_HEADINGS), AB_HEADINGS
                assert "variant" in term.screen()
        term.tmux("send-keys", "F9")            # the form, over the whole width
        # (the drawer's frame as a whole: a capture under load once caught the form drawn
        # over a chart's title not yet cleared, mid-frame)
        term.wait_for(lambda t: "find a knob" in t and "deterministic" in t
                      and "seed-2" not in t, 120)
        term.tmux("send-keys", "F9")
        term.wait_for(lambda t: "seed-2" in t and "find a knob" not in t, 120)
        term.tmux("send-keys", "F1")
        term.wait_for(lambda t: "ctrl+p finds every action" in t, 120)
        # Its last section is reachable: End shows the end of Statuses (issue 55: the help
        # stopped inside the A/B entry).
        from tui_trainer.ui.screens import HELP_STATUSES
        last = HELP_STATUSES.split()[-3:]
        term.tmux("send-keys", "End")
        text = term.wait_for(lambda t: "Statuses" in t and
                             " ".join(last) in " ".join(t.replace("█", " ").split()), 30)
        term.tmux("send-keys", "Escape")
        term.wait_for(lambda t: "ctrl+p finds every action" not in t and "seed-2" in t, 120)
    finally:
        term.kill()


def test_at_80x24_the_plots_tab_scrolls_by_its_keys_from_where_the_focus_starts(
        tmp_path, isolated_home):
    """Plots at 80x24 with two runs: from the run table (where the focus lands), PageDown
    shows the next chart and End the last one; from the tab strip too; and the options'
    hint fits the 80 columns whole."""
    import shutil as sh
    from pathlib import Path
    fixture = Path(__file__).parent / "fixtures" / "sessions" / "3-version-0.2.0"
    session = tmp_path / "session"
    sh.copytree(fixture, session)
    term = Terminal(isolated_home, session)
    try:
        term.start_app((80, 24))
        first = term.wait_for(lambda t: "train loss (raw" in t and "1 stopped" in t, 120)
        assert "1-8 one chart alone" in first, first
        assert "gradient norm" not in first
        term.tmux("send-keys", "PageDown")
        term.wait_for(lambda t: "train loss (raw" not in t, 20)     # the first chart left
        term.tmux("send-keys", "End")
        term.wait_for(lambda t: "gradient norm" in t, 20)           # the last chart
        term.tmux("send-keys", "Home")
        term.wait_for(lambda t: "train loss (raw" in t, 20)
        # the tab strip, then PageDown (the app takes keys in the order they came)
        term.tmux("send-keys", "Tab", "PageDown")
        term.wait_for(lambda t: "train loss (raw" not in t, 20)
    finally:
        term.kill()
