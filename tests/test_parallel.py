"""Data-parallel runs through torchrun: two processes with gloo on the CPU, the shipped MNIST
sample, a few steps. Real torchrun launchers and ranks, a real session: determinism of the
same config twice, a SIGKILL of the launcher and of one rank mid-epoch resumed bit-exact,
the crash naming the rank, Stop and Continue through the dashboard's supervisor, and one run
across two launcher agents (nnodes = 2) over the loopback address."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import (QUICK, db_rows, fingerprints, in_private_mount, kept_agrees, sets, tt,
                      tt_popen, wait_for_row, wait_until)
from tui_trainer.core.settings import config
from tui_trainer.core.processes.liveness import HEARTBEAT_S
from tui_trainer.core.session.reader import stall_note
from tui_trainer.core.session.store import SessionStore
from tui_trainer.core.processes.supervisor import Supervisor, rank_label

# 650 digits over 2 ranks: 325 each, 11 batches of 32 an epoch (a padded last one), 4 epochs.
# One thread per process, whatever the machine's cores (the two-machine test compares bits).
# Claims about the CPU and gloo (its time-outs, its messages), on a GPU machine too.
PARALLEL = [*QUICK, "train_samples=650", "nproc=2", "epochs=4", "log_every=1",
            "fingerprint_every=5", "checkpoint_every=5", "augment=torch", "num_threads=1",
            "device=cpu"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> tuple[Path, dict[int, str]]:
    """The parallel config trained straight through: the reference for every resume. Run
    with the installed `tui-trainer` script, as a person types it (its ranks were once
    refused there, the agent's command line not being `python -m tui_trainer`)."""
    session = tmp_path_factory.mktemp("straight")
    script = Path(sys.executable).parent / "tui-trainer"
    assert script.exists(), f"the installed script is not at {script}"
    p = subprocess.run([str(script), "run", "--session", str(session), "--json",
                        *sets(*PARALLEL)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["status"] == "finished" and summary["steps"] == 44
    return session, fingerprints(session, 1)


def test_knobs_are_checked_before_anything_starts(tmp_path):
    with pytest.raises(config.ConfigError, match="batch_size.*nproc x nnodes = 3"):
        config.from_dict({"nproc": 3, "batch_size": 64})
    with pytest.raises(config.ConfigError, match="rdzv_endpoint.*HOST:PORT"):
        config.from_dict({"nnodes": 2})
    with pytest.raises(config.ConfigError, match="device.*local rank"):
        config.from_dict({"nproc": 2, "device": "cuda:1"})
    assert config.from_dict({"nnodes": 2, "rdzv_endpoint": "10.0.0.1:29400"}).nnodes == 2
    r = tt("run", "--session", str(tmp_path / "s"), *sets(*QUICK, "nproc=2", "device=cpu",
                                                             "dist_backend=nccl"))
    assert r.rc == 2 and "dist_backend" in r.err and "nccl needs CUDA" in r.err
    assert not (tmp_path / "s" / "session.sqlite").exists() or \
        not db_rows(tmp_path / "s", "SELECT id FROM runs")          # nothing written


def test_the_failed_rank_is_named_not_the_one_that_aborted_on_its_way_out(tmp_path):
    """How the launcher names the rank that took a group down, from how each rank ended and
    its last words on stderr (torchrun's per-rank logs). CI once read "rank 1 was killed by
    SIGABRT" for a full disk on rank 0: rank 1 had said another rank ended first, then
    aborted in gloo on its way out. A rank whose own words say it stopped because of
    another is a consequence, whatever signal it died of."""
    from tui_trainer.engine.distributed import RankFailure, failure_reason

    def reason(*ranks: tuple[str, int, str | None]) -> str:
        """ranks: each rank's (last words, exit status, signal), rank = position."""
        logs = tmp_path / f"logs{len(list(tmp_path.iterdir()))}"
        failures = []
        for rank, (words, exitcode, sig) in enumerate(ranks):
            f = logs / "run" / "attempt_0" / str(rank) / "stderr.log"
            f.parent.mkdir(parents=True)
            f.write_text(words)
            failures.append(RankFailure(rank=rank, local_rank=rank, exitcode=exitcode,
                                        pid=100 + rank, host="h", signal=sig))
        return failure_reason(failures, logs, len(ranks), 900)

    full = "tui-trainer: no space left on device while writing /s/step-10.pt"
    after = ("12:00:00 stopping: another rank ended first (its connection closed); its own "
             "output says why\nterminate called without an active exception\n")
    why = reason((full, 1, None), (after, -6, "SIGABRT"))
    assert why.startswith("rank 0 (pid 100 on h) exited with status 1"), why
    assert why.endswith("its last words: no space left on device while writing /s/step-10.pt")
    # The other way round: rank 1 killed outright, rank 0 (the lead) aborts after saying so.
    why = reason((after, -6, "SIGABRT"), ("", -9, "SIGKILL"))
    assert why.startswith("rank 1 (pid 101 on h) was killed by SIGKILL"), why
    # Every rank a consequence (none said why): the one killed by a signal is named.
    why = reason((after, 1, None), (after, -6, "SIGABRT"))
    assert why.startswith("rank 1 (pid 101 on h) was killed by SIGABRT"), why


def test_same_parallel_config_twice_is_bit_identical(straight, tmp_path):
    """Trained again, with activation checkpointing this time (its recomputed blocks under
    DDP draw each rank's own dropout masks again): bit-identical to the reference."""
    session, reference = straight
    r = tt("run", "--session", str(tmp_path), "--json",
           *sets(*PARALLEL, "activation_checkpointing=full"))
    assert r.rc == 0, r.err
    assert fingerprints(tmp_path, 1) == reference
    run = SessionStore(tmp_path, create=False, readonly=True).run(1)
    assert run["settings"]["activation_checkpointing"] == "full"
    assert run["settings"]["world_size"] == 2 and run["settings"]["dist_backend"] == "gloo"
    assert run["settings"]["batch_per_process"] == 32
    assert set(run["summary"]["rank_peaks"]) == {"0", "1"}
    # the run's host memory counts both ranks: rank 1's own pages beside rank 0's RSS
    mem = db_rows(tmp_path, "SELECT peak_rss, ranks_uss FROM steps WHERE run_id = 1")
    assert mem and all(others > 1e6 for _, others in mem), mem
    listed, = tt("runs", "--session", str(tmp_path), "--json").json
    assert listed["peak_memory_mib"] >= max(p + o for p, o in mem) / 2**20 - 1e-6
    log = (tmp_path / "logs" / "run-1.log").read_text()
    assert rank_label(0) in log and rank_label(1) in log    # every rank's output, labelled
    events = [k for (k,) in db_rows(tmp_path, "SELECT kind FROM events WHERE run_id = 1")]
    assert "replicas_drift" not in events
    # Continuing it with another number of processes is refused, naming the key.
    r = tt("resume", "1", "--session", str(tmp_path), "--set", "nproc=1")
    assert r.rc == 2 and "nproc" in r.err and "as many processes" in r.err


def test_launcher_killed_mid_epoch_resumes_bit_exact(straight, tmp_path):
    """--kill-at-step SIGKILLs the launcher (torchrun's agent) at step 16, mid-epoch 2; its
    ranks die with it. The resumed run reproduces every hash of the straight one."""
    _, reference = straight
    r = tt("run", "--session", str(tmp_path), "--json", "--kill-at-step", "16",
           *sets(*PARALLEL))
    assert r.rc == -signal.SIGKILL
    # The ranks die with their launcher; the run then reads crashed (once rank 0's process
    # has finished exiting: a killed process with a big address space takes a moment).
    store = SessionStore(tmp_path, create=False, readonly=True)
    deadline = time.time() + 30
    while time.time() < deadline and store.run(1)["status"] != "crashed":
        time.sleep(0.2)
    assert store.run(1)["status"] == "crashed"
    # Every rank got its SIGKILL with the launcher's death; rank 1 may still be tearing
    # down its memory a moment after rank 0 is gone, so this waits (bounded) for it to end.
    # (a rank is titled "tui-trainer run 1 rank R/2 (session ...)": core/processes/proctitle.py)
    ranks = [p for p in psutil.process_iter(["cmdline"])
             if " rank " in " ".join(p.info["cmdline"] or [])
             and str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    _, alive = psutil.wait_procs(ranks, timeout=30)
    assert not alive
    r = tt("resume", "1", "--session", str(tmp_path), "--json")
    assert r.rc == 0, r.err
    assert r.json["resumed_from_step"] == 15 and r.json["steps"] == 44
    assert fingerprints(tmp_path, 1) == reference


def test_one_rank_killed_ends_the_run_as_crashed_naming_it(straight, tmp_path):
    _, reference = straight
    proc = tt_popen("run", "--session", str(tmp_path), "--json", *sets(*PARALLEL))
    wait_for_row(tmp_path, "SELECT 1 FROM steps WHERE run_id = 1 AND step >= 18")
    ranks = [p for p in psutil.Process(proc.pid).children(recursive=True)
             if _rank_of(p) == "1"]
    assert len(ranks) == 1
    ranks[0].send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert f"rank 1 (pid {ranks[0].pid}" in err and "SIGKILL" in err
    run = SessionStore(tmp_path, create=False, readonly=True).run(1)
    assert run["status"] == "crashed" and "rank 1" in run["summary"]["error"]
    kept_agrees(tmp_path, 1)            # a crashed data-parallel run's, kept by its launcher
    r = tt("resume", "1", "--session", str(tmp_path), "--json")
    assert r.rc == 0, r.err
    assert r.json["steps"] == 44 and fingerprints(tmp_path, 1) == reference
    kept_agrees(tmp_path, 1)            # and the resumed one's


@pytest.mark.slow
def test_stop_and_continue_through_the_supervisor(straight, tmp_path):
    """As the dashboard does it: Start, Stop (SIGTERM to the run's process: every rank stops
    at the same step, one checkpoint), Continue, to the same bits."""
    _, reference = straight
    with SessionStore(tmp_path) as store:
        sup = Supervisor(store)
        # Ten times longer than the reference, so that the stop lands early whatever the
        # load; it is continued to the reference's length (epochs may change on resume).
        run_id = sup.start(config.load(overrides=[*PARALLEL, "epochs=40"]).to_dict())
        wait_for_row(tmp_path, "SELECT 1 FROM steps WHERE run_id = 1 AND step >= 3")
        assert sup.stop(run_id)
        deadline = time.time() + 120
        while sup.children() and time.time() < deadline:
            time.sleep(0.2)
        sup.reap()
        run = store.run(run_id)
        # (why not, when not: a stop forced after the grace, or a rank's failure)
        assert run["status"] == "stopped", (run["status"], run["summary"])
        assert store.usable_checkpoints(run_id)[0]["step"] == run["step"] < 44
        sup.resume(run_id, {"epochs": 4})
        deadline = time.time() + 180
        while sup.children() and time.time() < deadline:
            time.sleep(0.2)
        sup.reap()
        assert store.run(run_id)["status"] == "finished"
    got = fingerprints(tmp_path, run_id)
    stopped_at = run["step"]
    if stopped_at not in reference:
        del got[stopped_at]       # the stop's own hash, between two periodic ones
    assert got == reference


def test_two_launcher_agents_over_loopback(straight, tmp_path):
    """nnodes = 2: node 0 holds the session and starts the run, node 1 joins it; with one
    process on each, the run is the two-process run of one machine, bit for bit."""
    _, reference = straight
    endpoint = f"127.0.0.1:{_free_port()}"
    # num_threads = 1 as in PARALLEL: by default one process per machine would take every
    # core, and another thread count sums in another order (the verdict names num_threads).
    cfg = [p for p in PARALLEL if not p.startswith("nproc=")] + \
        ["nproc=1", "nnodes=2", f"rdzv_endpoint={endpoint}"]
    node0 = tt_popen("run", "--session", str(tmp_path), "--json", *sets(*cfg))
    node1 = tt_popen("join", endpoint, "--nnodes", "2", "--nproc", "1", "--node-rank", "1")
    out1, err1 = node1.communicate(timeout=180)
    out0, err0 = node0.communicate(timeout=180)
    assert node0.returncode == 0, err0
    assert node1.returncode == 0, err1
    assert "ended cleanly" in out1
    assert fingerprints(tmp_path, 1) == reference


@pytest.mark.parametrize("torchrun_env", [False, True])
def test_worker_by_hand_is_refused_and_changes_nothing(tmp_path, monkeypatch, torchrun_env):
    """`worker` outside a torchrun group it belongs to (by hand; even with torchrun's
    variables set) would retrain the run from step 0 with any --set: refused, exit 2."""
    with SessionStore(tmp_path) as store:
        run_id = store.create_run(config.DEFAULTS.to_dict(), name="done")
        store.end_run(run_id, "finished", {"steps": 40})
    if torchrun_env:
        for key, value in (("TORCHELASTIC_RUN_ID", "x"), ("RANK", "0"), ("WORLD_SIZE", "1")):
            monkeypatch.setenv(key, value)
    before = db_rows(tmp_path, "SELECT status, config, summary FROM runs")
    r = tt("worker", "--session", str(tmp_path), "--run-id", str(run_id), "--set", "lr=5")
    assert r.rc == 2 and "not run by hand" in r.err
    assert db_rows(tmp_path, "SELECT status, config, summary FROM runs") == before


def test_a_failed_rank_explains_itself_with_its_last_words(tmp_path):
    """The stored reason of a rank's failure carries the last lines it wrote to stderr, from
    its newest launch, where torchrun keeps them (an abort's message included)."""
    import os as _os

    from tui_trainer.engine.distributed import STDERR_TAIL_CHARS, stderr_tail
    old = tmp_path / "a1" / "attempt_0" / "1" / "stderr.log"
    new = tmp_path / "b2" / "attempt_0" / "1" / "stderr.log"
    for path, text in ((old, "an earlier launch\n"),
                       (new, "step 3\n\nterminate called without an active exception\n"
                             "tui-trainer: no space left on device\n")):
        path.parent.mkdir(parents=True)
        path.write_text(text)
    _os.utime(old, (1, 1))
    assert stderr_tail(tmp_path, 1) == ("step 3 | terminate called without an active "
                                        "exception | tui-trainer: no space left on device")
    assert stderr_tail(tmp_path, 0) == ""
    new.write_text("x" * 5000 + "\n")
    assert len(stderr_tail(tmp_path, 1)) == STDERR_TAIL_CHARS + 1
    outside = tmp_path.parent / f"{tmp_path.name}-secret"
    outside.write_text("a secret outside the session\n")
    link = tmp_path / "c3" / "attempt_0" / "2" / "stderr.log"
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)                # a hostile session's link leading out
    assert stderr_tail(tmp_path, 2) == ""


@pytest.mark.parametrize("endpoint, key", [("127.0.0.1:99999", "PORT must be 1 to 65535"),
                                           ("no-such-host.invalid:29400", "not a host")])
def test_join_refuses_an_endpoint_it_cannot_use(endpoint, key):
    r = tt("join", endpoint, "--nnodes", "2", "--nproc", "1", "--node-rank", "1", timeout=180)
    assert r.rc == 2 and key in r.err and r.err.count("\n") == 1


def test_join_refuses_a_collective_timeout_out_of_range():
    r = tt("join", "127.0.0.1:29400", "--nnodes", "2", "--nproc", "1", "--node-rank", "1",
           "--dist-timeout", "5", timeout=180)
    assert r.rc == 2 and "dist_timeout" in r.err and "10" in r.err


def test_join_with_no_node_0_says_what_it_waits_for_and_gives_up(tmp_path, monkeypatch):
    """Nothing listens at the endpoint: one line says what is waited for, a bounded wait,
    one line says why it gave up (no C++ frames), and nothing is left in the temporary
    folder (one of the test's own: another test's `join` may be running beside it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    t0 = time.monotonic()
    r = tt("join", f"127.0.0.1:{port}", "--nnodes", "2", "--nproc", "1", "--node-rank", "1",
           "--timeout", "3", timeout=120)
    assert r.rc == 1 and time.monotonic() - t0 < 90
    lines = r.err.strip().splitlines()
    assert "waiting for node 0" in lines[0] and "at most 3 s" in lines[0]
    assert "did not meet" in lines[-1] and len(lines) <= 4, r.err
    assert list(tmp.glob("tui-trainer*")) == []      # (torch keeps a cache of its own there)


def _rank_of(p: psutil.Process) -> str | None:
    """A rank's number, from its title ("tui-trainer run 1 rank 1/2 (session ...)":
    core/processes/proctitle.py; setproctitle writes it over the process's environment)."""
    found = re.search(r" rank (\d+)/\d+", " ".join(p.cmdline()))
    return found.group(1) if found else None


def _ranks(agent_pid: int) -> dict[str | None, psutil.Process]:
    return {_rank_of(p): p for p in psutil.Process(agent_pid).children()}


@pytest.mark.slow
def test_a_hung_rank_ends_the_run_after_dist_timeout_naming_the_hang(tmp_path):
    """A rank that stops answering (SIGSTOP) holds its peers in the gradients' all-reduce:
    while it hangs the run's process beats but its step does not move (what reads stalled);
    after dist_timeout the waiting rank gives up and the run is crashed saying the group
    hung, not "exited with status 1"; every process ends."""
    proc = tt_popen("run", "--session", str(tmp_path), "--json",
                    *sets(*PARALLEL, "epochs=400", "dist_timeout=15"))
    wait_for_row(tmp_path, "SELECT 1 FROM steps WHERE run_id = 1 AND step >= 6")
    # (its heartbeat has measured its pace: two beats while it stepped)
    wait_for_row(tmp_path, "SELECT 1 FROM runs WHERE id = 1 AND pace_s > 0")
    ranks = _ranks(proc.pid)
    ranks["1"].suspend()

    def beating_but_not_moving() -> bool:        # two beats or more since the step moved
        (beat, moved, status), = db_rows(tmp_path, "SELECT heartbeat, progressed, status "
                                                   "FROM runs WHERE id = 1")
        return status == "running" and beat - moved >= 2 * HEARTBEAT_S
    assert wait_until(beating_but_not_moving, timeout=180)
    # It reads stalled at its own pace (20 of its steps, at least 5 s), long before the
    # fixed minute that would come after dist_timeout had ended it, and says the pace.
    store = SessionStore(tmp_path, create=False, readonly=True)
    assert wait_until(lambda: store.run(1)["stalled_s"] is not None, timeout=10), \
        {k: store.run(1)[k] for k in ("busy", "pace_s", "progressed", "heartbeat", "step")}
    run = store.run(1)
    assert run["status"] == "running" and run["pace_s"] > 0, run
    assert "it stepped every" in stall_note(run) and "without a step reads stalled" in \
        stall_note(run)
    # Rank 0 gives up after dist_timeout and stores the run crashed; then the stopped rank
    # is let go, so that it ends on the agent's SIGTERM instead of 30 s later by SIGKILL.
    wait_for_row(tmp_path, "SELECT 1 FROM runs WHERE id = 1 AND status = 'crashed'")
    ranks["1"].resume()
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 1, err[-3000:]
    run = SessionStore(tmp_path, create=False, readonly=True).run(1)
    assert run["status"] == "crashed", run
    why = run["summary"]["error"]
    assert "the group hung: rank 0 waited 15 s (dist_timeout)" in why, why
    assert "Timed out waiting 15000ms" in why, why
    assert "group hung" in err.strip().splitlines()[-1], err[-3000:]
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                   for p in ranks.values())


@pytest.mark.slow
def test_stop_ends_a_group_stuck_in_a_collective_within_its_grace(straight, tmp_path):
    """Stop on a run whose rank hangs (SIGSTOP), with a collective timeout far away: the
    rank 0 that Stop used to signal waits in the all-reduce and never sees it. Stop goes to
    the run's torchrun agent, which passes it to every rank and kills those still there
    stop_grace_s() later: the run ends in seconds, stored as stopped by force with an event,
    and continues from its checkpoint to the same bits."""
    from tui_trainer.core.processes.supervisor import stop_grace_s
    _, reference = straight
    with SessionStore(tmp_path) as store:
        sup = Supervisor(store)
        run_id = sup.start(config.load(overrides=[*PARALLEL, "epochs=40",
                                             "dist_timeout=3600"]).to_dict())
        wait_for_row(tmp_path, "SELECT 1 FROM steps WHERE run_id = 1 AND step >= 6")
        agent = psutil.Process(store.run(run_id)["pid"]).parent()
        ranks = _ranks(agent.pid)
        ranks["1"].suspend()
        assert sup.stop(run_id)
        asked = time.monotonic()
        assert wait_until(lambda: not sup.children(), timeout=stop_grace_s() + 90)
        took = time.monotonic() - asked
        sup.reap()
        run = store.run(run_id)
        assert run["status"] == "crashed", (run, took)
        assert run["summary"]["error"].startswith(f"stopped by force at step {run['step']}")
        assert f"had not stopped {stop_grace_s()} s after" in run["summary"]["error"]
        assert [e["kind"] for e in store.events(run_id)][-1] == "stop_forced"
        assert not any(p.is_running() for p in [agent, *ranks.values()])
        sup.resume(run_id, {"epochs": 4})
        assert wait_until(lambda: not sup.children(), timeout=180)
        sup.reap()
        assert store.run(run_id)["status"] == "finished"
    assert fingerprints(tmp_path, run_id) == reference


def test_a_full_disk_mid_checkpoint_is_told_in_one_line_and_resumes_exactly(straight,
                                                                            tmp_path):
    """No space left while rank 0 writes a checkpoint: the stored and printed reason says
    so (not only "exited with status 1"), no rank prints a Python traceback (rank 1 says in
    one line that another rank ended first), nothing written before is lost, and the run
    continues after space is freed to the same bits as one never interrupted."""
    _, reference = straight
    disk = tmp_path / "disk"
    p = in_private_mount(f"""
        mkdir -p {disk}
        mount -t tmpfs -o size=900k tmpfs {disk}
        python -m tui_trainer run --session {disk}/s --json \
            {' '.join(sets(*PARALLEL, 'keep_checkpoints=100'))} > {tmp_path}/run.json \
            2> {tmp_path}/run.err || echo "run rc=$?"
        mount -o remount,size=64m {disk}
        python -m tui_trainer resume 1 --session {disk}/s --json > {tmp_path}/resume.json \
            2> {tmp_path}/resume.err || echo "resume rc=$?"
        cp -a {disk}/s {tmp_path}/after
    """)
    err = (tmp_path / "run.err").read_text()
    assert "run rc=1" in p.stdout, p.stdout + p.stderr + err
    assert "Traceback" not in err, err
    assert rank_label(1) in err and "another rank ended first" in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("tui-trainer: training failed: rank 0") and \
        "its last words: no space left on device while writing" in last, last
    run = SessionStore(tmp_path / "after", create=False, readonly=True).run(1)
    failures = [e for e in SessionStore(tmp_path / "after", create=False, readonly=True)
                .events(1) if e["kind"] == "failure"]
    assert any("no space left on device" in e["message"] and "rank 0" in e["message"]
               for e in failures), failures
    assert "resume rc=" not in p.stdout, (tmp_path / "resume.err").read_text()
    assert run["status"] == "finished" and fingerprints(tmp_path / "after", 1) == reference


def test_a_torchrun_without_shutdown_timeout_is_given_none(tmp_path):
    """torch 2.11's torchrun has no --shutdown-timeout and refused every data-parallel run
    given it (seen on the H100 machine); the flag is passed only where torchrun's own source
    has it, and the stop message says the grace that then holds."""
    import os
    import textwrap
    import torch
    from tui_trainer.core.processes.supervisor import (STOP_GRACE_S, TORCHRUN_GRACE_S,
                                                       torchrun_args, torchrun_knows)
    pinned = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 15)
    # the pinned torch has both flags (torch 2.11's, on the H100 machine, neither)
    assert torchrun_knows("--shutdown-timeout") or not pinned
    assert (torchrun_args(2, 1, "", ["worker"], tmp_path)[6:8] ==
            ["--shutdown-timeout", str(STOP_GRACE_S)]) == torchrun_knows("--shutdown-timeout")
    assert torchrun_knows("--log-line-prefix-template") or not pinned
    old = tmp_path / "old" / "torch"
    (old / "distributed").mkdir(parents=True)
    (old / "__init__.py").write_text("")
    (old / "distributed" / "run.py").write_text('parser.add_argument("--max-restarts")\n')
    code = textwrap.dedent("""
        from pathlib import Path
        from tui_trainer.core.processes.supervisor import rank_label, stop_grace_s, torchrun_args
        args = torchrun_args(2, 1, "", ["worker"], Path("logs"))
        print("--shutdown-timeout" in args, "--max-restarts" in args, stop_grace_s(),
              "--log-line-prefix-template" in args, rank_label(1))
    """)
    root = Path(__file__).resolve().parent.parent
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env={**os.environ,
                                        "PYTHONPATH": f"{old.parent}{os.pathsep}{root}"})
    assert p.stdout.split() == ["False", "True", str(TORCHRUN_GRACE_S), "False",
                                "[default1]:"], p.stderr


