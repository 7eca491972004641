"""Applying the reproducibility knobs, and recording what was really applied.

The fingerprint is the run's *effective* settings: what torch reports after the knobs were
set, plus versions and the hardware, so that two runs can be compared on what can change
their bits, not on what their config files asked for.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import math
import os
import platform
import random
import re
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch import nn

from ..core.settings import hardware, machine, recorded
from ..core.settings.config import ConfigError, RunConfig, graph_step
from ..core.settings.machine import Machine
from .. import __version__


def machine_facts(device: str = "auto") -> Machine:
    """What torch sees here, for a run whose device setting is `device`; the rules that use
    it are in core.settings.machine. A run on the CPU (or an Apple GPU) is not asked about CUDA:
    asking starts CUDA's driver (cuInit: 0.13 s on an H100, and a connection to its
    persistence daemon's socket), which that run never uses; its facts say no CUDA."""
    asks = device not in ("cpu", "mps")
    n = torch.cuda.device_count() if asks and torch.cuda.is_available() else 0
    return Machine(torch=torch.__version__, cuda=n > 0, cuda_devices=n,
                   cuda_names=tuple(torch.cuda.get_device_name(i) for i in range(n)),
                   mps=torch.backends.mps.is_available(), cpu=this_cpu(),
                   cuda_capabilities=tuple("{}.{}".format(*torch.cuda.get_device_capability(i))
                                           for i in range(n)))


@functools.cache
def this_cpu() -> hardware.Cpu:
    """This processor, with the instruction set torch itself says it dispatches to (read
    once a process: torch chose it at import)."""
    return hardware.cpu(hardware.cpu_source(), torch.backends.cpu.get_cpu_capability())


def resolve_device(cfg: RunConfig) -> torch.device:
    """The torch device of cfg.device; a device this machine lacks is a ConfigError."""
    try:
        return torch.device(machine.device_type(cfg.device, machine_facts(cfg.device)))
    except machine.Problem as p:
        raise ConfigError(p.key, p.reason) from None


def check_device_knobs(cfg: RunConfig, device: torch.device) -> None:
    try:
        machine.knob_problem(cfg.to_dict(), str(device))
    except machine.Problem as p:
        raise ConfigError(p.key, p.reason) from None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def apply_knobs(cfg: RunConfig, device: torch.device, rank: int = 0) -> None:
    """Sets every process-wide knob, in the order torch needs them. Rank r of a data-parallel
    run seeds with seed + r: its dropout and augmentation draw their own numbers (rank 0's
    are those of a single-process run; DDP gives every rank rank 0's initial weights)."""
    workspace = machine.cublas_workspace(cfg.to_dict())   # (the launcher's rule too)
    if workspace is not None and device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", workspace)
    set_algorithms(cfg)
    set_malloc(cfg.malloc)
    if cfg.seed is not None:
        seed_everything(cfg.seed + rank)


# malloc = keep (core/settings/config.py): glibc's mallopt parameters, and the bytes under
# which a freed block stays in the process (both thresholds: the mmap threshold alone still
# faulted, the trim threshold alone faulted more, with pytorch/examples' net here)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEEP_BYTES = 1 << 30
_malloc = ["system"]        # what this process's glibc was told (mallopt has no getter)


def set_malloc(value: str) -> str:
    """Applies malloc = keep to this process (its DataLoader workers, forked later, inherit
    it); system leaves glibc as it is (a process once told keep stays so: no run asks
    back). Returns what this process's malloc does now: keep, or system where there is no
    glibc mallopt to tell."""
    if value == "keep" and _malloc[0] != "keep":
        try:
            libc = ctypes.CDLL("libc.so.6")
            if libc.mallopt(M_MMAP_THRESHOLD, KEEP_BYTES) and \
                    libc.mallopt(M_TRIM_THRESHOLD, KEEP_BYTES):
                _malloc[0] = "keep"
        except (OSError, AttributeError):       # (not glibc: as it comes)
            pass
    return _malloc[0]


def _set_deterministic(value: str) -> None:
    torch.use_deterministic_algorithms(value != "off", warn_only=value == "warn")


def _deterministic() -> str:
    if not torch.are_deterministic_algorithms_enabled():
        return "off"
    return "warn" if torch.is_deterministic_algorithms_warn_only_enabled() else "on"


