"""`tui-trainer ab` and `tui-trainer sweep`: a study (each knob's price, or seed noise), trained and tabled."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Iterable

from .. import pricing, runner
from ..core.settings import config, machine
from ..core.analysis import figures, sequential, stats, study, study_text
from ..core.settings.config import ConfigError
from ..core.errors import EXIT_FAILED, EXIT_OK, EXIT_STOPPED, BadInput
from ..core.session.store import SessionStore
from ..core.text import shown
from .common import (DEFAULT_AB_STEPS, check_name, config_args, json_safe, session_dir,
                     study_args, terminal_width, trust_named, trusted_only)


# A deciding study's steps a run unless given: its samples/s is the median of the logged
# intervals after the first (core.analysis.figures), five of them at the default log_every,
# and rounds are what it needs many of
DECIDE_STEPS = 60
# What a price in windows does not take: the flags of a study of whole runs
WHOLE_RUN_FLAGS = (("steps", "--steps"), ("level", "--level"), ("jobs", "--jobs"),
                   ("rerun_loaded", "--rerun-loaded"), ("quiet_wait", "--quiet-wait"),
                   ("max_time", "--max-time"))


def add(sub: Any) -> None:
    sp = sub.add_parser("ab", help="the price of each knob: an A/B study",
                        description="Train the base config and one variant per value of "
                                    "each --vary key, for the same steps, and show a table: "
                                    "samples/s, time waiting for data, peak memory, final "
                                    "loss and accuracy, each also as a ratio to the base, and "
                                    "whether each variant is bit-identical to the base. With "
                                    "--repeats N (default "
                                    f"{study.DEFAULT_REPEATS}) every arm trains N "
                                    "times, interleaved, round r with seed + r, and every "
                                    "ratio comes with a confidence interval and a verdict: "
                                    "faster, slower or within noise (within seed noise for "
                                    "accuracy and loss). A study file (experiments/ab/) holds "
                                    "a base config and an [ab] table with its vary list and "
                                    "steps. With --decide, each variant's speed is priced "
                                    "in seconds instead, until it is decided: faster, "
                                    "slower or the same.")
    config_args(sp)
    sp.add_argument("--vary", action="append", default=[], metavar="KEY=V1,V2",
                    help="a key and the values to try, one variant each (repeatable)")
    sp.add_argument("--repeats", type=int, metavar="N", default=None,
                    help="rounds: how many times each arm trains (default: the study "
                         f"file's, else {study.DEFAULT_REPEATS}; an interval and a "
                         "verdict need 6 or more at the 95%% level (5 at 90%%); fewer show the "
                         "ratios only)")
    sp.add_argument("--until-sure", type=float, metavar="WIDTH", default=None,
                    help="add rounds until every variant's samples/s interval is at most "
                         "WIDTH wide (high/low - 1: 0.05 is 5%%), or a bound is reached "
                         f"(--max-rounds, default {study.DEFAULT_MAX_ROUNDS}; --max-time); "
                         "the study says which ended it")
    sp.add_argument("--decide", type=float, nargs="?", const=sequential.DEFAULT_MARGIN,
                    default=None, metavar="MARGIN",
                    help="price each variant until it is decided: faster, slower, or the "
                         "same within ±MARGIN (default "
                         f"{sequential.DEFAULT_MARGIN:.2f}), with the error rate corrected "
                         "for every look, or unknown at the cap (--max-rounds). Seconds, "
                         "not minutes: the arms train in processes of their own (two new "
                         "ones a pair), taking turns in short slices of steady-state steps "
                         "(ABBA ABBA ...), looking at "
                         f"{', '.join(map(str, pricing.LOOKS))} window pairs (the cap, "
                         "8 to 200); each arm's start-up is measured and given beside the "
                         "price (tui_trainer/pricing.py). Knobs paid at start-up or outside "
                         "training steps (compile, cuda_graph, cudnn_benchmark on CUDA, "
                         "bookkeeping, evaluation) or that change how many cores a run "
                         "keeps busy (num_threads, num_workers) are priced with what they "
                         "cost, as whole runs, after the others' windows, said in a line")
    sp.add_argument("--whole-runs", action="store_true",
                    help="with --decide: decide over rounds of whole runs instead (every "
                         "arm trained --steps steps a round, start-up and all, with the "
                         "full table: memory, loss, accuracy, bit-identity), looking at "
                         f"{', '.join(map(str, sequential.LOOKS))} rounds (the cap, "
                         f"default {sequential.LOOKS[-1]}); minutes, not seconds")
    sp.add_argument("--windows", action="store_true", help=argparse.SUPPRESS)
    sp.add_argument("--max-rounds", type=int, metavar="N", default=None,
                    help="--until-sure's bound on rounds, or --decide's cap: window "
                         f"pairs, {pricing.LOOKS[0]} to 200 (default {pricing.LOOKS[-1]}); "
                         f"with --whole-runs rounds, {sequential.LOOKS[0]} to "
                         f"{study.MAX_ROUNDS} (default {sequential.LOOKS[-1]})")
    sp.add_argument("--max-time", type=float, metavar="S", default=None,
                    help="--until-sure's bound on seconds (the round under way finishes)")
    sp.add_argument("--rerun-loaded", type=int, metavar="N", default=None,
                    help="rounds that shared the CPU with another process (recorded around "
                         "every run: other processes' CPU, steal, load, frequency) are "
                         "trained again once the machine has more room than when they "
                         "were measured, at most N times in all (default: as many as "
                         "rounds; 0: never, the verdicts say how many rounds were under "
                         "load)")
    sp.add_argument("--quiet-wait", type=float, metavar="S", default=None,
                    help="how long to wait for more room before a re-run (default "
                         f"{study.QUIET_WAIT_S:.0f} s, and at most one round's time so "
                         "far; a wait that finds none keeps that round and the later "
                         "loaded ones as measured, marked)")
    sp.add_argument("--plan", action="store_true",
                    help="say what the study would train (its arms, what each changes, the "
                         "runs in all) and which arms this machine cannot run, and train "
                         "nothing (no session is written)")
    study_args(sp)

    # one arm of a windowed price (tui_trainer/pricing.py); not listed
    sp = sub.add_parser("price-arm")
    sp.add_argument("--config-json", required=True)

    sp = sub.add_parser("sweep", help="seed noise: one config trained with N seeds",
                        description="Train one config N times, seed, seed+1, ..., and show "
                                    "each figure's mean and spread over the seeds (the noise "
                                    "any knob's effect on accuracy has to beat). The dashboard "
                                    "draws the runs as a mean line with a min-max band, and "
                                    "its Divergence tab shows how the spread grows over "
                                    "steps.")
    config_args(sp)
    sp.add_argument("--seeds", type=int, metavar="N", default=None,
                    help=f"how many seeds (default {study.DEFAULT_SEEDS}); with --decide, "
                         f"the most (default {sequential.SEED_LOOKS[-1]})")
    sp.add_argument("--decide", type=float, nargs="?", const=sequential.DEFAULT_SPREAD * 100,
                    default=None, metavar="POINTS",
                    help="add seeds until the seed noise is decided: the sd of the seeds' "
                         "accuracy under POINTS (default "
                         f"{sequential.DEFAULT_SPREAD * 100:g}), over it, or unknown at the "
                         "most seeds, looking at "
                         f"{', '.join(map(str, sequential.SEED_LOOKS))} seeds with the error "
                         "rate corrected for the looks, as `ab --decide` does")
    study_args(sp)


def _print_plan(planned: study.Planned, as_json: bool) -> int:
    """`ab --plan`: the arms of a planned study, what each changes against the base, and
    why this machine cannot run one, where it cannot (nothing trained, nothing written)."""
    arms: dict[str, dict[str, Any]] = {}
    base = next(r["config"] for r in planned.runs if r["label"] == "base")
    for r in planned.runs:
        if r["label"] in arms:
            continue
        changes = {k: v for k, v in r["config"].items() if v != base.get(k) and k != "seed"}
        arms[r["label"]] = {"label": r["label"], "changes": changes,
                            "not_possible": runner.device_refusal(r["config"])}
    plan = {"name": planned.name, "steps": planned.spec["steps"],
            "repeats": planned.spec.get("repeats", 1), "runs": len(planned.runs),
            "arms": list(arms.values()), "notes": planned.notes}
    if as_json:
        print(json.dumps(json_safe(plan)))
        return 0
    print(f"A/B study {shown(planned.name, 60)} (plan): {len(arms)} arms x "
          f"{plan['repeats']} rounds of {plan['steps']} steps = {plan['runs']} runs")
    _print_arms(arms.values())
    for note in planned.notes:
        print(f"note: {shown(note, 300)}")
    return 0


def _print_arms(arms: Iterable[dict[str, Any]]) -> None:
    """A plan's arms, a line each: its label, what it changes, why this machine cannot."""
    for arm in arms:
        what = ", ".join(f"{k} = {v}" for k, v in arm["changes"].items()) or "-"
        why = f"  NOT POSSIBLE HERE: {arm['not_possible']}" if arm["not_possible"] else ""
        print(f"  {shown(arm['label'], 60):<52} {shown(what, 80)}{shown(why, 200)}")


