"""Following runs as they train: each run's series, read incrementally from the store.

A cursor per run and table (the largest row id seen) means each poll reads only new rows,
however long the run. A resumed run re-records steps after its checkpoint; those rows arrive
again with new ids and replace the old values of the same step.

Core layer: imports neither torch nor textual.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .store import SessionStore


@dataclass
class RunSeries:
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    evals: dict[int, dict[str, Any]] = field(default_factory=dict)
    fingerprints: dict[int, dict[str, Any]] = field(default_factory=dict)
    cursors: dict[str, int] = field(default_factory=lambda: {"steps": 0, "evals": 0, "fps": 0})
    version: int = 0      # bumped whenever new rows arrive

    def rows(self, table: str) -> list[dict[str, Any]]:
        d = {"steps": self.steps, "evals": self.evals, "fps": self.fingerprints}[table]
        return [d[k] for k in sorted(d)]

    def column(self, name: str) -> tuple[list[int], list[Any]]:
        rows = self.rows("steps")
        return [r["step"] for r in rows], [r.get(name) for r in rows]


class Watcher:
    def __init__(self, store: SessionStore):
        self.store = store
        self.series: dict[int, RunSeries] = {}

    def get(self, run_id: int) -> RunSeries:
        return self.series.setdefault(run_id, RunSeries())

    def poll(self, run_ids: list[int]) -> set[int]:
        """Reads new rows of these runs; returns the ids of runs that got any."""
        changed = set()
        for run_id in run_ids:
            s = self.get(run_id)
            new = False
            for table, target, read in (
                    ("steps", s.steps, self.store.steps),
                    ("evals", s.evals, self.store.evals),
                    ("fps", s.fingerprints, self.store.fingerprints)):
                rows = read(run_id, after_id=s.cursors[table])
                for r in rows:
                    target[r["step"]] = r
                    s.cursors[table] = max(s.cursors[table], r["id"])
                new = new or bool(rows)
            if new:
                s.version += 1
                changed.add(run_id)
        return changed

    def forget(self) -> None:
        self.series.clear()
