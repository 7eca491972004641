"""Time to 98% eval accuracy on the shipped MNIST sample, for each shipped preset, and the
samples/s of the fastest CPU preset against the pytorch/examples-style loop.

Each preset trains on the sample (8,000 train / 2,000 eval digits) with an evaluation every
epoch (`--eval-every`), for `--epochs` epochs, in its own process (warm-started: no
import time counted). Its time to 98% is the training time (the step rows' `elapsed`, the
wall clock from the first step, evaluations included) at the first evaluation at or above
98%. The presets run in rounds, interleaved, and the median of the rounds is reported.

    python benchmarks/time_to_accuracy.py [--rounds 2] [--epochs 15] [--target 98]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from tui_trainer.core import config
from tui_trainer.core import figures
from tui_trainer.core.presets import resolve
from tui_trainer.core.store import SessionStore
from tui_trainer.core.supervisor import WarmLauncher, launch, train_args

PRESETS = ("baseline", "fastest-cpu", "amp", "fastest-gpu")


def one(session: Path, store: SessionStore, warm: WarmLauncher, preset: str, epochs: int,
        every: int) -> tuple[float | None, float, float, int]:
    cfg = config.load(resolve(preset), [f"epochs={epochs}", "dataset=mnist-sample",
                                   f"eval_every={every}", "eval_samples=0", "max_steps=0"])
    run_id = store.create_run(cfg.to_dict(), name=Path(preset).stem)
    proc = launch(session, train_args(run_id), store.log_path(run_id), warm=warm)

    def hit() -> dict | None:
        return next((e for e in store.evals(run_id) if e["accuracy"] is not None
                     and 100 * e["accuracy"] >= TARGET), None)

    while proc.poll() is None:          # stopped once it is there: the rest is not timed
        if hit() is not None:
            proc.terminate()
            proc.wait()
            break
        time.sleep(0.2)
    found, run = hit(), store.run(run_id)
    evals = store.evals(run_id)
    best = max((100 * e["accuracy"] for e in evals if e["accuracy"] is not None),
               default=float("nan"))
    speed = figures.run_figures(store, run_id)["samples_per_s"] or float("nan")
    # wall time from the run's start (data, model, first steps) to that evaluation's row
    return (found["t"] - run["started"] if found else None, best, speed, run_id)


TARGET = 98.0


def main() -> None:
    global TARGET
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--eval-every", type=int, default=1, help="epochs between evaluations")
    ap.add_argument("--target", type=float, default=98.0)
    ap.add_argument("--presets", nargs="*", default=list(PRESETS))
    args = ap.parse_args()
    TARGET = args.target
    warm = WarmLauncher()
    warm.start()
    warm.wait_ready(120)
    results: dict[str, list[tuple[float | None, float, float]]] = {p: [] for p in args.presets}
    with tempfile.TemporaryDirectory() as tmp:
        session = Path(tmp)
        with SessionStore(session) as store:
            for r in range(args.rounds):
                order = args.presets if r % 2 == 0 else args.presets[::-1]
                for preset in order:
                    t, best, sps, run_id = one(session, store, warm, preset, args.epochs,
                                               args.eval_every)
                    results[preset].append((t, best, sps))
                    print(f"round {r + 1}: {preset} (run {run_id}): "
                          + (f"{TARGET:g}% after {t:.1f} s" if t is not None else
                             f"never reached {TARGET:g}% in {args.epochs} epochs")
                          + f", best {best:.2f}%, {sps:,.0f} samples/s", flush=True)
    warm.close()
    print()
    print(f"| preset | time to {TARGET:g}% (median s) | best accuracy % | samples/s |")
    print("| --- | ---: | ---: | ---: |")
    for preset, rows in results.items():
        times = [t for t, _, _ in rows if t is not None]
        shown = f"{statistics.median(times):.1f}" if len(times) == len(rows) else \
            f"not reached in {len(rows) - len(times)} of {len(rows)}"
        print(f"| {preset} | {shown} | {statistics.median(b for _, b, _ in rows):.2f} | "
              f"{statistics.median(s for _, _, s in rows):,.0f} |")


if __name__ == "__main__":
    main()
