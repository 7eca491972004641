"""Determinism verdicts: `tui-trainer repro` and the verdict it is built on."""

from __future__ import annotations

import json

import pytest

from conftest import QUICK, db_rows, fingerprints, sets, tt
from tui_trainer.core.analysis.verdicts import verdict
from tui_trainer.core.session.store import SessionStore

SHORT = QUICK + ["epochs=2", "deterministic=on"]


def _first_differing_step(session, a: int, b: int) -> int | None:
    fa, fb = fingerprints(session, a), fingerprints(session, b)
    differ = [s for s in sorted(fa.keys() & fb.keys()) if fa[s] != fb[s]]
    return differ[0] if differ else None


def test_a_deterministic_config_is_identical(tmp_path):
    r = tt("repro", "--session", str(tmp_path), "--json", "--repeats", "3", *sets(*SHORT))
    assert r.rc == 0, r.err
    v = json.loads(r.out)
    assert v["identical"] is True and len(v["runs"]) == 3
    assert v["fingerprints_compared"] == len(fingerprints(tmp_path, 1)) == 8
    assert v["first_difference"] is None and v["explanations"] == []
    kinds = db_rows(tmp_path, "SELECT kind FROM events WHERE kind = 'repro_verdict'")
    assert kinds == [("repro_verdict",)]


def test_no_seed_is_not_identical_and_says_why(tmp_path):
    r = tt("repro", "--session", str(tmp_path), "--json", *sets(*SHORT, "seed=none"))
    assert r.rc == 3, r.err
    v = json.loads(r.out)
    assert v["identical"] is False
    assert v["first_difference"] == _first_differing_step(tmp_path, 1, 2) == 0
    assert any(e.startswith("seed = none") for e in v["explanations"])
    assert v["growth"] and all(g["step"] >= 0 for g in v["growth"])
    # where they part, said by `explain` and kept on the twin for the dashboard and exports
    assert v["explanation"]["verdict"] == "initial" and v["explanation"]["runs"] == [1, 2]
    kept = db_rows(tmp_path, "SELECT run_id, message FROM events WHERE kind = 'explanation'")
    assert kept == [(2, "Runs 1 (A) and 2 (B) part at step 0: their initial parameters "
                     "differ (seed none: A and B drew their own); no replay needed. Cost: "
                     + kept[0][1].rsplit("Cost: ", 1)[1])]
    human = tt("repro", "--session", str(tmp_path), *sets(*SHORT, "seed=none"))
    assert human.rc == 3 and "NOT identical" in human.out and "seed = none" in human.out
    assert "where they part: Runs 3 (A) and 4 (B) part at step 0" in human.out


def test_another_seed_differs_from_the_first_step(tmp_path):
    for seed in (1, 2):
        assert tt("run", "--session", str(tmp_path), *sets(*SHORT, f"seed={seed}")).rc == 0
    v = verdict(SessionStore(tmp_path), [1, 2])
    assert not v.identical
    assert v.first_difference == _first_differing_step(tmp_path, 1, 2) == 0
    assert any("seed differs" in e for e in v.explanations)


def test_another_thread_count_changes_the_bits_on_this_machine(tmp_path):
    """A finding, not a law: on the 2-core machines this project runs on, 1 and 2 threads
    start identical (same seed) and differ from the first training fingerprint on. A claim
    about the CPU: the thread count does not touch CUDA's kernels."""
    for threads in (1, 2):
        r = tt("run", "--session", str(tmp_path),
               *sets(*SHORT, f"num_threads={threads}", "device=cpu"))
        assert r.rc == 0, r.err
    v = verdict(SessionStore(tmp_path), [1, 2])
    assert not v.identical
    assert v.last_identical == 0 and v.first_difference == _first_differing_step(tmp_path, 1, 2)
    assert any(e.startswith("num_threads differs") for e in v.explanations)


@pytest.mark.slow
def test_resume_check_mid_epoch_is_identical(tmp_path):
    r = tt("repro", "--session", str(tmp_path), "--json", "--resume-at", "14",
           *sets(*SHORT, "epochs=3", "num_workers=2", "augment=numpy"))
    assert r.rc == 0, r.err
    v = json.loads(r.out)
    assert v["mode"] == "resume" and v["identical"] is True
    killed = v["runs"][1]
    ckpt = db_rows(tmp_path, "SELECT min(step), batch_in_epoch FROM checkpoints "
                             "WHERE run_id = ? AND step > 0", (killed,))[0]   # not step 0's
    assert ckpt == (14, 4)                        # the resume point is inside epoch 2
    assert v["fingerprints_compared"] == len([s for s in fingerprints(tmp_path, killed)
                                              if s > 14])


@pytest.mark.parametrize("args,key", [(["--repeats", "1"], "--repeats"),
                                      (["--resume-at", "0"], "--resume-at"),
                                      (["--set", "max_steps=5", "--resume-at", "5"],
                                       "--resume-at"),
                                      (["--set", "lr=-1"], "lr")])
def test_bad_repro_input_exits_2_before_training(tmp_path, args, key):
    r = tt("repro", "--session", str(tmp_path), *args)
    assert r.rc == 2 and f"{key}:" in r.err
    assert not (tmp_path / "session.sqlite").exists()


@pytest.mark.slow
def test_repro_of_a_run_in_the_session_repeat_and_resume(tmp_path):
    """The dashboard's verdict actions: check a run already trained, with a twin."""
    assert tt("run", "--session", str(tmp_path), *sets(*SHORT)).rc == 0
    r = tt("repro", "--run", "1", "--session", str(tmp_path), "--json")
    assert r.rc == 0, r.err
    v = json.loads(r.out)
    assert v["identical"] is True and v["runs"] == [1, 2] and v["mode"] == "repeat"
    assert db_rows(tmp_path, "SELECT name, twin_of FROM runs WHERE id = 2") == \
        [("run-1-twin", 1)]
    r = tt("repro", "--run", "1", "--resume-at", "7", "--session", str(tmp_path), "--json")
    assert r.rc == 0, r.err
    v = json.loads(r.out)
    assert v["identical"] is True and v["runs"] == [1, 3] and v["mode"] == "resume"
    assert _first_differing_step(tmp_path, 1, 3) is None
    events = db_rows(tmp_path, "SELECT data FROM events WHERE run_id = 3 AND "
                               "kind = 'repro_verdict'")
    assert len(events) == 1 and json.loads(events[0][0])["resume_at"] == 7
    r = tt("repro", "--run", "1", "--set", "seed=2", "--session", str(tmp_path))
    assert r.rc == 2 and "--run" in r.err
    r = tt("repro", "--run", "1", "--resume-at", "20", "--session", str(tmp_path))
    assert r.rc == 2 and "--resume-at" in r.err
