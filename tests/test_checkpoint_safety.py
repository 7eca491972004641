"""A truncated, corrupt, foreign or malicious checkpoint is refused with a clear message:
nothing of it runs, and nothing else in the session changes. (With an older good checkpoint
beside it, resume falls back to that one instead: tests/test_trust.py.)"""

from __future__ import annotations

import hashlib
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from conftest import QUICK, db_rows, sets, tt


def _session_state(session: Path) -> tuple:
    """Everything a refused resume must leave as it was: every table's rows and every file."""
    tables = ["runs", "steps", "evals", "fingerprints", "checkpoints", "events"]
    rows = tuple(tuple(db_rows(session, f"SELECT * FROM {t} ORDER BY id")) for t in tables)
    files = tuple(sorted((str(p.relative_to(session)), hashlib.sha256(p.read_bytes()).hexdigest())
                         for p in (session / "checkpoints").rglob("*") if p.is_file()))
    return rows, files


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One short finished run with one checkpoint, which the tests replace: its replay root
    at step 0 (kept whatever keep_checkpoints says) is taken away, so that a resume has no
    older checkpoint to pass over to."""
    import sqlite3
    session = tmp_path_factory.mktemp("session")
    r = tt("run", "--session", str(session), "--json", *sets(*QUICK, "epochs=1",
                                                                "checkpoint_every=4",
                                                                "keep_checkpoints=1"))
    assert r.rc == 0, r.err
    with sqlite3.connect(session / "session.sqlite") as conn:
        conn.execute("UPDATE checkpoints SET removed = 1 WHERE step = 0")
    (session / "checkpoints" / "run-1" / "step-00000000.pt").unlink()
    return session, Path(r.json["checkpoint"])


@pytest.fixture
def session(trained, tmp_path):
    src, ckpt = trained
    dst = tmp_path / "s"
    shutil.copytree(src, dst)
    return dst, dst / ckpt.relative_to(src)


class Exploit:
    """A pickle that would create a file when unpickled without weights_only."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def _refused(session: Path, expect: str) -> None:
    before = _session_state(session)
    r = tt("resume", "1", "--session", str(session), "--json", "--set", "max_steps=0",
           "--set", "epochs=3")
    assert r.rc == 2, (r.rc, r.err)
    assert expect in r.err
    assert r.out == ""
    assert _session_state(session) == before


def test_truncated_checkpoint_is_refused(session):
    s, ckpt = session
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: len(data) // 2])
    _refused(s, "is truncated or corrupt")


def test_garbage_checkpoint_is_refused(session):
    s, ckpt = session
    ckpt.write_bytes(b"\x00not a checkpoint at all" * 100)
    _refused(s, "is truncated or corrupt")


def test_checkpoint_whose_pickle_runs_code_is_refused_and_never_runs(session, tmp_path):
    s, ckpt = session
    marker = tmp_path / "pwned"
    torch.save({"format": "tui-trainer-checkpoint", "version": 1, "model": Exploit(str(marker))},
               ckpt)
    # The payload is real: plain unpickling runs it and creates the marker.
    pickle.loads(pickle.dumps(Exploit(str(marker))))
    assert marker.exists()
    marker.unlink()
    _refused(s, "could run code")
    assert not marker.exists()


def test_foreign_checkpoint_is_refused(session):
    s, ckpt = session
    torch.save({"conv1.weight": torch.zeros(10, 1, 5, 5)}, ckpt)
    _refused(s, "is not a tui-trainer checkpoint")


def test_checkpoint_of_another_run_is_refused(session, trained):
    s, ckpt = session
    r = tt("run", "--session", str(s), "--json", *sets(*QUICK, "epochs=1", "seed=7"))
    assert r.rc == 0, r.err
    before = _session_state(s)
    r2 = tt("resume", "1", "--session", str(s), "--checkpoint", r.json["checkpoint"])
    assert r2.rc == 2 and "belongs to run 2, not to run 1" in r2.err
    assert _session_state(s) == before


def test_resume_refuses_to_change_anything_but_the_training_length(session):
    s, _ = session
    before = _session_state(s)
    r = tt("resume", "1", "--session", str(s), "--set", "lr=0.5")
    assert r.rc == 2 and "lr: cannot change when continuing a run" in r.err
    assert _session_state(s) == before


def test_damaged_session_database_is_reported(tmp_path):
    (tmp_path / "session.sqlite").write_bytes(b"SQLite format 3\x00" + b"\xff" * 5000)
    r = tt("runs", "--session", str(tmp_path))
    assert r.rc == 4 and "session.sqlite" in r.err and "Traceback" not in r.err
    r = tt("run", "--session", str(tmp_path), *sets(*QUICK, "max_steps=2"))
    assert r.rc == 4 and "session.sqlite" in r.err and "Traceback" not in r.err


def test_foreign_sqlite_file_is_not_taken_for_a_session(tmp_path):
    import sqlite3
    conn = sqlite3.connect(tmp_path / "session.sqlite")
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("INSERT INTO notes VALUES ('mine')")
    conn.commit()
    conn.close()
    r = tt("runs", "--session", str(tmp_path))
    assert r.rc == 4 and "not a tui-trainer session" in r.err
    assert db_rows(tmp_path, "SELECT body FROM notes") == [("mine",)]


def test_missing_session_is_reported(tmp_path):
    r = tt("runs", "--session", str(tmp_path / "nowhere"))
    assert r.rc == 4 and "no session at" in r.err
    assert not (tmp_path / "nowhere").exists()
