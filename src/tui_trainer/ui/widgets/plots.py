"""A plot panel: draws a few lines (core.plotdata.Line, already reduced to about its width)
and redraws only when given new lines and only while it can be seen."""

from __future__ import annotations

import math
from typing import Sequence

from textual_plotext import PlotextPlot

from ...core.plotdata import Line
from ..panels.common import COLOURS

Series = Line           # the name the panels and tests knew


class MetricPlot(PlotextPlot):
    def __init__(self, title: str, ylabel: str, xlabel: str = "step", **kwargs) -> None:
        super().__init__(**kwargs)
        self.title_text, self.ylabel, self.xlabel = title, ylabel, xlabel
        self.border_title = title
        self._pending: list[Line] | None = []
        self._note = ""
        self.log_y = False

    def show(self, lines: Sequence[Line], note: str = "", xlabel: str | None = None,
             log_y: bool = False) -> None:
        self._pending = list(lines)
        self._note = note
        self.xlabel = xlabel or self.xlabel
        self.log_y = log_y
        if self.is_on_screen:
            self.redraw()

    def on_show(self) -> None:
        self.redraw()

    def on_resize(self) -> None:
        self.redraw()

    def redraw(self) -> None:
        if self._pending is None:
            return
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        drawn = 0
        for line in self._pending:
            pts = [(x, y) for x, y in zip(line.xs, line.ys, strict=True)
                   if isinstance(y, (int, float)) and math.isfinite(y)]
            if pts:
                colour = COLOURS[line.colour % len(COLOURS)]
                plt.plot([p[0] for p in pts], [p[1] for p in pts], label=line.label,
                         color=colour, marker="dot" if line.faint else "braille")
                drawn += 1
        plt.xlabel(self.xlabel)
        plt.ylabel(("log10 " if self.log_y else "") + self.ylabel)
        plt.title(self._note if drawn else "no data yet")
        self.refresh()
