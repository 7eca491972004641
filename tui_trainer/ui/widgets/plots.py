"""A plot panel: draws a few lines (core.analysis.plotdata.Line, already reduced to about its
width).

Plotext builds a chart in pure Python (about 35 ms for eight lines at 60x14 on this 2-core
machine): too slow for the UI thread while runs stream, where eight panels redraw twice a
second. So each panel builds its chart in a thread worker, for its current size, only while
it is in view, only when its lines or size changed, and at most every 2 s; the UI
thread only shows the text.

"In view" means drawn in the screen's last update, not merely laid out: a panel scrolled
out of the plot grid is laid out but not seen, and refreshing it makes Textual rebuild the
whole screen's map (about 37 ms with the form on screen), which is what kept keys waiting
while runs streamed. A chart asks to be drawn when a container above it scrolls.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from typing import Sequence

import plotext
from rich.text import Text
from textual import work
from textual.app import RenderResult
from textual.widget import Widget
from textual_plotext import PlotextPlot
from textual_plotext.plot import Plot

from ...core.analysis.plotdata import Line
from ...core.text import shown
from ..panels.common import COLOURS

Series = Line           # the name the panels and tests knew
NO_DATA = "no data yet"     # a chart's title while it has no points
MIN_BUILD_S = 2.0       # a panel's chart is rebuilt at most this often (W&B: a few seconds)
# One chart is built at a time in the whole app: builds are pure Python, and several at once
# only take turns holding the GIL against the UI thread (a key then waits for each of them).
BUILDING = threading.Lock()


class MetricPlot(PlotextPlot):
    def __init__(self, title: str, ylabel: str, xlabel: str = "step", **kwargs) -> None:
        super().__init__(**kwargs)
        self.title_text, self.ylabel, self.xlabel = title, ylabel, xlabel
        self.border_title = title
        self._pending: list[Line] = []
        self._note = ""
        self._empty = NO_DATA
        self.log_y = False
        self._canvas: Text | None = None
        self._built_key: tuple | None = None      # what the canvas shows (lines, size)
        self._asked = itertools.count(1)
        self._latest = 0
        self._shown = 0
        self._last_build = -MIN_BUILD_S
        self._timer_set = False
        self._drawn_labels: frozenset[str] = frozenset()   # lines with points, last built

    def show(self, lines: Sequence[Line], note: str = "", xlabel: str | None = None,
             log_y: bool = False, empty: str = "") -> None:
        """`note` titles a chart with points; `empty` one without (default NO_DATA)."""
        self._pending = list(lines)
        self._note = note
        self._empty = empty or NO_DATA
        self.xlabel = xlabel or self.xlabel
        self.log_y = log_y
        self._built_key = None
        self.redraw()

    def on_show(self) -> None:
        self.redraw()

    def on_mount(self) -> None:
        # A chart out of view is not built; scrolled into view (by any container above it:
        # the plot grid, Compare, Divergence), it is built then.
        for above in self.ancestors:
            if isinstance(above, Widget):
                self.watch(above, "scroll_y", self._scrolled, init=False)

    def _scrolled(self) -> None:
        self.call_after_refresh(self.redraw)

    def on_resize(self) -> None:
        self.redraw()

    @property
    def in_view(self) -> bool:
        """Drawn in the screen's last update (in its visible map, not only laid out)."""
        if not self.is_mounted:
            return False
        try:
            return self in self.screen._compositor.visible_widgets
        except Exception:           # another Textual: the public, broader test
            return self.is_on_screen

    def redraw(self) -> None:
        """Builds the chart in a worker if what it would show changed and it is in view."""
        if not self.in_view:
            return
        w, h = self.size.width, self.size.height
        key = (id(self._pending), self._note, self._empty, self.xlabel, self.log_y, w, h,
               self.app.theme)
        if key == self._built_key or w < 8 or h < 4:
            return
        # A line that gets its first points (a run just started, a run newly plotted) is
        # drawn now, not after the streaming limit: a person waits for it (issue 55: the
        # first point of a run came 1 to 2 s after its first loss in the table).
        labels = frozenset(line.label for line in self._pending
                           if any(isinstance(y, (int, float)) and math.isfinite(y)
                                  for y in line.ys))
        wait = 0.0 if not labels <= self._drawn_labels else \
            self._last_build + MIN_BUILD_S - time.monotonic()
        quiet = getattr(self.app, "input_quiet", lambda: 0.0)()
        if quiet > 0 and self._canvas is not None:
            wait = max(wait, quiet)     # the user is typing: the screen answers first
        if wait > 0:            # streaming: at most one build a second; the newest wins
            if not self._timer_set:
                self._timer_set = True
                self.set_timer(wait, self._timer_redraw)
            return
        self._last_build = time.monotonic()
        self._built_key = key
        self._drawn_labels = labels
        self._latest = next(self._asked)
        self._build(self._latest, list(self._pending), (self._note, self._empty),
                    self.xlabel, self.ylabel + (" (log scale)" if self.log_y else ""), w, h,
                    self._get_plotext_theme_name(self.app.theme), self.log_y)

    @property
    def drawn(self) -> bool:
        """The chart shown is the newest asked for, and nothing is waiting (for tests)."""
        return not self._timer_set and self._shown == self._latest

    def _timer_redraw(self) -> None:
        self._timer_set = False
        self.redraw()

    @work(thread=True, group="plot-build")
    def _build(self, seq: int, lines: list[Line], notes: tuple[str, str], xlabel: str,
               ylabel: str, width: int, height: int, theme: str, log_y: bool = False) -> None:
        # A key just came: the UI thread answers it before a build takes turns with it for
        # the GIL (bounded: a chart is never held back more than a second).
        wait_for_quiet = getattr(self.app, "wait_for_quiet", None)
        if wait_for_quiet is not None:
            wait_for_quiet(1.0)
        with BUILDING:
            if seq != self._latest:
                return                          # a newer build was asked for meanwhile
            canvas = Text.from_ansi(chart(lines, notes[0], xlabel, ylabel, width, height,
                                          theme, log_y, empty=notes[1]))
        self.app.call_from_thread(self._set_canvas, seq, canvas)

    def _set_canvas(self, seq: int, canvas: Text) -> None:
        if seq == self._latest:
            self._canvas = canvas
            self._shown = seq
            self.refresh()

    def render(self) -> RenderResult:
        return self._canvas if self._canvas is not None else Text("…")


