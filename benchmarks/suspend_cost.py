"""What a suspended spare's restore costs, by what it holds (issue 34's goal 4).

TUI_TRAINER_SPARE=suspended (launcher/spare.py, engine/cuda_start.py) makes CUDA's context and cuBLAS's and
cuDNN's handles before Start, then moves them out of the GPU with CUDA's checkpoint API; at
Start it restores them. On the H100 (2026-11-26) that restore took 0.28 s of a first step
0.65 s after Start, against 0.39 s for the same spare kept on the GPU. Whether a smaller or
a fuller spare does better depends on what the restore's time follows: the bytes it copies
back, or a fixed cost. This benchmark forks one process for each variant and repeat (from a
parent that has imported torch and never touches CUDA, as the launcher), and in each:

- `context`: CUDA's context only (a device synchronisation);
- `handles`: what the suspended spare makes (`cuda_start.start_cuda`: the context, cuDNN's
  libraries, cuBLAS's and cuDNN's handles);
- `small-stack`: `handles`, then the context's stack limit (CU_LIMIT_STACK_SIZE, which
  sizes the local memory the context keeps for every thread the GPU can hold) made as small
  as the driver takes before the suspension, and set back to what it was after the restore;
- `shapes`: `handles`, then the default config's kernels loaded (engine.cuda_start's
  `warm_shapes`: one training step and one evaluation batch on a net of constants) before
  the suspension;
- `shapes-small-stack`: both.

Each one: the GPU memory it holds before it is suspended (nvidia-smi, less the figure before
it started), the bytes the suspension moved to the host, the suspension's and the restore's
seconds, then one training step of the default config's net and batch (its first: the
kernels it loads are part of it), and the restore and that step together, which is what a
run given such a spare waits for beyond one given a spare kept on the GPU.

    python benchmarks/suspend_cost.py [--repeats 3] [--variants context handles ...]

Where there is no CUDA device (or no checkpoint API) it says so and measures nothing.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import select
import statistics
import sys
import time

from cuda_start import gpu_memory_mib          # (this folder's: nvidia-smi's memory.used)

VARIANTS = ("context", "handles", "small-stack", "shapes", "shapes-small-stack")
CHILD_S = 120.0             # one variant's process, from its fork to its answer


def _variant(name: str, made_w: int, go_r: int) -> dict:
    """In the forked process: make what `name` holds, say so (made_w), wait until the parent
    has weighed it (go_r), then suspend, restore and time a first step."""
    import torch
    import torch.nn.functional as F
    from tui_trainer.core.settings import config
    from tui_trainer.core.processes.cuda_checkpoint import Helper
    from tui_trainer.core.settings.machine import CUBLAS_DETERMINISTIC
    from tui_trainer.engine.cuda_start import warm_shapes
    from tui_trainer.engine.models import MODELS
    from tui_trainer.engine.optim import make_optimizer
    from tui_trainer.engine.cuda_start import stack_limit, start_cuda
    said: dict = {"variant": name}
    t = time.perf_counter()
    if name == "context":
        torch.cuda.init()
        torch.cuda.synchronize(0)
    else:
        start_cuda(True, True, True, CUBLAS_DETERMINISTIC)
    cfg = config.from_dict({})
    if name.startswith("shapes"):
        stream = torch.cuda.Stream(0)
        with torch.cuda.stream(stream):
            warm_shapes(cfg, torch.device("cuda:0"), 1, make_optimizer)
        stream.synchronize()
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
    stack = None
    if name.endswith("small-stack"):
        stack = stack_limit()
        # the smallest the driver takes: 0 is refused by some drivers, so down in steps
        for value in (0, 16, 256):
            try:
                said["stack_set"] = stack_limit(value)
                break
            except RuntimeError as e:
                said["stack_refused"] = str(e)
        said["stack_was"] = stack
    torch.cuda.synchronize(0)
    said["made_s"] = time.perf_counter() - t
    os.write(made_w, b"1")
    select.select([go_r], [], [], CHILD_S)
    helper = Helper()
    try:
        said["suspend_s"], said["moved"] = helper.suspend()
        os.write(made_w, b"2")                      # suspended: the parent weighs it again
        select.select([go_r], [], [], CHILD_S)
        t = time.perf_counter()
        helper.restore()
        if stack is not None:
            stack_limit(stack)
        said["restore_s"] = time.perf_counter() - t
        # the default config's first step: its net (its own initialisation), its batch
        t = time.perf_counter()
        torch.manual_seed(1)
        net = MODELS[cfg.model]().to("cuda:0")
        opt = make_optimizer(cfg, net)
        x = torch.rand(cfg.batch_size, 1, 28, 28, device="cuda:0")
        y = torch.randint(0, 10, (cfg.batch_size,), device="cuda:0")
        F.nll_loss(net(x), y).backward()
        opt.step()
        torch.cuda.synchronize(0)
        said["step_s"] = time.perf_counter() - t
        torch.cuda.empty_cache()
    finally:
        try:            # NVIDIA/cuda-checkpoint issue #53: end suspended (engine/cuda_start.py)
            if "restore_s" in said:
                helper.suspend()
        finally:
            helper.close()
    return said


def run(name: str) -> dict:
    before = gpu_memory_mib(0)
    made_r, made_w = os.pipe()
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            for fd in (made_r, go_w, out_r):
                os.close(fd)
            said = _variant(name, made_w, go_r)
        except BaseException as e:  # noqa: BLE001 - said to the parent, never raised here
            said, code = {"variant": name, "error": f"{type(e).__name__}: {str(e)[:300]}"}, 1
        os.write(out_w, json.dumps(said).encode())
        os._exit(code)
    for fd in (made_w, go_r, out_w):
        os.close(fd)
    weighed = {}
    try:
        for mark, key in ((b"1", "held_mib"), (b"2", "suspended_mib")):
            if not select.select([made_r], [], [], CHILD_S)[0] or os.read(made_r, 1) != mark:
                break
            now = gpu_memory_mib(0)
            if now is not None and before is not None:
                weighed[key] = now - before
            os.write(go_w, b"1")
        deadline = time.monotonic() + CHILD_S
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:     # bounded: killed, said below
                os.kill(pid, 9)
                _, status = os.waitpid(pid, 0)
                break
            time.sleep(0.05)
        data = b""
        while select.select([out_r], [], [], 5)[0]:
            chunk = os.read(out_r, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        for fd in (made_r, go_w, out_r):
            os.close(fd)
    try:
        said = json.loads(data)
    except ValueError:
        said = {"variant": name, "error": f"no answer (exit status {status})"}
    return {**said, **weighed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    args = parser.parse_args()
    # imported once here, CUDA untouched (as the launcher: torch.cuda.is_available() would
    # start the runtime, and a fork could not use CUDA after it): nvidia-smi says
    for module in ("torch", "tui_trainer.engine.train", "tui_trainer.launcher.server"):
        importlib.import_module(module)
    if gpu_memory_mib(0) is None:
        print("no CUDA device here: nothing to measure")
        return 0
    rows: dict[str, list[dict]] = {v: [] for v in args.variants}
    for r in range(args.repeats):
        order = args.variants[r % len(args.variants):] + args.variants[:r % len(args.variants)]
        for name in order:
            said = run(name)
            rows[name].append(said)
            print(json.dumps(said), flush=True)
    print()
    print("variant: held before suspension (MiB) | moved to host (MiB) | suspend s | restore s "
          "| first step s | restore + step s (medians)")
    for name, got in rows.items():
        ok = [g for g in got if "error" not in g]
        if not ok:
            print(f"{name}: every repeat failed: {got[0].get('error')}")
            continue

        def med(key: str, scale: float = 1.0) -> str:
            vals = [g[key] / scale for g in ok if g.get(key) is not None]
            return f"{statistics.median(vals):.3f}" if vals else "-"
        both = [g["restore_s"] + g["step_s"] for g in ok]
        print(f"{name}: {med('held_mib')} | {med('moved', 2**20)} | {med('suspend_s')} | "
              f"{med('restore_s')} | {med('step_s')} | {statistics.median(both):.3f}"
              f"  ({len(ok)} of {len(got)} repeats; held once suspended "
              f"{med('suspended_mib')} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
