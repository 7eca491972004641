"""One run per GPU (issue 58, point 3): which GPUs a run takes, what a study and the
dashboard do with them, and what `machine` says. The GPUs a study or a session sees are
given as a list (TUI_TRAINER_GPUS), so the scheduling is checked on a machine without
one: runs of device "auto" take GPUs (they would start CUDA where there is one) and train
on the CPU here."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from conftest import QUICK, db_rows, sets, tt
from tui_trainer.core.processes import gpus
from tui_trainer.core.processes.supervisor import Supervisor
from tui_trainer.core.session.store import SessionStore


@pytest.mark.parametrize("config, want", [
    ({"device": "cpu"}, (0, None)), ({"device": "auto"}, (1, None)),
    ({"device": "cuda"}, (1, None)), ({"device": "cuda:0"}, (1, None)),
    ({"device": "cuda:2"}, (1, 2)), ({"device": "cuda", "nproc": 2}, (2, None)),
    ({"device": "cpu", "nproc": 2}, (0, None)), ({"device": "mps"}, (0, None)),
    ("not a table", (0, None))])
def test_a_run_wants_one_gpu_per_process_on_this_machine(config, want):
    assert gpus.wanted(config) == want


def test_the_gpus_a_run_is_put_on():
    assert gpus.gpu_list(3, {}) == [0, 1, 2] and gpus.gpu_list(0, {}) == []
    assert gpus.gpu_list(0, {gpus.GPUS_ENV: "1, 0,x,1,-2"}) == [1, 0]
    here, auto = [0, 1, 2], {"device": "auto"}
    assert gpus.choose(auto, here, {}) == [0]
    assert gpus.choose(auto, here, {0: [4]}) == [1]
    assert gpus.choose(auto, here, {0: [4], 1: [5], 2: [6, 7]}) == [0]     # least held
    assert gpus.choose({"device": "cuda", "nproc": 2}, here, {1: [4]}) == [0, 2]
    assert gpus.choose({"device": "cuda:2"}, here, {2: [4]}) == [2]         # as named
    assert gpus.choose({"device": "cpu"}, here, {}) == []
    assert gpus.choose(auto, [], {}) == []
    # Only a run given other GPUs than its own numbering's first is shown only those.
    assert gpus.visible_env([0], auto, {}) == {}
    assert gpus.visible_env([0, 1], {"device": "cuda", "nproc": 2}, {}) == {}
    assert gpus.visible_env([2], auto, {}) == {"CUDA_VISIBLE_DEVICES": "2"}
    assert gpus.visible_env([1], auto, {"CUDA_VISIBLE_DEVICES": "3,5"}) == \
        {"CUDA_VISIBLE_DEVICES": "5"}
    assert gpus.visible_env([2], {"device": "cuda:2"}, {}) == {}


def test_what_runs_hold_is_read_as_untrusted():
    runs = [{"id": 1, "gpus": [0]}, {"id": 2, "gpus": [0, 1]}, {"id": 3, "gpus": [2]},
            {"id": 4, "gpus": ["1", True, -1, 1.5]}, {"id": 5, "gpus": None},
            {"id": 6, "gpus": "0"}]
    held = gpus.held_by(runs, lambda r: r["id"] != 3)        # run 3's process is gone
    assert held == {0: [1, 2], 1: [2]}


def test_a_pool_never_puts_two_runs_on_one_gpu():
    """Real threads take and give back GPUs as a study's runs do: never two on one GPU, as
    many at a time as there are GPUs, a data-parallel run waiting for two free at once."""
    pool = gpus.Pool([0, 1])
    on: dict[int, int] = {0: 0, 1: 0}
    most = {"each": 0, "all": 0}
    lock = threading.Lock()
    side_by_side = threading.Barrier(2, timeout=60)     # the first two meet holding theirs

    def run(config: dict, meet: bool) -> None:
        held = pool.take(config)
        assert held is not None
        with lock:
            for g in held:
                on[g] += 1
            most["each"] = max(most["each"], *on.values())
            most["all"] = max(most["all"], sum(on.values()))
        if meet:
            side_by_side.wait()         # both hold a GPU at once, however they are scheduled
        with lock:
            for g in held:
                on[g] -= 1
        pool.give(held)

    first = [threading.Thread(target=run, args=({"device": "auto"}, True)) for _ in range(2)]
    configs = [{"device": "auto"}] * 6 + [{"device": "cuda", "nproc": 2}] * 2 + \
        [{"device": "cuda:1"}] * 2
    rest = [threading.Thread(target=run, args=(c, False)) for c in configs]
    for t in first + rest:
        t.start()
    for t in first + rest:
        t.join(timeout=60)
    assert most == {"each": 1, "all": 2} and sorted(pool._free) == [0, 1]
    # One GPU: one at a time; a run that can never have its GPUs is told so at once.
    one = gpus.Pool([0])
    assert one.take({"device": "cuda", "nproc": 2}) is None
    assert one.take({"device": "cuda:1"}) is None
    assert one.take({"device": "cpu"}) == []
    held = one.take({"device": "auto"})
    assert held == [0]
    asked = time.monotonic()
    assert one.take({"device": "auto"}, stop=lambda: time.monotonic() - asked > 0.3,
                    poll_s=0.05) is None                        # waited, then stopped
    one.give(held)
    assert one.take({"device": "auto"}) == [0]


def _spans(session, study_id: int) -> list[tuple[float, float, list]]:
    rows = db_rows(session, "SELECT r.started, r.ended, r.gpus FROM runs r JOIN study_runs s "
                   "ON s.run_id = r.id WHERE s.study_id = ? ORDER BY r.id", (study_id,))
    return [(a, b, json.loads(g)) for a, b, g in rows]


@pytest.mark.parametrize("listed", ["0,1", "0"])
def test_a_study_trains_one_run_per_gpu_side_by_side(tmp_path, monkeypatch, listed):
    """Two GPUs: the study's runs train two at a time, each on a GPU of its own; one GPU:
    one at a time. The study's notes say which, and each run's record says its GPU."""
    monkeypatch.setenv(gpus.GPUS_ENV, listed)
    r = tt("ab", "--session", str(tmp_path), "--json", *sets(*QUICK, "max_steps=20"),
           "--steps", "20", "--vary", "eval_batch_size=100", "--repeats", "2",
           "--rerun-loaded", "0")      # (the planned rounds only, however busy the machine)
    assert r.rc == 0, r.err
    study = json.loads(r.out)
    spans = _spans(tmp_path, study["study_id"])
    assert len(spans) == 4 and all(len(g) == 1 for _, _, g in spans)
    overlap = [(a, b) for i, a in enumerate(spans) for b in spans[i + 1:]
               if a[0] < b[1] and b[0] < a[1]]
    notes = " ".join(study.get("notes") or [])
    if listed == "0,1":
        assert {g[0] for _, _, g in spans} == {0, 1}
        assert overlap and all(a[2] != b[2] for a, b in overlap)
        assert "2 GPUs: the runs on CUDA train side by side, one run per GPU" in notes
    else:
        assert {g[0] for _, _, g in spans} == {0} and not overlap
        assert "1 GPU: the runs on CUDA train one at a time" in notes


def test_start_puts_a_run_on_a_free_gpu_and_machine_says_which_runs_hold_them(
        tmp_path, monkeypatch):
    """The dashboard's Start (Supervisor): a run is put on a GPU no live run of the session
    holds; `machine` lists each GPU with the runs that hold it."""
    monkeypatch.setenv(gpus.GPUS_ENV, "0,1")
    with SessionStore(tmp_path) as store:
        first = store.create_run({"device": "auto"}, name="holder")
        store.set_launcher(first, os.getpid())      # its process lives: this test's
        store.set_gpus(first, [0])
        sup = Supervisor(store)
        assert sup.gpus_for({"device": "auto"}) == [1]
        assert sup.gpus_for({"device": "cpu"}) == []
        store.set_gpus(first, [0, 1])
        assert sup.gpus_for({"device": "auto"}) == [0]      # none free: the least held
        store.set_gpus(first, [1])
    r = tt("--session", str(tmp_path), "machine")
    assert r.rc == 0, r.err
    assert "GPU 0: free" in r.out and "GPU 1: run 1 (holder)" in r.out
    got = json.loads(tt("--session", str(tmp_path), "machine", "--json").out)
    assert got["gpus"] == {"0": [], "1": [first]}
