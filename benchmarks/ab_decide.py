"""A knob's price: how long until a verdict, a study that decides (`ab --decide`, issue 67)
against today's fixed-round study, in one run on one machine; and how often a deciding
study of two equal arms says "faster" or "slower".

    python benchmarks/ab_decide.py [--price amp=bf16] [--aa 40] [--steps 60] [--fixed]
                                   [--windows] [--hog] [--record FILE] [--aa-only]
                                   [--peer DIR] [--set KEY=VALUE ...]

Each study is `tui-trainer ab` on the shipped sample, the default config, timed from the
command to its last line (what a person waits for: the launcher's start, every run, the
table). `--price`: a knob with a price (bf16 autocast: 0.5x on a CPU that emulates it, a
few per cent on one with bf16 hardware). The A/A arm is `eval_mode=inference_mode`: it
changes the evaluation only, so the training's samples/s of both arms is one config's.
`--fixed` also runs both as the fixed study of 6 rounds of 200 steps (the default before).
`--hog` runs every study beside one CPU hog (a busy loop). `--aa N` runs N deciding A/A
studies more and counts their verdicts (each an error where
it says faster or slower). `--set` changes the base of every study (`--set model=examples`:
pytorch/examples' net, whose steps are 6x longer). Every study's contention is printed: a
loaded study is not a quiet machine's figure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tui_trainer.core.processes import contention
from tui_trainer.core.settings import hardware

AA = "eval_mode=inference_mode"
# A windowed A/A: the base's own seed (the variant is the base's config to the letter; the
# windows time training steps, where the evaluation mode never runs)
AA_WINDOWS = "seed=1"


SETS: list[str] = []          # --set: more of the base, for every study


def study(session: Path, vary: str, decide: bool | str, steps: int,
          tree: str | None = None) -> dict:
    """One study, timed from the command to its last line; decide: True (whole runs),
    "windows" (tui_trainer/pricing.py) or False (the fixed 6 rounds). `tree`: another
    checkout's tui_trainer runs it (its launcher and arms too), with this venv."""
    args = [sys.executable, "-m", "tui_trainer", "ab", "--session", str(session), "--json",
            "--set", "dataset=mnist-sample", "--vary", vary]
    for kv in SETS:
        args += ["--set", kv]
    # (--windows: the flag of a price in windows before it was --decide's own way, which
    # this tree still takes and a peer tree from before needs)
    args += ["--decide", "--windows"] if decide == "windows" else \
        ["--decide", "--whole-runs", "--steps", str(steps)] if decide else \
        ["--repeats", "6", "--steps", str(steps)]
    before = contention.snapshot()
    t0 = time.monotonic()
    env = None if tree is None else {**os.environ, "PYTHONPATH": tree}
    p = subprocess.run(args, capture_output=True, text=True, timeout=1800,
                       stdin=subprocess.DEVNULL, cwd=tree, env=env)
    wall = time.monotonic() - t0
    load = contention.between(before, contention.snapshot())
    if p.returncode not in (0, 3):
        raise SystemExit(f"ab failed ({p.returncode}): {p.stderr[-2000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    if decide == "windows" and isinstance(out, list):     # (a knob windows cannot price,
        w = out[0]                                        # num_threads: whole runs, below)
        return {"wall": wall, "rounds": w["pairs"], "verdict": w["verdict"],
                "ratio": w["ratio"], "low": w["low"], "high": w["high"], "load": load,
                "loaded_rounds": w["loaded_pairs"], "startup": w["startup"],
                "ratios": w.get("ratios") or []}
    row = out["rows"][1]
    iv = (row.get("intervals") or {}).get("samples_per_s") or {}
    return {"wall": wall, "rounds": out["repeats"], "verdict":
            (row.get("verdicts") or {}).get("samples_per_s"), "ratio": iv.get("ratio"),
            "low": iv.get("low"), "high": iv.get("high"), "load": load,
            "loaded_rounds": len(row.get("loaded_rounds") or [])}


def line(name: str, r: dict) -> str:
    interval = f"{r['ratio']:.2f}x [{r['low']:.2f}-{r['high']:.2f}]" if r["low"] else \
        f"{r['ratio']:.2f}x" if r["ratio"] else "-"
    mark = " LOADED" if contention.loaded(r["load"]) else ""
    return (f"| {name} | {r['wall']:.1f} s | {r['rounds']} | {interval} {r['verdict']} | "
            f"{r['loaded_rounds']} | {contention.text(r['load'])}{mark} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--price", default="amp=bf16")
    ap.add_argument("--aa", type=int, default=0, help="deciding A/A studies to count")
    ap.add_argument("--steps", type=int, default=60, help="steps a run of a deciding study")
    ap.add_argument("--fixed", action="store_true", help="also the fixed 6 x 200 studies")
    ap.add_argument("--windows", action="store_true",
                    help="also (and with --aa: only) the windowed prices (--decide "
                         "--windows): two long-lived processes timed in alternating windows")
    ap.add_argument("--hog", action="store_true",
                    help="every study beside one CPU hog (a busy loop in another process)")
    ap.add_argument("--record", metavar="FILE",
                    help="with --windows --aa: each A/A's pairs' log ratios, a JSON line a "
                         "study (benchmarks/look_levels.py --pairs reads them)")
    ap.add_argument("--aa-only", action="store_true",
                    help="with --aa: only the A/A series, not the table's studies first "
                         "(with --set model=examples its whole-run studies take minutes)")
    ap.add_argument("--peer", metavar="DIR",
                    help="with --aa: each A/A also run by the tree checked out in DIR (git "
                         "worktree add DIR REV), in turns, which first alternating: its "
                         "peer in the same run")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="the base of every study (repeatable)")
    args = ap.parse_args()
    SETS.extend(args.set)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.hog else None
    try:
        measure(args)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()


