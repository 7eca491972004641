"""A session used for months stays quick (issue 56): an ended run's figures are computed once
from its rows, kept with it, and computed again only when the run changes (a Continue, a
resume, a kept record that does not read back); what lists runs reads what it shows, not
every row ever logged. The real store over real session files; the engine's own runs are
checked where they end (conftest.kept_agrees: finished, crashed, resumed, data-parallel)."""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
import subprocess
import sys

from conftest import damage_table, in_private_mount, kept_agrees, tt
from tui_trainer.commands.runs import run_rows
from tui_trainer.core.settings import config
from tui_trainer.core.analysis import figures, study
from tui_trainer.core.session.reader import SessionReader
from tui_trainer.core.session.schema import INDEXES
from tui_trainer.core.session.store import SessionStore


def _rows(first: int, n: int, loss: float = 2.3) -> list[dict]:
    out = []
    for s in range(first, first + n):
        out.append({"step": s, "epoch": s / 100, "elapsed": s * 0.01,
                    "loss": loss * 0.99 ** s if math.isfinite(loss) else loss,
                    "grad_norm": 1.0 + (s % 7) / 10, "samples_per_s": 1000.0 + (s * 37) % 101,
                    "rss_bytes": 1e8 + s, "peak_rss": 1.1e8 + s, "tensor_bytes": 1e6,
                    **{f"{k}_s": 0.001 * (1 + (s * i) % 5) for i, k in
                       enumerate(figures.PHASES, 1)}})
    return out


def _ended(store: SessionStore, name: str, steps: int = 300, status: str = "finished",
           loss: float = 2.3) -> int:
    rid = store.create_run(config.DEFAULTS.to_dict(), name=name)
    store.add_rows(steps=_rows(1, steps, loss), run_id=rid)
    store.add_rows(evals=[{"step": steps, "epoch": steps / 100, "loss": 0.3,
                           "accuracy": 0.91}], run_id=rid)
    store.set_progress(rid, steps, steps / 100)
    store.end_run(rid, status, {"elapsed_s": steps * 0.01})
    return rid


def _reads_of_rows(store: SessionStore, fn) -> list[str]:
    """The statements that read a run's step or eval rows while fn() runs."""
    seen: list[str] = []
    store._conn.set_trace_callback(seen.append)
    try:
        fn()
    finally:
        store._conn.set_trace_callback(None)
    return [s for s in seen if "FROM steps WHERE run_id" in s or "FROM evals WHERE run_id" in s]


def _same(a: figures.Figures, b: figures.Figures) -> bool:
    return json.dumps(a.as_dict(), sort_keys=True) == json.dumps(b.as_dict(), sort_keys=True)


def test_a_listing_reads_the_rows_of_live_runs_only(tmp_path):
    """`runs` and `runs --json` (run_rows) take an ended run's figures as kept when it ended,
    whatever its status: the rows read are the live run's, not the session's history."""
    with SessionStore(tmp_path) as w:
        ended = [_ended(w, "done"), _ended(w, "stopped", status="stopped"),
                 _ended(w, "crashed", status="crashed"),
                 _ended(w, "diverged", status="diverged", loss=math.nan)]
        live = w.create_run(config.DEFAULTS.to_dict(), name="live")
        w.claim(live)                               # this process trains it
        w.add_rows(steps=_rows(1, 50), run_id=live)
        w.set_progress(live, 50, 0.5)
        for rid in ended:
            kept_agrees(tmp_path, rid)
        with SessionStore(tmp_path, create=False, readonly=True) as r:
            rows: list = []
            reads = _reads_of_rows(r, lambda: rows.extend(run_rows(r)))
            # its steps and its evaluations, once each
            assert len(reads) == 2 and all(f"run_id = {live} " in s for s in reads), reads
            # The listed figures are those of every row, for the ended runs and the live one.
            for row in rows:
                again = figures.run_figures(
                    r, row["run_id"], f=figures.figures(r.steps(row["run_id"]),
                                                        r.evals(row["run_id"])))
                for key, shown in (("train_loss", "train_loss"), ("eval_loss", "eval_loss"),
                                   ("accuracy", "eval_accuracy"),
                                   ("samples_per_s", "samples_per_s"),
                                   ("peak_memory_mib", "peak_memory_mib")):
                    assert json.dumps(row[shown]) == json.dumps(again[key]), (row["name"], key)
            assert math.isnan(rows[3]["train_loss"])           # NaN kept as NaN
    # A study's table and the A/B tab read the kept figures too.
    planned = study.prepare(config.DEFAULTS, [("cudnn_benchmark", [True])], 300, repeats=2,
                            name="ab")
    with SessionStore(tmp_path) as w:
        sid = w.create_study(planned.kind, planned.name, planned.spec, planned.runs)
        for position in range(4):
            w.set_study_run(sid, position, _ended(w, f"arm-{position}"))
        w.set_study_status(sid, "finished")
    with SessionStore(tmp_path, create=False, readonly=True) as r:
        assert _reads_of_rows(r, lambda: study.table(r, sid)) == []
        reader = SessionReader(r)
        reads = _reads_of_rows(r, lambda: reader.tick(study=sid))
        assert all(f"run_id = {live} " in s for s in reads), reads
        assert reader.unkept == []


