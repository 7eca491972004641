"""The warm launcher: runs forked from a process that imported torch once start at once and
train exactly as a cold-started process does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import QUICK, db_rows, fingerprints, sets, tt, wait_until
from tui_trainer.core.settings import config
from tui_trainer.core.session.store import SessionStore
from tui_trainer.core.processes.supervisor import launch, train_args
from tui_trainer.launcher.client import WARM_LINE, WarmChild, WarmLauncher

CFG = {**{k: config.parse_value(k, v) for k, v in (p.split("=") for p in QUICK)},
       "max_steps": 12, "checkpoint_every": 4}


def _started() -> WarmLauncher:
    launcher = WarmLauncher()
    launcher.start()
    assert launcher.wait_ready(120), "the warm launcher did not come up"
    return launcher


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
        launcher = _started()
    yield launcher
    launcher.close()
    shutil.rmtree(runtime, ignore_errors=True)


@pytest.fixture
def doomed_warm():
    """A launcher for one test, which kills it."""
    launcher = _started()
    yield launcher
    launcher.close()


def _config(**over) -> dict:
    return config.from_dict({**config.DEFAULTS.to_dict(), **CFG, **over}).to_dict()


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
            run_id = store.create_run(_config(augment="numpy"), name=how)
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
                run_id = store.create_run(_config(max_steps=2), name=how)
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
            run_id = store.create_run(_config(seed=None, max_steps=3), name="unseeded")
            assert launch(tmp_path, train_args(run_id), store.log_path(run_id),
                          warm=warm).wait(timeout=120) == 0
            ids.append(run_id)
    a, b = (fingerprints(tmp_path, r) for r in ids)
    assert a[0] != b[0]                 # different initial weights


def test_a_forked_run_killed_reports_its_signal_and_resumes_bit_exact(tmp_path, warm):
    with SessionStore(tmp_path) as store:
        straight = store.create_run(_config(), name="straight")
        assert launch(tmp_path, train_args(straight), store.log_path(straight),
                      warm=warm).wait(timeout=120) == 0
        killed = store.create_run(_config(), name="killed")
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
        cfg = _config(max_steps=2)
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
        run_id = store.create_run(_config(max_steps=40, device="cpu"),
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


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_a_run_outlives_its_launcher_without_a_false_failure(tmp_path, doomed_warm):
    """The launcher dies while its run trains: waiting does not spin, and the run's outcome
    is what it recorded, not the launcher's missing exit status. The run was the launcher's
    spare (device auto, one process), which dies with the launcher until it is given a run
    and not after; a next spare, if one was made yet, dies with it."""
    from tui_trainer.launcher.client import SPARE_LINE
    from tui_trainer.runner import train_child
    warm = doomed_warm
    with SessionStore(tmp_path) as store:
        run_id = store.create_run(_config(max_steps=60), name="orphaned")
        import threading
        result: dict = {}
        t = threading.Thread(target=lambda: result.update(
            s=train_child(store.__class__(tmp_path), run_id, train_args(run_id), warm=warm)))
        t.start()
        assert wait_until(lambda: store.run(run_id)["status"] == "running")
        assert SPARE_LINE in store.log_path(run_id).read_text()
        others = _children(warm._proc.pid) - {store.run(run_id)["pid"]}    # a next spare
        os.kill(warm._proc.pid, signal.SIGKILL)
        assert wait_until(lambda: not any(_alive(p) for p in others))
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


# --- the spare (issue 34: the first step on CUDA) -------------------------------------------

def _children(pid: int) -> set[int]:
    """The live children of process `pid` (none once it is gone)."""
    import psutil
    out = set()
    try:
        kids = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return out
    for c in kids:
        try:
            if c.status() != psutil.STATUS_ZOMBIE:
                out.add(c.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def test_a_run_that_starts_cuda_is_given_the_spare_and_trains_the_same_bits(tmp_path):
    """The launcher keeps one spare, forked before anyone asks (on CUDA, by default, it has
    started CUDA, made cuBLAS's and cuDNN's handles and suspended them). A run that starts
    CUDA (device auto) is given it, and trains the bits a process forked at Start trains; a
    CPU run, and a run whose environment differs in what CUDA reads at its start, are
    forked at Start, the spare left waiting; a new spare is made after the one given away;
    the spare ends with its launcher, also one killed with SIGKILL. Holds on both devices
    (the spare of a CPU machine has nothing of CUDA to start)."""
    from tui_trainer.core.settings.machine import cublas_workspace, cuda_device
    from tui_trainer.launcher.client import SPARE_LINE
    warm = _started()
    launcher = warm._proc.pid
    assert wait_until(lambda: len(_children(launcher)) == 1), "no spare"
    (spare,) = _children(launcher)
    order = "CUDA_DEVICE_ORDER"
    other = {order: "FASTEST_FIRST" if os.environ.get(order) == "PCI_BUS_ID" else "PCI_BUS_ID"}
    # the config's device and the environment; "forked": a client that does not ask
    runs = {"spare": ({}, {}), "cpu": ({"device": "cpu"}, {}), "other-env": ({}, other),
            "forked": ({}, None)}
    procs = []
    try:
        with SessionStore(tmp_path) as store:
            ids, pids = {}, {}
            for how, (over, env) in runs.items():
                cfg = _config(**over)
                run_id = store.create_run(cfg, name=how)
                # (what Supervisor.start sends: the run's cuBLAS workspace too, which a
                # spare that made cuBLAS's handles must match where torch cannot set it)
                proc = launch(tmp_path, train_args(run_id), store.log_path(run_id), warm=warm,
                              env=env, spare=cuda_device(cfg) if env is not None else None,
                              cublas=cublas_workspace(cfg), config=cfg)
                procs.append(proc)
                assert isinstance(proc, WarmChild)
                pids[how], ids[how] = proc.pid, run_id
                if how == "other-env":
                    assert _children(launcher) >= {spare, proc.pid}   # still waiting
                assert proc.wait(timeout=120) == 0
                if how == "spare":      # the next spare, SPARE_AFTER_S later
                    assert wait_until(lambda: len(_children(launcher)) == 1)
                    (spare,) = _children(launcher)
                    assert spare != pids["spare"]
            logs = {how: store.log_path(r).read_text() for how, r in ids.items()}
        assert pids["spare"] not in _children(launcher) and spare not in pids.values()
        for how, log in logs.items():
            assert WARM_LINE in log and (SPARE_LINE in log) == (how == "spare"), (how, log)
        fp = {how: fingerprints(tmp_path, r) for how, r in ids.items()}
        assert len(fp["spare"]) >= 4 and fp["spare"] == fp["forked"] == fp["other-env"]
    finally:
        for proc in procs:          # a failed assertion leaves no run writing on
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        os.kill(launcher, signal.SIGKILL)       # (a study's end closes it: SIGTERM, above)
        warm.close()
    assert wait_until(lambda: not _alive(spare))


def test_spares_can_be_turned_off(tmp_path, monkeypatch):
    from tui_trainer.launcher.client import SPARE_LINE
    monkeypatch.setenv("TUI_TRAINER_SPARE", "0")
    warm = _started()
    try:
        with SessionStore(tmp_path) as store:
            run_id = store.create_run(_config(max_steps=2), name="no spare")
            proc = launch(tmp_path, train_args(run_id), store.log_path(run_id), warm=warm,
                          spare="auto")
            assert proc.wait(timeout=120) == 0
            log = store.log_path(run_id).read_text()
        assert WARM_LINE in log and SPARE_LINE not in log
        assert _children(warm._proc.pid) == set()
    finally:
        warm.close()


CUDNN = """
import json, torch
from tui_trainer.engine import cuda_start
from tui_trainer.launcher import server, spare
said = cuda_start.start_cuda()
loaded = cuda_start.load_cudnn()
maps = open("/proc/self/maps").read()
print(json.dumps({"said": said, "loaded": loaded, "contexts": cuda_start.primary_contexts(),
                  "engines": "libcudnn_engines_precompiled" in maps,
                  "initialized": torch.cuda.is_initialized()}))
