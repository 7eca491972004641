"""`tui-trainer fit`: the fastest config for this machine, with proof (issue 65).

From a start config (fastest-cpu, or fastest-gpu where there is CUDA, its `fit` knobs chosen
for this machine), one speed knob at a time: a study that decides (`ab --decide`: in
windows, or whole runs for a knob paid at start-up; core.analysis.sequential) of each other
value against the config so far; a value measured faster is taken, and the next knob is
priced on top of it. Then the proof: the start config
and the fitted one each trained to their end with several seeds, every epoch evaluated,
their accuracy compared against the seeds' spread and their time to 98% measured. The
result is a preset of the user's ("fastest-here" unless named), each choice written with
its price here and what it does to the bits; every study's prices are kept for this machine
(core.analysis.prices) as any study's are.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import pricing, runner
from .core.analysis import sequential, study as studies
from .core.errors import BadInput
from .core.session.store import SessionStore
from .core.settings import config, presets
from .core.settings.toml_text import to_toml
from .core.settings.config import ConfigError, RunConfig
from .core.text import shown

# The knobs that are about speed, the values a fit tries for each (the config's own value
# is the base), and where they apply: the CPU, CUDA, or both.
SPEED_KNOBS: dict[str, tuple[tuple[Any, ...], str]] = {
    "amp": (("off", "bf16", "fp16"), "both"),
    "channels_last": ((False, True), "both"),
    "num_threads": ((0, 1), "cpu"),
    "malloc": (("system", "keep"), "cpu"),
    "loader": (("resident", "torchvision"), "both"),
    "num_workers": ((0, 2), "both"),
    "compile": (("off", "on"), "both"),
    "cudnn_benchmark": ((False, True), "cuda"),
    "pin_memory": ((False, True), "cuda"),
    "non_blocking": ((False, True), "cuda"),
    "cuda_graph": (("off", "step"), "cuda"),
}
# What a fit prices unless told: what each device's speed turns on (compile is left out:
# its first step alone takes longer than the rest of a fit here; `--knobs compile` asks;
# malloc too: fastest-cpu's steps free no blocks glibc gives back (its price here "the
# same", 23 s of an 80 s fit); `--knobs malloc` for a net with large activations)
DEFAULT_KNOBS = {"cpu": ("amp", "channels_last", "num_threads"),
                 "cuda": ("amp", "channels_last", "cudnn_benchmark", "cuda_graph")}
TARGET = 0.98
SEEDS = 3


@dataclass
class Step:
    """One knob's study: what it tried, what it found, what was taken."""
    knob: str
    tried: list[Any]
    study: int | None = None
    seconds: float = 0.0
    taken: Any = None            # the value taken (the config so far's where none was faster)
    words: list[str] = field(default_factory=list)    # each variant's decision
    bits: str = ""               # what the taken value does to the bits
    loaded: bool = False
    skipped: str | None = None   # why it was not priced


@dataclass
class Proof:
    label: str
    runs: list[int]
    accuracy: list[float]
    seconds_to_target: list[float | None]

    def text(self) -> str:
        reached = [s for s in self.seconds_to_target if s is not None]
        acc = f"{statistics.mean(self.accuracy):.2%}" + (
            f" ± {statistics.stdev(self.accuracy):.2%}" if len(self.accuracy) > 1 else "")
        return (f"{self.label}: accuracy {acc} over {len(self.runs)} seeds; "
                + (f"{TARGET:.0%} in {statistics.mean(reached):.2f} s (mean of "
                   f"{len(reached)} of {len(self.runs)})" if reached else
                   f"never at {TARGET:.0%}"))


def plan_knobs(base: RunConfig, asked: list[str], device: str, m: Any = None
               ) -> tuple[list[tuple[str, list[Any]]], list[str]]:
    """The knobs to price and the values to try, checked: an unknown knob, one that is not
    about speed, or a value this machine cannot run is refused in one line (nothing is
    stored). `asked`: KEY or KEY=V1,V2; none: the device's defaults, less the values this
    machine `m` emulates or lacks (core.settings.fit.lacking: bf16 on a CPU without bf16
    instructions), each said in the second list; named with `--knobs amp=bf16`, one is
    priced all the same."""
    from .core.settings import fit as fit_rules
    from .core.settings.machine import device_type
    left_out: list[str] = []
    kind = "cuda" if device.startswith("cuda") else "cpu"
    out: list[tuple[str, list[Any]]] = []
    for item in asked or DEFAULT_KNOBS[kind]:
        key, _, values = item.partition("=")
        key = key.strip()
        if key not in config.FIELDS:
            raise config.unknown_key(key)
        if key not in SPEED_KNOBS:
            raise ConfigError("--knobs", f"{key} is not a speed knob; fit prices "
                              f"{', '.join(SPEED_KNOBS)}")
        options, where = SPEED_KNOBS[key]
        if where not in ("both", kind):
            raise ConfigError("--knobs", f"{key} acts on {where.upper()} only; this fit's "
                              f"device is {device}")
        tried = [config.parse_value(key, v) for v in values.split(",")] if values else \
            [v for v in options if v != getattr(base, key)]
        refused = {v: why for v in tried if (why := _refusal(base, key, v)) is not None}
        if values and refused:      # asked for by name: each must run here, or it is refused
            value, why = next(iter(refused.items()))
            raise ConfigError("--knobs", f"{key}={value}: {why}")
        tried = [v for v in tried if v not in refused]
        if not values and m is not None:
            here = device_type(base.device, m)
            for v in list(tried):
                if (why := fit_rules.lacking(key, v, here, m)) is not None:
                    tried.remove(v)
                    left_out.append(f"{key}={v}: not priced, {why} (--knobs {key}={v} "
                                    "prices it all the same)")
        if tried:
            out.append((key, tried))
    if not out:
        raise ConfigError("--knobs", "nothing to price: every value asked is the config's "
                          "own or cannot run here")
    return out, left_out


