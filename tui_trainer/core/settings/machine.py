"""Can this machine train a config? The rules, in one place, without importing torch.

The engine asks torch for the facts (`engine.knobs.machine_facts`) and applies the
rules here when a run starts; the dashboard gets the same facts once from a child process
(`tui-trainer machine --json`, see `probe`) and applies the same rules before Start, so a
config this machine cannot run is refused at its field instead of becoming a crashed run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .config import FOLDER, is_folder_dataset, world_size
from .hardware import Cpu
from ..session.paths import default_data_dir

# Debian's dataset-fashion-mnist package puts the four IDX files here.
FASHION_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@dataclass(frozen=True)
class Machine:
    """What torch sees on this machine."""
    torch: str = "?"
    cuda: bool = False
    cuda_devices: int = 0
    cuda_names: tuple[str, ...] = ()
    mps: bool = False
    cpu: Cpu | None = None                      # the processor (core.settings.hardware)
    cuda_capabilities: tuple[str, ...] = ()     # each CUDA device's compute capability, "9.0"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Machine":
        return cls(torch=str(d.get("torch", "?")), cuda=bool(d.get("cuda")),
                   cuda_devices=int(d.get("cuda_devices", 0)),
                   cuda_names=tuple(d.get("cuda_names", ())), mps=bool(d.get("mps")),
                   cpu=Cpu.from_dict(d.get("cpu")),
                   cuda_capabilities=tuple(str(c)[:10] for c in d.get("cuda_capabilities", ())))

    def gpus(self) -> str:
        """'1 CUDA device(s): NVIDIA H200 (9.0)' or 'no CUDA'."""
        if not self.cuda:
            return f"{'Apple GPU, ' if self.mps else ''}no CUDA"
        named = sorted(set(zip(self.cuda_names, self.cuda_capabilities or
                               ("",) * len(self.cuda_names), strict=False)))
        names = ", ".join(f"{n} ({c})" if c else n for n, c in named) or "CUDA"
        return f"{self.cuda_devices} CUDA device(s): {names}"

    def describe(self) -> str:
        if self.cpu is not None:
            return f"{self.cpu.describe()}; {self.gpus()}; torch {self.torch}"
        if self.cuda:
            return f"{self.gpus()}; torch {self.torch}"
        return f"CPU only{' (+ Apple GPU)' if self.mps else ''}, no CUDA; torch {self.torch}"

    def line(self) -> str:
        """`describe`, shorter: the form's machine line (two lines at most at 80 columns;
        `tui-trainer machine` says it all)."""
        if self.cpu is None:
            return self.describe()
        return f"{self.cpu.short()}; {self.gpus()}; torch {self.torch.split('+')[0]}"

    def cuda_capability(self, index: int = 0) -> float | None:
        """Device `index`'s compute capability as a number (8.0), or None where unknown."""
        try:
            return float(self.cuda_capabilities[index])
        except (IndexError, ValueError):
            return None


class Problem(Exception):
    """A config this machine cannot run: the config key and why."""

    def __init__(self, key: str, reason: str):
        self.key, self.reason = key, reason
        super().__init__(f"{key}: {reason}")


def device_type(spec: str, m: Machine) -> str:
    """The device a `device` setting means here ("cuda:1", "cpu", ...); raises Problem when
    this machine has no such device."""
    if spec == "auto":
        return "cuda" if m.cuda else "mps" if m.mps else "cpu"
    if spec.startswith("cuda"):
        if not m.cuda:
            raise Problem("device", f"{spec} was asked for but there is no usable CUDA device "
                          f"here (torch {m.torch}, torch.cuda.is_available() is False); use "
                          "device = cpu or auto")
        index = int(spec.split(":")[1]) if ":" in spec else 0
        if index >= m.cuda_devices:
            raise Problem("device", f"{spec} was asked for but this machine has "
                          f"{m.cuda_devices} CUDA device(s): cuda:0 to "
                          f"cuda:{m.cuda_devices - 1}")
        return f"cuda:{index}"
    if spec == "mps" and not m.mps:
        raise Problem("device", "mps was asked for but this machine has no Apple GPU; use "
                      "device = cpu or auto")
    return spec


# How a CUDA run starts CUDA (engine/cuda_start.py): unset or "0", in the run's own thread
# as its setup and first steps reach it (the default: measured sooner from Start than
# either thread on an H200); "shapes", the context, the handles and the run's kernels in a
# thread beside its setup; "handles", the context and handles only. By name, as the
# benchmarks take them (`@shapes`, `@handles`, `@off`): the variable's value for each.
CUDA_START_ENV = "TUI_TRAINER_CUDA_START"
CUDA_STARTS = {"shapes": "shapes", "handles": "handles", "off": "0"}