"""


def test_what_a_spare_starts_of_cuda_holds_no_context():
    """A spare loads cuDNN's libraries (host work) and, where there is a CUDA device, starts
    the driver, and makes no CUDA context (which would hold GPU memory while nothing
    trains). Holds on both devices: on a CPU the driver is not started and nothing is said."""
    import subprocess
    import sys

    import torch
    if not torch.backends.cudnn.is_available():
        pytest.skip("this torch has no cuDNN")
    r = subprocess.run([sys.executable, "-c", CUDNN], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["loaded"] >= 3 and got["engines"] and got["contexts"] == 0
    cuda = torch.cuda.device_count() > 0
    assert got["initialized"] == cuda
    assert (got["said"] is None) == (not cuda)
    if cuda:
        assert "no CUDA context" in got["said"]


def _socket(name: str) -> Path:
    """A launcher's socket path in a folder of its own in the test's runtime folder
    (conftest: short, as a socket's path must be)."""
    folder = Path(os.environ["XDG_RUNTIME_DIR"]) / name
    folder.mkdir(mode=0o700)
    return folder / "launcher.sock"


def _launcher_with_stand_ins(script: str, sock: Path, log: Path) -> subprocess.Popen:
    """The warm launcher as `script` runs it (some of its parts replaced by stand-ins),
    listening on `sock` once this returns, its log into `log`; the caller ends it."""
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-c", script, str(sock)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    if not wait_until(lambda: sock.exists() or proc.poll() is not None, 120) or \
            proc.poll() is not None:
        proc.kill()
        proc.wait(timeout=30)
        raise AssertionError(f"the launcher did not come up: {log.read_text()[-2000:]}")
    return proc


FAILING_SPARE = """
import sys
from tui_trainer.engine import cuda_start
from tui_trainer.launcher import server, spare


def start_cuda(context=False, cudnn=False, suspend=False, workspace=None):
    raise RuntimeError("starting CUDA's driver made a CUDA context (a test's stand-in)")


cuda_start.start_cuda = start_cuda
sys.exit(server.main([sys.argv[1]]))
"""


def test_a_spare_that_cannot_start_cuda_cleanly_ends_and_runs_are_forked(tmp_path):
    """Where the spare's CUDA start fails (a context made, a broken driver), the spare says
    why in the launcher's log and ends, no other is made, and every run is forked at Start
    as before. The failure is the test's stand-in for start_cuda; the rest is the
    launcher's own."""
    from tui_trainer.launcher.client import SPARE_LINE
    sock, log = _socket("failing"), tmp_path / "launcher.log"
    proc = _launcher_with_stand_ins(FAILING_SPARE, sock, log)
    try:
        assert wait_until(lambda: "no more spares" in log.read_text()), \
            (proc.poll(), log.read_text()[-2000:])
        said = log.read_text()
        assert "the spare cannot be one: starting CUDA's driver made a CUDA context" in said
        assert _children(proc.pid) == set()
        warm = WarmLauncher(str(sock))
        with SessionStore(tmp_path) as store:
            run_id = store.create_run(_config(max_steps=2), name="forked")
            child = launch(tmp_path, train_args(run_id), store.log_path(run_id), warm=warm,
                           spare="auto")
            assert isinstance(child, WarmChild) and child.wait(timeout=120) == 0
            text = store.log_path(run_id).read_text()
        assert WARM_LINE in text and SPARE_LINE not in text
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# CUDA's checkpoint helper (tui_trainer/core/cuda_checkpoint.py) as it is, its driver's calls
# stood in for: a suspension that waits while the file TT_SLOW_SUSPEND exists, and is
# refused while TT_SUSPEND_REFUSED does, a restore
# refused while TT_RESTORE_REFUSED does, never answered while TT_RESTORE_HANGS does.
HELPER = """
import os
import sys
import time
from tui_trainer.core.processes import cuda_checkpoint


class CudaCheckpoint:
    def __init__(self, pid):
        self.pid = pid

    def suspend(self):
        deadline = time.monotonic() + 60     # (a suspension that lasts until the test says)
        while os.path.exists(os.environ.get("TT_SLOW_SUSPEND", "/nonexistent")) and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        if os.path.exists(os.environ.get("TT_SUSPEND_REFUSED", "/nonexistent")):
            raise RuntimeError("cuCheckpointProcessLock returned CUDA_ERROR_NOT_SUPPORTED "
                               "(801) (a test's stand-in)")
        return 0

    def restore(self):
        if os.path.exists(os.environ.get("TT_RESTORE_HANGS", "/nonexistent")):
            time.sleep(600)
        if os.path.exists(os.environ.get("TT_RESTORE_REFUSED", "/nonexistent")):
            raise RuntimeError("cuCheckpointProcessRestore returned "
                               "CUDA_ERROR_OUT_OF_MEMORY (2) (a test's stand-in)")


cuda_checkpoint.CudaCheckpoint = CudaCheckpoint
sys.exit(cuda_checkpoint.main())
"""

UNRESTORED_SPARE = f"""
import os
import sys
import time
from tui_trainer.engine import cuda_start
from tui_trainer.launcher import server, spare
from tui_trainer.core.processes import cuda_checkpoint


def start_cuda(context=False, cudnn=False, suspend=False, workspace=None):
    deadline = time.monotonic() + 60     # (a CUDA start that lasts until the test says)
    while os.path.exists(os.environ.get("TT_SLOW_START", "/nonexistent")) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    if not suspend:
        assert not context and not cudnn
        return "CUDA's driver started (a test's stand-in)"
    assert context and cudnn
    return "CUDA's context, cuBLAS's and cuDNN's handles made (a test's stand-in)"


cuda_start.start_cuda = start_cuda
if os.environ.get("TT_FIXED_CUBLAS"):    # a torch that cannot set cuBLAS's workspace size
    cuda_start.cublas_size_settable = lambda: False
cuda_checkpoint.Helper.COMMAND = [sys.executable, "-c", {HELPER!r}]
cuda_checkpoint.RESTORE_S = 3.0
sys.exit(server.main([sys.argv[1]]))
"""


def _suspending_launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str,
                         flag: str | None = None
                         ) -> tuple[subprocess.Popen, Path, Path, Path | None]:
    """A launcher of suspended spares whose driver calls are stand-ins (UNRESTORED_SPARE),
    the stand-ins' file `flag` (HELPER says which) there, if one is named: the launcher, its
    socket, its log and that file. The caller ends the launcher."""
    monkeypatch.setenv("TUI_TRAINER_SPARE", "suspended")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    marker = None
    if flag is not None:
        marker = tmp_path / flag.lower()
        marker.touch()
        monkeypatch.setenv(flag, str(marker))
    sock, log = _socket(name), tmp_path / "launcher.log"
    return _launcher_with_stand_ins(UNRESTORED_SPARE, sock, log), sock, log, marker


