"""Where a forked run's CUDA start goes, and what could be done before Start without holding
GPU memory (issue 34: the first step after Start on CUDA at most 0.5 s).

The warm launcher forks each run from a process that has imported torch but never touched
CUDA (a fork after CUDA has started is unsafe), so every run starts CUDA itself. On an H100
the first step came 1.04 s after Start (benchmarks/first_step.py), against about 0.1 s on
a CPU: about 0.9 s of CUDA's start in the new process. This measures it in children forked
from a parent that, like the launcher, has imported what a run imports and nothing more
(and put it out of the garbage collector's reach, as the launcher does):

- `staged`: at Start the child goes through CUDA's start one stage at a time, each timed:
    driver   torch.cuda.init(): the driver (cuInit) and the device count
    context  the first allocation on the device: its primary context
    cublas   a matmul: cuBLAS's handle and workspace, its kernels loaded
    cudnn    the default net's first convolution, forward and backward, under the default
             config's cuDNN flags: cuDNN's libraries, handle and kernels
  then trains the default config (20 steps, seed 1, device cuda): its first step after the
  stages is what CUDA's start leaves to the run.
- `fresh`: at Start the child trains at once (what the launcher does today).
- `spare-driver`, `spare-context`, `spare-warm`: a spare forked before Start has done the
  stages up to driver / context / cudnn, then waits; at Start it trains.
- `spare`: what the launcher's spare does before Start (tui_trainer.engine.cuda_start.start_cuda: the
  driver and cuDNN's libraries loaded, no context), then waits; at Start it trains.
  `spare+context`: what TUI_TRAINER_SPARE=context's spare does (the same and the device's
  context, made without an allocation), holding GPU memory while it waits. The GPU memory the
  device holds while it waits (nvidia-smi's memory.used, less what was used before the
  children) is what such a spare would hold while nothing trains.
Every run makes what is left of CUDA's start (the context, cuBLAS's and cuDNN's handles,
the kernels of its own shapes) in a thread beside its setup, as the engine does
(engine/cuda_start.py); `spare-alone` is the spare with that turned off
(TUI_TRAINER_CUDA_START=0), as runs were before it, and `spare-handles` the spare with the
handles only (TUI_TRAINER_CUDA_START=handles), as the engine did before the shapes. (On
the H100 this experiment, then a thread of this benchmark's started at Start, brought the
spare's first step from 0.60 to 0.49 s: docs/benchmarks.md.)

Start is the moment the parent tells the child to go; the first step is the moment its
first step row is in the session store (as in first_step.py). Scenarios are interleaved
(the order turns each repeat). Every run trains the same config, so their parameter hashes
must all be equal: a run from a spare trains the same bits as a fresh one (printed).

    OPENBLAS_NUM_THREADS=1 python benchmarks/cuda_start.py [--repeats 3] [--device cuda]
        [--scenarios fresh spare spare-alone ...]

On a machine without a CUDA device it says so and measures nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import select
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tui_trainer.core.session.store import SessionStore
from tui_trainer.engine.cuda_start import start_cuda
from tui_trainer.launcher.server import prepare

STAGES = ("driver", "context", "cublas", "cudnn")
PREPARED = {"fresh": 0, "staged": 0, "spare": 0, "spare+context": 0, "spare-alone": 0,
            "spare-handles": 0, "spare-driver": 1, "spare-context": 2, "spare-warm": 4}
WAIT_S = 120.0          # how long the parent waits for a child's word or its first step


def gpu_memory_mib(index: int) -> float | None:
    """memory.used of the device (MiB), from nvidia-smi: the parent never touches CUDA."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,"
                              "nounits", "-i", str(index)], capture_output=True, text=True,
                             timeout=20, check=True).stdout
        return float(out.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def stage(name: str, device: str) -> None:
    import torch
    if device == "cpu":
        return                     # --device cpu: the plumbing and the CPU's own figure
    if name == "driver":
        torch.cuda.init()
    elif name == "context":
        torch.empty(1, device=device)
        torch.cuda.synchronize(device)
    elif name == "cublas":
        a = torch.randn(64, 64, device=device)
        (a @ a).sum().item()
    elif name == "cudnn":
        from tui_trainer.core.settings import config
        from tui_trainer.engine.knobs import apply_knobs
        from tui_trainer.engine.models import build_model
        cfg = config.DEFAULTS.replace(device=device)
        apply_knobs(cfg, torch.device(device), rank=0)   # the default config's cuDNN flags
        net = build_model(cfg.model, init=cfg.init).to(device)
        x = torch.randn(64, 1, 28, 28, device=device)
        net(x).sum().backward()
        torch.cuda.synchronize(device)


def child(how: str, device: str, session: Path, name: str, word: int, go: int) -> None:
    """Prepares as `how` says, says ready, waits for go, then trains (staged: the stages
    first). Never returns."""
    code = 1
    try:
        import numpy as np
        import torch
        np.random.seed()
        torch.seed()
        timed: dict[str, float] = {}
        for s in STAGES[:PREPARED[how]]:
            stage(s, device)
        if how.startswith("spare") and PREPARED[how] == 0 and device != "cpu":
            start_cuda(context=how == "spare+context")
        os.write(word, b"ready\n")
        if not select.select([go], [], [], WAIT_S)[0] or os.read(go, 1) != b"1":
            os._exit(0)
        if how == "staged":
            for s in STAGES:
                t = time.perf_counter()
                stage(s, device)
                timed[s] = time.perf_counter() - t
        if how in ("spare-alone", "spare-handles"):
            from tui_trainer.core.settings.machine import CUDA_START_ENV, CUDA_STARTS
            os.environ[CUDA_START_ENV] = CUDA_STARTS["off" if how == "spare-alone" else "handles"]
        os.write(word, (json.dumps(timed) + "\n").encode())
        from tui_trainer.core.settings import config
        from tui_trainer.engine.host import run_training
        cfg = config.DEFAULTS.replace(dataset="mnist-sample", device=device, max_steps=20,
                                      log_every=1, fingerprint_every=5, seed=1)
        run_training(cfg, session, name=name, echo=None)
        code = 0
    except BaseException:             # noqa: BLE001 - a forked child never returns
        import traceback
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def lines(fd: int, n: int) -> list[str]:
    got = b""
    deadline = time.monotonic() + WAIT_S
    while got.count(b"\n") < n:
        if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise SystemExit("a child said nothing within its time")
        chunk = os.read(fd, 4096)
        if not chunk:
            raise SystemExit("a child ended before saying what it did (its traceback above)")
        got += chunk
    return got.decode().splitlines()


def one(how: str, device: str, index: int, session: Path, name: str, base: float | None
        ) -> dict:
    word_r, word_w = os.pipe()
    go_r, go_w = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.close(word_r)
        os.close(go_w)
        child(how, device, session, name, word_w, go_r)
    os.close(word_w)
    os.close(go_r)
    try:
        lines(word_r, 1)                              # prepared, waiting
        time.sleep(0.3)
        used = gpu_memory_mib(index)
        held = None if used is None or base is None else used - base
        t0 = time.time()
        os.write(go_w, b"1")                          # Start
        timed = json.loads(lines(word_r, 1)[0])    # (said only after go)
        db = sqlite3.connect(session / "session.sqlite", timeout=30)
        try:
            deadline = time.monotonic() + WAIT_S
            while True:
                row = db.execute("SELECT min(s.t), r.id FROM steps s JOIN runs r ON "
                                 "r.id = s.run_id WHERE r.name = ?", (name,)).fetchone()
                if row[0] is not None:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"{name}: no first step within {WAIT_S:.0f} s")
                time.sleep(0.005)
        finally:
            db.close()
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{name}: the child failed (its traceback above)")
        return {"first": row[0] - t0, "run": row[1], "held_mib": held, "stages": timed}
    finally:
        os.close(word_r)
        os.close(go_w)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scenarios", nargs="+", choices=list(PREPARED), default=list(PREPARED))
    ap.add_argument("--device", default="cuda", help="cuda or cuda:N (default cuda); cpu "
                    "runs the same children with no CUDA to start (the rest of the first step)")
    args = ap.parse_args()
    why = prepare()         # as the launcher: the imports, no thread, out of gc's reach
    if why:
        raise SystemExit(f"the parent cannot fork safely: {why} (OPENBLAS_NUM_THREADS=1?)")
    import torch
    try:
        if args.device != "cpu" and torch.cuda.device_count() == 0:  # NVML's: no CUDA start
            print("no CUDA device here: nothing to measure (run this where a GPU is)")
            return
        assert not torch.cuda.is_initialized(), "the parent must not start CUDA (it forks)"
        index = torch.device(args.device).index or 0
        base = gpu_memory_mib(index) if args.device != "cpu" else None
        print(f"{torch.cuda.device_count()} CUDA device(s) (NVML); torch {torch.__version__}; "
              f"device {args.device}: {base} MiB used before the children")
        measure(args, index, base)
    finally:
        gc.unfreeze()       # torn down at exit as usual (triton's bindings count on it)


