"""A knob's price on this machine, remembered: what every A/B study of this user measured,
kept per machine so the form, `config KEY`, `machine` and the presets' choices can say
"bf16: 0.50x [0.41-0.57] here, 2026-11-29" without training again.

One JSON line a price in the user's data folder (`prices.jsonl`, beside the sessions): the
machine it was measured on (`core.settings.hardware.Cpu.key`, and the GPU's name on CUDA),
the knob, its value and the base's, the samples/s ratio with its interval and verdict, the
rounds, the date, the study (session folder, id, name), what it was measured on (model,
dataset, batch) and whether a round shared the CPU with another process. A price from another
machine, or one measured under load, is never shown as this machine's (`here`).

The file is the user's own and read as untrusted: a line that does not read back is passed
over. Core layer: no torch, no textual.
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..session.paths import user_data_dir
from ..settings.hardware import Cpu
from ..text import shown

FILE = "prices.jsonl"
# The verdicts that decide a choice (a fixed study's, and a deciding study's but "unknown")
DECIDED = ("faster", "slower", "within noise", "the same")
MAX_LINES = 5000          # the newest kept; a longer file is cut when written


@dataclass(frozen=True)
class Price:
    machine: str            # the machine's key: Cpu.key, with the GPU on CUDA
    words: str              # the machine in words
    knob: str
    value: Any
    base: Any               # the knob's value in the study's base
    ratio: float            # samples/s, value over base
    low: float | None
    high: float | None
    verdict: str | None     # faster, slower, within noise; None without an interval
    rounds: int
    date: str               # YYYY-MM-DD
    study: str              # 'study 3 (name) in SESSION'
    context: str            # what it was measured on: 'model fast, mnist-sample, batch 256'
    loaded: bool = False    # a round shared the CPU with another process

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> "Price | None":
        if not isinstance(d, dict):
            return None
        try:
            p = cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})
        except TypeError:
            return None
        ok = (isinstance(p.machine, str) and isinstance(p.knob, str)
              and isinstance(p.ratio, (int, float)) and p.ratio > 0
              and all(x is None or isinstance(x, (int, float)) for x in (p.low, p.high))
              and isinstance(p.date, str) and isinstance(p.rounds, int)
              # (an A/A, the base's own value, kept by a price in windows before 2026-11-30:
              # the machine's noise, no knob's price)
              and p.value != p.base)
        return p if ok else None

    def interval(self) -> str:
        if self.low is None or self.high is None:
            return f"{self.ratio:.2f}x"
        return f"{self.ratio:.2f}x [{self.low:.2f}-{self.high:.2f}]"

    def line(self, here: bool = True) -> str:
        """'amp = bf16: 0.50x [0.41-0.57] slower here, 2026-11-29 (study 3 in ...; model
        fast, mnist-sample, batch 256)'."""
        where = "here" if here else f"on {self.words}"
        load = " (under load)" if self.loaded else ""
        verdict = f" {self.verdict}" if self.verdict else ""
        return (f"{self.knob} = {shown(self.value, 40)}: {self.interval()}{verdict} against "
                f"{shown(self.base, 40)} {where}{load}, {self.date} ({shown(self.study, 120)};"
                f" {shown(self.context, 80)})")


def path() -> Path:
    return user_data_dir() / FILE


def machine_key(settings: Any) -> tuple[str, str] | None:
    """(key, words) of the machine a run recorded (its effective settings), or None for a
    run recorded before machines were (or a damaged record)."""
    if not isinstance(settings, dict):
        return None
    cpu = Cpu.from_dict(settings.get("cpu"))
    if cpu is None:
        return None
    device = str(settings.get("device", "cpu"))
    if device.startswith("cuda"):
        gpu = shown(settings.get("device_name"), 60)
        cc = shown(settings.get("cuda_capability"), 10)
        return f"{cpu.key}|{gpu} {cc}", f"{gpu} ({cc}) with {cpu.describe()}"
    return cpu.key, cpu.describe()


def machine_of(m: Any, device: str = "cpu") -> tuple[str, str] | None:
    """(key, words) of this machine (a core.settings.machine.Machine) for runs on `device`
    ("cpu" or "cuda:N"), as a run on it records them."""
    if m is None or m.cpu is None:
        return None
    settings: dict[str, Any] = {"cpu": m.cpu.to_dict(), "device": device}
    if device.startswith("cuda") and m.cuda:
        i = int(device.split(":")[1]) if ":" in device else 0
        settings.update(device_name=m.cuda_names[i] if i < len(m.cuda_names) else "?",
                        cuda_capability=m.cuda_capabilities[i]
                        if i < len(m.cuda_capabilities) else "?")
    return machine_key(settings)


