"""The Profile tab: where a run's step time goes, operator by operator (`tui-trainer
profile`: p starts it on the run under the cursor, or on both runs of the pair); for a pair,
which operators changed their self time. What it shows is the newest profile the session
keeps on each run; the trace's path is said (and ctrl+e exports it)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from ...core.analysis import profiling
from ...core.text import shown_lines
from .common import Tick

STEPS, WARMUP = 10, 3       # what p profiles (the command's defaults)
HINT = (f"p: profile the run under the cursor ({STEPS} steps of a copy of it under "
        f"torch.profiler, after {WARMUP} of warm-up; the run is not touched). With a pair "
        "marked, p profiles both and shows which operators changed their self time.")


class ProfilePanel(VerticalScroll):
    TAB, TITLE, PANEL_ID = "tab-profile", "Profile", "profile-panel"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._key: Any = None

    def compose(self) -> ComposeResult:
        yield Static(HINT, id="profile-text")

    def draw(self, tick: Tick) -> None:
        sel = tick.selection
        pair = sel.current_pair(tick.runs)
        cursor = sel.cursor
        checks = tick.snap.checks
        kept = {r: profiling.newest(checks.get(r, [])) for r in {*(pair or ()), cursor}
                if r is not None}
        busy = tick.profiling
        width = self.scrollable_content_region.width - 1 or None    # the tables fit it
        key = (pair, cursor, repr(sorted((r, repr(p)[:4000]) for r, p in kept.items())),
               (busy[0], int(busy[1])) if busy else None, width)
        if key == self._key:
            return
        self._key = key
        session = getattr(self.app, "session_dir", None)
        out: list[str] = []
        if busy:
            runs = " and ".join(str(r) for r in busy[0])
            out.append(f"Profiling run{'s' if len(busy[0]) > 1 else ''} {runs}: a copy trains "
                       f"under torch.profiler ({int(busy[1])} s so far) ...")
        if pair and kept.get(pair[0]) and kept.get(pair[1]):
            a, b = kept[pair[0]], kept[pair[1]]
            out += profiling.diff_lines(a, b, ids=pair, width=width)
            out += [""] + profiling.lines(a, pair[0], session, width) + [""] + \
                profiling.lines(b, pair[1], session, width)
        elif cursor is not None and kept.get(cursor):
            out += profiling.lines(kept[cursor], cursor, session, width)
            if pair:
                out.append(f"(p profiles both runs of the pair {pair[0]}, {pair[1]} for a diff)")
        if not busy:
            out += ["", HINT] if out else [HINT]
        self.query_one("#profile-text", Static).update(Text(shown_lines("\n".join(out))))
