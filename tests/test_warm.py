"""The warm launcher: runs forked from a process that imported torch once start at once and
train exactly as a cold-started process does."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from conftest import (QUICK, alive, db_rows, fingerprints, launch_config, live_children,
                      sets, started_launcher, tt, wait_until)
from tui_trainer.core.session.store import SessionStore
from tui_trainer.core.processes.supervisor import launch, train_args
from tui_trainer.launcher.client import WARM_LINE, WarmChild, WarmLauncher

@pytest.fixture(scope="module")
def warm():
    """A launcher of the module's own (each costs a torch import), shared by the tests that
    leave it as they found it; in a runtime folder of its own, since each test's is removed
    after it (conftest)."""
    import shutil
    import tempfile
    runtime = tempfile.mkdtemp(prefix="ttrun-")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_RUNTIME_DIR", runtime)
        launcher = started_launcher()
    yield launcher
    launcher.close()
    shutil.rmtree(runtime, ignore_errors=True)


@pytest.fixture
def doomed_warm():
    """A launcher for one test, which kills it."""
    launcher = started_launcher()
    yield launcher
    launcher.close()


def _group_nice(pid: int) -> int | None:
    """The nice value of the live process's autogroup; None where the kernel has none, or
    where the process's CPU share is a cgroup's, not an autogroup's (the kernel then writes
    nothing in the file: CI's containers)."""
    if not Path("/proc/self/autogroup").exists():
        return None
    text = Path(f"/proc/{pid}/autogroup").read_text()
    return int(text.split("nice")[1]) if "nice" in text else None


def _group(pid: int) -> str:
    """Which autogroup the process is in (`/autogroup-N`)."""
    return Path(f"/proc/{pid}/autogroup").read_text().split()[0]


def test_a_forked_run_is_bit_identical_to_a_cold_one(tmp_path, warm):
    with SessionStore(tmp_path) as store:
        ids = {}
        for how in ("warm", "cold", "warm-again"):
            # dropout, shuffling and numpy-drawn augmentation: every RNG a run uses
            run_id = store.create_run(launch_config(augment="numpy"), name=how)
            proc = launch(tmp_path, train_args(run_id), store.log_path(run_id),
                          warm=None if how == "cold" else warm)
            assert isinstance(proc, WarmChild) == (how != "cold")
            if how != "warm-again":
                # Out of the terminal's signals (a process group of its own: it outlives
                # the dashboard), and never ranked below the machine's other programs (issue
                # 54): in the caller's session, so in its scheduling group (the launcher's
                # too), at the launcher's nice value (0 here: not the dashboard's), its
                # group not niced.
                assert wait_until(lambda: os.getpgid(proc.pid) == proc.pid)
                assert os.getsid(proc.pid) == os.getsid(0) == os.getsid(warm._proc.pid)
                assert os.getpriority(os.PRIO_PROCESS, proc.pid) == warm.nice == 0
                assert _group_nice(proc.pid) in (None, 0)
                if _group_nice(proc.pid) is not None:
                    assert _group(proc.pid) == _group(os.getpid())
            if how == "warm":       # forked by the launcher
                assert int(Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1]
                           .split()[1]) == warm._proc.pid
            assert proc.wait(timeout=120) == 0
            ids[how] = run_id
        logs = {how: store.log_path(r).read_text() for how, r in ids.items()}
    assert WARM_LINE in logs["warm"] and WARM_LINE not in logs["cold"]
    fp = {how: fingerprints(tmp_path, r) for how, r in ids.items()}
    assert len(fp["cold"]) >= 4 and fp["warm"] == fp["cold"] == fp["warm-again"]
    statuses = db_rows(tmp_path, "SELECT status FROM runs ORDER BY id")
    assert statuses == [("finished",)] * 3


