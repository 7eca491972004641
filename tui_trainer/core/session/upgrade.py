"""A session written by an earlier version, opened by this one.

The session records the schema (meta.schema: its tables' shape; a newer one is refused when
the session is opened, core/session/schema.py), the newest tui-trainer version that wrote
it (meta.version) and every knob its writers knew (meta.knobs). When a version that knows a
knob the session has not seen opens it to write, it reads every run as
core/settings/recorded.py says (each knob a run lacks as the version that stored it ran
it), says once what it assumed (to whoever listens in this process, and as a session
event, kind "upgrade", for the Log), and records the knobs it knows and its version. A
read-only open says it too, each time, as it cannot record that it did.

Core layer: imports neither torch nor textual.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any, Callable

from ... import __version__
from ..settings import config, recorded

# Who hears the line in this process (the CLI prints it to stderr, the dashboard shows it),
# and what they heard: each line once a process, however often the session is opened.
_listeners: list[Callable[[str], None]] = []
_said: set[str] = set()


def listen(callback: Callable[[str], None]) -> None:
    _listeners.append(callback)


def assumed_of(conn: sqlite3.Connection) -> dict[int, dict[str, Any]]:
    """Each run recorded before some knobs existed, with the values assumed for them."""
    out = {}
    for run_id, text in conn.execute("SELECT id, config FROM runs ORDER BY id"):
        try:
            values = json.loads(text) if text else None
        except (TypeError, ValueError):
            continue                   # damaged: said by whatever reads the run
        assumed = recorded.as_recorded(values)[1]
        if assumed:
            out[int(run_id)] = assumed
    return out


def check(conn: sqlite3.Connection, writable: bool) -> str | None:
    """On open: what this version assumes about an earlier version's runs, said once. The
    session records the knobs its writers knew (meta.knobs): one this version has and the
    session has not seen is new to it, even where the version number did not move."""
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    was = meta.get("version")
    seen = set(filter(None, (meta.get("knobs") or "").split(",")))
    if set(config.FIELDS) <= seen:
        return None                    # written by this version or a newer one
    assumed = assumed_of(conn)
    note = recorded.upgrade_note(assumed, was) if assumed else None
    if writable:
        conn.execute("BEGIN IMMEDIATE")
        try:
            again = conn.execute("SELECT value FROM meta WHERE key = 'knobs'").fetchone()
            if (again[0] if again else None) != meta.get("knobs"):
                conn.execute("ROLLBACK")
                return None            # another process upgraded it meanwhile, and said so
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('knobs', ?)",
                         (",".join(sorted(seen | set(config.FIELDS))),))
            if recorded.version_key(was) < recorded.version_key(__version__):
                conn.execute("INSERT OR REPLACE INTO meta VALUES ('version', ?)",
                             (__version__,))
            if note:
                conn.execute("INSERT INTO events (run_id, t, step, kind, message, data) "
                             "VALUES (NULL, ?, NULL, 'upgrade', ?, ?)",
                             (time.time(), note, json.dumps({
                                 "from": was, "to": __version__,
                                 "runs": {str(k): v for k, v in assumed.items()}})))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    if note and note not in _said:
        _said.add(note)
        for tell in _listeners:
            tell(note)
    return note
