"""What a folder of your own images costs before and during training (issue 59's leftover):
`dataset = folder:PATH` against the same digits read from MNIST's IDX files, in the same
run of this script.

The sample's 8,000 training and 2,000 evaluation digits are written once as PNG files, an
ImageFolder tree (train/<class>/, val/<class>/); `--copies K` writes the training digits K
times (other file names), to see how the start grows with the number of files. Then, the
cases interleaved over `--repeats` (each a `tui-trainer run` of its own, log_every = 1):
  idx              dataset = mnist-sample: the same digits from the IDX files (the peer)
  idx-resident     the same, loader = resident (the peer of folder-resident)
  folder           dataset = folder:TREE, the torchvision loader: every image's header is
                   read at start (its mode and size: `_scan`), its pixels as it is drawn
  folder-resident  the same, loader = resident: every image decoded at start
  folder xK        the tree with K copies of the training digits (torchvision loader)
For each: from the command to the first step (the session's stamp of step 1), the whole
command, and samples/s over steps 6 to the end (the median of the rows). The scan alone
(engine.data._scan, in this process, the files in the page cache as they were written) is
timed beside them.

    python benchmarks/folder_cost.py [--repeats 3] [--steps 40] [--copies 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_tree(root: Path, copies: int) -> int:
    """The sample's digits as PNG files, train/ (`copies` times) and val/; how many."""
    from tui_trainer.core.settings import config
    from tui_trainer.engine.data import load_datasets
    train, test, _ = load_datasets(config.load(overrides=["dataset=mnist-sample"]))
    n = 0
    for split, ds, times in (("train", train, copies), ("val", test, 1)):
        for c in range(10):
            (root / split / str(c)).mkdir(parents=True, exist_ok=True)
        for i in range(len(ds)):
            img, label = ds[i]
            for k in range(times):
                img.save(root / split / str(label) / f"{i:05d}-{k}.png")
                n += 1
    return n


def one_run(data: list[str], steps: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        session = Path(tmp) / "s"
        sets = [*data, f"max_steps={steps}", "log_every=1", "eval_samples=1000",
                "device=cpu", "seed=1"]
        t0 = time.time()
        r = subprocess.run([sys.executable, "-m", "tui_trainer", "run", "--session",
                            str(session), "--json", *[x for s in sets for x in ("--set", s)]],
                           capture_output=True, text=True, timeout=600, env=dict(os.environ))
        whole = time.time() - t0
        if r.returncode:
            raise SystemExit(f"{data}: the run failed: {r.stderr[-400:]}")
        conn = sqlite3.connect(session / "session.sqlite")
        rows = conn.execute("SELECT step, t, samples_per_s FROM steps ORDER BY step").fetchall()
        conn.close()
    first = next(t for step, t, _ in rows if step == 1)
    rates = [rate for step, _, rate in rows if step > 5 and rate]
    return {"first_step_s": first - t0, "whole_s": whole,
            "samples_per_s": statistics.median(rates) if rates else float("nan")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--copies", type=int, default=5)
    args = ap.parse_args()
    from tui_trainer.engine.data import _scan
    with tempfile.TemporaryDirectory() as tmp:
        one, many = Path(tmp) / "tree", Path(tmp) / f"tree-x{args.copies}"
        t0 = time.perf_counter()
        files = write_tree(one, 1)
        files_many = write_tree(many, args.copies) if args.copies > 1 else 0
        print(f"trees written in {time.perf_counter() - t0:.1f} s: {files:,} files, "
              f"{files_many:,} with {args.copies} copies of the training digits", flush=True)
        scans = {}
        for name, root in (("folder", one), (f"folder x{args.copies}", many)):
            if not root.exists():
                continue
            took = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                _, _, count = _scan(root / "train", ())
                _scan(root / "val", ())
                took.append(time.perf_counter() - t0)
            scans[name] = (min(took), count)
        cases = {"idx": ["dataset=mnist-sample"],
                 "idx-resident": ["dataset=mnist-sample", "loader=resident"],
                 "folder": [f"dataset=folder:{one}"],
                 "folder-resident": [f"dataset=folder:{one}", "loader=resident"]}
        if args.copies > 1:
            cases[f"folder x{args.copies}"] = [f"dataset=folder:{many}"]
        got: dict[str, list[dict[str, float]]] = {k: [] for k in cases}
        for rep in range(args.repeats):
            for name, data in cases.items():
                got[name].append(one_run(data, args.steps))
                print(f"repeat {rep + 1}, {name}: {json.dumps(got[name][-1])}", flush=True)
    print(f"\n| case | files | scan (headers) | first step after the command | whole command "
          f"({args.steps} steps) | samples/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    counts = {"idx": 0, "idx-resident": 0, "folder": files, "folder-resident": files,
              f"folder x{args.copies}": files_many}
    for name, runs in got.items():
        def med(key: str) -> float:
            return statistics.median(r[key] for r in runs)
        scan = scans.get(name.replace("-resident", ""))
        print(f"| {name} | {counts[name]:,} | "
              f"{f'{scan[0]:.2f} s' if scan and name != 'idx' else '-'} | "
              f"{med('first_step_s'):.2f} s | {med('whole_s'):.2f} s | "
              f"{med('samples_per_s'):,.0f} |")
    print(f"(medians of {args.repeats} repeats, interleaved; the scan the fastest of "
          f"{args.repeats}, in this process)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
