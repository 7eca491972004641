"""What the commands share: the session they work on, a name's check, strict JSON, the
options of a run config and of a study, a failure's one line, a run's end in words."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from .. import lifecycle
from ..core.analysis import figures, stats
from ..core.settings.config import ConfigError
from ..core.errors import EXIT_FAILED, BadInput, ReadOnlySession, exit_for
from ..core.session.paths import default_session_dir
from ..core.session.store import SessionStore
from ..core.text import name_problem, shown, shown_lines

DEFAULT_AB_STEPS = 200


def config_args(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--config", metavar="FILE", help="a TOML run config")
    sp.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="override one key (repeatable); see `tui-trainer config`")


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
    sp.add_argument("--then", type=int, action="append", metavar="ID",
                    help="with --study: once it has finished, run (or continue) study ID "
                         "as planned too, and so on (how the dashboard's Decide a price "
                         "trains whole runs after its windows); each one's result in turn")
    sp.add_argument("--session", metavar="DIR")
    sp.add_argument("--json", action="store_true")


def session_dir(args: argparse.Namespace | str | None) -> Path:
    """The session: --session given before or after the command (the same if both)."""
    if isinstance(args, argparse.Namespace):
        after, before = getattr(args, "session", None), getattr(args, "app_session", None)
        if after and before and Path(after).expanduser().resolve() != \
                Path(before).expanduser().resolve():
            raise BadInput(f"--session is given twice with different folders ({before} and "
                           f"{after}); give it once")
        args = after or before
    return Path(args).expanduser() if args else default_session_dir()


def check_name(name: str | None, what: str = "--name") -> None:
    problem = None if name is None else name_problem(name)
    if problem:
        raise ConfigError(what, problem)


def json_safe(value: Any) -> Any:
    """Strict JSON: a NaN or infinity becomes null (the status and diverged fields say why)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


# Commands the tool starts itself: not listed in help or in an unknown command's choices.


def fitted(args: argparse.Namespace, quiet: bool = False) -> tuple[Any, list[Any]]:
    """The config of --config and --set, with the knobs its preset lets this machine choose
    chosen (core.settings.fit), each choice said on stderr (unless `quiet`): never silent.
    The machine is asked of torch here (the command imports it to train anyway)."""
    from ..core.settings import config, fit
    cfg = config.load(args.config, args.sets)                   # bad input stops here
    keys = config.read_preset(args.config)[1] if args.config else []
    sets = {kv.partition("=")[0].strip() for kv in args.sets}
    if not [k for k in keys if k not in sets]:
        return cfg, []                  # nothing to choose: torch is not asked
    from ..engine.knobs import machine_facts
    cfg, chosen = fit.load_fitted(args.config, args.sets,
                                  machine=machine_facts(cfg.device))
    for c in chosen:
        if not quiet:
            say(f"fit to this machine: {c.line()}")
    return cfg, chosen


def say(message: str) -> None:
    """One failure line; it may quote session data (names, paths, a log line): escaped."""
    print(f"tui-trainer: {shown_lines(message)}", file=sys.stderr)


def terminal_width() -> int | None:
    """The width tables are fitted to: the terminal's, none when the output goes to a pipe
    or file (the whole table, as `git` does)."""
    if not sys.stdout.isatty():
        return None
    import shutil
    return shutil.get_terminal_size().columns


def print_summary(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(json_safe(summary)))
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


def ended(ended: lifecycle.Ended, as_json: bool) -> int:
    if ended.failure:
        say(f"training failed: {ended.failure}")
    if ended.summary is None:
        return ended.code if ended.code is not None else EXIT_FAILED
    print_summary(ended.summary, as_json)
    return exit_for(ended.summary["status"])


def open_to_answer(args: argparse.Namespace) -> tuple[SessionStore, bool]:
    """The session of a command that answers and keeps its answer there (explain, memory),
    and whether it can keep it: on a read-only disk it answers without keeping."""
    session = session_dir(args)
    try:
        return SessionStore(session, create=False), True
    except ReadOnlySession:
        return SessionStore(session, create=False, readonly=True), False


def _file_models(configs: tuple[Any, ...]) -> list[str]:
    """The nets of the user's own files these configs name, each once."""
    from ..core.settings.config import is_file_model
    models = [c.get("model") if isinstance(c, dict) else getattr(c, "model", None)
              for c in configs]
    return list(dict.fromkeys(m for m in models if is_file_model(m)))


def trust_named(*configs: Any) -> None:
    """Nets of the user's own files named on this command line (or in a TOML file given on
    it) are trusted as they are now: naming a file yourself trusts it
    (core/settings/user_models.py). A file that is missing or not Python is refused here,
    in one line naming `model`, before anything is stored. Folders of images named so are
    named by this user (core/settings/user_data.py)."""
    from ..core.settings import user_data, user_models
    for model in _file_models(configs):
        user_models.trust(user_models.resolve(user_models.parse(model)[0]))
    user_data.name_in(*configs)         # and folders of images (core/settings/user_data.py)


def trusted_only(*configs: Any) -> None:
    """Nets of the user's own files named by a session (not by this command line) must be
    trusted already, and its folders of images named by this user: else one line naming
    the file (or folder) and `tui-trainer trust`, before anything starts
    (core/settings/user_models.py, user_data.py). Nothing is imported or read here."""
    from ..core.settings import user_data, user_models
    for model in _file_models(configs):
        user_models.checked(model)
    user_data.check_in(*configs)