def test_the_dashboards_runs_train_below_it_in_its_own_scheduling_group_only(tmp_path):
    """The dashboard's launcher (nice = supervisor.TRAINING_NICE, as dashboard_nice() gives
    where sessions are the scheduler's groups): its forked runs, and a run started cold in
    its place before it is ready, train at that nice value, each a process group of its own
    in the dashboard's session, so in the dashboard's autogroup, which is not niced: below
    the dashboard, never below the machine's other programs (issue 54)."""
    import shutil
    import tempfile

    from tui_trainer.core.processes.supervisor import TRAINING_NICE
    runtime = tempfile.mkdtemp(prefix="ttrun-")       # (as the module's launcher's)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_RUNTIME_DIR", runtime)
        launcher = WarmLauncher(nice=TRAINING_NICE)
        with SessionStore(tmp_path / "s") as store:
            procs = []
            for how in ("cold", "warm"):
                if how == "warm":
                    launcher.start()
                    assert launcher.wait_ready(120)
                run_id = store.create_run(launch_config(max_steps=2), name=how)
                proc = launch(tmp_path / "s", train_args(run_id), store.log_path(run_id),
                              warm=launcher)
                assert isinstance(proc, WarmChild) == (how == "warm")
                assert wait_until(lambda: os.getpgid(proc.pid) == proc.pid)
                # (a cold one is `nice`, which sets its value and then executes Python)
                assert wait_until(lambda: os.getpriority(os.PRIO_PROCESS, proc.pid)
                                  == TRAINING_NICE, timeout=30)
                assert os.getsid(proc.pid) == os.getsid(0)
                if _group_nice(proc.pid) is not None:
                    assert _group(proc.pid) == _group(os.getpid())
                    assert _group_nice(proc.pid) == 0
                procs.append(proc)
            for p in procs:             # where they train is the claim, not what
                p.kill()
                p.wait(timeout=60)
        launcher.close()
    shutil.rmtree(runtime, ignore_errors=True)


def test_forked_runs_without_a_seed_draw_their_own(tmp_path, warm):
    """seed = none: as two cold processes, two forks of one launcher must not start alike
    (the launcher's RNG state is not handed on)."""
    with SessionStore(tmp_path) as store:
        ids = []
        for _ in range(2):
            run_id = store.create_run(launch_config(seed=None, max_steps=3), name="unseeded")
            assert launch(tmp_path, train_args(run_id), store.log_path(run_id),
                          warm=warm).wait(timeout=120) == 0
            ids.append(run_id)
    a, b = (fingerprints(tmp_path, r) for r in ids)
    assert a[0] != b[0]                 # different initial weights


def test_a_forked_run_killed_reports_its_signal_and_resumes_bit_exact(tmp_path, warm):
    with SessionStore(tmp_path) as store:
        straight = store.create_run(launch_config(), name="straight")
        assert launch(tmp_path, train_args(straight), store.log_path(straight),
                      warm=warm).wait(timeout=120) == 0
        killed = store.create_run(launch_config(), name="killed")
        proc = launch(tmp_path, train_args(killed, kill_at_step=8), store.log_path(killed),
                      warm=warm)
        assert proc.wait(timeout=120) == -signal.SIGKILL
        assert store.run(killed)["status"] == "crashed"
    r = tt("resume", str(killed), "--session", str(tmp_path), "--json")
    assert r.rc == 0, r.err
    assert fingerprints(tmp_path, killed) == fingerprints(tmp_path, straight)


def test_a_config_the_launcher_cannot_be_sent_still_forks_its_run(tmp_path, warm):
    """A run's config goes to the launcher as JSON (which spare suits it). One that is not
    JSON is left out of the request: the run is forked all the same and trains, rather than
    its Start failing. Holds on both devices."""
    with SessionStore(tmp_path) as store:
        cfg = launch_config(max_steps=2)
        run_id = store.create_run(cfg, name="odd config")
        proc = launch(tmp_path, train_args(run_id), store.log_path(run_id), warm=warm,
                      spare="auto", config={**cfg, "odd": object()})
        assert isinstance(proc, WarmChild) and proc.wait(timeout=120) == 0
        log = store.log_path(run_id).read_text()
    assert WARM_LINE in log and "was not used" not in log, log


