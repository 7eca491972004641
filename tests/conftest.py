"""Shared helpers: every test runs the real `tui-trainer` command in a real process, against
a real session directory under tmp_path, on the MNIST sample shipped with the package."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

# One thread per training process (unless a test sets num_threads): the suite runs two test
# processes on a 2-core machine, and two runs that each start a thread per core spin against
# each other (OpenMP waits busily): a 60-step run took 9.6 s beside another instead of 6.2 s.
# Set before anything imports torch, so the test launcher and every run read it; the product
# does the same for the jobs of a study trained side by side (runner: a share of the cores).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Importing torchvision makes torch create its inductor cache folder; the product points it
# into its own cache (tui_trainer/engine/__init__.py), the suite (which imports torchvision
# itself too) into a folder of this test process, removed when it ends: nothing in /tmp stays.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _inductor = tempfile.mkdtemp(prefix="ttinductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _inductor
    atexit.register(shutil.rmtree, _inductor, ignore_errors=True)

# Every process the suite starts keeps its temporary files in a folder of the test process
# that started it, removed when that ends: a process a test kills as it starts can be caught
# in Python's probe of the temporary folder (a 4-byte file, "blat"), which then stays.
if "TT_SUITE_TMP" not in os.environ:
    _tmp = tempfile.mkdtemp(prefix="tttmp-")
    os.environ["TT_SUITE_TMP"] = os.environ["TMPDIR"] = _tmp
    # tmux keeps its servers' sockets under TMUX_TMPDIR (not TMPDIR), else /tmp/tmux-UID:
    # the terminal tests' sockets stayed there after their servers were killed.
    os.environ["TMUX_TMPDIR"] = _tmp
    tempfile.tempdir = None                         # asked again: this folder from now on
    atexit.register(shutil.rmtree, _tmp, ignore_errors=True)

# Which device a test's claim is about (docs/architecture.md, "Tests and devices"): CPU
# behaviour sets device=cpu, CUDA behaviour is marked `gpu` (skipped where CUDA is not),
# and everything else runs on the default device (auto: CUDA where there is one) and asserts
# what holds there (`on_cuda`).
_cuda: dict[str, int] = {}


def cuda_count() -> int:
    """CUDA devices torch sees in this test process (0 without CUDA); asked once."""
    if "n" not in _cuda:
        import torch
        _cuda["n"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return _cuda["n"]


# Modules whose tests wait longest (real grace periods, collective time-outs, data-parallel
# groups), run first: two workers then end on short tests, not one on a 40-s test while the
# other idles. Whole modules move, so that their module-wide fixtures are made once.
FIRST = ("test_parallel.py",)


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.path.name not in FIRST)


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is not None and cuda_count() == 0:
        pytest.skip("needs a CUDA device: torch.cuda.is_available() is False here")


def ranks_device(processes: int) -> str:
    """The `device` setting of a claim that needs several processes: one GPU each where
    there are that many, else the CPU (gloo)."""
    return "device=auto" if cuda_count() >= processes else "device=cpu"


def on_cuda(session: Path, run_id: int) -> bool:
    """Whether the run trained on a CUDA device (its recorded effective settings)."""
    from tui_trainer.core.session.store import SessionStore
    run = SessionStore(session, create=False, readonly=True).run(run_id)
    return str(run["settings"]["device"]).startswith("cuda")


# Short runs: 10 steps an epoch on 640 of the shipped training digits.
QUICK = ["dataset=mnist-sample", "train_samples=640", "eval_samples=200", "batch_size=64",
         "log_every=2", "fingerprint_every=3"]


@dataclass
class Result:
    rc: int
    out: str
    err: str

    @property
    def json(self) -> dict:
        return json.loads(self.out.strip().splitlines()[-1])


# Dashboard tests: a warm launcher of its own (one torch import, ~5 s of CPU) per app would
# only slow the suite; their apps use the test process's launcher (`_warm`, the one `tt`
# forks from), so the runs they start fork in well under a second, as in the dashboard.
# Tests marked `warm` test the dashboard's own launcher: they keep it. (test_activations and
# test_explain open the dashboard too: the Model tab, the Divergence tab's explanation.)
DASHBOARD = ("test_ui", "test_snapshots", "test_terminal", "test_activations",
             "test_explain")


@pytest.fixture(autouse=True)
def _ends_what_the_test_started(monkeypatch):
    """A dashboard's jobs (studies, checks, fits) and runs outlive it by design: the
    session goes on training. A test's end is theirs too: one that fails before it stops
    them left them training, writing into its folders after pytest removed them (a study of
    a failed tab test recreated the suite's temporary folder in /tmp). Whatever a test's
    supervisors started and is still alive at its end is stopped (SIGTERM: a run stops with
    its checkpoint), and killed where it does not end within 30 s."""
    from tui_trainer.core.processes import supervisor
    made: list = []
    init = supervisor.Supervisor.__init__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(supervisor.Supervisor, "__init__", record)
    yield
    alive = [p for sup in made for p in [*sup._jobs, *sup._children.values()]
             if p.poll() is None]
    for p in alive:
        p.terminate()
    for p in alive:
        try:
            p.wait(timeout=30)
        except Exception:  # noqa: BLE001 - then killed: nothing outlives the test
            p.kill()
            p.wait(timeout=10)


@pytest.fixture(autouse=True)
def isolated_home(tmp_path_factory, monkeypatch, request):
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("TUI_TRAINER_HOME", str(home))
    # Launcher sockets in a runtime folder of the test's own (short: a socket path has about
    # 100 bytes), looked at by the tests and removed after them.
    runtime = tempfile.mkdtemp(prefix="ttrun-")
    monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
    request.addfinalizer(lambda: shutil.rmtree(runtime, ignore_errors=True))
    monkeypatch.setenv("TUI_TRAINER_OFFLINE", "1")
    if request.module.__name__.startswith(DASHBOARD) \
            and request.node.get_closest_marker("warm") is None:
        launcher = _warm()
        monkeypatch.setenv("TUI_TRAINER_WARM", str(launcher.path) if launcher else "0")
    return home


def sets(*pairs: str) -> list[str]:
    out: list[str] = []
    for p in pairs:
        out += ["--set", p]
    return out


# One warm launcher per test process (tui_trainer/launcher/, the one the dashboard uses): `tt`
# forks each command from it, the real CLI in a real process, without the ~5 s of importing
# torch that a cold `python -m tui_trainer` spends. TT_COLD=1 starts every command cold.
_forker: dict[str, object] = {}


def _warm():
    """The test process's launcher once it is ready; None (commands start cold) when it
    cannot be had. Started at the first `tt`, in a runtime folder of its own."""
    from tui_trainer.launcher.client import WarmLauncher
    if os.environ.get("TT_COLD") == "1":
        return None
    if "launcher" not in _forker:
        runtime = tempfile.mkdtemp(prefix="ttwarm-")
        saved = os.environ.get("XDG_RUNTIME_DIR")
        os.environ["XDG_RUNTIME_DIR"] = runtime
        try:
            launcher = WarmLauncher()
            launcher.start()
        finally:
            if saved is None:
                del os.environ["XDG_RUNTIME_DIR"]
            else:
                os.environ["XDG_RUNTIME_DIR"] = saved
        _forker.update(launcher=launcher, runtime=runtime)
    launcher = _forker["launcher"]
    return launcher if launcher.wait_ready(120) else None


def pytest_sessionfinish(session, exitstatus):
    launcher = _forker.pop("launcher", None)
    if launcher is not None:
        launcher.close()
        shutil.rmtree(_forker.pop("runtime"), ignore_errors=True)


def _read_all(fds: list[int], deadline: float) -> list[bytes] | None:
    """Everything written to these pipes until every writer closed them; None at the
    deadline."""
    import selectors
    import time
    chunks: dict[int, list[bytes]] = {fd: [] for fd in fds}
    with selectors.DefaultSelector() as sel:
        for fd in fds:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            for key, _ in sel.select(min(left, 1.0)):
                data = os.read(key.fd, 65536)
                if data:
                    chunks[key.fd].append(data)
                else:
                    sel.unregister(key.fd)
    return [b"".join(chunks[fd]) for fd in fds]


def tt(*args: str, timeout: float = 300) -> Result:
    """Runs `tui-trainer ARGS` in a process of its own (forked by the test process's warm
    launcher, else `python -m tui_trainer` cold) and returns its exit status and output."""
    proc = _fork(args)
    if proc is not None:
        try:
            out, err = proc.communicate(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        return Result(proc.returncode, out, err)
    proc = subprocess.run([sys.executable, "-m", "tui_trainer", *args], capture_output=True,
                          text=True, timeout=timeout, env=os.environ.copy())
    return Result(proc.returncode, proc.stdout, proc.stderr)


class Forked:
    """`tui-trainer ARGS` forked by the test process's launcher, used as the Popen of a cold
    start with stdout and stderr piped as text: pid, poll, wait, send_signal, kill,
    communicate (the launcher's "forked" line taken off stderr)."""

    def __init__(self, child, out: int, err: int) -> None:
        self._child, self._fds, self.pid = child, [out, err], child.pid

    @property
    def returncode(self) -> int | None:
        return self._child.returncode

    def poll(self) -> int | None:
        return self._child.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._child.wait(timeout)

    def send_signal(self, sig: int) -> None:
        self._child.send_signal(sig)

    def kill(self) -> None:
        self._child.kill()

    def terminate(self) -> None:
        self._child.terminate()

    def communicate(self, timeout: float = 300) -> tuple[str, str]:
        import time
        from tui_trainer.launcher.client import WARM_LINE
        got = _read_all(self._fds, time.monotonic() + timeout)
        if got is None:
            raise subprocess.TimeoutExpired(f"tui-trainer (pid {self.pid})", timeout)
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        self.wait(60)
        out, err = (b.decode("utf-8", errors="replace") for b in got)
        first, _, rest = err.partition("\n")
        return out, rest if first.endswith(WARM_LINE) else err

    def __del__(self) -> None:
        for fd in self._fds:
            os.close(fd)


def _fork(args: tuple[str, ...], quiet: bool = False) -> Forked | None:
    """`tui-trainer ARGS` forked by the test process's launcher (None where it cannot be):
    commands that start runs of their own (ab, repro, sweep) fork them from it too, as
    when the dashboard starts them."""
    launcher = _warm()
    if launcher is None:
        return None
    if quiet:
        out_r, out_w = os.open(os.devnull, os.O_RDONLY), os.open(os.devnull, os.O_WRONLY)
        err_r, err_w = os.open(os.devnull, os.O_RDONLY), os.open(os.devnull, os.O_WRONLY)
    else:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
    try:
        env = {launcher.ENV: str(launcher.path), **os.environ}
        child = launcher.spawn(list(args), out_w, err_w, detach=False, env=env)
    finally:
        os.close(out_w)
        os.close(err_w)
    if child is not None:
        return Forked(child, out_r, err_r)
    os.close(out_r)
    os.close(err_r)
    return None


def tt_popen(*args: str, quiet: bool = False) -> Forked | subprocess.Popen:
    """`tui-trainer ARGS` started and left running (forked as `tt` does, else cold),
    stdout and stderr piped (to /dev/null with `quiet`: a test that never reads them)."""
    proc = _fork(args, quiet)
    if proc is not None:
        return proc
    pipe = subprocess.DEVNULL if quiet else subprocess.PIPE
    return subprocess.Popen([sys.executable, "-m", "tui_trainer", *args], stdout=pipe,
                            stderr=pipe, text=True, env=os.environ.copy())


def db_rows(session: Path, sql: str, args: tuple = ()) -> list[tuple]:
    conn = sqlite3.connect(session / "session.sqlite")
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def fingerprints(session: Path, run_id: int) -> dict[int, str]:
    return dict(db_rows(session, "SELECT step, sha256 FROM fingerprints WHERE run_id = ? "
                                 "ORDER BY step", (run_id,)))


def damage_table(session: Path, table: str) -> None:
    """Overwrites the root page of a session's table with garbage (its WAL folded in
    first): every read of that table then meets a damaged page."""
    con = sqlite3.connect(session / "session.sqlite")
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = ?",
                       (table,)).fetchone()[0]
    size = con.execute("PRAGMA page_size").fetchone()[0]
    con.close()
    data = bytearray((session / "session.sqlite").read_bytes())
    data[(root - 1) * size:root * size] = b"\xff" * size
    (session / "session.sqlite").write_bytes(bytes(data))


def kept_agrees(session: Path, run_id: int) -> None:
    """An ended run's figures were kept (SessionStore.figures_of), and they are exactly those
    computed again from its rows now: every figure shown and every kept number, bit for bit
    (NaN as NaN)."""
    from tui_trainer.core.analysis import figures
    from tui_trainer.core.session.store import SessionStore
    with SessionStore(session, create=False, readonly=True, verify=False) as store:
        run = store.run(run_id)
        kept = store.kept_figures(run)
        assert kept is not None, f"run {run_id} ({run['stored_status']}) has no kept figures"
        again = figures.figures(store.steps(run_id), store.evals(run_id))
    assert json.dumps(kept.as_dict(), sort_keys=True) == \
        json.dumps(again.as_dict(), sort_keys=True)
    assert json.dumps(kept.state(), sort_keys=True) == json.dumps(again.state(), sort_keys=True)


def wait_until(condition, timeout: float = 60) -> bool:
    """Polls `condition()` until it holds (True) or `timeout` seconds pass (False): a wait
    for a condition with a generous bound, never a fixed time."""
    import time
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)              # a poll, not a wait: the condition decides
    return True


