"""Does activation checkpointing pay on this machine? One table per net and batch size.

For each (net, batch): an A/B study of activation_checkpointing off (the base, the
reference in the same run) against full and selective, in interleaved rounds, each arm a
fresh process (`tui-trainer ab --json`): the step time as samples/s and the process's peak
memory (RSS high-water mark on the CPU, the CUDA peak on a GPU), each as a ratio to off with
its interval, and whether the arm is bit-identical to off. Then one step of each arm's
first run under MemTracker (`tui-trainer memory --json`): the peak of training itself and
the activations kept for backward.

    python benchmarks/checkpointing.py [--nets grokking,examples] [--batches 256,1024]
                                       [--steps 30] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def tui(*args: str) -> dict:
    p = subprocess.run([sys.executable, "-m", "tui_trainer", *args, "--json"],
                       capture_output=True, text=True, timeout=3600)
    if p.returncode not in (0, 3):
        raise SystemExit(f"{' '.join(args)} failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def ratio(row: dict, key: str) -> str:
    iv = (row.get("intervals") or {}).get(key)
    if not iv:
        r = (row.get("ratios") or {}).get(key)
        return "1.00 (base)" if r is None else f"{r:.2f}"
    if iv["low"] is None:
        return f"{iv['ratio']:.2f}"
    return f"{iv['ratio']:.2f} [{iv['low']:.2f}-{iv['high']:.2f}]"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nets", default="grokking,examples")
    ap.add_argument("--batches", default="256,1024")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"{'net':<9} {'batch':>5} {'arm':<10} {'samples/s ratio':<20} {'RSS peak ratio':<20} "
          f"{'bits':<10} {'peak MiB':>9} {'activations MiB':>16}")
    for net in args.nets.split(","):
        for batch in args.batches.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                session = str(Path(tmp) / "s")
                study = tui("ab", "--session", session, "--set", "dataset=mnist-sample",
                            "--set", f"model={net}", "--set", f"batch_size={batch}",
                            "--set", "log_every=5", "--set", "deterministic=on",
                            "--set", "fingerprint_every=10",
                            "--vary", "activation_checkpointing=full,selective",
                            "--steps", str(args.steps), "--repeats", str(args.repeats))
                for row in study["rows"]:
                    run = row["runs"][0]
                    m = tui("memory", str(run), "--session", session)
                    acts = m["categories"].get("activations (kept for backward)", 0)
                    arm = "off" if not row["position"] else row["label"].split("=")[-1]
                    bits = "(base)" if not row["position"] else \
                        ("identical" if row["bit_identical"] else
                         f"differ@{row['first_difference']}")
                    print(f"{net:<9} {batch:>5} {arm:<10} {ratio(row, 'samples_per_s'):<20} "
                          f"{ratio(row, 'peak_memory_mib'):<20} {bits:<10} "
                          f"{m['total'] / 2**20:>9.1f} {acts / 2**20:>16.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
