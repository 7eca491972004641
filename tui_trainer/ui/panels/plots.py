"""The Plots tab: the plotted runs' panels, and the controls that shape them.

Keys (anywhere in the tab): m smoothing (cycles), x the x axis (step, samples, time),
l log scale, w the window (all steps or the last N); 1-8 (wherever the focus is while the
tab shows, but in a text field: the App binds them) show one panel alone over the tab
(again: all, each at a readable height, the tab scrolling); b (the same way) where the
memory of the run under the cursor goes, measured on a copy of it when none is kept.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Static

from ...core.analysis import memory
from ...core.analysis.plotdata import PANELS, SMOOTHING_CHOICES, X_AXES, Line, PlotOptions
from ...core.session.reader import Snapshot
from ...core.text import shown
from ..jobs import Job, TabJob
from ..screens import MemoryScreen
from ..widgets.plots import MetricPlot
from .common import Tick, label

WINDOWS = (0, 100, 500, 2000)
# what the charts say in a session with no runs yet
EMPTY_SESSION = "no runs yet: F2 starts one with the form's config (F9 shows the form)"


class PlotGrid(Grid):
    def compose(self) -> ComposeResult:
        for pid, title, ylabel in PANELS:
            yield MetricPlot(title, ylabel, id=pid)


class PlotsPanel(Vertical):
    TAB, TITLE, PANEL_ID = "tab-plots", "Plots", "plots-panel"
    BINDINGS = [
        Binding("m", "smoothing", "Smoothing"),
        Binding("x", "x_axis", "X axis"),
        Binding("l", "log_scale", "Log scale"),
        Binding("w", "window", "Window"),
    ]
    # The app's while this tab shows, wherever the focus is but in a text field.
    TAB_KEYS = [Binding("b", "memory", "Memory", show=False),
                *[Binding(str(i + 1), f"solo({i})", show=False) for i in range(len(PANELS))]]
    COMMANDS = [("Memory breakdown", "Where the memory of the run under the cursor goes: one "
                 "step of a copy of it, by category and module", "memory"),
                *((f"Plot alone: {title.split(' (')[0]}", f"The Plots tab's {i + 1} key: this "
                   "chart alone over the tab (the key again: all of them)", f"solo({i})")
                  for i, (_, title, _) in enumerate(PANELS))]

    class OptionsChanged(Message):
        def __init__(self, options: PlotOptions) -> None:
            self.options = options
            super().__init__()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.options = PlotOptions()
        self.solo: int | None = None
        self._lines: dict | None = None
        self._drawn_for: tuple | None = None     # (any runs, the runs plotted) when drawn
        self.measuring = TabJob(self)       # a memory breakdown under way (b)

    def action_memory(self) -> None:
        """b: the run under the cursor's newest memory breakdown, or (none yet, or asked
        again from its screen) one measured now on a copy of the run."""
        app = self.app
        run = app.selected()
        if run is None:
            return
        found = memory.newest(app.snapshot.checks.get(run.id, [])) if app.snapshot else None
        if found is not None:
            self._show_memory(run.id, found)
        else:
            self.measure_memory(run.id)

    def measure_memory(self, run_id: int) -> None:
        app = self.app
        if not app.writable("not measured"):
            return
        if self.measuring.job is not None:
            app.notify(f"already measuring run {self.measuring.job.runs[0]}",
                       severity="warning")
            return
        app.notify(f"measuring one step of a copy of run {run_id} (a few seconds) ...")
        self.measuring.start((run_id,), lambda sup: sup.memory(run_id), "not measured")

    def settle(self, snap: Snapshot) -> None:
        """After each tick: a breakdown that landed is shown (or said, when another screen
        is up); a measurement that ended without one is said to have failed."""
        app = self.app

        def landed(job: Job, found: Any) -> None:
            if len(app.screen_stack) == 1:
                self._show_memory(job.runs[0], found)
            else:
                app.notify(f"run {job.runs[0]}'s memory breakdown is ready: b in the Plots "
                           "tab")

        def failed(job: Job) -> None:
            app.notify(f"measuring run {job.runs[0]}'s memory failed (exit status "
                       f"{job.job.poll()}); its output is in logs/memory-run-{job.runs[0]}"
                       ".log", severity="error", timeout=12)

        self.measuring.settle(
            lambda job: memory.newest(snap.checks.get(job.runs[0], []), since=job.wall),
            landed, failed)

    def _show_memory(self, run_id: int, result: dict[str, Any]) -> None:
        def closed(again: Any) -> None:
            if again:
                self.measure_memory(run_id)
        row = self.app.runs.get(run_id)
        resident = row.peak_memory_mib if row is not None and row.memory_kind == "RSS" \
            else None
        self.app.push_screen(MemoryScreen(f"Where run {run_id}'s memory goes", result,
                                          resident), closed)

    def compose(self) -> ComposeResult:
        yield Static("", id="plot-options")
        with VerticalScroll(id="plot-scroll"):
            yield PlotGrid(id="plots")

    def on_mount(self) -> None:
        self._say()

    def set_options(self, options: PlotOptions) -> None:
        self.options = options
        self._say()

    def draw(self, tick: Tick) -> None:
        """The lines the polling thread built for the plotted runs (the same object while
        nothing changed: drawn once)."""
        plotted = tick.selection.plotted()
        # the same lines, but runs or the runs plotted changed: what an empty chart says did
        # (issue 68: "no runs yet" stayed a second while the table showed run 1 at step 86)
        key = (bool(tick.runs), tuple(plotted))
        if tick.lines is None or (tick.lines is self._lines and key == self._drawn_for):
            return
        self._lines, self._drawn_for = tick.lines, key
        names = ", ".join(label(r, tick.runs) for r in plotted)
        stuck = [r for r in plotted if r in tick.runs and tick.runs[r].not_learning]
        warn = f" · not learning: {', '.join(map(str, stuck))} (its row says why)" \
            if stuck else ""
        # a chart without points says why: a session with no runs yet says how to start one
        empty = EMPTY_SESSION if not tick.runs else \
            "no run selected: move the cursor to a run" if not plotted else ""
        self.show(tick.lines, (shown(names, 80) or "no run selected") + warn, empty)

    def show(self, lines: dict[str, list[Line]], note: str, empty: str = "") -> None:
        for pid, _, _ in PANELS:
            self.query_one(f"#{pid}", MetricPlot).show(
                lines.get(pid, []), note, xlabel=X_AXES[self.options.x],
                log_y=self.options.log_y, empty=empty)

    def _say(self) -> None:
        o = self.options
        self.query_one("#plot-options", Static).update(Text(
            f"m smoothing {o.smoothing or 'off'} · x {o.x} · "
            f"l {'log' if o.log_y else 'linear'} · "
            f"w {'last ' + str(o.last) + ' steps' if o.last else 'all steps'} · "
            "1-8 one chart alone"))

    def _change(self, **kw: Any) -> None:
        self.options = replace(self.options, **kw)
        self._say()
        self.post_message(self.OptionsChanged(self.options))

    def action_smoothing(self) -> None:
        i = SMOOTHING_CHOICES.index(self.options.smoothing) \
            if self.options.smoothing in SMOOTHING_CHOICES else 0
        self._change(smoothing=SMOOTHING_CHOICES[(i + 1) % len(SMOOTHING_CHOICES)])

    def action_x_axis(self) -> None:
        axes = list(X_AXES)
        self._change(x=axes[(axes.index(self.options.x) + 1) % len(axes)])

    def action_log_scale(self) -> None:
        self._change(log_y=not self.options.log_y)

    def action_window(self) -> None:
        i = WINDOWS.index(self.options.last) if self.options.last in WINDOWS else 0
        self._change(last=WINDOWS[(i + 1) % len(WINDOWS)])

    def action_solo(self, index: int) -> None:
        """One panel alone over the whole tab; the same key again: every panel, each at its
        own height in a grid that scrolls (classes, so the terminal's size still decides the
        grid: a display set here outlived a resize and squeezed eight panels into one
        column's height)."""
        self.solo = None if self.solo == index else index
        for i, (pid, _, _) in enumerate(PANELS):
            self.query_one(f"#{pid}").set_class(self.solo == i, "-alone")
        self.query_one(PlotGrid).set_class(self.solo is not None, "-solo")
        self.query_one("#plot-scroll", VerticalScroll).scroll_home(animate=False)
