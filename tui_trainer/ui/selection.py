"""What the user has picked, and the screen state saved with the session: plain objects.

No Textual and no SQLite here: the app keeps the values in reactives and asks these what
follows from them (which runs the plots show, which pair is compared); the saved state is
checked against the session it is restored into.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable

from ..core.settings import config
from ..core.analysis.study import sweep_groups
from ..core.analysis.plotdata import X_AXES, PlotOptions

SAVED_PLOT_OPTIONS = ("x", "smoothing", "last", "log_y")     # not the width: the terminal's
MAX_SHOWN = 8           # runs drawn at once: one colour each (panels.common.COLOURS)


@dataclass(frozen=True)
class Selection:
    """The marked runs (in the order marked), the pair, and the run under the cursor."""
    marked: tuple[int, ...] = ()
    pair: tuple[int, ...] = ()
    cursor: int | None = None

    def current_pair(self, runs: dict[int, Any]) -> tuple[int, int] | None:
        """The pair the Divergence tab explains: the pair set (F5, F6, an A/B row), else the
        last two marked, else the run under the cursor and its twin."""
        if len(self.pair) == 2:
            return self.pair[0], self.pair[1]
        if len(self.marked) >= 2:
            return self.marked[-2], self.marked[-1]
        run = runs.get(self.cursor) if self.cursor is not None else None
        if run is not None:
            if run.twin_of:
                return run.twin_of, run.id
            twins = [r.id for r in runs.values() if r.twin_of == run.id]
            if twins:
                return run.id, twins[-1]
        return None

    def plotted(self) -> list[int]:
        """The runs the Plots tab draws: the marked ones, else the one under the cursor."""
        if self.marked:
            return list(self.marked[:MAX_SHOWN])
        return [self.cursor] if self.cursor is not None else []

    def compared(self, runs: dict[int, Any]) -> list[int]:
        """The pair, or every marked run when more than two are marked."""
        if len(self.marked) > 2:
            return list(self.marked[:MAX_SHOWN])
        return list(self.current_pair(runs) or ())

    def marked_sweep(self, studies: Iterable[dict[str, Any]]) -> tuple[str, list[int]] | None:
        """The seed sweep whose runs are marked (at least two of them), if one is."""
        if len(self.marked) < 2:
            return None
        for name, members in sweep_groups(tuple(studies)):
            mine = [r for r in self.marked if r in members]
            if len(mine) >= 2:
                return name, mine
        return None

    def toggled(self, run_id: int) -> Selection:
        """Space on a run: marked or unmarked; two marked or more make the last two the
        pair; a run unmarked leaves the pair too (the pair follows the user: Compare,
        Divergence and Model then show the run under the cursor, or the marks)."""
        if run_id in self.marked:
            marked = tuple(r for r in self.marked if r != run_id)
            pair = tuple(r for r in self.pair if r != run_id)
        else:
            marked, pair = (*self.marked, run_id), self.pair
        return replace(self, marked=marked, pair=marked[-2:] if len(marked) >= 2 else pair)

    def cleared(self) -> Selection:
        """No mark and no pair (u, the palette's "Clear marks and pair"): the tabs follow
        the cursor."""
        return Selection((), (), self.cursor)

    def without(self, run_id: int) -> Selection:
        """A deleted run leaves every part of the selection."""
        return Selection(tuple(r for r in self.marked if r != run_id),
                         tuple(r for r in self.pair if r != run_id),
                         None if self.cursor == run_id else self.cursor)

    def kept(self, ids: set[int]) -> Selection:
        """Only runs the session has (a saved state may name runs deleted since)."""
        return Selection(tuple(r for r in self.marked if r in ids),
                         tuple(r for r in self.pair if r in ids),
                         self.cursor if self.cursor in ids else None)


@dataclass(frozen=True)
class ScreenState:
    """What reopening a session restores: the selection, the tab, the study shown, the
    form's values and the plot options. Saved as JSON in the session's meta table."""
    selection: Selection = field(default_factory=Selection)
    tab: str | None = None
    study: int | None = None
    form: dict[str, Any] | None = None
    plots: PlotOptions | None = None

    def to_json(self) -> str:
        s = self.selection
        return json.dumps({"marked": list(s.marked), "pair": list(s.pair), "cursor": s.cursor,
                           "tab": self.tab, "study": self.study, "form": self.form,
                           "plots": {k: v for k, v in asdict(self.plots).items()
                                     if k in SAVED_PLOT_OPTIONS} if self.plots else None})

    @classmethod
    def restored(cls, raw: str | None, runs: set[int], studies: list[int],
                 tabs: Iterable[str]) -> ScreenState:
        """A saved state, checked against the session: runs and studies it no longer has
        are dropped, a tab or plot options or form from another version are ignored, and
        without a saved study the newest is shown. Never raises for what a file holds."""
        try:
            saved = json.loads(raw) if raw else {}
        except ValueError:
            saved = {}
        if not isinstance(saved, dict):
            saved = {}

        def ids(key: str) -> tuple[int, ...]:
            value = saved.get(key)
            return tuple(r for r in value if isinstance(r, int) and not isinstance(r, bool)) \
                if isinstance(value, list) else ()

        cursor = saved.get("cursor")
        selection = Selection(ids("marked"), ids("pair"),
                              cursor if isinstance(cursor, int) and not isinstance(cursor, bool)
                              else None).kept(runs)
        study = saved.get("study")
        if study not in studies:
            study = max(studies) if studies else None
        plots = _plot_options(saved.get("plots"))
        form = None
        if isinstance(saved.get("form"), dict):
            try:
                form = config.from_dict(saved["form"]).to_dict()
            except config.ConfigError:
                form = None         # a form saved by another version: the defaults
        tab = saved.get("tab") if saved.get("tab") in set(tabs) else None
        return cls(selection, tab, study, form, plots)


def _plot_options(saved: Any) -> PlotOptions | None:
    """Saved plot options, if every one is known and allowed (else another version's)."""
    if not isinstance(saved, dict) or not set(saved) <= set(SAVED_PLOT_OPTIONS):
        return None
    o = PlotOptions(**saved)
    number = (int, float)
    ok = (o.x in X_AXES and isinstance(o.smoothing, number) and 0 <= o.smoothing < 1
          and isinstance(o.last, int) and o.last >= 0 and isinstance(o.log_y, bool))
    return o if ok else None