def apart(settings: list[Any]) -> str | None:
    """Where runs trained on different machines, one line saying which (a price across two
    machines is not a price); None when they share one, or a run does not say."""
    keys = [machine_key(s) for s in settings]
    if any(k is None for k in keys) or len({k[0] for k in keys}) < 2:  # type: ignore[index]
        return None
    words = list(dict.fromkeys(k[1] for k in keys))   # type: ignore[index]
    return ("the runs trained on different machines (" + "; ".join(words[:3]) + "): a "
            "difference in speed is the machines' as much as the knobs'")


def read(file: Path | None = None) -> list[Price]:
    """Every remembered price, oldest first; lines that do not read back passed over."""
    try:
        text = (file or path()).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines()[-MAX_LINES:]:
        try:
            p = Price.from_dict(json.loads(line))
        except ValueError:
            continue
        if p is not None:
            out.append(p)
    return out


def add(new: list[Price], file: Path | None = None) -> None:
    """Appends prices (the file cut to its newest MAX_LINES), written to a temporary file
    and moved into place."""
    if not new:
        return
    target = file or path()
    target.parent.mkdir(parents=True, exist_ok=True)
    kept = [p.to_dict() for p in read(target)] + [p.to_dict() for p in new]
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(json.dumps(p) + "\n" for p in kept[-MAX_LINES:]), encoding="utf-8")
    os.replace(tmp, target)


def here(all_prices: list[Price], machine: str | None, knob: str | None = None,
         value: Any = None, loaded: bool = False) -> list[Price]:
    """The prices measured on this machine (its key), newest first: of one knob (and one
    value) where given; those measured under load only when asked."""
    if machine is None:
        return []
    return [p for p in reversed(all_prices) if p.machine == machine
            and (knob is None or p.knob == knob) and (value is None or p.value == value)
            and (loaded or not p.loaded)]


def decided(all_prices: list[Price], machine: str | None, knob: str, value: Any,
            base: Any) -> Price | None:
    """The newest price with a verdict of `knob` at `value` against `base` measured quietly
    on this machine (either way round: a price of base against value is turned over), or
    None."""
    for p in here(all_prices, machine, knob):
        if p.verdict not in DECIDED or p.low is None or p.high is None:
            continue        # no verdict, or "unknown" (a deciding study's cap): not decided
        if p.value == value and p.base == base:
            return p
        if p.value == base and p.base == value:
            return flipped(p)
    return None


def flipped(p: Price) -> Price:
    """The price of the base against the value."""
    words = {"faster": "slower", "slower": "faster"}
    return Price(**{**p.to_dict(), "value": p.base, "base": p.value, "ratio": 1 / p.ratio,
                    "low": 1 / p.high if p.high else None,
                    "high": 1 / p.low if p.low else None,
                    "verdict": words.get(p.verdict or "", p.verdict)})


def of_study(store: Any, study_id: int, session: str) -> list[Price]:
    """The prices an ended A/B study measured: each arm that changes one knob against the
    base, with a samples/s interval, all its runs on one machine."""
    from . import study as studies
    record, rows = studies.table(store, study_id)
    if record["kind"] != "ab" or not rows or rows[0].run_id is None:
        return []
    variants = record["variants"]
    base_cfg = variants[0]["config"]
    settings = [store.run(v["run_id"])["settings"] for v in variants if v["run_id"]]
    keys = {k[0] for s in settings if (k := machine_key(s)) is not None}
    first = machine_key(settings[0]) if settings else None
    if first is None or len(keys) != 1 or any(machine_key(s) is None for s in settings):
        return []
    context = (f"model {shown(base_cfg.get('model'), 40)}, {shown(base_cfg.get('dataset'), 40)}"
               f", batch {shown(base_cfg.get('batch_size'), 10)}")
    where = f"study {study_id} ({shown(record['name'], 40)}) in {shown(session, 200)}"
    today = datetime.date.today().isoformat()
    out = []
    for row in rows[1:]:
        arm = next((v for v in variants if v["run_id"] in row.runs and v["run_id"]), None)
        iv = (row.intervals or {}).get("samples_per_s")
        if arm is None or iv is None or iv.low is None:
            continue
        changed = [k for k in arm["config"] if k != "seed"
                   and arm["config"].get(k) != base_cfg.get(k)]
        if len(changed) != 1:
            continue
        knob = changed[0]
        out.append(Price(machine=first[0], words=first[1], knob=knob,
                         value=arm["config"][knob], base=base_cfg.get(knob),
                         ratio=iv.ratio, low=iv.low, high=iv.high,
                         verdict=(row.verdicts or {}).get("samples_per_s"),
                         rounds=row.compared_rounds or row.done, date=today, study=where,
                         context=context, loaded=bool(row.loaded_rounds)))
    return out
