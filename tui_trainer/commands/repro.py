"""`tui-trainer repro`: a determinism verdict on a config (or a run), or an exact-resume check."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .. import runner
from ..core.analysis import figures
from ..core.settings.config import ConfigError
from ..launcher.client import WarmLauncher
from ..core.errors import EXIT_NOT_IDENTICAL, EXIT_OK, BadInput
from ..core.session.store import SessionStore
from ..core.text import shown, shown_lines
from .common import config_args, fitted, session_dir, trust_named


def add(sub: Any) -> None:
    sp = sub.add_parser("repro", help="is this config reproducible? a determinism verdict",
                        description="Train a config N times (each in its own process) and "
                                    "say whether the runs are bit-identical; if not, where "
                                    "they part, how the divergence grows, and which settings "
                                    "can explain it. With --resume-at STEP, check exact resume "
                                    "instead: the config straight through against a run killed "
                                    "at STEP and resumed from its checkpoint. Exit status 0 "
                                    "when identical, 3 when not.")
    config_args(sp)
    sp.add_argument("--repeats", type=int, default=2, metavar="N",
                    help="how many runs to compare (default 2)")
    sp.add_argument("--resume-at", type=int, metavar="STEP",
                    help="check exact resume: kill a run at STEP and resume it")
    sp.add_argument("--run", type=int, metavar="RUN_ID",
                    help="check a run of the session instead of a config: train its twin "
                         "(or, with --resume-at, a twin killed at STEP and resumed) and "
                         "compare the two (how the dashboard's verdict actions work)")
    sp.add_argument("--session", metavar="DIR")
    sp.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    if args.run is not None and (args.config or args.sets):
        raise BadInput("--run checks a run of the session with its own config; it takes no "
                       "--config or --set")
    session = session_dir(args)
    SessionStore.check(session)
    if args.run is None:
        cfg, _ = fitted(args, quiet=args.json)       # bad input stops here, before training
        trust_named(cfg)                    # named here by the user: theirs to run
    if args.repeats < 2:
        raise ConfigError("--repeats", "must be 2 or more (there is nothing to compare)")
    if args.resume_at is not None and args.resume_at < 1:
        raise ConfigError("--resume-at", "must be a step >= 1")
    if args.resume_at is not None and args.run is None and cfg.max_steps \
            and args.resume_at >= cfg.max_steps:
        raise ConfigError("--resume-at", f"must be below max_steps ({cfg.max_steps})")
    say = (lambda m: None) if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    check = runner.Check(config=None if args.run is not None else cfg, run=args.run,
                         repeats=args.repeats, resume_at=args.resume_at)
    with SessionStore(session, create=args.run is None) as store:
        warm = WarmLauncher.shared()
        try:
            warm.wait_ready(timeout=120)
            result = runner.repro(store, check, say, warm)
        finally:
            warm.close()
    if args.json:
        print(json.dumps(result))
    else:
        _print_verdict(result)
    return EXIT_OK if result["identical"] else EXIT_NOT_IDENTICAL


def _print_verdict(r: dict[str, Any]) -> None:
    what = ("resumed run vs straight run" if r["mode"] == "resume"
            else f"{len(r['runs'])} runs of one config")
    print(f"{what}: runs {', '.join(map(str, r['runs']))}")
    for run_id, why in (r.get("not_learning") or {}).items():
        print(f"run {run_id} is {shown(why, 300)}")
    if r["identical"]:
        print(f"verdict: BIT-IDENTICAL at all {r['fingerprints_compared']} parameter "
              "fingerprints compared")
        return
    if r["fingerprints_compared"] == 0:
        print("verdict: NOT identical: no common fingerprint to compare")
    else:
        last = r["last_identical"]
        print(f"verdict: NOT identical: parameter hashes first differ at step "
              f"{r['first_difference']}" + (f" (identical at step {last})"
                                             if last is not None else ""))
    rows = r["growth"]
    if rows:
        print("how it grows:   step   |Δloss|   parameter distance")
        for row in rows[:: max(1, len(rows) // 10)]:
            print(f"            {row['step']:>7}   "
                  f"{figures.fmt(row['loss_delta'], 'train_loss')}   "    # a loss's digits
                  f"{figures.fmt(row['param_distance'], 'param_distance')}")
    print("settings that can explain it:")
    for reason in r["explanations"] or ["none of the known causes applies to these runs"]:
        print(f"  - {reason}")
    if r.get("explanation"):
        from ..core.analysis.explain import explanation_text
        print("where they part: " + shown_lines(explanation_text(r["explanation"])))
