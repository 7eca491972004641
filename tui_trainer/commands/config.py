"""`tui-trainer config`: the run config as TOML, every key documented."""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import Any

from ..core.analysis import prices
from ..core.settings import config, fit, machine
from ..core.settings.toml_text import to_toml, toml_value
from ..core.errors import EXIT_OK
from .common import config_args, say, terminal_width


def add(sub: Any) -> None:
    sp = sub.add_parser("config", help="print the run config (the defaults, documented)",
                        description="Print the complete run config as TOML, every key with "
                                    "what it does. With --config/--set, prints the result "
                                    "after checking it.")
    config_args(sp)
    sp.add_argument("key", nargs="?", metavar="KEY",
                    help="one knob: what it does, what it takes, its default, what a "
                         "preset chose for it here, and its prices measured on this machine")
    sp.add_argument("--plain", action="store_true", help="without the comments")


def run(args: argparse.Namespace) -> int:
    if args.key is None:
        cfg, chosen = fit.load_fitted(args.config, args.sets)
        for c in chosen:
            say(f"fit to this machine: {c.line()}")
        sys.stdout.write(to_toml(cfg, comments=not args.plain))
        return EXIT_OK
    if args.key not in config.FIELDS:
        raise config.unknown_key(args.key)
    key = args.key
    cfg, chosen = fit.load_fitted(args.config, args.sets)
    value = getattr(cfg, key)
    print(f"{key} = {toml_value(value)}    # {config.allowed(key)}; default "
          f"{toml_value(getattr(config.DEFAULTS, key))}")
    print(textwrap.fill(config.doc(key), terminal_width() or 100))
    for c in chosen:
        if c.key == key:
            print(f"fit to this machine: {c.line()}")
    m = machine.here(str(cfg.device))
    try:
        device = machine.device_type(str(cfg.device), m) if m is not None else "cpu"
    except machine.Problem:
        device = "cpu"          # (a device this machine lacks: its CPU's prices)
    here = prices.machine_of(m, device)
    if m is not None and (lacking := fit.lacking(key, value, device, m)):
        print(f"on this machine: {lacking}")
    measured = prices.here(prices.read(), here[0] if here else None, key)
    if here is not None:
        print(f"prices of {key} measured on this machine ({here[1]}; {device}):"
              if measured else f"no price of {key} measured on this machine ({here[1]}; "
              f"{device}) yet: `tui-trainer ab --vary {key}=VALUE` measures one")
    for p in measured[:10]:
        print(f"  {p.line()}")
    return EXIT_OK
