"""The dashboard's reader (core.session.reader) over a real session file: each tick reads only what
changed, whatever the number of runs or of stored rows, and never writes."""

from __future__ import annotations

import pytest

from tui_trainer.core.settings import config
from tui_trainer.core.session.reader import SessionReader
from tui_trainer.core.session.store import SessionStore


def _rows(first: int, n: int) -> list[dict]:
    return [{"step": s, "epoch": s / 100, "elapsed": s * 0.01, "loss": 1.0 / s,
             "samples_per_s": 1000.0 + s} for s in range(first, first + n)]


def _session(path, runs: int, steps: int) -> SessionStore:
    w = SessionStore(path)
    for i in range(runs):
        rid = w.create_run(config.DEFAULTS.to_dict(), name=f"r{i}")
        w.add_rows(steps=_rows(1, steps), run_id=rid)
        w.end_run(rid, "finished", {"elapsed_s": 1.0})
    return w


def _statements(reader: SessionReader, **tick) -> list[str]:
    seen: list[str] = []
    reader.store._conn.set_trace_callback(seen.append)
    try:
        reader.tick(**tick)
    finally:
        reader.store._conn.set_trace_callback(None)
    return seen


@pytest.mark.parametrize("runs, steps", [(4, 100), (200, 100), (4, 20_000)])
def test_a_tick_costs_the_same_whatever_is_stored(tmp_path, runs, steps):
    w = _session(tmp_path, runs, steps)
    live = w.create_run(config.DEFAULTS.to_dict(), name="live")
    reader = SessionReader(SessionStore(tmp_path, readonly=True, create=False))
    first = reader.tick(watched=(1,))
    assert len(first.runs) == runs + 1 and len(first.series[1].steps) == steps
    w.add_rows(steps=_rows(1, 5), run_id=live)
    sql = _statements(reader, watched=(1,))
    # The same few statements for 4 or 200 runs, 100 or 20,000 steps: three range reads
    # of new rows, one read of the live and new runs, and the (rare) studies list.
    assert len([s for s in sql if s.lstrip().upper().startswith("SELECT")]) <= 6, sql
    assert not any(s.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")) for s in sql)
    snap = reader.tick(watched=(1,))
    row = {r.id: r for r in snap.runs}[live]
    assert row.samples_per_s == 1003.5            # median of 1002..1005: the first left out


def test_unchanged_ticks_keep_the_same_table_and_changes_show(tmp_path, monkeypatch):
    w = _session(tmp_path, 3, 10)
    reader = SessionReader(SessionStore(tmp_path, readonly=True, create=False))
    a = reader.tick()
    b = reader.tick()
    assert b.runs is a.runs and b.runs_version == a.runs_version
    # This dashboard renames, labels, deletes: it asks for a full read.
    w.rename_run(1, "renamed")
    w.set_labels(2, tags=["x", "y"], notes="n", hidden=True)
    w.delete_run(3)
    reader.invalidate()
    c = reader.tick()
    assert [(r.id, r.name, r.tags, r.hidden) for r in c.runs] == \
        [(1, "renamed", (), False), (2, "r1", ("x", "y"), True)]
    # Another process changes a finished run: the periodic full read catches it.
    w.rename_run(1, "elsewhere")
    assert reader.tick().runs[0].name == "renamed"
    monkeypatch.setattr("tui_trainer.core.session.reader.FULL_EVERY_S", 0.0)
    assert reader.tick().runs[0].name == "elsewhere"


def test_a_resumed_run_rerecording_steps_replaces_them(tmp_path):
    w = _session(tmp_path, 1, 10)
    reader = SessionReader(SessionStore(tmp_path, readonly=True, create=False))
    reader.tick(watched=(1,))
    w.add_rows(steps=[{**r, "loss": 9.0} for r in _rows(6, 3)], run_id=1)   # steps 6-8 again
    snap = reader.tick(watched=(1,))
    steps = snap.series[1].steps
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert steps[-1]["loss"] == 9.0


def test_deleting_a_run_removes_its_files_and_keeps_others(tmp_path):
    w = _session(tmp_path, 2, 5)
    for rid in (1, 2):
        d = w.checkpoint_dir(rid)
        d.mkdir(parents=True)
        (d / "step-5.pt").write_bytes(b"x")
        w.add_checkpoint(rid, 5, 0, 5, d / "step-5.pt")
        w.log_path(rid).parent.mkdir(exist_ok=True)
        w.log_path(rid).write_text("log\n")
    w.delete_run(1)
    assert [r["id"] for r in w.runs()] == [2]
    assert not w.checkpoint_dir(1).exists() and not w.log_path(1).exists()
    assert (w.checkpoint_dir(2) / "step-5.pt").exists() and w.log_path(2).exists()
    assert w.steps(1) == [] and len(w.steps(2)) == 5


def test_an_ended_run_is_seeded_from_its_kept_figures_and_trained_on_from_its_rows(tmp_path):
    from tui_trainer.core.analysis import figures
    w = SessionStore(tmp_path)
    rid = w.create_run(config.DEFAULTS.to_dict(), name="r")
    w.add_rows(steps=_rows(1, 500), run_id=rid)
    w.add_rows(evals=[{"step": 500, "epoch": 5.0, "loss": 0.3, "accuracy": 0.9}], run_id=rid)
    w.set_progress(rid, 500, 5.0)
    full = figures.figures(w.steps(rid), w.evals(rid))
    w.end_run(rid, "finished", {"elapsed_s": 5.0})          # keeps its figures
    reader = SessionReader(SessionStore(tmp_path, readonly=True, create=False))
    sql: list[str] = []
    reader.store._conn.set_trace_callback(sql.append)
    row = reader.tick().runs[0]
    # The same figures as from every row, without reading one of its rows.
    assert not [s for s in sql if "FROM steps WHERE run_id" in s], sql
    assert (row.samples_per_s, row.train_loss, row.eval_loss, row.accuracy) == \
        (full.samples_per_s, full.train_loss, full.eval_loss, full.accuracy)
    # Continued: it trains on, and its figures are those of all its rows again.
    w.add_rows(steps=_rows(501, 20), run_id=rid)
    w.set_progress(rid, 520, 5.2)
    row = reader.tick().runs[0]
    again = figures.figures(w.steps(rid), w.evals(rid))
    assert (row.samples_per_s, row.train_loss, row.accuracy) == \
        (again.samples_per_s, again.train_loss, again.accuracy)
    assert row.samples_per_s != full.samples_per_s


def test_a_study_run_started_while_the_table_is_drawn_waits_for_its_row(tmp_path,
                                                                           monkeypatch):
    """The study process starts a variant's run between the reader's read of the runs and
    its drawing of the study table: the table keeps to the study as the reader read it (the
    variant still queued) and shows the run once its row is read. (The dashboard's polling
    thread died once of a KeyError there, and the A/B tab stopped updating.)"""
    from conftest import wait_until
    from tui_trainer.core.analysis import study as studies
    w = _session(tmp_path, 1, 10)
    runs, _ = studies.plan(config.DEFAULTS, [("lr", [0.1])], steps=10)
    sid = w.create_study("ab", "s", {"repeats": 1, "steps": 10}, runs)
    w.set_study_run(sid, 0, 1)
    reader = SessionReader(SessionStore(tmp_path, readonly=True, create=False))
    read_study = reader.store.study
    started: list[int] = []

    def study_read_after_a_start(study_id: int) -> dict:
        if not started:              # the study process, meanwhile
            started.append(w.create_run(runs[1]["config"], name="variant"))
            w.set_study_run(sid, 1, started[0])
        return read_study(study_id)
    monkeypatch.setattr(reader.store, "study", study_read_after_a_start)
    rows = reader.tick(study=sid).study["rows"]
    assert [(r.label, r.run_id) for r in rows] == [("base", 1), ("lr=0.1", None)]
    if not started:
        study_read_after_a_start(sid)
    assert wait_until(lambda: [r.run_id for r in reader.tick(study=sid).study["rows"]] ==
                      [1, started[0]], timeout=30)
