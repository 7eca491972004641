"""From Start to the first logged step: a run forked by the warm launcher, one given the
launcher's spare, and one started cold, side by side in one session, and whether they train
the same bits.

Start is what the dashboard's F2 does (core.processes.supervisor.Supervisor.start: create the run,
launch its process); the first step is the moment its first step row is in the session
store, where the dashboard reads it. Three ways, their order turning each repeat so that
none always goes first:
- `cold`: a new interpreter (imports torch);
- `warm`: forked from a launcher whose spares are off (TUI_TRAINER_SPARE=0), at Start;
- `spare`: given the spare of a launcher as it comes by default (TUI_TRAINER_SPARE unset:
  since issue 34 the suspended spare below; the driver's before); on a CPU it differs from
  `warm` only by the fork.
- `spare@shapes`, `spare@handles` (with `--cuda-start shapes handles`): the same with
  TUI_TRAINER_CUDA_START=shapes (a thread beside the run's setup starts CUDA's context and
  handles and loads the kernels of the run's shapes) or =handles (the context and handles
  only); plain `spare` is the engine's default (engine/cuda_start.py: the run starts CUDA
  in its own thread, `spare@off` the same asked for by name);
- `driver` (with `--spares driver`): TUI_TRAINER_SPARE=driver, a process forked before
  Start that has started CUDA's driver and loaded cuDNN where there is a CUDA device, no
  context: no GPU memory held while it waits (the default spare until issue 34).
- `context`, `cudnn` (with `--spares context cudnn`): given the spare of a launcher with
  TUI_TRAINER_SPARE=context (it also made CUDA's context before Start) or =cudnn (the
  context and cuDNN's handles), which hold GPU memory while they wait: what a user who
  asks for it gets.
- `suspended` (with `--spares suspended`): TUI_TRAINER_SPARE=suspended, cudnn's spare moved
  out of the GPU into its host memory by CUDA's checkpoint API before Start and restored at
  Start: no GPU memory held while it waits.
  (Both, since 2026-11-26's fourth session, also load the kernels of the last run's config
  before Start, the default config's for a launcher's first spare: the same config here.)
Where there is a CUDA device, each launcher's spare is weighed while it waits: the GPU memory
in use (nvidia-smi) once its spare is made, less what was in use before its launcher started.
Each run's log says whether it was given a spare (a `spare` run that was not is counted
apart). Every run trains the same config (seed 1), so all their fingerprints must be equal.
Each first step is also told in parts, from the session's own stamps: to the run's claim (the
fork or process and the setup), step 0's fingerprint and checkpoint, the first step itself;
and that step by its phases (data, copy, forward, backward, optimizer, record), as its row
in the session records them.
Goals: warm under 1 s on this machine; on CUDA the first step at most 0.5 s (issue 34).

    python benchmarks/first_step.py [--repeats 5] [--steps 20] [--cuda-start shapes handles]
        [--spares driver context cudnn suspended] [--deterministic off]

`--deterministic off` times runs that use torch's default cuBLAS workspace (fastest-gpu's),
which the cudnn and suspended spares serve too (engine/cuda_start.py, `cublas_size_settable`;
with a torch that cannot set the size, each such launcher's first run is forked, counted
under "no spare", and its next spares are made for the rest).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from cuda_start import gpu_memory_mib          # (this folder's: nvidia-smi's memory.used)
from tui_trainer.core.settings import config
from tui_trainer.core.analysis.figures import PHASES
from tui_trainer.core.session.store import SessionStore
from tui_trainer.core.processes.supervisor import Supervisor
from tui_trainer.launcher.client import SPARE_LINE, WarmLauncher
from tui_trainer.core.settings.machine import CUDA_START_ENV, CUDA_STARTS
from tui_trainer.launcher.spare import DEFAULT_SPARE, HOLDS_CONTEXT, SPARE_ENV, ready_line

READY_S = 90.0          # how long a spare may take to be ready (a suspended one: its CUDA
                        # made, then moved to the host) before its run is timed anyway
# Goal 4 counts a spare as holding no GPU memory at or under this much in nvidia-smi (the
# driver's spare, which has no context, reads 4 MiB there)
NO_MEMORY_MIB = 16
HELD: dict[str, float] = {}     # each launcher's spare: the GPU memory it held (MiB)


def spare_ready(warm: WarmLauncher) -> bool:
    """Waits (at most READY_S) until the launcher's one spare says in the launcher's log that
    it is ready, so that a run given it is timed from a spare that waits, not from one still
    starting CUDA (or, suspended, still moving it out of the GPU). Whether it did."""
    import psutil
    assert warm._proc is not None and warm.path is not None
    log, deadline = warm.path.parent / "launcher.log", time.monotonic() + READY_S
    while time.monotonic() < deadline:
        try:
            kids = psutil.Process(warm._proc.pid).children()
            said = log.read_text(errors="replace")
        except (psutil.Error, OSError):
            return False
        if len(kids) == 1 and ready_line(kids[0].pid) in said:
            return True
        time.sleep(0.1)
    return False


def first_step_s(session: Path, sup: Supervisor, cfg: dict
                 ) -> tuple[int, float, float, tuple[float, float, float] | None,
                            dict[str, float]]:
    """(run, first step, whole run, parts, phases): the parts of the first step's time, from
    the session's own stamps: to the run's claim (the fork or the process, its setup: data,
    model, CUDA where the setup reaches it), then step 0's fingerprint and checkpoint, then
    the first step itself; and that step's phases as its row records them (core.analysis.figures
    PHASES: on CUDA the device phases are the times between CUDA events, which in a first
    step follow the host, the GPU waiting for each kernel as it is loaded)."""
    t0 = time.time()
    run_id = sup.start(cfg)
    db = sqlite3.connect(session / "session.sqlite")
    try:
        while True:
            row = db.execute("SELECT min(t) FROM steps WHERE run_id = ?", (run_id,)).fetchone()
            if row[0] is not None:
                first = row[0] - t0
                break
            time.sleep(0.005)
        while db.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()[0] \
                in ("created", "running"):
            time.sleep(0.05)
        whole = time.time() - t0
        claimed = db.execute("SELECT started FROM runs WHERE id = ?", (run_id,)).fetchone()[0]
        step0 = db.execute("SELECT max(t) FROM fingerprints WHERE run_id = ? AND step = 0",
                           (run_id,)).fetchone()[0]
        row = db.execute(f"SELECT {', '.join(p + '_s' for p in PHASES)} FROM steps WHERE "
                         "run_id = ? ORDER BY step LIMIT 1", (run_id,)).fetchone()
    finally:
        db.close()
    parts = None if claimed is None or step0 is None else \
        (claimed - t0, step0 - claimed, first + t0 - step0)
    phases = {p: v for p, v in zip(PHASES, row or ()) if v is not None}
    return run_id, first, whole, parts, phases


def launcher(spares: str, weigh: bool) -> WarmLauncher:
    """A launcher whose spares are `spares` (launcher/spare.py's SPARE_MODES; "": unset, the default); with
    `weigh`, what its spare holds of the GPU's memory once it is made (the memory in use
    then, less before the launcher started: the launchers before it have made their spares
    already)."""
    before = gpu_memory_mib(0) if weigh else None
    os.environ[SPARE_ENV] = spares          # read by the launcher it starts
    try:
        warm = WarmLauncher()
        t0 = time.time()
        warm.start()
        if not warm.wait_ready(120):
            raise SystemExit("the warm launcher did not come up")
    finally:
        del os.environ[SPARE_ENV]
    named = spares or f"(unset: {DEFAULT_SPARE})"
    print(f"warm launcher (TUI_TRAINER_SPARE={named}) ready after "
          f"{time.time() - t0:.2f} s (its one-time import cost)")
    if before is not None and spares != "0":
        if not spare_ready(warm):               # its spare made, CUDA started as it asks
            print(f"   its spare was not ready within {READY_S:.0f} s")
        used = gpu_memory_mib(0)
        print(f"   GPU memory held while its spare waits: {used - before:.0f} MiB (nvidia-smi)"
              if used is not None else "   nvidia-smi did not answer")
        if used is not None:
            HELD[spares] = used - before
    return warm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--cuda-start", nargs="*", default=[], choices=list(CUDA_STARTS),
                    help="also spare runs with TUI_TRAINER_CUDA_START=shapes, =handles or =0")
    ap.add_argument("--spares", nargs="*", default=[],
                    choices=[m for m in ("driver", "context", "cudnn", "suspended")
                             if m != DEFAULT_SPARE],
                    help="also runs given a spare that started the driver only, that made "
                         "CUDA's context (and cuDNN's handles) before Start, or that then "
                         "suspended them (the default spare's runs are `spare`'s)")
    ap.add_argument("--deterministic", choices=["on", "off"], default="on",
                    help="the runs' deterministic setting (off: torch's cuBLAS workspace)")
    args = ap.parse_args()
    cfg = config.DEFAULTS.replace(dataset="mnist-sample", max_steps=args.steps, log_every=1,
                                  fingerprint_every=5,
                                  deterministic=args.deterministic).to_dict()
    weigh = gpu_memory_mib(0) is not None
    plain, spares = launcher("0", weigh), launcher("", weigh)
    holding = {mode: launcher(mode, weigh) for mode in args.spares}
    ways = ("cold", "warm", "spare", *(f"spare@{m}" for m in args.cuda_start), *holding)
    results: dict[str, list[tuple[float, float]]] = {how: [] for how in (*ways, "no spare")}
    split: dict[str, list[tuple[float, float, float]]] = {how: [] for how in results}
    steps: dict[str, list[dict[str, float]]] = {how: [] for how in results}
    ids: list[int] = []
    on_cuda = False         # a spare's log says it started CUDA's driver
    try:
        with tempfile.TemporaryDirectory() as tmp:
            session = Path(tmp)
            with SessionStore(session) as store:
                sups = {"cold": Supervisor(store), "warm": Supervisor(store, plain),
                        "spare": Supervisor(store, spares),
                        **{mode: Supervisor(store, w) for mode, w in holding.items()}}
                for i in range(args.repeats):
                    for how in ways[i % len(ways):] + ways[:i % len(ways)]:
                        # a quiet moment between runs; then the spare given away last is
                        # made again (SPARE_AFTER_S later), and a run is timed once it
                        # waits ready (a suspended one: its CUDA made, then suspended)
                        time.sleep(1.5)
                        owner = {"spare": spares, **holding}.get(how.partition("@")[0])
                        if owner is not None and not spare_ready(owner):
                            print(f"{how}: its launcher's spare was not ready within "
                                  f"{READY_S:.0f} s: this run is timed anyway", flush=True)
                        mode = how.partition("@")[2]
                        if mode:            # the run's environment: launch() passes it on
                            os.environ[CUDA_START_ENV] = CUDA_STARTS[mode]
                        try:
                            run_id, first, whole, parts, phases = first_step_s(
                                session, sups[how.partition("@")[0]], cfg)
                        finally:
                            os.environ.pop(CUDA_START_ENV, None)
                        log = store.log_path(run_id).read_text()
                        got = how if how in ("cold", "warm") or SPARE_LINE in log \
                            else "no spare"
                        ids.append(run_id)
                        results[got].append((first, whole))
                        if parts is not None:
                            split[got].append(parts)
                        steps[got].append(phases)
                        print(f"{got}: run {run_id}: first step after {first:.2f} s"
                              + (" (to the claim {:.2f}, step 0's records {:.2f}, the step "
                                 "{:.2f})".format(*parts) if parts else "")
                              + f", {args.steps}-step run done after {whole:.2f} s",
                              flush=True)
                        print("   the first step's phases (s): " + ", ".join(
                            f"{p} {v:.3f}" for p, v in phases.items()), flush=True)
                        said = [x for x in log.splitlines() if SPARE_LINE in x]
                        started = [x for x in log.splitlines() if "CUDA's context" in x
                                   or "CUDA's start" in x]
                        if started:
                            print("   " + started[0].split(" ", 1)[1], flush=True)
                        if said:
                            print("   " + said[0].split("; ", 1)[1], flush=True)
                            on_cuda = on_cuda or "CUDA's driver started" in said[0]
                        for line in log.splitlines():   # a suspended spare's run, at its end
                            if "suspended again before it ended" in line:
                                print("   " + line.split(" ", 1)[1], flush=True)
                prints = [tuple(r["sha256"] for r in store.fingerprints(i)) for i in ids]
    finally:
        for name, w in ((f"(unset: {DEFAULT_SPARE})", spares), *holding.items()):
            log = w.path.parent / "launcher.log" if w.path is not None else None
            said = log.read_text(errors="replace").strip() if log and log.exists() else ""
            if said:           # what a spare met (a CUDA start or a suspension refused)
                print(f"launcher TUI_TRAINER_SPARE={name} said:\n   "
                      + "\n   ".join(said.splitlines()[-5:]))
        plain.close()
        spares.close()
        for w in holding.values():
            w.close()
    print()
    for how, rs in results.items():
        if not rs:
            continue
        firsts = [f for f, _ in rs]
        wholes = [w for _, w in rs]
        parts = split[how]
        print(f"{how}: first step median {statistics.median(firsts):.2f} s "
              f"(min {min(firsts):.2f}, max {max(firsts):.2f}"
              + ("; medians: to the claim {:.2f}, step 0's records {:.2f}, the step {:.2f}"
                 .format(*(statistics.median(p[i] for p in parts) for i in range(3)))
                 if parts else "")
              + f"); whole run median {statistics.median(wholes):.2f} s")
        known = [p for p in PHASES if all(p in ph for ph in steps[how])] if steps[how] else []
        if known:
            print("   the first step's phases, medians (s): " + ", ".join(
                f"{p} {statistics.median(ph[p] for ph in steps[how]):.3f}" for p in known))
    for how in ways[1:]:
        if results[how]:
            ratio = statistics.median(f for f, _ in results["cold"]) / \
                statistics.median(f for f, _ in results[how])
            print(f"reference: cold start; {how} is {ratio:.1f}x sooner to the first step")
    for how in (w for w in ways if w.startswith(("spare", *holding)) and results[w]
                and on_cuda):
        # the goal: at most 0.5 s, without GPU memory held while nothing trains (unless
        # asked for: the context and cudnn spares); `spare@...` are the default launcher's
        spare = statistics.median(f for f, _ in results[how])
        mib = HELD.get("" if how.startswith("spare") else how)
        asked = how in HOLDS_CONTEXT
        held = f"{mib:.0f} MiB of GPU memory held while it waited" if mib is not None else \
            "its GPU memory not weighed"
        held += f", as TUI_TRAINER_SPARE={how} asks" if asked else ""
        met = spare <= 0.5 and (asked or (mib is not None and mib <= NO_MEMORY_MIB))
        print(f"goal (CUDA, issue 34): the first step at most 0.5 s after Start: {how} "
              f"{spare:.2f} s ({held}) -> {'MET' if met else 'NOT MET'}")
    same = len(set(prints)) == 1 and len(prints[0]) > 1
    print(f"all {len(ids)} runs bit-identical (every fingerprint): {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
