"""The `tui-trainer` command: headless commands for scripts and CI.

Exit status (core/errors.py): 0 ok, 1 failed, 2 bad input, 3 not identical, 4 session
unusable (damaged, read-only, or the run is trained by another process), 5 diverged. torch
is imported only by the commands that train.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from . import __version__, lifecycle, runner
from .core import config
from .core import figures, machine, supervisor
from .core.columns import fit
from .core.reader import reason_of, shown_status, stall_note
from .core import stats, study
from .core.config import ConfigError
from .core.errors import (EXIT_BAD_INPUT, EXIT_FAILED, EXIT_NOT_IDENTICAL, EXIT_OK,
                          EXIT_SESSION, EXIT_STOPPED, EXPECTED, BadInput, DiskFull,
                          ExportFailed, ReadOnlySession, SessionError, exit_for, expected,
                          is_disk_full)
from .core.paths import default_session_dir
from .core.store import SessionStore
from .core.text import name_problem, shown, shown_lines

DEFAULT_AB_STEPS = 200

EXIT_CODES = """exit status: 0 ok, 1 failed (e.g. no space left), 2 bad input, 3 not identical
(repro), 4 session unusable (damaged, read-only, or the run is trained by another process),
5 the run diverged (NaN/inf; its rows and last finite checkpoint are kept), 130 the run was
stopped before its end (Ctrl-C or a stop request; it wrote a checkpoint: `resume` continues
it)"""


def _session_dir(args: argparse.Namespace | str | None) -> Path:
    """The session: --session given before or after the command (the same if both)."""
    if isinstance(args, argparse.Namespace):
        after, before = getattr(args, "session", None), getattr(args, "app_session", None)
        if after and before and Path(after).expanduser().resolve() != \
                Path(before).expanduser().resolve():
            raise BadInput(f"--session is given twice with different folders ({before} and "
                           f"{after}); give it once")
        args = after or before
    return Path(args).expanduser() if args else default_session_dir()


def _check_name(name: str | None, what: str = "--name") -> None:
    problem = None if name is None else name_problem(name)
    if problem:
        raise ConfigError(what, problem)


def _json_safe(value: Any) -> Any:
    """Strict JSON: a NaN or infinity becomes null (the status and diverged fields say why)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


# Commands the tool starts itself: not listed in help or in an unknown command's choices.
INTERNAL_COMMANDS = ("worker",)


