"""A knob's price in seconds: the two arms take turns in short slices of steady-state steps
until the pairs decide (core/analysis/sequential.py).

Each arm is a process of its own (engine/probes/price.py, forked by the warm launcher where
it is ready), built exactly as a run is built: a knob that changes what a process loads
(determinism flags, num_workers, the data loader) is priced in processes that loaded it,
and nothing is swapped inside a running process. The arms take turns, never side by side:
a pair gives each arm about WINDOW_S of steps, cut in short slices taken in turns, ABBA
ABBA ... (pair i+1 BAAB ...: its first slice on the other arm). The machine's pace drifts
by 5-15% over tenths of a second here (a quiet VM: one arm's back-to-back 40-step windows
spread 3.8%), and one window an arm a pair laid that drift on the ratio; slices of about
WINDOW_S / SLICES in turns cancel it, and halve the pairs' spread at the same cost
(docs/benchmarks.md: log sd 0.024-0.035 against 0.054-0.075, one process pair).

Every pair has two new processes (built while nothing is timed, then a few steps of
warm-up each): two processes of one config can differ in pace by themselves (where their
memory landed, which core their threads met: 5-6% with pytorch/examples' net held to AVX2
here, about 0.2% with the default net once in slices), and with one process an arm that
difference fell on every pair alike and A/A prices read "faster" or "slower"; a process
pair a pair puts it inside the pairs' spread, where the interval counts it. Each pair's
ratio of samples/s is one observation; the study looks at LOOKS pairs with the error rate
corrected for the looks, and ends faster, slower, the same within the margin, or unknown
at the cap.

What the price leaves out, it says: it is the steady state (the windows after each arm's
warm-up), and each arm's start-up (its process's set-up: imports already made by the
launcher, data, model; and its first steps beyond the steady pace) is measured and given
beside it. Knobs whose price is mostly start-up or bookkeeping (START_UP_KNOBS, those of
CUDA_START_UP only where the arms train on CUDA, and the bookkeeping and data-parallel
groups), and those that change how many cores an arm keeps busy (CONCURRENCY_KNOBS, and
any knob on a base with DataLoader workers) are not priced this way: `ab --decide` trains
them as whole runs after the others' windows (as `--whole-runs` does any knob). A window
in which other processes took CPU the arms could have used is marked loaded
(core.processes.contention); a verdict resting on loaded windows says so.
"""

from __future__ import annotations

import datetime
import json
import math
import mmap
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .core.analysis import prices, sequential
from .core.analysis.study import _label, changes, text_of
from .core.errors import BadInput
from .core.processes import contention, supervisor
from .core.settings import config, machine
from .core.settings.config import RunConfig
from .core.text import shown
from .launcher.client import WarmLauncher