def _set_threads(n: int) -> None:
    if n:                       # 0: PyTorch's own default, left as it is
        torch.set_num_threads(n)


def _flag(owner: Any, name: str) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    return (lambda: getattr(owner, name)), (lambda v: setattr(owner, name, bool(v)))


# Each process-wide knob (declared `process_wide` in core/settings/config.py): how torch is
# asked for its value and given one, in the knob's own terms. set_algorithms applies them,
# algorithms_of gives them back, explain switches them, effective_settings records them.
TORCH_STATE: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {
    "deterministic": (_deterministic, _set_deterministic),
    "fill_uninitialized": _flag(torch.utils.deterministic, "fill_uninitialized_memory"),
    "cudnn_deterministic": _flag(torch.backends.cudnn, "deterministic"),
    "cudnn_benchmark": _flag(torch.backends.cudnn, "benchmark"),
    "cudnn_enabled": _flag(torch.backends.cudnn, "enabled"),
    "num_threads": (torch.get_num_threads, _set_threads),
    "float32_matmul_precision": (torch.get_float32_matmul_precision,
                                 torch.set_float32_matmul_precision),
    "cudnn_allow_tf32": _flag(torch.backends.cudnn, "allow_tf32"),
}


def set_algorithms(cfg: RunConfig, cudnn_benchmark: bool | None = None) -> None:
    """Every process-wide knob: the thread count, deterministic algorithms, cuDNN's flags,
    the float32 matmul precision (cudnn_benchmark the config's unless given)."""
    for key in recorded.PROCESS_WIDE:
        value = getattr(cfg, key)
        if key == "cudnn_benchmark" and cudnn_benchmark is not None:
            value = cudnn_benchmark
        TORCH_STATE[key][1](value)


@contextlib.contextmanager
def algorithms_of(cfg: RunConfig, cudnn_benchmark: bool | None = None) -> Iterator[None]:
    """`set_algorithms` for the block, then each of those knobs back as it was (the
    launcher's spare loads a run's kernels under them: engine/cuda_start.py)."""
    was = {key: TORCH_STATE[key][0]() for key in recorded.PROCESS_WIDE}
    try:
        set_algorithms(cfg, cudnn_benchmark)
        yield
    finally:
        for key, value in was.items():
            TORCH_STATE[key][1](value)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return this_cpu().model


def optimizer_impl(cfg: RunConfig, cuda: bool) -> str:
    """The implementation the optimizer really uses (auto: PyTorch's own choice, foreach
    for tensors on CUDA, the for-loop on the CPU)."""
    if cfg.optimizer_impl != "auto":
        return cfg.optimizer_impl
    return "foreach" if cuda else "for-loop"


def determinism_refusal(e: BaseException) -> str | None:
    """What PyTorch raises for an op that has no deterministic implementation while
    torch.use_deterministic_algorithms(True) holds (deterministic = on), in one line naming
    the op and the knob; None for any other error."""
    m = re.search(r"(\w+) does not have a deterministic implementation", str(e))
    if not isinstance(e, RuntimeError) or m is None:
        return None
    return (f"deterministic = on refused {m.group(1)}: PyTorch has no deterministic "
            "implementation of it on this device; set deterministic = warn to run it and be "
            "told where (its results can then differ run to run), or off")


def _torchvision_version() -> str:
    """torchvision's version (imported here, not with this module: a data-parallel run's
    own process checks the knobs without loading torchvision; a training process has it
    loaded already)."""
    import torchvision
    return torchvision.__version__


