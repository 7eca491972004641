"""The Log tab: what the run under the cursor printed (its log file, tailed by the polling
thread; lines arrive as messages). Control characters are shown escaped, never sent to the
terminal; tqdm's carriage-return updates keep only each line's last state."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Log

from ...core.text import shown_line
from .common import Tick

LOG_TAIL_BYTES = 64_000


class LogTail:
    """Reads new whole lines of one run's log file (in the polling thread)."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.offset = 0

    def read(self, path: Path | None) -> tuple[bool, list[str]]:
        """(started over, new lines)."""
        reset = path != self.path
        if reset:
            self.path = path
            size = path.stat().st_size if path is not None and path.exists() else 0
            self.offset = max(0, size - LOG_TAIL_BYTES)
        if path is None or not path.exists():
            return reset, []
        with open(path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        cut = data.rfind(b"\n") + 1          # only whole lines; the rest comes next time
        if not cut:
            return reset, []
        self.offset += cut
        text = data[:cut].decode("utf-8", "replace")
        return reset, [shown_line(line.rsplit("\r", 1)[-1]) for line in text.split("\n")[:-1]]


class LogPanel(Log):
    """Its lines come as the app's `LogLines` messages (`show`), not with each tick: a tick
    can be replaced by a newer one, a log's lines cannot."""
    TAB, TITLE, PANEL_ID = "tab-log", "Log", "log"
    FOLLOWS_CURSOR = True       # a tick at once when the cursor moves

    def __init__(self, **kwargs) -> None:
        super().__init__(max_lines=5000, **kwargs)

    def draw(self, tick: Tick) -> None:
        pass                # the lines of the run under the cursor come as messages (show)

    def show(self, reset: bool, lines: list[str]) -> None:
        if reset:
            self.clear()
        if lines:
            self.write_lines(lines)
