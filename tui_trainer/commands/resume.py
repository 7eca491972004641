"""`tui-trainer resume`: a run continued from its newest checkpoint, bit for bit."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .. import lifecycle
from ..core.settings import config
from ..core.text import shown_lines
from .common import ended, session_dir


def add(sub: Any) -> None:
    sp = sub.add_parser("resume", help="continue a run from its newest checkpoint",
                        description="Continue a stopped, finished or crashed run from its "
                                    "newest checkpoint, bit-for-bit. Only the training length "
                                    f"({', '.join(config.TRAINING_LENGTH_KEYS)}) may change.")
    sp.add_argument("run_id", type=int, metavar="RUN_ID")
    sp.add_argument("--session", metavar="DIR")
    sp.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    sp.add_argument("--checkpoint", metavar="PATH",
                    help="resume from this checkpoint of the run instead of the newest")
    sp.add_argument("--restart", action="store_true",
                    help="when the run has no usable checkpoint, train it again from step 0 "
                         "(its recorded rows are replaced as it goes)")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--kill-at-step", type=int, metavar="N", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    return ended(lifecycle.resume(
        session_dir(args), args.run_id, args.sets, checkpoint=args.checkpoint,
        restart=args.restart, kill_at_step=args.kill_at_step, progress=sys.stderr.isatty(),
        say=lambda message: print(f"tui-trainer: {shown_lines(message)}", file=sys.stderr)),
        args.json)