def effective_settings(cfg: RunConfig, device: torch.device, data: dict[str, Any],
                       pin_memory: bool, model: nn.Module) -> dict[str, Any]:
    """What the run really ran with: each knob that declares a `setting`
    (core/settings/config.py) as torch or the engine applied it (its config value where
    nothing changes it), and the facts of core/settings/recorded.py:FACTS."""
    cuda = device.type == "cuda"
    applied = {
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        **{k: TORCH_STATE[k][0]() for k in recorded.PROCESS_WIDE if k != "deterministic"},
        "num_workers": cfg.num_workers if cfg.loader == "torchvision" else 0,
        "pin_memory": pin_memory,
        "non_blocking": cfg.non_blocking and cuda,
        "persistent_workers": cfg.persistent_workers and cfg.num_workers > 0,
        "optimizer_impl": optimizer_impl(cfg, cuda),
        "cuda_graph": "step" if graph_step(cfg, cuda) else "off",      # (auto: which)
        "device": str(device),
        "malloc": _malloc[0],           # (set by apply_knobs at set-up: what took)
    }
    knobs = {setting: applied[key] if key in applied else getattr(cfg, key)
             for key, setting in recorded.SETTING_OF.items()}
    return {
        **knobs,
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "num_interop_threads": torch.get_num_interop_threads(),
        # how idle OpenMP threads wait, as libgomp read it
        # (core.processes.supervisor.THREAD_WAIT)
        "omp_wait": os.environ.get("OMP_WAIT_POLICY") or
        f"spin {os.environ.get('GOMP_SPINCOUNT', 'default')}",
        "grad_scaler": cfg.amp == "fp16",
        "parameters": sum(p.numel() for p in model.parameters()),
        "device_name": device_name(device),
        # the processor (core.settings.hardware): what a price measured here holds for, and
        # the instruction set torch's kernels dispatch to (another can change the bits)
        "cpu": (cpu := this_cpu()).to_dict(),
        "cpu_capability": cpu.capability,
        "cuda_capability": "{}.{}".format(*torch.cuda.get_device_capability(device))
        if cuda else None,
        "torch": torch.__version__,
        "torchvision": _torchvision_version(),
        "numpy": np.__version__,
        "python": platform.python_version(),
        "cuda": torch.version.cuda,
        # cuDNN's version where it can run (asking it on the CPU would start CUDA's driver)
        "cudnn": torch.backends.cudnn.version()
        if cuda and torch.backends.cudnn.is_available() else None,
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "platform": platform.platform(),
        "data": data,
        "tui_trainer": __version__,         # the version that trained it
    }


# --- RNG states, in a form that torch.load(weights_only=True) accepts --------------------

def capture_rng(generator: torch.Generator | None, cuda: bool) -> dict[str, Any]:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if cuda else [],
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(gauss)},
        "python": [py_version, list(py_state), py_gauss],
        "loader": generator.get_state() if generator is not None else None,
    }


def restore_rng(state: dict[str, Any], generator: torch.Generator | None) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np_state["keys"].numpy().astype(np.uint32),
                         np_state["pos"], np_state["has_gauss"], np_state["cached_gaussian"]))
    py_version, py_state, py_gauss = state["python"]
    random.setstate((py_version, tuple(py_state), py_gauss))
    if generator is not None and state["loader"] is not None:
        generator.set_state(state["loader"])


# --- parameter identity ------------------------------------------------------------------

@torch.no_grad()
def param_fingerprint(model: nn.Module) -> tuple[str, float]:
    """SHA-256 over every parameter's name and bytes (in the standard contiguous layout, so
    channels_last does not change it), and the parameters' global L2 norm."""
    h = hashlib.sha256()
    squares = 0.0
    for name, p in model.named_parameters():
        t = p.detach().to("cpu").contiguous()
        h.update(name.encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        squares += float(t.double().pow(2).sum())
    return h.hexdigest(), math.sqrt(squares)


SKETCH_SIZE = 256


class ParamSketch:
    """A fixed linear sketch of all parameters: each parameter goes to one of SKETCH_SIZE
    buckets with a random sign (feature hashing, fixed seed). Being linear, the distance
    between two runs' sketches estimates the distance between their parameter vectors
    (unbiased for the squared distance), so the dashboard can plot how far two runs have
    drifted apart without storing their parameters."""

    def __init__(self, model: nn.Module, size: int = SKETCH_SIZE):
        n = sum(p.numel() for p in model.parameters())
        g = torch.Generator().manual_seed(0x5EED)
        self.bucket = torch.randint(0, size, (n,), generator=g)
        self.sign = torch.randint(0, 2, (n,), generator=g).double() * 2 - 1
        self.size = size

    @torch.no_grad()
    def __call__(self, model: nn.Module) -> bytes:
        flat = torch.cat([p.detach().to("cpu", torch.float64).reshape(-1)
                          for p in model.parameters()])
        out = torch.zeros(self.size, dtype=torch.float64)
        out.index_add_(0, self.bucket, flat * self.sign)
        return out.numpy().tobytes()