def test_a_study_forks_its_runs_and_stops_cleanly(tmp_path):
    """`ab` starts a launcher of its own: every run's log says it was forked, the launcher
    is gone afterwards with its folder, and the variant is bit-identical where it should
    be."""
    runtime = os.environ["XDG_RUNTIME_DIR"]         # the test's own (conftest)
    r = tt("ab", "--session", str(tmp_path), "--json", *sets(*QUICK), "--steps", "4",
           "--vary", "eval_batch_size=100", "--repeats", "2", "--rerun-loaded", "0")
    assert r.rc == 0, r.err
    rows = json.loads(r.out)["rows"]
    assert rows[1]["bit_identical"] is True and rows[1]["done"] == 2
    for (run_id,) in db_rows(tmp_path, "SELECT id FROM runs"):
        assert WARM_LINE in (tmp_path / "logs" / f"run-{run_id}.log").read_text()
    assert wait_until(lambda: not _launchers(runtime))
    assert not list(Path(runtime).glob("tui-trainer/warm-*"))


def test_warm_starts_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv(WarmLauncher.ENV, "0")
    r = tt("ab", "--session", str(tmp_path), *sets(*QUICK), "--steps", "2",
           "--vary", "eval_batch_size=100", "--repeats", "1")
    assert r.rc == 0, r.err
    for (run_id,) in db_rows(tmp_path, "SELECT id FROM runs"):
        assert WARM_LINE not in (tmp_path / "logs" / f"run-{run_id}.log").read_text()


def _launchers(under: str) -> set[int]:
    """Warm launchers whose socket lies under `under`."""
    out = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"tui_trainer.launcher" in cmd and any(c.startswith(under.encode()) for c in cmd):
                out.add(int(proc.name))
    return out


# --- what the launcher and its clients trust (issue 19) -------------------------------------

