"""malloc = keep (core/settings/config.py; engine/knobs.py's set_malloc): glibc keeps the large
blocks a step frees, so the next step does not fault them in again. device=cpu: glibc's
malloc behind torch's CPU tensors, in a run's own process as a run builds it."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

FAULTS = r'''
import json, resource, sys
from tui_trainer import pricing
from tui_trainer.core.settings import config
from tui_trainer.engine.train import Trainer
cfg = config.from_dict({"dataset": "mnist-sample", "device": "cpu", "model": "examples",
                        "malloc": sys.argv[1]})
t = Trainer(pricing.arm_config(cfg))
t.setup()
t.attach(None, 0, None)
t.model.train()
batches = t.steps()
for _ in range(3):
    t.step(next(batches))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    t.step(next(batches))
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10
print(json.dumps({"faults": faults, "malloc": t.settings["malloc"]}))
'''


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc = keep tells glibc")
def test_malloc_keep_stops_a_step_faulting_in_the_memory_the_step_before_freed():
    """pytorch/examples' net (its activations several MB a step): as glibc comes, every step
    faults thousands of pages in again (4,000-11,000 here); with keep, a tenth of that or
    less (what is left is new small objects: 40-460 here, the most on a loaded machine).
    Each run records what its malloc did. (glibc's thresholds move by themselves: once, in
    a loaded suite, a process as glibc comes kept its blocks and faulted 2.4 pages a step;
    such a process is measured again, at most twice: keep's claim needs the faults.)"""
    seen = {}
    for value in ("system", "keep"):
        for _ in range(3 if value == "system" else 1):
            p = subprocess.run([sys.executable, "-c", FAULTS, value], capture_output=True,
                               text=True, timeout=300)
            assert p.returncode == 0, p.stderr[-3000:]
            seen[value] = json.loads(p.stdout.strip().splitlines()[-1])
            if seen[value]["faults"] >= 1000:
                break
    assert seen["system"]["malloc"] == "system" and seen["keep"]["malloc"] == "keep", seen
    assert seen["system"]["faults"] >= 1000, seen           # what keep is for
    assert seen["keep"]["faults"] * 10 <= seen["system"]["faults"], seen
    assert seen["keep"]["faults"] < 1000, seen         # not one step's blocks again


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc = keep tells glibc")
def test_a_price_says_where_its_arms_fault_memory_in_again_and_prices_keep(tmp_path,
                                                                          isolated_home):
    """device=cpu. malloc = keep priced in windows on pytorch/examples' net: the arms count
    their page faults a timed step (the base thousands, keep a fraction of that), and the
    price says what the base's faults do to it, with the knob that keeps that memory."""
    from conftest import tt
    from tui_trainer import pricing
    r = tt("ab", "--session", str(tmp_path), "--decide", "--json", "--vary", "malloc=keep",
           "--set", "dataset=mnist-sample", "--set", "device=cpu", "--set", "model=examples")
    assert r.rc == 0, r.err
    (out,) = json.loads(r.out)
    faults = out["faults_a_step"]
    # (an arm forked from the launcher also faults in the pages it first writes of what it
    # shares with it: 360-1,150 a step here, under keep too)
    assert faults["base"] >= pricing.FAULTS_NOTE > faults["variant"], out
    assert faults["variant"] * 2 < faults["base"], out
    r = tt("ab", "--session", str(tmp_path), "--study", "1")
    assert r.rc == 0 and "note: a step faults in again the base's" in r.out, r.out
    assert "the variant's" not in r.out and "malloc = keep keeps that memory" in r.out
    assert pricing.faults_lines({"base": 2.0, "variant": "x"}) == []     # (session data)