def measure(args: argparse.Namespace, index: int, base: float | None) -> None:
    results: dict[str, list[dict]] = {how: [] for how in args.scenarios}
    order = list(args.scenarios)
    with tempfile.TemporaryDirectory() as tmp:
        session = Path(tmp)
        SessionStore(session).close()
        for r in range(args.repeats):
            for how in order[r % len(order):] + order[:r % len(order)]:
                res = one(how, args.device, index, session, f"{how} {r + 1}", base)
                results[how].append(res)
                said = ", ".join(f"{k} {v:.3f}" for k, v in res["stages"].items())
                held = "?" if res["held_mib"] is None else f"{res['held_mib']:.0f} MiB"
                print(f"{how}: first step after {res['first']:.3f} s; GPU memory held while "
                      f"waiting {held}" + (f"; stages (s): {said}" if said else ""),
                      flush=True)
        with SessionStore(session) as store:
            prints: dict[tuple, set[str]] = {}      # the bits trained -> the scenarios
            for how, rs in results.items():
                for res in rs:
                    bits = tuple(f["sha256"] for f in store.fingerprints(res["run"]))
                    prints.setdefault(bits, set()).add(how)
    print()
    for how, rs in results.items():
        firsts = [x["first"] for x in rs]
        held = [x["held_mib"] for x in rs if x["held_mib"] is not None]
        line = (f"{how:14s} first step median {statistics.median(firsts):.3f} s "
                f"(min {min(firsts):.3f}, max {max(firsts):.3f}); held while waiting "
                f"{statistics.median(held):.0f} MiB" if held else
                f"{how:14s} first step median {statistics.median(firsts):.3f} s "
                f"(min {min(firsts):.3f}, max {max(firsts):.3f})")
        if how == "staged":
            for s in STAGES:
                line += f"\n{'':14s}   {s}: median {statistics.median(x['stages'][s] for x in rs):.3f} s"
        print(line)
    print(f"goal: first step after Start at most 0.5 s without holding GPU memory while "
          f"nothing trains; every run bit-identical: {'yes' if len(prints) == 1 else 'NO'}")
    if len(prints) > 1:           # which preparation changed the bits (cuBLAS's workspace?)
        for bits, hows in prints.items():
            print(f"  final hash {bits[-1][:12]}: {', '.join(sorted(hows))}")


if __name__ == "__main__":
    main()