# Device settings that mean the first CUDA device (where there is one).
FIRST_DEVICES = ("auto", "cuda", "cuda:0")


def cuda_device(config: dict[str, Any]) -> str | None:
    """The device setting of a run that starts CUDA in its own process where the machine has
    a CUDA device ("auto", "cuda" or "cuda:N"), or None: a run of another device, or of
    several processes (a group's agent leaves CUDA to its ranks). The warm launcher may give
    such a run its spare, which has started CUDA's driver already (launcher/spare.py). A
    config that is not a table (a damaged session's) says None."""
    if not isinstance(config, dict):
        return None
    spec = str(config.get("device", "auto"))
    if (spec == "auto" or spec.startswith("cuda")) and world_size(config) == 1:
        return spec[:40]
    return None


# cuBLAS needs a fixed workspace to be deterministic; a run sets it before cuBLAS's first use
# where its environment sets none (engine/knobs.py, by `cublas_workspace`).
CUBLAS_DETERMINISTIC = ":4096:8"

# Which spare the warm launcher makes before Start (its environment; launcher/spare.py).
SPARE_ENV = "TUI_TRAINER_SPARE"


def cublas_workspace(config: dict[str, Any]) -> str | None:
    """The CUBLAS_WORKSPACE_CONFIG a run sets for itself on CUDA where its environment sets
    none: the deterministic knob's (CUBLAS_DETERMINISTIC), or None (torch's default). The
    run applies it (engine/knobs.py); the warm launcher is told it, because with a torch
    that cannot set cuBLAS's workspace size a spare that made cuBLAS's handles before Start
    is given only runs of the workspace it made them with (launcher/spare.py). A config
    that is not a table says None."""
    if isinstance(config, dict) and str(config.get("deterministic", "on")) != "off":
        return CUBLAS_DETERMINISTIC
    return None


def knob_problem(config: dict[str, Any], device: str) -> None:
    """Knobs that need a kind of device; raises Problem."""
    kind = device.split(":")[0]
    if config.get("amp") == "fp16" and kind != "cuda":
        raise Problem("amp", "fp16 needs a CUDA device (fp16 kernels and a GradScaler); this "
                      f"run's device is {kind}: use amp = bf16 or off")
    if config.get("compile") == "reduce-overhead" and kind != "cuda":
        raise Problem("compile", "reduce-overhead captures CUDA graphs, which need a CUDA "
                      f"device; this run's device is {kind}: use compile = on (or "
                      "max-autotune)")
    if config.get("cuda_graph") == "step" and kind != "cuda":
        raise Problem("cuda_graph", "step captures CUDA graphs, which need a CUDA device; this "
                      f"run's device is {kind}: use cuda_graph = off")
    if config.get("dist_backend") == "nccl" and kind != "cuda":
        raise Problem("dist_backend", "nccl needs CUDA devices; this run's device is "
                      f"{kind}: use dist_backend = gloo or auto")


def data_root(config: dict[str, Any]) -> tuple[Path, str]:
    """Where the run's datasets live, and the config key that says so."""
    if config.get("data_dir"):
        return Path(str(config["data_dir"])).expanduser(), "data_dir"
    return default_data_dir(), "data_dir (default)"


def mnist_on_disk(root: Path) -> bool:
    raw = root / "MNIST" / "raw"
    return all((raw / n).exists() or (raw / f"{n}.gz").exists() for n in IDX_FILES)


def fashion_source(root: Path) -> Path | None:
    """The folder holding Fashion-MNIST's IDX files (unpacked in root, or .gz in root or the
    system folder), or None."""
    raw = root / "FashionMNIST" / "raw"
    if all((raw / n).exists() for n in IDX_FILES):
        return raw
    for source in (raw, FASHION_SYSTEM_DIR):
        if all((source / f"{n}.gz").exists() for n in IDX_FILES):
            return source
    return None


def offline() -> bool:
    return bool(os.environ.get("TUI_TRAINER_OFFLINE"))


