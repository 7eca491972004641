"""The launcher's spare (issue 34: the first step on CUDA): a process that starts CUDA
before Start and is given the next run; what it holds, how it is suspended, replaced
and ended, and that a run it is given trains the same bits as a cold one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import (alive, db_rows, fingerprints, launch_config, live_children,
                      started_launcher, wait_until)
from tui_trainer.core.settings import config
from tui_trainer.core.session.store import SessionStore
from tui_trainer.core.processes.supervisor import launch, train_args
from tui_trainer.launcher.client import WARM_LINE, WarmChild, WarmLauncher


# --- the spare (issue 34: the first step on CUDA) -------------------------------------------

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
    warm = started_launcher()
    launcher = warm._proc.pid
    assert wait_until(lambda: len(live_children(launcher)) == 1), "no spare"
    (spare,) = live_children(launcher)
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
                cfg = launch_config(**over)
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
                    assert live_children(launcher) >= {spare, proc.pid}   # still waiting
                assert proc.wait(timeout=120) == 0
                if how == "spare":      # the next spare, SPARE_AFTER_S later
                    assert wait_until(lambda: len(live_children(launcher)) == 1)
                    (spare,) = live_children(launcher)
                    assert spare != pids["spare"]
            logs = {how: store.log_path(r).read_text() for how, r in ids.items()}
        assert pids["spare"] not in live_children(launcher) and spare not in pids.values()
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
    assert wait_until(lambda: not alive(spare))


def test_spares_can_be_turned_off(tmp_path, monkeypatch):
    from tui_trainer.launcher.client import SPARE_LINE
    monkeypatch.setenv("TUI_TRAINER_SPARE", "0")
    warm = started_launcher()
    try:
        with SessionStore(tmp_path) as store:
            run_id = store.create_run(launch_config(max_steps=2), name="no spare")
            proc = launch(tmp_path, train_args(run_id), store.log_path(run_id), warm=warm,
                          spare="auto")
            assert proc.wait(timeout=120) == 0
            log = store.log_path(run_id).read_text()
        assert WARM_LINE in log and SPARE_LINE not in log
        assert live_children(warm._proc.pid) == set()
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
        assert live_children(proc.pid) == set()
        warm = WarmLauncher(str(sock))
        with SessionStore(tmp_path) as store:
            run_id = store.create_run(launch_config(max_steps=2), name="forked")
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
        assert wait_until(lambda: [len(live_children(p)) for p in live_children(proc.pid)] == [0])
        (spare,) = live_children(proc.pid)           # the next one, with no helper
        # ready, as its line in the launcher's log says (what benchmarks wait for)
        assert wait_until(lambda: f"{ready_line(spare)}: CUDA's driver started (a test's "
                          "stand-in)" in log.read_text()), log.read_text()[-2000:]
        with SessionStore(tmp_path / "s") as store:
            cfg = launch_config(max_steps=2, deterministic="off")
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
        assert wait_until(lambda: len(live_children(proc.pid)) == 1), log.read_text()[-2000:]
        (spare,) = live_children(proc.pid)
        with SessionStore(tmp_path / "s") as store:
            cfg = launch_config(max_steps=2)
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
        assert alive(pid)
    finally:
        owner.kill()
        owner.wait(timeout=30)
    assert wait_until(lambda: not alive(pid), 30)


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
                assert wait_until(lambda: [len(live_children(p)) for p in
                                           live_children(proc.pid)] == [1]), \
                    log.read_text()[-2000:]
                (spare,) = live_children(proc.pid)
                helpers.append(live_children(spare).pop())
                cfg = launch_config(max_steps=4, fingerprint_every=2)
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
        assert not any(alive(pid) for pid in helpers), helpers
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
        warm = started_launcher()
        launcher = warm._proc.pid
    session = tmp_path / "s"
    try:
        assert wait_until(lambda: len(live_children(launcher)) == 1), "no spare"
        logs = {}
        with SessionStore(session) as store:
            # what the client says the run uses: its device, and whether it is deterministic
            for device, deterministic in (("cuda:1", "on"), ("auto", "on"), ("auto", "off")):
                # (a spare waits: the first one, or the one made after a run was given one)
                assert wait_until(lambda: len(live_children(launcher)) == 1), "no spare"
                cfg = launch_config(max_steps=2, deterministic=deterministic)
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
    spares = live_children(launcher.pid)
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
                cfg = launch_config(max_steps=2, deterministic=deterministic)
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
                    assert wait_until(lambda: not alive(spare)), "the spare did not end"
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
                cfg = launch_config(max_steps=2, cudnn_benchmark=benchmark, batch_size=batch)
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
                    assert wait_until(lambda: not alive(spare)), "the spare did not end"
                elif not given:                                 # kept for the next
                    assert alive(spare) and ready(made) == spare
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
        assert wait_until(lambda: len(live_children(proc.pid)) == 1), log.read_text()[-2000:]
        (spare,) = live_children(proc.pid)
        assert wait_until(lambda: len(live_children(spare)) == 1)    # its helper: suspending
        (helper,) = live_children(spare)
        with SessionStore(tmp_path / "s") as store:
            cfg = launch_config(max_steps=2, deterministic="off")
            run_id = store.create_run(cfg, name="another workspace")
            child = launch(tmp_path / "s", train_args(run_id), store.log_path(run_id),
                           warm=WarmLauncher(str(sock)), spare="auto", cublas=None,
                           config=cfg)
            assert isinstance(child, WarmChild) and child.pid != spare
            assert child.wait(timeout=120) == 0
        assert slow is not None
        slow.unlink()                   # the suspension ends now
        assert wait_until(lambda: not alive(spare) and not alive(helper))
        assert wait_until(lambda: len(live_children(proc.pid)) == 1 and
                          ready_line(next(iter(live_children(proc.pid)))) in log.read_text()), \
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