def test_a_data_parallel_run_whose_ranks_refuse_the_model_stores_nothing(tmp_path):
    """A net that cannot take the data's images, in a 2-process run: every rank refuses
    (rank 1 with rank 0's reason: it said "RuntimeError: rank 0 could not set up" and the
    run was stored crashed, exit 1), so `run` exits 2 and stores nothing, as one process
    does; the dashboard's Start (the supervisor, `--new`) removes its run and its logs and
    keeps the refusal, read from a rank's line, for the form (issue 68, point 4)."""
    net = tmp_path / "rgb.py"
    net.write_text("from torch import nn\n\n\ndef rgb():\n    return nn.Sequential("
                   "nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(10))\n")
    bad = [*PARALLEL, f"model={net}:rgb"]
    s = tmp_path / "cli"
    r = tt("run", "--session", str(s), *sets(*bad))
    assert r.rc == 2 and "model: rgb in" in r.err and "cannot take a batch" in r.err, r.err
    assert "training failed" not in r.err and db_rows(s, "SELECT count(*) FROM runs") == [(0,)]
    assert not any((s / "logs").iterdir())
    d = tmp_path / "dashboard"
    with SessionStore(d) as store:
        sup = Supervisor(store)
        run_id = sup.start(config.load(overrides=bad).to_dict())
        deadline = time.time() + 120
        while sup.children() and time.time() < deadline:
            time.sleep(0.2)
        sup.reap()
        assert [(rid, line.split(": ")[0]) for rid, line, _ in sup.refused] == [(run_id, "model")]
        assert "cannot take a batch" in sup.refused[0][1]
        assert store.runs() == [] and not any(store.logs_dir.iterdir())
