"""The session store: one SQLite database (WAL mode) per session directory.

It is the channel between a training process (which writes its own metrics, in small batched
transactions) and whoever reads them: the CLI, the dashboard, tests. Checkpoints and per-run
log files live beside the database:

    SESSION/session.sqlite
    SESSION/checkpoints/run-<id>/step-<step>.pt
    SESSION/logs/run-<id>.log

Beside it in core/session/: the schema and its helpers (schema.py), the figures kept for
ended runs (kept.py) and the studies (studies.py), both mixed into SessionStore, and a
training process's batched writer (writer.py).

Core layer: imports neither torch nor textual.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ... import __version__
from ..analysis import figures
from ..settings import config, recorded
from ..errors import DiskFull, NotFound, RunBusy, SessionError, is_disk_full
from ..processes.liveness import (dead_reason, is_live, process_alive, process_start_time,
                                  stalled_for, starting)
from . import upgrade
from .kept import KeptFigures
from .schema import (APP_ID, CHECKED, DB_NAME, ENDED, EVAL_COLUMNS, FINGERPRINT_COLUMNS,
                     INDEXES, OPTIONAL_COLUMNS, OPTIONAL_TABLES, SCHEMA, SCHEMA_VERSION,
                     STEP_COLUMNS, decode, encode, expected_columns, newer_schema,
                     refuse_as_new, refuse_newer, refuse_read_only, session_error, tx)
from .studies import StudyRecords


class SessionStore(KeptFigures, StudyRecords):
    """One session directory. Safe to open from several processes at once.

    Reading never writes: `run()` and `runs()` give each run's effective status (a run whose
    process is gone reads as crashed) without storing it; `reconcile()` stores it, and only
    writers call it. `readonly=True` opens the database read-only (a session on a read-only
    disk, or one being listed or exported), and nothing at all is written.
    """

    def __init__(self, directory: str | Path, create: bool = True, readonly: bool = False,
                 verify: bool = True):
        self.dir = Path(directory).expanduser().resolve()
        self.db_path = self.dir / DB_NAME
        self.readonly = readonly
        # SQLite's quick_check of the tables every command reads first (CHECKED): once per
        # process is enough; a second connection of the same process (the heartbeat) skips it.
        self.verify = verify
        self.checkpoints_dir = self.dir / "checkpoints"
        self.logs_dir = self.dir / "logs"
        refuse_as_new(self.dir)
        if not self.db_path.exists():
            if not create or readonly:
                raise SessionError(f"no session at {self.dir} (no {DB_NAME} there)")
            self._create()
        self._conn = self._connect()

    @classmethod
    def check(cls, directory: str | Path) -> None:
        """Refuses a session that exists but cannot be trained in (damaged, read-only, a
        deleted database), creating and writing nothing: commands call it before their slow
        start (importing torch, loading data), so such a session is refused at once."""
        d = Path(directory).expanduser().resolve()
        refuse_as_new(d)
        if (d / DB_NAME).exists():
            # The structure only: the full quick_check comes with the command's own open.
            cls(d, create=False, readonly=True, verify=False).close()
            refuse_read_only(d)

    # --- connection and schema -----------------------------------------------------------
    def _create(self) -> None:
        """A new session's database, built under a temporary name and linked into place, so
        nobody ever sees a half-made one (and two processes creating it at once agree)."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self.dir / f".{DB_NAME}.{os.getpid()}.tmp"
            tmp.unlink(missing_ok=True)
            conn = sqlite3.connect(tmp, isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                with tx(conn):
                    for stmt in SCHEMA.split(";"):
                        if stmt.strip():
                            conn.execute(stmt)
                    conn.executemany("INSERT INTO meta VALUES (?, ?)",
                                     [("app", APP_ID), ("schema", str(SCHEMA_VERSION)),
                                      ("created", str(time.time())),
                                      ("version", __version__),
                                      ("knobs", ",".join(sorted(config.FIELDS)))])
            finally:
                conn.close()
            try:
                os.link(tmp, self.db_path)
            except FileExistsError:
                pass                         # another process made it first: use theirs
            except OSError:
                # A filesystem without hard links: a rename is atomic too, though a racing
                # creator's file may then be replaced by this (equally new, empty) one.
                if not self.db_path.exists():
                    os.replace(tmp, self.db_path)
            finally:
                tmp.unlink(missing_ok=True)
        except OSError as e:
            if is_disk_full(e):
                raise DiskFull(self.dir) from None
            raise SessionError(f"cannot create a session in {self.dir}: "
                               f"{e.strerror or e}") from None
        except sqlite3.Error as e:
            raise session_error(self.db_path, e) from None

    def _connect(self) -> sqlite3.Connection:
        if self.db_path.stat().st_size == 0:
            raise SessionError(f"{self.db_path} is empty (0 bytes): the session's database is "
                               "lost. Nothing was written; its checkpoints and logs are still "
                               f"in {self.dir}")
        if not self.readonly:
            refuse_read_only(self.dir)
        refuse_newer(self.db_path)        # before SQLite makes any file beside it
        try:
            if self.readonly:
                immutable = not os.access(self.dir, os.W_OK) and \
                    not (self.dir / f"{DB_NAME}-shm").exists()
                conn = self._open_readonly(immutable)
            else:
                # The dashboard's writer is used from its worker threads, one at a time
                # (under a lock): the connection may move between threads.
                conn = sqlite3.connect(self.db_path, timeout=30.0, isolation_level=None,
                                       check_same_thread=False)
        except sqlite3.Error as e:
            raise SessionError(f"{self.db_path} cannot be opened: {e}") from None
        try:
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA busy_timeout = 30000")
            missing = self._check(conn)    # reads only: nothing written yet
            if not self.readonly:
                conn.execute("PRAGMA journal_mode = WAL")
                if missing:                 # a session from before these tables
                    with tx(conn):
                        for stmt in SCHEMA.split(";"):
                            if any(f"EXISTS {t} " in stmt for t in missing
                                   if isinstance(t, str)):
                                conn.execute(stmt)
                        for name in sorted(m[len("index:"):] for m in missing
                                           if isinstance(m, str) and m.startswith("index:")):
                            conn.execute(INDEXES[name])
                        for table, column in sorted(m for m in missing
                                                    if isinstance(m, tuple)):
                            have = {r[1] for r in conn.execute(
                                f"PRAGMA table_info('{table}')")}    # another opener's?
                            if column not in have:
                                kind = OPTIONAL_COLUMNS[table][column]
                                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} "
                                             f"{kind}")
                conn.execute("PRAGMA synchronous = NORMAL")
                conn.execute("PRAGMA foreign_keys = ON")
            else:
                conn.execute("PRAGMA query_only = ON")
            # an earlier version's session: what is assumed of its runs, said once
            self.upgrade_note = upgrade.check(conn, writable=not self.readonly)
            self._tables = OPTIONAL_TABLES - (missing if self.readonly else set())
            self._has_studies = "studies" in self._tables
            return conn
        except sqlite3.Error as e:
            conn.close()
            raise session_error(self.db_path, e) from None
        except SessionError:
            conn.close()
            raise

    def _open_readonly(self, immutable: bool) -> sqlite3.Connection:
        """A read-only connection. On a read-only or full disk SQLite may be unable to make
        its WAL index (-shm); nothing can be writing there then, so the file is read as it
        is (immutable)."""
        def connect(flag: bool) -> sqlite3.Connection:
            uri = f"file:{self.db_path}?mode=ro" + ("&immutable=1" if flag else "")
            return sqlite3.connect(uri, uri=True, timeout=30.0, isolation_level=None,
                                   check_same_thread=False)
        conn = connect(immutable)
        if immutable:
            return conn
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.OperationalError:
            conn.close()
            return connect(True)

    def _check(self, conn: sqlite3.Connection) -> set[str]:
        """Checks that the database is a tui-trainer session this version can use: the marker,
        the schema version, every table and column it needs, SQLite's own structural check.
        Returns the optional tables (added after schema 1) that are missing, the optional
        columns that are missing as (table, column), and the missing INDEXES as
        "index:NAME"."""
        tables = {r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        where = self.db_path
        if "meta" not in tables:
            raise SessionError(f"{where} is a SQLite file but not a tui-trainer session "
                               "(it has no meta table)")
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("app") != APP_ID:
            raise SessionError(f"{where} is a SQLite file but not a tui-trainer session "
                               "(no session marker in its meta table)")
        try:
            version = int(meta.get("schema", ""))
        except (TypeError, ValueError):
            raise SessionError(f"{where} is damaged: its schema version (meta.schema) is "
                               f"{str(meta.get('schema'))[:40]!r}, not a number") from None
        if version > SCHEMA_VERSION:
            raise SessionError(newer_schema(where, version))
        optional = OPTIONAL_TABLES
        missing_columns: set[tuple[str, str]] = set()
        for table, columns in expected_columns().items():
            if table not in tables:
                if table in optional:
                    continue
                raise SessionError(f"{where} is damaged: its table '{table}' is missing")
            have = {r[1] for r in conn.execute(f"PRAGMA table_info('{table}')")}
            optional_columns = set(OPTIONAL_COLUMNS.get(table, {}))
            missing_columns.update((table, c) for c in optional_columns - have)
            lacking = sorted(columns - have - optional_columns)
            if lacking:
                raise SessionError(f"{where} is damaged: table '{table}' lacks the column(s) "
                                   f"{', '.join(lacking)}")
        for table in CHECKED if self.verify else ():
            if table not in tables:
                continue
            check = conn.execute(f"PRAGMA quick_check('{table}')").fetchone()[0]
            if check != "ok":
                raise SessionError(f"{where} is damaged: SQLite's check of its table "
                                   f"'{table}' says {check}")
        indexes = {r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index'")}
        return set(optional - tables) | missing_columns | \
            {f"index:{name}" for name in INDEXES if name not in indexes}

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _q(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.Error as e:
            raise session_error(self.db_path, e) from None

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        if self.readonly:
            raise SessionError(f"{self.dir} was opened read-only; nothing can be written")
        try:
            with tx(self._conn):
                yield self._conn
        except sqlite3.Error as e:
            raise session_error(self.db_path, e) from None

    def touch(self) -> None:
        """Records that the session was used now (for listings of sessions)."""
        with self.transaction() as c:
            c.execute("INSERT OR REPLACE INTO meta VALUES ('last_used', ?)", (str(time.time()),))

    def copy_to(self, dest: str | Path) -> Path:
        """Copies the whole session (database, checkpoints, logs) to a new directory.
        The database goes through SQLite's online backup, so it is consistent even while
        runs are writing to it."""
        target = Path(dest).expanduser().resolve()
        if target.exists() and any(target.iterdir()):
            raise SessionError(f"{target} exists and is not empty; choose another name")
        target.mkdir(parents=True, exist_ok=True)
        for sub in ("checkpoints", "logs"):
            if (self.dir / sub).is_dir():
                shutil.copytree(self.dir / sub, target / sub,
                                ignore=shutil.ignore_patterns(".*.tmp"))
        dest_conn = sqlite3.connect(target / DB_NAME)
        try:
            self._conn.backup(dest_conn)
            self._mark_copied(dest_conn)
        finally:
            dest_conn.close()
        return target

    def _mark_copied(self, conn: sqlite3.Connection) -> None:
        """In a copy, runs and studies still training here are not training there: they
        read 'copied', with what they were and where, instead of turning 'crashed' once
        their heartbeat (which goes on here) looks stale, and no pid of this session's
        processes is left in the copy for a Stop to signal. A run or study whose process is
        already gone is left as it is: it reads crashed in the copy as it does here."""
        now = time.time()
        conn.row_factory = sqlite3.Row
        with conn:
            for r in conn.execute("SELECT * FROM runs WHERE status IN "
                                  "('running', 'created')").fetchall():
                if dead_reason(dict(r)) is not None:
                    continue
                what = (f"{r['status'] if r['status'] == 'running' else 'starting'} in "
                        f"{self.dir} when copied, at step {r['step']}; it trains on there, "
                        "this copy keeps it as it was (continue it here from its newest "
                        "checkpoint)")
                try:
                    summary = json.loads(r["summary"]) if r["summary"] else {}
                except ValueError:
                    summary = {}
                summary["copied"] = what
                conn.execute("UPDATE runs SET status = 'copied', pid = NULL, ended = ?, "
                             "summary = ? WHERE id = ?", (now, json.dumps(summary), r["id"]))
                conn.execute("INSERT INTO events (run_id, t, step, kind, message) "
                             "VALUES (?, ?, ?, ?, ?)", (r["id"], now, r["step"], "copied", what))
            tables = {t for (t,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "studies" in tables:
                for st in conn.execute("SELECT id, pid, pid_started FROM studies WHERE "
                                       "status = 'running'").fetchall():
                    if process_alive(st["pid"], st["pid_started"]):
                        conn.execute(
                            "UPDATE studies SET status = 'copied', pid = NULL, ended = ?, "
                            "message = ? WHERE id = ?",
                            (now, f"running in {self.dir} when copied; it goes on there "
                                  "(continue it here to train the rest)", st["id"]))

    def meta(self, key: str) -> str | None:
        rows = self._q("SELECT value FROM meta WHERE key = ?", (key,))
        return rows[0][0] if rows else None

    def set_meta(self, key: str, value: str) -> None:
        with self.transaction() as c:
            c.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    # --- runs ----------------------------------------------------------------------------
    def create_run(self, config: dict[str, Any], name: str | None = None,
                   twin_of: int | None = None) -> int:
        """A new run, status 'created'. Its pid is the creating process until the process
        that trains it is known (`set_launcher`) or claims it: a run whose process dies
        before it starts training then reads as crashed instead of 'created' forever."""
        pid = os.getpid()
        with self.transaction() as c:
            cur = c.execute(
                "INSERT INTO runs (name, created, config, status, twin_of, pid, pid_started, "
                "host) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                ("", time.time(), json.dumps(config), "created", twin_of, pid,
                 process_start_time(pid), socket.gethostname()))
            run_id = int(cur.lastrowid)
            c.execute("UPDATE runs SET name = ? WHERE id = ?", (name or f"run-{run_id}", run_id))
        return run_id

    def set_launcher(self, run_id: int, pid: int) -> None:
        """The process started to train a created run (until that process claims it)."""
        with self.transaction() as c:
            c.execute("UPDATE runs SET pid = ?, pid_started = ?, host = ? "
                      "WHERE id = ? AND status = 'created'",
                      (pid, process_start_time(pid), socket.gethostname(), run_id))

    def set_gpus(self, run_id: int, gpus: list[int]) -> None:
        """The GPUs the run's process was put on (core.processes.gpus; [] for none)."""
        with self.transaction() as c:
            c.execute("UPDATE runs SET gpus = ? WHERE id = ?", (json.dumps(gpus), run_id))

    def claim(self, run_id: int) -> None:
        """Makes this process the run's one writer and marks it running, atomically: a second
        process claiming a run that a live process trains gets RunBusy naming that process."""
        pid, now = os.getpid(), time.time()
        with self.transaction() as c:
            rows = c.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchall()
            if not rows:
                raise NotFound(f"no run {run_id} in session {self.dir}")
            run = dict(rows[0])
            if run["status"] == "running" and run["pid"] != pid and is_live(run):
                since = time.strftime("%H:%M:%S", time.localtime(run["started"] or now))
                raise RunBusy(f"run {run_id} is being trained by process {run['pid']} on "
                              f"{run['host']} (running since {since}); one process trains a "
                              "run at a time. Stop it first, or wait for it to end")
            c.execute("UPDATE runs SET status = 'running', pid = ?, pid_started = ?, host = ?, "
                      "heartbeat = ?, progressed = ?, started = COALESCE(started, ?), "
                      "ended = NULL WHERE id = ?",
                      (pid, process_start_time(pid), socket.gethostname(), now, now, now,
                       run_id))

    def heartbeat(self, run_id: int, progressed: float | None = None,
                  pace_s: float | None = None, busy: str | None = None,
                  crowded: Any = ...) -> None:
        """The training process is alive; `progressed`: when it last saw its step (or its
        other work) move; `pace_s`: its seconds per step so far; `busy`: what it does now
        besides stepping (None: training steps); `crowded`: while its threads outnumber the
        free cores, the note that says so (core.processes.contention.crowded), None once they fit
        again, Ellipsis (the default) to leave it as it is."""
        with self.transaction() as c:
            c.execute("UPDATE runs SET heartbeat = ?, progressed = COALESCE(?, progressed), "
                      "pace_s = COALESCE(?, pace_s), busy = ? WHERE id = ?",
                      (time.time(), progressed, pace_s, busy, run_id))
            if crowded is not ...:
                c.execute("UPDATE runs SET crowded = ? WHERE id = ?", (crowded, run_id))

    def set_progress(self, run_id: int, step: int, epoch: float) -> None:
        with self.transaction() as c:
            c.execute("UPDATE runs SET step = ?, epoch = ?, heartbeat = ? WHERE id = ?",
                      (step, epoch, time.time(), run_id))

    def set_settings(self, run_id: int, settings: dict[str, Any], dataset: str) -> None:
        """The run's effective settings, as the engine applied them (threads, device,
        versions, ...). Stored in the column `fingerprint` (its name since schema 1); read
        back as run["settings"]. Not to be confused with parameter fingerprints, the hashes
        of the parameters in the `fingerprints` table."""
        with self.transaction() as c:
            c.execute("UPDATE runs SET fingerprint = ?, dataset = ? WHERE id = ?",
                      (json.dumps(settings), dataset, run_id))

    def set_config(self, run_id: int, config: dict[str, Any]) -> None:
        with self.transaction() as c:
            c.execute("UPDATE runs SET config = ? WHERE id = ?", (json.dumps(config), run_id))

    def refused_to_start(self, run_id: int, reason: str, new: bool = False) -> None:
        """A run refused to train (a bad config here, a checkpoint that does not fit): crashed,
        the reason as a failure event; a `new` one (the dashboard's) removed, as by the CLI."""
        if new and self.run(run_id)["stored_status"] == "created":
            return self.delete_run(run_id, refused=True)
        self.add_event(run_id, "failure", f"refused to start: {reason}")
        self.end_run(run_id, "crashed", {"error": reason})

    def end_run(self, run_id: int, status: str, summary: dict[str, Any] | None = None,
                computed: figures.Figures | None = None) -> None:
        """Stores how a run ended, and its figures, computed once from its rows (the run's
        process wrote its last rows before; `computed`: what it computed from them just
        now): readers take them from then on."""
        assert status in ENDED, status
        kept = computed if computed is not None else self._from_rows(run_id)
        with self.transaction() as c:
            c.execute("UPDATE runs SET status = ?, ended = ?, summary = ?, pid = NULL "
                      "WHERE id = ?", (status, time.time(), json.dumps(summary or {}), run_id))
        self._keep_after(run_id, kept)

    def _run_dict(self, row: sqlite3.Row) -> dict[str, Any]:
        run = dict(row)
        for key in ("config", "fingerprint", "summary"):
            try:
                run[key] = json.loads(run[key]) if run[key] else None
            except (TypeError, ValueError):
                raise SessionError(f"{self.db_path} is damaged: the {key} of run {run['id']} "
                                   "is not valid JSON") from None
        try:    # the GPUs it holds (core.processes.gpus), as JSON; read as untrusted
            gpus = json.loads(run.get("gpus") or "null")
        except (TypeError, ValueError):
            gpus = None
        run["gpus"] = gpus if isinstance(gpus, list) else None
        # as the version that stored it ran it (knobs added since: core/settings/recorded.py)
        run["config"], run["assumed"], run["newer_knobs"] = recorded.as_recorded(run["config"])
        run["settings"] = recorded.settings_as_recorded(run.pop("fingerprint"))
        run["stored_status"] = run["status"]
        dead = dead_reason(run)
        if dead is not None:
            run["status"] = "crashed"
            run["summary"] = {**(run["summary"] or {}), "error": dead}
        run["stalled_s"] = stalled_for(run)
        return run

    def run(self, run_id: int) -> dict[str, Any]:
        """One run, with its effective status (a run whose process is gone reads crashed)."""
        rows = self._q("SELECT * FROM runs WHERE id = ?", (run_id,))
        if not rows:
            raise NotFound(f"no run {run_id} in session {self.dir}")
        return self._run_dict(rows[0])

    def runs(self) -> list[dict[str, Any]]:
        return [self._run_dict(r) for r in self._q("SELECT * FROM runs ORDER BY id")]

    def runs_where(self, after_id: int = 0, ids: list[int] = ()) -> list[dict[str, Any]]:
        """Runs with an id above `after_id` (new ones) and the runs `ids` (index reads)."""
        marks = ",".join("?" * len(ids))
        sql = "SELECT * FROM runs WHERE id > ?" + (f" OR id IN ({marks})" if ids else "")
        return [self._run_dict(r) for r in self._q(sql + " ORDER BY id", (after_id, *ids))]

    def reconcile(self, run_id: int | None = None, reason: str | None = None) -> list[int]:
        """Stores 'crashed' (with the reason, as an event and in the summary) for runs whose
        process is gone: the explicit write that reading leaves out. Also for studies."""
        sql = "SELECT * FROM runs WHERE status IN ('running', 'created')"
        rows = self._q(sql + (" AND id = ?" if run_id is not None else ""),
                       (run_id,) if run_id is not None else ())
        dead = []
        for r in rows:
            why = dead_reason(dict(r))
            if why is None:
                continue
            why = f"{reason}: {why}" if reason else why
            kept = self._from_rows(r["id"])      # its process is gone: its rows are all here
            with self.transaction() as c:
                # Re-check inside the transaction: the run may have changed meanwhile.
                now = c.execute("SELECT * FROM runs WHERE id = ?", (r["id"],)).fetchone()
                if now is None or dead_reason(dict(now)) is None:
                    continue
                summary = json.loads(now["summary"]) if now["summary"] else {}
                c.execute("UPDATE runs SET status = 'crashed', ended = ?, pid = NULL, "
                          "summary = ? WHERE id = ?",
                          (time.time(), json.dumps({**summary, "error": why}), r["id"]))
                c.execute("INSERT INTO events (run_id, t, kind, message) VALUES (?, ?, ?, ?)",
                          (r["id"], time.time(), "crashed", f"marked crashed: {why}"))
            self._keep_after(r["id"], kept)
            dead.append(r["id"])
        if run_id is None:
            self._reconcile_studies()
        return dead

    def group_failed(self, run_id: int, reason: str, data: dict[str, Any],
                     kind: str = "failure") -> None:
        """A data-parallel run whose rank died: its launcher, once every rank has ended,
        stores it crashed with the rank that took the group down (the lead may have stored
        a consequence first, e.g. its all-reduce losing a peer). A run that had already
        ended well keeps its status; the failure is recorded either way (an event of
        `kind`: failure, or stop_forced for ranks killed after a Stop they did not see)."""
        kept = self._from_rows(run_id)          # every rank has ended: its rows are all here
        with self.transaction() as c:
            row = c.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                return
            if row["status"] in ("created", "running", "crashed"):
                summary = json.loads(row["summary"]) if row["summary"] else {}
                if summary.get("error") and summary["error"] != reason:
                    summary["lead_error"] = summary["error"]
                summary["error"] = reason
                c.execute("UPDATE runs SET status = 'crashed', ended = ?, pid = NULL, "
                          "summary = ? WHERE id = ?", (time.time(), json.dumps(summary), run_id))
            c.execute("INSERT INTO events (run_id, t, step, kind, message, data) "
                      "VALUES (?, ?, ?, ?, ?, ?)",
                      (run_id, time.time(), row["step"], kind,
                       f"training failed: {reason}" if kind == "failure" else reason,
                       json.dumps(data)))
        self._keep_after(run_id, kept)      # (kept only where it still stands for the run)

    # --- what the user says about runs: names, notes, tags, hidden; deleting ---------------
    def rename_run(self, run_id: int, name: str) -> None:
        self.run(run_id)
        with self.transaction() as c:
            c.execute("UPDATE runs SET name = ? WHERE id = ?", (name, run_id))

    def labels(self) -> dict[int, dict[str, Any]]:
        """{run_id: {"notes", "tags" (a list), "hidden"}} of runs that have any."""
        if "run_labels" not in self._tables:
            return {}
        return {r["run_id"]: {"notes": r["notes"], "tags": [t for t in r["tags"].split(",")
                                                             if t],
                              "hidden": bool(r["hidden"])}
                for r in self._q("SELECT * FROM run_labels")}

    def set_labels(self, run_id: int, notes: str | None = None,
                   tags: list[str] | None = None, hidden: bool | None = None) -> None:
        """Changes what is given, keeps the rest. Tags are words without commas."""
        self.run(run_id)
        now = self.labels().get(run_id, {"notes": "", "tags": [], "hidden": False})
        notes = now["notes"] if notes is None else notes
        tags = now["tags"] if tags is None else [t.strip() for t in tags if t.strip()]
        hidden = now["hidden"] if hidden is None else hidden
        with self.transaction() as c:
            c.execute("INSERT OR REPLACE INTO run_labels (run_id, notes, tags, hidden) "
                      "VALUES (?, ?, ?, ?)", (run_id, notes, ",".join(tags), int(hidden)))

    def delete_run(self, run_id: int, refused: bool = False) -> None:
        """Removes a run: its rows, then its checkpoints and log (only files inside the
        session). A run training now is refused (stop it first; `refused`: by its own
        process); a run that an A/B study used leaves its study row without a run."""
        run = self.run(run_id)
        if not refused and (is_live(run) or starting(run)):
            raise RunBusy(f"run {run_id} is training; stop it before deleting it")
        files = [c["path"] for c in self.checkpoints(run_id) if c["path"]]
        with self.transaction() as c:
            for table in ("steps", "evals", "fingerprints", "checkpoints", "events"):
                c.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            for table in ("run_labels", "kept_figures"):
                if table in self._tables:
                    c.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            if self._has_studies:
                c.execute("UPDATE study_runs SET run_id = NULL, note = ? WHERE run_id = ?",
                          (f"run {run_id} was deleted", run_id))
            c.execute("UPDATE runs SET twin_of = NULL WHERE twin_of = ?", (run_id,))
            c.execute("DELETE FROM runs WHERE id = ?", (run_id,))
        for f in files:
            Path(f).unlink(missing_ok=True)
        folder = self.checkpoint_dir(run_id)
        if folder.is_dir() and not folder.is_symlink() and \
                folder.resolve().is_relative_to(self.dir):
            shutil.rmtree(folder, ignore_errors=True)
        if not refused:                 # (its dashboard reads the refusal there, then it)
            self.log_path(run_id).unlink(missing_ok=True)

    # --- metrics -------------------------------------------------------------------------
    def add_rows(self, steps: list[dict] = (), evals: list[dict] = (),
                 fingerprints: list[dict] = (), run_id: int | None = None) -> None:
        """Writes a batch of rows in one transaction. A row for a step already stored
        replaces it (a resumed run re-records the steps after its checkpoint)."""
        with self.transaction() as c:
            self._insert_rows(c, run_id, steps, evals, fingerprints)

    def write_batch(self, run_id: int, steps: list[dict], evals: list[dict],
                    fingerprints: list[dict], progress: tuple[int, float] | None,
                    live: figures.Figures | None) -> None:
        """A training process's flush, in one transaction: its rows, its progress, and its
        figures so far (`live`: computed from every row of the run, these included; None
        when it cannot say, and then none are kept: readers compute them from the rows).
        So a reader finds the kept figures of a live run only with the rows and the step
        they were computed from."""
        with self.transaction() as c:
            self._insert_rows(c, run_id, steps, evals, fingerprints)
            if progress is not None:
                c.execute("UPDATE runs SET step = ?, epoch = ?, heartbeat = ? WHERE id = ?",
                          (*progress, time.time(), run_id))
            if live is not None:
                self._keep(c, run_id, live)
            elif "kept_figures" in self._tables:
                c.execute("DELETE FROM kept_figures WHERE run_id = ?", (run_id,))

    def _insert_rows(self, c: sqlite3.Connection, run_id: int | None, steps: Any, evals: Any,
                     fingerprints: Any) -> None:
        now = time.time()
        steps, evals, fingerprints = (encode(steps), encode(evals), encode(fingerprints))
        if steps:
            cols = ("run_id", "t") + STEP_COLUMNS
            c.executemany(
                f"INSERT OR REPLACE INTO steps ({', '.join(cols)}) "
                f"VALUES ({', '.join('?' * len(cols))})",
                [(run_id, now) + tuple(r.get(k) for k in STEP_COLUMNS) for r in steps])
        if evals:
            c.executemany(
                "INSERT OR REPLACE INTO evals (run_id, t, step, epoch, loss, accuracy) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(run_id, now) + tuple(r[k] for k in EVAL_COLUMNS) for r in evals])
        if fingerprints:
            c.executemany(
                "INSERT OR REPLACE INTO fingerprints (run_id, t, step, sha256, l2, sketch) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(run_id, now) + tuple(r.get(k) for k in FINGERPRINT_COLUMNS)
                 for r in fingerprints])

    def steps(self, run_id: int, after_id: int = 0) -> list[dict[str, Any]]:
        """Step rows in step order; `after_id` is a cursor (the largest `id` already seen)."""
        return [decode(r) for r in self._q(
            "SELECT * FROM steps WHERE run_id = ? AND id > ? ORDER BY step", (run_id, after_id))]

    def rows_after(self, table: str, after_id: int) -> list[dict[str, Any]]:
        """Rows of every run written after the row `after_id` of `table` (steps, evals or
        fingerprints), in the order written: what changed since a cursor, whatever the
        number of runs or of rows stored (a range read on the primary key)."""
        assert table in ("steps", "evals", "fingerprints"), table
        return [decode(r) for r in self._q(
            f"SELECT * FROM {table} WHERE id > ? ORDER BY id", (after_id,))]

    def last_row_id(self, table: str) -> int:
        """The newest row of `table` (steps, evals or fingerprints): a cursor to start from."""
        assert table in ("steps", "evals", "fingerprints"), table
        return self._q(f"SELECT COALESCE(MAX(id), 0) FROM {table}")[0][0]

    def last_step(self, run_id: int) -> dict[str, Any] | None:
        rows = self._q("SELECT * FROM steps WHERE run_id = ? ORDER BY step DESC LIMIT 1",
                       (run_id,))
        return decode(rows[0]) if rows else None

    def last_eval(self, run_id: int) -> dict[str, Any] | None:
        rows = self._q("SELECT * FROM evals WHERE run_id = ? ORDER BY step DESC LIMIT 1",
                       (run_id,))
        return decode(rows[0]) if rows else None

    def evals(self, run_id: int, after_id: int = 0) -> list[dict[str, Any]]:
        return [decode(r) for r in self._q(
            "SELECT * FROM evals WHERE run_id = ? AND id > ? ORDER BY step", (run_id, after_id))]

    def fingerprints(self, run_id: int, after_id: int = 0) -> list[dict[str, Any]]:
        return [decode(r) for r in self._q(
            "SELECT * FROM fingerprints WHERE run_id = ? AND id > ? ORDER BY step",
            (run_id, after_id))]

    def fingerprint_at(self, run_id: int, step: int) -> str | None:
        rows = self._q("SELECT sha256 FROM fingerprints WHERE run_id = ? AND step = ?",
                       (run_id, step))
        return rows[0][0] if rows else None

    # --- events --------------------------------------------------------------------------
    def add_event(self, run_id: int | None, kind: str, message: str, step: int | None = None,
                  data: dict[str, Any] | None = None) -> None:
        with self.transaction() as c:
            c.execute("INSERT INTO events (run_id, t, step, kind, message, data) "
                      "VALUES (?, ?, ?, ?, ?, ?)",
                      (run_id, time.time(), step, kind, message,
                       json.dumps(data) if data is not None else None))

    def events(self, run_id: int, kind: str | tuple[str, ...] | None = None
               ) -> list[dict[str, Any]]:
        """A run's events in the order written; of one kind, or of any of several."""
        kinds = (kind,) if isinstance(kind, str) else tuple(kind or ())
        sql = "SELECT * FROM events WHERE run_id = ?" + (
            f" AND kind IN ({','.join('?' * len(kinds))})" if kinds else "")
        rows = self._q(sql + " ORDER BY id", (run_id, *kinds))
        out = []
        for r in rows:
            d = dict(r)
            d["data"] = json.loads(d["data"]) if d["data"] else None
            out.append(d)
        return out

    # --- checkpoints ---------------------------------------------------------------------
    def checkpoint_dir(self, run_id: int) -> Path:
        return self.checkpoints_dir / f"run-{run_id}"

    def log_path(self, run_id: int) -> Path:
        return self.logs_dir / f"run-{run_id}.log"

    def add_checkpoint(self, run_id: int, step: int, epoch: int, batch_in_epoch: int,
                       path: Path) -> None:
        with self.transaction() as c:
            # A resumed run may write a checkpoint at a step it had reached before.
            c.execute("UPDATE checkpoints SET removed = 1 WHERE run_id = ? AND step = ?",
                      (run_id, step))
            c.execute("INSERT INTO checkpoints (run_id, t, step, epoch, batch_in_epoch, path) "
                      "VALUES (?, ?, ?, ?, ?, ?)",
                      (run_id, time.time(), step, epoch, batch_in_epoch, self._relative(path)))
            c.execute("INSERT INTO events (run_id, t, step, kind, message) VALUES (?, ?, ?, ?, ?)",
                      (run_id, time.time(), step, "checkpoint",
                       f"checkpoint written at step {step} (epoch {epoch}, "
                       f"batch {batch_in_epoch}): {path.name}"))

    def _relative(self, path: Path) -> str:
        # Paths are stored relative to the session, so a copied or moved session ("save as")
        # uses its own files; a path outside it is never stored.
        try:
            return str(Path(path).resolve().relative_to(self.dir))
        except ValueError:
            raise SessionError(f"{path} is outside the session {self.dir}; only files "
                               "inside it are recorded") from None

    def inside(self, stored: str) -> Path:
        """The file a path stored in the session names, which must lie inside the session
        directory (after following links). An absolute path, `..`, or a link leading out is
        refused: a copied or hostile session can never make tui-trainer read or delete
        anything else."""
        p = Path(stored)
        if p.is_absolute() or not stored.strip():
            raise SessionError(f"the session stores the path {stored!r}, which is not relative "
                               "to the session; refused")
        target = (self.dir / p).resolve()
        if not target.is_relative_to(self.dir):
            raise SessionError(f"the session stores the path {stored!r}, which leads outside "
                               f"the session ({target}); refused")
        return target

    def checkpoints(self, run_id: int) -> list[dict[str, Any]]:
        """The run's recorded checkpoints, newest first. `path` is the absolute file inside
        the session, or None with the reason in `refused` when the stored path leads out of
        it (such a file is never read or deleted)."""
        out = []
        for r in self._q("SELECT * FROM checkpoints WHERE run_id = ? AND removed = 0 "
                         "ORDER BY step DESC, id DESC", (run_id,)):
            d = dict(r)
            try:
                d["path"], d["refused"] = str(self.inside(d["path"])), None
            except SessionError as e:
                d["path"], d["refused"] = None, str(e)
            out.append(d)
        return out

    def newest_checkpoints(self) -> dict[int, str]:
        """Each run's newest usable checkpoint file ({run id: path}), in one read: for
        listings of every run."""
        newest: dict[int, str] = {}
        for r in self._q("SELECT run_id, path FROM checkpoints WHERE removed = 0 "
                         "ORDER BY run_id, step DESC, id DESC"):
            if r["run_id"] in newest:
                continue
            try:
                newest[r["run_id"]] = str(self.inside(r["path"]))
            except SessionError:
                continue                     # leads out of the session: never used
        return newest

    def usable_checkpoints(self, run_id: int) -> list[dict[str, Any]]:
        return [c for c in self.checkpoints(run_id) if c["path"] is not None]

    def replay_roots(self, run_id: int) -> set[int]:
        """The steps of a run's checkpoints that are never pruned: step 0 (where every replay
        of its first steps starts, and `explain` asks this machine whether a step is
        deterministic) and each step a resume started from."""
        return {0} | {int(r["step"]) for r in self._q(
            "SELECT step FROM events WHERE run_id = ? AND kind = 'resumed' AND step IS NOT NULL",
            (run_id,))}

    def mark_checkpoint_removed(self, checkpoint_id: int) -> None:
        with self.transaction() as c:
            c.execute("UPDATE checkpoints SET removed = 1 WHERE id = ?", (checkpoint_id,))