# Knobs whose price is mostly paid at start-up (compiling, timing algorithms, capturing
# graphs): priced with it, as whole runs.
START_UP_KNOBS = ("compile", "cudnn_benchmark", "cuda_graph")
# ... of those, the ones whose start-up is CUDA's: cuDNN times its algorithms on a GPU only.
# Where the arms train on a CPU (or MPS) nothing of them runs at start-up, and what they do
# in each step (nothing, there) is priced in windows like any other knob.
CUDA_START_UP = ("cudnn_benchmark",)
# Knobs that change how many cores an arm keeps busy. Turns in slices assume that an arm
# does nothing while the other takes its turn, and that its steps in a slice are a run's
# steps; these two break that (docs/benchmarks.md, "Threads and workers ..."):
# - num_workers: its worker processes go on loading batches during the other arm's turn,
#   work the arm is never timed for (two workers: windows 0.71-0.77x, whole runs 0.63x);
# - num_threads: a second thread starts each turn slower (its first 3-4 steps 5-20% slower
#   than a run's), so that the arm with more threads pays more in slices than in a run
#   (one thread: 0.87-0.92x against 0.82x; under OMP_WAIT_POLICY=PASSIVE 1.14-1.17x
#   against 1.07x; benchmarks/turns_bias.py).
# They are priced as whole runs, as is any price whose base has DataLoader workers.
CONCURRENCY_KNOBS = ("num_threads", "num_workers")
WINDOW_S = 0.25           # an arm's time a pair, about (its steps chosen from the warm-up)
SLICES = 8                # ... cut in up to this many slices, taken in turns (ABBA ABBA ...)
WARMUP_STEPS = 5          # each of an arm's two warm-up windows: at most this many steps,
WARMUP_S = 0.1            # ... fewer (two at least) where they pass this (slow steps)
# A later pair's two new processes are warmed up side by side, untimed: their first step
# pays the lazy set-up (allocations, oneDNN's primitives), and a few more steps, up to
# FRESH_WARMUP_STEPS, fill about FRESH_WARMUP_S at an arm's own pace. Recorded A/A pairs
# (docs/benchmarks.md, "A later pair's warm-up by its time"; benchmarks/pair_slices.py):
# with pytorch/examples' net held to AVX2 (56 ms a step) one step spread a pair's ratio
# less than three in both runs (0.029 against 0.039, 0.074 against 0.114), and three cost
# 0.17 s a pair more (0.88 s against 0.71 s); with the default net (8 ms a step) neither
# was better (0.060 against 0.051, then 0.049 against 0.064), and it keeps its three.
FRESH_WARMUP_STEPS = 3
FRESH_WARMUP_S = 0.04
# The pairs at which the study looks (the last: its cap): every 4 pairs. Their level is
# calibrated to these seven looks (core/analysis/sequential.py, CALIBRATED: 96.7% for "the
# same" at each, where Bonferroni's alpha / 7 would ask 98.6%), so a look costs the others
# little: bootstrapped from 240 real A/A pairs, 3.9% of A/A studies past 20 s instead of
# 13.4% with five looks at alpha / 5, and 1.2% past 22 s (docs/benchmarks.md).
LOOKS = (8, 12, 16, 20, 24, 28, 32)
# A difference no larger is no difference (criterion.rs's noise threshold): two processes
# of one config differ by about this much with the default net (docs/benchmarks.md, over
# A/A prices), and a price this small is not what a user changes a knob for.
NOISE = 0.03
# Page faults a step from which a price says its arms' steps fault memory in again: 2,500
# pages (10 MB). Measured in prices here: the default net 4-9; pytorch/examples' net under
# malloc = system 5,400-8,000, under keep 360-1,150 (an arm forked from the launcher also
# faults in the pages it shares with it as it first writes them: Python's reference counts)
FAULTS_NOTE = 2500
READY_S = 180.0           # how long an arm may take to build (a cold start on a slow CPU)
WINDOW_WAIT_S = 60.0      # how long one window may take before the arm counts as hung


def windowable(key: str, device: str | None = None) -> str | None:
    """Why a knob cannot be priced in steady-state windows, or None where it can (a joined
    arm's key, K1+K2: where none of its knobs is such). `device`: the type of device the
    arms train on ("cpu", "cuda", ...; `trains_on`), None where not known (then as CUDA)."""
    if "+" in key:
        return next((why for part in key.split("+") if (why := windowable(part, device))),
                    None)
    if key in CUDA_START_UP and device is not None and not device.startswith("cuda"):
        return None
    if key in START_UP_KNOBS:
        return f"{key}'s price is mostly at start-up: priced with it, as whole runs"
    if key in CONCURRENCY_KNOBS:
        return (f"{key} changes how many cores a run keeps busy, which turns in slices "
                "cannot price: priced as whole runs")
    if config.group(key) in ("bookkeeping", "parallel") or key.startswith("eval") or \
            key in ("epochs", "max_steps"):
        return f"{key} is paid outside training steps: priced as whole runs"
    return None


def base_windowable(base: RunConfig) -> str | None:
    """Why no knob can be priced in windows on `base`, or None: its DataLoader workers
    would load batches during the other arm's turn (CONCURRENCY_KNOBS)."""
    if base.num_workers > 0:
        return (f"the base loads batches in {base.num_workers} worker processes, which go "
                "on during the other arm's turn: priced as whole runs")
    return None


def sort_out(base: RunConfig, vary: list[tuple[str, list[Any]]], device: str | None = None
             ) -> tuple[list[tuple[str, list[Any]]], list[tuple[str, list[Any]]], list[str]]:
    """The knobs of `vary` priced in windows on `base`, those priced as whole runs, and why
    (each reason once): the one answer of `ab --decide`, the A/B tab and the fit."""
    on_base = base_windowable(base)
    windowed, whole, why = [], [], [on_base] if on_base else []
    for key, values in vary:
        reason = on_base or windowable(key, device)
        (whole if reason else windowed).append((key, values))
        if reason and reason not in why:
            why.append(reason)
    return windowed, whole, why


