"""The Plots tab: the plotted runs' panels, and the controls that shape them.

Keys (anywhere in the tab): m smoothing (cycles), x the x axis (step, samples, time),
l log scale, w the window (all steps or the last N); 1-8 (wherever the focus is while the
tab shows, but in a text field: the App's) show one panel alone over the tab (again: all,
each at a readable height, the tab scrolling).
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

from ...core.analysis.plotdata import PANELS, SMOOTHING_CHOICES, X_AXES, Line, PlotOptions
from ...core.text import shown
from ..widgets.plots import MetricPlot
from .common import Tick, label

WINDOWS = (0, 100, 500, 2000)


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
    ]   # (1-8 are the App's: they work wherever the focus is, but in a text field)

    class OptionsChanged(Message):
        def __init__(self, options: PlotOptions) -> None:
            self.options = options
            super().__init__()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.options = PlotOptions()
        self.solo: int | None = None
        self.can_focus = True
        self._lines: dict | None = None

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
        if tick.lines is None or tick.lines is self._lines:
            return
        self._lines = tick.lines
        plotted = tick.selection.plotted()
        names = ", ".join(label(r, tick.runs) for r in plotted)
        stuck = [r for r in plotted if r in tick.runs and tick.runs[r].not_learning]
        warn = f" · not learning: {', '.join(map(str, stuck))} (its row says why)" \
            if stuck else ""
        self.show(tick.lines, (shown(names, 80) or "no run selected") + warn)

    def show(self, lines: dict[str, list[Line]], note: str) -> None:
        for pid, _, _ in PANELS:
            self.query_one(f"#{pid}", MetricPlot).show(
                lines.get(pid, []), note, xlabel=X_AXES[self.options.x],
                log_y=self.options.log_y)

    def _say(self) -> None:
        o = self.options
        self.query_one("#plot-options", Static).update(Text(
            f"smoothing {o.smoothing or 'off'} (m) · x: {o.x} (x) · "
            f"{'log' if o.log_y else 'linear'} scale (l) · "
            f"{'last ' + str(o.last) + ' steps' if o.last else 'all steps'} (w) · "
            "1-8 one panel alone"))

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
