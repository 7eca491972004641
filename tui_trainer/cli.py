"""The `tui-trainer` command: headless commands for scripts and CI. Each command is a
module of tui_trainer/commands (its parser and its run); this is the front door: the
top-level options, the unknown command's answer, the dashboard when no command is given,
and the one place a failure becomes its exit status and line.

Exit status (core/errors.py): 0 ok, 1 failed, 2 bad input, 3 not identical, 4 session
unusable (damaged, read-only, or the run is trained by another process), 5 diverged. torch
is imported only by the commands that train.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import signal
import sys
from typing import Any

from . import __version__, commands
from .commands.common import say, session_dir
from .core.processes import supervisor
from .core.errors import (EXIT_FAILED, EXIT_OK, EXIT_SESSION, EXIT_STOPPED, EXPECTED,
                          SessionError, expected)
from .core.session import upgrade
from .core.session.paths import default_session_dir

EXIT_CODES = """exit status: 0 ok, 1 failed (e.g. no space left), 2 bad input, 3 not identical
(repro), 4 session unusable (damaged, read-only, or the run is trained by another process),
5 the run diverged (NaN/inf; its rows and last finite checkpoint are kept), 130 the run was
stopped before its end (Ctrl-C or a stop request; it wrote a checkpoint: `resume` continues
it)"""


# Commands the tool starts itself: not listed in help or in an unknown command's choices.
INTERNAL_COMMANDS = ("worker", "price-arm")


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
    for command in commands.ORDER:
        command.add(sub)
    # The internal commands stay callable but are listed nowhere.
    sub._choices_actions = [a for a in sub._choices_actions
                            if a.dest not in INTERNAL_COMMANDS]
    return p


def _quick_end() -> None:
    """gc.freeze, where no module built with nanobind is loaded: those (triton, which
    torchvision's import brings) report every object still alive at the end as a leak, on
    stderr."""
    if "triton" not in sys.modules:
        gc.freeze()


def main(argv: list[str] | None = None) -> int:
    os.environ.update(supervisor.thread_wait_env())     # before any command imports torch
    # Last of the exit functions (they run in reverse): what is still alive is put out of
    # the garbage collector's reach, so that the interpreter's end does not walk torch's
    # objects once more. After `import torch` the end took 0.6 s here and 0.24 s with it
    # (benchmarks/exit_cost.py); `ab` and `machine` paid it on every call.
    atexit.register(_quick_end)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        if not sys.stdin.isatty() or not sys.stdout.isatty():
            parser.print_help()
            print("\n(no terminal: the dashboard needs one; use the commands above headless)")
            return EXIT_OK
        try:
            from .ui.app import run_app
            return run_app(session_dir(args.app_session))
        except SessionError as e:
            say(str(e))
            return EXIT_SESSION
    supervisor.watch_owner()
    upgrade.listen(lambda note: say(note))    # an earlier version's session: what is assumed
    try:
        return commands.BY_NAME[args.command].run(args)
    except BrokenPipeError:
        # the reader of the output went away (`tui-trainer runs | head`): quietly, with the
        # status a shell gives a command ended by SIGPIPE (`yes | head`); what is left to
        # flush goes nowhere
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return 128 + signal.SIGPIPE
    except EXPECTED as e:
        code, prefix = expected(e)
        say(f"{prefix}{e}")
        return code
    except KeyboardInterrupt:
        print("tui-trainer: interrupted", file=sys.stderr)
        return EXIT_STOPPED
    except Exception as e:  # noqa: BLE001 - the run's log has the traceback
        what = "training failed" if args.command in ("run", "resume", "repro", "ab") \
            else f"{args.command} failed"
        say(f"{what}: {type(e).__name__}: {e}")
        return EXIT_FAILED
