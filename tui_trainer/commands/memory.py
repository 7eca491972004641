"""`tui-trainer memory`: where a run's memory goes, one step of a copy of it."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .. import runner
from ..core.errors import EXIT_OK
from .common import json_safe, open_to_answer


def add(sub: Any) -> None:
    sp = sub.add_parser("memory", help="where a run's memory goes: one step of a copy of it "
                                       "by category and module",
                        description="Trains one step of a copy of run RUN (from its newest "
                                    "checkpoint, after one step of warm-up; the run itself is "
                                    "not touched) under torch's MemTracker, and says the memory "
                                    "at the step's peak by category (parameters, gradients, "
                                    "optimizer state, activations kept for backward, "
                                    "temporaries) and each module's own peak. The answer is "
                                    "kept in the session, where the dashboard shows it.")
    sp.add_argument("run", type=int, metavar="RUN", help="a run id")
    sp.add_argument("--session", metavar="DIR")
    sp.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from ..core.analysis import memory
    store, record = open_to_answer(args)
    with store:
        run = store.run(args.run)
        result = runner.memory(store, run, keep=record)
        if record:
            memory.record(store, run["id"], result)
    if args.json:
        print(json.dumps(json_safe(result)))
    else:
        print("\n".join(memory.lines(result)))
    return EXIT_OK