def _number(v: float) -> str:
    return f"{v:.3g}" if 1e-3 <= abs(v) < 1e5 or v == 0 else f"{v:.1e}"


def _gap(lo: float, hi: float, rows: int) -> float:
    """The least distance between two ticks of an axis lo..hi drawn on `rows` rows: a row
    apart (plotext puts a tick's label on its nearest row, and of two on one row shows the
    last, beside a row it does not mark)."""
    return (hi - lo) / max(rows - 1, 1)


def log_ticks(lo: float, hi: float, rows: int = 99) -> tuple[list[float], list[str]]:
    """Ticks for a log10 axis spanning lo..hi (in log10 units) on `rows` rows, labelled in
    the data's own units: 1, 2 and 5 times the powers of ten inside the range (only the
    powers of ten when more than six; fewer where rows are few; its ends when fewer than two
    fall inside)."""
    values = [m * 10.0 ** d for d in range(math.floor(lo), math.ceil(hi) + 1)
              for m in (1, 2, 5)]
    inside = [v for v in values if lo - 1e-9 <= math.log10(v) <= hi + 1e-9]
    if len(inside) > 6:
        inside = [v for v in inside if f"{v:.0e}".startswith("1")] or inside
    kept: list[float] = []
    for v in inside:
        if not kept or math.log10(v) - math.log10(kept[-1]) >= _gap(lo, hi, rows) - 1e-9:
            kept.append(v)
    if len(kept) < 2 and rows >= 2:
        kept = [10.0 ** lo, 10.0 ** hi]
    return [math.log10(v) for v in kept], [_number(v) for v in kept]


def linear_ticks(lo: float, hi: float, rows: int) -> tuple[list[float], list[str]]:
    """Ticks for a linear axis lo..hi on `rows` rows (or places for a label along x): round
    steps (1, 2 or 5 times a power of ten), at most seven and at least a row apart, each
    labelled distinctly (the step's digits); its ends when fewer than two round values fall
    inside."""
    most = max(min(rows, 7), 2)
    raw = max((hi - lo) / (most - 1), _gap(lo, hi, rows))
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw - 1e-12 * power)
    first = math.ceil(lo / step - 1e-9)
    values = [k * step for k in range(first, math.floor(hi / step + 1e-9) + 1)]
    if len(values) < 2:
        values = [lo, hi]
        step = (hi - lo) / 2
    top = max(abs(lo), abs(hi))
    return values, [_tick_label(v, step, top) for v in values]


