"""`tui-trainer profile`: where a run's step time goes, operator by operator."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .. import runner
from ..core.settings.config import ConfigError
from ..core.errors import EXIT_OK
from .common import json_safe, open_to_answer


def add(sub: Any) -> None:
    sp = sub.add_parser("profile", help="where a run's step time goes, operator by operator: "
                                        "K steps of a copy of it under torch.profiler",
                        description="Trains K steps of a copy of run RUN (from its newest "
                                    "checkpoint, after --warmup steps; the run itself is not "
                                    "touched) under torch.profiler (CPU, and CUDA where the "
                                    "run trains there; shapes and memory recorded) and says: "
                                    "the time per step by phase, the operators by self time "
                                    "(calls, share), each module's forward time, the memory "
                                    "peak by category, and where the Chrome/Perfetto trace "
                                    "is (beside the run's log). With a second run RUN_B, "
                                    "profiles both and says which operators changed their "
                                    "self time. Kept in the session: the dashboard's Profile "
                                    "tab shows it and exports carry the trace.")
    sp.add_argument("run", type=int, metavar="RUN", help="a run id")
    sp.add_argument("run_b", type=int, metavar="RUN_B", nargs="?",
                    help="a second run: profile both and diff them by operator")
    sp.add_argument("--steps", type=int, default=10, metavar="K",
                    help="steps profiled (default 10)")
    sp.add_argument("--warmup", type=int, default=3, metavar="W",
                    help="steps trained first, not profiled (default 3)")
    sp.add_argument("--session", metavar="DIR")
    sp.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from ..core.analysis import profiling
    for flag, value, lo, hi in (("--steps", args.steps, 1, 1000), ("--warmup", args.warmup, 0,
                                                                     1000)):
        if not lo <= value <= hi:
            raise ConfigError(flag, f"must be {lo} to {hi} steps, got {value}")
    store, keep = open_to_answer(args)
    with store:
        runs = [store.run(r) for r in ([args.run] if args.run_b is None
                                       else [args.run, args.run_b])]
        results = []
        for run in runs:
            result = runner.profile(store, run, args.steps, args.warmup, keep=keep)
            if keep:
                profiling.record(store, run["id"], result)
            results.append(result)
        session = store.dir
    if args.json:
        out: dict[str, Any] = {"profiles": results}
        if len(results) == 2:
            out["diff"] = profiling.diff(*results)
        print(json.dumps(json_safe(out)))
        return EXIT_OK
    for run, result in zip(runs, results, strict=True):
        print("\n".join(profiling.lines(result, run["id"], session)))
        if not keep:
            print("(a read-only session: the profile and its trace are not kept)")
    if len(results) == 2:
        print("\n".join(profiling.diff_lines(*results, ids=(runs[0]["id"], runs[1]["id"]))))
    return EXIT_OK
