"""`tui-trainer config`: the run config as TOML, every key documented."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..core.settings import config
from ..core.errors import EXIT_OK
from .common import config_args


def add(sub: Any) -> None:
    sp = sub.add_parser("config", help="print the run config (the defaults, documented)",
                        description="Print the complete run config as TOML, every key with "
                                    "what it does. With --config/--set, prints the result "
                                    "after checking it.")
    config_args(sp)
    sp.add_argument("--plain", action="store_true", help="without the comments")


def run(args: argparse.Namespace) -> int:
    cfg = config.load(args.config, args.sets)
    sys.stdout.write(cfg.to_toml(comments=not args.plain))
    return EXIT_OK
