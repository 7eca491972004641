"""`tui-trainer machine`: what this machine can run, whether a config can train here, and
which GPUs the runs of the session hold (core.processes.gpus)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..core.analysis import prices
from ..core.settings import fit, machine
from ..core.errors import EXIT_BAD_INPUT, EXIT_OK, SessionError
from ..core.processes import gpus
from ..core.processes.liveness import is_live, starting
from ..core.session.schema import DB_NAME
from ..core.session.store import SessionStore
from ..core.text import shown
from .common import config_args, say, session_dir


def add(sub: Any) -> None:
    sp = sub.add_parser("machine", help="what this machine can run (devices, torch), and "
                        "whether a config can train here",
                        description="Print what torch sees here (CUDA devices, Apple GPU, "
                                    "version). With --config/--set, also check that this "
                                    "machine can train that config (device, amp, dataset "
                                    "present): exit 2 naming the key when it cannot. "
                                    "Where there are GPUs, which ones the live runs of the "
                                    "session (--session) hold.")
    config_args(sp)
    sp.add_argument("--json", action="store_true", help="one JSON object")


def run(args: argparse.Namespace) -> int:
    from ..engine.knobs import machine_facts   # torch is imported here
    m = machine_facts()
    # (a preset's per-machine knobs chosen for this machine, as `run` would: said)
    cfg, chosen = fit.load_fitted(args.config, args.sets, machine=m) \
        if args.config or args.sets else (None, [])
    for c in chosen:
        if not args.json:
            print(f"fit to this machine: {c.line()}")
    found = machine.problem(cfg.to_dict(), m) if cfg else None
    here = gpus.gpu_list(m.cuda_devices)
    held, runs, why = _held(args) if here else ({}, {}, None)
    measured = _prices(m)
    if args.json:
        print(json.dumps({**m.to_dict(), "problem": None if found is None else
                          {"key": found.key, "reason": found.reason},
                          "gpus": {str(g): held.get(g, []) for g in here},
                          "prices": {device: [p.to_dict() for p in ps]
                                     for device, ps in measured.items()}}))
    else:
        print(m.describe())
        for device, ps in measured.items():
            print(f"prices measured here ({device}), newest first:" if ps else
                  f"no price measured here ({device}) yet: `tui-trainer ab --vary KEY=VALUE` "
                  "measures one, and it is kept")
            for p in ps[:20]:
                print(f"  {p.line()}")
        for g in here:
            who = ", ".join(f"run {r} ({shown(runs[r], 40)})" for r in held.get(g, [])) \
                or "free"
            print(f"GPU {g}: {who}")
        if why:
            print(why)
        if cfg is not None and found is None:
            print("this machine can train the config")
    if found is not None:
        if not args.json:
            say(f"bad config: {found}")
        return EXIT_BAD_INPUT
    return EXIT_OK


def _prices(m: machine.Machine) -> dict[str, list[prices.Price]]:
    """The knobs' prices measured on this machine, quietly (core.analysis.prices), for its
    CPU and each kind of its GPUs; those under load or of other machines are not its."""
    book = prices.read()
    devices = ["cpu"] + [f"cuda:{i}" for i, name in enumerate(m.cuda_names)
                         if name not in m.cuda_names[:i]]
    out = {}
    for device in devices:
        key = prices.machine_of(m, device)
        out[device] = prices.here(book, key[0] if key else None)
    return out


def _held(args: argparse.Namespace) -> tuple[dict[int, list[int]], dict[int, str], str | None]:
    """Which GPUs the live runs of the session hold ({gpu: runs}), the runs' names, and why
    the session was not read (None: it was, or there is none yet: nothing is created)."""
    folder = session_dir(args)
    if not (folder / DB_NAME).is_file():
        return {}, {}, None
    try:
        with SessionStore(folder, create=False, readonly=True) as store:
            runs = store.runs()
    except SessionError as e:
        return {}, {}, f"the session's GPUs not read: {shown(e, 200)}"
    held = gpus.held_by(runs, lambda r: is_live(r) or starting(r))
    return held, {r["id"]: r["name"] for r in runs}, None
