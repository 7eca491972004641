"""Presets that fit the machine they run on: a preset names the knobs whose best value
depends on the machine (`fit = ["amp", "channels_last"]` in its TOML file), and each is
chosen here, for this machine, with its reason, never silently.

A knob's rule, in order:
1. a price measured on this machine, quietly, with a verdict (core.analysis.prices: any A/B
   study of this user) decides: the value the preset writes where it was faster here, else
   the other;
2. else the hardware: a value this machine emulates or lacks is not chosen (bf16 autocast
   on a CPU without bf16 instructions: 0.50x on an AMD EPYC with AVX2 only; on CUDA, bf16
   needs compute capability 8.0, fp16's tensor cores 7.0);
3. else the preset's own value.

What is chosen is shown where the preset is loaded (the form's notice, the command's line)
and recorded with each run (an event and a line of its log: `record`).

Core layer: imports neither torch nor textual.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..analysis import prices as price_book
from ..analysis.prices import Price
from ..text import shown
from . import config
from .machine import Machine, Problem, device_type, here

EVENT = "fit"
SAID = "fit to this machine: "


@dataclass(frozen=True)
class Choice:
    key: str
    value: Any
    written: Any           # the preset's own value
    reason: str

    def line(self) -> str:
        return f"{self.key} = {_text(self.value)}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "written": self.written,
                "reason": self.reason}


def _text(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else shown(value, 40)


# --- the rules: (the preset's value, this machine's facts) -> (value, reason) -----------

@dataclass(frozen=True)
class Facts:
    """What a rule knows: the device the run will use here, the machine, and the prices
    measured on it for that device."""
    device: str                        # "cpu", "cuda:0", "mps"
    machine: Machine
    prices: list[Price]
    key: str | None                    # the machine's price key for that device

    def measured(self, knob: str, value: Any, base: Any) -> Price | None:
        return price_book.decided(self.prices, self.key, knob, value, base)


def _by_price(knob: str, written: Any, other: Any, f: Facts
              ) -> tuple[Any, str] | None:
    """Rule 1: a decided price of `written` against `other` measured here."""
    p = f.measured(knob, written, other)
    if p is None:
        return None
    value = written if p.verdict == "faster" else other
    return value, (f"{knob} = {_text(written)} measured {p.interval()} {p.verdict} against "
                   f"{_text(other)} here, {p.date} ({p.study})")


def fit_amp(written: Any, f: Facts) -> tuple[Any, str]:
    kind = f.device.split(":")[0]
    if kind == "cpu":
        cpu = f.machine.cpu
        if written == "off":
            return _by_price("amp", "bf16", "off", f) or (
                "off", "as the preset writes it (no bf16 price measured on this CPU)")
        measured = _by_price("amp", "bf16", "off", f)
        if measured:
            return measured
        if cpu is None:
            return written, "this CPU is not known: as the preset writes it"
        if cpu.bf16:
            return "bf16", (f"this CPU runs bf16 in hardware ({shown(cpu.model, 40)}, "
                            f"{cpu.capability}, {'/'.join(cpu.flags).upper()})")
        return "off", (f"this CPU has no bf16 hardware ({shown(cpu.model, 40)}, "
                       f"{cpu.capability}): bf16 autocast would be emulated (0.50x on an "
                       "AMD EPYC with AVX2 only, docs/benchmarks.md); `tui-trainer ab "
                       "--vary amp=bf16` prices it here")
    if kind == "cuda":
        index = int(f.device.split(":")[1]) if ":" in f.device else 0
        cc = f.machine.cuda_capability(index)
        if written == "off":
            return _by_price("amp", "bf16", "off", f) or (
                "off", "as the preset writes it (fp32; no bf16 price measured on this GPU)")
        if cc is None:
            return written, "this GPU's compute capability is not known: as the preset writes it"
        if cc >= 8.0:
            return _by_price("amp", "bf16", "off", f) or (
                "bf16", f"this GPU (compute capability {cc:.1f}) has bf16 tensor cores")
        if cc >= 7.0:
            return "fp16", (f"this GPU (compute capability {cc:.1f}) has fp16 tensor cores "
                            "and no bf16: fp16 with a GradScaler")
        return "off", (f"this GPU (compute capability {cc:.1f}) has no tensor cores: "
                       "autocast would not be faster")
    return written, f"as the preset writes it (device {shown(f.device, 20)})"


def fit_channels_last(written: Any, f: Facts) -> tuple[Any, str]:
    if f.device.split(":")[0] != "cpu":
        return written, "as the preset writes it (measured on CUDA)"
    return _by_price("channels_last", written, not written, f) or (
        written, "as the preset writes it: oneDNN's channels_last convolutions were faster "
        "under AVX512 (AMD EPYC, 2026-11) and AVX2 (the same EPYC limited to AVX2, "
        "2026-11-29: 1.70 s to 98% against 3.19 s without; docs/benchmarks.md); "
        "`tui-trainer ab --vary channels_last=false` prices it here")


RULES: dict[str, Callable[[Any, Facts], tuple[Any, str]]] = {
    "amp": fit_amp,
    "channels_last": fit_channels_last,
}


def check_keys(keys: Any, where: str) -> list[str]:
    """A preset's `fit` list, checked: knobs that have a rule here."""
    ConfigError = config.ConfigError
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ConfigError("fit", f"in {where} must be a list of knob names, got {keys!r}")
    bad = [k for k in keys if k not in RULES]
    if bad:
        raise ConfigError("fit", f"in {where}: {shown(bad[0], 40)} has no per-machine rule; "
                          f"the knobs that have one: {', '.join(RULES)}")
    return keys


