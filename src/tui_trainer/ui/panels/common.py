"""What every panel shares: text from data as plain text, colours per run, shown figures."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from ...core import figures as F
from ...core.text import shown

# Each run keeps one colour in every panel (plotext colour names).
COLOURS = ("cyan", "orange", "green", "magenta", "blue", "red", "yellow", "white")


def plain(text: object, limit: int | None = 60) -> Text:
    """Text from data as a plain-text cell or label: never markup, control characters
    shown escaped, cut to `limit`."""
    return Text(shown(text, limit), no_wrap=True, end="")


def fig(value: Any, key: str) -> str:
    return F.fmt(value, key)


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
