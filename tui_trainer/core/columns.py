"""Which columns of a table fit the width at hand: the one rule for the dashboard's tables
and the command line's (as `ls` and `git` fit the terminal). Columns are taken in priority
order while they fit and shown in their own order; one free-text column may take what is
left, cut. What is left out is reachable elsewhere (a key, `--json`, an export).

Core layer: standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Fit:
    shown: list[int]            # column indices to show, in display order
    left_out: list[int]         # column indices that did not fit
    stretch_width: int | None   # the width the stretch column is cut to, if it is shown


def fit(widths: Sequence[int], priority: Sequence[int], available: int | None, gap: int = 2,
        stretch: int | None = None, min_stretch: int = 12) -> Fit:
    """`widths[i]`: column i's natural width (its widest cell or heading); `priority`: the
    columns, most important first (any not named come last, in order); `gap`: the cells
    between two columns. `stretch`, if given, is a free-text column: when its turn comes and
    its natural width does not fit, it takes what is left (at least `min_stretch` cells) and
    its cells are cut to `stretch_width`. With `available` None everything is shown."""
    n = len(widths)
    if available is None:
        return Fit(list(range(n)), [], None)
    order = [i for i in priority if 0 <= i < n]
    order += [i for i in range(n) if i not in order]
    chosen: set[int] = set()
    used = 0
    stretch_width = None
    for i in order:
        gap_here = gap if chosen else 0
        if used + gap_here + widths[i] <= available:
            chosen.add(i)
            used += gap_here + widths[i]
        elif i == stretch and available - used - gap_here >= min(min_stretch, widths[i]):
            chosen.add(i)
            stretch_width = available - used - gap_here
            used = available
    if stretch in chosen and stretch_width is None:
        stretch_width = widths[stretch]
    shown = [i for i in range(n) if i in chosen]
    return Fit(shown, [i for i in range(n) if i not in chosen], stretch_width)


def cut(text: str, width: int | None) -> str:
    """`text` cut to `width` cells with an ellipsis (None: as it is)."""
    if width is None or len(text) <= width:
        return text
    return text[:max(0, width - 1)] + "…"
