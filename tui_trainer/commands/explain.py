"""`tui-trainer explain`: where two runs part, and why."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .. import runner
from ..core.errors import EXIT_NOT_IDENTICAL, EXIT_OK
from ..core.text import shown_lines
from .common import json_safe, open_to_answer


def add(sub: Any) -> None:
    sp = sub.add_parser("explain", help="where two runs part, and why: the exact step, the "
                                        "first operation, the setting",
                        description="Replays runs A and B from their checkpoints to the first "
                                    "step whose result differs, compares what went into it "
                                    "(parameters, optimizer state, RNG states, the batch) and, "
                                    "when that agrees, traces the step op by op to name the "
                                    "first op whose output differs and the setting it "
                                    "follows. The answer is kept in the session (on run B), "
                                    "where the dashboard's Divergence tab and exports show it. "
                                    "Exit status 0 when the runs are identical, 3 when they "
                                    "part.")
    sp.add_argument("a", type=int, metavar="A", help="a run id")
    sp.add_argument("b", type=int, metavar="B", help="another run id")
    sp.add_argument("--session", metavar="DIR")
    sp.add_argument("--evidence", action="store_true",
                    help="after the answer, what it rests on, one fact a line")
    sp.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from ..core.analysis.explain import evidence_lines, explanation_text
    store, record = open_to_answer(args)
    with store:
        result = runner.explain(store, args.a, args.b, record=record)
    if args.json:
        print(json.dumps(json_safe(result)))
    else:
        print(shown_lines(explanation_text(result)))
        if args.evidence:
            print("\n".join(f"  {shown_lines(line)}" for line in evidence_lines(result)))
    return EXIT_OK if result["verdict"] == "identical" else EXIT_NOT_IDENTICAL