def run(args: argparse.Namespace) -> int:
    """`ab` and `sweep`: plan a study (or take one planned), train it, print its table."""
    if args.command == "price-arm":
        from ..engine.probes.price import serve
        return serve(config.from_dict(json.loads(args.config_json)))
    if args.then:
        if args.study is None:
            raise BadInput("--then runs a planned study after the one of --study; give "
                           "--study ID")
        code = EXIT_OK
        for study_id in [args.study, *args.then]:     # one after the other, never side by side
            code = run(argparse.Namespace(**{**vars(args), "study": study_id, "then": None}))
            if code != EXIT_OK:
                break                   # (stopped or failed: the next is left as planned)
        return code
    if args.command == "ab":
        if args.windows and args.decide is None:
            raise BadInput("--windows: a price in windows decides; give --decide [MARGIN]")
        if args.whole_runs and args.decide is None:
            raise BadInput("--whole-runs decides over rounds of whole runs; give --decide "
                           "[MARGIN] with it")
        if args.whole_runs and args.windows:
            raise BadInput("--whole-runs and --windows: a price is decided one way; give one")
        if args.decide is not None and args.until_sure is not None:
            raise ConfigError("--decide", "decides when to stop by itself; give it or "
                              "--until-sure, not both")
        if args.decide is not None and args.repeats is not None:
            raise ConfigError("--repeats", "--decide chooses how many it needs by itself; "
                              "give --max-rounds for its cap instead")
        if args.decide is not None and not args.whole_runs:
            return windows(args)
    session = session_dir(args)
    check_name(args.name)
    SessionStore.check(session)
    say = (lambda m: None) if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    sweep = args.command == "sweep"
    if args.jobs is not None and not 1 <= args.jobs <= study.MAX_JOBS:
        raise ConfigError("--jobs", f"must be 1 to {study.MAX_JOBS} (the cores of this machine), "
                          f"got {args.jobs}")
    if args.study is not None:
        if (not sweep and (args.vary or args.repeats or args.until_sure is not None
                           or args.decide is not None
                           or args.max_rounds is not None or args.max_time is not None
                           or args.rerun_loaded is not None or args.quiet_wait is not None
                           or args.plan)) \
                or (sweep and (args.seeds is not None or args.decide is not None)) \
                or args.config or args.sets or args.steps or args.level:
            raise BadInput("--study runs a study as planned; it takes no --vary, --repeats, "
                           "--until-sure, --max-rounds, --max-time, --rerun-loaded, --plan, "
                           "--seeds, --decide, --config, --set, --steps or --level")
        with SessionStore(session, create=False) as store:
            record = store.study(args.study)
            study_id = record["id"]
        # a study from the session: its nets of the user's own files were named by the
        # session, and run only where this user trusts them (one line, nothing started)
        trusted_only(*(v["config"] for v in record["variants"]))
    else:
        if sweep:
            file_values = config.read_toml(args.config) if args.config else {}
            spec: dict[str, Any] = {}
            vary, repeats = [], study.DEFAULT_SEEDS if args.seeds is None else args.seeds
        else:
            file_values, spec = ({}, {}) if not args.config else study.read_study_file(args.config)
            vary = _only(study.parse_vary(list(spec.get("vary", [])) + args.vary), args)
            repeats = args.repeats if args.repeats is not None else \
                spec.get("repeats") or study.DEFAULT_REPEATS
        values = {**file_values, **config.parse_overrides(args.sets)}
        base = config.from_dict({**config.DEFAULTS.to_dict(), **values})
        name = args.name or spec.get("name") or \
            (Path(args.config).stem if args.config else args.command)
        check_name(name, "ab.name")
        steps = args.steps if args.steps is not None else \
            spec.get("steps") or (DECIDE_STEPS if not sweep and args.decide is not None
                                  else DEFAULT_AB_STEPS)
        more = {"spread": None if args.decide is None else args.decide / 100,
                "max_rounds": args.seeds if args.decide is not None else None} if sweep else {
            "rerun_loaded": args.rerun_loaded, "until_sure": args.until_sure,
            "max_rounds": args.max_rounds, "max_time_s": args.max_time,
            "quiet_wait_s": args.quiet_wait, "decide": args.decide}
        planned = study.prepare(base, vary, steps, repeats=repeats, name=name, level=args.level,
                                jobs=args.jobs if args.jobs is not None else 1,
                                file=args.config, **more)
        if getattr(args, "plan", False):
            return _print_plan(planned, args.json)
        trust_named(*(r["config"] for r in planned.runs))   # named here by the user
        for note in planned.notes:
            say(f"{args.command}: {note}")
        with SessionStore(session) as store:
            study_id = store.create_study(planned.kind, name, planned.spec, planned.runs)
    status = runner.run_study(session, study_id, say, jobs=args.jobs)
    with SessionStore(session, create=False) as store:
        if store.study(study_id)["kind"] == "price":     # (started from the A/B tab)
            return print_price(store.study(study_id), status, args.json)
        record, rows = study.table(store, study_id)
    if args.json:
        print(json.dumps(json_safe(
            {"study_id": study_id, "kind": record["kind"], "name": record["name"],
             "status": status, "steps": record["spec"]["steps"],
             "repeats": record["spec"].get("repeats", 1),
             "level": record["spec"].get("level", stats.DEFAULT_LEVEL),
             "jobs": record["spec"].get("jobs", 1), "vary": record["spec"]["vary"],
             "notes": record["spec"].get("notes", []),
             "reruns": record["spec"].get("reruns", []),
             "waits": record["spec"].get("waits", []),
             "until_sure": record["spec"].get("until_sure"),
             "decide": record["spec"].get("decide"),
             "ended_by": record["spec"].get("ended_by"),
             "rows": [r.to_dict() for r in rows]})))
    else:
        width = terminal_width()

        def para(text: str) -> str:      # prose wraps at words, tables are fitted
            import textwrap
            return textwrap.fill(text, width, break_on_hyphens=False) if width else text

        print(para(study_text.title_text(record, rows, status)))
        print("\n".join(line if i <= len(rows) else para(line) for i, line in
                        enumerate(study_text.format_table(rows, sweep=record["kind"] == "sweep",
                                                  width=width))))
        print(para(figures.EXPLAINED + " data wait: total time the loop waited for batches. "
                   + study_text.method_text(record, rows)))
        for line in study_text.phase_lines(rows) + study_text.rerun_lines(record):
            print(para(shown(line, 2000)))
        for note in record["spec"].get("notes", []):
            print(para(f"note: {shown(note, 1000)}"))
    failed = any(r.status == "crashed" for r in rows)
    if failed or status == "crashed":
        return EXIT_FAILED
    return EXIT_STOPPED if status == "stopped" else EXIT_OK