def test_a_continue_computes_them_again_and_its_end_keeps_the_new_ones(tmp_path):
    with SessionStore(tmp_path) as w:
        rid = _ended(w, "r")
        before = w.kept_figures(w.run(rid))
        assert before is not None
        w.claim(rid)                                # Continue: the run trains again
        assert w.kept_figures(w.run(rid)) is None   # kept for the run as it was
        w.add_rows(steps=_rows(301, 100), run_id=rid)
        w.set_progress(rid, 400, 4.0)
        live = w.run_figures(w.run(rid))
        assert live.steps == 400 and not _same(live, before)
        w.end_run(rid, "finished", {"elapsed_s": 4.0})
    kept_agrees(tmp_path, rid)
    with SessionStore(tmp_path, create=False, readonly=True) as r:
        assert _same(r.kept_figures(r.run(rid)), live)


def test_a_crashed_run_is_kept_when_a_writer_stores_it_crashed(tmp_path):
    with SessionStore(tmp_path) as w:
        rid = w.create_run(config.DEFAULTS.to_dict(), name="dies")
        proc = subprocess.Popen([sys.executable, "-c",
                                 "import sys, time; from tui_trainer.core.session.store import "
                                 f"SessionStore\nSessionStore(sys.argv[1]).claim({rid}); "
                                 "print('ok', flush=True); time.sleep(60)", str(tmp_path)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ok"
        w.add_rows(steps=_rows(1, 120), run_id=rid)
        w.set_progress(rid, 120, 1.2)
        proc.kill()
        proc.wait()
        assert w.run(rid)["status"] == "crashed"          # read so, not stored yet
        assert w.kept_figures(w.run(rid)) is None
        assert w.reconcile() == [rid]
    kept_agrees(tmp_path, rid)


def test_a_kept_record_that_does_not_read_back_is_computed_again_and_replaced(tmp_path):
    with SessionStore(tmp_path) as w:
        rid = _ended(w, "r")
        right = w.kept_figures(w.run(rid))
    damages = ["not json", json.dumps({"steps": "300"}), json.dumps([1, 2]),
               json.dumps({**right.state(), "phase_s": {"data": "x"}}),
               json.dumps({**right.state(), "train_loss": True})]
    for damage in [*damages, None]:
        con = sqlite3.connect(tmp_path / "session.sqlite")
        if damage is None:                          # kept by another definition of them
            con.execute("UPDATE kept_figures SET version = ?", (figures.VERSION + 1,))
        else:
            con.execute("UPDATE kept_figures SET state = ?", (damage,))
        con.commit()
        con.close()
        with SessionStore(tmp_path, create=False, readonly=True) as r:
            assert r.kept_figures(r.run(rid)) is None, damage
            assert _same(r.run_figures(r.run(rid)), right)      # from the rows
        with SessionStore(tmp_path, create=False) as w:
            assert _same(w.run_figures(w.run(rid)), right)      # ... and kept again
        kept_agrees(tmp_path, rid)


def _older(tmp_path, runs: int = 3, legacy: dict | None = None):
    """A session as written before figures were kept: no kept_figures table, no indexes of
    events and checkpoints by run; `legacy`: the figures state its engine wrote into each
    finished run's summary (an older definition's)."""
    with SessionStore(tmp_path) as w:
        ids = [_ended(w, f"old-{i}", steps=200 + i) for i in range(runs)]
    con = sqlite3.connect(tmp_path / "session.sqlite")
    if legacy is not None:
        for rid in ids:
            con.execute("UPDATE runs SET summary = ? WHERE id = ?", (json.dumps(
                {"elapsed_s": 2.0, "figures": {**legacy, "steps": 199 + rid}}), rid))
    con.execute("DROP TABLE kept_figures")
    for name in INDEXES:
        con.execute(f"DROP INDEX {name}")
    con.commit()
    con.close()
    return ids


def _digest(path) -> str:
    return hashlib.sha256((path / "session.sqlite").read_bytes()).hexdigest()


def test_an_older_session_is_listed_then_its_figures_are_kept_once(tmp_path):
    ids = _older(tmp_path)
    expected = None
    with SessionStore(tmp_path, create=False, readonly=True) as r:
        expected = [figures.figures(r.steps(i), r.evals(i)).train_loss for i in ids]
        computed: list = []
        rows = run_rows(r, computed)                # read-only: lists, keeps nothing
        assert [x["train_loss"] for x in rows] == expected and len(computed) == 3
    listing = tt("runs", "--session", str(tmp_path), "--json")
    assert listing.rc == 0, listing.err
    assert [x["train_loss"] for x in listing.json] == expected
    for rid in ids:                                 # kept by that first listing
        kept_agrees(tmp_path, rid)
    con = sqlite3.connect(tmp_path / "session.sqlite")   # ... which brought the session up
    assert {n for (n,) in con.execute("SELECT name FROM sqlite_master")} >= set(INDEXES)
    con.close()
    with SessionStore(tmp_path, create=False, readonly=True) as r:
        assert _reads_of_rows(r, lambda: run_rows(r)) == []
    # The dashboard: its reader computes them once, for its writer to keep.
    _older(tmp_path / "ui")
    with SessionStore(tmp_path / "ui", create=False, readonly=True) as r:
        reader = SessionReader(r)
        reader.tick()
        assert sorted(run["id"] for run, _ in reader.unkept) == [1, 2, 3]
        with SessionStore(tmp_path / "ui", create=False) as w:   # (the app's writer)
            assert w.keep_figures(reader.unkept)
    with SessionStore(tmp_path / "ui", create=False, readonly=True) as r:   # the next open
        reader = SessionReader(r)
        assert _reads_of_rows(r, reader.tick) == [] and reader.unkept == []


def test_an_older_session_on_a_read_only_disk_is_listed_and_nothing_is_written(tmp_path):
    _older(tmp_path / "s")
    before = _digest(tmp_path / "s")
    p = in_private_mount(f"""
        mount --bind {tmp_path}/s {tmp_path}/s
        mount -o remount,bind,ro {tmp_path}/s
        python -m tui_trainer runs --session {tmp_path}/s --json > {tmp_path}/out.json
        echo "rc=$?"
    """)
    assert "rc=0" in p.stdout, p.stdout + p.stderr
    listed = json.loads((tmp_path / "out.json").read_text())
    assert [x["status"] for x in listed] == ["finished"] * 3
    assert all(isinstance(x["train_loss"], float) for x in listed)
    assert _digest(tmp_path / "s") == before
    assert sorted(f.name for f in (tmp_path / "s").iterdir()) == ["session.sqlite"]


def test_a_damaged_page_of_old_rows_is_said_by_what_reads_it_not_by_every_listing(tmp_path):
    """Opening a session checks the tables that grow with the runs
    (core.session.schema.CHECKED), not every row ever logged: a listing of a session whose old
    step rows are damaged lists its runs from their kept figures, and what reads those rows
    says the damage in one line."""
    with SessionStore(tmp_path) as w:
        for i in range(2):
            _ended(w, f"r{i}", steps=3000)
    damage_table(tmp_path, "steps")
    listing = tt("runs", "--session", str(tmp_path), "--json")
    assert listing.rc == 0, listing.err
    assert [(x["name"], x["steps"]) for x in listing.json] == [("r0", 3000), ("r1", 3000)]
    exported = tt("export", "1", "--session", str(tmp_path), "--out", str(tmp_path / "out"))
    assert exported.rc == 4 and "session.sqlite is damaged" in exported.err
    assert "Traceback" not in exported.err and len(exported.err.strip().splitlines()) == 1


def test_the_dashboard_opens_an_older_session_at_once_and_catches_up(tmp_path, monkeypatch):
    """An older session's ended runs show the figures their summary kept (what the dashboard
    showed before) on the first screen, without reading their rows; the following ticks
    compute them from the rows (CATCH_UP_S of each) and hand them to the writer to keep."""
    from tui_trainer.core.session import reader as reader_module
    old_definition = {**figures.figures(_rows(1, 10)).state(), "train_loss": 9.0}
    ids = _older(tmp_path, legacy=old_definition)
    with SessionStore(tmp_path, create=False, readonly=True) as r:
        reader = SessionReader(r)
        seen: list = []
        reads = _reads_of_rows(r, lambda: seen.append(reader.tick()))
        assert reads == [] and [row.train_loss for row in seen[0].runs] == [9.0] * 3
        monkeypatch.setattr(reader_module, "CATCH_UP_S", 0.0)    # a tick with no time left
        assert [row.train_loss for row in reader.tick().runs] == [9.0] * 3
        monkeypatch.setattr(reader_module, "CATCH_UP_S", 30.0)
        rows = reader.tick().runs
        again = [figures.figures(r.steps(i), r.evals(i)) for i in ids]
        assert [row.train_loss for row in rows] == [f.train_loss for f in again]
        assert sorted(run["id"] for run, _ in reader.unkept) == ids
        with SessionStore(tmp_path, create=False) as w:
            assert w.keep_figures(reader.unkept)
    for rid in ids:
        kept_agrees(tmp_path, rid)


def test_runs_says_what_it_computes_before_a_long_wait(tmp_path, monkeypatch):
    from tui_trainer.core.session import kept as kept_module
    monkeypatch.setattr(kept_module, "SAY_BEHIND", 3)
    _older(tmp_path)
    said: list[str] = []
    with SessionStore(tmp_path, create=False, readonly=True) as r:
        run_rows(r, say=said.append)
    assert said == ["computing the figures of 3 ended runs from their rows, once (kept from "
                    "now on: this session was written before they were kept)"]
    with SessionStore(tmp_path, create=False) as w:
        said.clear()
        run_rows(w, say=said.append)            # a writer keeps them: the next one is quiet
        run_rows(w, say=said.append)
    assert len(said) == 1


def _kept_now(path, rid) -> figures.Figures | None:
    with SessionStore(path, create=False, readonly=True) as r:
        return r.kept_figures(r.run(rid))


def test_a_live_runs_figures_are_kept_with_each_batch_of_its_rows(tmp_path):
    """The training process's writer keeps its run's figures as its rows arrive, in the
    transaction that writes them: a listing of a live run reads none of its rows, and what
    it reads is what every row gives. A resumed run re-recording steps it had before has
    none kept (the rows say) until it is past them."""
    from tui_trainer.core.session.writer import BatchedWriter
    with SessionStore(tmp_path) as w:
        rid = w.create_run(config.DEFAULTS.to_dict(), name="live")
        w.claim(rid)
        writer = BatchedWriter(w, rid, interval=3600)
        for row in _rows(1, 120):
            row["peak_rss"] = int(row["peak_rss"])        # a whole number, stored as REAL
            row["loss"] = math.nan if row["step"] == 60 else row["loss"]
            writer.step(row)
            writer.progress(row["step"], row["epoch"])
            if row["step"] % 50 == 0:
                writer.eval({"step": row["step"], "epoch": 0.5, "loss": 0.4, "accuracy": 1})
        writer.flush()
        with SessionStore(tmp_path, create=False, readonly=True) as r:
            run = r.run(rid)
            assert run["status"] == "running" and run["step"] == 120
            got: dict = {}
            assert _reads_of_rows(r, lambda: got.update(r.figures_of([run]))) == []
            assert json.dumps(got[rid].state(), sort_keys=True) == json.dumps(
                figures.figures(r.steps(rid), r.evals(rid)).state(), sort_keys=True)
        w.end_run(rid, "stopped", {}, writer.live)
        kept_agrees(tmp_path, rid)
        # Continued from step 80: steps 81-120 are recorded again.
        w.claim(rid)
        writer = BatchedWriter(w, rid, interval=3600)
        for row in _rows(81, 30):
            writer.step({**row, "loss": 0.5})
            writer.progress(row["step"], row["epoch"])
        writer.flush()
        assert writer.live is None and _kept_now(tmp_path, rid) is None
        for row in _rows(111, 20):                        # past what it had: kept again
            writer.step({**row, "loss": 0.5})
            writer.progress(row["step"], row["epoch"])
        writer.flush()
        with SessionStore(tmp_path, create=False, readonly=True) as r:
            kept = r.kept_figures(r.run(rid))
            assert kept is not None and kept.steps == 130
            assert json.dumps(kept.state(), sort_keys=True) == json.dumps(
                figures.figures(r.steps(rid), r.evals(rid)).state(), sort_keys=True)
