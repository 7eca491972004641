"""`tui-trainer run`: one run in the foreground (or one the dashboard created)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .. import lifecycle
from ..core.session.paths import default_session_dir
from .common import check_name, config_args, ended, fitted, session_dir, trust_named


def add(sub: Any) -> None:
    sp = sub.add_parser("run", help="train one run in the foreground",
                        description="Train one run in the foreground, recording everything in "
                                    "the session; a progress bar goes to stderr.")
    config_args(sp)
    sp.add_argument("--session", metavar="DIR", help="session directory (default: "
                    f"{default_session_dir()})")
    sp.add_argument("--name", help="a name for the run (default run-<id>)")
    sp.add_argument("--json", action="store_true",
                    help="end stdout with one JSON object describing the run")
    sp.add_argument("--kill-at-step", type=int, metavar="N",
                    help="simulate a crash: the process kills itself (SIGKILL) right after "
                         "step N, to try resuming")
    sp.add_argument("--run-id", type=int, metavar="ID",
                    help="train a run already created in the session, with its stored config "
                         "(how the dashboard starts runs)")
    sp.add_argument("--new", action="store_true", help="with --run-id: a run the dashboard "
                    "has just made, removed if refused before its first step (its log's "
                    "last line says why)")


def run(args: argparse.Namespace) -> int:
    session = session_dir(args)
    check_name(args.name)
    progress = sys.stderr.isatty()
    if args.run_id is not None:
        return ended(lifecycle.start_created(session, args.run_id, args.config, args.sets,
                                              args.kill_at_step, progress, args.new),
                     args.json)
    cfg, chosen = fitted(args)
    trust_named(cfg)                    # named here by the user: theirs to run
    return ended(lifecycle.start(session, cfg, args.name, args.kill_at_step, progress,
                                 chosen), args.json)
