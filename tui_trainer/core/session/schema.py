"""The session's schema and the rules of its file: its tables and columns (those added
since schema 1 made by a writable open), the statuses a run can have, the tables checked
when it is opened, and the helpers every read and write uses (NaN stored as text, a write
transaction, what SQLite says as one clear line).

Core layer: imports neither torch nor textual.
"""

from __future__ import annotations

import math
import os
import sqlite3
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any, Iterator

from ..errors import DiskFull, ReadOnlySession, SessionError, free_bytes, is_disk_full

SCHEMA_VERSION = 1
DB_NAME = "session.sqlite"
APP_ID = "tui-trainer session"
# Whether a run's process is alive (heartbeat, pid, stalled) is core/processes/liveness.py's
# policy.

# diverged: the loss or the parameters became NaN/inf; the rows up to it and the last finite
# checkpoint are kept.
# "copied": a run (or study) that was training in another session when this one was copied
# from it; it trains on there, and this copy keeps it as it was (it can be continued here).
STATUSES = ("created", "running", "finished", "stopped", "crashed", "diverged", "copied")
ENDED = ("finished", "stopped", "crashed", "diverged", "copied")
# Whose figures are kept: an ended run's (computed once where it ends), and a running one's
# (its training process's, written with every batch of its rows: BatchedWriter).
KEPT_FOR = ENDED + ("running",)
# Stored for a NaN in a REAL column (SQLite would store NULL, losing "it was NaN"); read back
# as float("nan"). Infinities are stored as themselves.
NAN_TEXT = "NaN"

STEP_COLUMNS = ("step", "epoch", "elapsed", "loss", "lr", "grad_norm", "samples_per_s",
                "data_s", "compute_s", "rss_bytes", "cuda_alloc", "cuda_reserved", "cuda_peak",
                "peak_rss", "tensor_bytes", "copy_s", "forward_s", "backward_s", "optimizer_s",
                "record_s", "workers_uss", "ranks_uss")
EVAL_COLUMNS = ("step", "epoch", "loss", "accuracy")
FINGERPRINT_COLUMNS = ("step", "sha256", "l2", "sketch")

SCHEMA = f"""
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
    summary TEXT, twin_of INTEGER, progressed REAL, pace_s REAL, busy TEXT
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
)""", """
CREATE TABLE IF NOT EXISTS run_labels (
    run_id INTEGER PRIMARY KEY REFERENCES runs(id), notes TEXT NOT NULL DEFAULT '',
    tags TEXT NOT NULL DEFAULT '', hidden INTEGER NOT NULL DEFAULT 0
)""", """
CREATE TABLE IF NOT EXISTS kept_figures (
    run_id INTEGER PRIMARY KEY REFERENCES runs(id), version INTEGER NOT NULL,
    status TEXT NOT NULL, step INTEGER NOT NULL, ended REAL, state TEXT NOT NULL
)"""))
# Indexes added since schema 1, made by a writable open where missing (a read-only open of an
# older session reads without them): a run's events and checkpoints are read by run (the
# dashboard's checks every tick, a listing's newest checkpoints), and both tables grow with
# every run ever trained.
INDEXES = {"events_by_run": "CREATE INDEX IF NOT EXISTS events_by_run ON events (run_id)",
           "checkpoints_by_run": "CREATE INDEX IF NOT EXISTS checkpoints_by_run ON "
                                 "checkpoints (run_id, step)"}
SCHEMA += "".join(f"{stmt};" for stmt in INDEXES.values())
# Tables added after schema 1 shipped: a writable open creates them when missing; a read-only
# open of an older session reads them as empty. kept_figures: an ended run's figures
# (core.analysis.figures), computed once from its rows when it ended, with the run as it was
# then (status, step, end time) and the figures' VERSION: they stand for the run while all four
# still hold (SessionStore.figures_of).
OPTIONAL_TABLES = frozenset({"studies", "study_runs", "run_labels", "kept_figures"})
# Columns added since, the same way: {table: {column: its type}}. runs.progressed is when the
# training process last saw its step move (its heartbeat thread writes it), runs.pace_s its
# own seconds per step and runs.busy what it does besides stepping (evaluating, ...): a live
# run whose step has not moved for its stall window (core.processes.liveness) reads as stalled.
# runs.crowded: while it trains, why its threads wait (core.processes.contention.crowded).
OPTIONAL_COLUMNS = {"runs": {"progressed": "REAL", "pace_s": "REAL", "busy": "TEXT",
                             "crowded": "TEXT", "gpus": "TEXT"},
                    "steps": {c: "REAL" for c in ("peak_rss", "tensor_bytes", "copy_s",
                                                  "forward_s", "backward_s", "optimizer_s",
                                                  "record_s", "workers_uss", "ranks_uss")}}


