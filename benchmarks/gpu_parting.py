"""Where two runs of one config part on a GPU, and why (issue 58, point 1).

`explain` has named the op two runs part at only on a planted CPU op (tests/plant). Here,
for each case, two runs of one config are trained on CUDA (`tui-trainer run`), then
`tui-trainer explain 1 2` is timed from the command to its last line and its answer kept:
whether the runs parted, at which step, in which op (module, call site, how many elements
differ and by how much), and what each fix does to that op alone (explain's replays run it
on its recorded inputs under deterministic=warn, cudnn_deterministic=on and
cudnn_benchmark=off: raises, agrees, or still differs). `explain --evidence` and the
answer's words are saved beside the JSON: what the screen's Divergence tab shows.

Cases, the likeliest to part first (each as the `gpu-determinism` study's base: deterministic
algorithms and cuDNN's deterministic choice off, cuDNN's autotuner on, the resident loader):
  index_add       a net of the user's own file that pools with index_add_ in its forward
                  (experiments/models/index_add.py; experiments/gpu-parting-index-add.toml):
                  CUDA adds with atomics, 16 additions into each cell in any order
  index_add_warn  the same with deterministic = warn: CUDA's sorted index_add_, which
                  should agree
  resnet          the residual net at batch 256: adaptive average pooling, whose CUDA
                  backward adds with atomics, BatchNorm, convolutions chosen by timing
  resnet_b1024    the same at batch 1024 (more atomic adds to each address)
  resnet_chosen   the same with cuDNN's heuristics choosing (cudnn_benchmark off): what is
                  left is the pooling's backward
  resnet_warn     deterministic = warn (the deterministic kernels that exist; the pooling
                  backward has none, and warns): do the runs still part, and where

    python benchmarks/gpu_parting.py OUT [--cases index_add,resnet] [--steps 40]

Writes OUT/CASE.json (the answer), OUT/CASE.txt (its words) and OUT/CASE-evidence.txt, and
prints one line a case; after index_add, the shipped config's one command (`tui-trainer
repro --config gpu-parting-index-add`, from another folder) timed, its words in
OUT/repro-index-add.txt. Needs CUDA; where there is none it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tui_trainer.core.analysis.explain import evidence, words

BASE = ["dataset=mnist-sample", "model=resnet", "device=cuda", "deterministic=off",
        "cudnn_deterministic=false", "cudnn_benchmark=true", "loader=resident",
        "batch_size=256", "log_every=5", "fingerprint_every=5", "seed=1"]
INDEX_ADD = Path(__file__).resolve().parents[1] / "experiments/models/index_add.py"
CASES = {
    "index_add": [f"model={INDEX_ADD}:IndexAddNet"],
    "index_add_warn": [f"model={INDEX_ADD}:IndexAddNet", "deterministic=warn"],
    "resnet": [],
    "resnet_b1024": ["batch_size=1024"],
    "resnet_chosen": ["cudnn_benchmark=false"],
    "resnet_warn": ["deterministic=warn"],
}


def tui(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tui_trainer", *args], capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ))


def sets(values: list[str]) -> list[str]:
    return [x for v in values for x in ("--set", v)]


def summary(result: dict[str, Any]) -> str:
    """One line: the verdict, the step, the op and where it is, its difference, the fixes."""
    hunt = result.get("hunt") or {}
    op = result.get("op") or hunt.get("op") or {}
    step = result.get("step", hunt.get("step", "-"))
    where = f"{op.get('name', '-')} in {op.get('module') or '-'} at {op.get('source') or '-'}"
    diff = op.get("difference") or hunt.get("difference") or {}
    differs = (f"{diff.get('elements', '?')} elements, max |d| {diff.get('max_abs', '?')}"
               if diff else "-")
    fixes = (hunt.get("fixes") or op.get("fixes") or (op.get("why") or {}).get("fixes")
             or {})
    tried = ", ".join(f"{t['key']}={t['value']}: {t['result']}"
                      for t in fixes.get("tried", [])) or "-"
    return (f"verdict {result.get('verdict')}, step {step}; op {where}; {differs}; "
            f"fixes: {tried}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--device", default="cuda", help="cuda; cpu checks this script here")
    args = ap.parse_args()
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_parting: no CUDA device here (torch.cuda.is_available() is False)",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    here = torch.cuda.get_device_name(0) if args.device == "cuda" else "the CPU"
    print(f"{here}, torch {torch.__version__}; {args.steps} steps a run", flush=True)
    for name in args.cases.split(","):
        common = [*BASE, *CASES[name], f"max_steps={args.steps}", f"device={args.device}"]
        with tempfile.TemporaryDirectory() as tmp:
            session = str(Path(tmp) / "s")
            t0 = time.perf_counter()
            runs = [tui("run", "--session", session, *sets(common)) for _ in range(2)]
            train_s = time.perf_counter() - t0
            if any(r.returncode for r in runs):
                bad = next(r for r in runs if r.returncode)
                print(f"{name}: training failed: {bad.stderr[-400:]}", flush=True)
                continue
            t0 = time.perf_counter()
            e = tui("explain", "1", "2", "--session", session, "--json")
            command_s = time.perf_counter() - t0
        if e.returncode not in (0, 3):
            print(f"{name}: explain failed (exit {e.returncode}): {e.stderr[-400:]}",
                  flush=True)
            continue
        result = json.loads(e.stdout)
        (args.out / f"{name}.json").write_text(json.dumps(result, indent=1, default=str))
        # what the Divergence tab and `explain` / `explain --evidence` print of it
        (args.out / f"{name}.txt").write_text(words(result) + "\n")
        (args.out / f"{name}-evidence.txt").write_text("\n".join(evidence(result)) + "\n")
        print(f"{name}: two runs {train_s:.1f} s; explain {command_s:.1f} s from the command "
              f"to its last line (its own cost {result.get('cost_s') or 0:.1f} s); "
              f"{summary(result)}", flush=True)
        if name == "index_add":
            shipped(args.out, args.device)
    return 0


def shipped(out: Path, device: str) -> None:
    """The shipped one-command answer, as a user runs it from another folder: `tui-trainer
    repro --config gpu-parting-index-add`, timed from the command to its last line, its
    words kept (OUT/repro-index-add.txt)."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "tui_trainer", "repro", "--session",
                            str(Path(tmp) / "s"), "--config", "gpu-parting-index-add",
                            "--set", f"device={device}"], capture_output=True, text=True,
                           timeout=300, cwd=tmp, env=dict(os.environ))
        took = time.perf_counter() - t0
    (out / "repro-index-add.txt").write_text(r.stdout + r.stderr)
    last = (r.stdout.strip().splitlines() or ["-"])[-1]
    print(f"repro --config gpu-parting-index-add: exit {r.returncode} in {took:.1f} s from "
          f"the command to its last line; {last}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