@pytest.fixture
def short_tmp():
    """A folder with a short path (a socket's path has at most 107 bytes; pytest's tmp_path
    under a long TMPDIR, as on the device machine's round, is longer), removed after."""
    import shutil
    import tempfile
    folder = Path(tempfile.mkdtemp(prefix="tts-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _fake_launcher(folder: Path, answer) -> tuple[Path, list]:
    """A socket that answers every request with `answer` (a launcher that is not ours, or
    lies); returns its path and what it received."""
    import socket
    import threading
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / "launcher.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(str(path))
    server.listen(4)
    got: list = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 4)
            got.append(data)
            for fd in fds:
                os.close(fd)
            conn.send(answer if isinstance(answer, bytes) else json.dumps(answer).encode())
            conn.close()
    threading.Thread(target=serve, daemon=True).start()
    return path, got


def _spawn_into(launcher: WarmLauncher, log: Path):
    with open(log, "ab") as f:
        return launcher.spawn(["runs"], f.fileno(), f.fileno(), True, {"SECRET": "x"})


@pytest.mark.parametrize("answer", [{"pid": 1}, {"pid": "12"}, {"pid": True}, [], b"\xff",
                                    {"pid": os.getpid()}, {"error": "no"}])
def test_a_launcher_answer_is_believed_only_for_its_own_child(tmp_path, short_tmp, answer):
    """A pid that is not the launcher's child (pid 1, this test, nonsense) is never
    recorded, waited on or signalled: the run starts cold and its log says why."""
    path, got = _fake_launcher(short_tmp / "run", answer)
    log = tmp_path / "run.log"
    assert _spawn_into(WarmLauncher(str(path)), log) is None
    assert len(got) == 1 and "not used" in log.read_text()
    assert WARM_LINE not in log.read_text()


def test_nothing_is_sent_to_a_socket_in_a_folder_open_to_others(tmp_path, short_tmp):
    path, got = _fake_launcher(short_tmp / "open", {"pid": 1})
    (short_tmp / "open").chmod(0o755)
    log = tmp_path / "run.log"
    assert _spawn_into(WarmLauncher(str(path)), log) is None
    assert got == [] and "open to other users" in log.read_text()


def test_a_peer_of_another_user_is_refused(tmp_path):
    """SO_PEERCRED: the check is fed another uid, as a socket of another user would be."""
    import socket

    from tui_trainer.core.processes import trust
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with a, b:
        assert trust.check_peer(a) == os.getpid()
        with pytest.raises(trust.Untrusted, match="runs as uid"):
            trust.check_peer(a, uid=os.getuid() + 1)


def _fds(pid: int) -> list[str]:
    out = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            out.append(os.readlink(fd))
        except OSError:
            pass
    return out


def test_silent_and_bad_clients_neither_block_nor_leak(tmp_path, warm):
    """A client that connects and says nothing blocks no one; 40 bad requests with
    descriptors leave no descriptor open; a forked run holds none of the launcher's. A
    claim about the launcher, checked with a run on the CPU, which opens no socket or epoll
    of its own: CUDA's driver opens one while it starts (a socket to its daemon), which
    cannot be told from the launcher's by name. A CPU run does not start the driver (the
    H200's round of 2026-11-26 caught one holding that socket: it asked torch whether
    there was CUDA, which starts the driver; engine.knobs.machine_facts no longer asks for
    a run on the CPU)."""
    import socket
    launcher = warm._proc.pid
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    silent.connect(str(warm.path))
    before = len(_fds(launcher))
    for _ in range(40):
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as bad, \
                open(tmp_path / "x", "ab") as f:
            bad.connect(str(warm.path))
            socket.send_fds(bad, [b"{not json"], [f.fileno(), f.fileno()])
            bad.recv(4096)
    assert wait_until(lambda: len(_fds(launcher)) <= before)
    with SessionStore(tmp_path) as store:
        run_id = store.create_run(launch_config(max_steps=40, device="cpu"),
                                  name="beside a silent client")
        t0 = time.monotonic()
        proc = launch(tmp_path, train_args(run_id), store.log_path(run_id), warm=warm)
        assert isinstance(proc, WarmChild) and time.monotonic() - t0 < 4
        assert wait_until(lambda: WARM_LINE in store.log_path(run_id).read_text())
        held = _fds(proc.pid)
        assert not any("eventpoll" in h for h in held), held
        assert sum("socket:" in h for h in held) == 0, held
        assert proc.wait(timeout=120) == 0
    silent.close()


def test_a_run_outlives_its_launcher_without_a_false_failure(tmp_path, doomed_warm):
    """The launcher dies while its run trains: waiting does not spin, and the run's outcome
    is what it recorded, not the launcher's missing exit status. The run was the launcher's
    spare (device auto, one process), which dies with the launcher until it is given a run
    and not after; a next spare, if one was made yet, dies with it."""
    from tui_trainer.launcher.client import SPARE_LINE
    from tui_trainer.runner import train_child
    warm = doomed_warm
    with SessionStore(tmp_path) as store:
        run_id = store.create_run(launch_config(max_steps=60), name="orphaned")
        import threading
        result: dict = {}
        t = threading.Thread(target=lambda: result.update(
            s=train_child(store.__class__(tmp_path), run_id, train_args(run_id), warm=warm)))
        t.start()
        assert wait_until(lambda: store.run(run_id)["status"] == "running")
        assert SPARE_LINE in store.log_path(run_id).read_text()
        others = live_children(warm._proc.pid) - {store.run(run_id)["pid"]}    # a next spare
        os.kill(warm._proc.pid, signal.SIGKILL)
        assert wait_until(lambda: not any(alive(p) for p in others))
        cpu = time.process_time()
        t.join(120)
        assert not t.is_alive() and result["s"]["status"] == "finished"
        assert time.process_time() - cpu < 1.0      # waited, did not spin
        assert store.run(run_id)["status"] == "finished"


def test_stale_launcher_folders_are_swept(tmp_path):
    import subprocess

    from tui_trainer.core.processes import trust
    base = trust.runtime_base()
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = base / "warm-stale"
    stale.mkdir(mode=0o700)
    (stale / "owner.pid").write_text(f"{dead.pid} 1\n")
    live = base / "warm-live"
    live.mkdir(mode=0o700)
    (live / "owner.pid").write_text(f"{os.getpid()} {trust.start_time(os.getpid())}\n")
    young = base / "warm-young"             # starting: no pid written yet
    young.mkdir(mode=0o700)
    assert trust.sweep_stale(base) == [stale]
    assert live.exists() and young.exists() and not stale.exists()


def test_the_last_launcher_to_close_leaves_nothing_in_the_temporary_directory(
        short_tmp, monkeypatch):
    """Without XDG_RUNTIME_DIR the launchers' folder is made in the temporary directory; it
    stays while a launcher has its folder there and goes with the last one."""
    import tempfile

    from tui_trainer.core.processes import trust
    tmp_path = short_tmp
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    first, second = WarmLauncher(), WarmLauncher()
    try:
        first.start()
        second.start()
        base = trust.runtime_base()
        assert base.parent == tmp_path and len(list(base.iterdir())) == 2
        first.close()
        assert [p.name for p in base.iterdir()] == [second.path.parent.name]
        second.close()
        assert list(tmp_path.iterdir()) == []
        again = WarmLauncher()                  # the next one makes it again
        again.start()
        assert again.path.parent.parent == base and base.is_dir()
        again.close()
        assert list(tmp_path.iterdir()) == []
    finally:
        first.close()
        second.close()


def test_a_temporary_directory_too_long_for_a_socket_starts_no_launcher(tmp_path,
                                                                         monkeypatch):
    """A TMPDIR whose launcher socket would pass AF_UNIX's 107 bytes: no launcher is
    started (it could never bind, and was waited for in vain), nothing is left there, and
    a run starts cold."""
    import tempfile

    from tui_trainer.core.processes import trust
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    assert len(os.fsencode(deep / "tui-trainer-0/warm-12345678/launcher.sock.binding")) \
        > trust.SOCKET_PATH_MAX
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    launcher = WarmLauncher()
    try:
        launcher.start()
        t0 = time.monotonic()
        assert not launcher.wait_ready(30) and time.monotonic() - t0 < 1.0
        assert launcher._proc is None and list(deep.iterdir()) == []
    finally:
        launcher.close()
    log = tmp_path / "run.log"
    assert _spawn_into(launcher, log) is None       # the caller starts the run cold


def test_a_launcher_whose_owner_is_killed_leaves_nothing_in_the_temporary_directory():
    """A dashboard killed (SIGKILL: it closes nothing): its launcher ends with it and
    removes its socket, its folder and, the last one there, the runtime folder."""
    import shutil
    import subprocess
    import sys
    import tempfile
    tmp = Path(tempfile.mkdtemp(prefix="ttk-"))     # short: a socket's path has ~100 bytes
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env["TMPDIR"] = str(tmp)
    owner = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom tui_trainer.launcher.client import "
         "WarmLauncher\nw = WarmLauncher()\nw.start()\nprint(w.path, flush=True)\n"
         "print(w.wait_ready(120), flush=True)\nsys.stdin.read()"],   # until killed
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        sock = Path(owner.stdout.readline().strip())
        assert sock.parent.parent.parent == tmp, sock
        assert owner.stdout.readline().strip() == "True" and sock.exists()
        owner.kill()
        owner.wait(30)
        assert wait_until(lambda: not any(tmp.iterdir()), timeout=30), list(tmp.rglob("*"))
    finally:
        owner.kill()
        owner.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)


