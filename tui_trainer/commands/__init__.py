"""The commands of `tui-trainer`, one module each: its parser (`add`) and what it does
(`run`). `ORDER` is the order `--help` lists them in; `BY_NAME` finds a command's run
(`ab` and `sweep` share one module)."""

from __future__ import annotations

from types import ModuleType

from . import (ab, activations, config, explain, export, fit, machine, memory, profile, repro,
               resume, run, runs, trust)
from .group import join, worker

ORDER: tuple[ModuleType, ...] = (config, run, resume, repro, ab, fit, export, machine, join,
                                 worker, profile, runs, memory, explain, activations, trust)
BY_NAME = {"config": config, "run": run, "resume": resume, "repro": repro, "ab": ab,
           "sweep": ab, "price-arm": ab, "export": export, "machine": machine, "join": join, "worker": worker,
           "profile": profile, "runs": runs, "memory": memory, "explain": explain,
           "activations": activations, "trust": trust, "fit": fit}