def trains_on(base: RunConfig, vary: list[tuple[str, list[Any]]],
              facts: Callable[[], machine.Machine | None]) -> str | None:
    """The type of device a price's arms train on ("cpu", "cuda", ...), where a knob of
    `vary` is priced one way or the other by it (CUDA_START_UP); else None, as where the
    machine's `facts` (called only then) cannot say."""
    if not any(part in CUDA_START_UP for key, _ in vary for part in key.split("+")):
        return None
    if base.device in ("cpu", "mps"):
        return base.device
    found = facts()
    try:
        return None if found is None else machine.device_type(base.device, found)
    except machine.Problem:
        return None


class NotHere(BadInput):
    """An arm whose config this machine cannot train (core.settings.machine's rules, as
    its process found them): a variant so refused is skipped, said, and the rest priced."""

    def __init__(self, label: str, why: str):
        self.label, self.why = label, why
        super().__init__(f"{label}: not possible on this machine ({why})")


@dataclass
class Arm:
    """One arm's process and what it said."""
    label: str
    cfg: RunConfig
    proc: Any
    sock: socket.socket
    stream: Any
    spawned: float
    machine: list[str] | None = None      # (key, words) of the machine it trains on
    setup_s: float | None = None          # its own set-up (data, model), as it measured it
    pid: int | None = None                # as it said
    ready_s: float | None = None          # spawn to ready, as this process saw it
    warm: list[tuple[int, float]] = field(default_factory=list)  # warm-up windows: steps, s

    def ask(self, steps: int) -> dict[str, Any]:
        self.send(steps)
        return self.answer(WINDOW_WAIT_S)

    def warm_up(self) -> None:
        """One warm-up window: WARMUP_STEPS steps, asked one at a time, or fewer (two at
        least) once they pass WARMUP_S (a step of 56 ms: two; of 8 ms: five)."""
        steps, seconds = 0, 0.0
        while warm_more(steps, seconds):
            w = self.ask(1)
            if not w["steps"]:
                break
            steps, seconds = steps + w["steps"], seconds + w["s"]
        self.warm.append((steps, seconds))

    def pace(self, window: int) -> float:
        """Seconds a step in a warm-up window."""
        steps, seconds = self.warm[window]
        return seconds / max(1, steps)

    def send(self, steps: int) -> None:
        self.stream.write(json.dumps({"steps": steps}) + "\n")
        self.stream.flush()

    def answer(self, timeout: float) -> dict[str, Any]:
        self.sock.settimeout(timeout)
        try:
            line = self.stream.readline()
        except (TimeoutError, socket.timeout):
            raise BadInput(f"{self.label}: its process said nothing for {timeout:.0f} s "
                           "(hung or starved)") from None
        if not line:
            raise BadInput(f"{self.label}: its process ended before it was asked to")
        said = json.loads(line)
        if "refused" in said:
            raise NotHere(self.label, str(said["refused"]))
        if "error" in said:
            raise BadInput(f"{self.label}: {said['error']}")
        return said

    def end(self) -> None:
        """Tells it to end (it exits as soon as it reads the empty line)."""
        try:
            self.stream.write("\n")
            self.stream.flush()
        except (OSError, ValueError):       # (gone, or ended already)
            pass
        self.sock.close()

    def close(self) -> None:
        """Ends it and waits for it (killed where it does not end within 10 s)."""
        self.end()
        try:
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - then it is killed: it ends with its owner
            self.proc.kill()
            self.proc.wait(timeout=10)


def arm_config(cfg: RunConfig) -> RunConfig:
    """An arm trains for as long as it is asked, with nothing recorded and no evaluation."""
    return cfg.replace(epochs=100000, max_steps=0, eval_every=0)


def start_arm(label: str, cfg: RunConfig, warm: WarmLauncher | None) -> Arm:
    mine, theirs = socket.socketpair()
    args = ["price-arm", "--config-json", json.dumps(arm_config(cfg).to_dict())]
    env = {**os.environ, **supervisor.owner_env(), **supervisor.thread_wait_env()}
    t = time.monotonic()
    proc = None
    with open(os.devnull, "wb") as null:
        if warm is not None:
            proc = warm.spawn(args, stdout=theirs.fileno(), stderr=null.fileno(),
                              detach=False, env=env)
        if proc is None:
            proc = subprocess.Popen([sys.executable, "-m", "tui_trainer", *args],
                                    stdin=subprocess.DEVNULL, stdout=theirs, stderr=null,
                                    env=env)
    theirs.close()
    return Arm(label, cfg, proc, mine, mine.makefile("rw", encoding="utf-8", newline="\n"), t)