class Parser(argparse.ArgumentParser):
    """argparse, with an unknown command answered by the nearest public command."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if isinstance(action, argparse._SubParsersAction) and value not in action.choices:
            import difflib
            public = [c for c in action.choices if c not in INTERNAL_COMMANDS]
            near = difflib.get_close_matches(value, public, n=1)
            raise argparse.ArgumentError(
                action, f"unknown command {value!r}"
                + (f"; did you mean {near[0]}?" if near else "")
                + f" (commands: {', '.join(public)})")
        super()._check_value(action, value)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="tui-trainer", epilog=EXIT_CODES,
        description="Controlled PyTorch training experiments on MNIST: toggle the knobs, "
                    "train, and prove reproducibility. With no command, opens the dashboard.")
    p.add_argument("--version", action="version", version=f"tui-trainer {__version__}")
    p.add_argument("--session", dest="app_session", metavar="DIR",
                   help="the session (for the dashboard, or any command; default: "
                        f"{default_session_dir()})")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def config_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", metavar="FILE", help="a TOML run config")
        sp.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="override one key (repeatable); see `tui-trainer config`")

    sp = sub.add_parser("config", help="print the run config (the defaults, documented)",
                        description="Print the complete run config as TOML, every key with "
                                    "what it does. With --config/--set, prints the result "
                                    "after checking it.")
    config_args(sp)
    sp.add_argument("--plain", action="store_true", help="without the comments")

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

    def study_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--steps", type=int, metavar="N",
                        help="optimizer steps of every run (default: the study file's, else "
                             f"{DEFAULT_AB_STEPS})")
        sp.add_argument("--level", type=float, metavar="P", default=None,
                        help="confidence level of the intervals (default "
                             f"{stats.DEFAULT_LEVEL})")
        sp.add_argument("--jobs", type=int, metavar="N", default=None,
                        help="train N runs at a time (default 1; at most the number of "
                             "cores): sooner done, but the runs share the machine, so "
                             "samples/s is each run's share of it")
        sp.add_argument("--name", help="a name for the study")
        sp.add_argument("--study", type=int, metavar="ID",
                        help="run (or continue) a study already in the session, as planned "
                             "there (how the dashboard starts studies)")
        sp.add_argument("--session", metavar="DIR")
        sp.add_argument("--json", action="store_true")

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
                                    "steps.")
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
    sp.add_argument("--max-rounds", type=int, metavar="N", default=None,
                    help="--until-sure's bound on rounds")
    sp.add_argument("--max-time", type=float, metavar="S", default=None,
                    help="--until-sure's bound on seconds (the round under way finishes)")
    sp.add_argument("--rerun-loaded", type=int, metavar="N", default=None,
                    help="rounds that shared the CPU with another process (recorded around "
                         "every run: other processes' CPU, steal, load, frequency) are "
                         "trained again once the machine is quiet, at most N times in all "
                         "(default: as many as rounds; 0: never, the verdicts say how many "
                         "rounds were under load)")
    sp.add_argument("--quiet-wait", type=float, metavar="S", default=None,
                    help="how long to wait for a quiet machine before a re-run (default "
                         f"{study.QUIET_WAIT_S:.0f} s; then the round is kept, marked)")
    sp.add_argument("--plan", action="store_true",
                    help="say what the study would train (its arms, what each changes, the "
                         "runs in all) and which arms this machine cannot run, and train "
                         "nothing (no session is written)")
    study_args(sp)

    sp = sub.add_parser("sweep", help="seed noise: one config trained with N seeds",
                        description="Train one config N times, seed, seed+1, ..., and show "
                                    "each figure's mean and spread over the seeds (the noise "
                                    "any knob's effect on accuracy has to beat). The dashboard "
                                    "draws the runs as a mean line with a min-max band, and "
                                    "its Divergence tab shows how the spread grows over "
                                    "steps.")
    config_args(sp)
    sp.add_argument("--seeds", type=int, metavar="N", default=study.DEFAULT_SEEDS,
                    help=f"how many seeds (default {study.DEFAULT_SEEDS})")
    study_args(sp)

    sp = sub.add_parser("export", help="PNG figures and CSVs of runs",
                        description="Export runs: every stored point as CSV (steps, "
                                    "evaluations, fingerprints; no downsampling) and PNG "
                                    "figures (loss, throughput, memory, and divergence for "
                                    "two runs) into SESSION/exports, naming the files written.")
    sp.add_argument("run_ids", type=int, nargs="*", metavar="RUN_ID")
    sp.add_argument("--study", type=int, metavar="ID",
                    help="export an A/B study: its table as CSV, every run's points, and "
                         "figures of all its runs and of each figure's ratio to the base")
    sp.add_argument("--session", metavar="DIR")
    sp.add_argument("--out", metavar="DIR",
                    help="write the files here instead of SESSION/exports (e.g. for a "
                         "read-only session)")
    sp.add_argument("--json", action="store_true")

    sp = sub.add_parser("machine", help="what this machine can run (devices, torch), and "
                        "whether a config can train here",
                        description="Print what torch sees here (CUDA devices, Apple GPU, "
                                    "version). With --config/--set, also check that this "
                                    "machine can train that config (device, amp, dataset "
                                    "present): exit 2 naming the key when it cannot.")
    config_args(sp)
    sp.add_argument("--json", action="store_true", help="one JSON object")

    sp = sub.add_parser("join", help="join a run that spans several machines (nnodes > 1)",
                        description="Start this machine's processes of a data-parallel run "
                                    "that spans several machines: the run is started on node "
                                    "0 (the machine holding the session) with nnodes and "
                                    "rdzv_endpoint set, and every other machine runs `join` "
                                    "with the same endpoint, nnodes and nproc and its own "
                                    "node rank (under Slurm, $SLURM_NODEID). Rank 0 hands "
                                    "this machine's processes the config and checkpoint; "
                                    "only node 0 needs the session.")
    sp.add_argument("endpoint", metavar="HOST:PORT", help="the run's rdzv_endpoint (on node 0)")
    sp.add_argument("--nnodes", type=int, required=True, help="machines in all")
    sp.add_argument("--nproc", type=int, required=True, help="processes on this machine "
                    "(the run's nproc)")
    sp.add_argument("--node-rank", type=int, required=True, metavar="R",
                    help="this machine's number, 1 to nnodes - 1")
    sp.add_argument("--timeout", type=int, default=supervisor.RENDEZVOUS_S, metavar="S",
                    help="how long to wait for node 0 and the other nodes (default "
                         f"{supervisor.RENDEZVOUS_S} s)")
    sp.add_argument("--dist-timeout", type=int, default=config.RunConfig().dist_timeout,
                    metavar="S", help="the run's dist_timeout: how long this machine's "
                    "processes wait for the others in one collective (default "
                    f"{config.RunConfig().dist_timeout} s)")

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

    sp = sub.add_parser("profile", help="where a run's step time goes, operator by operator: "
                                        "K steps of a copy of it under torch.profiler",
                        description="Trains K steps of a copy of run RUN (from its newest "
                                    "checkpoint, after --warmup steps; the run itself is not "
                                    "touched) under torch.profiler (CPU, and CUDA where the "
                                    "run trains there; shapes and memory recorded) and says: "
                                    "the time per step by phase, the operators by self time "
                                    "(calls, share), each module's forward time, the memory "
                                    "peak by category, and where the Chrome/Perfetto trace "
                                    "is (beside the run's log). With a second run RUN_B, "
                                    "profiles both and says which operators changed their "
                                    "self time. Kept in the session: the dashboard's Profile "
                                    "tab shows it and exports carry the trace.")
    sp.add_argument("run", type=int, metavar="RUN", help="a run id")
    sp.add_argument("run_b", type=int, metavar="RUN_B", nargs="?",
                    help="a second run: profile both and diff them by operator")
    sp.add_argument("--steps", type=int, default=10, metavar="K",
                    help="steps profiled (default 10)")
    sp.add_argument("--warmup", type=int, default=3, metavar="W",
                    help="steps trained first, not profiled (default 3)")
    sp.add_argument("--session", metavar="DIR")
    sp.add_argument("--json", action="store_true")

    sp = sub.add_parser("runs", help="list a session's runs (reads only; works on a "
                                     "read-only session)")
    sp.add_argument("--session", metavar="DIR")
    sp.add_argument("--json", action="store_true")

    sp = sub.add_parser("memory", help="where a run's memory goes: one step of a copy of it "
                                       "by category and module",
                        description="Trains one step of a copy of run RUN (from its newest "
                                    "checkpoint, after one step of warm-up; the run itself is "
                                    "not touched) under torch's MemTracker, and says the memory "
                                    "at the step's peak by category (parameters, gradients, "
                                    "optimizer state, activations kept for backward, "
                                    "temporaries) and each module's own peak. The answer is "
                                    "kept in the session, where the dashboard shows it.")
    sp.add_argument("run", type=int, metavar="RUN", help="a run id")
    sp.add_argument("--session", metavar="DIR")
    sp.add_argument("--json", action="store_true")

    sp = sub.add_parser("explain", help="where two runs part, and why: the exact step, the "
                                        "first operation, the setting",
                        description="Replays runs A and B from their checkpoints to the first "
                                    "step whose result differs, compares what went into it "
                                    "(parameters, optimizer state, RNG states, the batch) and, "
                                    "when that agrees, traces the step op by op to name the "
                                    "first op whose output differs and the setting it "
                                    "follows. The answer is kept in the session (on run B), "
                                    "where the dashboard's Divergence tab and exports show it. "
                                    "Exit status 0 when the runs are identical, 3 when they "
                                    "part.")
    sp.add_argument("a", type=int, metavar="A", help="a run id")
    sp.add_argument("b", type=int, metavar="B", help="another run id")
    sp.add_argument("--session", metavar="DIR")
    sp.add_argument("--evidence", action="store_true",
                    help="after the answer, what it rests on, one fact a line")
    sp.add_argument("--json", action="store_true")
    # The internal commands stay callable but are listed nowhere.
    sub._choices_actions = [a for a in sub._choices_actions
                            if a.dest not in INTERNAL_COMMANDS]
    return p


# --- commands ----------------------------------------------------------------------------

def cmd_config(args: argparse.Namespace) -> int:
    cfg = config.load(args.config, args.sets)
    sys.stdout.write(cfg.to_toml(comments=not args.plain))
    return EXIT_OK


def cmd_machine(args: argparse.Namespace) -> int:
    cfg = config.load(args.config, args.sets) if args.config or args.sets else None
    from .engine.knobs import machine_facts   # torch is imported here
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
            _say(f"bad config: {found}")
        return EXIT_BAD_INPUT
    return EXIT_OK


def _print_summary(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(_json_safe(summary)))
        return
    acc = summary.get("eval_accuracy")
    print(f"run {summary['run_id']} ({shown(summary['name'])}) {summary['status']}: "
          f"{summary['steps']} steps, {summary['epochs']:.2f} epochs, "
          f"train loss (smoothed) {figures.fmt(summary.get('train_loss'), 'train_loss')}, "
          f"eval loss {figures.fmt(summary.get('eval_loss'), 'eval_loss')}, "
          f"eval accuracy {figures.accuracy_text(acc)}, "
          f"{figures.fmt(summary.get('samples_per_s'), 'samples_per_s')} samples/s "
          f"(training), data {summary['dataset']}")
    if summary.get("diverged"):
        print(f"DIVERGED: {summary['diverged']}; every logged row is kept and the newest "
              "checkpoint is the last finite one")
    print(f"parameters sha256 {summary['param_sha256']}")
    print(f"checkpoint {summary['checkpoint']}")


def _ended(ended: lifecycle.Ended, as_json: bool) -> int:
    if ended.failure:
        _say(f"training failed: {ended.failure}")
    if ended.summary is None:
        return ended.code if ended.code is not None else EXIT_FAILED
    _print_summary(ended.summary, as_json)
    return exit_for(ended.summary["status"])


def cmd_run(args: argparse.Namespace) -> int:
    session = _session_dir(args)
    _check_name(args.name)
    progress = sys.stderr.isatty()
    if args.run_id is not None:
        return _ended(lifecycle.start_created(session, args.run_id, args.config, args.sets,
                                              args.kill_at_step, progress), args.json)
    cfg = config.load(args.config, args.sets)
    return _ended(lifecycle.start(session, cfg, args.name, args.kill_at_step, progress),
                  args.json)


def cmd_worker(args: argparse.Namespace) -> int:
    from .engine.rank import RankArgs, run_rank
    return run_rank(RankArgs(
        session=_session_dir(args) if args.session else None, run_id=args.run_id,
        sets=args.sets, checkpoint=args.checkpoint, events=args.events,
        kill_at_step=args.kill_at_step, dist_timeout=args.dist_timeout), say=_say)


def cmd_join(args: argparse.Namespace) -> int:
    def waiting() -> None:
        print(f"node {args.node_rank}: waiting for node 0 at {args.endpoint} and the other "
              f"nodes (at most {args.timeout} s) ...", file=sys.stderr, flush=True)

    failure = lifecycle.join(args.endpoint, args.nnodes, args.node_rank, args.nproc,
                             args.timeout, args.dist_timeout, waiting)
    if failure is not None:
        _say(failure)
        return EXIT_FAILED
    print(f"node {args.node_rank}: its {args.nproc} process(es) ended cleanly")
    return EXIT_OK


def cmd_resume(args: argparse.Namespace) -> int:
    return _ended(lifecycle.resume(
        _session_dir(args), args.run_id, args.sets, checkpoint=args.checkpoint,
        restart=args.restart, kill_at_step=args.kill_at_step, progress=sys.stderr.isatty(),
        say=lambda message: print(f"tui-trainer: {shown_lines(message)}", file=sys.stderr)),
        args.json)


def run_rows(store: SessionStore) -> list[dict[str, Any]]:
    rows = []
    for run in store.runs():
        summary = run["summary"] or {}
        f = figures.run_figures(store, run["id"])
        checkpoints = store.usable_checkpoints(run["id"])
        rows.append({
            "run_id": run["id"], "name": run["name"],
            "status": shown_status(run["status"], run["stalled_s"]),
            "reason": stall_note(run) or reason_of(summary), "stalled_s": run["stalled_s"],
            "not_learning": f["not_learning_text"],
            "steps": run["step"], "epochs": run["epoch"],
            "train_loss": f["train_loss"], "eval_loss": f["eval_loss"],
            "eval_accuracy": f["accuracy"],
            "samples_per_s": f["samples_per_s"],
            "peak_memory_mib": f["peak_memory_mib"], "memory_kind": f["memory_kind"],
            "workers_mib": f["workers_mib"],
            "elapsed_s": f["wall_s"],
            "dataset": run["dataset"], "created": run["created"],
            "checkpoint": checkpoints[0]["path"] if checkpoints else None,
            "config": run["config"], "settings": run["settings"],
        })
    return rows


def cmd_runs(args: argparse.Namespace) -> int:
    session = _session_dir(args)
    with SessionStore(session, create=False, readonly=True) as store:   # reads only
        rows = run_rows(store)
    if args.json:
        print(json.dumps(_json_safe(rows)))
        return EXIT_OK
    if not rows:
        print(f"no runs in {shown(session, None)}")
        return EXIT_OK
    header = ("id", "name", "status", "step", "epoch", "train loss", "eval loss", "acc",
              "samples/s", "data", "created")
    table = [header]
    for r in rows:
        table.append((
            str(r["run_id"]), shown(r["name"], 40), r["status"], str(r["steps"]),
            f"{r['epochs']:.2f}", figures.fmt(r["train_loss"], "train_loss"),
            figures.fmt(r["eval_loss"], "eval_loss"),
            figures.accuracy_text(r["eval_accuracy"]),
            figures.fmt(r["samples_per_s"], "samples_per_s"),
            r["dataset"] or "-", time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"]))))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    # Cut to the terminal by importance: id, name, status, step, accuracy, loss, speed, ...
    fitted = fit(widths, (0, 1, 2, 3, 7, 5, 8, 6, 4, 9, 10), _terminal_width())
    for row in table:
        print("  ".join(row[i].ljust(widths[i]) for i in fitted.shown).rstrip())
    if fitted.left_out:
        print(f"({', '.join(header[i] for i in fitted.left_out)} left out to fit the "
              "terminal; --json has every field)")
    for r in rows:
        if r["status"] in ("crashed", "diverged", "copied", "stalled") and r["reason"]:
            print(f"run {r['run_id']} {r['status']}: {shown(r['reason'], 300)}")
        elif r["not_learning"]:
            print(f"run {r['run_id']} {r['status']}, {r['not_learning']}")
    return EXIT_OK


def cmd_repro(args: argparse.Namespace) -> int:
    if args.run is not None and (args.config or args.sets):
        raise BadInput("--run checks a run of the session with its own config; it takes no "
                       "--config or --set")
    session = _session_dir(args)
    SessionStore.check(session)
    if args.run is None:
        cfg = config.load(args.config, args.sets)    # bad input stops here, before training
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
        warm = supervisor.WarmLauncher.shared()
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
        from .core.explain import explanation_text
        print("where they part: " + shown_lines(explanation_text(r["explanation"])))


def cmd_export(args: argparse.Namespace) -> int:
    from .core.export import export_runs, export_study
    if not args.run_ids and args.study is None:
        raise BadInput("export what? give RUN_ID ... or --study ID")
    if args.run_ids and args.study is not None:
        raise BadInput("give either RUN_ID ... or --study ID, not both")
    with SessionStore(_session_dir(args), create=False, readonly=True) as store:
        out = Path(args.out).expanduser().resolve() if args.out else store.dir / "exports"
        try:
            if args.study is not None:
                written = export_study(store, args.study, out)
            else:
                written = export_runs(store, args.run_ids, out)
        except OSError as e:
            if is_disk_full(e):
                raise DiskFull(e.filename or out) from None
            hint = "" if args.out else "; give --out DIR to write them elsewhere"
            raise ExportFailed(f"cannot write the exports to {out}: "
                               f"{e.strerror or e}{hint}") from None
    if args.json:
        print(json.dumps({"files": [str(p) for p in written]}))
    else:
        print("\n".join(str(p) for p in written))
    return EXIT_OK


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
        print(json.dumps(_json_safe(plan)))
        return 0
    print(f"A/B study {shown(planned.name, 60)} (plan): {len(arms)} arms x "
          f"{plan['repeats']} rounds of {plan['steps']} steps = {plan['runs']} runs")
    for arm in arms.values():
        what = ", ".join(f"{k} = {v}" for k, v in arm["changes"].items()) or "-"
        why = f"  NOT POSSIBLE HERE: {arm['not_possible']}" if arm["not_possible"] else ""
        print(f"  {shown(arm['label'], 60):<52} {shown(what, 80)}{shown(why, 200)}")
    for note in planned.notes:
        print(f"note: {shown(note, 300)}")
    return 0


def cmd_ab(args: argparse.Namespace) -> int:
    """`ab` and `sweep`: plan a study (or take one planned), train it, print its table."""
    session = _session_dir(args)
    _check_name(args.name)
    SessionStore.check(session)
    say = (lambda m: None) if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    sweep = args.command == "sweep"
    if args.jobs is not None and not 1 <= args.jobs <= study.MAX_JOBS:
        raise ConfigError("--jobs", f"must be 1 to {study.MAX_JOBS} (the cores of this machine), "
                          f"got {args.jobs}")
    if args.study is not None:
        if (not sweep and (args.vary or args.repeats or args.until_sure is not None
                           or args.max_rounds is not None or args.max_time is not None
                           or args.rerun_loaded is not None or args.quiet_wait is not None
                           or args.plan)) \
                or args.config or args.sets or args.steps or args.level:
            raise BadInput("--study runs a study as planned; it takes no --vary, --repeats, "
                           "--until-sure, --max-rounds, --max-time, --rerun-loaded, --plan, "
                           "--config, --set, --steps or --level")
        with SessionStore(session, create=False) as store:
            study_id = store.study(args.study)["id"]
    else:
        if sweep:
            file_values = config.read_toml(args.config) if args.config else {}
            spec: dict[str, Any] = {}
            vary, repeats = [], args.seeds
        else:
            file_values, spec = ({}, {}) if not args.config else study.read_study_file(args.config)
            vary = study.parse_vary(list(spec.get("vary", [])) + args.vary)
            repeats = args.repeats if args.repeats is not None else \
                spec.get("repeats") or study.DEFAULT_REPEATS
        values = {**file_values, **config.parse_overrides(args.sets)}
        base = config.from_dict({**config.DEFAULTS.to_dict(), **values})
        name = args.name or spec.get("name") or \
            (Path(args.config).stem if args.config else args.command)
        _check_name(name, "ab.name")
        steps = args.steps if args.steps is not None else \
            spec.get("steps") or DEFAULT_AB_STEPS
        more = {} if sweep else {
            "rerun_loaded": args.rerun_loaded, "until_sure": args.until_sure,
            "max_rounds": args.max_rounds, "max_time_s": args.max_time,
            "quiet_wait_s": args.quiet_wait}
        planned = study.prepare(base, vary, steps, repeats=repeats, name=name, level=args.level,
                                jobs=args.jobs if args.jobs is not None else 1,
                                file=args.config, **more)
        if getattr(args, "plan", False):
            return _print_plan(planned, args.json)
        for note in planned.notes:
            say(f"{args.command}: {note}")
        with SessionStore(session) as store:
            study_id = store.create_study(planned.kind, name, planned.spec, planned.runs)
    status = runner.run_study(session, study_id, say, jobs=args.jobs)
    with SessionStore(session, create=False) as store:
        record, rows = study.table(store, study_id)
    if args.json:
        print(json.dumps(_json_safe(
            {"study_id": study_id, "kind": record["kind"], "name": record["name"],
             "status": status, "steps": record["spec"]["steps"],
             "repeats": record["spec"].get("repeats", 1),
             "level": record["spec"].get("level", stats.DEFAULT_LEVEL),
             "jobs": record["spec"].get("jobs", 1), "vary": record["spec"]["vary"],
             "notes": record["spec"].get("notes", []),
             "reruns": record["spec"].get("reruns", []),
             "until_sure": record["spec"].get("until_sure"),
             "ended_by": record["spec"].get("ended_by"),
             "rows": [r.to_dict() for r in rows]})))
    else:
        width = _terminal_width()

        def para(text: str) -> str:      # prose wraps at words, tables are fitted
            import textwrap
            return textwrap.fill(text, width, break_on_hyphens=False) if width else text

        print(para(study.title_text(record, rows, status)))
        print("\n".join(line if i <= len(rows) else para(line) for i, line in
                        enumerate(study.format_table(rows, sweep=record["kind"] == "sweep",
                                                  width=width))))
        print(para(figures.EXPLAINED + " data wait: total time the loop waited for batches. "
                   + study.method_text(record, rows)))
        for line in study.phase_lines(rows) + study.rerun_lines(record):
            print(para(shown(line, 2000)))
        for note in record["spec"].get("notes", []):
            print(para(f"note: {shown(note, 1000)}"))
    failed = any(r.status == "crashed" for r in rows)
    if failed or status == "crashed":
        return EXIT_FAILED
    return EXIT_STOPPED if status == "stopped" else EXIT_OK


def _open_to_answer(args: argparse.Namespace) -> tuple[SessionStore, bool]:
    """The session of a command that answers and keeps its answer there (explain, memory),
    and whether it can keep it: on a read-only disk it answers without keeping."""
    session = _session_dir(args)
    try:
        return SessionStore(session, create=False), True
    except ReadOnlySession:
        return SessionStore(session, create=False, readonly=True), False


def cmd_explain(args: argparse.Namespace) -> int:
    from .core.explain import evidence_lines, explanation_text
    store, record = _open_to_answer(args)
    with store:
        result = runner.explain(store, args.a, args.b, record=record)
    if args.json:
        print(json.dumps(_json_safe(result)))
    else:
        print(shown_lines(explanation_text(result)))
        if args.evidence:
            print("\n".join(f"  {shown_lines(line)}" for line in evidence_lines(result)))
    return EXIT_OK if result["verdict"] == "identical" else EXIT_NOT_IDENTICAL


def cmd_memory(args: argparse.Namespace) -> int:
    from .core import memory
    store, record = _open_to_answer(args)
    with store:
        run = store.run(args.run)
        result = runner.memory(store, run)
        if record:
            memory.record(store, run["id"], result)
    if args.json:
        print(json.dumps(_json_safe(result)))
    else:
        print("\n".join(memory.lines(result)))
    return EXIT_OK


def cmd_profile(args: argparse.Namespace) -> int:
    from .core import profiling
    for flag, value, lo, hi in (("--steps", args.steps, 1, 1000), ("--warmup", args.warmup, 0,
                                                                     1000)):
        if not lo <= value <= hi:
            raise ConfigError(flag, f"must be {lo} to {hi} steps, got {value}")
    store, keep = _open_to_answer(args)
    with store:
        runs = [store.run(r) for r in ([args.run] if args.run_b is None
                                       else [args.run, args.run_b])]
        results = []
        for run in runs:
            result = runner.profile(store, run, args.steps, args.warmup, keep=keep)
            if keep:
                profiling.record(store, run["id"], result)
            results.append(result)
        session = store.dir
    if args.json:
        out: dict[str, Any] = {"profiles": results}
        if len(results) == 2:
            out["diff"] = profiling.diff(*results)
        print(json.dumps(_json_safe(out)))
        return EXIT_OK
    for run, result in zip(runs, results, strict=True):
        print("\n".join(profiling.lines(result, run["id"], session)))
        if not keep:
            print("(a read-only session: the profile and its trace are not kept)")
    if len(results) == 2:
        print("\n".join(profiling.diff_lines(*results, ids=(runs[0]["id"], runs[1]["id"]))))
    return EXIT_OK


COMMANDS = {"config": cmd_config, "run": cmd_run, "resume": cmd_resume, "runs": cmd_runs,
            "repro": cmd_repro, "export": cmd_export, "ab": cmd_ab, "sweep": cmd_ab,
            "machine": cmd_machine, "join": cmd_join, "worker": cmd_worker,
            "explain": cmd_explain, "memory": cmd_memory, "profile": cmd_profile}


def _terminal_width() -> int | None:
    """The width tables are fitted to: the terminal's, none when the output goes to a pipe
    or file (the whole table, as `git` does)."""
    if not sys.stdout.isatty():
        return None
    import shutil
    return shutil.get_terminal_size().columns


def _say(message: str) -> None:
    """One failure line; it may quote session data (names, paths, a log line): escaped."""
    print(f"tui-trainer: {shown_lines(message)}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        if not sys.stdin.isatty() or not sys.stdout.isatty():
            parser.print_help()
            print("\n(no terminal: the dashboard needs one; use the commands above headless)")
            return EXIT_OK
        try:
            from .ui.app import run_app
            return run_app(_session_dir(args.app_session))
        except SessionError as e:
            _say(str(e))
            return EXIT_SESSION
    supervisor.yield_to_dashboard()
    supervisor.watch_owner()
    try:
        return COMMANDS[args.command](args)
    except EXPECTED as e:
        code, prefix = expected(e)
        _say(f"{prefix}{e}")
        return code
    except KeyboardInterrupt:
        print("tui-trainer: interrupted", file=sys.stderr)
        return EXIT_STOPPED
    except Exception as e:  # noqa: BLE001 - the run's log has the traceback
        what = "training failed" if args.command in ("run", "resume", "repro", "ab") \
            else f"{args.command} failed"
        _say(f"{what}: {type(e).__name__}: {e}")
        return EXIT_FAILED
