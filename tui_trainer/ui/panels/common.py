"""What every panel shares: text from data as plain text, colours per run, shown figures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.binding import Binding
from textual.widget import Widget
from textual.widgets import DataTable, TabbedContent

from ...core.analysis import figures
from ...core.session.reader import RunRow, Snapshot
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
    checking: tuple[int, Any] | None = None     # the check (F7/F8) under way: run, process


def tabs_of(panel: Widget) -> TabbedContent:
    """The TabbedContent a tab's panel is shown in."""
    return next(a for a in panel.ancestors if isinstance(a, TabbedContent))


def show_tab(panel: Widget) -> None:
    """Shows the panel's own tab."""
    tabs_of(panel).active = panel.TAB


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


def active_scroller(app: Any) -> Widget | None:
    """The part of the tab shown that scrolls (the Plots tab's charts, Compare, ...): where
    PageDown, End and the arrows go when the focus cannot use them (the tab strip, the run
    table past its last row). None where nothing in it scrolls."""
    tabs = app.query_one("#tabs", TabbedContent)
    pane = tabs.active_pane
    if pane is None:
        return None
    return next((w for w in (pane, *pane.walk_children(Widget))
                 if w.display and w.allow_vertical_scroll and w.max_scroll_y > 0), None)


# Keys the app takes where the focus does not (the tab strip, a button): the tab's pane
# scrolls (issue 68: from where the focus landed, PageDown, Down and End did nothing).
PANE_KEYS = [Binding(key, f"scroll_pane('{how}')", show=False)
             for key, how in (("pagedown", "page_down"), ("pageup", "page_up"),
                              ("down", "down"), ("up", "up"), ("end", "end"),
                              ("home", "home"))]


class Table(DataTable):
    """A DataTable whose lines are drawn again when its column widths change.

    DataTable measures new rows' widths when it is next idle and keeps the lines it drew
    before, keyed by an update count that this measuring does not change: a line drawn in
    between (the first screen, a busy machine) stayed on the screen at the old widths (the
    run table showed "[@cl" and "finish" above rows drawn in full). The count is moved on
    here so that every line is drawn again with the widths measured."""

    # A table that shows all its rows (height auto: Compare's, A/B's) in a pane that
    # scrolls: PageUp and PageDown scroll the pane, and so do Up past its first row and
    # Down past its last (issue 55: the keyboard could not scroll Compare or A/B).
    def _pane(self) -> Widget | None:
        if self.max_scroll_y > 0:
            return None
        return next((a for a in self.ancestors
                     if isinstance(a, Widget) and a.allow_vertical_scroll), None)

    def action_page_down(self) -> None:
        pane = self._pane()
        pane.scroll_page_down(animate=False) if pane else super().action_page_down()

    def action_page_up(self) -> None:
        pane = self._pane()
        pane.scroll_page_up(animate=False) if pane else super().action_page_up()

    def action_cursor_down(self) -> None:
        pane = self._pane()
        if pane is not None and (self.cursor_type == "none" or not self.show_cursor
                                 or self.cursor_row >= self.row_count - 1):
            pane.scroll_down(animate=False)
        else:
            super().action_cursor_down()

    def action_cursor_up(self) -> None:
        pane = self._pane()
        if pane is not None and (self.cursor_type == "none" or not self.show_cursor
                                 or self.cursor_row <= 0):
            pane.scroll_up(animate=False)
        else:
            super().action_cursor_up()

    def action_cursor_right(self) -> None:
        """With a row cursor, Right shows the next column at the left edge (after the fixed
        ones): every column of a wide table is a few key presses away, not one character
        each (issue 55: the A/B table's accuracy sat some 100 presses to the right)."""
        if self.cursor_type != "row" or not self.show_cursor:
            return super().action_cursor_right()
        self._set_hover_cursor(False)
        starts = self._column_starts()
        later = [x for x in starts if x > self.scroll_x]
        self.scroll_to(x=min(later[0], self.max_scroll_x) if later else self.max_scroll_x,
                       animate=False)

    def action_cursor_left(self) -> None:
        """With a row cursor, Left shows the column before the leftmost one shown."""
        if self.cursor_type != "row" or not self.show_cursor:
            return super().action_cursor_left()
        self._set_hover_cursor(False)
        earlier = [x for x in self._column_starts() if x < self.scroll_x]
        self.scroll_to(x=earlier[-1] if earlier else 0, animate=False)

    def _column_starts(self) -> list[int]:
        """Where each scrolling column begins (scroll_x that puts it first)."""
        starts, x = [], 0
        for column in self.ordered_columns[self.fixed_columns:]:
            starts.append(x)
            x += column.get_render_width(self)
        return starts

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