def _refusal(base: RunConfig, key: str, value: Any) -> str | None:
    """Why `key = value` on top of `base` cannot train here (a combination the config
    refuses, or one this machine cannot run), or None."""
    try:
        cfg = base.replace(**{key: value})
    except ConfigError as e:
        return f"{e.key}: {e.reason}"
    refusal = runner.device_refusal(cfg.to_dict())
    return None if refusal is None else f"cannot run on this machine: {refusal}"


# Training samples of the datasets a proof can train to their end (the config's epochs)
TRAIN_SIZES = {"mnist-sample": 8000, "mnist": 60000, "fashion-mnist": 60000,
               "kmnist": 60000, "emnist": 112800, "cifar10": 50000}


def fit(session: Path, base: RunConfig, knobs: list[tuple[str, list[Any]]], steps: int,
        seeds: int, say: Callable[[str], None]) -> tuple[RunConfig, list[Step],
                                                          list[Proof], dict[str, float]]:
    """Prices the knobs one by one on top of each other, then proves the result (see the
    module's text). Returns the fitted config, each knob's step, the two proofs and where
    the time went."""
    spent: dict[str, float] = {}
    current = base
    steps_done: list[Step] = []
    for key, tried in knobs:
        step = Step(key, tried)
        steps_done.append(step)
        tried = [v for v in tried if v != getattr(current, key) and
                 _refusal(current, key, v) is None]
        if not tried:
            step.skipped, step.taken = "nothing else runs on top of the choices so far", \
                getattr(current, key)
            continue
        if pricing.sort_out(current, [(key, tried)])[0]:
            # its price in steady-state windows (two new processes a pair): seconds
            t0 = time.monotonic()
            current = _by_windows(step, current, key, tried, say)
            step.seconds = spent[f"price {key}"] = time.monotonic() - t0
            step.taken = getattr(current, key)
            continue
        # (logged often enough for a steady samples/s in a short run: a price does not
        # depend on its bookkeeping, core.analysis.study.PRICE_IGNORES)
        priced = current.replace(log_every=max(1, min(current.log_every, steps // 6)))
        planned = studies.prepare(priced, [(key, tried)], steps, repeats=1,
                                  name=f"fit-{key}", decide=sequential.DEFAULT_MARGIN)
        with SessionStore(session) as store:
            step.study = store.create_study(planned.kind, planned.name, planned.spec,
                                            planned.runs)
        say(f"fit: pricing {key} ({', '.join(map(str, tried))} against "
            f"{getattr(current, key)}), study {step.study}")
        t0 = time.monotonic()
        status = runner.run_study(session, step.study, say)
        step.seconds = spent[f"price {key}"] = time.monotonic() - t0
        if status != "finished":
            raise BadInput(f"fit stopped: study {step.study} ended {status}")
        with SessionStore(session, create=False) as store:
            _, rows = studies.table(store, step.study)
        best = None
        for row in rows[1:]:
            d = row.decision
            step.words.append(f"{row.label}: {d.words if d else 'no decision'}")
            step.loaded |= bool(row.loaded_rounds)
            if d is not None and d.verdict == "faster" and \
                    (best is None or d.interval.ratio > best.decision.interval.ratio):
                best = row
        if best is not None:
            row = best
            value = next(v for v in tried if studies._label(key, v) == row.label)
            current = current.replace(**{key: value})
            step.bits = ("the same bits as before" if row.bit_identical else
                         "other bits than before" if row.bit_identical is False else
                         "bits not compared")
        step.taken = getattr(current, key)
    proofs = []
    for label, cfg in (("start", base), ("fitted", current)):
        if label == "fitted" and cfg == base:      # nothing was faster: one proof says it
            say("fit: nothing was faster than the start config: its proof is the fitted one's")
            proofs.append(dataclasses.replace(proofs[0], label="fitted (the start config)"))
            continue
        t0 = time.monotonic()
        proofs.append(prove(session, label, cfg, seeds, say))
        spent[f"prove {label}"] = time.monotonic() - t0
    return current, steps_done, proofs, spent


def _by_windows(step: Step, current: RunConfig, key: str, tried: list[Any],
                say: Callable[[str], None]) -> RunConfig:
    """A knob's values against the config so far in alternating windows (pricing.py), each
    price kept for this machine; the fastest that is faster taken."""
    from .core.analysis import prices
    best: tuple[float, Any] | None = None
    warm = runner.WarmLauncher.shared()
    try:
        warm.wait_ready(timeout=120)
        for value in tried:
            say(f"fit: pricing {key} = {value} against {getattr(current, key)} in windows")
            p = pricing.price(current, current.replace(**{key: value}), say=say, warm=warm)
            kept = pricing.kept(key, value, current, p)
            if kept is not None:
                prices.add([kept])
            step.words.append(f"{key} = {value}: {p.decision.words} (steady state; "
                              f"{p.startup_text()})")
            step.loaded |= p.loaded_pairs > 0
            iv = p.decision.interval
            if p.decision.verdict == "faster" and iv is not None and \
                    (best is None or iv.ratio > best[0]):
                best = (iv.ratio, value)
    finally:
        warm.close()
    if best is None:
        return current
    step.bits = "bits not compared (priced in windows; the proof compares accuracy)"
    return current.replace(**{key: best[1]})


def prove(session: Path, label: str, cfg: RunConfig, seeds: int,
          say: Callable[[str], None]) -> Proof:
    """A config trained to its end with `seeds` seeds (a seed sweep), every epoch
    evaluated: each run's last accuracy and its time to TARGET from its start."""
    full = cfg.replace(eval_every=1)
    steps = _steps_of(full)
    planned = studies.prepare(full, [], steps, repeats=seeds, name=f"fit-proof-{label}")
    with SessionStore(session) as store:
        sid = store.create_study(planned.kind, planned.name, planned.spec, planned.runs)
    say(f"fit: proving the {label} config, {seeds} seeds of {steps} steps (study {sid})")
    runner.run_study(session, sid, say)
    runs, acc, secs = [], [], []
    with SessionStore(session, create=False) as store:
        for v in store.study(sid)["variants"]:
            if v["run_id"] is None:
                continue
            run = store.run(v["run_id"])
            evals = [e for e in store.evals(v["run_id"]) if e["accuracy"] is not None]
            if not evals:
                continue
            runs.append(v["run_id"])
            acc.append(evals[-1]["accuracy"])
            hit = next((e for e in evals if e["accuracy"] >= TARGET), None)
            secs.append(hit["t"] - run["started"] if hit and run["started"] else None)
    return Proof(label, runs, acc, secs)


def _steps_of(cfg: RunConfig) -> int:
    """The steps a config trains to its end (its epochs over its training set), or its
    max_steps: what a proof of it trains."""
    if cfg.max_steps:
        return cfg.max_steps
    from .core.settings import machine
    name = cfg.dataset
    if name == "auto":
        root, _ = machine.data_root(cfg.to_dict())
        name = "mnist" if machine.mnist_on_disk(root) else "mnist-sample"
    if name not in TRAIN_SIZES:
        raise ConfigError("dataset", f"fit proves its config by training it to its end, "
                          f"and cannot tell how many steps that is for {shown(name, 60)}; "
                          "set max_steps")
    size = min(TRAIN_SIZES[name], cfg.train_samples or TRAIN_SIZES[name])
    per = size // cfg.batch_size if cfg.drop_last else -(-size // cfg.batch_size)
    return per * cfg.epochs


def same_accuracy(start: Proof, fitted: Proof) -> tuple[bool, str]:
    """Whether the fitted config's accuracy is the start's within the seeds' spread: its
    mean within twice the start's sd (at least 0.3 points) of the start's mean."""
    mean = statistics.mean(start.accuracy)
    sd = statistics.stdev(start.accuracy) if len(start.accuracy) > 1 else 0.0
    allowed = max(2 * sd, 0.003)
    got = statistics.mean(fitted.accuracy)
    ok = got >= mean - allowed
    return ok, (f"fitted {got:.2%} against the start's {mean:.2%} ± {sd:.2%}: "
                + ("the same within the seeds' spread" if ok else
                   f"lower by more than {allowed:.2%}, the seeds' spread"))


def preset_text(fitted: RunConfig, steps_done: list[Step], machine_words: str,
                start: str) -> str:
    """The preset "fastest here": each choice with its price here and what it does to the
    bits, then the config."""
    lines = [f"# Fastest here: `tui-trainer fit` on {machine_words},",
             f"# {time.strftime('%Y-%m-%d')}, from {start}. Each speed knob was priced on top "
             "of the choices before it",
             "# (a study that decides: faster, slower, the same within ±5%, or unknown):"]
    for s in steps_done:
        if s.skipped:
            lines.append(f"#   {s.knob} = {shown(s.taken, 40)}: not priced ({s.skipped})")
            continue
        how = f"study {s.study}" if s.study is not None else "windows"
        lines.append(f"#   {s.knob} = {shown(s.taken, 40)} ({how}"
                     + ("; measured under load" if s.loaded else "") + "): "
                     + "; ".join(shown(w, 200) for w in s.words)
                     + (f"; taken, {s.bits}" if s.bits else
                        "; kept as it was (the start config's bits)"))
    return "\n".join(lines) + "\n" + to_toml(fitted, comments=False)


def save(name: str, text: str) -> Path:
    return presets.save(name, text)