def test_warm_refuses_a_path_where_something_is(tmp_path):
    import subprocess
    import sys
    victim = tmp_path / "notes.txt"
    victim.write_text("keep me")
    r = subprocess.run([sys.executable, "-m", "tui_trainer.launcher", str(victim)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "exists" in r.stderr
    assert victim.read_text() == "keep me"


def test_the_launcher_is_no_command_of_the_cli_and_the_cli_does_not_import_it():
    """The launcher runs the CLI in its forks; the CLI does not import its server (no circle)."""
    import subprocess
    import sys
    code = ("import sys, tui_trainer.cli, tui_trainer.runner; "
            "print('tui_trainer.launcher.server' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120).stdout.strip() == "False"
    assert tt("warm", "x.sock").rc == 2 and tt("launcher", "x.sock").rc == 2


@pytest.mark.parametrize("args", [["worker", "--run-id", "1"],
                                  ["--session", "s", "join", "127.0.0.1:29400"]])
def test_a_rank_or_a_join_is_never_forked(tmp_path, warm, args):
    """`worker` forked by the launcher would pass for a rank of a group (its parent is a
    tui-trainer process), and `join` cannot quieten torch's C++ logging in a fork: the
    launcher refuses them, the client says why and starts them cold."""
    err_r, err_w = os.pipe()
    with open(os.devnull, "wb") as null:
        child = warm.spawn(args, null.fileno(), err_w, detach=False, env=dict(os.environ))
    os.close(err_w)
    with os.fdopen(err_r, "rb") as f:
        said = f.read().decode()
    assert child is None
    assert "is not forked by the warm launcher" in said and "starting cold" in said


def test_a_forked_child_waits_for_its_clients_go_ahead_and_ends_unheard_without_it(
        tmp_path, warm):
    """The launcher forks at once, but the child runs its command only once the client has
    believed the answer and said go; a client that gives up (a time-out, an answer it does
    not believe) starts the run cold and closes the pipe unsaid: the forked child then ends
    without a word (no "forked" line in the log, nothing run), so that one process trains
    the run and its log says which."""
    import json
    import socket
    outcomes = {}
    for go in (b"", b"1"):
        log = tmp_path / f"log-{len(go)}"
        go_r, go_w = os.pipe()
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn, \
                open(log, "ab") as out:
            conn.connect(str(warm.path))
            request = {"args": ["config", "--plain"], "env": dict(os.environ),
                       "cwd": str(tmp_path), "detach": True}
            socket.send_fds(conn, [json.dumps(request).encode()],
                            [out.fileno(), out.fileno(), go_r])
            os.close(go_r)
            pid = json.loads(conn.recv(4096))["pid"]        # forked, waiting
            # blocked in select on the pipe (where the kernel hides wait channels: asleep)
            wchan = Path(f"/proc/{pid}/wchan")

            def waiting() -> bool:
                where = wchan.read_text()
                if where.strip() == "0":
                    import psutil
                    return psutil.Process(pid).status() == psutil.STATUS_SLEEPING
                return "poll" in where or "select" in where
            assert wait_until(waiting)
            assert log.read_text() == ""                    # nothing said before the go
            os.write(go_w, go) if go else None
            os.close(go_w)
            outcomes[go] = json.loads(conn.recv(4096))["exit"]
        text = log.read_text()
        assert (WARM_LINE in text) == bool(go) and ("seed = 1" in text) == bool(go), text
    assert outcomes == {b"": 0, b"1": 0}


PROBE = """
import gc, json, os, psutil
from tui_trainer.engine import cuda_start
from tui_trainer.launcher import server, spare


def collection_in_a_child():
    # what a full collection in a forked process makes it copy of the parent's pages
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        me = psutil.Process()
        before = me.memory_full_info().uss
        gc.collect()
        os.write(w, str(me.memory_full_info().uss - before).encode())
        os._exit(0)
    os.close(w)
    grew = int(os.read(r, 64))
    os.waitpid(pid, 0)
    return grew


server.warm_up()
imported = collection_in_a_child()
why = server.prepare()
print(json.dumps({"imported": imported, "prepared": collection_in_a_child(), "why": why}))
gc.unfreeze()
"""


def test_a_process_forked_from_the_prepared_launcher_collects_without_copying_its_heap():
    """The launcher's preparation puts what torch's import made out of the collector's
    reach: a full collection in a forked process (a long run, a compiled one, a profile)
    no longer writes to every page it shares with the launcher. The same process, forked
    before and after `prepare`, its own memory (USS) measured around the collection.
    Holds on any device (no CUDA is touched)."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    grew = json.loads(out.stdout.strip().splitlines()[-1])
    assert grew["why"] is None                    # it would serve: no thread, frozen
    mib = 1 << 20
    assert grew["imported"] > 20 * mib, grew      # 85 MiB here: the cost being removed
    assert grew["prepared"] < 4 * mib, grew       # 0 here
    assert "leaked" not in out.stderr             # torn down as usual after unfreeze


def test_a_training_process_is_named_by_its_run_name_and_session_in_ps(tmp_path, warm):
    """`ps`, `top` and `nvidia-smi` show what a training process is: its run, name and
    session (setproctitle), whether forked by the launcher or started cold (issue 55:
    every run read "python3 -m tui_trainer.launcher ...")."""
    import psutil
    with SessionStore(tmp_path / "s") as store:
        procs = []
        for how in ("cold", "warm"):
            run_id = store.create_run(launch_config(max_steps=0, epochs=1000),
                                      name=f"{how}-\x1b[31mrun")
            proc = launch(tmp_path / "s", train_args(run_id), store.log_path(run_id),
                          warm=warm if how == "warm" else None)
            procs.append(proc)
            assert isinstance(proc, WarmChild) == (how == "warm")
            want = f'tui-trainer run {run_id} "{how}-\\x1b[31mrun" (session {tmp_path / "s"})'
            try:
                assert wait_until(lambda: " ".join(
                    x for x in psutil.Process(proc.pid).cmdline() if x) == want, timeout=120), \
                    psutil.Process(proc.pid).cmdline()
                assert "\x1b" not in Path(f"/proc/{proc.pid}/cmdline").read_text()
            finally:
                proc.kill()
                proc.wait(timeout=60)


def test_runs_are_niced_only_where_the_session_has_an_autogroup_of_its_own(tmp_path):
    """supervisor.ranked_by_session reads the kernel's files: autogroup on and this
    session's own group named (`/autogroup-N nice 0`), no cgroup with the CPU controller
    above it. An empty autogroup file (the session in the root group every other process
    shares, as in CI's containers) ranks nothing by session: a nice value there would put
    the runs below every other program (issue 54's resubmission)."""
    from tui_trainer.core.processes.supervisor import ranked_by_session

    def kernel(enabled: str, group: str, cgroup: str, delegated: str = "") -> Path:
        root = tmp_path / f"k{len(list(tmp_path.iterdir()))}"
        (root / "proc/sys/kernel").mkdir(parents=True)
        (root / "proc/self").mkdir()
        (root / "proc/sys/kernel/sched_autogroup_enabled").write_text(enabled)
        (root / "proc/self/autogroup").write_text(group)
        (root / "proc/self/cgroup").write_text(cgroup)
        (root / "cg/user.slice").mkdir(parents=True)
        (root / "cg/user.slice/cgroup.subtree_control").write_text(delegated)
        return root

    def ranked(root: Path) -> bool:
        return ranked_by_session(root / "proc", root / "cg")
    own = "/autogroup-428 nice 0\n"
    assert ranked(kernel("1\n", own, "1:cpu:/\n0::/\n"))
    assert not ranked(kernel("1\n", "", "1:cpu:/\n0::/\n"))          # the root group
    assert not ranked(kernel("0\n", own, "0::/\n"))                   # autogroup off
    assert not ranked(kernel("1\n", own, "1:cpu,cpuacct:/docker/x\n"))  # a v1 cpu cgroup
    assert not ranked(kernel("1\n", own, "0::/user.slice/s\n", "cpu memory"))  # v2, cpu
    assert ranked(kernel("1\n", own, "0::/user.slice/s\n", "memory pids"))
