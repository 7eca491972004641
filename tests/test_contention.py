"""Was the machine fit to measure (core.processes.contention): what counts as another process's
load, on a 2-core machine and on a 16-core GPU machine, and the study's own processes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tui_trainer.core.processes import contention


def _c(others: float, own: float, cores: int | None, steal: float = 0.0) -> dict:
    return contention.read({"wall_s": 10.0, "others_cores": others, "own_cores": own,
                            "steal_cores": steal, "cores": cores})


def test_load_is_what_the_run_could_have_used():
    # 2 cores: a busy process beside a one-thread run, or beside a two-thread one, is load;
    # the idle background is not, nor a third of the other core
    assert contention.loaded(_c(1.0, 1.0, 2)) and contention.loaded(_c(0.6, 1.3, 2))
    assert not contention.loaded(_c(0.05, 1.9, 2)) and not contention.loaded(_c(0.3, 1.0, 2))
    # 16 cores (an H100's VM): steal and a dashboard beside a CUDA run are not load (the
    # H100's time-to-accuracy runs read others 0.05, stolen 0.25, own 1.85 and were marked);
    # a neighbour that takes the machine is
    assert not contention.loaded(_c(0.05, 1.85, 16, steal=0.25))
    assert not contention.loaded(_c(3.0, 2.0, 16))
    assert contention.loaded(_c(14.5, 1.5, 16))
    # a record from before the machine's cores were kept: others alone, as before
    assert contention.loaded(_c(0.3, 1.0, None)) and not contention.loaded(_c(0.1, 1.0, None))
    # damaged records read as none
    assert contention.read({"wall_s": 1.0, "others_cores": 0.1, "cores": "16"})["cores"] is None
    assert contention.read({"wall_s": 1.0, "others_cores": -1}) is None


def test_a_study_waits_for_room_for_its_runs_not_for_an_idle_machine():
    # quiet as it can be when nothing says what the runs take; else what leaves them spare
    assert contention.room_for(None) == contention.QUIET_CORES
    assert contention.room_for(1.0, cores=2) == 0.5
    assert contention.room_for(2.0, cores=2) == contention.QUIET_CORES
    assert contention.room_for(1.85, cores=16) == 16 - contention.SPARE_CORES - 1.85
    # what room_for allows, a re-run then reads as not loaded
    busy = contention.room_for(1.0, cores=2) - 0.01
    assert not contention.loaded(_c(busy, 1.0, 2))


def test_the_processes_of_the_study_that_started_a_run_are_not_others(tmp_path):
    """A real process tree: an owner (the study) starts a busy process (its launcher or
    another of its runs) and the run that measures. The busy process's CPU counts as the
    study's cores, not as others'; a stranger's busy loop stays others'. Each busy loop's
    own CPU over the same interval is read beside (whatever else the machine runs)."""
    run = textwrap.dedent("""
        import json, os, sys, time
        from tui_trainer.core.processes import contention
        owner, busy, stranger = os.getppid(), int(sys.argv[1]), int(sys.argv[2])
        cpu = lambda: (contention._cpu_of(busy), contention._cpu_of(stranger))
        a, ca = contention.snapshot(owner), cpu()
        time.sleep(2.0)
        b, cb = contention.snapshot(owner), cpu()
        c = contention.between(a, b)
        wall = c["wall_s"]
        print(json.dumps({**c, "busy": (cb[0] - ca[0]) / wall,
                          "stranger": (cb[1] - ca[1]) / wall}))
    """)
    owner = textwrap.dedent(f"""
        import subprocess, sys
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        out = subprocess.run([sys.executable, "-c", {run!r}, str(busy.pid), sys.argv[1]],
                             capture_output=True, text=True)
        busy.kill()
        print(out.stdout, out.stderr)
    """)
    stranger = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        p = subprocess.run([sys.executable, "-c", owner, str(stranger.pid)],
                           capture_output=True, text=True, timeout=120)
    finally:
        stranger.kill()
        stranger.wait()
    c = json.loads(p.stdout.strip().splitlines()[0])
    assert c["busy"] > 0.05 and c["stranger"] > 0.05, c       # both ran, however loaded
    # (the clock ticks of /proc: 0.01 s each, a few over 2 s)
    assert abs(c["study_cores"] - c["busy"]) < 0.05, c
    assert c["others_cores"] >= c["stranger"] - 0.05, c
    assert c["own_cores"] < 0.2, c


def test_threads_beyond_the_free_cores_are_named_with_the_count_that_fits_device_cpu():
    """device=cpu: a CPU run's torch threads against the cores the rest of the machine left
    it (issue 54). 2 threads beside one busy program on 2 cores wait on the starved one;
    the note names the count that fits, and that it can change the bits."""
    note = contention.crowded(_c(1.0, 1.2, 2), 2, "cpu")
    assert note is not None and note.startswith("2 threads, 1.0 of 2 cores free")
    assert "num_threads = 1 would not" in note and "changes the bits" in note
    assert contention.suggested_threads(note) == 1
    # 4 threads beside 1.4 cores of others on 4 cores: 2.6 free, 3 fit
    assert contention.suggested_threads(contention.crowded(_c(1.4, 2.0, 4), 4, "cpu")) == 3
    # the idle background, one thread, a 16-core machine, a CUDA run: nothing to say
    assert contention.crowded(_c(0.05, 1.9, 2), 2, "cpu") is None
    assert contention.crowded(_c(1.0, 1.0, 2), 1, "cpu") is None
    assert contention.crowded(_c(1.0, 2.0, 16), 2, "cpu") is None
    assert contention.crowded(_c(1.0, 1.2, 2), 2, "cuda") is None
    # the study's own processes take cores too; a record that cannot say reads as none
    assert contention.crowded(contention.read({"wall_s": 5.0, "others_cores": 0.1,
                                               "study_cores": 0.9, "cores": 2}), 2, "cpu")
    assert contention.crowded(_c(1.0, 1.2, None), 2, "cpu") is None
    assert contention.crowded(None, 2, "cpu") is None
    assert contention.crowded(_c(1.0, 1.2, 2), True, "cpu") is None
    assert contention.suggested_threads("2 threads") is None


def test_a_stored_runs_crowded_note_is_its_live_judgment_then_its_whole_run():
    summary = {"contention": {"wall_s": 10.0, "others_cores": 1.0, "own_cores": 1.1,
                              "cores": 2}}
    settings = {"num_threads": 2, "device": "cpu"}
    ended = {"status": "finished", "summary": summary, "settings": settings}
    assert "num_threads = 1" in contention.run_crowded(ended)
    # live: what the process said last (its column), not the summary
    assert contention.run_crowded({**ended, "status": "running", "crowded": None}) is None
    assert contention.run_crowded({**ended, "status": "running", "crowded": "x"}) == "x"
    # on CUDA, with damaged records, or before the column existed: nothing
    assert contention.run_crowded({**ended, "settings": {**settings,
                                                          "device": "cuda:0"}}) is None
    assert contention.run_crowded({**ended, "summary": "junk"}) is None
    assert contention.run_crowded({**ended, "settings": None}) is None
    assert contention.run_crowded({"status": "running"}) is None


def test_a_stored_runs_busy_machine_is_read_from_its_whole_run():
    """An ended run whose record says others took the cores it could have used reads as
    loaded, with what took them; a quiet one, a live one and damaged records do not."""
    busy = {"wall_s": 10.0, "others_cores": 1.2, "own_cores": 1.0, "cores": 2}
    ended = {"status": "finished", "summary": {"contention": busy}}
    assert contention.run_loaded(ended) == \
        "the machine was busy while it trained (others 1.20 cores, own 1.00, of 2)"
    quiet = {**busy, "others_cores": 0.03}
    assert contention.run_loaded({**ended, "summary": {"contention": quiet}}) is None
    # 16 cores: a neighbour on spare cores took nothing the run wanted
    assert contention.run_loaded({**ended, "summary": {"contention": {**busy,
                                                                        "cores": 16}}}) is None
    assert contention.run_loaded({**ended, "status": "running"}) is None
    for junk in ("junk", None, {"contention": "x"}, {"contention": {"others_cores": "1"}}):
        assert contention.run_loaded({**ended, "summary": junk}) is None


def test_a_loaded_round_is_trained_again_only_with_more_room_than_it_was_measured_with():
    # measured beside a hog (1 core of others on 2 cores): the same hog is no more room;
    # half of it is, and so is room for the runs unloaded
    assert not contention.more_room(0.95, 1.0, 1.0, cores=2)
    assert not contention.more_room(1.6, 1.0, 1.0, cores=2)
    assert contention.more_room(0.5, 1.0, 2.0, cores=2)
    assert contention.more_room(0.4, 0.3, 1.0, cores=2)       # below room_for(1.0) = 0.5
    # nothing recorded about the load then: only room for the runs counts
    assert not contention.more_room(0.5, None, 2.0, cores=2)
    assert contention.more_room(0.05, None, 2.0, cores=2)


def test_a_run_whose_threads_outnumber_the_free_cores_says_so_while_it_trains_device_cpu(
        tmp_path):
    """device=cpu, beside real CPU hogs (one a core but one): a run of 2 torch threads says,
    while it trains, that they outnumber the free cores (its log, the run's live note that
    the run table shows) and, once stopped, over its whole run (`runs`)."""
    import os
    import signal

    from conftest import QUICK, db_rows, sets, tt, tt_popen, wait_until
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(max(1, (os.cpu_count() or 2) - 1))]
    try:
        proc = tt_popen("run", "--session", str(tmp_path),
                        *sets(*QUICK, "device=cpu", "num_threads=2", "epochs=500"))

        def live_note() -> str | None:
            if not (tmp_path / "session.sqlite").exists():
                return None                     # (connecting would create it)
            try:
                rows = db_rows(tmp_path, "SELECT crowded FROM runs WHERE status = 'running'")
            except Exception:               # noqa: BLE001 - not created yet
                return None
            return rows[0][0] if rows else None
        if not wait_until(lambda: live_note() is not None or proc.poll() is not None,
                          timeout=120) or proc.poll() is not None:
            proc.kill()
            raise AssertionError(f"no crowded note while it trained: {proc.communicate(30)}")
        os.kill(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=120)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    note = live_note() or db_rows(tmp_path, "SELECT crowded FROM runs")[0][0]
    assert note.startswith("2 threads, ") and "num_threads = 1 would not" in note, note
    assert note in (tmp_path / "logs" / "run-1.log").read_text()
    r = tt("runs", "--session", str(tmp_path))
    assert r.rc == 0 and "run 1 stopped, crowded: 2 threads, " in r.out, r.out


def test_how_idle_threads_wait_changes_no_bit_device_cpu(tmp_path):
    """device=cpu, 2 torch threads: the spin count the tool gives libgomp (how an idle
    OpenMP thread waits, core.processes.supervisor.THREAD_WAIT) against libgomp's own default,
    in two cold processes (libgomp reads it as torch loads it): the same parameter hashes at
    every step, and each run's settings say how its threads waited."""
    import os

    from conftest import QUICK, fingerprints, sets
    from tui_trainer.core.session.store import SessionStore
    from tui_trainer.core.processes.supervisor import THREAD_WAIT
    procs = []
    for spin, session in ((THREAD_WAIT["GOMP_SPINCOUNT"], tmp_path / "a"),
                          ("300000", tmp_path / "b")):
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tui_trainer", "run", "--session", str(session),
             *sets(*QUICK, "device=cpu", "num_threads=2", "max_steps=12")],
            env={**env, "GOMP_SPINCOUNT": spin}, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True))
    for p in procs:
        assert p.wait(timeout=240) == 0, p.stderr.read()
    a, b = fingerprints(tmp_path / "a", 1), fingerprints(tmp_path / "b", 1)
    assert len(a) >= 4 and a == b
    waits = [SessionStore(tmp_path / s, create=False, readonly=True).run(1)["settings"]
             ["omp_wait"] for s in ("a", "b")]
    assert waits == [f"spin {THREAD_WAIT['GOMP_SPINCOUNT']}", "spin 300000"]


def test_an_arm_whose_runs_were_crowded_says_so_in_its_verdict_and_under_the_table():
    """The A/B table's words for an arm whose runs' threads outnumbered the free cores
    (core.analysis.study, from each finished run's note): its verdict counts the rounds, and a
    line under the table (and in the A/B tab) gives the note whole."""
    from tui_trainer.core.analysis import study, study_text
    note = contention.crowded(_c(1.0, 1.2, 2), 2, "cpu")
    row = study.Row(position=1, label="amp=bf16", run_id=3, status="finished", rounds=6,
                    crowded_rounds=[0, 2, 5], crowded=note)
    assert study_text.crowded_text(row) == "; its threads outnumbered the free cores in 3 of 6 " \
        "rounds"
    assert study_text.verdict_text(row).endswith(study_text.crowded_text(row))     # not yet a verdict
    row.verdicts, row.intervals = {"samples_per_s": "1.20x faster"}, {}
    assert study_text.verdict_text(row) == "1.20x faster" + study_text.crowded_text(row)
    (line,) = study_text.crowded_lines([study.Row(position=0, label="base", run_id=1,
                                             status="finished", rounds=6), row])
    assert line == f"amp=bf16: its threads outnumbered the free cores in 3 of 6 rounds: {note}"
