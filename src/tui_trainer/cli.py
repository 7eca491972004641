"""The `tui-trainer` command: headless commands for scripts and CI.

Exit status: 0 on success, 2 on bad input (config, session, checkpoint, data), 1 when
training fails. torch is imported only by the commands that train.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from . import __version__
from .core import config as cfgmod
from .core.config import ConfigError
from .core.errors import CheckpointError
from .core.paths import default_session_dir
from .core.store import SessionError, SessionStore

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_NOT_IDENTICAL = 0, 1, 2, 3


class BadInput(Exception):
    """Input the user can fix; printed as one message, exit status 2."""


def _session_dir(arg: str | None) -> Path:
    return Path(arg).expanduser() if arg else default_session_dir()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tui-trainer",
        description="Controlled PyTorch training experiments on MNIST: toggle the knobs, "
                    "train, and prove reproducibility. With no command, opens the dashboard.")
    p.add_argument("--version", action="version", version=f"tui-trainer {__version__}")
    p.add_argument("--session", dest="app_session", metavar="DIR",
                   help="the session the dashboard opens (default: "
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
                                    f"({', '.join(cfgmod.TRAINING_LENGTH_KEYS)}) may change.")
    sp.add_argument("run_id", type=int, metavar="RUN_ID")
    sp.add_argument("--session", metavar="DIR")
    sp.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    sp.add_argument("--checkpoint", metavar="PATH",
                    help="resume from this checkpoint of the run instead of the newest")
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
    sp.add_argument("--session", metavar="DIR")
    sp.add_argument("--json", action="store_true")

    sp = sub.add_parser("export", help="PNG figures and CSVs of runs",
                        description="Export runs: every stored point as CSV (steps, "
                                    "evaluations, fingerprints; no downsampling) and PNG "
                                    "figures (loss, throughput, memory, and divergence for "
                                    "two runs) into SESSION/exports, naming the files written.")
    sp.add_argument("run_ids", type=int, nargs="+", metavar="RUN_ID")
    sp.add_argument("--session", metavar="DIR")
    sp.add_argument("--json", action="store_true")

    sp = sub.add_parser("runs", help="list a session's runs")
    sp.add_argument("--session", metavar="DIR")
    sp.add_argument("--json", action="store_true")
    return p


# --- commands ----------------------------------------------------------------------------

def cmd_config(args: argparse.Namespace) -> int:
    cfg = cfgmod.load(args.config, args.sets)
    sys.stdout.write(cfg.to_toml(comments=not args.plain))
    return EXIT_OK


def _print_summary(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary))
        return
    acc = summary.get("eval_accuracy")
    sps = summary.get("samples_per_s")
    print(f"run {summary['run_id']} ({summary['name']}) {summary['status']}: "
          f"{summary['steps']} steps, {summary['epochs']:.2f} epochs, "
          f"loss {_num(summary.get('final_loss'))}, "
          f"eval accuracy {'-' if acc is None else f'{acc:.2%}'}, "
          f"{'-' if sps is None else f'{sps:,.0f}'} samples/s, data {summary['dataset']}")
    print(f"parameters sha256 {summary['param_sha256']}")
    print(f"checkpoint {summary['checkpoint']}")


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def cmd_run(args: argparse.Namespace) -> int:
    session = _session_dir(args.session)
    if args.run_id is not None:
        return _run_created(args, session)
    cfg = cfgmod.load(args.config, args.sets)
    from .engine.train import run_training   # torch is imported here, not before
    summary = run_training(cfg, session, name=args.name,
                           progress=sys.stderr.isatty(), kill_at_step=args.kill_at_step)
    _print_summary(summary.to_dict(), args.json)
    return EXIT_OK


def _run_created(args: argparse.Namespace, session: Path) -> int:
    """Trains a run the dashboard created. Its row exists already, so a refusal is recorded
    on it (status crashed, the message as a failure event) for the dashboard to show."""
    with SessionStore(session, create=False) as store:
        run = store.run(args.run_id)
        if run["status"] != "created":
            raise BadInput(f"run {args.run_id} was started before (status {run['status']}); "
                           "use `tui-trainer resume` to continue it")
        try:
            cfg = cfgmod.load(args.config, args.sets, base=cfgmod.from_dict(run["config"]))
            from .engine.train import run_training
            summary = run_training(cfg, session, run_id=args.run_id,
                                   progress=sys.stderr.isatty(),
                                   kill_at_step=args.kill_at_step)
        except (ConfigError, CheckpointError) as e:
            store.add_event(args.run_id, "failure", f"refused to start: {e}")
            store.end_run(args.run_id, "crashed", {"error": str(e)})
            raise
    _print_summary(summary.to_dict(), args.json)
    return EXIT_OK


def cmd_resume(args: argparse.Namespace) -> int:
    overrides = cfgmod.parse_overrides(args.sets)
    for key in overrides:
        if key not in cfgmod.TRAINING_LENGTH_KEYS:
            raise ConfigError(key, "cannot change when continuing a run (it would no longer "
                              "be the same run); only "
                              f"{', '.join(cfgmod.TRAINING_LENGTH_KEYS)} may change")
    session = _session_dir(args.session)
    with SessionStore(session, create=False) as store:
        run = store.run(args.run_id)
        if store.is_live(run):
            raise BadInput(f"run {args.run_id} is still training (pid {run['pid']}); stop it "
                           "before continuing it")
        cfg = cfgmod.from_dict({**run["config"], **overrides})
        if args.checkpoint:
            path = Path(args.checkpoint)
        else:
            checkpoints = store.checkpoints(args.run_id)
            if not checkpoints:
                raise BadInput(f"run {args.run_id} has no checkpoint to continue from")
            path = Path(checkpoints[0]["path"])
    from .engine.checkpoint import load_checkpoint
    from .engine.train import run_training
    state = load_checkpoint(path)
    if state.get("run_id") != args.run_id:
        raise CheckpointError(f"checkpoint {path} belongs to run {state.get('run_id')}, "
                              f"not to run {args.run_id}")
    mine = {k: v for k, v in cfg.to_dict().items() if k not in cfgmod.TRAINING_LENGTH_KEYS}
    theirs = {k: v for k, v in dict(state["config"]).items()
              if k not in cfgmod.TRAINING_LENGTH_KEYS}
    if mine != theirs:
        diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        raise CheckpointError(f"checkpoint {path} was written with another config "
                              f"(differs in: {', '.join(diff)})")
    summary = run_training(cfg, session, run_id=args.run_id, checkpoint=state,
                           progress=sys.stderr.isatty(), kill_at_step=args.kill_at_step)
    _print_summary(summary.to_dict(), args.json)
    return EXIT_OK


def run_rows(store: SessionStore) -> list[dict[str, Any]]:
    rows = []
    for run in store.runs():
        summary = run["summary"] or {}
        last = store.last_step(run["id"]) or {}
        last_eval = store.last_eval(run["id"]) or {}
        checkpoints = store.checkpoints(run["id"])
        rows.append({
            "run_id": run["id"], "name": run["name"], "status": run["status"],
            "steps": run["step"], "epochs": run["epoch"],
            "loss": last.get("loss"),
            "eval_accuracy": last_eval.get("accuracy"),
            "samples_per_s": summary.get("samples_per_s", last.get("samples_per_s")),
            "elapsed_s": summary.get("elapsed_s", last.get("elapsed")),
            "dataset": run["dataset"], "created": run["created"],
            "checkpoint": checkpoints[0]["path"] if checkpoints else None,
            "config": run["config"], "fingerprint": run["fingerprint"],
        })
    return rows


def cmd_runs(args: argparse.Namespace) -> int:
    session = _session_dir(args.session)
    with SessionStore(session, create=False) as store:
        rows = run_rows(store)
    if args.json:
        print(json.dumps(rows))
        return EXIT_OK
    if not rows:
        print(f"no runs in {session}")
        return EXIT_OK
    header = ("id", "name", "status", "step", "epoch", "loss", "acc", "samples/s", "data",
              "created")
    table = [header]
    for r in rows:
        table.append((
            str(r["run_id"]), r["name"], r["status"], str(r["steps"]), f"{r['epochs']:.2f}",
            _num(r["loss"]),
            "-" if r["eval_accuracy"] is None else f"{r['eval_accuracy']:.2%}",
            "-" if r["samples_per_s"] is None else f"{r['samples_per_s']:,.0f}",
            r["dataset"] or "-", time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"]))))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return EXIT_OK


def _train(args: list[str], expect_kill: bool = False) -> dict[str, Any] | None:
    """Runs `tui-trainer ARGS --json` in a process of its own; its summary, or None when it
    was killed as asked."""
    import subprocess
    proc = subprocess.run([sys.executable, "-m", "tui_trainer", *args],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if expect_kill and proc.returncode < 0:
        return None
    if proc.returncode != 0:
        message = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
        if proc.returncode == EXIT_BAD_INPUT:
            raise BadInput(message.removeprefix("tui-trainer: "))
        raise RuntimeError(f"a repro run failed (exit {proc.returncode}): {message}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cmd_repro(args: argparse.Namespace) -> int:
    from .core.repro import verdict
    cfg = cfgmod.load(args.config, args.sets)        # bad input stops here, before training
    if args.repeats < 2:
        raise ConfigError("--repeats", "must be 2 or more (there is nothing to compare)")
    session = _session_dir(args.session)
    base = ["run", "--session", str(session), "--json"]
    if args.config:
        base += ["--config", args.config]
    for pair in args.sets:
        base += ["--set", pair]
    say = (lambda m: None) if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    if args.resume_at is None:
        ids = []
        for i in range(args.repeats):
            say(f"repro: run {i + 1} of {args.repeats} ...")
            ids.append(_train(base + ["--name", f"repro-{i + 1}"])["run_id"])
        since = -1
    else:
        if args.resume_at < 1:
            raise ConfigError("--resume-at", "must be a step >= 1")
        if cfg.max_steps and args.resume_at >= cfg.max_steps:
            raise ConfigError("--resume-at", f"must be below max_steps ({cfg.max_steps})")
        say("repro: the config straight through ...")
        straight = _train(base + ["--name", "repro-straight"])
        if args.resume_at >= straight["steps"]:
            raise ConfigError("--resume-at", f"must be below the run's {straight['steps']} "
                              "steps")
        say(f"repro: the same, killed at step {args.resume_at} ...")
        _train(base + ["--name", f"repro-killed-at-{args.resume_at}", "--set",
                       f"checkpoint_every={args.resume_at}", "--kill-at-step",
                       str(args.resume_at)], expect_kill=True)
        with SessionStore(session, create=False) as store:
            # By name, not "the newest run": the dashboard may start runs meanwhile.
            killed = max(r["id"] for r in store.runs()
                         if r["name"] == f"repro-killed-at-{args.resume_at}")
        say(f"repro: resuming it from its checkpoint at step {args.resume_at} ...")
        _train(["resume", str(killed), "--session", str(session), "--json"])
        ids, since = [straight["run_id"], killed], args.resume_at
    with SessionStore(session, create=False) as store:
        v = verdict(store, ids, since_step=since)
        store.add_event(ids[-1], "repro_verdict",
                        f"{'identical' if v.identical else 'not identical'} to run {ids[0]}",
                        data=v.to_dict())
    result = {"mode": "repeat" if args.resume_at is None else "resume",
              "resume_at": args.resume_at, "config": cfg.to_dict(), **v.to_dict()}
    if args.json:
        print(json.dumps(result))
    else:
        _print_verdict(result)
    return EXIT_OK if v.identical else EXIT_NOT_IDENTICAL


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
            dist = row["param_distance"]
            print(f"            {row['step']:>7}   {_num(row['loss_delta'])}   "
                  f"{'-' if dist is None else f'{dist:.4g}'}")
    print("settings that can explain it:")
    for reason in r["explanations"] or ["none of the known causes applies to these runs"]:
        print(f"  - {reason}")


def cmd_export(args: argparse.Namespace) -> int:
    from .core.export import export_csv, export_png
    with SessionStore(_session_dir(args.session), create=False) as store:
        for run_id in args.run_ids:
            store.run(run_id)                   # an unknown run is bad input, before writing
        out = store.dir / "exports"
        written = [p for r in args.run_ids for p in export_csv(store, r, out)]
        written += export_png(store, args.run_ids, out)
    if args.json:
        print(json.dumps({"files": [str(p) for p in written]}))
    else:
        print("\n".join(str(p) for p in written))
    return EXIT_OK


COMMANDS = {"config": cmd_config, "run": cmd_run, "resume": cmd_resume, "runs": cmd_runs,
            "repro": cmd_repro, "export": cmd_export}


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
            print(f"tui-trainer: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
    try:
        return COMMANDS[args.command](args)
    except ConfigError as e:
        print(f"tui-trainer: bad config: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (SessionError, CheckpointError, BadInput) as e:
        print(f"tui-trainer: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("tui-trainer: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - training failed; the run's log has the traceback
        print(f"tui-trainer: training failed: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_FAILED