@dataclass
class Priced:
    """A windowed price: the decision, its windows, and the arms' start-up."""
    decision: sequential.Decision
    pairs: list[tuple[float, float]]       # (base, variant) samples/s, pair by pair
    loaded: list[bool]                     # each pair: was a window loaded
    steps: int                             # an arm's steps a pair
    startup: dict[str, dict[str, float]]   # per arm: set-up, ready, first steps' extra
    seconds: float                         # the whole price, spawn to decision
    machine: list[str] | None = None       # (key, words): where it was measured
    processes: int = 0                     # arm processes it started (two a pair)
    slices: int = 1                        # an arm's slices a pair (its steps in turns)
    looks: tuple[int, ...] = LOOKS         # the pairs at which it looked (the last: its cap)
    fresh: int = FRESH_WARMUP_STEPS        # a later pair's warm-up steps, side by side
    step_s: float | None = None            # the pace its slices and warm-ups were set by
    faults: dict[str, float] | None = None  # per arm: page faults a timed step

    @property
    def loaded_pairs(self) -> int:
        return sum(self.loaded)

    def startup_text(self) -> str:
        """Each arm's start-up beside the steady price: its process ready (spawn to built)
        and its first steps' time beyond the steady pace."""
        b, v = self.startup["base"], self.startup["variant"]

        def one(s: dict[str, float]) -> float:
            return s["ready_s"] + s["first_steps_extra_s"]
        n = [int(s.get("first_steps", WARMUP_STEPS)) for s in (b, v)]
        firsts = str(n[0]) if n[0] == n[1] else f"{n[0]} and {n[1]}"
        return (f"start-up, not in the price: base {one(b):.2f} s, variant {one(v):.2f} s "
                f"({one(v) - one(b):+.2f} s; ready {b['ready_s']:.2f} and {v['ready_s']:.2f} "
                f"s, first {firsts} steps beyond the steady pace "
                f"{b['first_steps_extra_s']:.2f} and {v['first_steps_extra_s']:.2f} s)")


def as_dict(p: Priced) -> dict[str, Any]:
    d = p.decision
    iv = d.interval
    return {"verdict": d.verdict, "words": verdict_words(p), "pairs": len(p.pairs),
            "ratio": iv.ratio if iv else None, "low": iv.low if iv else None,
            "high": iv.high if iv else None, "level": d.level,
            "loaded_pairs": p.loaded_pairs, "steps_a_window": p.steps,
            "startup": p.startup, "startup_text": p.startup_text(), "seconds": p.seconds,
            "processes": p.processes, "slices": p.slices, "looks": list(p.looks),
            "fresh_warmup_steps": p.fresh, "step_s": p.step_s,
            "faults_a_step": p.faults,
            # every pair's ratio, in order: what the interval was drawn from
            "ratios": [round(v / b, 6) if b > 0 else None for b, v in p.pairs],
            "window": "steady state: training steps and their data, after each arm's "
                      "warm-up; no evaluation, logging or checkpoints"}


def verdict_words(p: Priced) -> str:
    """The decision in words; an undecided price whose windows mostly shared the CPU says
    the machine was too busy (more windows there would price the other load), and a
    decided one says it is a busy machine's price (beside a hog here bf16 read 1.02-1.08x
    faster where quiet it is 0.88x slower)."""
    busy = p.loaded_pairs * 2 > len(p.pairs)
    if p.decision.verdict == "unknown" and busy:
        return (f"unknown: the machine was too busy ({p.loaded_pairs} of {len(p.pairs)} "
                "window pairs shared the CPU with another process)")
    if busy:
        return (f"{p.decision.words}, on a busy machine ({p.loaded_pairs} of {len(p.pairs)} "
                "window pairs shared the CPU with another process: quiet, the price may "
                "differ)")
    return p.decision.words


def figure(d: dict[str, Any], key: str) -> float | None:
    """A number a price study kept (its spec is session data: read, never trusted)."""
    x = d.get(key)
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) \
        and math.isfinite(x) else None


