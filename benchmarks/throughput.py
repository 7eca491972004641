"""Throughput: the reference loop against this engine, in one process, same model, batch size
and data.

- reference: the pytorch/examples mnist/main.py loop: torchvision per-sample transforms in a
  DataLoader, `loss.item()` every step, nothing recorded.
- engine: `tui-trainer`'s loop with the same settings, recording everything into a real
  session store (metrics at log points, fingerprints, a checkpoint, heartbeats).
- engine-resident: the same engine with `loader = resident`.
- engine-resident-cl: resident plus `channels_last = true`.
- preset-fastest-cpu: the shipped `fastest-cpu` preset as it is (its own batch size, bf16
  autocast, channels_last, resident data, deterministic), against the same reference.

The three are interleaved (A B C A B C ...) so that drift in the machine's speed hits all
alike, and the median of the repeats is reported. Goals: engine overhead under 2% of the
reference; resident at least 3x the reference's samples/s at batch size 256. The fastest-cpu
preset's samples/s is shown; its goal is time to accuracy (benchmarks/time_to_accuracy.py).

    python benchmarks/throughput.py [--dataset fashion-mnist] [--batch-size 256]
                                    [--steps 200] [--repeats 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from tui_trainer.core.settings.config import RunConfig
from tui_trainer.engine.data import load_datasets, make_loaders
from tui_trainer.engine.models import build_model
from tui_trainer.engine.host import run_training


def reference(cfg: RunConfig, device: torch.device, steps: int) -> float:
    """pytorch/examples style; returns samples/s over `steps` steps (after 5 warm-up)."""
    torch.manual_seed(cfg.seed)
    loaders = make_loaders(cfg, device)     # the same torchvision datasets and transforms
    train_loader = torch.utils.data.DataLoader(loaders.train.dataset, batch_size=cfg.batch_size,
                                               shuffle=True, num_workers=cfg.num_workers)
    model = build_model(cfg.model).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    model.train()
    done, samples, t0 = 0, 0, None
    while done < steps + 5:
        for data, target in train_loader:
            if done == 5:
                t0, samples = time.perf_counter(), 0
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            loss.item()                      # the reference logs every step
            samples += len(target)
            done += 1
            if done == steps + 5:
                break
    return samples / (time.perf_counter() - t0)


def engine(cfg: RunConfig, steps: int, session: Path) -> float:
    warm = run_training(cfg.replace(max_steps=5), session, echo=None)   # same warm-up
    del warm
    summary = run_training(cfg.replace(max_steps=steps), session, echo=None)
    return summary.samples_per_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="fashion-mnist")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="grokking")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    base = RunConfig(dataset=args.dataset, batch_size=args.batch_size, model=args.model,
                     device=args.device, deterministic="off", seed_workers=False,
                     num_workers=0, augment="off", eval_every=0, log_every=10,
                     fingerprint_every=50, checkpoint_every=0, epochs=1000)
    device = torch.device(args.device)
    _, _, info = load_datasets(base)
    print(f"data: {info.description}; model {args.model}; batch {args.batch_size}; "
          f"{args.steps} steps x {args.repeats} repeats; device {args.device} "
          f"({torch.get_num_threads()} threads); torch {torch.__version__}", flush=True)
    results: dict[str, list[float]] = {"reference": [], "engine": [], "engine-resident": [],
                                       "engine-resident-cl": [], "preset-fastest-cpu": []}
    from tui_trainer.core.settings.config import load
    from tui_trainer.core.settings.presets import resolve
    preset = load(resolve("fastest-cpu"), [f"dataset={args.dataset}", "eval_every=0",
                                           "epochs=1000", "checkpoint_every=0",
                                           f"device={args.device}"])
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            results["reference"].append(reference(base, device, args.steps))
            results["engine"].append(engine(base, args.steps, Path(tmp) / f"s{i}"))
            results["engine-resident"].append(
                engine(base.replace(loader="resident"), args.steps, Path(tmp) / f"r{i}"))
            results["engine-resident-cl"].append(
                engine(base.replace(loader="resident", channels_last=True), args.steps,
                       Path(tmp) / f"c{i}"))
            results["preset-fastest-cpu"].append(engine(preset, args.steps, Path(tmp) / f"p{i}"))
            print("  repeat", i + 1, {k: round(v[-1]) for k, v in results.items()}, flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    ref = med["reference"]
    overhead = (ref - med["engine"]) / ref
    speedup = max(med["engine-resident"], med["engine-resident-cl"]) / ref
    print(f"{'variant':<19} {'samples/s (median)':>19} {'vs reference':>13}")
    for k, v in med.items():
        print(f"{k:<19} {v:>19,.0f} {v / ref:>12.2f}x")
    per_repeat = [(r - e) / r for r, e in zip(results["reference"], results["engine"])]
    print(f"engine overhead: {overhead:+.1%} (each repeat: "
          + ", ".join(f"{o:+.1%}" for o in per_repeat) + ") (goal < 2%)  -> "
          f"{'MET' if overhead < 0.02 else 'NOT MET'}")
    # (the resident goal is set at batch 256: at smaller batches the per-step work that
    # the resident loader does not remove is a larger share, and it is not judged there)
    print(f"best resident speed-up: {speedup:.2f}x (goal >= 3x at batch 256)  -> "
          + (("MET" if speedup >= 3 else "NOT MET") if args.batch_size == 256 else
             f"not judged at batch {args.batch_size}"))
    fastest = med["preset-fastest-cpu"] / ref
    # (the preset is tuned for time to accuracy since issue 34, a net twice the size and
    # three epochs: its goal is in benchmarks/time_to_accuracy.py, against the peer)
    print(f"fastest-cpu preset (model {preset.model}, batch {preset.batch_size}, amp "
          f"{preset.amp}): {fastest:.2f}x the reference's samples/s")
    if args.json:
        print(json.dumps({"median_samples_per_s": med, "overhead": overhead,
                          "resident_speedup": speedup, "runs": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
