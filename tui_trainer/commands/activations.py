"""`tui-trainer activations`: what a net sees in one digit, run against run, as a PNG."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .. import runner
from ..core.settings.config import ConfigError
from ..core.errors import EXIT_OK, DiskFull, ExportFailed, is_disk_full
from ..core.text import shown
from .common import json_safe, open_to_answer


def digit_arg(text: str) -> tuple[str, int | None]:
    """--digit: an index into the evaluation set, `random` or `worst`."""
    if text in ("random", "worst"):
        return text, None
    try:
        return "index", int(text)
    except ValueError:
        raise ConfigError("--digit", f"must be an index into the evaluation set (0, 1, ...), "
                          f"random or worst, got {shown(text, 40)!r}") from None


def add(sub: Any) -> None:
    sp = sub.add_parser("activations", help="what a net sees in one digit: each convolution's "
                                            "feature maps and the class probabilities, run "
                                            "against run, as a PNG",
                        description="Restores run RUN's model from a kept checkpoint (its "
                                    "newest, or the one at --step) in evaluation mode on the "
                                    "CPU, feeds it one digit of its evaluation set and draws "
                                    "the digit, every channel of each convolution's output "
                                    "and the ten class probabilities into a PNG, printing "
                                    "where it went. With RUN_B, the same digit through both "
                                    "runs, each layer on one colour scale shared by the two, "
                                    "and their difference. Kept in the session, where the "
                                    "dashboard's Model tab shows it.")
    sp.add_argument("run", type=int, metavar="RUN", help="a run id")
    sp.add_argument("run_b", type=int, metavar="RUN_B", nargs="?",
                    help="a second run: the same digit through both, and their difference")
    sp.add_argument("--digit", default="0", metavar="N",
                    help="which digit: its index in the evaluation set (default 0), random, "
                         "or worst (the one RUN gets wrong with the highest confidence)")
    sp.add_argument("--step", type=int, metavar="S",
                    help="the checkpoint at step S (of each run; default: each run's newest)")
    sp.add_argument("--out", metavar="DIR",
                    help="write the PNG here instead of SESSION/exports")
    sp.add_argument("--no-png", action="store_true",
                    help="keep the maps for the dashboard without drawing the PNG (what the "
                         "Model tab asks for: export draws it from them)")
    sp.add_argument("--session", metavar="DIR")
    sp.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from ..core.analysis import activations
    how, index = digit_arg(args.digit)
    if index is not None and index < 0:
        raise ConfigError("--digit", f"must be 0 or more, got {index}")
    if args.step is not None and args.step < 0:
        raise ConfigError("--step", f"must be 0 or more, got {args.step}")
    store, keep = open_to_answer(args)
    with store:
        ids = [args.run] if args.run_b is None else [args.run, args.run_b]
        runs = [store.run(r) for r in ids]
        meta, arrays = runner.activations(store, runs, how, index, args.step)
        path = None if args.no_png else _png(args, store, meta, arrays)
        meta["png"] = str(path) if path else None
        if keep:
            kept = dict(meta)               # (kept with the PNG's path inside the session)
            activations.keep(store, kept, arrays)
            meta["file"] = kept["file"]
    if args.json:
        print(json.dumps(json_safe(meta)))
        return EXIT_OK
    print("\n".join(activations.lines(meta)))
    if not keep:
        print("(a read-only session: the maps are not kept for the dashboard)")
    if path:
        print(f"PNG: {path}")
    return EXIT_OK


def _png(args: argparse.Namespace, store: Any, meta: dict, arrays: dict) -> Path:
    from ..core.analysis import activations
    out = Path(args.out).expanduser().resolve() if args.out else store.dir / "exports"
    try:
        out.mkdir(parents=True, exist_ok=True)
        return activations.png(meta, arrays, out / f"{activations.stem(meta)}.png")
    except OSError as e:
        if is_disk_full(e):
            raise DiskFull(e.filename or out) from None
        hint = "" if args.out else "; give --out DIR to write it elsewhere"
        raise ExportFailed(f"cannot write the PNG to {out}: {e.strerror or e}{hint}") \
            from None
