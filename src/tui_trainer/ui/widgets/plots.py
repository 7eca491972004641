"""Plot panels: each draws a few series, already reduced to about its own width."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from textual.containers import Grid
from textual_plotext import PlotextPlot

from ...core.divergence import reduce_minmax

# Each run keeps one colour in every panel (plotext colour names).
COLOURS = ("cyan", "orange", "green", "magenta", "blue", "red", "yellow", "white")


@dataclass
class Series:
    label: str
    xs: Sequence[float]
    ys: Sequence[float | None]
    colour: str = "cyan"


class MetricPlot(PlotextPlot):
    """A plot that redraws only when given new data and only while it can be seen."""

    def __init__(self, title: str, ylabel: str, xlabel: str = "step", **kwargs) -> None:
        super().__init__(**kwargs)
        self.title_text, self.ylabel, self.xlabel = title, ylabel, xlabel
        self.border_title = title
        self._pending: list[Series] | None = []
        self._note = ""

    def show(self, series: list[Series], note: str = "") -> None:
        self._pending = series
        self._note = note
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
        width = max(10, self.size.width - 8)
        drawn = 0
        for s in self._pending:
            xs, ys = reduce_minmax(s.xs, s.ys, width)
            if xs:
                plt.plot(xs, ys, label=s.label, color=s.colour, marker="braille")
                drawn += 1
        plt.xlabel(self.xlabel)
        plt.ylabel(self.ylabel)
        plt.title(self._note if drawn else "no data yet")
        self.refresh()


class PlotGrid(Grid):
    """The live panels for the selected runs."""

    def compose(self):
        yield MetricPlot("loss (raw and smoothed)", "loss", id="plot-loss")
        yield MetricPlot("throughput", "samples/s", id="plot-throughput")
        yield MetricPlot("memory", "MiB", id="plot-memory")
        yield MetricPlot("waiting for data vs computing", "s per log interval",
                         id="plot-timing")
        yield MetricPlot("evaluation accuracy", "%", id="plot-accuracy")
        yield MetricPlot("learning rate", "lr", id="plot-lr")
