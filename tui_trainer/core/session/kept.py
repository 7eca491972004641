"""An ended run's figures, computed once from its rows and kept with the run
(issue 56): `SessionStore.figures_of` is the one way to read a run's figures.

Core layer: imports neither torch nor textual.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Callable

from ..analysis import figures
from ..errors import DiskFull, SessionError
from .schema import ENDED, KEPT_FOR

# How many ended runs without kept figures make figures_of say what it computes first.
SAY_BEHIND = 20


class KeptFigures:
    """SessionStore's kept figures (the module's docstring); mixed into SessionStore."""

    # --- figures: computed once a run has ended, kept with it -----------------------------
    def figures_of(self, runs: list[dict[str, Any]],
                   computed: list[tuple[dict[str, Any], figures.Figures]] | None = None,
                   say: Callable[[str], None] | None = None) -> dict[int, figures.Figures]:
        """Each run's figures (core.analysis.figures, the one definition), by run id. An
        ended run's are the ones kept when it ended, while the run is as it was then (its
        status, step and end time, and the figures' VERSION); otherwise, and for a kept record that does
        not read back (damaged), they are computed from its rows. An ended run's computed
        figures go to `computed`, and are kept where this store writes (a session from
        before they were kept: computed once, then read). `say` hears what a long
        computation waits for before it starts."""
        kept_rows = self._kept_rows([r["id"] for r in runs])
        kept = {r["id"]: _restored(kept_rows.get(r["id"]), r) for r in runs}
        behind = [r for r in runs if kept[r["id"]] is None
                  and r.get("stored_status", r.get("status")) in ENDED]
        if say is not None and len(behind) >= SAY_BEHIND:
            say(f"computing the figures of {len(behind)} ended runs from their rows, once "
                "(kept from now on: this session was written before they were kept)")
        out: dict[int, figures.Figures] = {}
        fresh = []
        for run in runs:
            f = kept[run["id"]]
            if f is None:
                f = self._from_rows(run["id"])
                if run.get("stored_status", run.get("status")) in ENDED:
                    fresh.append((run, f))
            out[run["id"]] = f
        if computed is not None:
            computed.extend(fresh)
        self.keep_figures(fresh)
        return out

    def run_figures(self, run: dict[str, Any]) -> figures.Figures:
        """One run's figures (figures_of)."""
        return self.figures_of([run])[run["id"]]

    def kept_figures(self, run: dict[str, Any]) -> figures.Figures | None:
        """The figures kept for an ended run while they still stand for it, else None."""
        return _restored(self._kept_rows([run["id"]]).get(run["id"]), run)

    def keep_figures(self, computed: list[tuple[dict[str, Any], figures.Figures]]) -> bool:
        """Keeps figures computed from the rows of runs (as read then) that had ended, each
        only while its run is still as it was read (a Continue since then keeps nothing).
        Keeping saves later readers time and nothing more: on a read-only or full disk
        nothing is kept, and False says so."""
        if self.readonly or not computed:
            return False
        try:
            with self.transaction() as c:
                for run, f in computed:
                    self._keep(c, run["id"], f, "status = ? AND step = ? AND ended IS ?",
                               (run.get("stored_status", run.get("status")), run["step"],
                                run["ended"]))
            return True
        except (DiskFull, SessionError):
            return False

    def _keep_after(self, run_id: int, f: figures.Figures) -> None:
        """Keeps an ended run's figures once its end is stored, in a transaction of their
        own: on a full disk the end's small update may fit where they do not, and the end
        counts (a reader that can write keeps them later)."""
        try:
            with self.transaction() as c:
                self._keep(c, run_id, f, f"status IN ({','.join('?' * len(ENDED))})", ENDED)
        except (DiskFull, SessionError):
            pass

    def _keep(self, c: sqlite3.Connection, run_id: int, f: figures.Figures,
              only_if: str = "1", args: tuple = ()) -> None:
        """Keeps a run's figures with the run as it is in this transaction (its status,
        step and end time), where the run's row also meets `only_if`."""
        c.execute("INSERT OR REPLACE INTO kept_figures (run_id, version, status, step, ended, "
                  f"state) SELECT id, ?, status, step, ended, ? FROM runs WHERE id = ? AND "
                  f"({only_if})", (figures.VERSION, _state_json(f), run_id, *args))

    def _kept_rows(self, run_ids: list[int]) -> dict[int, sqlite3.Row]:
        if "kept_figures" not in self._tables or not run_ids:
            return {}
        if len(run_ids) > 100:        # most of a session: one read of the (small) table
            rows = self._q("SELECT * FROM kept_figures")
        else:
            rows = self._q(f"SELECT * FROM kept_figures WHERE run_id IN "
                           f"({','.join('?' * len(run_ids))})", tuple(run_ids))
        return {r["run_id"]: r for r in rows}

    def _from_rows(self, run_id: int) -> figures.Figures:
        return figures.figures(self.steps(run_id), self.evals(run_id))


def _state_json(f: figures.Figures) -> str:
    return json.dumps(f.state())     # floats as repr: read back bit for bit (NaN, inf too)


def _restored(row: sqlite3.Row | None, run: dict[str, Any]) -> figures.Figures | None:
    """Kept figures that stand for the run as it is now, else None (none kept, kept for the
    run as it was before a Continue, by another definition of the figures, or damaged)."""
    if row is None or row["version"] != figures.VERSION or row["step"] != run.get("step") \
            or row["status"] != run.get("stored_status", run.get("status")) \
            or row["status"] not in KEPT_FOR or row["ended"] != run.get("ended"):
        return None
    try:
        state = json.loads(row["state"])
    except (TypeError, ValueError):
        return None
    return figures.Figures.restore(state) if figures.valid_state(state) else None