# The tables checked (SQLite's quick_check) when a session is opened: those that grow with
# the runs and studies, which every command reads first. The metric rows and events grow
# with every step ever logged (the whole file took 0.7 s to check at 1,000 runs of 2,000
# steps, and growing): SQLite checks each of their pages as it is read, and a damaged one
# is said then, naming the file (session_error), by whatever read it.
CHECKED = ("meta", "runs", "kept_figures", "checkpoints", "studies", "study_runs",
           "run_labels")


def refuse_as_new(d: Path) -> None:
    """A path that must not become a new session: a file, or a session whose database was
    deleted while its checkpoints and logs are still there."""
    if d.exists() and not d.is_dir():
        raise SessionError(f"session path {d} exists and is not a directory")
    if not (d / DB_NAME).exists() and ((d / "checkpoints").is_dir() or (d / "logs").is_dir()):
        raise SessionError(
            f"{d / DB_NAME} is missing, but {d} holds the checkpoints or logs of a session: "
            "its database was deleted or moved. Nothing was written; restore the file, or "
            "use another directory for a new session")


def newer_schema(db_path: Path, version: int) -> str:
    return (f"{db_path} was written by a newer tui-trainer (schema {version}; this one reads "
            f"{SCHEMA_VERSION}): nothing was changed; open it with that version or newer")


def refuse_newer(db_path: Path) -> None:
    """A session of a newer schema, refused before SQLite makes its -wal and -shm files
    beside it (an open does): read as it is on disk (immutable: no file made), where no
    -wal file holds writes the disk's copy lacks (then the open's own check reads them)."""
    if Path(f"{db_path}-wal").exists():
        return
    try:
        conn = sqlite3.connect(f"file:{db_path}?mode=ro&immutable=1", uri=True)
        try:
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        finally:
            conn.close()
        version = int(row[0]) if row else 0
    except (sqlite3.Error, TypeError, ValueError):
        return                      # not a session, or damaged: the open's check says which
    if version > SCHEMA_VERSION:
        raise SessionError(newer_schema(db_path, version))


def refuse_read_only(d: Path) -> None:
    if not os.access(d, os.W_OK) or not os.access(d / DB_NAME, os.W_OK):
        raise ReadOnlySession(
            f"{d} is read-only: the session can be listed (`tui-trainer runs`), viewed in "
            "the dashboard and exported with `export --out DIR`, but not trained in")


def session_error(db_path: Path, e: sqlite3.Error) -> Exception:
    """One clear error for what SQLite says: a full disk, a read-only file, damage."""
    text = str(e)
    free = free_bytes(db_path.parent)
    if is_disk_full(e) or ("disk i/o error" in text.lower() and free is not None
                           and free < 1024 * 1024):
        # A full disk also shows as an I/O error when SQLite cannot grow its -shm file.
        return DiskFull(db_path)
    if "readonly" in text or "read-only" in text:
        return ReadOnlySession(f"{db_path} is read-only: the session can be listed, viewed and "
                            "exported (`export --out DIR`), not written")
    if "not a database" in text or "malformed" in text:
        return SessionError(f"{db_path} is damaged or not a SQLite database ({text})")
    if "locked" in text or "busy" in text:
        return SessionError(f"{db_path} is locked by another process for too long ({text})")
    return SessionError(f"{db_path}: {text}")


@cache
def expected_columns() -> dict[str, frozenset[str]]:
    """Every table of the schema and its columns, read from the schema itself."""
    conn = sqlite3.connect(":memory:")
    try:
        for stmt in SCHEMA.split(";"):
            if stmt.strip():
                conn.execute(stmt)
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: frozenset(r[1] for r in conn.execute(f"PRAGMA table_info('{t}')"))
                for t in tables}
    finally:
        conn.close()


def encode(rows: Any) -> list[dict]:
    return [{k: NAN_TEXT if isinstance(v, float) and math.isnan(v) else v
             for k, v in r.items()} for r in rows]


def as_read(row: dict[str, Any], columns: tuple[str, ...]) -> dict[str, Any]:
    """A row as it reads back once stored: its columns only, a whole number in a REAL
    column as a float (SQLite's affinity), so that figures fed it are those of the rows."""
    out = {}
    for k in columns:
        v = row.get(k)
        if k != "step" and isinstance(v, int):
            v = float(v)
        out[k] = v
    return out


def decode(row: sqlite3.Row) -> dict[str, Any]:
    return {k: math.nan if v == NAN_TEXT else v for k, v in dict(row).items()}


@contextmanager
def tx(conn: sqlite3.Connection) -> Iterator[None]:
    # BEGIN IMMEDIATE takes the write lock up front, so concurrent writers queue on
    # busy_timeout instead of failing with "database is locked" halfway through.
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


