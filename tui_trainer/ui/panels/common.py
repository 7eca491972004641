"""What every panel shares: text from data as plain text, colours per run, shown figures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from ...core import figures
from ...core.reader import RunRow, Snapshot
from ...core.text import shown
from ..selection import MAX_SHOWN, Selection

# Each run keeps one colour in every panel (plotext colour names).
COLOURS = ("cyan", "orange", "green", "magenta", "blue", "red", "yellow", "white")
assert len(COLOURS) == MAX_SHOWN        # the selection draws at most one run per colour


@dataclass(frozen=True)
class Tick:
    """What every panel is given to draw, one snapshot at a time (`draw(tick)`): the
    session as last read, the user's selection, and what the polling thread computed for
    the visible tab. A panel keeps a key of what it drew and skips a tick that changes
    nothing it shows."""
    snap: Snapshot
    runs: dict[int, RunRow]
    selection: Selection
    study: int | None = None                # the A/B study shown
    awaiting_twin: int | None = None        # a check (F7/F8) whose twin has not started
    lines: dict | None = None               # the Plots tab's lines, when it is visible
    starting: frozenset[int] = frozenset()  # runs this dashboard is starting
    explaining: tuple[int, int, float] | None = None    # A, B, seconds since it started
    profiling: tuple[tuple[int, ...], float] | None = None  # runs, seconds since it started
    activating: tuple[tuple[int, ...], float] | None = None  # runs, seconds since it started


def plain(text: object, limit: int | None = 60) -> Text:
    """Text from data as a plain-text cell or label: never markup, control characters
    shown escaped, cut to `limit`."""
    return Text(shown(text, limit), no_wrap=True, end="")


def fig(value: Any, key: str) -> str:
    return figures.fmt(value, key)


def label(rid: int, runs: dict[int, Any]) -> str:
    """A run as `id name`, safe to show (the name from data is escaped and cut)."""
    run = runs.get(rid)
    return f"{rid} {shown(run.name, 30)}" if run else str(rid)


class Table(DataTable):
    """A DataTable whose lines are drawn again when its column widths change.

    DataTable measures new rows' widths when it is next idle and keeps the lines it drew
    before, keyed by an update count that this measuring does not change: a line drawn in
    between (the first screen, a busy machine) stayed on the screen at the old widths (the
    run table showed "[@cl" and "finish" above rows drawn in full). The count is moved on
    here so that every line is drawn again with the widths measured."""

    def _update_dimensions(self, new_rows: Any) -> None:
        super()._update_dimensions(new_rows)
        self._update_count += 1
        self.refresh()

    # DataTable keys the lines and cells it drew by its update count, and keeps up to
    # 10,000 cells and 1,000 lines of them: entries of an older count are never used again
    # but stayed until evicted. With four runs training, the run table's cells change twice
    # a second and these dead entries (each a list of Segments) grew by 3,000 objects a
    # second, until Python's full collections took 100-270 ms, a key waiting behind each
    # (issue 18, measured with gc.callbacks). When the count moves on, they go.
    _DRAWN = ("_row_render_cache", "_cell_render_cache", "_row_renderable_cache",
              "_line_cache", "_offset_cache", "_ordered_row_cache")

    @property
    def _update_count(self) -> int:
        return self.__count

    @_update_count.setter
    def _update_count(self, value: int) -> None:
        self.__count = value
        for name in self._DRAWN:
            cache = self.__dict__.get(name)
            if cache is not None:
                cache.clear()
