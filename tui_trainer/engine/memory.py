"""Where a run's memory goes, on demand (`breakdown`: the `memory` command, the dashboard's
key b): one training step of a copy of the run under torch's MemTracker, which accounts
every tensor to a category (parameters, gradients, optimizer state, activations,
temporaries) and to the module it was made in. (The figures at every log point are
engine.meter's.)
"""

from __future__ import annotations

from typing import Any


from ..core.config import FIELDS
from .train import Trainer

# --- on demand: one step, accounted by category and module ------------------------------------

CATEGORIES = {"PARAM": "parameters", "BUFFER": "buffers", "GRAD": "gradients",
              "OPT": "optimizer state", "ACT": "activations (kept for backward)",
              "TEMP": "temporaries", "OTH": "other"}


def copy_of(cfg: Any, state: dict[str, Any] | None, steps: int, **changes: Any
            ) -> tuple[Any, int]:
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
    trainer = Trainer(one, checkpoint=state)
    trainer.setup()
    trainer.model.train()
    return trainer, world


def breakdown(cfg: Any, state: dict[str, Any] | None) -> dict[str, Any]:
    """One step of a copy of the run (from `state`, its checkpoint, or as its config starts
    it), after one step of warm-up, under MemTracker: the memory at the step's peak by
    category, and each module's own peak with its parameters and outputs. A data-parallel
    run is measured as one of its ranks (its share of the batch, without DDP's buckets)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    trainer, world = copy_of(cfg, state, steps=2, compile="off")
    steps = trainer.steps()
    trainer.step(next(steps))                     # warm-up: optimizer state, allocators
    batch = next(steps)
    tracker = MemTracker()
    tracker.track_external(trainer.model, trainer.optimizer)
    with tracker:
        trainer.step(batch)
    peak = tracker.get_tracker_snapshot("peak")
    device = next(iter(peak), trainer.device)
    cats = {CATEGORIES.get(str(k).rsplit(".", 1)[-1].split(":")[0].strip(), str(k)): v
            for k, v in peak.get(device, {}).items() if "Total" not in str(k)}
    total = next((v for k, v in peak.get(device, {}).items() if "Total" in str(k)), None)
    modules = []
    for stats in tracker.memory_tracking.values():
        modules.append({"module": stats.mod_fqn, "parameters": stats.parameter_mem,
                        "outputs": stats.output_mem,
                        "peak": max(stats.local_peak.values(), default=0)})
    return {"device": str(trainer.device), "batch": trainer.cfg.batch_size, "world": world,
            "step": trainer.pos.step, "checkpointing": cfg.activation_checkpointing,
            "categories": cats, "total": total, "modules": modules,
            "from_checkpoint": state is not None}
