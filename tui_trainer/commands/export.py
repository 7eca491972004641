"""`tui-trainer export`: runs or a study as CSVs and PNG figures."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..core.errors import EXIT_OK, BadInput, DiskFull, ExportFailed, is_disk_full
from ..core.session.store import SessionStore
from .common import session_dir


def add(sub: Any) -> None:
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


def run(args: argparse.Namespace) -> int:
    from ..core.session.export import export_runs, export_study
    if not args.run_ids and args.study is None:
        raise BadInput("export what? give RUN_ID ... or --study ID")
    if args.run_ids and args.study is not None:
        raise BadInput("give either RUN_ID ... or --study ID, not both")
    with SessionStore(session_dir(args), create=False, readonly=True) as store:
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
