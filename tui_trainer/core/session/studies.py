"""A session's studies (A/B studies and seed sweeps): their planned runs, their status,
and studies whose process is gone.

Core layer: imports neither torch nor textual.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from typing import Any

from ..errors import NotFound
from ..processes.liveness import process_alive, process_start_time
from ..settings.recorded import as_recorded
from .schema import STATUSES

_STUDY_GONE = "the study process is gone; run it again to continue"


class StudyRecords:
    """SessionStore's studies (the module's docstring); mixed into SessionStore."""

    # --- studies (A/B) ---------------------------------------------------------------------
    def create_study(self, kind: str, name: str, spec: dict[str, Any],
                     variants: list[dict[str, Any]]) -> int:
        """A study and its planned variants (label, key, value, config), in order; their runs
        are created when each one starts."""
        with self.transaction() as c:
            cur = c.execute("INSERT INTO studies (name, created, kind, spec, status) "
                            "VALUES (?, ?, ?, ?, 'created')",
                            (name, time.time(), kind, json.dumps(spec)))
            study_id = int(cur.lastrowid)
            c.executemany(
                "INSERT INTO study_runs (study_id, position, label, key, value, config) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(study_id, i, v["label"], v.get("key"), json.dumps(v.get("value")),
                  json.dumps(v["config"])) for i, v in enumerate(variants)])
        return study_id

    def study(self, study_id: int) -> dict[str, Any]:
        rows = self._q("SELECT * FROM studies WHERE id = ?", (study_id,)) \
            if self._has_studies else []
        if not rows:
            raise NotFound(f"no study {study_id} in session {self.dir}")
        return self._study_dict(rows[0])

    def studies(self) -> list[dict[str, Any]]:
        if not self._has_studies:              # an old session opened read-only
            return []
        return [self._study_dict(r) for r in self._q("SELECT * FROM studies ORDER BY id")]

    def _study_dict(self, row: sqlite3.Row) -> dict[str, Any]:
        study = dict(row)
        if study["status"] == "running" and not process_alive(study["pid"],
                                                              study["pid_started"]):
            study["status"] = "crashed"
            study["message"] = _STUDY_GONE
        study["spec"] = json.loads(study["spec"])
        study["variants"] = []
        for r in self._q("SELECT * FROM study_runs WHERE study_id = ? ORDER BY position",
                         (study["id"],)):
            v = dict(r)
            v["value"] = json.loads(v["value"]) if v["value"] is not None else None
            # an arm stored by an earlier version: as it ran (core/settings/recorded.py)
            v["config"] = as_recorded(json.loads(v["config"]))[0]
            study["variants"].append(v)
        return study

    def set_study_status(self, study_id: int, status: str, message: str | None = None,
                         pid: int | None = None) -> None:
        assert status in STATUSES, status
        now = time.time()
        with self.transaction() as c:
            if status == "running":
                pid = pid or os.getpid()
                c.execute("UPDATE studies SET status = ?, pid = ?, pid_started = ?, "
                          "ended = NULL, message = ? WHERE id = ?",
                          (status, pid, process_start_time(pid), message, study_id))
            else:
                c.execute("UPDATE studies SET status = ?, pid = NULL, ended = ?, message = ? "
                          "WHERE id = ?", (status, now, message, study_id))

    def set_study_run(self, study_id: int, position: int, run_id: int | None,
                      note: str | None = None) -> None:
        with self.transaction() as c:
            c.execute("UPDATE study_runs SET run_id = ?, note = ? "
                      "WHERE study_id = ? AND position = ?", (run_id, note, study_id, position))

    def add_study_runs(self, study_id: int, variants: list[dict[str, Any]],
                       spec: dict[str, Any]) -> list[int]:
        """More planned runs for a study (a round added, a loaded round trained again), at
        the next positions, and the spec that places them; in one transaction. Returns
        their positions."""
        with self.transaction() as c:
            top = c.execute("SELECT COALESCE(MAX(position), -1) FROM study_runs "
                            "WHERE study_id = ?", (study_id,)).fetchone()[0]
            positions = list(range(top + 1, top + 1 + len(variants)))
            c.executemany(
                "INSERT INTO study_runs (study_id, position, label, key, value, config) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(study_id, p, v["label"], v.get("key"), json.dumps(v.get("value")),
                  json.dumps(v["config"])) for p, v in zip(positions, variants, strict=True)])
            c.execute("UPDATE studies SET spec = ? WHERE id = ?", (json.dumps(spec), study_id))
        return positions

    def set_study_spec(self, study_id: int, spec: dict[str, Any]) -> None:
        with self.transaction() as c:
            c.execute("UPDATE studies SET spec = ? WHERE id = ?", (json.dumps(spec), study_id))

    def _reconcile_studies(self) -> None:
        """A study whose runner process is gone is marked crashed (it can be continued)."""
        if not self._has_studies:
            return
        for r in self._q("SELECT id, pid, pid_started FROM studies WHERE status = 'running'"):
            if not process_alive(r["pid"], r["pid_started"]):
                with self.transaction() as c:
                    c.execute("UPDATE studies SET status = 'crashed', pid = NULL, ended = ?, "
                              "message = ? WHERE id = ? AND status = 'running'",
                              (time.time(), _STUDY_GONE, r["id"]))
