"""What this machine's processor is: its model, its cores, the instruction set torch
dispatches to, and whether bf16 and fp16 run in hardware. Read from /proc/cpuinfo without
importing torch (the dashboard and the presets' choices need it at once); a training
process adds what torch itself says it dispatches to (`engine.knobs.machine_facts`).

What is fast on one CPU can be many times slower on another: bf16 autocast on a CPU
without bf16 instructions is emulated (measured 0.50x on an AMD EPYC with AVX2 only, issue
65). So every run records these facts, and a price or a choice names the machine it holds
for (`Cpu.key`).

Core layer: imports neither torch nor textual.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CPUINFO = Path("/proc/cpuinfo")
# torch's own switch for the instruction set it dispatches to (lower only): ATen reads it
# at import, and `torch.backends.cpu.get_cpu_capability()` then reports it.
CAPABILITY_ENV = "ATEN_CPU_CAPABILITY"

# The flags that say a number format runs in hardware (Linux's names): x86's AVX-512 and
# AMX extensions, and Arm's.
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
FP16_FLAGS = ("avx512_fp16", "amx_fp16", "fphp")
AMX_FLAGS = ("amx_tile", "amx_bf16", "amx_int8")
# The capabilities under which torch's bf16 kernels can use those instructions (a lower
# one, chosen by ATEN_CPU_CAPABILITY, emulates them whatever the flags say); on x86 torch
# says DEFAULT, AVX2 or AVX512 (AVX512 on a CPU with AMX too).
WIDE = ("AVX512", "SVE256")


@dataclass(frozen=True)
class Cpu:
    """A processor as a run records it (a plain dict in the session: read back untrusted)."""
    model: str = "unknown CPU"
    physical_cores: int | None = None
    logical_cores: int = 1
    capability: str = "?"      # the instruction set torch dispatches to (AVX2, AVX512, ...)
    bf16: bool = False         # bf16 arithmetic in hardware, usable under that capability
    fp16: bool = False         # fp16 arithmetic in hardware
    amx: bool = False          # Intel's matrix tiles (AMX)
    flags: tuple[str, ...] = ()   # the flags among BF16_FLAGS, FP16_FLAGS and AMX_FLAGS

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> "Cpu | None":
        """A recorded processor, or None where the record is not one (an older run's, a
        damaged session's)."""
        if not isinstance(d, dict) or not isinstance(d.get("model"), str):
            return None
        try:
            phys = d.get("physical_cores")
            return cls(model=d["model"][:200],
                       physical_cores=int(phys) if phys is not None else None,
                       logical_cores=int(d.get("logical_cores") or 1),
                       capability=str(d.get("capability", "?"))[:20],
                       bf16=d.get("bf16") is True, fp16=d.get("fp16") is True,
                       amx=d.get("amx") is True,
                       flags=tuple(str(f)[:20] for f in d.get("flags", ())[:10]))
        except (TypeError, ValueError):
            return None

    @property
    def cores(self) -> str:
        """'2 cores' or '8 cores, 16 threads'."""
        if self.physical_cores and self.physical_cores != self.logical_cores:
            return f"{self.physical_cores} cores, {self.logical_cores} threads"
        return f"{self.logical_cores} core{'s' if self.logical_cores != 1 else ''}"

    def formats(self) -> str:
        """'bf16 in hardware (AVX512-BF16), no fp16 hardware'."""
        def named(flags: tuple[str, ...]) -> str:
            mine = [f.upper().replace("_", "-") for f in flags if f in self.flags]
            return f" ({', '.join(mine)})" if mine else ""
        bf16 = f"bf16 in hardware{named(BF16_FLAGS)}" if self.bf16 else \
            "bf16 emulated (no bf16 hardware" + (
                f" under {self.capability})" if any(f in self.flags for f in BF16_FLAGS)
                else ")")
        fp16 = f"fp16 in hardware{named(FP16_FLAGS)}" if self.fp16 else "no fp16 hardware"
        return f"{bf16}, {fp16}" + (", AMX" if self.amx else "")

    def describe(self) -> str:
        """'AMD EPYC (2 cores), AVX2; bf16 emulated (no bf16 hardware), no fp16 hardware'."""
        return f"{self.model} ({self.cores}), {self.capability}; {self.formats()}"

    def short(self) -> str:
        """'AMD EPYC (2 cores), AVX2, bf16 emulated': the form's machine line at 80 columns."""
        model = " ".join(self.model.replace("(R)", "").replace("(TM)", "").split())
        return (f"{model} ({self.cores}), {self.capability}, bf16 "
                + ("in hardware" if self.bf16 else "emulated") + (", AMX" if self.amx else ""))

    @property
    def key(self) -> str:
        """What a price measured on this processor holds for: another model, instruction
        set, format support or core count is another machine (two 'AMD EPYC's here were
        3x apart)."""
        return (f"{self.model}|{self.capability}|bf16={int(self.bf16)}|fp16={int(self.fp16)}"
                f"|{self.logical_cores}")


def read_cpuinfo(path: Path = CPUINFO) -> list[dict[str, str]]:
    """The file's text blocks, one per logical processor, as {field: value}."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    blocks: list[dict[str, str]] = []
    for part in text.split("\n\n"):
        fields = {}
        for line in part.splitlines():
            name, sep, value = line.partition(":")
            if sep:
                fields[name.strip().lower()] = value.strip()
        if fields:
            blocks.append(fields)
    return blocks


def dispatch(flags: set[str], env: str | None = None) -> str:
    """The instruction set torch's CPU kernels dispatch to on a processor with these flags
    (ATen's rule on x86: AVX512 with F, BW, VL and DQ; else AVX2 with FMA; else DEFAULT),
    lowered by ATEN_CPU_CAPABILITY as torch lowers it. Torch's own answer replaces this
    where torch is loaded (engine.knobs.machine_facts)."""
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        best = "AVX512"
    elif {"avx2", "fma"} <= flags:
        best = "AVX2"
    else:
        best = "DEFAULT"
    order = ["DEFAULT", "AVX2", "AVX512"]
    want = (env or "").strip().upper()
    if want in order and order.index(want) < order.index(best):
        return want
    return best


def cpu(path: Path = CPUINFO, capability: str | None = None,
        env: dict[str, str] | None = None) -> Cpu:
    """This processor, from /proc/cpuinfo (or `path`, a faked one in tests); `capability`
    is torch's own answer where the caller has torch, else it is worked out from the flags
    as torch works it out."""
    env = os.environ if env is None else env
    blocks = read_cpuinfo(path)
    first = blocks[0] if blocks else {}
    flags = set((first.get("flags") or first.get("features") or "").split())
    # (as runs before it named their CPU in device_name: a bit-relevant setting, so an
    # older run and a newer one of one machine must read alike)
    model = first.get("model name") or platform.processor() or platform.machine()
    logical = sum(1 for b in blocks if "processor" in b) or os.cpu_count() or 1
    pairs = {(b.get("physical id", "0"), b["core id"]) for b in blocks if "core id" in b}
    physical = len(pairs) or None
    if capability is None:
        capability = dispatch(flags, env.get(CAPABILITY_ENV)) if "flags" in first else \
            "DEFAULT"
    arm = "features" in first and "flags" not in first
    wide = arm or capability.upper() in WIDE
    return Cpu(model=model[:200], physical_cores=physical,
               logical_cores=logical, capability=capability,
               bf16=wide and any(f in flags for f in BF16_FLAGS),
               fp16=wide and any(f in flags for f in FP16_FLAGS),
               amx=any(f in flags for f in AMX_FLAGS),
               flags=tuple(f for f in dict.fromkeys((*BF16_FLAGS, *FP16_FLAGS, *AMX_FLAGS))
                             if f in flags))


# Another /proc/cpuinfo to read (tests fake another kind of CPU with it, beside
# ATEN_CPU_CAPABILITY for what torch dispatches to).
CPUINFO_ENV = "TUI_TRAINER_CPUINFO"


def cpu_source() -> Path:
    return Path(os.environ.get(CPUINFO_ENV) or CPUINFO)


_this: Cpu | None = None


def this_cpu() -> Cpu:
    """This machine's processor, read once per process (without torch)."""
    global _this
    if _this is None:
        _this = cpu(cpu_source())
    return _this
