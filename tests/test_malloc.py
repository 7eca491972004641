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
for _ in range(5):
    t.step(next(batches))
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5
print(json.dumps({"faults": faults, "malloc": t.settings["malloc"]}))
'''


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc = keep tells glibc")
def test_malloc_keep_stops_a_step_faulting_in_the_memory_the_step_before_freed():
    """pytorch/examples' net (its activations several MB a step): as glibc comes, every step
    faults thousands of pages in again (4,000-11,000 here); with keep, next to none. Each
    run records what its malloc did."""
    seen = {}
    for value in ("system", "keep"):
        p = subprocess.run([sys.executable, "-c", FAULTS, value], capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        seen[value] = json.loads(p.stdout.strip().splitlines()[-1])
    assert seen["system"]["malloc"] == "system" and seen["keep"]["malloc"] == "keep", seen
    assert seen["system"]["faults"] >= 1000, seen           # what keep is for
    assert seen["keep"]["faults"] <= 300, seen