def test_a_spare_that_cannot_be_suspended_is_followed_by_spares_that_start_the_driver(
        tmp_path, monkeypatch):
    """TUI_TRAINER_SPARE=suspended where CUDA's checkpoint API does not take the spare (a
    driver without it, a lock refused): the spare says why in the launcher's log and ends,
    its helper with it, and the next spares start CUDA's driver only (TUI_TRAINER_SPARE=
    driver's spare, holding no GPU memory), which says it is ready and is given a run at
    Start. The driver's calls are the test's stand-ins; the spares, the helper process and
    the launcher are their own. Holds on both devices."""
    from tui_trainer.launcher.client import SPARE_LINE
    from tui_trainer.launcher.spare import ready_line
    proc, sock, log, _ = _suspending_launcher(tmp_path, monkeypatch, "unsuspended",
                                              "TT_SUSPEND_REFUSED")
    try:
        assert wait_until(lambda: "the next spares start CUDA's driver only" in
                          log.read_text()), log.read_text()[-2000:]
        said = log.read_text()
        assert "the spare cannot be one: cuCheckpointProcessLock returned " \
            "CUDA_ERROR_NOT_SUPPORTED (801) (a test's stand-in)" in said, said
        assert wait_until(lambda: [len(_children(p)) for p in _children(proc.pid)] == [0])
        (spare,) = _children(proc.pid)           # the next one, with no helper
        # ready, as its line in the launcher's log says (what benchmarks wait for)
        assert wait_until(lambda: f"{ready_line(spare)}: CUDA's driver started (a test's "
                          "stand-in)" in log.read_text()), log.read_text()[-2000:]
        with SessionStore(tmp_path / "s") as store:
            cfg = _config(max_steps=2, deterministic="off")
            run_id = store.create_run(cfg, name="given the driver's spare")
            child = launch(tmp_path / "s", train_args(run_id), store.log_path(run_id),
                           warm=WarmLauncher(str(sock)), spare="auto", cublas=None,
                           config=cfg)
            assert isinstance(child, WarmChild) and child.pid == spare
            assert child.wait(timeout=120) == 0
            text = store.log_path(run_id).read_text()
        assert f"{SPARE_LINE}: CUDA's driver started (a test's stand-in)" in text, text
        assert "no more spares" not in log.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_spare_given_a_run_while_its_cuda_starts_is_not_suspended(tmp_path, monkeypatch):
    """TUI_TRAINER_SPARE=suspended: a run handed to the spare while its CUDA is still being
    made (the stand-in's lasts until the run is handed over) is not made to wait for a
    suspension and a restore on top: the spare skips both, starts no helper, and the run's
    log says so. The driver's calls are the test's stand-ins. Holds on both devices."""
    from tui_trainer.core.settings.machine import CUBLAS_DETERMINISTIC
    from tui_trainer.launcher.client import SPARE_LINE
    proc, sock, log, starting = _suspending_launcher(tmp_path, monkeypatch, "waited",
                                                     "TT_SLOW_START")
    try:
        assert wait_until(lambda: len(_children(proc.pid)) == 1), log.read_text()[-2000:]
        (spare,) = _children(proc.pid)
        with SessionStore(tmp_path / "s") as store:
            cfg = _config(max_steps=2)
            run_id = store.create_run(cfg, name="handed over early")
            child = launch(tmp_path / "s", train_args(run_id), store.log_path(run_id),
                           warm=WarmLauncher(str(sock)), spare="auto",
                           cublas=CUBLAS_DETERMINISTIC, config=cfg)
            assert starting is not None
            starting.unlink()           # handed over: the stand-in's CUDA start ends now
            assert isinstance(child, WarmChild) and child.pid == spare
            assert child.wait(timeout=120) == 0
            text = store.log_path(run_id).read_text()
        assert SPARE_LINE in text and "(not suspended: a run was already waiting for it)" \
            in text, text
        assert "restored at Start" not in text and "suspended again" not in text, text
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_checkpoint_helper_answers_within_its_bounds_and_ends_with_its_owner(
        tmp_path, monkeypatch):
    """CUDA's checkpoint helper (cuda_checkpoint.Helper, a child of the spare it suspends):
    the driver's refusal comes back in the driver's words and leaves the helper serving; a
    restore not answered within its bound ends the helper and says what was waited for; it
    acts on its parent only; and a helper whose owner is killed ends too. The driver's calls
    are the test's stand-ins (HELPER); the helper process and its pipe are its own. Holds on
    both devices."""
    from tui_trainer.core.processes import cuda_checkpoint
    from tui_trainer.core.processes.cuda_checkpoint import Helper
    monkeypatch.setattr(Helper, "COMMAND", [sys.executable, "-c", HELPER])
    monkeypatch.setattr(cuda_checkpoint, "RESTORE_S", 1.0)
    refused, hangs = tmp_path / "refused", tmp_path / "hangs"
    monkeypatch.setenv("TT_RESTORE_REFUSED", str(refused))
    monkeypatch.setenv("TT_RESTORE_HANGS", str(hangs))
    helper = Helper()
    assert helper.proc.pid in Helper.pids and helper.memory() > 0
    assert helper.suspend()[1] == 0
    refused.touch()
    with pytest.raises(RuntimeError, match=r"^cuCheckpointProcessRestore returned "
                       r"CUDA_ERROR_OUT_OF_MEMORY \(2\) \(a test's stand-in\)$"):
        helper.restore()
    refused.unlink()
    assert helper.restore() >= 0
    hangs.touch()
    t = time.monotonic()
    with pytest.raises(RuntimeError, match=r"did not answer a restore within 1 s, and was "
                       "ended"):
        helper.restore()
    assert time.monotonic() - t < 10
    assert helper.proc.returncode is not None and helper.proc.pid not in Helper.pids
    assert helper.close() == helper.proc.returncode         # (once more: nothing to do)

    # It acts on its parent only.
    other = subprocess.run([sys.executable, "-m", "tui_trainer.core.processes.cuda_checkpoint",
                            "1"], capture_output=True, text=True, timeout=60)
    assert other.returncode == 2 and "acts on its parent only" in other.stdout

    # Its owner killed: it ends (its pipe closed).
    owner = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom tui_trainer.core.processes.cuda_checkpoint "
         "import Helper\nHelper.COMMAND = [sys.executable, '-c', sys.argv[1]]\n"
         "print(Helper().proc.pid, flush=True)\ntime.sleep(600)", HELPER],
        stdout=subprocess.PIPE, text=True)
    try:
        pid = int(owner.stdout.readline())
        assert _alive(pid)
    finally:
        owner.kill()
        owner.wait(timeout=30)
    assert wait_until(lambda: not _alive(pid), 30)