def windows(args: argparse.Namespace) -> int:
    """`ab --decide`: a study of kind "price" (tui_trainer/pricing.py): each variant against
    the base taking turns in short slices (two new processes a pair), kept in the session
    (the A/B tab shows it) and as this machine's price. Knobs paid at start-up or outside the
    steps go to the rounds of whole runs (`--decide --whole-runs`), said in a line."""
    if args.study is not None:
        raise BadInput("--study runs a study as planned there; it takes no --decide")
    study.check_margin(args.decide)
    session = session_dir(args)
    check_name(args.name)
    SessionStore.check(session)
    file_values, spec = ({}, {}) if not args.config else study.read_study_file(args.config)
    vary = study.parse_vary(list(spec.get("vary", [])) + args.vary)
    base = config.from_dict({**config.DEFAULTS.to_dict(), **file_values,
                             **config.parse_overrides(args.sets)})
    # (cuDNN's benchmark is a start-up only on CUDA: where the arms train is asked of the
    # machine, a child process, only for such a knob on a device that may be CUDA)
    on = pricing.trains_on(base, vary, lambda: machine.here(str(base.device)))
    vary = _only(vary, args)
    windowed, whole, why = pricing.sort_out(base, vary, on)
    if why and windowed:
        return _split(args, [k for k, _ in windowed], [k for k, _ in whole], why)
    if why:
        # priced with what it costs, as the A/B tab's "Decide a price" does: whole runs
        # deciding when to stop, the windows' cap left aside
        if not args.json:
            print(f"ab: {'; '.join(why)} (--decide over rounds of whole "
                  "runs, as with --whole-runs" + ("; --max-rounds counted window pairs: the "
                                                  "rounds' own cap applies"
                                                  if args.max_rounds is not None else "")
                  + ")", file=sys.stderr, flush=True)
        args.windows, args.whole_runs, args.max_rounds = False, True, None
        return run(args)
    given = [flag for attr, flag in WHOLE_RUN_FLAGS if getattr(args, attr) is not None]
    if given:
        raise BadInput(f"{', '.join(given)}: --decide prices in windows of steady-state "
                       "steps until the price is decided, so it takes no "
                       f"{' or '.join(given)}; --decide --whole-runs decides over rounds of "
                       "whole runs (--steps steps each)")
    if args.max_rounds is not None and not pricing.LOOKS[0] <= args.max_rounds <= 200:
        raise ConfigError("--max-rounds", f"with --decide: the window pairs' cap, "
                          f"{pricing.LOOKS[0]} to 200, got {args.max_rounds}")
    arms = pricing.plan(base, vary, on)
    if args.plan:           # what it would price, and how; nothing trained or written
        cap = args.max_rounds or pricing.LOOKS[-1]
        plan = {"name": args.name, "windows": True, "cap": cap, "arms": [
            {"label": a["label"], "changes": study.changes(a["key"], a["value"])
             if "key" in a else {},
             "not_possible": runner.device_refusal(a["config"])} for a in arms]}
        if args.json:
            print(json.dumps(json_safe(plan)))
            return 0
        print(f"price (plan): {len(arms) - 1} variant(s), each against the base in two "
              f"processes taking turns, about {pricing.WINDOW_S} s of each a pair in short "
              f"slices (ABBA ...), until the window pairs decide (at most {cap})")
        _print_arms(plan["arms"])
        return 0
    trust_named(*(a["config"] for a in arms))
    say = (lambda m: None) if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    name = args.name or spec.get("name") or "+".join(k for k, _ in vary)
    with SessionStore(session) as store:
        study_id = store.create_study("price", name, {
            "windows": True, "decide": args.decide, "cap": args.max_rounds,
            "vary": [[k, v] for k, v in vary], "steps": 0}, arms)
    status = runner.run_study(session, study_id, say)
    with SessionStore(session, create=False) as store:
        return print_price(store.study(study_id), status, args.json)


