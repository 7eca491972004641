"""Where two runs part, and why (`tui-trainer explain A B`).

1. The exact step. The fingerprints say between which two recorded steps the parameters
   parted. Each run is replayed from its newest checkpoint at or before the last agreeing
   fingerprint (a checkpoint continues a run exactly, and `Trainer.step` is the code that
   trained it), its parameters hashed after every step, up to the first differing
   fingerprint; the replay must reproduce that recorded hash, or it proves nothing.
2. What went into that step, for each run: the position, parameters, buffers, optimizer
   state, RNG states and the batch. The first item that differs is the answer.
3. When everything going in is bit-identical, the step was traced (a TorchDispatchMode:
   every aten op of forward, backward and optimizer, with a SHA-256 of each output's bytes,
   order-sensitive), and the first op whose outputs differ is named: the op, the phase, the
   module and parameters it works on, the source line, and how large the difference is.
4. Why: that op is run again, twice, on its recorded inputs under each run's settings.
   Outputs that differ within one run's settings: nondeterministic on this device. Each
   self-consistent but the two different: each setting that differs is switched, one at a
   time, to find the one the difference follows.

The answer is a plain dict; core.analysis.explain puts it in words.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch.utils._pytree import tree_map

from ...core.settings import config
from ...core.errors import BadInput
from ...core.settings import recorded, user_models
from ...core.session.store import SessionStore
from ..checkpoint import load_checkpoint
from ..distributed import Group
from ..knobs import capture_rng, param_fingerprint, restore_rng, set_algorithms
from ..train import Step, Trainer
from ..step import batch_in, forward_loss
from .trace import Op, Trace, tensors_in, tensor_hash


# Process-wide knobs that can choose another kernel or summation order for the same op on
# the same inputs: each knob declared process_wide (core/settings/config.py), set as
# engine/knobs.py sets it while an op is run again.
SWITCHES = recorded.PROCESS_WIDE


# --- replaying a run ------------------------------------------------------------------------

@dataclass
class Side:
    """One of the two runs: its row, config and the checkpoint its replay starts from."""
    run: dict[str, Any]
    cfg: config.RunConfig
    checkpoint_step: int
    state: dict[str, Any] | None        # None: from its config, as it started (step 0)
    missing: str = ""                   # why not from a checkpoint

    @property
    def threads(self) -> int:
        return int((self.run["settings"] or {}).get("num_threads") or torch.get_num_threads())

    @property
    def world(self) -> int:
        """The processes that trained it (its checkpoint holds every rank's RNG states)."""
        return int(self.state.get("world_size", 1)) if self.state \
            else self.cfg.nproc * self.cfg.nnodes


class Replica(Group):
    """Rank `rank` of a data-parallel run, replayed in this process: its shard, its seeds
    and its RNG states, with no process group (Replay does DDP's gradient average)."""

    @property
    def active(self) -> bool:
        return False


def _trainer(side: Side, rank: int = 0) -> Trainer:
    """A trainer positioned at the side's checkpoint (as rank `rank` of a data-parallel
    run), with its run's knobs applied (the thread count the run really had, whatever its
    config said)."""
    torch.set_num_threads(side.threads)
    # A copy: the optimizer takes the checkpoint's tensors as they are (momentum buffers
    # included) and updates them in place, and the next replay must start from the file.
    group = Replica(rank=rank, world=side.world) if side.world > 1 else None
    trainer = Trainer(side.cfg, checkpoint=copy.deepcopy(side.state) if side.state else None,
                      group=group, recorded=user_models.recorded(side.run))
    trainer.setup()
    # Replayed op by op, to be traced, whatever cuda_graph says: a captured step does the
    # same kernels (a run resumed with cuda_graph = step re-runs eagerly steps that it
    # first replayed, and must come to the same bits: a `gpu` test)
    trainer.step_graph = None
    trainer.attach(None, side.run["id"], None)
    trainer.model.train()
    for n, p in trainer.model.named_parameters():
        p._explain_name = n                     # for the backward nodes' modules (Trace)
    return trainer


class Replay:
    """One run's training from its checkpoint, step by step, with the code that trained it
    (`Trainer.step`). A data-parallel run is replayed as its ranks, one after the other in
    this process, each with its own shard and its own global RNG states (swapped in around
    everything it does), and between backward and the optimizer what DDP does: each rank's
    gradients times 1/world, summed in rank order (the all-reduce of two ranks: a sum is the
    same either way round). Whether that is what the run did is not assumed: the replay
    must reproduce the run's recorded parameter hashes."""

    def __init__(self, side: Side):
        self.ranks: list[Trainer] = []
        self._rng: list[dict[str, Any] | None] = []
        for r in range(side.world):
            t = _trainer(side, r)
            self.ranks.append(t)          # each rank's generators as its set-up left them
            self._rng.append(capture_rng(t.loaders.generator, t.cuda) if side.world > 1
                             else None)
        if side.state is None:
            # from the config: DDP gives every rank rank 0's initial parameters
            for t in self.ranks[1:]:
                t.model.load_state_dict(self.lead.model.state_dict())
        self._iters: list[Iterator[Step] | None] = [None] * len(self.ranks)

    @property
    def lead(self) -> Trainer:
        return self.ranks[0]

    @contextmanager
    def rank(self, r: int) -> Iterator[Trainer]:
        """Rank r's turn: its RNG states in the process's generators (one rank: nothing to
        swap)."""
        t = self.ranks[r]
        if len(self.ranks) > 1 and self._rng[r] is not None:
            restore_rng(self._rng[r], t.loaders.generator)
        try:
            yield t
        finally:
            if len(self.ranks) > 1:
                self._rng[r] = capture_rng(t.loaders.generator, t.cuda)

    def next_step(self) -> list[Step] | None:
        """Every rank's next step (None at the end of the training)."""
        out = []
        for r in range(len(self.ranks)):
            with self.rank(r) as t:
                if self._iters[r] is None:
                    self._iters[r] = t.steps()
                batch = next(self._iters[r], None)
            if batch is None:
                return None
            out.append(batch)
        return out

    def step(self, batches: list[Step], between: Callable[[], None] | None = None) -> None:
        """One optimizer step of every rank; `between`: called once the gradients are
        those the optimizer is given (averaged over the ranks), before it runs (before its
        clipping too)."""
        if len(self.ranks) == 1 and between is None:
            self.lead.step(batches[0])
            return
        wants: dict[int, bool] = {}
        # DDP broadcasts rank 0's buffers (BatchNorm's running statistics) to every rank
        # as each forward begins: the others start the step from the lead's.
        lead_buffers = [b.detach().clone() for b in self.lead.model.buffers()]
        for r, batch in enumerate(batches):
            if r:
                with torch.no_grad():
                    for mine, lead in zip(self.ranks[r].model.buffers(), lead_buffers):
                        mine.copy_(lead)
            with self.rank(r) as t:
                # the optimizer waits for the all-reduce: asked now, run after it
                t._optimizer_step = lambda want_norm, r=r: wants.__setitem__(r, want_norm)
                try:
                    t.step(batch)
                finally:
                    del t._optimizer_step
        if len(self.ranks) > 1:
            self._all_reduce()
        if between is not None:
            between()
        for r in range(len(self.ranks)):
            with self.rank(r) as t:
                t._optimizer_step(wants[r])

    @torch.no_grad()
    def _all_reduce(self) -> None:
        """DDP's gradient average: each rank's gradient times 1/world (in its dtype), summed
        over the ranks in rank order; every rank gets the sum."""
        per_rank = [dict(t.model.named_parameters()) for t in self.ranks]
        for name, p in per_rank[0].items():
            if p.grad is None:
                continue
            total = ddp_average([q[name].grad for q in per_rank])
            for q in per_rank:
                q[name].grad.copy_(total)


def ddp_average(grads: list[torch.Tensor]) -> torch.Tensor:
    """What DDP's all-reduce makes of the ranks' gradients: each times 1/world (in its
    dtype, as DDP's reducer scales its bucket), summed in rank order (for two ranks the
    order does not matter: a sum of two is the same either way round)."""
    scale = 1.0 / len(grads)
    return functools.reduce(torch.add, [g * scale for g in grads])


def replay_hashes(side: Side, until: int) -> dict[int, str]:
    """The parameters' hash after every step from the checkpoint to `until` (rank 0's, as
    the run recorded them)."""
    replay = Replay(side)
    hashes: dict[int, str] = {}
    while (batches := replay.next_step()) is not None:
        replay.step(batches)
        hashes[replay.lead.pos.step] = param_fingerprint(replay.lead.model)[0]
        if replay.lead.pos.step >= until:
            break
    return hashes


@dataclass
class Inputs:
    """What went into one step."""
    position: dict[str, int]
    params: dict[str, str]
    buffers: dict[str, str]
    optimizer: dict[str, str]
    rng: dict[str, str]
    batch: list[tuple[list[str], list[str]]]       # per micro-batch: per-sample x, y hashes
    labels: list[list[int]]


def _state_hashes(state: Any, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(state, dict):
        for k, v in state.items():
            out.update(_state_hashes(v, f"{prefix}{k}."))
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            out.update(_state_hashes(v, f"{prefix}{i}."))
    elif isinstance(state, torch.Tensor):
        out[prefix.rstrip(".")] = tensor_hash(state)
    elif state is not None:
        out[prefix.rstrip(".")] = hashlib.sha256(repr(state).encode()).hexdigest()[:24]
    return out


# How an optimizer computes its update, not what goes into it (the optimizer_impl knob):
# the same state under another implementation is the same input.
IMPLEMENTATION_FLAGS = ("foreach", "fused", "capturable", "differentiable")


def _optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    state = optimizer.state_dict()
    groups = [{k: v for k, v in g.items() if k not in IMPLEMENTATION_FLAGS}
              for g in state["param_groups"]]
    return {**state, "param_groups": groups}


def _recording(micro: Iterator[Any], into: list[Any]) -> Iterator[Any]:
    for x, y in micro:
        into.append((x.detach().clone(), y.detach().clone()))
        yield x, y


@dataclass
class Capture:
    inputs: Inputs
    ops: list[Op]
    grads: dict[str, str]
    # each rank's micro-batches (x, y) and rank 0's model as the step found it
    micro: list[list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=list)
    model: Any = None


def capture_step(side: Side, step: int) -> Capture:
    """Replays the side to just before `step`, records what goes into it, traces it (one
    process: ops of a data-parallel step are not traced), and hashes the gradients the
    optimizer is given."""
    replay = Replay(side)
    lead = replay.lead
    while (batches := replay.next_step()) is not None:
        if lead.pos.step + 1 < step:
            replay.step(batches)
            continue
        p = lead.pos
        position = {"step": p.step, "epoch": p.epoch, "batch_in_epoch": p.batch}
        params = _state_hashes(dict(lead.model.named_parameters()))
        buffers = _state_hashes(dict(lead.model.named_buffers()))
        optimizer = _state_hashes({"optimizer": _optimizer_state(lead.optimizer),
                                   "scheduler": lead.scheduler.state_dict(),
                                   "scaler": lead.scaler.state_dict()})
        with replay.rank(0):
            rng = _state_hashes(capture_rng(lead.loaders.generator, lead.cuda))
        before = copy.deepcopy(lead.model)
        grads: dict[str, str] = {}

        def keep_grads() -> None:
            grads.update({n: tensor_hash(q.grad) for n, q in lead.model.named_parameters()
                          if q.grad is not None})
        micro: list[list[Any]] = [[] for _ in batches]
        recorded = [Step(b.size, _recording(b.micro_batches, micro[r]))
                    for r, b in enumerate(batches)]
        traced = len(replay.ranks) == 1
        with torch.autograd.set_detect_anomaly(traced, check_nan=False), \
                (Trace(lead.model) if traced else nullcontext()) as trace:
            replay.step(recorded, between=keep_grads)
        # the step's batch: the ranks' micro-batches side by side (its global batch)
        whole = [(torch.cat([m[k][0] for m in micro if k < len(m)]),
                  torch.cat([m[k][1] for m in micro if k < len(m)]))
                 for k in range(max(len(m) for m in micro))]
        inputs = Inputs(
            position=position, params=params, buffers=buffers, optimizer=optimizer, rng=rng,
            batch=[([tensor_hash(s) for s in x], [tensor_hash(s) for s in y])
                   for x, y in whole],
            labels=[y.tolist() for _, y in whole])
        return Capture(inputs, trace.ops if traced else [], grads, micro, before)
    raise BadInput(f"run {side.run['id']} ends before step {step}")


def sums(capture: Capture, side: Side) -> dict[str, Any]:
    """What splitting a step over the ranks does to the sums alone: on the data-parallel
    run's own samples and weights at that step (dropout off, so that no random draw
    differs), one backward over the whole batch against each rank's backward over its part,
    averaged as DDP does. The first parameter whose gradient differs, and by how much."""
    model = copy.deepcopy(capture.model)
    model.eval()
    parts = [m[0] for m in capture.micro]

    def grads(x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        loss = forward_loss(side.cfg, model, batch_in(side.cfg, x), y)
        loss.backward()
        return {n: q.grad.detach().clone() for n, q in model.named_parameters()
                if q.grad is not None}

    one = grads(torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts]))
    each = [grads(x, y) for x, y in parts]
    averaged = {n: ddp_average([g[n] for g in each]) for n in one}
    differ = [n for n in one if not torch.equal(one[n], averaged[n])]
    out: dict[str, Any] = {
        "world": len(parts), "samples": sum(len(y) for _, y in parts),
        "per_rank": [len(y) for _, y in parts],
        "elements": sum(int((one[n] != averaged[n]).sum()) for n in differ),
        "of": sum(t.numel() for t in one.values()), "params": differ}
    if differ:
        out["first"] = differ[0]
        out["difference"] = difference(one[differ[0]], averaged[differ[0]])
    return out


def replay_start(store: SessionStore, runs: list[dict[str, Any]], last: int,
                 first: int) -> int:
    """The step both replays start at or before: the last agreeing fingerprint, or the
    latest resume of either run between it and the first differing one (the steps after a
    resume are its checkpoint's, not those of an older checkpoint of that run)."""
    resumed = [e["step"] for r in runs for e in store.events(r["id"], "resumed")
               if e["step"] is not None and last < e["step"] < first]
    return max([last, *resumed])


def load_side(store: SessionStore, run: dict[str, Any], start: int) -> Side:
    """The run's newest checkpoint at or before `start`, loaded (weights only); with none
    kept there, the run as its config starts it (a seeded, deterministic run starts the
    same every time: the replay's recorded hash says whether it did), and what is missing
    is said in case it did not."""
    cfg = recorded.run_config(run)
    kept = [c for c in store.usable_checkpoints(run["id"]) if c["step"] <= start]
    if not kept:
        steps = sorted(c["step"] for c in store.usable_checkpoints(run["id"]))
        return Side(run=run, cfg=cfg, checkpoint_step=0, state=None, missing=(
            f"run {run['id']} has no checkpoint at or before step {start}, where its replay "
            f"should start (it keeps {'steps ' + ', '.join(map(str, steps)) if steps else 'none'}"
            "; its checkpoint at step 0 and those its resumes started from are never pruned, "
            "so they were removed by hand, or by an older tui-trainer)"))
    newest = kept[0]
    return Side(run=run, cfg=cfg, checkpoint_step=newest["step"],
                state=load_checkpoint(newest["path"]))


# --- is this machine deterministic here? --------------------------------------------------

HUNT_REPLAYS = 3        # replays of one state, side by side, whose ops are compared
HUNT_STEPS = 100        # steps traced at most (about 0.05 s a step a replay, grokking, CPU)
FIX_TRIES = 4           # runs of the op on its recorded inputs per setting tried

# What the settings that make ops deterministic are set to for that, and the device they
# act on ("" for any).
FIXES = (("deterministic", "on", ""), ("cudnn_benchmark", False, "cuda"),
         ("cudnn_deterministic", True, "cuda"))

# The recorded settings that say which machine and libraries trained a run.
MACHINE_KEYS = ("device_name", "device", "torch", "cuda", "cudnn", "torchvision", "numpy",
                "python", "platform", "num_threads", "num_interop_threads")


class Lockstep:
    """`n` replays of one side from the same restored state, stepped one after the other,
    each with its own global RNG states (swapped in around everything it does): with no
    source of difference but the machine, they stay bit-identical."""

    def __init__(self, side: Side, n: int):
        self.replays: list[Replay] = []
        self._rng: list[dict[str, Any]] = []
        for _ in range(n):
            r = Replay(side)            # its set-up puts the side's RNG states in place
            self.replays.append(r)
            self._rng.append(capture_rng(r.lead.loaders.generator, r.lead.cuda))

    def step(self) -> list[list[Op]] | None:
        """The next step of every replay, traced; each replay's ops (None: training ended)."""
        traces = []
        for i, r in enumerate(self.replays):
            restore_rng(self._rng[i], r.lead.loaders.generator)
            batches = r.next_step()
            if batches is None:
                return None
            with torch.autograd.set_detect_anomaly(True, check_nan=False), \
                    Trace(r.lead.model) as trace:
                r.step(batches)
            self._rng[i] = capture_rng(r.lead.loaders.generator, r.lead.cuda)
            traces.append(trace.ops)
        return traces

    @property
    def at(self) -> int:
        return self.replays[0].lead.pos.step


def _parting(traces: list[list[Op]]) -> tuple[int, int] | None:
    """The first op at which a replay's trace differs from the first replay's (the op's
    name, dtypes or outputs), and that replay; None when all agree."""
    first = traces[0]
    for j in range(max(len(t) for t in traces)):
        for k, other in enumerate(traces[1:], 1):
            if j >= len(first) or j >= len(other):
                return j, k
            x, y = first[j], other[j]
            if (x.name, x.dtypes, x.outputs) != (y.name, y.dtypes, y.outputs):
                return j, k
    return None


def hunt(side: Side, until: int, replays: int = HUNT_REPLAYS,
         most: int | None = None) -> dict[str, Any]:
    """Asks this machine whether the side's steps are deterministic: `replays` replays from
    the same restored state, every op of every step traced, up to step `until`. The first
    op whose output differs across replays of identical inputs is the nondeterministic one
    (with its module, call site and how many elements differ, and what each setting that
    can make it deterministic does to it); with none, the replays agree, and what the run's
    recorded settings show of the machine it trained on is set beside this one's."""
    t0 = time.perf_counter()
    out: dict[str, Any] = {"run": side.run["id"], "replays": replays,
                           "from_checkpoint": side.checkpoint_step,
                           "from_config": side.state is None}
    if side.world > 1:
        out.update(traced=False, seconds=time.perf_counter() - t0)
        return out
    most = HUNT_STEPS if most is None else most
    lock = Lockstep(side, replays)
    steps = 0
    while lock.at < until and steps < most and (traces := lock.step()) is not None:
        steps += 1
        parted = _parting(traces)
        if parted is None:
            continue
        j, k = parted
        x = traces[0][j] if j < len(traces[0]) else None
        y = traces[k][j] if j < len(traces[k]) else None
        out.update(agree=False, step=lock.at, steps=steps)
        if x is None or y is None or (x.name, x.dtypes) != (y.name, y.dtypes):
            out["paths"] = {"first": x.to_dict() if x else None,
                            "other": y.to_dict() if y else None}
        else:
            # how many replays' results differ from the first's at this op
            differing = sum(1 for t in traces[1:]
                            if j >= len(t) or t[j].outputs != x.outputs)
            o = next(n for n, (h1, h2) in enumerate(zip(x.outputs, y.outputs)) if h1 != h2)
            out["op"] = {**x.to_dict(), "output": o, "difference": difference(x.out[o], y.out[o]),
                         "inputs_agree": x.inputs == y.inputs, "other_outputs": y.outputs,
                         "differing_replays": differing}
            out["fixes"] = fixes(x, side)
        out["seconds"] = time.perf_counter() - t0
        return out
    here = lock.replays[0].lead.settings
    recorded = side.run.get("settings") or {}
    out.update(agree=True, steps=steps, seconds=time.perf_counter() - t0,
               short_of=max(0, until - lock.at),      # steps left untraced (the bound)
               elsewhere=[{"key": k, "recorded": recorded.get(k), "here": here.get(k)}
                          for k in MACHINE_KEYS if k in recorded
                          and recorded.get(k) != here.get(k)])
    return out


def fixes(op: Op, side: Side, tries: int = FIX_TRIES) -> dict[str, Any]:
    """The op run `tries` times on its recorded inputs: under the side's own settings
    (whether it differs alone, outside the step), then with each setting that can make it
    deterministic switched to that value (what it does: raises, agrees, still differs)."""
    def distinct() -> int:
        return len({tuple(_run_again(op)) for _ in range(tries)})

    _apply(side)
    alone = distinct() > 1
    out: dict[str, Any] = {"tries": tries, "alone_differs": alone, "tried": [], "already": []}
    for key, value, device in FIXES:
        if device and not op.device.startswith(device):
            continue
        if _knob(side, key) == value:
            out["already"].append(key)
            continue
        _apply(side, (key, value))
        try:
            # an op that agrees with itself alone cannot show what a setting changes
            result = ("agrees" if distinct() == 1 else "differs") if alone else "untold"
            out["tried"].append({"key": key, "value": value, "result": result})
        except RuntimeError as e:
            out["tried"].append({"key": key, "value": value, "result": "raises",
                                 "error": str(e).strip().splitlines()[0][:300]})
    _apply(side)
    return out


# --- why an op differs ----------------------------------------------------------------------

def _apply(side: Side, switched: tuple[str, Any] | None = None) -> None:
    """The side's process-wide knobs (one of them switched to another value)."""
    changes: dict[str, Any] = {"num_threads": side.threads}
    if switched:
        changes[switched[0]] = switched[1]
    set_algorithms(dataclasses.replace(side.cfg, **changes))


def _knob(side: Side, key: str) -> Any:
    if key == "num_threads":
        return side.threads
    return getattr(side.cfg, key)


def _run_again(op: Op, layout: torch.memory_format | None = None) -> list[str]:
    """The op on copies of its recorded inputs (4-D ones in `layout` when given)."""
    def copy_of(a: Any) -> Any:
        if not isinstance(a, torch.Tensor):
            return a
        if layout is not None and a.dim() == 4:
            # (not .contiguous(): with one channel both layouts pass for contiguous, yet the
            # strides, which choose the kernel, differ)
            return torch.empty_like(a, memory_format=layout).copy_(a)
        return a.clone()
    args, kwargs = tree_map(copy_of, op.args)
    return [tensor_hash(t) for t in tensors_in(op.func(*args, **kwargs))]


def why(op_a: Op, op_b: Op, a: Side, b: Side) -> dict[str, Any]:
    """Runs the op again on its recorded inputs: twice under each side's settings, then
    under A's with each differing knob switched to B's value."""
    consistent = []
    for op, side in ((op_a, a), (op_b, b)):
        _apply(side)
        consistent.append(_run_again(op) == _run_again(op) == op.outputs)
    out: dict[str, Any] = {"self_consistent": consistent, "follows": []}
    if not all(consistent):
        out["kind"] = "nondeterministic"
    else:
        for key in SWITCHES:
            va, vb = _knob(a, key), _knob(b, key)
            if va == vb:
                continue
            _apply(a, (key, vb))
            if _run_again(op_a) == op_b.outputs:
                out["follows"].append({"key": key, "a": va, "b": vb})
        if a.cfg.channels_last != b.cfg.channels_last:
            # not a process-wide knob: the layout of the op's 4-D inputs
            _apply(a)
            layout = torch.channels_last if b.cfg.channels_last else torch.contiguous_format
            if _run_again(op_a, layout) == op_b.outputs:
                out["follows"].append({"key": "channels_last", "a": a.cfg.channels_last,
                                       "b": b.cfg.channels_last})
        same_settings = all(_knob(a, k) == _knob(b, k) for k in SWITCHES) and \
            a.cfg.channels_last == b.cfg.channels_last
        # Same op, same inputs, same settings, two results: only the machine differs.
        out["kind"] = "setting" if out["follows"] else \
            "nondeterministic_between" if same_settings else "unknown"
    _apply(a)
    return out


def difference(x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    """How two outputs of one op differ: elements, largest absolute difference, ULPs."""
    if x.shape != y.shape or x.dtype != y.dtype:
        return {"shapes": [list(x.shape), list(y.shape)],
                "dtypes": [str(x.dtype).replace("torch.", ""), str(y.dtype).replace("torch.", "")]}
    x, y = x.detach().cpu().contiguous(), y.detach().cpu().contiguous()
    ne = x != y
    out: dict[str, Any] = {"elements": int(ne.sum()), "of": x.numel()}
    if x.is_floating_point():
        out["max_abs"] = float((x.double() - y.double()).abs().max())
        ints = {torch.float32: torch.int32, torch.float64: torch.int64,
                torch.float16: torch.int16, torch.bfloat16: torch.int16}.get(x.dtype)
        if ints is not None:
            xi, yi = x.view(ints).long(), y.view(ints).long()
            # ordered integers: negative floats count down from the sign bit
            top = 1 << (torch.finfo(x.dtype).bits - 1)
            xi = torch.where(xi < 0, -top - xi, xi)
            yi = torch.where(yi < 0, -top - yi, yi)
            out["max_ulps"] = int((xi - yi).abs().max())
    return out


# --- the whole explanation ------------------------------------------------------------------

def _first(a: dict[str, str], b: dict[str, str]) -> str | None:
    for k in list(a) + [k for k in b if k not in a]:
        if a.get(k) != b.get(k):
            return k
    return None


def first_differing_input(ca: Capture, cb: Capture) -> dict[str, Any] | None:
    ia, ib = ca.inputs, cb.inputs
    if ia.position != ib.position:
        return {"item": "position", "a": ia.position, "b": ib.position}
    for item in ("params", "buffers", "optimizer"):
        key = _first(getattr(ia, item), getattr(ib, item))
        if key is not None:
            return {"item": item, "name": key}
    if ia.batch != ib.batch:
        # What the whole step consumed, its micro-batches in order: one batch of 64 and two
        # accumulated micro-batches of 32 take the same samples (issue 55: the first
        # micro-batches were compared, and B's second half read as "differs").
        xa, ya = [h for x, _ in ia.batch for h in x], [h for _, y in ia.batch for h in y]
        xb, yb = [h for x, _ in ib.batch for h in x], [h for _, y in ib.batch for h in y]
        sizes = [[len(x) for x, _ in ia.batch], [len(x) for x, _ in ib.batch]]
        if (xa, ya) == (xb, yb):        # the same samples, split otherwise: how it computed
            return {"item": "partition", "samples": len(xa), "a": sizes[0], "b": sizes[1]}
        la = [c for m in ia.labels for c in m]
        lb = [c for m in ib.labels for c in m]
        diff = [i for i in range(max(len(xa), len(xb)))
                if i >= len(xa) or i >= len(xb) or xa[i] != xb[i] or ya[i] != yb[i]]
        detail: dict[str, Any] = {
            "item": "batch", "micro_batches": max(len(ia.batch), len(ib.batch)),
            "samples": diff, "of": max(len(xa), len(xb)),
            "same_samples_reordered": sorted(zip(xa, ya)) == sorted(zip(xb, yb)),
            "same_labels": la == lb,
            "labels_a": [la[i] for i in diff[:8] if i < len(la)],
            "labels_b": [lb[i] for i in diff[:8] if i < len(lb)]}
        if sizes[0] == sizes[1] and len(sizes[0]) > 1:     # the micro-batch it starts in
            ends = [sum(sizes[0][:k + 1]) for k in range(len(sizes[0]))]
            detail["micro_batch"] = next(k for k, end in enumerate(ends) if diff[0] < end)
        return detail
    key = _first(ia.rng, ib.rng)
    if key is not None:
        return {"item": "rng", "name": key}
    return None


def _prices(store: SessionStore, side: Side, found: dict[str, Any]) -> list[dict[str, Any]]:
    """What each setting that made the op deterministic costs, where an A/B study of this
    config measured it (core.analysis.study.price)."""
    from ...core.analysis.study import price
    out = []
    for tried in (found.get("fixes") or {}).get("tried", []):
        if tried["result"] == "agrees":
            measured = price(store, side.run["config"], tried["key"], tried["value"])
            if measured is not None:
                out.append({"key": tried["key"], "value": tried["value"], **measured})
    return out


def replay(store: SessionStore, located: dict[str, Any]) -> dict[str, Any]:
    """Goes on from what the fingerprints said (core.analysis.explain.locate, verdict "replay"):
    the exact step, what went into it, the op and why, as a plain dict (core.analysis.explain words
    it)."""
    t0 = time.perf_counter() - located["cost_s"]
    out = dict(located)
    ra, rb = (store.run(r) for r in out["runs"])
    first, last = out["first_different"], out["last_identical"]
    start = replay_start(store, [ra, rb], last if last is not None else 0, first)
    sides = [load_side(store, r, start) for r in (ra, rb)]
    hashes = [replay_hashes(side, first) for side in sides]
    reproduced = [h.get(first) == recorded for h, recorded in zip(hashes, out["recorded"])]
    out["replay"] = {"from_checkpoints": [s.checkpoint_step for s in sides],
                     "from_config": [s.state is None for s in sides],
                     "steps": [len(h) for h in hashes], "reproduced": reproduced}
    if not all(reproduced):
        # A replay that does not give its own run's bits: is this machine deterministic
        # there? The same state replayed side by side, op by op, says.
        lost = next(i for i, ok in enumerate(reproduced) if not ok)
        found = hunt(sides[lost], first)
        out.update(verdict="nondeterministic" if found.get("agree") is False else
                   "not_reproduced", hunt={**found, "side": "AB"[lost]},
                   missing=[s.missing for s, ok in zip(sides, reproduced) if s.missing and not ok])
        if found.get("op"):
            out["hunt"]["price"] = _prices(store, sides[lost], found)
        out["cost_s"] = time.perf_counter() - t0
        return out
    both = max(side.checkpoint_step for side in sides)
    step = next(s for s in range(both + 1, first + 1) if hashes[0][s] != hashes[1][s])
    out["step"] = step
    captures = [capture_step(side, step) for side in sides]
    worlds = [side.world for side in sides]
    out["worlds"] = worlds
    if worlds[0] != worlds[1]:
        # one process against several: besides what goes in, the sums themselves
        dp = 0 if worlds[0] > worlds[1] else 1
        out["sums"] = {"run": "AB"[dp], **sums(captures[dp], sides[dp])}
    differing = first_differing_input(*captures)
    if differing is not None:
        out.update(verdict="input", input=differing, cost_s=time.perf_counter() - t0)
        return out
    if max(worlds) > 1:
        out.update(verdict="untraced", cost_s=time.perf_counter() - t0)
        return out
    oa, ob = captures[0].ops, captures[1].ops
    for i in range(min(len(oa), len(ob))):
        x, y = oa[i], ob[i]
        if x.name != y.name or x.dtypes != y.dtypes or x.outputs != y.outputs:
            break
    else:
        out.update(verdict="unexplained", cost_s=time.perf_counter() - t0)
        return out
    op = {**x.to_dict(), "other": y.to_dict() if (x.name, x.dtypes) != (y.name, y.dtypes)
          else None, "inputs_agree": x.inputs == y.inputs, "same_strides": x.strides == y.strides,
          "b_outputs": y.outputs}
    if op["other"] is None:
        k = next(j for j, (h1, h2) in enumerate(zip(x.outputs, y.outputs)) if h1 != h2)
        op["output"] = k
        op["difference"] = difference(x.out[k], y.out[k])
        op["why"] = why(x, y, *sides) if x.inputs == y.inputs else None
    grads = [k for k in captures[0].grads if captures[0].grads[k] != captures[1].grads.get(k)]
    out.update(verdict="op", op=op, gradients_differ=grads, cost_s=time.perf_counter() - t0)
    return out