def test_a_spare_whose_cuda_is_not_restored_at_start_runs_its_run_cold_in_its_process(
        tmp_path, monkeypatch):
    """TUI_TRAINER_SPARE=suspended: where the spare's CUDA does not come back at Start (its
    helper, which suspended it, does not answer the restore within the bound), the run it
    was handed is not lost and does not meet a CUDA it cannot use: the same process (the
    pid its client was told) becomes a cold `python -m tui_trainer` of the run's command,
    environment and folder, whose log says why and never that it was forked or given a
    spare, and trains the run to its end; the helper is ended. The next spare's restore
    succeeds: its run trains in that process, says it was given the spare, and as its last
    line that its CUDA was suspended again before it ended; its helper (a child of the run
    while it trains) is not counted as a DataLoader worker, and ends with it. The driver's
    calls are the test's stand-ins; the spare, its helper process and the launcher are
    their own. Holds on both devices."""
    from tui_trainer.core.settings.machine import CUBLAS_DETERMINISTIC
    from tui_trainer.launcher.client import SPARE_LINE
    proc, sock, log, hangs = _suspending_launcher(tmp_path, monkeypatch, "unrestored",
                                                  "TT_RESTORE_HANGS")
    try:
        warm = WarmLauncher(str(sock))
        texts, helpers = [], []
        with SessionStore(tmp_path / "s") as store:
            for name in ("hangs", "restored"):
                # The spare, and its helper: the only process it started.
                assert wait_until(lambda: [len(_children(p)) for p in
                                           _children(proc.pid)] == [1]), \
                    log.read_text()[-2000:]
                (spare,) = _children(proc.pid)
                helpers.append(_children(spare).pop())
                cfg = _config(max_steps=4, fingerprint_every=2)
                run_id = store.create_run(cfg, name=name)
                child = launch(tmp_path / "s", train_args(run_id), store.log_path(run_id),
                               warm=warm, spare="auto", cublas=CUBLAS_DETERMINISTIC,
                               config=cfg)
                assert isinstance(child, WarmChild) and child.pid == spare
                assert child.wait(timeout=120) == 0
                texts.append(store.log_path(run_id).read_text())
                assert store.run(run_id)["status"] == "finished"
                assert sorted(fingerprints(tmp_path / "s", run_id)) == [0, 2, 4]
                workers = db_rows(tmp_path / "s", "SELECT workers_uss FROM steps WHERE "
                                  "run_id = ?", (run_id,))
                assert workers and {w for (w,) in workers} == {0.0}, workers
                hangs.unlink(missing_ok=True)
        text, restored = texts
        assert "a spare could not restore its CUDA at Start (CUDA's checkpoint helper did " \
            "not answer a restore within 3 s, and was ended): the run starts cold in its " \
            "process" in text, text
        assert WARM_LINE not in text and SPARE_LINE not in text
        assert SPARE_LINE in restored and "then suspended by CUDA's checkpoint API" in \
            restored and "; restored at Start (" in restored, restored
        assert "its CUDA suspended again before it ended" in \
            restored.strip().splitlines()[-1], restored
        assert not any(_alive(pid) for pid in helpers), helpers
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("value, mode, wrong", [
    ("", "suspended", False), ("driver", "driver", False), ("0", None, False),
    ("context", "context", False), ("cudnn", "cudnn", False),
    ("suspended", "suspended", False), ("1", "suspended", True),
    ("ctx\x1b[31m", "suspended", True)])