def wait_for_row(session: Path, sql: str, timeout: float = 120) -> None:
    """Polls the session until `sql` returns a row (the training process is that far)."""
    if not wait_until(lambda: (session / "session.sqlite").exists()
                      and bool(db_rows(session, sql)), timeout):
        raise AssertionError(f"timed out waiting for: {sql}")


def in_private_mount(script: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs a bash script as root of a private mount namespace (`unshare -rm`: a tmpfs or a
    read-only remount stays inside it, no real root needed), with this Python on PATH as
    `python`: a real full or read-only disk for the tests that need one."""
    import shutil
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed for the full-disk and read-only tests")
    bindir = Path(sys.executable).parent
    return subprocess.run(["unshare", "-rm", "bash", "-uc", script], capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"})


async def click(pilot, selector: str, timeout: float = 30.0) -> None:
    """Clicks a widget once it is on the screen and laid out: on a loaded machine a dialog
    or a tab's panel is mounted a moment before it has a place, and a click at an empty
    region lands nowhere (the quit test failed so)."""
    import time
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = pilot.app.screen.query(selector)
        # A button ignores clicks while it still shows its last press ("-active", a timer
        # that runs late on a loaded machine): the A/B test's second click was lost so.
        if found and found.first().region.area > 0 and not found.first().has_class("-active"):
            assert await pilot.click(selector), f"the click on {selector} did not land"
            return
        await pilot.pause(0.05)
    raise AssertionError(f"{selector} never showed")


# --- the warm launcher's tests (test_warm, test_spare) ------------------------------------

def started_launcher():
    """A warm launcher of the test's own, up (WarmLauncher)."""
    from tui_trainer.launcher.client import WarmLauncher
    launcher = WarmLauncher()
    launcher.start()
    assert launcher.wait_ready(120), "the warm launcher did not come up"
    return launcher


def launch_config(**over) -> dict:
    """A whole config of QUICK's runs (12 steps, a checkpoint every 4), `over` changed."""
    from tui_trainer.core.settings import config
    quick = {k: config.parse_value(k, v) for k, v in (p.split("=") for p in QUICK)}
    return config.from_dict({**config.DEFAULTS.to_dict(), **quick, "max_steps": 12,
                             "checkpoint_every": 4, **over}).to_dict()


def alive(pid: int) -> bool:
    """Process `pid` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def live_children(pid: int) -> set[int]:
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


def price_arms() -> list[int]:
    """Processes of windowed prices' arms still alive on this machine."""
    import os
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if b"price-arm" in cmd:
            out.append(int(pid))
    return out