def data_problem(config: dict[str, Any]) -> None:
    """Whether the run's dataset can be found, judged from the file system alone (full MNIST
    may still be downloaded when it is missing and the machine is online); raises Problem."""
    root, key = data_root(config)
    if root.exists() and not root.is_dir():
        raise Problem(key, f"{root} is a file, not a folder; give a folder for the datasets "
                      "(empty means the user's cache folder)")
    name = config.get("dataset", "auto")
    if is_folder_dataset(name) and not folder_root(name).is_dir():
        raise Problem("dataset", folder_missing(folder_root(name)))
    if name in ON_DISK and (why := on_disk_missing(name, root)) is not None:
        raise Problem("dataset", why)
    if name == "fashion-mnist" and fashion_source(root) is None:
        raise Problem("dataset", fashion_missing(root))
    if name == "mnist" and offline() and not mnist_on_disk(root):
        raise Problem("dataset", mnist_missing(root))


# Datasets torchvision reads from data_dir in its own layout, never downloaded here: where
# each one's files are (relative to data_dir), and those files.
ON_DISK = {
    "kmnist": ("KMNIST/raw", IDX_FILES),
    "emnist": ("EMNIST/raw", tuple(f"emnist-balanced-{s}-{k}-ubyte" for s in ("train", "test")
                                   for k in ("images-idx3", "labels-idx1"))),
    "cifar10": ("cifar-10-batches-py", (*(f"data_batch_{i}" for i in range(1, 6)),
                                        "test_batch", "batches.meta")),
}


def on_disk_missing(name: str, root: Path) -> str | None:
    """Why a dataset read in torchvision's layout cannot be (where it was looked for), or
    None when its files are there."""
    folder, files = ON_DISK[name]
    where = root / folder
    lacking = [f for f in files if not (where / f).is_file()]
    if not lacking:
        return None
    return (f"{name} is not in {where} (lacking {', '.join(lacking[:3])}"
            f"{', ...' if len(lacking) > 3 else ''}): put torchvision's files there (its "
            "download=True writes that layout), or set data_dir to where they are; it is "
            "never downloaded here")


def folder_root(name: str) -> Path:
    """The folder of `dataset = folder:PATH` (~ expanded, relative to where the command
    runs, links followed)."""
    p = Path(name[len(FOLDER):].strip()).expanduser()
    return (p if p.is_absolute() else Path.cwd() / p).resolve()


def folder_missing(root: Path) -> str:
    return (f"{root} is not a folder; give folder:PATH, PATH a folder holding one folder of "
            "images per class (and, optionally, val/ with the same class folders)")


def fashion_missing(root: Path) -> str:
    return (f"Fashion-MNIST is not in data_dir ({root / 'FashionMNIST' / 'raw'}) nor in "
            f"{FASHION_SYSTEM_DIR} (Debian: apt-get install dataset-fashion-mnist). Use "
            "dataset = mnist-sample for the sample shipped with tui-trainer.")


def mnist_missing(root: Path) -> str:
    return (f"full MNIST is not in data_dir ({root / 'MNIST' / 'raw'}) and cannot be "
            "downloaded here. Put the four IDX files there (or set data_dir to where they "
            "are), or use dataset = mnist-sample: the 10,000 real digits shipped with "
            "tui-trainer.")


def problem(config: dict[str, Any], m: Machine) -> Problem | None:
    """Everything that stops this machine from training the config, first found; or None."""
    try:
        knob_problem(config, device_type(str(config.get("device", "auto")), m))
        data_problem(config)
    except Problem as p:
        return p
    return None


def probe(timeout: float = 120.0) -> Machine:
    """The facts, from a child process (the caller never imports torch). Raises
    RuntimeError when the child cannot say."""
    p = subprocess.run([sys.executable, "-m", "tui_trainer", "machine", "--json"],
                       capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise RuntimeError((p.stderr or p.stdout).strip()[-300:] or f"exit {p.returncode}")
    return Machine.from_dict(json.loads(p.stdout.strip().splitlines()[-1]))


def here(device: str = "auto") -> Machine | None:
    """This machine for a run of `device`: its processor read at once (no torch); its GPUs,
    where the device may be CUDA, from the child process of `facts`."""
    from .hardware import this_cpu
    if device in ("cpu", "mps"):
        return Machine(cpu=this_cpu())
    try:
        return facts()
    except (RuntimeError, OSError, ValueError, subprocess.SubprocessError):
        return None         # the choices then say the machine is not known


_probed: Machine | None = None
_probe_lock = threading.Lock()


def facts() -> Machine:
    """`probe()` once per process (threads asking together wait for the one probe)."""
    global _probed
    with _probe_lock:
        if _probed is None:
            _probed = probe()
        return _probed


def known() -> Machine | None:
    """What `facts()` found, where it has been asked already; None, never waiting, where
    not (a screen's thread asks this)."""
    return _probed
