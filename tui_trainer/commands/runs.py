"""`tui-trainer runs`: a session's runs, read only."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ..core import contention, figures
from ..core.columns import fit
from ..core.errors import EXIT_OK
from ..core.reader import reason_of, shown_status, stall_note
from ..core.store import SessionStore
from ..core.text import shown
from .common import json_safe, session_dir, terminal_width


def add(sub: Any) -> None:
    sp = sub.add_parser("runs", help="list a session's runs (reads only; works on a "
                                     "read-only session)")
    sp.add_argument("--session", metavar="DIR")
    sp.add_argument("--json", action="store_true")


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
            "crowded": contention.run_crowded(run),
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


def run(args: argparse.Namespace) -> int:
    session = session_dir(args)
    with SessionStore(session, create=False, readonly=True) as store:   # reads only
        rows = run_rows(store)
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
    return EXIT_OK