def test_the_spare_setting_is_read_and_a_wrong_value_named_in_one_line(monkeypatch, value,
                                                                         mode, wrong):
    from tui_trainer.launcher import spare
    monkeypatch.setenv("TUI_TRAINER_SPARE", value)
    got, why = spare.spare_mode()
    assert got == mode and (why is not None) == wrong
    if wrong:
        assert why.startswith("TUI_TRAINER_SPARE: ")
        assert "0, driver, context, cudnn, suspended" in why
        assert "\x1b" not in why and "\n" not in why


@pytest.mark.parametrize("mode", ["cudnn", "suspended"])
def test_a_context_spare_takes_only_runs_on_the_first_device(tmp_path, monkeypatch, mode):
    """TUI_TRAINER_SPARE=context, =cudnn or =suspended: the spare (which on CUDA makes the
    first visible device's context, with cudnn and suspended its cuDNN handles, and holds
    them while it waits, or with suspended has them in its host memory, to be restored on
    that device) is given a run on that device (auto, cuda, cuda:0), never one on another
    device, which is forked at Start. Checked with cudnn, which holds the most, and
    suspended (one rule, spare.ON_FIRST_DEVICE, for the three). The two also made cuBLAS's
    handles: where torch can set its workspace's size (cuda_start.cublas_size_settable) a run of
    either workspace is given the spare, deterministic off (torch's default) as on (the
    deterministic one); elsewhere only a run of the workspace it made them with, and the
    other is forked (`test_a_spare_whose_cublas_workspace_a_run_does_not_use_is_replaced`
    follows the rest). The suspended spare's suspension is the stand-ins'
    (`_suspending_launcher`): the rule is the launcher's, and a GPU whose checkpoint API
    refuses the spare (which makes the next spares the default one) must not change what
    this test says. Holds on both devices."""
    from tui_trainer.core.settings.machine import cublas_workspace
    from tui_trainer.launcher.client import SPARE_LINE
    from tui_trainer.engine.cuda_start import cublas_size_settable
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    stand_in = None
    if mode == "suspended":
        stand_in, sock, _, _ = _suspending_launcher(tmp_path, monkeypatch, "first-device")
        warm, launcher = WarmLauncher(str(sock)), stand_in.pid
    else:
        monkeypatch.setenv("TUI_TRAINER_SPARE", mode)
        warm = _started()
        launcher = warm._proc.pid
    session = tmp_path / "s"
    try:
        assert wait_until(lambda: len(_children(launcher)) == 1), "no spare"
        logs = {}
        with SessionStore(session) as store:
            # what the client says the run uses: its device, and whether it is deterministic
            for device, deterministic in (("cuda:1", "on"), ("auto", "on"), ("auto", "off")):
                # (a spare waits: the first one, or the one made after a run was given one)
                assert wait_until(lambda: len(_children(launcher)) == 1), "no spare"
                cfg = _config(max_steps=2, deterministic=deterministic)
                run_id = store.create_run(cfg, name=f"{device} {deterministic}")
                proc = launch(session, train_args(run_id), store.log_path(run_id),
                              warm=warm, spare=device, cublas=cublas_workspace(cfg),
                              config=cfg)
                assert proc.wait(timeout=120) == 0
                logs[device, deterministic] = store.log_path(run_id).read_text()
        given = {("cuda:1", "on"): False, ("auto", "on"): True,
                 ("auto", "off"): cublas_size_settable()}
        for run, spare in given.items():
            assert (SPARE_LINE in logs[run]) == spare, (run, logs[run])
            assert WARM_LINE in logs[run], (run, logs[run])      # forked, or a spare's
    finally:
        warm.close()
        if stand_in is not None:
            stand_in.terminate()
            stand_in.wait(timeout=30)


