"""Where a run's memory goes, on demand (`breakdown`: the `memory` command, the dashboard's
key b): one training step of a copy of the run under torch's MemTracker, which accounts
every tensor to a category (parameters, gradients, optimizer state, activations,
temporaries) and to the module it was made in. (The figures at every log point are
engine.meter's.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...core.settings.config import FIELDS, graph_step
from ..train import Trainer

# --- on demand: one step, accounted by category and module ------------------------------------

CATEGORIES = {"PARAM": "parameters", "BUFFER": "buffers", "GRAD": "gradients",
              "OPT": "optimizer state", "ACT": "activations (kept for backward)",
              "TEMP": "temporaries", "OTH": "other"}


def copy_of(cfg: Any, state: dict[str, Any] | None, steps: int,
            recorded: dict[str, Any] | None = None, **changes: Any) -> tuple[Any, int]:
    """A trainer of a copy of a run, set up from `state` (its checkpoint) or its config, in
    this process, with room for `steps` more steps and nothing recorded; a data-parallel
    run as one of its ranks (its share of the batch). (trainer, the run's world size)."""
    world = cfg.nproc * cfg.nnodes
    # (epochs beyond the run's: a run copied at its end has steps left to take)
    epochs = min(cfg.epochs + 2 + steps, FIELDS["epochs"].metadata["hi"])
    one = cfg.replace(nproc=1, nnodes=1, batch_size=cfg.batch_size // world, max_steps=0,
                      eval_every=0, rdzv_endpoint="", epochs=epochs, **changes)
    if state is not None and world > 1:
        state = {**state, "world_size": 1, **state["ranks"][0]}
    trainer = Trainer(one, checkpoint=state, recorded=recorded)
    trainer.setup()
    trainer.step_graph = None       # its ops are followed one by one: never a replayed graph
    trainer.model.train()
    return trainer, world


MAX_POINTS = 4000          # a timeline longer than this keeps every k-th point and the peak
SNAPSHOT_ENTRIES = 200_000  # the CUDA allocator's history kept for the step


def _category(key: Any) -> str:
    return CATEGORIES.get(str(key).rsplit(".", 1)[-1].split(":")[0].strip(), str(key))


def _timeline_tracker() -> Any:
    """MemTracker that also notes, after every operator, the memory by category, the
    phase (forward, backward, between them and the optimizer: the gradients' norm,
    clipping, unscaling; optimizer; after it) and the innermost module running: the step's
    timeline. Public API only: MemTracker's current snapshot, a ModTracker of its own for
    the module and phase, the optimizer's step hooks for the optimizer."""
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed._tools.mod_tracker import ModTracker

    class Timeline(MemTracker):
        def __init__(self) -> None:
            super().__init__()
            self.points: list[tuple[str, str, str, dict[str, int]]] = []
            self.where = ModTracker()
            self.in_optimizer = False
            self.stepped = False
            self.backward_seen = False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore
            out = super().__torch_dispatch__(func, types, args, kwargs)
            self.note(getattr(func, "__name__", str(func)))
            return out

        def note(self, op: str) -> None:
            snap = self.get_tracker_snapshot("current")
            self.backward_seen = self.backward_seen or self.where.is_bw
            phase = "optimizer" if self.in_optimizer else "after" if self.stepped else \
                "backward" if self.where.is_bw else "between" if self.backward_seen else \
                "forward"
            inner = max(self.where.parents, key=lambda n: (n != "Global", n.count(".")),
                        default="")
            self.points.append((phase, inner, op, {str(d): {_category(k): v for k, v in
                                                            s.items()}
                                                   for d, s in snap.items()}))

    return Timeline()


def _timeline(points: list[tuple[str, str, str, dict[str, dict[str, int]]]], device: str
              ) -> dict[str, Any]:
    """The points as columns: category names once, then per point its phase, module,
    operator and bytes by category (at most MAX_POINTS: every k-th and the peak)."""
    cats = [c for c in CATEGORIES.values()
            if any(p[3].get(device, {}).get(c) for p in points)]
    rows = [[phase, module, op, *[int(p.get(device, {}).get(c, 0)) for c in cats]]
            for phase, module, op, p in points]
    if len(rows) > MAX_POINTS:
        k = -(-len(rows) // MAX_POINTS)
        peak = max(range(len(rows)), key=lambda i: sum(rows[i][3:]))
        rows = [r for i, r in enumerate(rows) if i % k == 0 or i == peak]
    return {"categories": cats, "points": rows, "unit": "bytes"}


def breakdown(cfg: Any, state: dict[str, Any] | None, snapshot: Path | None = None,
              recorded: dict[str, Any] | None = None) -> dict[str, Any]:
    """One step of a copy of the run (from `state`, its checkpoint, or as its config starts
    it), after one step of warm-up, under MemTracker: the memory at the step's peak by
    category, each module's own peak with its parameters and outputs, and the step's
    timeline (the memory by category after each operator). On CUDA the allocator's
    history of that step is also recorded and written to `snapshot` (a pickle that
    https://pytorch.org/memory_viz opens). A data-parallel run is measured as one of its
    ranks (its share of the batch, without DDP's buckets)."""
    import torch

    trainer, world = copy_of(cfg, state, steps=2, recorded=recorded, compile="off")
    steps = trainer.steps()
    trainer.step(next(steps))                     # warm-up: optimizer state, allocators
    batch = next(steps)
    tracker = _timeline_tracker()
    tracker.track_external(trainer.model, trainer.optimizer)

    def optimizer(on: bool) -> Any:
        def hook(*_: Any) -> None:
            tracker.in_optimizer = on
            tracker.stepped = tracker.stepped or not on
        return hook
    hooks = [trainer.optimizer.register_step_pre_hook(optimizer(True)),
             trainer.optimizer.register_step_post_hook(optimizer(False))]
    history = snapshot is not None and trainer.device.type == "cuda"
    if history:
        torch.cuda.memory._record_memory_history(max_entries=SNAPSHOT_ENTRIES)
    try:
        with tracker, tracker.where:
            tracker.note("start")
            trainer.step(batch)
            tracker.note("end")
        if history:
            torch.cuda.synchronize()
            torch.cuda.memory._dump_snapshot(str(snapshot))
    finally:
        for h in hooks:
            h.remove()
        if history:
            torch.cuda.memory._record_memory_history(enabled=None)
    peak = tracker.get_tracker_snapshot("peak")
    device = next(iter(peak), trainer.device)
    cats = {_category(k): v for k, v in peak.get(device, {}).items() if "Total" not in str(k)}
    total = next((v for k, v in peak.get(device, {}).items() if "Total" in str(k)), None)
    modules = []
    for stats in tracker.memory_tracking.values():
        modules.append({"module": stats.mod_fqn, "parameters": stats.parameter_mem,
                        "outputs": stats.output_mem,
                        "peak": max(stats.local_peak.values(), default=0)})
    return {"device": str(trainer.device), "batch": trainer.cfg.batch_size, "world": world,
            "step": trainer.pos.step, "checkpointing": cfg.activation_checkpointing,
            "categories": cats, "total": total, "modules": modules,
            "from_checkpoint": state is not None,
            # (cuda_graph = step: the copy steps op by op, its memory followed op by op)
            "graphs_replayed": graph_step(cfg, trainer.cuda),
            "timeline": _timeline(tracker.points, str(device)),
            "snapshot": str(snapshot) if history else None}
