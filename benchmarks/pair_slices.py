"""A windowed price's pairs, slice by slice (issue 67): how much a pair's ratio spreads and
how long a pair takes, for each count of a later pair's warm-up steps, in one run.

    python benchmarks/pair_slices.py [--warmups 1,3] [--pairs 160] [--set KEY=VALUE ...]
                                     [--out FILE]

A/A pairs (the sample's config against its own seed=1), run as `pricing.price` runs them:
two new processes a pair, forked by the warm launcher, warmed up side by side, then each
arm's slices in turns (ABBA ...). Nothing stops early, so no pair is kept or dropped for
what it read. The warm-up counts take turns in blocks of four pairs (each block has every
order of which arm forks first and which slice goes first). Printed per count: the pairs'
log sd (what the stopping rule has to see through), the seconds a pair, its untimed
part, and each slice's time over its pair's median slice by position (a new process's
first slices run slow). `--out`: every slice, a JSON line a pair.

With `--set model=examples` and the kernels held to AVX2 (`ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2`), steps are about as long as the default net's on an AVX2 CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from typing import Any

from tui_trainer import pricing
from tui_trainer.core.settings import config, hardware
from tui_trainer.launcher.client import WarmLauncher


def record(warmups: list[int], n: int, sets: dict[str, str]) -> list[dict[str, Any]]:
    base = config.from_dict({**config.RunConfig().to_dict(), "dataset": "mnist-sample",
                             **sets})
    variant = base.replace(seed=1)
    warm = WarmLauncher.shared()
    warm.wait_ready(120)
    rows: list[dict[str, Any]] = []
    arms: list[pricing.Arm] = []
    try:
        arms = pricing._ready_pair(base, variant, warm)
        for arm in arms:
            for _ in range(2):
                w = arm.ask(pricing.WARMUP_STEPS)
                arm.warm.append(w["s"] / max(1, w["steps"]))
        per_step = max(arm.warm[-1] for arm in arms)
        size, slices = pricing.slicing(per_step)
        for p in range(1, n + 1):
            fresh = warmups[(p // 4) % len(warmups)]
            t0 = time.monotonic()
            arms = pricing._ready_pair(base, variant, warm, ending=arms,
                                       variant_first=p // 2 % 2 == 1)
            for arm in arms:
                arm.send(fresh)
            for arm in arms:
                arm.answer(pricing.WINDOW_WAIT_S)
            t1 = time.monotonic()
            seq = []
            for i in pricing.turns(slices, flip=p % 2 == 1):
                w = arms[i].ask(size)
                seq.append([i, w["samples"], w["s"]])
            rows.append({"warmup": fresh, "per_step": per_step, "size": size,
                         "slices": seq, "untimed_s": t1 - t0,
                         "pair_s": time.monotonic() - t0})
    finally:
        for arm in arms:
            arm.close()
        warm.close()
    return rows


def log_ratio(seq: list[list[float]]) -> float:
    rate = [sum(n for i, n, _ in seq if i == arm) / sum(s for i, _, s in seq if i == arm)
            for arm in (0, 1)]
    return math.log(rate[1] / rate[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warmups", default="1,3", help="a later pair's warm-up steps to try")
    ap.add_argument("--pairs", type=int, default=160)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", metavar="FILE", help="every pair's slices, a JSON line each")
    args = ap.parse_args()
    warmups = [int(x) for x in args.warmups.split(",")]
    sets = dict(kv.split("=", 1) for kv in args.set)
    rows = record(warmups, args.pairs, sets)
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"machine: {hardware.this_cpu().describe()}; base: sample"
          + "".join(f", {k}={v}" for k, v in sets.items())
          + f"; {rows[0]['per_step'] * 1000:.1f} ms a step, slices of {rows[0]['size']} "
          f"step(s), {len(rows[0]['slices']) // 2} an arm a pair")
    print("| warm-up steps | pairs | log sd | seconds a pair | untimed a pair | "
          "each slice over its pair's median, by position |")
    print("| ---: | ---: | ---: | ---: | ---: | --- |")
    for fresh in warmups:
        mine = [r for r in rows if r["warmup"] == fresh]
        ratios = [log_ratio(r["slices"]) for r in mine]
        where = [statistics.mean(r["slices"][k][2] / statistics.median(
            s for _, _, s in r["slices"]) for r in mine) for k in range(len(mine[0]["slices"]))]
        print(f"| {fresh} | {len(mine)} | {statistics.pstdev(ratios):.4f} | "
              f"{statistics.mean(r['pair_s'] for r in mine):.3f} | "
              f"{statistics.mean(r['untimed_s'] for r in mine):.3f} | "
              + " ".join(f"{x:.2f}" for x in where) + " |")


if __name__ == "__main__":
    main()
