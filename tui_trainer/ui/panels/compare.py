"""The Compare tab: the compared runs side by side (the pair, or every marked run): the
settings that differ, each figure (core.analysis.figures) with its ratio to the first run, and their
training loss overlaid."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, Static

from ...core.analysis import figures, prices
from ...core.settings.recorded import BIT_RELEVANT_SETTINGS
from ...core.analysis.figures import smooth
from ...core.analysis.plotdata import Line
from ...core.session.reader import RunRow
from ...core.text import shown_lines
from ..widgets.plots import MetricPlot
from .common import Table, Tick, label, plain

LETTERS = "ABCDEFGH"
WINDOW = (f"{figures.WINDOW}; {figures.WALL}. A ratio is the run's value over A's: above 1 "
          "is faster for samples/s, slower for ms/step and wall time.")
SUMMARY = ("train_loss", "eval_loss", "accuracy", "samples_per_s", "peak_memory_mib", "wall_s")


def summary_rows(runs: list[RunRow]) -> list[list[str]]:
    """[figure label, value per run..., ratio of each later run to the first...]; then
    where a step's time went, phase by phase (ms per step), where the runs recorded it."""
    out = []
    for key in SUMMARY:
        values = [_value(r, key) for r in runs]
        ratios = [figures.ratio(v, values[0]) for v in values[1:]]
        out.append([figures.LABELS[key], *(figures.fmt(v, key) for v in values),
                    *("-" if q is None else f"{q:.2f}x" for q in ratios)])
        if key == "peak_memory_mib" and any(r.workers_mib for r in runs):
            values = [r.workers_mib or 0.0 for r in runs]
            ratios = [figures.ratio(v, values[0]) for v in values[1:]]
            out.append(["  of it, workers (USS)", *(figures.fmt(v, key) for v in values),
                        *("-" if q is None else f"{q:.2f}x" for q in ratios)])
    if all(r.phase_ms for r in runs):
        phases = [dict(r.phase_ms or ()) for r in runs]
        for key in figures.PHASES:
            values = [p.get(key) for p in phases]
            ratios = [figures.ratio(v, values[0]) for v in values[1:]]
            out.append([f"{key} ms/step", *("-" if v is None else f"{v:.2f}" for v in values),
                        *("-" if q is None else f"{q:.2f}x" for q in ratios)])
    return out


def speed_caveats(runs: list[RunRow]) -> list[str]:
    """The machine the compared runs trained on (or that they trained on different ones),
    and those whose speed is the machine's load as much as their knobs': trained crowded
    (threads beyond the free cores) or beside other busy processes."""
    machines = [prices.machine_key(r.settings) for r in runs]
    apart = prices.apart([r.settings for r in runs])
    where = [f"⚠ {apart}"] if apart else \
        [f"machine: {machines[0][1]}"] if all(machines) else []
    return where + [f"⚠ {x} = run {r.id}'s speed is not its knobs' alone: "
                    + (f"crowded, {r.crowded}" if r.crowded else str(r.loaded))
                    for x, r in zip(LETTERS, runs, strict=False) if r.crowded or r.loaded]


def _value(r: RunRow, key: str) -> Any:
    return {"train_loss": r.train_loss, "eval_loss": r.eval_loss, "accuracy": r.accuracy,
            "samples_per_s": r.samples_per_s, "peak_memory_mib": r.peak_memory_mib,
            "wall_s": r.elapsed}[key]


def settings_rows(runs: list[RunRow]) -> list[list[str]]:
    """Config keys whose values differ, then effective settings (⚠ where a difference can
    break bit-identity)."""
    out = []
    keys = sorted(set().union(*(r.config.keys() for r in runs)))
    for k in keys:
        values = [r.config.get(k) for r in runs]
        if len({repr(v) for v in values}) > 1:
            out.append([k, *map(str, values)])
    settings = [r.settings or {} for r in runs]
    for k in sorted(set().union(*(s.keys() for s in settings))):
        if k in ("data", "cpu"):    # (the processor: in words under the tables; its model
            continue                # and instruction set are rows of their own)
        values = [s.get(k) for s in settings]
        if len({repr(v) for v in values}) > 1:
            out.append([("⚠ " if k in BIT_RELEVANT_SETTINGS else "") + f"{k} (effective)",
                        *map(str, values)])
    return out or [["(same config)", *([""] * len(runs))]]


class ComparePanel(VerticalScroll):
    TAB, TITLE, PANEL_ID = "tab-compare", "Compare", "compare-panel"
    EXPORTS = "compared"        # ctrl+e here: the runs compared
    FOLLOWS_CURSOR = True       # a tick at once when the cursor moves

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._key: Any = None

    def compose(self) -> ComposeResult:
        yield Static("", id="compare-title")
        with Horizontal(id="compare-tables"):
            yield Table(id="compare-config", cursor_type="row")
            yield Table(id="compare-summary", cursor_type="row")
        yield Static(Text(WINDOW), id="compare-window")
        yield MetricPlot("train loss (smoothed)", "loss", id="plot-compare")

    def draw(self, tick: Tick) -> None:
        self.show(tick.selection.compared(tick.runs), tick.runs, tick.snap.series)

    def show(self, ids: list[int], runs: dict[int, RunRow], series: dict) -> None:
        title = self.query_one("#compare-title", Static)
        rows = [runs[r] for r in ids if r in runs]
        if len(rows) < 2:
            if self._key != "hint":
                self._key = "hint"
                title.update("Mark two runs or more (space in the run table) to compare them; "
                             "F6 compares the marked runs.")
            return
        key = (tuple(rows), tuple(series[r].version if r in series else 0 for r in ids))
        if key == self._key:
            return
        self._key = key
        letters = LETTERS[:len(rows)]
        two = " ⚠ different machines (below)" if prices.apart([r.settings for r in rows]) \
            else ""
        title.update(plain("    ".join(f"{x} = {label(r.id, runs)} ({r.status})"
                                       for x, r in zip(letters, rows, strict=False)) + two,
                           None))
        cfg = self.query_one("#compare-config", DataTable)
        cfg.clear(columns=True)
        cfg.add_columns("setting", *letters)
        for row in settings_rows(rows):
            cfg.add_row(*(plain(v) for v in row))
        summary = self.query_one("#compare-summary", DataTable)
        summary.clear(columns=True)
        summary.add_columns("", *letters, *(f"{x}/A" for x in letters[1:]))
        for row in summary_rows(rows):
            summary.add_row(*(plain(v) for v in row))
        self.query_one("#compare-window", Static).update(
            Text(shown_lines("\n".join([*speed_caveats(rows), WINDOW]))))
        lines = []
        for i, r in enumerate(rows):
            s = series.get(r.id)
            if s is None:
                continue
            xs = [x["step"] for x in s.steps]
            lines.append(Line(f"{letters[i]} {label(r.id, runs)}", xs,
                              smooth([x.get("loss") for x in s.steps]), i))
        self.query_one("#plot-compare", MetricPlot).show(lines, "train loss, smoothed")