def _only(vary: list[tuple[str, list[Any]]], args: argparse.Namespace
          ) -> list[tuple[str, list[Any]]]:
    """The knobs of `vary` that this part of a split `--decide` prices (`_split`)."""
    only = getattr(args, "only", None)
    return vary if only is None else [(k, v) for k, v in vary if k in only]


def _split(args: argparse.Namespace, windowed: list[str], whole: list[str],
           why: list[str]) -> int:
    """`--decide` over knobs of both kinds: those paid in every step priced in windows first
    (seconds), then the others as rounds of whole runs, one study after the other (never
    side by side: they would share the CPU), each a study of the session. The flags of
    whole runs (--steps, ...) are theirs; the exit status is the worse of the two; --json
    gives {"windows": the price's, "whole_runs": the study's}."""
    import contextlib
    import io
    parts = {"windows": argparse.Namespace(**{**vars(args), "only": windowed}),
             "whole_runs": argparse.Namespace(**{**vars(args), "only": whole,
                                                 "windows": False, "whole_runs": True,
                                                 "max_rounds": None})}
    for attr, _ in WHOLE_RUN_FLAGS:
        setattr(parts["windows"], attr, None)
    if not args.json:
        print(f"ab: --decide prices {', '.join(windowed)} in windows first, then "
              f"{', '.join(whole)} over rounds of whole runs ({'; '.join(why)})",
              file=sys.stderr, flush=True)
    codes, out = [], {}
    for name, part in parts.items():
        if args.json:
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):
                codes.append(windows(part) if name == "windows" else run(part))
            out[name] = json.loads(buffer.getvalue().strip().splitlines()[-1])
        else:
            codes.append(windows(part) if name == "windows" else run(part))
        if codes[-1] not in (EXIT_OK, EXIT_FAILED):
            break                          # stopped: the rest is not started
    if args.json:
        print(json.dumps(out))
    return next((c for c in codes if c == EXIT_STOPPED), max(codes))


def print_price(record: dict[str, Any], status: str, as_json: bool) -> int:
    """A price study's result (from what the study kept, as the A/B tab reads it)."""
    done = record["spec"].get("prices")
    done = done if isinstance(done, dict) else {}      # (session data: read, not trusted)
    if as_json:
        print(json.dumps(json_safe([{"key": v["key"], "value": v["value"],
                                     **done.get(v["label"], {})}
                                    for v in record["variants"][1:]])))
    else:
        print(f"price study {record['id']} ({shown(record['name'], 60)}), {status}:")
        for v in record["variants"][1:]:
            for line in pricing.stored_lines(v["label"], done.get(v["label"]), status):
                print(line)
    return EXIT_STOPPED if status == "stopped" else \
        EXIT_OK if status == "finished" else EXIT_FAILED