def interval_text(d: dict[str, Any]) -> str:
    """`0.88x [0.86-0.91]` of what a price study kept, `-` where it holds none."""
    r, lo, hi = (figure(d, k) for k in ("ratio", "low", "high"))
    return f"{r:.2f}x [{lo:.2f}-{hi:.2f}]" if None not in (r, lo, hi) else "-"


def pricing_now(variants: list[dict[str, Any]], entries: Any, status: Any) -> str | None:
    """The label of the variant a running price study is pricing now: the first one without
    a finished entry (`price_study` takes them in order), whose windows have not reached a
    look yet where it has no entry. None where the study is not running. Session data:
    read, never trusted."""
    entries = entries if isinstance(entries, dict) else {}
    if status != "running":
        return None
    for v in variants[1:]:
        d = entries.get(v["label"])
        if not (isinstance(d, dict) and d.get("done")):
            return v["label"]
    return None


def stored_lines(label: str, d: Any, status: str | None = None, now: bool = False,
                 first_look: int | None = None) -> list[str]:
    """What `ab --decide` prints of one variant, from what its study kept (the
    A/B tab reads the same): the price so far where it is not done. A variant with nothing
    kept is being measured where it is the study's variant `now` (its pairs before their
    `first_look`), waiting its turn while its study (`status`) has not ended, and was never
    priced once it has. Its words come from the session: shown as text, cut."""
    if not isinstance(d, dict) or not d:
        return [f"{shown(label, 60)}: " + (
            "its first pairs are being measured" + (
                f" (the first look at {first_look} pairs)" if first_look else "")
            if now else
            "waiting its turn" if status in ("created", "running") else
            f"not priced: the study {shown(status, 20)} before its turn" if status
            else "not priced")]
    if isinstance(d.get("skipped"), str):
        return [f"{shown(label, 60)}: not possible on this machine ({shown(d['skipped'], 300)})"]
    loaded, pairs, seconds = (figure(d, k) for k in ("loaded_pairs", "pairs", "seconds"))
    load = (f"; {loaded:.0f} of {pairs or 0:.0f} pairs shared the CPU with another process"
            if loaded else "")
    words = shown(d["words"], 300) if isinstance(d.get("words"), str) else \
        "no verdict kept"
    if not d.get("done"):
        return [f"{shown(label, 60)}: so far {words}{load}"]
    steps = figure(d, "steps_a_window")
    lines = [f"{shown(label, 60)}: {words}, samples/s of the variant over the base"
             + (f", in {seconds:.1f} s" if seconds is not None else "") + load]
    if steps is not None:
        lines.append(
            f"  window: {steps:.0f} steady-state steps an arm a pair"
            + (f", in {figure(d, 'slices'):.0f} slices taken in turns (ABBA ...)"
               if figure(d, "slices") else ", ABBA")
            + ", each pair in two processes of its own"
            + (f", warmed up {figure(d, 'fresh_warmup_steps'):.0f} "
               f"step{'' if figure(d, 'fresh_warmup_steps') == 1 else 's'} side by side first"
               if figure(d, "fresh_warmup_steps") else "")
            + " (training steps and their data; no evaluation, logging or checkpoints)")
    if isinstance(d.get("startup_text"), str):
        lines.append(f"  {shown(d['startup_text'], 300)}")
    lines.extend(f"  {line}" for line in faults_lines(d.get("faults_a_step")))
    return lines


def faults_lines(faults: Any) -> list[str]:
    """Where an arm's steps fault much memory in again (glibc gave back what the step before
    freed: malloc = system), what that does to the price: a fault's cost moves with the
    kernel's memory traffic, and two prices of one knob minutes apart disagreed
    (docs/benchmarks.md, "Prices that moved with the kernel's page faults"). `faults` is
    session data: read, never trusted."""
    faults = faults if isinstance(faults, dict) else {}
    many = {arm: figure(faults, arm) for arm in ("base", "variant")}
    many = {arm: n for arm, n in many.items() if n is not None and n >= FAULTS_NOTE}
    if not many:
        return []
    mb = " and ".join(f"the {arm}'s {n * mmap.PAGESIZE / 2**20:.0f} MB" for arm, n in
                      many.items())
    return [f"note: a step faults in again {mb} (memory glibc gave back after the step "
            "before): what that costs moves with the kernel's memory traffic, so this price "
            "can move from minute to minute; malloc = keep keeps that memory"]


