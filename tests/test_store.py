"""The session store, on real SQLite files and real processes."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from tui_trainer.core.session.store import SessionStore
from tui_trainer.core.session.writer import BatchedWriter


def test_rows_cursor_and_replacement(tmp_path):
    store = SessionStore(tmp_path)
    rid = store.create_run({"seed": 1}, name="a")
    store.add_rows(steps=[{"step": s, "epoch": 0.1 * s, "loss": 1.0 / s} for s in (1, 2, 3)],
                   run_id=rid)
    rows = store.steps(rid)
    assert [r["step"] for r in rows] == [1, 2, 3]
    cursor = rows[-1]["id"]
    assert store.steps(rid, after_id=cursor) == []
    # A resumed run re-records step 3 and adds step 4: a reader past the cursor sees both.
    store.add_rows(steps=[{"step": 3, "epoch": 0.3, "loss": 0.5},
                          {"step": 4, "epoch": 0.4, "loss": 0.25}], run_id=rid)
    newer = store.steps(rid, after_id=cursor)
    assert [(r["step"], r["loss"]) for r in newer] == [(3, 0.5), (4, 0.25)]
    assert len(store.steps(rid)) == 4


def test_a_running_run_whose_process_died_is_marked_crashed(tmp_path):
    store = SessionStore(tmp_path)
    rid = store.create_run({}, name="dead")
    proc = subprocess.Popen([sys.executable, "-c",
                             "import sys, time\n"
                             "from tui_trainer.core.session.store import SessionStore\n"
                             f"SessionStore(sys.argv[1]).claim({rid}); time.sleep(60)",
                             str(tmp_path)])
    deadline = time.time() + 30
    while store.run(rid)["status"] != "running" and time.time() < deadline:
        time.sleep(0.05)
    assert store.run(rid)["status"] == "running"
    proc.kill()
    proc.wait()
    run = store.run(rid)
    assert run["status"] == "crashed" and "gone" in run["summary"]["error"]
    # Reading reported it without writing it; reconcile() is the explicit write.
    assert run["stored_status"] == "running" and store.events(rid) == []
    assert store.reconcile() == [rid]
    assert store.run(rid)["stored_status"] == "crashed"
    assert [e["kind"] for e in store.events(rid)] == ["crashed"]


def test_a_live_process_is_not_marked_crashed_from_another_connection(tmp_path):
    store = SessionStore(tmp_path)
    rid = store.create_run({}, name="me")
    store.claim(rid)                 # this very process
    other = SessionStore(tmp_path)
    assert other.run(rid)["status"] == "running"


def test_concurrent_writers_lose_nothing(tmp_path):
    SessionStore(tmp_path).close()
    code = (
        "import sys; from tui_trainer.core.session.store import SessionStore\n"
        "from tui_trainer.core.session.writer import BatchedWriter\n"
        "s = SessionStore(sys.argv[1]); rid = s.create_run({}, name=sys.argv[2])\n"
        "w = BatchedWriter(s, rid, interval=0)\n"
        "for i in range(300): w.step({'step': i, 'epoch': 0, 'loss': float(i)})\n"
        "w.flush()\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), f"w{i}"])
             for i in range(4)]
    seen = []

    def read() -> None:
        reader = SessionStore(tmp_path)   # a connection of the reading thread's own
        seen.extend(len(reader.runs()) for _ in range(50))

    t = threading.Thread(target=read)
    t.start()
    assert all(p.wait(timeout=120) == 0 for p in procs)
    t.join()
    assert len(seen) == 50 and seen == sorted(seen)
    store = SessionStore(tmp_path)
    runs = store.runs()
    assert len(runs) == 4
    assert all(len(store.steps(r["id"])) == 300 for r in runs)


def test_batched_writer_commits_on_interval_not_per_row(tmp_path):
    store = SessionStore(tmp_path)
    rid = store.create_run({}, name="b")
    w = BatchedWriter(store, rid, interval=3600)
    for i in range(50):
        w.step({"step": i, "epoch": 0, "loss": 0.0})
    # the first step row at once (a dashboard shows the run going), the rest buffered
    assert [r["step"] for r in SessionStore(tmp_path).steps(rid)] == [0]
    w.flush()
    reader = SessionStore(tmp_path)
    assert len(reader.steps(rid)) == 50
    assert reader.run(rid)["step"] == 49


def test_processes_opening_one_new_session_at_once_all_succeed(tmp_path):
    code = ("import sys; from tui_trainer.core.session.store import SessionStore\n"
            "s = SessionStore(sys.argv[1]); s.create_run({}, name='x'); s.close()")
    for attempt in range(3):
        session = tmp_path / f"new{attempt}"
        procs = [subprocess.Popen([sys.executable, "-c", code, str(session)],
                                  stderr=subprocess.PIPE, text=True) for _ in range(6)]
        errors = [p.communicate(timeout=180)[1] for p in procs]
        assert all(p.returncode == 0 for p in procs), errors
        assert len(SessionStore(session).runs()) == 6


def test_a_copy_marks_only_live_runs_copied_and_dead_ones_read_crashed_there_too(tmp_path):
    """Save as: a run whose process lives goes into the copy as 'copied' (what it was,
    where); one whose process is gone stays what it is, so the copy reads it crashed, as
    the original does. Nothing in the copy points at the original's processes."""
    orig = tmp_path / "orig"
    SessionStore(orig).close()
    code = ("import sys; from tui_trainer.core.session.store import SessionStore\n"
            "SessionStore(sys.argv[1]).create_run({}, name='orphan')\n")
    subprocess.run([sys.executable, "-c", code, str(orig)], check=True)   # its creator ends
    with SessionStore(orig) as s:
        live = s.create_run({}, name="live")       # created by this process, which lives
        assert s.run(1)["status"] == "crashed" and s.run(live)["status"] == "created"
        s.copy_to(tmp_path / "copy")
    with SessionStore(tmp_path / "copy", create=False) as c:
        assert c.run(1)["status"] == "crashed"
        copied = c.run(live)
        assert copied["status"] == "copied" and copied["pid"] is None
        assert f"starting in {orig} when copied, at step 0" in copied["summary"]["copied"]


