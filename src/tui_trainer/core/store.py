"""The session store: one SQLite database (WAL mode) per session directory.

It is the channel between a training process (which writes its own metrics, in small batched
transactions) and whoever reads them: the CLI, the dashboard, tests. Checkpoints and per-run
log files live beside the database:

    SESSION/session.sqlite
    SESSION/checkpoints/run-<id>/step-<step>.pt
    SESSION/logs/run-<id>.log

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

import psutil

SCHEMA_VERSION = 1
DB_NAME = "session.sqlite"
APP_ID = "tui-trainer session"
# A run whose heartbeat is older than this is dead, whatever its pid says (the training
# process beats every HEARTBEAT_S from a thread of its own, so a slow step does not starve it).
HEARTBEAT_S = 2.0
STALE_S = 30.0

STATUSES = ("created", "running", "finished", "stopped", "crashed")

STEP_COLUMNS = ("step", "epoch", "elapsed", "loss", "lr", "grad_norm", "samples_per_s",
                "data_s", "compute_s", "rss_bytes", "cuda_alloc", "cuda_reserved", "cuda_peak")
EVAL_COLUMNS = ("step", "epoch", "loss", "accuracy")
FINGERPRINT_COLUMNS = ("step", "sha256", "l2", "sketch")

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    created REAL NOT NULL,
    config TEXT NOT NULL,
    status TEXT NOT NULL,
    pid INTEGER, pid_started REAL, host TEXT,
    heartbeat REAL, started REAL, ended REAL,
    fingerprint TEXT, dataset TEXT,
    step INTEGER NOT NULL DEFAULT 0, epoch REAL NOT NULL DEFAULT 0,
    summary TEXT, twin_of INTEGER
);
CREATE TABLE IF NOT EXISTS steps (
    id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id), t REAL NOT NULL,
    {", ".join(c + (" INTEGER NOT NULL" if c == "step" else " REAL") for c in STEP_COLUMNS)},
    UNIQUE (run_id, step)
);
CREATE TABLE IF NOT EXISTS evals (
    id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id), t REAL NOT NULL,
    step INTEGER NOT NULL, epoch REAL, loss REAL, accuracy REAL, UNIQUE (run_id, step)
);
CREATE TABLE IF NOT EXISTS fingerprints (
    id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id), t REAL NOT NULL,
    step INTEGER NOT NULL, sha256 TEXT NOT NULL, l2 REAL NOT NULL, sketch BLOB,
    UNIQUE (run_id, step)
);
CREATE TABLE IF NOT EXISTS checkpoints (
    id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id), t REAL NOT NULL,
    step INTEGER NOT NULL, epoch INTEGER NOT NULL, batch_in_epoch INTEGER NOT NULL,
    path TEXT NOT NULL, removed INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY, run_id INTEGER REFERENCES runs(id), t REAL NOT NULL,
    step INTEGER, kind TEXT NOT NULL, message TEXT NOT NULL, data TEXT
);
""" + "".join(f"{stmt};" for stmt in (
    # Added after schema 1 shipped: created on open when missing, readers of schema 1
    # ignore them.
    """
CREATE TABLE IF NOT EXISTS studies (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL, created REAL NOT NULL, kind TEXT NOT NULL,
    spec TEXT NOT NULL, status TEXT NOT NULL, pid INTEGER, pid_started REAL,
    ended REAL, message TEXT
)""", """
CREATE TABLE IF NOT EXISTS study_runs (
    study_id INTEGER NOT NULL REFERENCES studies(id), position INTEGER NOT NULL,
    label TEXT NOT NULL, key TEXT, value TEXT, config TEXT NOT NULL,
    run_id INTEGER REFERENCES runs(id), note TEXT, PRIMARY KEY (study_id, position)
)"""))


class SessionError(Exception):
    """The session directory or its database cannot be used; the message says why."""


def process_start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def process_alive(pid: int | None, started: float | None) -> bool:
    """True while the process that wrote `pid` (started at `started`) still runs here."""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        # A reused pid belongs to a process started later than the one we recorded.
        return started is None or abs(proc.create_time() - started) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


