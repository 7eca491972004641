"""Was the machine fit to measure (core.contention): what counts as another process's load,
on a 2-core machine and on a 16-core GPU machine, and the study's own processes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tui_trainer.core import contention


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
        from tui_trainer.core import contention
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