def _spare_ready(launcher: subprocess.Popen, log: Path, said: str) -> int | None:
    """The launcher's one spare, once its ready line in the launcher's log goes on with
    `said` (what it did before Start)."""
    from tui_trainer.launcher.spare import ready_line
    spares = _children(launcher.pid)
    return next((pid for pid in spares if len(spares) == 1 and
                 f"{ready_line(pid)}: {said}" in log.read_text()), None)


# A launcher of TUI_TRAINER_SPARE=cudnn spares under a torch that reads cuBLAS's workspace
# size once in a process and cannot set it (cuda_start.cublas_size_settable: torch 2.11, the
# leased GPUs'), its CUDA start the stand-in's, which says the workspace it was given.
FIXED_SIZE_SPARE = """
import sys
from tui_trainer.engine import cuda_start
from tui_trainer.launcher import server, spare


def start_cuda(context=False, cudnn=False, suspend=False, workspace=None):
    assert context and cudnn and not suspend
    return f"cuBLAS's handles made with workspace {workspace or 'default'} (a test's stand-in)"


cuda_start.start_cuda = start_cuda
cuda_start.cublas_size_settable = lambda: False
sys.exit(server.main([sys.argv[1]]))
"""


def test_a_spare_whose_cublas_workspace_a_run_does_not_use_is_replaced(tmp_path,
                                                                      monkeypatch):
    """Where torch reads cuBLAS's workspace size once in a process and cannot set it, a
    spare that made cuBLAS's handles (TUI_TRAINER_SPARE=cudnn or suspended) fits only runs
    of its workspace. The first is made with the deterministic one (the default config's).
    A run of another (deterministic off: torch's default) is forked, that spare ends, and
    the next ones are made with the run's: the next such run is given one. A deterministic
    run after it is forked, and the spares turn back. The launcher's log says each change;
    none counts as a spare lost. torch here can set the size: the stand-ins are for the
    torch that cannot and for CUDA's start; the launcher, its spares and the runs are their
    own. Holds on both devices."""
    from tui_trainer.core.settings.machine import cublas_workspace
    from tui_trainer.launcher.client import SPARE_LINE
    monkeypatch.setenv("TUI_TRAINER_SPARE", "cudnn")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    sock, log = _socket("replaced"), tmp_path / "launcher.log"
    proc = _launcher_with_stand_ins(FIXED_SIZE_SPARE, sock, log)

    def ready(workspace: str) -> int | None:
        """The spare, once it waits ready with cuBLAS's handles of that workspace."""
        return _spare_ready(proc, log, "cuBLAS's handles made with workspace " + workspace)

    try:
        with SessionStore(tmp_path / "s") as store:
            for deterministic, made_with, given in (("off", ":4096:8", False),
                                                    ("off", "default", True),
                                                    ("on", "default", False)):
                assert wait_until(lambda: ready(made_with)), log.read_text()[-2000:]
                spare = ready(made_with)
                cfg = _config(max_steps=2, deterministic=deterministic)
                run_id = store.create_run(cfg, name=f"{deterministic} after {made_with}")
                child = launch(tmp_path / "s", train_args(run_id), store.log_path(run_id),
                               warm=WarmLauncher(str(sock)), spare="auto",
                               cublas=cublas_workspace(cfg), config=cfg)
                assert isinstance(child, WarmChild) and (child.pid == spare) == given
                assert child.wait(timeout=120) == 0
                text = store.log_path(run_id).read_text()
                assert (f"{SPARE_LINE}: cuBLAS's handles made with workspace {made_with}"
                        in text) == given and WARM_LINE in text, text
                if not given:
                    assert wait_until(lambda: not _alive(spare)), "the spare did not end"
        assert wait_until(lambda: ready(":4096:8")), log.read_text()[-2000:]
        said = log.read_text()
        for run, spare in (("default", ":4096:8"), (":4096:8", "default")):
            assert f"tui_trainer.launcher: a run of cuBLAS workspace {run} was forked: the " \
                f"spare had made cuBLAS's handles with {spare}" in said, said
        assert "no more spares" not in said and "cannot be one" not in said, said
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# A launcher of TUI_TRAINER_SPARE=cudnn spares, its CUDA start and its loading of a run's
# kernels the stand-ins': the line of each says for which config's batch it loaded kernels.
KERNELS_SPARE = """
import sys
from tui_trainer.engine import cuda_start
from tui_trainer.launcher import server, spare
from tui_trainer.core.settings import config


def start_cuda(context=False, cudnn=False, suspend=False, workspace=None):
    assert context and cudnn and not suspend
    return "cuBLAS's and cuDNN's handles made (a test's stand-in)"


def load_kernels(values, workspace):
    if not cuda_start.loads_kernels(values):
        return "; no kernels loaded (a test's stand-in)"
    batch = (values or config.DEFAULTS.to_dict())["batch_size"]
    return f"; the kernels of a run of batch {batch} loaded (a test's stand-in)"


cuda_start.start_cuda = start_cuda
cuda_start.load_kernels = load_kernels
sys.exit(server.main([sys.argv[1]]))
"""


