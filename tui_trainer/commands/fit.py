"""`tui-trainer fit`: the fastest config for this machine, with proof (tui_trainer/fitting.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from .. import fitting
from ..core.errors import EXIT_FAILED, EXIT_OK
from ..core.session.store import SessionStore
from ..core.settings import fit as fit_rules
from ..core.settings import hardware, presets
from ..core.settings.config import ConfigError
from ..core.text import name_problem, shown
from .common import config_args, json_safe, session_dir, trust_named


STEPS = 30        # a knob's study: its runs' steps (8 rounds or more of two runs each)


def add(sub: Any) -> None:
    sp = sub.add_parser("fit", help="the fastest config for this machine, with proof",
                        description="Price the speed knobs one by one on top of each other "
                                    "(each a study that decides: faster, slower, the same "
                                    "within ±5%, or unknown), take each value measured "
                                    "faster, then prove the result: the start config and "
                                    "the fitted one trained to their end with several seeds, "
                                    "their accuracy compared against the seeds' spread and "
                                    "their time to 98% measured. Writes your preset "
                                    "(--name, default fastest-here) naming each choice with "
                                    "its price here and what it does to the bits.")
    config_args(sp)
    sp.add_argument("--knobs", action="append", default=[], metavar="KEY[=V1,V2]",
                    help="a speed knob to price (repeatable; default: amp, channels_last "
                         "and num_threads on the CPU; amp, channels_last, cudnn_benchmark "
                         "and cuda_graph on CUDA), with the values to try")
    sp.add_argument("--steps", type=int, metavar="N", default=STEPS,
                    help=f"steps of every run of a knob's study (default {STEPS}; its runs "
                         "log every steps/6)")
    sp.add_argument("--seeds", type=int, metavar="N", default=fitting.SEEDS,
                    help=f"seeds of each proof (default {fitting.SEEDS})")
    sp.add_argument("--name", default="fastest-here", help="the preset written (yours)")
    sp.add_argument("--session", metavar="DIR")
    sp.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    if (problem := name_problem(args.name)) or "/" in args.name:
        raise ConfigError("--name", f"the preset's name {problem or 'must be a name, not a path'}")
    if not 1 <= args.steps <= 100000:
        raise ConfigError("--steps", f"must be 1 to 100000, got {args.steps}")
    if not 2 <= args.seeds <= 10:
        raise ConfigError("--seeds", f"must be 2 to 10 (a spread needs two), got {args.seeds}")
    from ..engine.knobs import machine_facts       # torch: the machine, as a run sees it
    m = machine_facts()
    start = args.config or ("fastest-gpu" if m.cuda else "fastest-cpu")
    base, chosen = fit_rules.load_fitted(start, args.sets, machine=m)
    trust_named(base)
    knobs, left_out = fitting.plan_knobs(base, args.knobs, "cuda" if m.cuda and
                                         base.device != "cpu" else "cpu", m)
    fitting._steps_of(base)                  # a proof it cannot train is refused here
    session = session_dir(args)
    SessionStore.check(session)
    say = (lambda x: None) if args.json else (lambda x: print(x, file=sys.stderr, flush=True))
    for c in chosen:
        say(f"fit: from {start}: {c.line()}")
    for line in left_out:
        say(f"fit: {line}")
    fitted, steps_done, proofs, spent = fitting.fit(session, base, knobs, args.steps,
                                                    args.seeds, say)
    ok, accuracy = fitting.same_accuracy(*proofs)
    words = hardware.this_cpu().describe() if not m.cuda else m.describe()
    path = None
    if ok:
        path = presets.save(args.name, fitting.preset_text(fitted, steps_done, words, start))
    total = time.monotonic() - started
    loaded = [s.knob for s in steps_done if s.loaded]
    if args.json:
        print(json.dumps(json_safe({
            "start": start, "machine": words, "preset": str(path) if path else None,
            "config": fitted.to_dict(), "same_accuracy": ok, "accuracy": accuracy,
            "left_out": left_out,
            "knobs": [{"knob": s.knob, "tried": s.tried, "taken": s.taken, "study": s.study,
                       "decisions": s.words, "bits": s.bits, "loaded": s.loaded,
                       "skipped": s.skipped, "seconds": s.seconds} for s in steps_done],
            "proofs": [{"label": p.label, "runs": p.runs, "accuracy": p.accuracy,
                        "seconds_to_target": p.seconds_to_target} for p in proofs],
            "seconds": total, "spent": spent, "loaded": loaded})))
    else:
        print(f"fit on {words}, from {start}:")
        for s in steps_done:
            print(f"  {s.knob} = {shown(s.taken, 40)}" + (
                f": not priced ({s.skipped})" if s.skipped else
                f" ({f'study {s.study}' if s.study is not None else 'windows'}, "
                f"{s.seconds:.0f} s): " + "; ".join(s.words)
                + (f"; taken, {s.bits}" if s.bits else "; kept")))
        for p in proofs:
            print(f"  {p.text()}")
        print(f"  accuracy: {accuracy}")
        print(f"  {total:.0f} s in all: " + ", ".join(f"{k} {v:.0f} s" for k, v in spent.items())
              + (f"; measured under load: {', '.join(loaded)} (their prices are not this "
                 "machine's alone)" if loaded else ""))
        print(f"preset written: {path} (tui-trainer run --config {args.name})" if path else
              "no preset written: the fitted config's accuracy is not the start's")
    return EXIT_OK if ok else EXIT_FAILED
