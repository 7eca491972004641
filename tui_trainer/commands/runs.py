"""`tui-trainer runs`: a session's runs, read only."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ..core.processes import contention
from ..core.analysis import figures
from ..core.columns import fit
from ..core.errors import EXIT_OK, DiskFull, SessionError
from ..core.session.reader import reason_of, shown_status, stall_note
from ..core.session.store import SessionStore
from ..core.text import shown
from .common import json_safe, say, session_dir, terminal_width


def add(sub: Any) -> None:
    sp = sub.add_parser("runs", help="list a session's runs (reads; works on a read-only "
                                     "session)")
    sp.add_argument("--session", metavar="DIR")
    sp.add_argument("--json", action="store_true")


def run_rows(store: SessionStore, computed: list | None = None,
             say: Any = None) -> list[dict[str, Any]]:
    """Every run's row: an ended run's figures as kept when it ended (what is read does not
    grow with its rows); those computed from rows instead go to `computed`."""
    runs = store.runs()
    kept = store.figures_of(runs, computed, say)
    newest = store.newest_checkpoints()
    rows = []
    for run in runs:
        summary = run["summary"] or {}
        f = figures.run_figures(store, run["id"], run, kept[run["id"]])
        rows.append({
            "run_id": run["id"], "name": run["name"],
            "status": shown_status(run["status"], run["stalled_s"]),
            "reason": stall_note(run) or reason_of(summary), "stalled_s": run["stalled_s"],
            "not_learning": f["not_learning_text"],
            "crowded": contention.run_crowded(run), "busy_machine": contention.run_loaded(run),
            "steps": run["step"], "epochs": run["epoch"],
            "train_loss": f["train_loss"], "eval_loss": f["eval_loss"],
            "eval_accuracy": f["accuracy"],
            "samples_per_s": f["samples_per_s"],
            "peak_memory_mib": f["peak_memory_mib"], "memory_kind": f["memory_kind"],
            "workers_mib": f["workers_mib"],
            "elapsed_s": f["wall_s"],
            "dataset": run["dataset"], "created": run["created"],
            "checkpoint": newest.get(run["id"]),
            "config": run["config"], "settings": run["settings"],
        })
    return rows


def keep_figures(session: Any, computed: list) -> None:
    """Ended runs whose figures were computed from their rows (a session from before they
    were kept): kept now where the session can be written, so that the next listing reads
    them; a read-only session is left as it is. The writable open also records that an
    earlier version's session was upgraded (core/session/upgrade.py): said once."""
    try:
        with SessionStore(session, create=False, verify=False) as store:
            store.keep_figures(computed)
    except (DiskFull, SessionError):    # read-only, full, locked: nothing kept
        pass                            # listed all the same; computed again next time


def run(args: argparse.Namespace) -> int:
    session = session_dir(args)
    computed: list = []
    with SessionStore(session, create=False, readonly=True) as store:   # reads
        rows = run_rows(store, computed, say)
        told = store.upgrade_note is not None   # an earlier version's: said, to be recorded
    if computed or told:
        keep_figures(session, computed)
    if args.json:
        print(json.dumps(json_safe(rows)))
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
    fitted = fit(widths, (0, 1, 2, 3, 7, 5, 8, 6, 4, 9, 10), terminal_width())
    for row in table:
        print("  ".join(row[i].ljust(widths[i]) for i in fitted.shown).rstrip())
    if fitted.left_out:
        print(f"({', '.join(header[i] for i in fitted.left_out)} left out to fit the "
              "terminal; --json has every field)")
    for r in rows:
        if r["status"] in ("crashed", "diverged", "copied", "stalled") and r["reason"]:
            print(f"run {r['run_id']} {r['status']}: {shown(r['reason'], 300)}")
        elif r["not_learning"]:
            print(f"run {r['run_id']} {r['status']}, {shown(r['not_learning'], 300)}")
        if r["crowded"]:
            print(f"run {r['run_id']} {r['status']}, crowded: {shown(r['crowded'], 300)}")
        elif r["busy_machine"]:
            print(f"run {r['run_id']} {r['status']}: {shown(r['busy_machine'], 300)}")
    return EXIT_OK
