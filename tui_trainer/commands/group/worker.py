"""`tui-trainer worker` (internal): one rank of a data-parallel run, started by torchrun."""

from __future__ import annotations

import argparse
from typing import Any

from ...core.settings import config
from ..common import say, session_dir


def add(sub: Any) -> None:
    sp = sub.add_parser("worker", help="one process of a data-parallel run (torchrun starts "
                        "it; not for direct use)")
    sp.add_argument("--session", metavar="DIR")
    sp.add_argument("--run-id", type=int)
    sp.add_argument("--checkpoint", metavar="PATH")
    sp.add_argument("--set", dest="sets", action="append", default=[])
    sp.add_argument("--events", default="[]")
    sp.add_argument("--kill-at-step", type=int)
    sp.add_argument("--dist-timeout", type=int, default=config.RunConfig().dist_timeout,
                    metavar="S")


def run(args: argparse.Namespace) -> int:
    from ...engine.rank import RankArgs, run_rank
    return run_rank(RankArgs(
        session=session_dir(args) if args.session else None, run_id=args.run_id,
        sets=args.sets, checkpoint=args.checkpoint, events=args.events,
        kill_at_step=args.kill_at_step, dist_timeout=args.dist_timeout), say=say)