def choose(values: dict[str, Any], keys: list[str], m: Machine | None,
           prices: list[Price] | None = None) -> tuple[dict[str, Any], list[Choice]]:
    """The values with each fitted key chosen for machine `m`, and the choices. Without a
    machine, or on a device this machine lacks (its check refuses the config later), the
    values are the preset's and each choice says so."""
    if not keys:
        return values, []
    if m is None:
        return values, [Choice(k, values.get(k), values.get(k), "the machine is not known "
                               "yet: as the preset writes it") for k in keys]
    try:
        device = device_type(str(values.get("device", "auto")), m)
    except Problem as p:
        return values, [Choice(k, values.get(k), values.get(k), f"as the preset writes it "
                               f"({p.reason})") for k in keys]
    key = price_book.machine_of(m, device)
    facts = Facts(device, m, price_book.read() if prices is None else prices,
                  key[0] if key else None)
    out, choices = dict(values), []
    for k in keys:
        written = values.get(k, getattr(config.DEFAULTS, k))
        value, reason = RULES[k](written, facts)
        out[k] = value
        choices.append(Choice(k, value, written, reason))
    return out, choices


def load_fitted(config_file: str | Path | None = None, overrides: list[str] | None = None,
                machine: Machine | None = None, probe: bool = True,
                measured: list[Price] | None = None
                ) -> tuple[config.RunConfig, list[Choice]]:
    """The config of a file and --set overrides, with the knobs its preset lets the machine
    choose (`fit`) chosen for `machine` (None: this processor, and, where the config's
    device may be CUDA, what a child process says: core.settings.machine.facts), and those
    choices, to show and record (`probe` False: a machine not given is not asked for, and
    each choice says it is not known yet; `measured`: the prices kept here, read from
    their file where not given). A knob set with --set is the user's: not chosen.
    (`config.load` takes the file's values as written.)"""
    values, fitted = config.read_preset(config_file) if config_file is not None else ({}, [])
    fitted = check_keys(fitted, str(config_file))
    overrides_d = config.parse_overrides(overrides or [])
    fitted = [k for k in fitted if k not in overrides_d]
    values = {**values, **overrides_d}
    config.from_dict({**config.DEFAULTS.to_dict(), **values})   # bad input stops here, first
    if fitted and machine is None and probe:
        machine = here(str(values.get("device", config.DEFAULTS.device)))
    values, choices = choose(values, fitted, machine, measured)
    return config.from_dict({**config.DEFAULTS.to_dict(), **values}), choices


def still_chosen(choices: list[Choice], values: dict[str, Any]) -> list[Choice]:
    """The choices a config still holds (a value the user changed since is theirs)."""
    return [c for c in choices if values.get(c.key) == c.value]


def record(store: Any, run_id: int, choices: list[Choice]) -> None:
    """Each choice a run's config holds, kept on the run (an event its log shows)."""
    for c in choices:
        store.add_event(run_id, EVENT, f"{SAID}{c.line()}", data=c.to_dict())


# --- what the form says beside a knob --------------------------------------------------

def lacking(key: str, value: Any, device: str, m: Machine) -> str | None:
    """Why this machine emulates or lacks a knob's value on `device`, or None: a few words
    (the form's note fits one line at 80 columns; the reasons with figures are the rules')."""
    kind = device.split(":")[0]
    if key != "amp" or value == "off":
        return None
    if kind == "cpu" and m.cpu is not None and value == "bf16" and not m.cpu.bf16:
        return f"bf16 emulated here ({m.cpu.capability}, no bf16 hardware)"
    if kind == "cuda":
        index = int(device.split(":")[1]) if ":" in device else 0
        cc = m.cuda_capability(index)
        need = 8.0 if value == "bf16" else 7.0
        if cc is not None and cc < need:
            return f"no {value} tensor cores on this GPU ({cc:.1f}; they need {need:.1f})"
    return None


def notes(values: dict[str, Any], m: Machine | None, all_prices: list[Price],
          keys: Any = None) -> dict[str, str]:
    """{knob: a line} for the knobs whose value this machine emulates or lacks, and those
    with a price measured here for their value (quietly; the newest): what the form shows
    under each. Nothing without a machine, or for a device it lacks."""
    if m is None:
        return {}
    try:
        device = device_type(str(values.get("device", "auto")), m)
    except Problem:
        return {}
    key = price_book.machine_of(m, device)
    mine = price_book.here(all_prices, key[0] if key else None)
    out: dict[str, str] = {}
    for k in (keys or values):
        value = values.get(k)
        said = lacking(k, value, device, m)
        price = next((p for p in mine if p.knob == k and p.value == value), None) or \
            next((price_book.flipped(p) for p in mine if p.knob == k and p.base == value),
                 None)
        if price is not None:
            verdict = f" {price.verdict}" if price.verdict else ""
            said = (f"{said}; " if said else "") + (
                f"{_text(value)}: {price.interval()}{verdict} against {_text(price.base)} "
                f"here, {price.date}" + (f" ({shown(price.context, 80)})"   # what it priced
                                         if isinstance(price.context, str) else ""))
        if said:
            out[k] = said
    return out
