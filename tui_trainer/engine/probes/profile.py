"""Where a run's step time goes, op by op: K steps of a copy of the run under torch.profiler.

The copy starts from the run's newest checkpoint (or its config), trains `warmup` steps
unprofiled (allocators, optimizer state, one-off kernels), then `steps` steps under
`torch.profiler.profile` (CPU activities, CUDA where the run trains there; shapes and
memory recorded). From that: the operators by self time (calls, share), the steps' time by
phase (the engine's own Clock, as every run records it), each leaf module's forward time
(a record_function scope around it), the memory peak by category (one more step under
MemTracker, engine.probes.memory), and a Chrome/Perfetto trace written where the caller
says. On CUDA also the GPU's side: each operator's kernel time (the kernels it launched), the
kernels by their time on the device, and the steps' total kernel time. What else took the
CPU while the steps were profiled is kept too (core.processes.contention): a profile taken
on a busy machine says so. core.analysis.profiling words and diffs it; the session keeps it
as an event on the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, record_function

from ...core.analysis.figures import PHASES
from ...core.processes import contention
from ...core.settings.config import graph_step

SCOPE = "module: "          # the record_function name of a module's forward
TOP_OPS = 40                 # operators kept (by self time); the trace has them all


def _scope_modules(model: torch.nn.Module) -> list[Any]:
    """A record_function scope around every leaf module's forward; the hooks' handles."""
    handles = []
    for name, module in model.named_modules():
        if not name or any(True for _ in module.children()):
            continue

        def pre(mod: Any, args: Any, _name: str = name) -> None:
            scope = record_function(SCOPE + _name)
            scope.__enter__()
            mod._tt_scope = scope

        def post(mod: Any, args: Any, out: Any) -> None:
            scope = getattr(mod, "_tt_scope", None)
            if scope is not None:
                scope.__exit__(None, None, None)
                mod._tt_scope = None

        handles += [module.register_forward_pre_hook(pre),
                    module.register_forward_hook(post)]
    return handles


def profile(cfg: Any, state: dict[str, Any] | None, steps: int, warmup: int,
            trace: Path | None, recorded: dict[str, Any] | None = None) -> dict[str, Any]:
    """Profiles `steps` steps of a copy of the run (see the module's text). A data-parallel
    run is profiled as one of its ranks (its share of the batch)."""
    from .memory import breakdown, copy_of
    trainer, world = copy_of(cfg, state, steps=steps + warmup, recorded=recorded)
    it = trainer.steps()
    for _ in range(warmup):
        trainer.step(next(it))
    cuda = trainer.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    handles = _scope_modules(trainer.model)
    try:
        with torch.profiler.profile(activities=activities, record_shapes=True,
                                    profile_memory=True) as prof:
            # (the steps' own time: the profiler's start and its processing left out)
            trainer.clock.lap(trainer.pos.samples)
            before = contention.snapshot()      # what else the machine did meanwhile
            for _ in range(steps):
                trainer.step(next(it))
            wall, _, spent = trainer.clock.lap(trainer.pos.samples)
            machine = contention.between(before, contention.snapshot())
    finally:
        for h in handles:
            h.remove()
    if trace is not None:
        trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace))
    events = prof.key_averages()
    ops, kernels, modules = [], [], []
    for e in events:
        if e.key.startswith(SCOPE):
            modules.append({"module": e.key[len(SCOPE):], "ms": e.cpu_time_total / 1000 / steps,
                            "calls": e.count // steps})
            continue
        if e.key.startswith("ProfilerStep") or e.key.startswith("## "):
            continue
        if cuda and e.device_type != DeviceType.CPU:
            # a kernel (or a copy) as the GPU ran it: its time on the device (a named
            # region's span on the GPU is no kernel: it would count its kernels twice)
            if getattr(e, "is_user_annotation", False):
                continue
            kernels.append({"kernel": e.key, "device_ms": e.self_device_time_total / 1000 / steps,
                            "calls": e.count / steps})
            continue
        op = {"op": e.key, "self_ms": e.self_cpu_time_total / 1000 / steps,
              "total_ms": e.cpu_time_total / 1000 / steps, "calls": e.count / steps,
              "self_mem": e.self_cpu_memory_usage / steps}
        if cuda:      # the GPU time of the kernels this operator itself launched
            op["device_ms"] = e.self_device_time_total / 1000 / steps
        ops.append(op)
    self_total = sum(o["self_ms"] for o in ops)
    device_total = sum(k["device_ms"] for k in kernels)
    for o in ops:
        o["share"] = o["self_ms"] / self_total if self_total else 0.0
        if cuda:
            o["device_share"] = o["device_ms"] / device_total if device_total else 0.0
    # kept: the operators that take the most host time, and on CUDA those whose kernels
    # take the most GPU time (a step can be bound by either)
    by_self = sorted(ops, key=lambda o: -o["self_ms"])
    kept = by_self[:TOP_OPS]
    if cuda:
        ids = {id(o) for o in kept}
        kept += [o for o in sorted(ops, key=lambda o: -o["device_ms"])[:TOP_OPS]
                 if id(o) not in ids and o["device_ms"] > 0]
        kept.sort(key=lambda o: -o["self_ms"])
    kernels.sort(key=lambda k: -k["device_ms"])
    modules.sort(key=lambda m: -m["ms"])
    try:
        memory = breakdown(cfg, state)
    except (RuntimeError, ValueError, StopIteration) as e:
        memory = {"error": f"{type(e).__name__}: {e}"}
    return {"device": str(trainer.device), "batch": trainer.cfg.batch_size, "world": world,
            "steps": steps, "warmup": warmup, "from_step": trainer.pos.step - steps,
            "from_checkpoint": state is not None, "compile": cfg.compile,
            # (cuda_graph = step: the copy steps op by op, its modules timed by hooks)
            "graphs_replayed": graph_step(cfg, cuda),
            "wall_ms": wall * 1000 / steps, "self_ms": self_total,
            "phases_ms": {k: spent[k] * 1000 / steps for k in PHASES},
            "machine": machine, "ops": kept, "op_count": len(ops), "modules": modules,
            "device_ms": device_total if cuda else None, "kernels": kernels[:TOP_OPS],
            "memory": {k: memory.get(k) for k in ("categories", "total", "error")
                       if k in memory},
            "trace": None}
