"""The Log tab: what the run under the cursor printed (its log file, tailed by the polling
thread; lines arrive as messages). Control characters are shown escaped, never sent to the
terminal; tqdm's carriage-return updates keep only each line's last state."""

from __future__ import annotations

import textwrap
from collections import deque
from pathlib import Path
from typing import Iterable

from textual.widgets import Log

from ...core.text import shown_line
from .common import Tick

LOG_TAIL_BYTES = 64_000
MAX_LINES = 5000            # the tab keeps the last this many lines


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
    can be replaced by a newer one, a log's lines cannot. A line wider than the tab is
    wrapped at its width (its continuation indented), and wrapped again when the width
    changes: at 80x24 a run's last line was 264 columns, reached by 186 presses of →."""
    TAB, TITLE, PANEL_ID = "tab-log", "Log", "log"
    FOLLOWS_CURSOR = True       # a tick at once when the cursor moves

    def __init__(self, **kwargs) -> None:
        super().__init__(max_lines=MAX_LINES, **kwargs)
        self._written: deque[str] = deque(maxlen=MAX_LINES)     # as the run wrote them
        self._wrapped_at = 0

    def draw(self, tick: Tick) -> None:
        pass                # the lines of the run under the cursor come as messages (show)

    def show(self, reset: bool, lines: list[str]) -> None:
        if reset:
            self.clear()
            self._written.clear()
        self._written.extend(lines)
        # A tab not laid out yet (its first lines, as it mounts) writes them once it is
        # (on_resize), wrapped at its width: written now they showed cut at the edge for a
        # moment, then wrapped.
        if lines and self._wrap_width() > 0:
            self.write_lines(self._wrapped(lines))

    def on_resize(self) -> None:
        if self._written and self._wrap_width() != self._wrapped_at:
            self.clear()
            self.write_lines(self._wrapped(self._written))

    def _wrap_width(self) -> int:
        return self.scrollable_content_region.width - 1     # (a cell for the scrollbar)

    def _wrapped(self, lines: Iterable[str]) -> list[str]:
        """The lines as the tab shows them: one wider than the tab wrapped (a tab narrower
        than 20 cells wraps nothing); a blank line as a space (Textual's Log drops an empty
        one, and a traceback's blank lines part its chained exceptions)."""
        self._wrapped_at = width = self._wrap_width()
        out = []
        for line in lines:
            if width < 20 or len(line) <= width:        # (most lines: no textwrap)
                out.append(line or " ")
                continue
            indent = line[:len(line) - len(line.lstrip(" "))]
            out += textwrap.wrap(line, width, subsequent_indent=indent + "  ",
                                 replace_whitespace=False, break_on_hyphens=False) or [line]
        return out