class SessionStore:
    """One session directory. Safe to open from several processes at once."""

    def __init__(self, directory: str | Path, create: bool = True):
        self.dir = Path(directory).expanduser().resolve()
        self.db_path = self.dir / DB_NAME
        if not self.db_path.exists():
            if not create:
                raise SessionError(f"no session at {self.dir} (no {DB_NAME} there)")
            if self.dir.exists() and not self.dir.is_dir():
                raise SessionError(f"session path {self.dir} exists and is not a directory")
            self.dir.mkdir(parents=True, exist_ok=True)
        self.checkpoints_dir = self.dir / "checkpoints"
        self.logs_dir = self.dir / "logs"
        self._conn = self._connect()

    # --- connection and schema -----------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.db_path, timeout=30.0, isolation_level=None)
        except sqlite3.Error as e:
            raise SessionError(f"{self.db_path} cannot be opened: {e}") from None
        try:
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA busy_timeout = 30000")
            tables = {r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not tables:
                self._initialise(conn)
            else:
                self._check(conn, tables)
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            return conn
        except sqlite3.DatabaseError as e:
            conn.close()
            raise SessionError(f"{self.db_path} cannot be read as a session database: {e}") \
                from None
        except SessionError:
            conn.close()
            raise

    def _initialise(self, conn: sqlite3.Connection) -> None:
        # Idempotent under the write lock: two processes opening a new session at the same
        # moment both get here, and the second one's statements change nothing.
        conn.execute("PRAGMA journal_mode = WAL")
        with _tx(conn):
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('app', ?)", (APP_ID,))
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)",
                         (str(SCHEMA_VERSION),))
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('created', ?)", (str(time.time()),))

    def _check(self, conn: sqlite3.Connection, tables: set[str]) -> None:
        row = conn.execute("SELECT value FROM meta WHERE key = 'app'").fetchone() \
            if "meta" in tables else None
        if not row or row[0] != APP_ID:
            raise SessionError(f"{self.db_path} is a SQLite file but not a tui-trainer session "
                               "(no session marker in its meta table)")
        version = int(conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise SessionError(f"{self.db_path} was written by a newer tui-trainer "
                               f"(schema {version}; this one reads {SCHEMA_VERSION})")
        conn.execute("PRAGMA journal_mode = WAL")
        if not {"studies", "study_runs"} <= tables:      # a session from before A/B studies
            with _tx(conn):
                for stmt in _SCHEMA.split(";"):
                    if "studies" in stmt or "study_runs" in stmt:
                        conn.execute(stmt)
        # A quick structural check: a damaged file fails here, not halfway through a run.
        check = conn.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise SessionError(f"{self.db_path} is damaged: {check}")

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _q(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.DatabaseError as e:
            raise SessionError(f"{self.db_path}: {e}") from None

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        try:
            with _tx(self._conn):
                yield self._conn
        except sqlite3.DatabaseError as e:
            raise SessionError(f"{self.db_path}: {e}") from None

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
        finally:
            dest_conn.close()
        return target

    def meta(self, key: str) -> str | None:
        rows = self._q("SELECT value FROM meta WHERE key = ?", (key,))
        return rows[0][0] if rows else None

    def set_meta(self, key: str, value: str) -> None:
        with self.transaction() as c:
            c.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    # --- runs ----------------------------------------------------------------------------
    def create_run(self, config: dict[str, Any], name: str | None = None,
                   twin_of: int | None = None) -> int:
        with self.transaction() as c:
            cur = c.execute(
                "INSERT INTO runs (name, created, config, status, twin_of) VALUES (?, ?, ?, ?, ?)",
                ("", time.time(), json.dumps(config), "created", twin_of))
            run_id = int(cur.lastrowid)
            c.execute("UPDATE runs SET name = ? WHERE id = ?", (name or f"run-{run_id}", run_id))
        return run_id

    def mark_running(self, run_id: int, pid: int | None = None) -> None:
        pid = pid or os.getpid()
        now = time.time()
        with self.transaction() as c:
            c.execute("UPDATE runs SET status = 'running', pid = ?, pid_started = ?, host = ?, "
                      "heartbeat = ?, started = COALESCE(started, ?), ended = NULL WHERE id = ?",
                      (pid, process_start_time(pid), socket.gethostname(), now, now, run_id))

    def heartbeat(self, run_id: int) -> None:
        with self.transaction() as c:
            c.execute("UPDATE runs SET heartbeat = ? WHERE id = ?", (time.time(), run_id))

    def set_progress(self, run_id: int, step: int, epoch: float) -> None:
        with self.transaction() as c:
            c.execute("UPDATE runs SET step = ?, epoch = ?, heartbeat = ? WHERE id = ?",
                      (step, epoch, time.time(), run_id))

    def set_fingerprint(self, run_id: int, fingerprint: dict[str, Any], dataset: str) -> None:
        with self.transaction() as c:
            c.execute("UPDATE runs SET fingerprint = ?, dataset = ? WHERE id = ?",
                      (json.dumps(fingerprint), dataset, run_id))

    def set_config(self, run_id: int, config: dict[str, Any]) -> None:
        with self.transaction() as c:
            c.execute("UPDATE runs SET config = ? WHERE id = ?", (json.dumps(config), run_id))

    def end_run(self, run_id: int, status: str, summary: dict[str, Any] | None = None) -> None:
        assert status in STATUSES, status
        with self.transaction() as c:
            c.execute("UPDATE runs SET status = ?, ended = ?, summary = ?, pid = NULL "
                      "WHERE id = ?", (status, time.time(), json.dumps(summary or {}), run_id))

    def _run_dict(self, row: sqlite3.Row) -> dict[str, Any]:
        run = dict(row)
        for key in ("config", "fingerprint", "summary"):
            run[key] = json.loads(run[key]) if run[key] else None
        return run

    def run(self, run_id: int) -> dict[str, Any]:
        """One run, with its status reconciled against its process (dead means crashed)."""
        self.reconcile(run_id)
        rows = self._q("SELECT * FROM runs WHERE id = ?", (run_id,))
        if not rows:
            raise SessionError(f"no run {run_id} in session {self.dir}")
        return self._run_dict(rows[0])

    def runs(self) -> list[dict[str, Any]]:
        self.reconcile()
        return [self._run_dict(r) for r in self._q("SELECT * FROM runs ORDER BY id")]

    def is_live(self, run: dict[str, Any]) -> bool:
        if run["status"] != "running":
            return False
        if run["heartbeat"] is None or time.time() - run["heartbeat"] > STALE_S:
            return False
        if run["host"] == socket.gethostname():
            return process_alive(run["pid"], run["pid_started"])
        return True

    def reconcile(self, run_id: int | None = None) -> list[int]:
        """Marks runs that say 'running' but whose process is gone as crashed."""
        sql = "SELECT * FROM runs WHERE status = 'running'"
        rows = self._q(sql + (" AND id = ?" if run_id is not None else ""),
                       (run_id,) if run_id is not None else ())
        dead = [r["id"] for r in rows if not self.is_live(dict(r))]
        for rid in dead:
            with self.transaction() as c:
                # Re-check inside the transaction: the run may have ended meanwhile.
                c.execute("UPDATE runs SET status = 'crashed', ended = ?, pid = NULL "
                          "WHERE id = ? AND status = 'running'", (time.time(), rid))
                c.execute("INSERT INTO events (run_id, t, kind, message) VALUES (?, ?, ?, ?)",
                          (rid, time.time(), "crashed",
                           "the training process is gone (no heartbeat, no process): "
                           "marked crashed; continue it from its newest checkpoint"))
        return dead

    # --- metrics -------------------------------------------------------------------------
    def add_rows(self, steps: list[dict] = (), evals: list[dict] = (),
                 fingerprints: list[dict] = (), run_id: int | None = None) -> None:
        """Writes a batch of rows in one transaction. A row for a step already stored
        replaces it (a resumed run re-records the steps after its checkpoint)."""
        now = time.time()
        with self.transaction() as c:
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
        return [dict(r) for r in self._q(
            "SELECT * FROM steps WHERE run_id = ? AND id > ? ORDER BY step", (run_id, after_id))]

    def last_step(self, run_id: int) -> dict[str, Any] | None:
        rows = self._q("SELECT * FROM steps WHERE run_id = ? ORDER BY step DESC LIMIT 1",
                       (run_id,))
        return dict(rows[0]) if rows else None

    def last_eval(self, run_id: int) -> dict[str, Any] | None:
        rows = self._q("SELECT * FROM evals WHERE run_id = ? ORDER BY step DESC LIMIT 1",
                       (run_id,))
        return dict(rows[0]) if rows else None

    def evals(self, run_id: int, after_id: int = 0) -> list[dict[str, Any]]:
        return [dict(r) for r in self._q(
            "SELECT * FROM evals WHERE run_id = ? AND id > ? ORDER BY step", (run_id, after_id))]

    def fingerprints(self, run_id: int, after_id: int = 0) -> list[dict[str, Any]]:
        return [dict(r) for r in self._q(
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

    def events(self, run_id: int, kind: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT * FROM events WHERE run_id = ?" + (" AND kind = ?" if kind else "")
        rows = self._q(sql + " ORDER BY id", (run_id, kind) if kind else (run_id,))
        out = []
        for r in rows:
            d = dict(r)
            d["data"] = json.loads(d["data"]) if d["data"] else None
            out.append(d)
        return out

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
        self._reconcile_studies()
        rows = self._q("SELECT * FROM studies WHERE id = ?", (study_id,))
        if not rows:
            raise SessionError(f"no study {study_id} in session {self.dir}")
        return self._study_dict(rows[0])

    def studies(self) -> list[dict[str, Any]]:
        self._reconcile_studies()
        return [self._study_dict(r) for r in self._q("SELECT * FROM studies ORDER BY id")]

    def _study_dict(self, row: sqlite3.Row) -> dict[str, Any]:
        study = dict(row)
        study["spec"] = json.loads(study["spec"])
        study["variants"] = []
        for r in self._q("SELECT * FROM study_runs WHERE study_id = ? ORDER BY position",
                         (study["id"],)):
            v = dict(r)
            v["value"] = json.loads(v["value"]) if v["value"] is not None else None
            v["config"] = json.loads(v["config"])
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

    def _reconcile_studies(self) -> None:
        """A study whose runner process is gone is marked crashed (it can be continued)."""
        for r in self._q("SELECT id, pid, pid_started FROM studies WHERE status = 'running'"):
            if not process_alive(r["pid"], r["pid_started"]):
                with self.transaction() as c:
                    c.execute("UPDATE studies SET status = 'crashed', pid = NULL, ended = ?, "
                              "message = 'the study process is gone; run it again to "
                              "continue' WHERE id = ? AND status = 'running'",
                              (time.time(), r["id"]))

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
        # Paths inside the session are stored relative to it, so a copied or moved session
        # ("save as") uses its own files.
        try:
            return str(Path(path).resolve().relative_to(self.dir))
        except ValueError:
            return str(path)

    def checkpoints(self, run_id: int) -> list[dict[str, Any]]:
        """The run's checkpoints still on disk, newest first, with absolute paths."""
        out = []
        for r in self._q("SELECT * FROM checkpoints WHERE run_id = ? AND removed = 0 "
                         "ORDER BY step DESC, id DESC", (run_id,)):
            d = dict(r)
            d["path"] = str(self.dir / d["path"])
            out.append(d)
        return out

    def mark_checkpoint_removed(self, checkpoint_id: int) -> None:
        with self.transaction() as c:
            c.execute("UPDATE checkpoints SET removed = 1 WHERE id = ?", (checkpoint_id,))


@contextmanager
def _tx(conn: sqlite3.Connection) -> Iterator[None]:
    # BEGIN IMMEDIATE takes the write lock up front, so concurrent writers queue on
    # busy_timeout instead of failing with "database is locked" halfway through.
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


class BatchedWriter:
    """Buffers metric rows of one run and writes them in one transaction at most every
    `interval` seconds (or when asked), so a fast loop does not pay a commit per step."""

    def __init__(self, store: SessionStore, run_id: int, interval: float = 1.0):
        self.store = store
        self.run_id = run_id
        self.interval = interval
        self._steps: list[dict] = []
        self._evals: list[dict] = []
        self._fps: list[dict] = []
        self._last = time.monotonic()
        self._progress: tuple[int, float] | None = None

    def step(self, row: dict) -> None:
        self._steps.append(row)
        self._progress = (row["step"], row["epoch"])
        self.maybe_flush()

    def eval(self, row: dict) -> None:
        self._evals.append(row)
        self.flush()

    def fingerprint(self, row: dict) -> None:
        self._fps.append(row)
        self.maybe_flush()

    def progress(self, step: int, epoch: float) -> None:
        self._progress = (step, epoch)

    def maybe_flush(self) -> None:
        if time.monotonic() - self._last >= self.interval:
            self.flush()

    def flush(self) -> None:
        if self._steps or self._evals or self._fps:
            self.store.add_rows(self._steps, self._evals, self._fps, run_id=self.run_id)
            self._steps, self._evals, self._fps = [], [], []
        if self._progress is not None:
            self.store.set_progress(self.run_id, *self._progress)
            self._progress = None
        self._last = time.monotonic()
