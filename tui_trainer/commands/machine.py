"""`tui-trainer machine`: what this machine can run, and whether a config can train here."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..core.settings import config, machine
from ..core.errors import EXIT_BAD_INPUT, EXIT_OK
from .common import config_args, say


def add(sub: Any) -> None:
    sp = sub.add_parser("machine", help="what this machine can run (devices, torch), and "
                        "whether a config can train here",
                        description="Print what torch sees here (CUDA devices, Apple GPU, "
                                    "version). With --config/--set, also check that this "
                                    "machine can train that config (device, amp, dataset "
                                    "present): exit 2 naming the key when it cannot.")
    config_args(sp)
    sp.add_argument("--json", action="store_true", help="one JSON object")


def run(args: argparse.Namespace) -> int:
    cfg = config.load(args.config, args.sets) if args.config or args.sets else None
    from ..engine.knobs import machine_facts   # torch is imported here
    m = machine_facts()
    found = machine.problem(cfg.to_dict(), m) if cfg else None
    if args.json:
        print(json.dumps({**m.to_dict(), "problem": None if found is None else
                          {"key": found.key, "reason": found.reason}}))
    else:
        print(m.describe())
        if cfg is not None and found is None:
            print("this machine can train the config")
    if found is not None:
        if not args.json:
            say(f"bad config: {found}")
        return EXIT_BAD_INPUT
    return EXIT_OK