def test_a_live_run_whose_step_does_not_move_reads_stalled(tmp_path):
    """A process that beats but does not train (a data-parallel rank hung, the others in a
    collective waiting for it) reads stalled once its step has not moved for its window
    (STALL_S while its pace is not known, else 20 of its steps, at least 5 s): in the
    store, the run table's row and `runs`; a beat that saw the step move clears it."""
    from conftest import tt
    from tui_trainer.core.session.reader import SessionReader
    from tui_trainer.core.processes.liveness import STALL_S
    from tui_trainer.ui.panels.runs import cells
    store = SessionStore(tmp_path)
    rid = store.create_run({"nproc": 2, "dist_timeout": 300}, name="group")
    store.claim(rid)                        # this process: alive, beating
    store.set_progress(rid, 412, 1.5)
    assert store.run(rid)["stalled_s"] is None
    store.heartbeat(rid, progressed=time.time() - STALL_S - 15)
    run = store.run(rid)
    assert run["status"] == "running" and run["stalled_s"] >= STALL_S + 15
    reader = SessionReader(SessionStore(tmp_path, readonly=True))
    reader.tick()
    got = reader.rows[rid]
    assert got.live and got.stalled_s >= STALL_S + 15
    assert "no step for 1:15" in got.reason and "dist_timeout (300 s)" in got.reason
    assert cells(got, False, "stalled")["status"].plain == "stalled"
    from tui_trainer.core.session.reader import stall_note
    older = {"stalled_s": 75.0, "step": 3, "config": {"nproc": 2}}    # before dist_timeout
    assert "dist_timeout (300 s)" in stall_note(older)
    assert "dist_timeout" not in stall_note({**older, "config": {"nproc": "x"}})
    r = tt("runs", "--session", str(tmp_path), "--json")
    (listed,) = r.json
    assert listed["status"] == "stalled" and listed["stalled_s"] >= STALL_S + 15
    text = tt("runs", "--session", str(tmp_path)).out
    assert f"run {rid} stalled: no step for" in text and "at step 412" in text
    # The window follows the run's own pace (its heartbeat measures it): a run that steps
    # 30 times a second is stalled after 6 s without a step, and says what it expected ...
    store.heartbeat(rid, progressed=time.time() - 6, pace_s=1 / 30)
    run = store.run(rid)
    assert run["stalled_s"] >= 6
    assert "it stepped every 0.033 s, so 0:05 without a step reads stalled" in stall_note(run)
    # ... but not while it does something else than stepping (the window is then STALL_S),
    store.heartbeat(rid, progressed=time.time() - 6, busy="evaluating")
    assert store.run(rid)["stalled_s"] is None
    # and a run of 2 s a step has 40 s
    store.heartbeat(rid, progressed=time.time() - 30, pace_s=2.0)
    assert store.run(rid)["stalled_s"] is None
    store.heartbeat(rid, progressed=time.time() - 41)
    assert store.run(rid)["stalled_s"] >= 41
    store.heartbeat(rid, progressed=time.time())            # it moved again
    assert store.run(rid)["stalled_s"] is None
    # A run whose process is gone is not stalled but crashed, whatever its progress says.
    store.end_run(rid, "finished", {})
    assert store.run(rid)["stalled_s"] is None


def test_a_session_from_before_the_progress_column_is_read_and_brought_up(tmp_path):
    """Sessions written before runs.progressed existed: a read-only open reads them as
    they are (no stalled reading), a writable open adds the column, even two at once."""
    import sqlite3
    store = SessionStore(tmp_path)
    rid = store.create_run({}, name="old")
    store.close()
    conn = sqlite3.connect(tmp_path / "session.sqlite")
    conn.execute("ALTER TABLE runs DROP COLUMN progressed")
    conn.commit()
    conn.close()
    old = SessionStore(tmp_path, readonly=True)
    assert old.run(rid)["stalled_s"] is None and "progressed" not in old.run(rid)
    errors: list[BaseException] = []

    def open_writable() -> None:
        try:
            SessionStore(tmp_path).close()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=open_writable) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    store = SessionStore(tmp_path)
    store.claim(rid)
    assert store.run(rid)["progressed"] is not None