def x_ticks(lo: float, hi: float, columns: int) -> tuple[list[float], list[str]]:
    """Round steps along an x axis `columns` wide, each label with two columns to spare."""
    places = max(2, columns // 6)
    while True:
        values, labels = linear_ticks(lo, hi, places)
        if places == 2 or len(values) * (max(map(len, labels)) + 2) <= columns:
            return values, labels
        places -= 1


def _tick_label(v: float, step: float, top: float) -> str:
    """v with as many digits as its axis's step needs, so no two ticks read alike: fixed
    decimals, or a power of ten where they would be many (top: the axis's largest |value|)."""
    if abs(v) < step * 1e-9:
        return "0"
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    if decimals <= 6 and top < 1e9:
        return f"{v:.{decimals}f}"
    digits = max(0, math.floor(math.log10(max(top, step))) - math.floor(math.log10(step)
                                                                        + 1e-9))
    return f"{v:.{digits}e}"


def fitted(text: str, width: int) -> str:
    """A title that fits: cut at its last " (" and then its ": " while it does not (plotext
    drops a title wider than the chart)."""
    for cut in (" (", ": "):
        if len(text) > width and cut in text:
            text = text[:text.rindex(cut)]
    return text


LEGEND_SHARE = 3    # a legend inside a chart takes at most a third of its rows, else below


def legend_row(lines: Sequence[Line], width: int) -> str:
    """The legend as one row under the chart (ANSI, at most `width` columns): each line's
    label in its colour, · for a faint line and ━ for a bold one; "+N" for those left out."""
    out, used = [], 0
    for i, line in enumerate(lines):
        entry = f"{'·' if line.faint else '━'} {shown(line.label, 60)}"    # (data: text)
        more = f"+{len(lines) - i}"
        if used + len(entry) + (len(more) + 2 if i < len(lines) - 1 else 0) > width:
            out.append(more if used + len(more) <= width else "")
            break
        out.append(plotext.colorize(entry, COLOURS[line.colour % len(COLOURS)]))
        used += len(entry) + 2
    return "  ".join(x for x in out if x)


def chart(lines: Sequence[Line], note: str, xlabel: str, ylabel: str, width: int,
          height: int, theme: str, log_y: bool = False, empty: str = "") -> str:
    """The plotext chart of `lines` at width x height, as ANSI text (any thread). With log_y
    the lines hold log10 values and the ticks are labelled in the data's units. Where
    plotext's legend (a row a line, over the curves' start) would take more than a third
    of the rows (at 80x24: 4 of 6), it is one row under the chart instead."""
    drawable = [(line, pts) for line in lines
                if (pts := [(x, y) for x, y in zip(line.xs, line.ys, strict=True)
                            if isinstance(y, (int, float)) and math.isfinite(y)])]
    below = len(drawable) * LEGEND_SHARE > height - 5
    height -= 1 if below else 0
    plt = Plot()
    plt.plotsize(width, height)
    plt._set_size(width, height)
    plt.theme(theme)
    drawn = 0
    xs: list[float] = []
    ys: list[float] = []
    for line, pts in drawable:
        colour = COLOURS[line.colour % len(COLOURS)]
        plt.plot([p[0] for p in pts], [p[1] for p in pts], label=None if below else line.label,
                 color=colour, marker="dot" if line.faint else "braille")
        drawn += 1
        xs += [p[0] for p in pts]
        ys += [p[1] for p in pts]
    if xs and min(xs) < max(xs):
        plt.xticks(*x_ticks(min(xs), max(xs), width - 8))
    if ys and min(ys) == max(ys):
        # A constant (two identical runs' |Δloss| is 0 throughout): one tick, on the line,
        # instead of plotext's -1..1 whose nearest tick reads 0.33.
        c = ys[0]
        plt.ylim(c, c + 1) if c >= 0 else plt.ylim(c - 1, c)
        plt.yticks([c], [_number(10 ** c if log_y else c)])
    elif ys:
        rows = height - 5          # the canvas between the title, the frame and the x axis
        ticks = log_ticks if log_y else linear_ticks
        plt.yticks(*ticks(min(ys), max(ys), rows))
    plt.xlabel(xlabel)
    plt.ylabel(ylabel)
    plt.title(note if drawn else fitted(empty or NO_DATA, width - 4))
    built = plt.build()
    return built.rstrip("\n") + "\n" + legend_row([line for line, _ in drawable], width) \
        if below else built