def kept(key: str, value: Any, base: RunConfig, p: Priced) -> "prices.Price | None":
    """The price as remembered for this machine (core/analysis/prices.py); None without a
    ratio or a machine, and for an arm that is not one knob's other value: a joined arm
    (K1=V+K2=W, as a study of whole runs keeps none), or the base's own value (an A/A price:
    the machine's noise, not a knob's price)."""
    iv = p.decision.interval
    if iv is None or iv.ratio is None or not p.machine or isinstance(value, dict) or \
            value == getattr(base, key):
        return None
    return prices.Price(
        machine=p.machine[0], words=p.machine[1], knob=key, value=value,
        base=getattr(base, key), ratio=iv.ratio, low=iv.low, high=iv.high,
        verdict=p.decision.verdict or None, rounds=len(p.pairs),
        date=datetime.date.today().isoformat(),
        study=f"windowed price ({len(p.pairs)} window pairs, steady state; "
              f"{p.startup_text()})",
        context=f"model {base.model}, {base.dataset}, batch {base.batch_size}",
        loaded=p.loaded_pairs > len(p.pairs) // 2)


def price(base: RunConfig, variant: RunConfig, margin: float = sequential.DEFAULT_MARGIN,
          cap: int | None = None, say: Callable[[str], None] = lambda m: None,
          warm: WarmLauncher | None = None,
          on_look: Callable[[dict[str, Any]], None] | None = None,
          stop: Callable[[], bool] = lambda: False) -> Priced | None:
    """Base against variant in alternating windows until the windows decide (None when
    `stop` says so between two pairs). `on_look`: what the price is so far, at each look
    (the A/B tab shows it narrowing)."""
    t0 = time.monotonic()
    looks = looks_for(cap)
    arms: list[Arm] = []
    try:
        arms = first = _ready_pair(base, variant, warm)     # its start-up is the one given
        pids = {arm.pid for arm in arms}
        for arm in arms:                   # two warm-up windows each, in turn
            for _ in range(2):
                arm.warm_up()
        per_step = max(arm.pace(-1) for arm in arms)
        size, slices = slicing(per_step)
        steps = size * slices                    # an arm's steps a pair
        fresh = fresh_warmup(per_step)
        pairs: list[tuple[float, float]] = []
        loaded: list[bool] = []
        steady = [[], []]
        faulted = [[0, 0], [0, 0]]                # each arm's faults and steps, timed
        while True:
            if stop():
                return None
            if pairs:
                # every pair in processes of its own: a process's own pace (where its
                # memory landed, which core its threads met: up to ±6% between two of one
                # config with a larger net) falls on the pairs at random, inside the
                # interval, not on a whole arm
                # (the variant forked first in pairs 2-3 of every 4: the launcher's first
                # and second forks of a pair can differ by themselves, as the windows' order
                # can; over 4 pairs each arm has every place)
                arms = _ready_pair(base, variant, warm, ending=arms,
                                   variant_first=len(pairs) // 2 % 2 == 1)
                pids.update(arm.pid for arm in arms)
                for arm in arms:            # warmed up side by side: not timed
                    arm.send(fresh)
                for arm in arms:
                    arm.answer(WINDOW_WAIT_S)
            done = [[0, 0.0, 0], [0, 0.0, 0]]     # an arm's samples, seconds, steps
            before = contention.snapshot(os.getpid())
            for i in turns(slices, flip=len(pairs) % 2 == 1):
                w = arms[i].ask(size)
                done[i] = [done[i][0] + w["samples"], done[i][1] + w["s"],
                           done[i][2] + w["steps"]]
                faulted[i] = [faulted[i][0] + int(w.get("faults") or 0),
                              faulted[i][1] + w["steps"]]
            seen = contention.between(before, contention.snapshot(os.getpid()))
            rates = [n / s if s > 0 else 0.0 for n, s, _ in done]
            for i in (0, 1):
                steady[i].append(done[i][1] / max(1, done[i][2]))
            pairs.append((rates[0], rates[1]))
            loaded.append(contention.loaded(seen))
            decision = sequential.decide(pairs, margin, looks_at=looks, unit="window pairs",
                                         noise=NOISE)
            if decision.interval is not None and len(pairs) in looks:
                say(f"price: {len(pairs)} pairs, {decision.words}")
                if on_look is not None:
                    iv = decision.interval
                    on_look({"pairs": len(pairs), "words": decision.words,
                             "verdict": decision.verdict, "ratio": iv.ratio, "low": iv.low,
                             "high": iv.high, "next_look": decision.next_look,
                             "cap": looks[-1], "loaded_pairs": sum(loaded),
                             "steps_a_window": steps, "slices": slices,
                             "looks": list(looks)})
            if decision.decided or decision.next_look is None:
                break
        startup = {}
        for arm, st in zip(first, steady, strict=True):
            pace = sorted(st)[len(st) // 2]
            n, warmup = arm.warm[0]
            startup[arm.label] = {"setup_s": arm.setup_s, "ready_s": arm.ready_s,
                                  "first_steps": n,
                                  "first_steps_extra_s": max(0.0, warmup - pace * n)}
        return Priced(decision, pairs, loaded, steps, startup, time.monotonic() - t0,
                      first[0].machine, len(pids), slices, looks, fresh,
                      per_step, {arm.label: n / max(1, k)
                                 for arm, (n, k) in zip(first, faulted, strict=True)})
    finally:
        for arm in arms:
            arm.close()


def looks_for(cap: int | None) -> tuple[int, ...]:
    """The pairs at which a price looks under a cap of `cap` pairs (None: LOOKS')."""
    cap = cap or LOOKS[-1]
    return tuple(n for n in LOOKS if n < cap) + (cap,)


def looks_kept(entries: Any, cap: Any) -> tuple[int, ...] | None:
    """The looks a price study was priced under, as its entries kept them; where none is
    priced yet, the ones it will use under its cap (`looks_for`); None where its entries,
    kept by an earlier version, do not say, or its cap is no count. Both are session data:
    read, never trusted."""
    def count(n: Any) -> bool:
        return isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 10_000
    kept = [d.get("looks") for d in (entries.values() if isinstance(entries, dict) else ())
            if isinstance(d, dict)]
    if not kept:
        return looks_for(cap) if cap is None or count(cap) else None
    for looks in kept:
        if isinstance(looks, list) and looks and len(looks) <= 64 and all(map(count, looks)):
            return tuple(looks)
    return None


def warm_more(steps: int, seconds: float) -> bool:
    """Whether a warm-up window of `steps` steps in `seconds` takes one more: up to
    WARMUP_STEPS, and past two only while under WARMUP_S."""
    return steps < WARMUP_STEPS and (steps < 2 or seconds < WARMUP_S)


def fresh_warmup(per_step: float) -> int:
    """A later pair's warm-up steps, side by side: at least one (the lazy set-up), up to
    FRESH_WARMUP_STEPS, about FRESH_WARMUP_S at an arm's pace of `per_step` seconds."""
    return min(FRESH_WARMUP_STEPS, max(1, round(FRESH_WARMUP_S / max(per_step, 1e-6))))


def slicing(per_step: float) -> tuple[int, int]:
    """(steps a slice, slices an arm a pair) for steps of `per_step` seconds: an arm's
    share of a pair about WINDOW_S in SLICES slices, an even count (ABBA), at least one step
    a slice (steps slower than WINDOW_S / 2: two slices of one step, ABBA)."""
    per_step = max(per_step, 1e-6)
    size = max(1, math.ceil(WINDOW_S / SLICES / per_step))
    slices = 2 * round(WINDOW_S / (2 * size * per_step))
    return size, min(SLICES, max(2, slices))


def turns(slices: int, flip: bool = False) -> list[int]:
    """The arms' order in a pair of `slices` slices an arm: ABBA repeated (BAAB where
    `flip`), so that each arm's slices sit, on average, at the same moment of the pair: a
    drift of the machine that is linear over the pair falls on both alike."""
    a, b = (1, 0) if flip else (0, 1)
    return [a, b, b, a] * (slices // 2)


def _ready_pair(base: RunConfig, variant: RunConfig, warm: WarmLauncher | None,
                ending: list[Arm] | None = None, variant_first: bool = False) -> list[Arm]:
    """The two arms' processes, started together and built (each waited for at most
    READY_S); one that fails is said in one line, and both end. `ending`: the pair before,
    told to end first and waited for while these build (never while a window is timed)."""
    for arm in ending or []:
        arm.end()
    if variant_first:
        arms = [start_arm("variant", variant, warm), start_arm("base", base, warm)][::-1]
    else:
        arms = [start_arm("base", base, warm), start_arm("variant", variant, warm)]
    for arm in ending or []:
        arm.close()
    try:
        for arm in arms:
            said = arm.answer(READY_S)
            arm.setup_s, arm.ready_s = said["setup_s"], time.monotonic() - arm.spawned
            arm.machine, arm.pid = said.get("machine"), said.get("pid")
    except BaseException:
        for arm in arms:
            arm.close()
        raise
    return arms


def plan(base: RunConfig, vary: list[tuple[str, list[Any]]],
         device: str | None = None) -> list[dict[str, Any]]:
    """A windowed price's arms as a study's variants: the base first, then one per value
    (each knob checked: one that cannot be priced in windows on `device` is refused by
    name)."""
    why = base_windowable(base)
    if why:
        raise config.ConfigError("--vary", why)
    arms: list[dict[str, Any]] = [{"label": "base", "config": base.to_dict()}]
    for key, values in vary:
        why = windowable(key, device)
        if why:
            raise config.ConfigError("--vary", why)
        for value in values:
            arms.append({"label": _label(key, value), "key": key, "value": value,
                         "config": base.replace(**changes(key, value)).to_dict()})
    return arms


def spec_figures(study_id: int, spec: Any) -> tuple[float, int | None]:
    """A price study's margin and cap as its spec keeps them, and its prices checked to be
    a mapping of mappings (session data: a study of another tool or version, or edited, is
    refused in one line naming the field, before anything starts)."""
    if not isinstance(spec, dict):
        raise BadInput(f"study {study_id}: its spec is {text_of(spec)}; a price "
                       "study's spec is a mapping")
    margin, cap = spec.get("decide"), spec.get("cap")
    margin = sequential.DEFAULT_MARGIN if margin is None else margin

    def number(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    if not (number(margin) and 0.005 <= margin <= 0.5):
        raise BadInput(f"study {study_id}: its decide is {text_of(margin)}; a price "
                       "study's margin is from 0.005 to 0.5 (0.05: ±5%)")
    if cap is not None and not (number(cap) and cap == int(cap)
                                and LOOKS[0] <= cap <= 200):
        raise BadInput(f"study {study_id}: its cap is {text_of(cap)}; a price "
                       f"study's cap is {LOOKS[0]} to 200 window pairs, or none")
    kept = spec.get("prices")
    if kept is not None and not (isinstance(kept, dict) and
                                 all(isinstance(d, dict) for d in kept.values())):
        raise BadInput(f"study {study_id}: its prices are {text_of(kept)}; a price "
                       "study keeps each variant's price as a mapping, by its label")
    return float(margin), None if cap is None else int(cap)


def price_study(store: Any, study_id: int, say: Callable[[str], None],
                stop: Callable[[], bool], warm: WarmLauncher | None) -> None:
    """A study of kind "price" (`ab --decide`, the A/B tab's "Decide a price"):
    each variant priced against the base in windows, what it is so far kept in the study's
    spec at each look, and the end kept as this machine's price."""
    study = store.study(study_id)
    margin, cap = spec_figures(study_id, study["spec"])
    base_cfg = config.from_dict(study["variants"][0]["config"])
    for v in study["variants"][1:]:
        if stop():
            return
        if (study["spec"].get("prices") or {}).get(v["label"], {}).get("done"):
            continue                    # priced before the study was stopped: kept

        def keep(entry: dict[str, Any], label: str = v["label"]) -> None:
            spec = store.study(study_id)["spec"]
            store.set_study_spec(study_id, {**spec, "prices": {
                **(spec.get("prices") or {}), label: entry}})

        say(f"price: {v['label']} against the base, in windows ...")
        try:
            p = price(base_cfg, config.from_dict(v["config"]), margin, cap, say, warm,
                      on_look=keep, stop=stop)
        except NotHere as e:
            if e.label == "base":       # (then no variant can be priced: the study ends)
                raise
            keep({"done": True, "skipped": e.why})
            say(f"price: {v['label']}: skipped, not possible on this machine ({e.why})")
            continue
        if p is None:
            return
        keep({**as_dict(p), "done": True})
        mine = kept(v["key"], v["value"], base_cfg, p)
        if mine is not None:
            prices.add([mine])
