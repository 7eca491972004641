"""The Profile tab: where a run's step time goes, operator by operator (`tui-trainer
profile`: p starts it on the run under the cursor, or on both runs of the pair); for a pair,
which operators changed their self time. What it shows is the newest profile the session
keeps on each run; the trace's path is said (and ctrl+e exports it). This panel owns p and
the command it starts."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from ...core.analysis import profiling
from ...core.session.reader import Snapshot
from ...core.text import shown_lines
from ..jobs import Job, TabJob
from .common import Tick, tabs_of

STEPS, WARMUP = 10, 3       # what p profiles (the command's defaults)
HINT = (f"p: profile the run under the cursor ({STEPS} steps of a copy of it under "
        f"torch.profiler, after {WARMUP} of warm-up; the run is not touched). With a pair "
        "marked, p profiles both and shows which operators changed their self time.")


class ProfilePanel(VerticalScroll):
    TAB, TITLE, PANEL_ID = "tab-profile", "Profile", "profile-panel"
    TAB_KEYS = [Binding("p", "profile", "Profile", show=False)]    # the app's, while it shows
    COMMANDS = [("Profile the run", "K steps of a copy of the run under the cursor (or of the "
                 "pair's runs) under torch.profiler: where a step's time goes, op by op",
                 "profile")]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._key: Any = None
        self.profiling = TabJob(self)       # a profile under way (p)

    def action_profile(self) -> None:
        """p: K steps of a copy of the run under the cursor under torch.profiler, or of both
        runs of the pair (then the tab diffs them)."""
        app = self.app
        if not app.writable("not profiled"):
            return
        if self.profiling.job is not None:
            app.notify("already profiling run(s) "
                       f"{', '.join(map(str, self.profiling.job.runs))}", severity="warning")
            return
        pair = app.selection.current_pair(app.runs)
        if pair:
            runs: tuple[int, ...] = tuple(pair)
        else:
            run = app.selected()
            if run is None:
                return
            runs = (run.id,)
        self.profiling.start(runs, lambda sup: sup.profile(runs), "not profiled")
        app.draw_tab()

    def settle(self, snap: Snapshot) -> None:
        """After each tick: a profile that landed (on the last of its runs) lets the job go;
        one that ended without it is said to have failed."""
        app = self.app

        def landed(job: Job, _: Any) -> None:
            if tabs_of(self).active != self.TAB:
                app.notify(f"the profile of run(s) {', '.join(map(str, job.runs))} is ready: "
                           "the Profile tab")

        def failed(job: Job) -> None:
            app.notify(f"profiling run(s) {', '.join(map(str, job.runs))} failed (exit status "
                       f"{job.job.poll()}); its output is in logs/profile-"
                       f"{'-'.join(map(str, job.runs))}.log", severity="error", timeout=12)

        self.profiling.settle(
            lambda job: profiling.newest(snap.checks.get(job.runs[-1], []), since=job.wall),
            landed, failed)

    def compose(self) -> ComposeResult:
        yield Static(HINT, id="profile-text")

    def draw(self, tick: Tick) -> None:
        sel = tick.selection
        pair = sel.current_pair(tick.runs)
        cursor = sel.cursor
        checks = tick.snap.checks
        kept = {r: profiling.newest(checks.get(r, [])) for r in {*(pair or ()), cursor}
                if r is not None}
        busy = self.profiling.now()
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