def test_a_spare_that_loaded_a_runs_kernels_is_not_given_a_run_that_benchmarks_cudnn(
        tmp_path, monkeypatch):
    """A cudnn (or suspended) spare loads the kernels of the last CUDA run's config (the
    default config's before any), which leaves cuDNN's heuristic choices of engines cached
    for its shapes. A run with cudnn_benchmark on must benchmark its own: it is forked, that
    spare ends, and the next is made for the run, loading none: the next such run is given
    it. A run with the heuristics (benchmark off) may be given either kind, and the spare
    after it loads its kernels (its batch). A run whose request does not say its config is
    not given a spare that loaded kernels, which stays. The launcher's log says each change;
    none counts as a spare lost. CUDA's start and the kernels' loading are the test's
    stand-ins; the launcher, its spares and the runs are their own. Holds on both devices."""
    from tui_trainer.core.settings.machine import cublas_workspace
    from tui_trainer.launcher.client import SPARE_LINE
    monkeypatch.setenv("TUI_TRAINER_SPARE", "cudnn")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    sock, log = _socket("kernels"), tmp_path / "launcher.log"
    proc = _launcher_with_stand_ins(KERNELS_SPARE, sock, log)
    default_batch = config.DEFAULTS.batch_size

    def ready(loaded: str) -> int | None:
        """The spare, once it waits ready having loaded `loaded`."""
        return _spare_ready(proc, log, "cuBLAS's and cuDNN's handles made (a test's "
                            "stand-in); " + loaded)

    try:
        with SessionStore(tmp_path / "s") as store:
            for benchmark, batch, made, given, says in (
                    (False, 40, f"the kernels of a run of batch {default_batch}", True, True),
                    (False, 24, "the kernels of a run of batch 40", False, False),
                    (True, 32, "the kernels of a run of batch 40", False, True),
                    (True, 48, "no kernels loaded", True, True)):
                assert wait_until(lambda: ready(made)), log.read_text()[-2000:]
                spare = ready(made)
                cfg = _config(max_steps=2, cudnn_benchmark=benchmark, batch_size=batch)
                run_id = store.create_run(cfg, name=f"benchmark {benchmark} after {made}")
                child = launch(tmp_path / "s", train_args(run_id), store.log_path(run_id),
                               warm=WarmLauncher(str(sock)), spare="auto",
                               cublas=cublas_workspace(cfg), config=cfg if says else None)
                assert isinstance(child, WarmChild) and (child.pid == spare) == given
                assert child.wait(timeout=120) == 0
                text = store.log_path(run_id).read_text()
                assert (f"{SPARE_LINE}: cuBLAS's and cuDNN's handles made (a test's "
                        f"stand-in); {made}" in text) == given and WARM_LINE in text, text
                if not given and says:
                    assert wait_until(lambda: not _alive(spare)), "the spare did not end"
                elif not given:                                 # kept for the next
                    assert _alive(spare) and ready(made) == spare
        said = log.read_text()
        assert said.count("a run that asks cuDNN to benchmark its engines (cudnn_benchmark) "
                          "was forked: the spare had loaded another run's kernels") == 1, said
        assert "no more spares" not in said and "cannot be one" not in said, said
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_spare_replaced_while_it_is_suspended_leaves_without_saying_it_is_ready(
        tmp_path, monkeypatch):
    """TUI_TRAINER_SPARE=suspended where torch cannot set cuBLAS's workspace size: a run of
    another workspace (deterministic off) arrives while the spare is still being suspended.
    The run is forked and the launcher lets that spare go; once its suspension ends it
    leaves, its helper with it, without the ready line that would name a spare that never
    takes a run, and the next spare (the run's workspace) says it is ready. The torch that
    cannot set the size, CUDA's start and the driver's calls are the test's stand-ins; the
    launcher, the spares, the helper process and the run are their own. Holds on both
    devices."""
    from tui_trainer.launcher.spare import ready_line
    monkeypatch.setenv("TT_FIXED_CUBLAS", "1")
    proc, sock, log, slow = _suspending_launcher(tmp_path, monkeypatch, "suspending",
                                                 "TT_SLOW_SUSPEND")
    try:
        assert wait_until(lambda: len(_children(proc.pid)) == 1), log.read_text()[-2000:]
        (spare,) = _children(proc.pid)
        assert wait_until(lambda: len(_children(spare)) == 1)    # its helper: suspending
        (helper,) = _children(spare)
        with SessionStore(tmp_path / "s") as store:
            cfg = _config(max_steps=2, deterministic="off")
            run_id = store.create_run(cfg, name="another workspace")
            child = launch(tmp_path / "s", train_args(run_id), store.log_path(run_id),
                           warm=WarmLauncher(str(sock)), spare="auto", cublas=None,
                           config=cfg)
            assert isinstance(child, WarmChild) and child.pid != spare
            assert child.wait(timeout=120) == 0
        assert slow is not None
        slow.unlink()                   # the suspension ends now
        assert wait_until(lambda: not _alive(spare) and not _alive(helper))
        assert wait_until(lambda: len(_children(proc.pid)) == 1 and
                          ready_line(next(iter(_children(proc.pid)))) in log.read_text()), \
            log.read_text()[-2000:]
        said = log.read_text()
        assert ready_line(spare) not in said, said
        assert "a run of cuBLAS workspace default was forked" in said, said
    finally:
        proc.terminate()
        proc.wait(timeout=30)


