"""A session used for months: what a person waits for, against the session's size (issue 56).

Builds sessions of N ended runs of R logged steps each (rows as the engine writes them:
every column, an evaluation every 500 steps, a fingerprint every 100, two checkpoints),
through the store's own writes (so each run's figures are kept when it ends, as a run's
are), with one A/B study of 8 of them (base and a variant, 4 rounds). Then, per size:

- `runs` and `runs --json`: the command as a user types it, a fresh process each time
  (the median of --repeats);
- the study's table (core.analysis.study.table: what `ab` prints at its end and the A/B tab draws);
- the dashboard's first read (core.session.reader: its first tick, the run table's rows) and the
  A/B tab's (a tick with the study);
- an older session: the same session as a session written before figures were kept reads
  (no kept figures; each run's summary holds the figures its engine computed, as before):
  the dashboard's first read (which shows those) and the time its ticks take to compute
  every run's figures from its rows; then its first `runs` computes every run's figures
  from every row (what `runs` did for every listing before issue 56, the peer of the same
  run) and keeps them; the second reads them.

Goal (issue 56): `runs` and `runs --json` at most 1.5 s on 1,000 runs of 2,000 rows.

    python benchmarks/long_session.py [--sizes 100x2000,301x2000,1000x2000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tui_trainer.core.settings import config
from tui_trainer.core.session import reader
from tui_trainer.core.analysis import study  # noqa: E402
from tui_trainer.core.session.store import SessionStore  # noqa: E402

GOAL_S = 1.5


def _rows(n: int, rng: random.Random) -> list[dict]:
    rows, loss = [], 2.35
    for step in range(1, n + 1):
        loss = max(0.02, loss * 0.998 + rng.gauss(0, 0.01))
        phases = {f"{k}_s": rng.uniform(0.0005, 0.004) for k in
                  ("data", "copy", "forward", "backward", "optimizer", "record")}
        rows.append({"step": step, "epoch": step / 469, "elapsed": step * 0.02, "loss": loss,
                     "lr": 0.01, "grad_norm": rng.uniform(0.5, 2.0),
                     "samples_per_s": rng.gauss(5000, 300), "compute_s": 0.01,
                     "rss_bytes": 300e6 + rng.uniform(0, 1e6), "peak_rss": 310e6,
                     "tensor_bytes": 2e6, "workers_uss": 0.0, "ranks_uss": 0.0, **phases})
    return rows


def build(directory: Path, runs: int, rows: int) -> None:
    rng = random.Random(0)
    planned = study.prepare(config.DEFAULTS, [("cudnn_benchmark", [True])], rows, repeats=4,
                            name="bench")
    with SessionStore(directory) as store:
        sid = store.create_study(planned.kind, planned.name, planned.spec, planned.runs)
        for i in range(runs):
            cfg = planned.runs[i]["config"] if i < len(planned.runs) else \
                config.DEFAULTS.to_dict()
            rid = store.create_run(cfg, name=f"r{i + 1}")
            steps = _rows(rows, rng)
            store.add_rows(steps=steps, evals=[
                {"step": s, "epoch": s / 469, "loss": 0.3, "accuracy": 0.9}
                for s in range(500, rows + 1, 500)], fingerprints=[
                {"step": s, "sha256": f"{s:064x}", "l2": 1.0, "sketch": None}
                for s in range(0, rows + 1, 100)], run_id=rid)
            for s in (rows // 2, rows):
                store.add_checkpoint(rid, s, s // 469, s % 469,
                                     store.checkpoint_dir(rid) / f"step-{s}.pt")
            store.set_progress(rid, rows, rows / 469)
            store.end_run(rid, "finished", {"elapsed_s": rows * 0.02})
            if i < len(planned.runs):
                store.set_study_run(sid, i, rid)
        store.set_study_status(sid, "finished")


def command(session: Path, *args: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tui_trainer", "runs", "--session", str(session),
                    *args], cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "COLUMNS": "200"})
    return time.perf_counter() - t0


def median_of(repeats: int, fn) -> float:
    return statistics.median(fn() for _ in range(repeats))


def in_process(session: Path) -> dict[str, float]:
    with SessionStore(session, create=False, readonly=True) as store:
        sid = store.studies()[0]["id"]
        t0 = time.perf_counter()
        study.table(store, sid)
        table_s = time.perf_counter() - t0
    with SessionStore(session, create=False, readonly=True, verify=False) as store:
        t0 = time.perf_counter()
        r = reader.SessionReader(store)
        r.tick()
        first_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        r.tick(study=sid)
        ab_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        while r._behind:                     # an older session's runs, caught up tick by tick
            r.tick()
        behind_s = ab_s + time.perf_counter() - t0      # (the A/B tab's tick caught up too)
        unkept = len(r.unkept)
    return {"study_table_s": table_s, "dashboard_first_read_s": first_s,
            "ab_tab_read_s": ab_s, "dashboard_unkept": unkept,
            "dashboard_catch_up_s": behind_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100x2000,301x2000,1000x2000",
                    help="runs x rows, comma separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    out = []
    root = Path(tempfile.mkdtemp(prefix="tui-trainer-long-session-"))
    try:
        for size in args.sizes.split(","):
            n_runs, n_rows = (int(x) for x in size.split("x"))
            session = root / size
            t0 = time.perf_counter()
            build(session, n_runs, n_rows)
            built_s = time.perf_counter() - t0
            mb = (session / "session.sqlite").stat().st_size / 2**20
            r = {"runs": n_runs, "rows_per_run": n_rows, "step_rows": n_runs * n_rows,
                 "db_mib": round(mb), "build_s": built_s,
                 "runs_s": median_of(args.repeats, lambda: command(session)),
                 "runs_json_s": median_of(args.repeats, lambda: command(session, "--json")),
                 **in_process(session)}
            # As a session from before: no kept figures; its engine wrote each finished
            # run's figures (of their day's definition) into its summary.
            con = sqlite3.connect(session / "session.sqlite")
            con.execute("UPDATE runs SET summary = json_set(summary, '$.figures', "
                        "json(k.state)) FROM kept_figures AS k WHERE k.run_id = runs.id")
            con.execute("DELETE FROM kept_figures")
            con.commit()
            con.close()
            older = in_process(session)
            r.update({f"older_{k}": v for k, v in older.items()})
            r["older_first_runs_s"] = command(session)        # computes and keeps
            r["older_second_runs_s"] = command(session)       # reads what it kept
            out.append(r)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                              for k, v in r.items()}), flush=True)
            shutil.rmtree(session)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    print("| runs x rows | step rows | MiB | runs s | runs --json s | study table s | "
          "dashboard first read s | A/B tab s | older: dashboard first read s | older: "
          "dashboard caught up s | older: first runs s | older: second runs s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in out:
        print(f"| {r['runs']} x {r['rows_per_run']} | {r['step_rows']:,} | {r['db_mib']} | "
              f"{r['runs_s']:.2f} | {r['runs_json_s']:.2f} | {r['study_table_s']:.3f} | "
              f"{r['dashboard_first_read_s']:.2f} | {r['ab_tab_read_s']:.3f} | "
              f"{r['older_dashboard_first_read_s']:.2f} | "
              f"{r['older_dashboard_catch_up_s']:.1f} | "
              f"{r['older_first_runs_s']:.2f} | {r['older_second_runs_s']:.2f} |")
    worst = max((r for r in out if r["runs"] >= 1000), key=lambda r: r["runs_s"], default=None)
    if worst is not None:
        ok = max(worst["runs_s"], worst["runs_json_s"]) <= GOAL_S
        print(f"\ngoal: runs and runs --json at most {GOAL_S} s on {worst['runs']} runs: "
              f"{'met' if ok else 'NOT met'}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
