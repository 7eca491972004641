"""Determinism verdicts: are these runs bit-identical, and if not, where did they part and
which settings can explain it.

Works on what the session store holds (parameter hashes, losses, parameter sketches, the
runs' configs and effective settings). Core layer: imports neither torch nor textual.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .divergence import divergence
from .figures import hashes, identity
from ..session.store import SessionStore
from ..settings import recorded, user_models

@dataclass
class Verdict:
    identical: bool
    runs: list[int]
    fingerprints_compared: int
    first_difference: int | None          # first fingerprint step where any run differs
    last_identical: int | None            # the last fingerprint step before it (all equal)
    growth: list[dict[str, Any]] = field(default_factory=list)   # per step, vs the first run
    explanations: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def explain(runs: list[dict[str, Any]], sources: dict[int, str] | None = None) -> list[str]:
    """Settings of these runs that can make them differ, in words (`sources`: their nets'
    recorded sources, where they are nets of the user's own files)."""
    cfgs = [r["config"] or {} for r in runs]
    fps = [r["settings"] or {} for r in runs]
    reasons: list[str] = []
    code = user_models.code_differs(runs, sources)
    if code is not None:
        reasons.append(code)
    if any(c.get("seed") is None for c in cfgs):
        reasons.append("seed = none: nothing is seeded, so each run starts from fresh random "
                       "state (initial weights, shuffle, dropout, augmentation)")
    cuda = any(str(f.get("device", "")).startswith("cuda") for f in fps)
    if cuda and any(f.get("deterministic_algorithms") is False for f in fps):
        reasons.append("deterministic = off on CUDA: kernels that use atomics (e.g. some "
                       "backward passes, scatter/index_add) may sum in a different order")
    if cuda and any(f.get("cudnn_benchmark") for f in fps):
        reasons.append("cudnn.benchmark = on: cuDNN times convolution algorithms and may pick "
                       "a different one in each run")
    if cuda and any(f.get("cudnn_deterministic") is False for f in fps):
        reasons.append("cudnn.deterministic = off: cuDNN may use non-deterministic "
                       "convolution algorithms")
    if any(c.get("activation_checkpointing", "off") != "off"
           and c.get("preserve_rng_state") is False for c in cfgs):
        reasons.append("preserve_rng_state = off with activation checkpointing: a block "
                       "recomputed in backward draws other dropout masks than its forward "
                       "did, so its gradients are not those of the forward")
    compiled = sorted({str(c.get("compile")) for c in cfgs} - {"off", "None"})
    if compiled and len({c.get("activation_checkpointing", "off") for c in cfgs}) > 1:
        reasons.append(f"activation checkpointing differs under compile = {compiled[0]}: "
                       "the compiled "
                       "graph is partitioned and fused around the recomputed blocks, which "
                       "rounds differently (measured on this CPU: eager runs stay "
                       "bit-identical, compiled ones do not)")
    if compiled:
        reasons.append(f"compile = {', '.join(compiled)}: generated kernels and their fusion "
                       "can change the order of floating-point operations"
                       + ("; max-autotune picks kernels by timing them, which can differ "
                          "from run to run" if "max-autotune" in compiled else ""))
    reasons += differing(cfgs, fps)
    for c in cfgs:
        if c.get("augment") == "numpy" and c.get("num_workers", 0) > 0 \
                and not c.get("seed_workers"):
            reasons.append("numpy augmentation in DataLoader workers without seed_workers: "
                           "the workers' numpy seeds then come from the global torch RNG")
            break
    return reasons


_UNKNOWN = object()


def differing(cfgs: list[dict[str, Any]], fps: list[dict[str, Any]]) -> list[str]:
    """Each knob and recorded fact declared able to change the bits (core/settings/
    recorded.py) whose values differ between the runs: a knob as its settings record what
    was applied, else as its config says; a value recorded before it was, where not known,
    is no difference."""
    out = []
    keys = [(recorded.SETTING_OF.get(k), k) for k in recorded.BIT_KNOBS] + \
        [(f, None) for f, fact in recorded.FACTS.items() if fact.bits]
    for setting, knob in keys:
        if setting is not None:
            values = [f[setting] if setting in f else
                      recorded.SETTING_DEFAULTS.get(setting, _UNKNOWN) for f in fps]
        else:
            values = [c.get(knob, recorded.before(knob)) for c in cfgs]
        name = setting or knob
        if any(v is _UNKNOWN for v in values):
            continue              # recorded before it was: not known, not a difference
        if name == "dist_backend" and None in values:
            continue              # a one-process run has none: world_size says it already
        if name == "model_sha256":
            continue              # said above: which code, and how it differs
        if len({repr(v) for v in values}) > 1:
            why = recorded.WHY.get(name)
            out.append(f"{name} differs between the runs: {', '.join(repr(v) for v in values)}"
                       + (f" ({why})" if why else ""))
    return out


def verdict(store: SessionStore, run_ids: list[int], since_step: int = -1) -> Verdict:
    """Compares every run with the first one at every common fingerprint after since_step."""
    runs = [store.run(r) for r in run_ids]
    base_steps, base_fps = store.steps(run_ids[0]), store.fingerprints(run_ids[0])
    first: int | None = None
    compared: set[int] = set()
    growth: dict[int, dict[str, Any]] = {}
    for other in run_ids[1:]:
        other_fps = store.fingerprints(other)
        same = identity(hashes(base_fps), hashes(other_fps), since_step)
        compared.update(same.compared)
        if same.first_difference is not None:
            first = same.first_difference if first is None else min(first,
                                                                    same.first_difference)
        d = divergence(base_steps, store.steps(other), base_fps, other_fps)
        for s, dl in zip(d.steps, d.loss_delta, strict=True):
            if s > since_step:
                row = growth.setdefault(s, {"step": s, "loss_delta": 0.0,
                                            "param_distance": None})
                row["loss_delta"] = max(row["loss_delta"], dl)
        for s, dist in zip(d.fp_steps, d.param_distance, strict=True):
            if s > since_step and dist is not None:
                row = growth.setdefault(s, {"step": s, "loss_delta": None,
                                            "param_distance": 0.0})
                row["param_distance"] = max(row["param_distance"] or 0.0, dist)
    ordered = sorted(compared)
    last_identical = None
    if first is not None:
        before = [s for s in ordered if s < first]
        last_identical = before[-1] if before else None
    identical = first is None and bool(ordered)
    return Verdict(identical=identical, runs=list(run_ids), fingerprints_compared=len(ordered),
                   first_difference=first, last_identical=last_identical,
                   growth=[growth[s] for s in sorted(growth)],
                   explanations=[] if identical else explain(
                       runs, user_models.sources(store.events, run_ids)))


def divergence_text(names: str, d: Any, checks: list[dict[str, Any]], pair: tuple[int, int],
                    training: bool, runs: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    """The Divergence panel's words, as (text, bold) pieces: the headline from the parameter
    hashes, the recorded check (determinism verdict or resume check) of this pair, how the
    difference grows, and the settings that can explain it. `runs` are the pair's runs
    (config and settings); `d` is their core.analysis.divergence.Divergence."""
    out: list[tuple[str, bool]] = [(names + ": ", False)]
    if d.identical is None:
        out.append(("no common fingerprint yet.", False))
    elif d.identical:
        out += [(f"bit-identical at all {len(d.fp_steps)} common fingerprints", True),
                (f" (up to step {d.fp_steps[-1]}).", False)]
    elif d.first_difference == 0:
        out += [("not identical:", True), (" the parameters differ already at step 0 "
                "(different initialisation: another seed, model or no seed at all).", False)]
    else:
        before = max(s for s in d.fp_steps if s < d.first_difference) \
            if d.first_difference != d.fp_steps[0] else None
        where = (f"identical at step {before}, different at step {d.first_difference}"
                 if before is not None else
                 f"different at step {d.first_difference}, the first step compared")
        out += [("not identical:", True), (f" parameter hashes {where} ({len(d.fp_steps)} "
                "fingerprints compared; a smaller fingerprint_every narrows it down).", False)]
    mine = [c for c in checks if c.get("kind") == "repro_verdict" and c["data"]
            and c["data"].get("runs") == list(pair)]
    if mine:
        data = mine[-1]["data"]
        result = ("identical" if data.get("identical") is True else "NOT identical", True)
        if data.get("mode") == "resume":
            out += [(f"\nResume check: B was killed at step {data.get('resume_at')} and "
                     "resumed from its checkpoint; after the resume it is ", False), result,
                    (f" to A ({data.get('fingerprints_compared')} fingerprints compared).",
                     False)]
        else:
            out += [("\nDeterminism verdict: B is a twin of A, trained again: ", False),
                    result, (".", False)]
    elif training:
        out.append(("\nTraining: the verdict covers the steps both runs have reached so far.",
                    False))
    if d.identical is False:
        deltas = [(v, s) for s, v in zip(d.steps, d.loss_delta, strict=True) if v is not None]
        dists = [(s, v) for s, v in zip(d.fp_steps, d.param_distance, strict=True)
                 if v is not None]
        grow = []
        if deltas:
            v, s = max(deltas)
            grow.append(f"largest |Δloss| {v:.4g} at step {s}" if v > 0 else
                        "the logged losses are still equal")
        if dists:
            grow.append(f"parameter distance {dists[-1][1]:.4g} at step {dists[-1][0]}")
        if grow:
            out.append(("\nHow it grows: " + "; ".join(grow) + ".", False))
        kept = {c.get("run_id"): c["data"]["source"] for c in checks
                if c.get("kind") == "model_source" and isinstance(c.get("data"), dict)
                and isinstance(c["data"].get("source"), str)}
        reasons = explain([{**r, "id": rid} for r, rid in zip(runs, pair)], kept)
        out.append(("\nSettings that can explain it: " + (
            " • ".join(reasons) if reasons else "none of the known causes applies (same "
            "seed, deterministic settings, same threads): look at the Compare tab"), False))
    return out


def replica_text(drifts: dict[int, dict[str, Any]], runs: dict[int, Any]
                 ) -> list[tuple[str, bool]]:
    """The Divergence panel's words for data-parallel runs whose replicas drifted apart
    (event `replicas_drift`: rank 0 compares every rank's parameter hash at each
    fingerprint), as (text, bold) pieces ending in a line break."""
    out: list[tuple[str, bool]] = []
    for run_id, event in sorted(drifts.items()):
        ranks = ", ".join(map(str, (event.get("data") or {}).get("ranks", []))) or "?"
        name = getattr(runs.get(run_id), "name", None) or f"run {run_id}"
        out += [(f"Run {run_id} ({name}): ", False),
                (f"replicas drifted apart at step {event.get('step')}", True),
                (f" (rank(s) {ranks} no longer hold rank 0's parameters).\n", False)]
    return out