SIZE_LET_GO = """
import json, os, torch
from tui_trainer.engine import cuda_start
from tui_trainer.launcher import server, spare
os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
torch._C._cuda_setCublasWorkspaceSize(12345)
held = torch.backends.cuda.cublas_workspace_size()
cuda_start.let_cublas_size_go()
os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":16:8"
try:
    after = torch.backends.cuda.cublas_workspace_size()
except RuntimeError as e:
    after = str(e).splitlines()[0]
print(json.dumps({"held": held, "after": after}))
"""


def test_a_spares_cublas_size_is_let_go_at_start_and_the_run_reads_its_own():
    """Where torch can set cuBLAS's workspace size (cuda_start.cublas_size_settable), a spare sets
    it before it makes cuBLAS's handles and lets it go at Start (cuda_start.let_cublas_size_go).
    While set, the size is answered without reading CUBLAS_WORKSPACE_CONFIG, or on a CPU
    the device. Let go, the next answer reads the variable the run set, as a fresh process
    does: :16:8 is 128 KiB on a GPU; on a CPU the answer asks for the device, which is not
    there. So the size a fresh process reads once is still unread when a run is given the
    spare. Holds on both devices."""
    import torch

    from tui_trainer.engine.cuda_start import cublas_size_settable
    if not cublas_size_settable():
        pytest.skip("this torch cannot set cuBLAS's workspace size")
    r = subprocess.run([sys.executable, "-c", SIZE_LET_GO], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["held"] == 12345
    if torch.cuda.device_count() > 0:
        assert got["after"] == 16 * 1024 * 8, got
    else:
        assert isinstance(got["after"], str) and "CUDA" in got["after"], got


def test_a_training_process_is_named_by_its_run_name_and_session_in_ps(tmp_path, warm):
    """`ps`, `top` and `nvidia-smi` show what a training process is: its run, name and
    session (setproctitle), whether forked by the launcher or started cold (issue 55:
    every run read "python3 -m tui_trainer.launcher ...")."""
    import psutil
    with SessionStore(tmp_path / "s") as store:
        procs = []
        for how in ("cold", "warm"):
            run_id = store.create_run(_config(max_steps=0, epochs=1000),
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
