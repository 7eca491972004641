"""The warm launcher: runs forked from a process that imported torch once start at once and
train exactly as a cold-started process does."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from conftest import QUICK, db_rows, fingerprints, sets, tt
from tui_trainer.core import config as C
from tui_trainer.core.store import SessionStore
from tui_trainer.core.supervisor import (NICENESS, WARM_LINE, WarmChild, WarmLauncher,
                                         launch, train_args)

CFG = {**{k: C.parse_value(k, v) for k, v in (p.split("=") for p in QUICK)},
       "max_steps": 12, "checkpoint_every": 4}


@pytest.fixture
def warm():
    launcher = WarmLauncher()
    launcher.start()
    assert launcher.wait_ready(120), "the warm launcher did not come up"
    yield launcher
    launcher.close()


def _config(**over) -> dict:
    return C.from_dict({**C.DEFAULTS.to_dict(), **CFG, **over}).to_dict()


def _wait(condition, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _group_nice(pid: int) -> int | None:
    """The nice value of the live process's autogroup; None where the kernel has none."""
    if not Path("/proc/self/autogroup").exists():
        return None
    return int(Path(f"/proc/{pid}/autogroup").read_text().split("nice")[1])


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
                # its own process session (it outlives the dashboard), and its session's
                # scheduling group yields to the dashboard as the process does
                assert _wait(lambda: os.getsid(proc.pid) == proc.pid)
                assert _wait(lambda: _group_nice(proc.pid) in (None, NICENESS)), \
                    f"autogroup nice {_group_nice(proc.pid)}, the process's {NICENESS}"
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


def test_a_study_forks_its_runs_and_stops_cleanly(tmp_path, monkeypatch):
    """`ab` starts a launcher of its own: every run's log says it was forked, the launcher
    is gone afterwards, and the variant is bit-identical where it should be."""
    import tempfile
    mine = tempfile.mkdtemp(prefix="tw-")       # short: a socket path has ~100 bytes
    monkeypatch.setenv("TMPDIR", mine)
    r = tt("ab", "--session", str(tmp_path), "--json", *sets(*QUICK), "--steps", "4",
           "--vary", "eval_batch_size=100", "--repeats", "2")
    assert r.rc == 0, r.err
    rows = json.loads(r.out)["rows"]
    assert rows[1]["bit_identical"] is True and rows[1]["done"] == 2
    for (run_id,) in db_rows(tmp_path, "SELECT id FROM runs"):
        assert WARM_LINE in (tmp_path / "logs" / f"run-{run_id}.log").read_text()
    deadline = time.monotonic() + 10
    while _launchers(mine) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _launchers(mine) and not list(Path(mine).glob("tui-trainer-warm-*"))
    shutil.rmtree(mine)


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
            if b"warm" in cmd and any(c.startswith(under.encode()) for c in cmd):
                out.add(int(proc.name))
    return out