def measure(args: argparse.Namespace) -> None:
    print(f"machine: {hardware.this_cpu().describe()}"
          + (f"; base: {', '.join(SETS)}" if SETS else ""), flush=True)
    print("| study | wall time to its verdict | rounds | samples/s ratio and verdict | "
          "loaded rounds | contention |")
    print("| --- | ---: | ---: | --- | ---: | --- |", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        runs = [(f"{args.price}, --decide", args.price, True, args.steps),
                (f"A/A ({AA}), --decide", AA, True, args.steps)]
        if args.windows:
            runs += [(f"{args.price}, --decide --windows", args.price, "windows", 0),
                     (f"A/A ({AA_WINDOWS}), --decide --windows", AA_WINDOWS, "windows", 0)]
        if args.fixed:
            runs += [(f"{args.price}, 6 rounds x 200 steps", args.price, False, 200),
                     (f"A/A ({AA}), 6 rounds x 200 steps", AA, False, 200)]
        for i, (name, vary, decide, steps) in enumerate([] if args.aa_only else runs):
            print(line(name, study(Path(tmp) / f"s{i}", vary, decide, steps)), flush=True)
        if args.aa:
            trees = {"this tree": None, **({f"peer {args.peer}": args.peer} if args.peer
                                           else {})}
            counts: dict[str, dict[str, int]] = {name: {} for name in trees}
            walls: dict[str, list[float]] = {name: [] for name in trees}
            for i in range(args.aa):
                order = list(trees.items())
                for name, tree in order[::-1] if i % 2 else order:
                    r = study(Path(tmp) / f"aa{i}-{len(walls[name])}-{tree is None}",
                              AA_WINDOWS if args.windows else AA,
                              "windows" if args.windows else True, args.steps, tree)
                    counts[name][r["verdict"]] = counts[name].get(r["verdict"], 0) + 1
                    walls[name].append(r["wall"])
                    if args.record and r.get("ratios") and tree is None:
                        with open(args.record, "a") as f:
                            f.write(json.dumps([math.log(x) for x in r["ratios"] if x])
                                    + "\n")
                    print(line(f"A/A {i + 1} of {args.aa}"
                               + (f", {name}" if args.peer else ""), r), flush=True)
            for name in trees:
                w, c = walls[name], counts[name]
                wrong = c.get("faster", 0) + c.get("slower", 0)
                print(f"\n{name}: {args.aa} deciding A/A studies: {c}; faster or slower in "
                      f"{wrong} ({wrong / args.aa:.1%}); wall time mean "
                      f"{sum(w) / len(w):.1f} s, median {sorted(w)[len(w) // 2]:.1f} s, "
                      f"max {max(w):.1f} s, within 20 s {sum(x <= 20 for x in w)} of {len(w)}")


if __name__ == "__main__":
    main()
