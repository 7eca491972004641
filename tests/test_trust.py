"""Trust at the edges: hostile paths, divergence, replaced or missing checkpoints, kills at
every checkpoint write point, two writers, runs that die before they start, damaged,
read-only and full sessions, and odd input. Real processes, real SQLite files, real
filesystems (a tmpfs in a private mount namespace for a full or read-only disk)."""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import QUICK, db_rows, fingerprints, in_private_mount, sets, tt, tt_popen
from tui_trainer.core.settings import config
from tui_trainer.core.errors import NotFound, SessionError
from tui_trainer.core.session.store import SessionStore
from tui_trainer.core.processes.supervisor import Supervisor
from tui_trainer.engine.checkpoint import FAULT_POINTS

SHORT = QUICK + ["epochs=2", "checkpoint_every=5", "keep_checkpoints=2"]   # 20 steps


def _train(session: Path, *extra: str) -> dict:
    r = tt("run", "--session", str(session), "--json", *sets(*SHORT, *extra))
    assert r.rc == 0, r.err
    return r.json


def _files(session: Path) -> dict[str, str]:
    """Every file of the session with its hash (to show that nothing changed). SQLite's
    shared-memory index (-shm) and an empty -wal, which a reader may create for its locks,
    hold no data and are left out."""
    return {str(p.relative_to(session)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(session.rglob("*")) if p.is_file()
            and not p.name.endswith("-shm")
            and not (p.name.endswith("-wal") and p.stat().st_size == 0)}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A session with one finished 20-step run; tests work on copies of it."""
    session = tmp_path_factory.mktemp("finished")
    _train(session)
    return session


@pytest.fixture
def copy(finished, tmp_path) -> Path:
    dst = tmp_path / "s"
    shutil.copytree(finished, dst)
    return dst


# --- 1. paths stored in a session stay inside it --------------------------------------------

def test_checkpoint_rows_pointing_outside_are_never_deleted_nor_loaded(copy, tmp_path):
    victims = [tmp_path / "victim-absolute", tmp_path / "victim-dotdot"]
    for v in victims:
        v.write_text("precious")
    conn = sqlite3.connect(copy / "session.sqlite")
    # Old rows (pruned first when the run continues) and one posing as the newest checkpoint.
    conn.executemany("INSERT INTO checkpoints (run_id, t, step, epoch, batch_in_epoch, path) "
                     "VALUES (1, 0, ?, 0, 0, ?)",
                     [(1, str(victims[0])), (2, "../../victim-dotdot"),
                      (99, str(victims[0]))])
    conn.commit()
    conn.close()
    r = tt("resume", "1", "--session", str(copy), "--json", "--set", "epochs=3")
    assert r.rc == 0, r.err
    assert "leads outside the session" in r.err or "not relative" in r.err
    assert r.json["resumed_from_step"] == 20                  # the real newest one
    assert [v.read_text() for v in victims] == ["precious", "precious"]


def test_the_store_resolves_stored_paths_only_inside_the_session(tmp_path):
    store = SessionStore(tmp_path / "s")
    outside = tmp_path / "outside"
    outside.mkdir()
    (store.dir / "link").symlink_to(outside)
    assert store.inside("checkpoints/run-1/step-1.pt") == store.dir / "checkpoints/run-1/step-1.pt"
    for bad in (str(outside / "x"), "../outside/x", "checkpoints/../../outside/x", "link/x", ""):
        with pytest.raises(SessionError):
            store.inside(bad)
    with pytest.raises(SessionError, match="outside the session"):
        store.add_checkpoint(store.create_run({}), 1, 0, 1, outside / "x.pt")   # never stored


# --- 2. a run that diverges is a result ------------------------------------------------------

def test_a_diverging_run_keeps_every_row_and_ends_diverged(tmp_path):
    r = tt("run", "--session", str(tmp_path), "--json",
           *sets(*QUICK, "lr=100", "momentum=0.99", "weight_decay=1", "log_every=1"))
    assert r.rc == 5, r.err
    out = r.json
    assert out["status"] == "diverged" and out["final_loss"] is None     # strict JSON
    bad = out["diverged_at_step"]
    assert bad >= 1 and f"step {bad}" in out["diverged"]
    store = SessionStore(tmp_path, readonly=True)
    steps = store.steps(1)
    assert [s["step"] for s in steps] == list(range(1, bad + 1))    # every logged row kept
    assert math.isfinite(steps[0]["loss"]) and not math.isfinite(steps[-1]["loss"])
    run = store.run(1)
    assert (run["status"], run["step"]) == ("diverged", bad)
    assert any(e["kind"] == "diverged" for e in store.events(1))
    # The newest checkpoint is the last finite one.
    import torch
    from tui_trainer.engine.checkpoint import load_checkpoint
    newest = store.usable_checkpoints(1)[0]
    assert newest["step"] < bad
    state = load_checkpoint(newest["path"])
    assert all(torch.isfinite(t).all() for t in state["model"].values())
    listing = tt("runs", "--session", str(tmp_path))
    assert "diverged" in listing.out and f"at step {bad}" in listing.out


@pytest.mark.parametrize("key", ["lr", "momentum", "weight_decay", "lr_step_gamma",
                                 "clip_grad_norm"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_numbers_are_refused_naming_the_key(key, value):
    with pytest.raises(config.ConfigError) as e:
        config.load(overrides=[f"{key}={value}"])
    assert e.value.key == key and "finite" in e.value.reason


def test_nan_on_the_command_line_exits_2_and_writes_nothing(tmp_path):
    r = tt("run", "--session", str(tmp_path / "s"), *sets(*QUICK, "lr=nan"))
    assert r.rc == 2 and "lr:" in r.err and "finite" in r.err
    assert not (tmp_path / "s").exists()


# --- 3. resume checks the checkpoint against the store ---------------------------------------

def _newest_two(session: Path) -> list[Path]:
    """The run's two newest checkpoints (keep_checkpoints=2); its replay root at step 0 is
    kept besides them."""
    ckpts = sorted((session / "checkpoints" / "run-1").glob("step-*.pt"))
    assert [p.name for p in ckpts] == ["step-00000000.pt", "step-00000015.pt",
                                       "step-00000020.pt"]
    return ckpts[1:]


def test_an_older_checkpoint_under_the_newest_name_is_detected_and_passed_over(copy):
    ckpts = _newest_two(copy)
    shutil.copyfile(ckpts[0], ckpts[1])            # step 15's file under step 20's name
    r = tt("resume", "1", "--session", str(copy), "--json", "--set", "epochs=3")
    assert r.rc == 0, r.err
    assert "holds step 15" in r.err and "recorded step 20" in r.err
    assert "previous good checkpoint, at step 15" in r.err
    assert r.json["resumed_from_step"] == 15
    assert r.json["resume_fingerprints_differed"] == 0 and r.json["resume_fingerprints_matched"]
    kinds = [e["kind"] for e in SessionStore(copy, readonly=True).events(1)]
    assert "checkpoint_fallback" in kinds


def test_an_explicit_checkpoint_of_another_step_is_refused(copy):
    ckpts = _newest_two(copy)
    shutil.copyfile(ckpts[0], ckpts[1])
    before = _files(copy)
    r = tt("resume", "1", "--session", str(copy), "--checkpoint", str(ckpts[1]))
    assert r.rc == 2 and "the file was replaced" in r.err
    assert _files(copy) == before


# --- 6. statuses converge: a run that dies before it starts ----------------------------------

def test_a_run_killed_before_it_marks_itself_running_reads_crashed_at_once(tmp_path):
    store = SessionStore(tmp_path)
    sup = Supervisor(store)
    rid = sup.start(config.load(overrides=QUICK).to_dict(), name="short-lived")
    pid = sup._children[rid].pid
    os.kill(pid, signal.SIGKILL)                   # long before torch is even imported
    sup._children[rid].wait()
    assert store.run(rid)["stored_status"] == "created"
    run = store.run(rid)                           # reading: crashed, without writing
    assert run["status"] == "crashed" and "before training started" in run["summary"]["error"]
    sup.reap()                                     # the dashboard's poll stores it
    reopened = SessionStore(tmp_path, readonly=True)
    run = reopened.run(rid)
    assert run["stored_status"] == "crashed"
    assert "SIGKILL" in run["summary"]["error"]


def test_a_run_whose_creator_dies_before_launching_it_reads_crashed(tmp_path):
    SessionStore(tmp_path).close()
    code = ("import sys; from tui_trainer.core.session.store import SessionStore\n"
            "SessionStore(sys.argv[1]).create_run({}, name='orphan')\n")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True)
    r = tt("runs", "--session", str(tmp_path), "--json")
    assert r.rc == 0 and r.json[0]["status"] == "crashed"


# --- 7. one writer per run -------------------------------------------------------------------

def test_two_resumes_of_one_run_one_trains_the_other_is_refused(copy):
    procs = [tt_popen("resume", "1", "--session", str(copy), "--set", "epochs=500")
             for _ in range(2)]
    deadline = time.time() + 120
    while all(p.poll() is None for p in procs) and time.time() < deadline:
        time.sleep(0.1)
    loser = next(p for p in procs if p.poll() is not None)
    winner = next(p for p in procs if p is not loser)
    _, err = loser.communicate()
    assert loser.returncode == 4, err
    assert "is being trained by process" in err and str(winner.pid) in err
    assert winner.poll() is None                   # still training
    winner.send_signal(signal.SIGTERM)
    _, err = winner.communicate(timeout=120)
    assert winner.returncode == 130, err        # stopped
    assert db_rows(copy, "SELECT status FROM runs") == [("stopped",)]


# --- 8, 9. kills at every checkpoint write point; a crash before any checkpoint -------------

@pytest.mark.parametrize("point", FAULT_POINTS)
def test_a_kill_at_each_checkpoint_write_point_loses_nothing(finished, tmp_path, point):
    ref = finished                  # the same config, never killed
    session = tmp_path / "s"
    # (20 steps, a checkpoint every 5, 2 kept: the replay root at step 0 is never unlisted,
    # so the run unlists twice)
    env = {**os.environ, "TUI_TRAINER_FAULT": f"{point}:{2 if point == 'unlisted' else 3}"}
    killed = subprocess.run([sys.executable, "-m", "tui_trainer", "run", "--session",
                             str(session), *sets(*SHORT)], env=env, capture_output=True,
                            text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    r = tt("resume", "1", "--session", str(session), "--json")
    assert r.rc == 0, r.err
    assert r.json["resume_fingerprints_differed"] == 0 and r.json["steps"] == 20
    assert fingerprints(session, 1) == fingerprints(ref, 1)          # bit-exact
    listed = db_rows(session, "SELECT path FROM checkpoints WHERE removed = 0")
    assert all((session / p).is_file() for p, in listed)              # none without its file
    on_disk = {p.name for p in (session / "checkpoints" / "run-1").iterdir()}
    assert on_disk == {Path(p).name for p, in listed}                 # no tmp, no orphan


def test_a_crash_before_the_first_periodic_checkpoint_resumes_exactly(finished, tmp_path):
    session = tmp_path / "s"
    every = config.DEFAULTS.checkpoint_every
    assert every > 0                                 # the default bounds lost work
    # The default checkpoint_every (checkpoint settings do not change the bits of `finished`).
    killed = tt("run", "--session", str(session), "--kill-at-step", "3",
                *sets(*SHORT, f"checkpoint_every={every}"))
    assert killed.rc == -signal.SIGKILL
    r = tt("resume", "1", "--session", str(session), "--json")
    assert r.rc == 0, r.err
    assert r.json["resumed_from_step"] == 0 and r.json["resume_fingerprints_differed"] == 0
    assert fingerprints(session, 1) == fingerprints(finished, 1)


def test_a_run_with_no_checkpoint_can_be_restarted_from_step_0(tmp_path):
    store = SessionStore(tmp_path)
    rid = store.create_run(config.load(overrides=QUICK + ["max_steps=4"]).to_dict())
    store.close()
    r = tt("resume", str(rid), "--session", str(tmp_path))
    assert r.rc == 2 and f"resume {rid} --restart" in r.err
    r = tt("resume", str(rid), "--session", str(tmp_path), "--restart", "--json")
    assert r.rc == 0, r.err
    assert "from step 0" in r.err and r.json["steps"] == 4 and r.json["status"] == "finished"


# --- 10. damaged sessions: one clear message, nothing written ---------------------------------

def test_a_zero_byte_database_is_reported_and_left_alone(copy):
    (copy / "session.sqlite").write_bytes(b"")
    for extra in ("-wal", "-shm"):
        (copy / f"session.sqlite{extra}").unlink(missing_ok=True)
    before = _files(copy)
    for args in (["runs"], ["run", *sets(*QUICK)], ["resume", "1"], ["export", "1"]):
        r = tt(*args, "--session", str(copy))
        assert r.rc == 4 and "is empty (0 bytes)" in r.err and "Traceback" not in r.err, args
    assert _files(copy) == before


def test_a_deleted_database_beside_checkpoints_is_not_replaced_by_a_new_session(copy):
    for f in copy.glob("session.sqlite*"):
        f.unlink()
    before = _files(copy)
    r = tt("run", "--session", str(copy), *sets(*QUICK))
    assert r.rc == 4 and "is missing" in r.err
    assert _files(copy) == before


@pytest.mark.parametrize("damage, message", [
    ("UPDATE meta SET value = 'garbage' WHERE key = 'schema'", "schema version"),
    ("DROP TABLE evals", "table 'evals' is missing"),
    ("ALTER TABLE steps DROP COLUMN loss", "lacks the column(s) loss"),
])
def test_a_damaged_schema_is_reported_before_anything_is_written(copy, damage, message):
    conn = sqlite3.connect(copy / "session.sqlite")
    conn.execute(damage)
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    before = _files(copy)
    for args in (["runs"], ["resume", "1", "--set", "epochs=3"], ["repro", "--run", "1"],
                 ["run", *sets(*QUICK)]):
        r = tt(*args, "--session", str(copy))
        assert r.rc == 4 and message in r.err and "Traceback" not in r.err, (args, r.err)
    assert _files(copy) == before


def test_listing_never_writes_to_the_session(copy):
    before = _files(copy)
    assert tt("runs", "--session", str(copy)).rc == 0
    assert tt("runs", "--session", str(copy), "--json").rc == 0
    assert _files(copy) == before


def test_a_read_only_session_is_listed_and_exported_elsewhere(finished, tmp_path):
    out = tmp_path / "out"
    p = in_private_mount(f"""
        mkdir -p {tmp_path}/ro
        mount -t tmpfs tmpfs {tmp_path}/ro
        cp -a {finished}/. {tmp_path}/ro/
        rm -f {tmp_path}/ro/session.sqlite-wal {tmp_path}/ro/session.sqlite-shm
        mount -o remount,ro {tmp_path}/ro
        python -m tui_trainer runs --session {tmp_path}/ro; echo "rc=$?"
        python -m tui_trainer export 1 --session {tmp_path}/ro; echo "rc=$?"
        python -m tui_trainer export 1 --session {tmp_path}/ro --out {out}; echo "rc=$?"
        python -m tui_trainer resume 1 --session {tmp_path}/ro --set epochs=3; echo "rc=$?"
    """)
    text = p.stdout + p.stderr
    codes = [line for line in p.stdout.splitlines() if line.startswith("rc=")]
    assert codes == ["rc=0", "rc=1", "rc=0", "rc=4"], text
    assert "finished" in p.stdout                                        # listed
    assert "give --out DIR" in text and "training failed" not in text
    assert "is read-only" in text
    names = sorted(f.name for f in out.iterdir())
    assert sorted(f.suffix for f in out.iterdir()) == [".csv"] * 4 + [".png"] * 3, names
    assert "runs-1-summary.csv" in names


def test_a_full_disk_names_the_path_and_the_run_resumes_exactly_after_freeing_space(
        finished, tmp_path):
    ref = finished                  # the same config, never interrupted
    disk, disk2 = tmp_path / "disk", tmp_path / "disk2"
    p = in_private_mount(f"""
        mkdir -p {disk} {disk2}
        mount -t tmpfs -o size=900k tmpfs {disk}
        python -m tui_trainer run --session {disk}/s --json \
            {' '.join(sets(*SHORT, 'keep_checkpoints=100'))} > {tmp_path}/run.json \
            2> {tmp_path}/run.err || echo "run rc=$?"
        python -m tui_trainer runs --session {disk}/s || echo "runs rc=$?"
        mount -o remount,size=64m {disk}
        python -m tui_trainer resume 1 --session {disk}/s --json > {tmp_path}/resume.json \
            2> {tmp_path}/resume.err || echo "resume rc=$?"
        cp -a {disk}/s {tmp_path}/after
        # An existing session on a disk with no space at all.
        mount -t tmpfs -o size=2m tmpfs {disk2}
        mkdir {disk2}/s && cp {ref}/session.sqlite {disk2}/s/
        dd if=/dev/zero of={disk2}/filler bs=4k 2> /dev/null || true
        python -m tui_trainer run --session {disk2}/s {' '.join(sets(*QUICK))} \
            2> {tmp_path}/full.err || echo "full rc=$?"
        python -m tui_trainer runs --session {disk2}/s || echo "runs2 rc=$?"
    """)
    out = p.stdout
    err = (tmp_path / "run.err").read_text()
    assert "run rc=1" in out, out + err + p.stderr
    last = err.strip().splitlines()[-1]
    assert last.startswith("tui-trainer: no space left on device while writing")
    assert str(disk) in last and "free there" in last and "Traceback" not in err
    crashed = [line for line in out.splitlines() if line.startswith("run 1 crashed:")]
    assert crashed and "no space left on device" in crashed[0]       # the stored reason
    assert "runs rc=" not in out
    assert "resume rc=" not in out, (tmp_path / "resume.err").read_text()
    assert fingerprints(tmp_path / "after", 1) == fingerprints(ref, 1)   # exact after resume
    full = (tmp_path / "full.err").read_text()
    assert "full rc=1" in out and "no space left on device" in full, out + full
    assert "runs2 rc=" not in out and "finished" in out                   # still listed


# --- 12, 13. odd input: data_dir, exit codes, --session before the command -------------------

def test_an_unusable_data_dir_is_refused_naming_the_key(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for value, why in ((str(a_file), "is a file"), (str(tmp_path / ("x" * 300)), "cannot be used")):
        r = tt("run", "--session", str(tmp_path / "s"), *sets(*QUICK, f"data_dir={value}"))
        assert r.rc == 2 and "data_dir" in r.err and why in r.err, r.err
        assert "training failed" not in r.err and len(r.err.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()


def test_session_may_come_before_or_after_the_command(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    r = tt("--session", str(a), "run", *sets(*QUICK, "max_steps=2"))
    assert r.rc == 0, r.err
    assert len(db_rows(a, "SELECT id FROM runs")) == 1
    assert "run-1" in tt("--session", str(a), "runs").out
    r = tt("--session", str(a), "runs", "--session", str(b))
    assert r.rc == 2 and "--session is given twice" in r.err


def test_unknown_ids_are_bad_input(copy):
    with pytest.raises(NotFound):
        SessionStore(copy, readonly=True).run(42)
    assert tt("export", "42", "--session", str(copy)).rc == 2


def test_failure_lines_quoting_session_data_are_escaped(tmp_path):
    hostile = tmp_path / "s\x1b]0;PWNED\x07"
    hostile.mkdir()
    (hostile / "session.sqlite").write_bytes(b"")
    r = tt("run", "--session", str(hostile), *sets(*QUICK))
    assert r.rc == 4 and "is empty (0 bytes)" in r.err
    assert "\x1b" not in r.err and "\x07" not in r.err and "\\x1b]0;PWNED\\x07" in r.err


@pytest.mark.parametrize("name, why", [("a\x1b]0;x\x07b", "control characters"),
                                       ("n" * 201, "at most 200 characters")])
def test_names_with_control_characters_or_too_long_are_refused_when_created(tmp_path, name,
                                                                              why):
    for args in (["run", "--name", name, *sets(*QUICK)],
                 ["ab", "--name", name, "--vary", "seed=2", *sets(*QUICK)]):
        r = tt(*args, "--session", str(tmp_path / "s"))
        assert r.rc == 2 and why in r.err and "\x1b" not in r.err, (args, r.err)
    assert not (tmp_path / "s").exists()
