"""Activation checkpointing and the memory training needs: real runs of the shipped sample."""

from __future__ import annotations

import json

from conftest import QUICK, fingerprints, sets, tt
from tui_trainer.core.store import SessionStore
from tui_trainer.core.verdicts import verdict

# 12 steps, fingerprints every 3, deterministic algorithms on.
SHORT = [*QUICK, "max_steps=12", "deterministic=on"]


def _run(session, *extra: str) -> dict:
    r = tt("run", "--session", str(session), "--json", *sets(*SHORT, *extra))
    assert r.rc == 0, r.err
    return json.loads(r.out.strip().splitlines()[-1])


def test_checkpointing_changes_memory_and_time_not_the_bits(tmp_path):
    """off, full and selective: bit-identical at every fingerprint, dropout included (the
    recomputed blocks draw the forward's masks). With preserve_rng_state off they are not,
    and the verdict names that setting."""
    for mode in ("off", "full", "selective"):
        _run(tmp_path, f"activation_checkpointing={mode}")
    store = SessionStore(tmp_path, create=False, readonly=True)
    v = verdict(store, [1, 2, 3])
    assert v.identical and v.fingerprints_compared == len(fingerprints(tmp_path, 1)) == 5
    assert store.run(2)["settings"]["activation_checkpointing"] == "full"
    _run(tmp_path, "activation_checkpointing=full", "preserve_rng_state=false")
    v = verdict(store, [1, 4])
    assert not v.identical and v.first_difference == 3
    assert any(e.startswith("preserve_rng_state = off with activation checkpointing")
               for e in v.explanations), v.explanations


def test_checkpointing_keeps_the_bits_with_amp_channels_last_and_accumulation(tmp_path):
    """The examples net, bf16 autocast, channels_last, two micro-batches a step: selective
    against off, bit-identical."""
    extra = ["model=examples", "amp=bf16", "channels_last=true", "grad_accum_steps=2",
             "max_steps=6"]
    _run(tmp_path, *extra)
    _run(tmp_path, *extra, "activation_checkpointing=selective")
    assert fingerprints(tmp_path, 1) == fingerprints(tmp_path, 2)
