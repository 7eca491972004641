"""The run config: every knob of a training run, typed, documented and validated.

Keys are flat and the same everywhere: in TOML files, in `--set KEY=VALUE`, in the session
store and (later) in the dashboard's form. Each knob carries the one-line explanation that
`tui-trainer config` prints, so the text lives in one place.

This module is part of the core layer: it imports neither torch nor textual.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..text import shown

# Keys that may change when a run is continued: they only say how long to train.
TRAINING_LENGTH_KEYS = ("epochs", "max_steps")
# Keys that may also change when a run is continued: where its processes meet and how long
# they wait for one another, not what they compute (the machines of a multi-node run may be
# others the next time).
LAUNCH_KEYS = ("rdzv_endpoint", "dist_timeout")

GROUPS = {
    # (each title whole in the form at 130 columns, 38% of the width: issue 68)
    "reproducibility": "Reproducibility: seeds and determinism",
    "data": "Data and data loading",
    "speed": "Model, precision and speed",
    "optimisation": "Optimisation",
    "parallel": "Data-parallel processes (torchrun)",
    "bookkeeping": "Device, logs, fingerprints, checkpoints",
}

_DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
_ENDPOINT_RE = re.compile(r"^[A-Za-z0-9._-]+:\d{1,5}$|^\[[0-9A-Fa-f:.]+\]:\d{1,5}$")


class ConfigError(ValueError):
    """A bad config value; `key` names the field, the message says what is allowed."""

    def __init__(self, key: str, message: str):
        self.key = key
        self.reason = message
        super().__init__(f"{key}: {message}")


# A declaration's `before` when it is not given: the same as the default.
SAME = object()


def knob(default: Any, doc: str, group: str, *, choices: tuple[str, ...] | None = None,
         lo: float | None = None, hi: float | None = None, lo_open: bool = False,
         hi_open: bool = False, bits: bool = False, process_wide: bool = False,
         setting: str | None = None, before: Any = SAME, setting_before: Any = None,
         why: str = "") -> Any:
    """A knob's one declaration (core/settings/recorded.py builds the tables from it). bits:
    it can change the bits (the verdict names it); process_wide: engine/knobs.py's
    set_algorithms applies it to torch (explain switches it); setting: the name its applied
    value is recorded under in a run's effective settings (None: not recorded); before: its
    value for runs recorded before it existed, what they did (the default unless said);
    setting_before: what its setting reads for them (None: not known); why: the verdict's
    words on how it changes the bits."""
    return field(default=default, metadata={
        "doc": doc, "group": group, "choices": choices,
        "lo": lo, "hi": hi, "lo_open": lo_open, "hi_open": hi_open,
        "bits": bits, "process_wide": process_wide, "setting": setting,
        "before": default if before is SAME else before, "why": why,
        "setting_before": setting_before,
    })


# Each model by what it is, where a line names a run's net (the knob's value is a short key).
MODEL_WORDS = {"grokking": "small two-conv net, 10 and 20 5x5 filters",
               "examples": "pytorch/examples' net, 32 and 64 3x3 filters",
               "fast": "fast-MNIST net, 24 5x5 and 32 3x3 filters",
               "resnet": "small ResNet, BatchNorm"}


def model_words(model: object) -> str:
    """`small two-conv net, 10 and 20 5x5 filters (model = grokking)`; an unknown value (a
    kept answer is untrusted) as its text, cut."""
    words = MODEL_WORDS.get(model) if isinstance(model, str) else None
    return f"{words} (model = {model})" if words else f"model {shown(model, 40)}"


@dataclass(frozen=True)
class RunConfig:
    # --- reproducibility -------------------------------------------------------------------
    seed: int | None = knob(
        1, "Seed for torch, numpy and Python's random (an integer), or \"none\" to seed nothing: "
        "then no two runs are alike.", "reproducibility",
        bits=True, setting="seed", lo=0, hi=2**63 - 1)
    deterministic: str = knob(
        "on", "torch.use_deterministic_algorithms: on makes ops that have no deterministic "
        "implementation raise, warn only warns about them, off allows them (some CUDA "
        "kernels, e.g. scatter_add and index_add, use atomics and differ run to run).",
        "reproducibility",
        choices=("off", "on", "warn"), bits=True, process_wide=True,
        setting="deterministic_algorithms")
    fill_uninitialized: bool = knob(
        True, "torch.utils.deterministic.fill_uninitialized_memory: while deterministic "
        "algorithms are on (or warn), every tensor made without values (torch.empty and "
        "the like) is filled with NaN or the largest integer first, so a kernel that reads "
        "memory nobody wrote gives the same wrong answer every time. It costs a write of "
        "each such tensor (Megatron-LM measured about 15% of throughput); off skips it. No "
        "effect while deterministic = off.", "reproducibility",
        bits=True, process_wide=True, setting="fill_uninitialized_memory", setting_before=True)
    cudnn_deterministic: bool = knob(
        True, "torch.backends.cudnn.deterministic: cuDNN picks only deterministic convolution "
        "algorithms. Matters on CUDA only.", "reproducibility",
        bits=True, process_wide=True, setting="cudnn_deterministic")
    cudnn_benchmark: bool = knob(
        False, "torch.backends.cudnn.benchmark: cuDNN times several convolution algorithms per "
        "new input shape and keeps the fastest. Faster with fixed shapes, but the choice can "
        "differ run to run and so break bit-for-bit determinism. CUDA only.", "reproducibility",
        bits=True, process_wide=True, setting="cudnn_benchmark")
    cudnn_enabled: bool = knob(
        True, "Use cuDNN at all (torch.backends.cudnn.enabled). The notes: cuDNN uses "
        "nondeterministic algorithms, and it can be disabled with enabled = False; then "
        "PyTorch's own (slower) CUDA convolutions run. No effect on the CPU.",
        "reproducibility",
        bits=True, process_wide=True, setting="cudnn_enabled", setting_before=True,
        why="cuDNN's convolutions or PyTorch's own: other kernels")
    init: str = knob(
        "default", "The model's initial weights: default (each layer's own, as PyTorch "
        "makes them), or as the notes' init_weights for every convolution and linear layer: "
        "normal (N(0, 0.02), bias 0), xavier (Xavier uniform, bias 0.01), kaiming (Kaiming "
        "normal for ReLU, bias 0). Another init is another start: the runs differ from step "
        "0.", "reproducibility",
        bits=True, setting="init", setting_before="default",
        why="another initialisation: the runs start from other weights",
        choices=("default", "normal", "xavier", "kaiming"))
    seed_workers: bool = knob(
        True, "Give the DataLoader its own seeded generator, so the shuffle and the workers' "
        "seeds no longer follow the global RNG (then, e.g., another model's initialisation "
        "cannot change the data order), and a worker_init_fn seeding numpy and random from "
        "each worker's torch seed (the documented recipe; PyTorch >= 1.9 also seeds numpy "
        "per worker by itself).", "reproducibility",
        bits=True, setting="seed_workers")
    num_threads: int = knob(
        0, "torch.set_num_threads for CPU ops; 0 keeps PyTorch's default (one per core). A "
        "different thread count can change the order of float sums, hence the bits.",
        "reproducibility",
        bits=True, process_wide=True, setting="num_threads", lo=0, hi=1024,
        why="another thread count can change the order of float sums")

    # --- data ------------------------------------------------------------------------------
    dataset: str = knob(
        "auto", "auto: full MNIST when it is in data_dir or can be downloaded, else the real-MNIST "
        "sample shipped with tui-trainer (8,000 train / 2,000 eval digits). mnist and "
        "fashion-mnist need the full set; synthetic is random images (speed tests only). "
        "kmnist, emnist (its balanced split: 47 classes) and cifar10 (colour, 32x32: a net "
        "of your own) are read from data_dir in torchvision's layout, never downloaded. "
        "folder:PATH: your own images, one folder of images per class (an ImageFolder tree; "
        "grayscale or colour); evaluation on its val/ folder where it has one, else on a "
        "fifth of the images split off by the run's seed.",
        "data",
        bits=True, choices=("auto", "mnist", "fashion-mnist", "mnist-sample", "synthetic",
                         "kmnist", "emnist", "cifar10"))
    image_size: int = knob(
        0, "dataset = folder:PATH: the square size (pixels) every image is resized to; 0 "
        "keeps them as they are (then they must all have one size).", "data",
        bits=True, lo=0, hi=1024)
    data_dir: str = knob(
        "", "Where datasets live and are downloaded to; empty means the user's cache directory "
        "(tui-trainer/datasets).", "data")
    train_samples: int = knob(
        0, "Train on the first N training samples only (0 = all): short epochs for quick "
        "experiments.", "data",
        bits=True, lo=0, hi=10**9)
    eval_samples: int = knob(
        0, "Evaluate on the first N evaluation samples only (0 = all).", "data", lo=0, hi=10**9)
    loader: str = knob(
        "torchvision", "torchvision: per-sample transforms in a DataLoader, as in "
        "pytorch/examples. resident: the whole split normalized once into one tensor on the "
        "device, each epoch gathered once in its shuffled order and its batches sliced from "
        "that copy (no per-sample Python work, no index op per step; the split's memory "
        "twice while an epoch trains).", "data",
        bits=True, setting="loader",
        choices=("torchvision", "resident"))
    augment: str = knob(
        "off", "Random shifts of up to 2 pixels, drawn from torch's or numpy's RNG (inside the "
        "DataLoader workers when num_workers > 0, each with its own seed).", "data",
        bits=True, setting="augment",
        choices=("off", "torch", "numpy"))
    batch_size: int = knob(
        64, "Training samples per micro-batch, across all processes: with nproc x nnodes "
        "processes each takes batch_size / (nproc x nnodes), so changing nproc alone keeps the "
        "global batch (and the meaning of lr) and runs stay comparable.", "data",
        bits=True,
        lo=1, hi=65536)
    drop_last: bool = knob(
        False, "Drop each epoch's last batch when it is smaller than batch_size (8,000 samples "
        "in batches of 256 leave one of 64): every step then has one shape, as static graphs "
        "want (compile: no second compilation for the smaller batch; reduce-overhead: no "
        "second CUDA graph; cudnn_benchmark: no other shape to time). Those samples are not "
        "trained on in that epoch (with shuffling, other ones each epoch).", "data",
        bits=True)
    eval_batch_size: int = knob(1000, "Samples per evaluation batch.", "data", lo=1, hi=65536)
    num_workers: int = knob(
        0, "DataLoader worker processes (torchvision loader). 0 loads in the training process; "
        "more overlaps loading with compute but each worker costs memory and start-up time.",
        "data",
        bits=True, setting="num_workers", lo=0, hi=64)
    pin_memory: bool = knob(
        False, "Put batches in page-locked host memory. Only speeds host-to-GPU copies, and only "
        "then can non_blocking copies overlap compute. No effect on the CPU.", "data",
        setting="pin_memory")
    non_blocking: bool = knob(
        False, "Copy batches to the GPU with non_blocking=True: asynchronous only from pinned "
        "memory. No effect on the CPU.", "data",
        setting="non_blocking")
    persistent_workers: bool = knob(
        False, "Keep DataLoader workers alive between epochs instead of starting them anew each "
        "epoch (needs num_workers > 0).", "data",
        setting="persistent_workers")

    # --- model and speed -------------------------------------------------------------------
    model: str = knob(
        "grokking", "grokking: the small two-conv net of the \"Grokking PyTorch\" notes (10 and "
        "20 5x5 filters, dropout). examples: the net of pytorch/examples mnist/main.py (32 and "
        "64 3x3 filters, 1.2M parameters), heavier. fast: the net of the fastest published "
        "MNIST recipe (tuomaso/train_mnist_fast: 24 5x5 and 32 3x3 filters, pooling before "
        "ReLU, no dropout, 0.22M parameters). resnet: a small residual net of the kind "
        "trained on GPUs (BatchNorm, three residual stages, global average pooling, 0.08M "
        "parameters), whose CUDA backward has a kernel PyTorch documents as nondeterministic "
        "(adaptive average pooling): there the determinism knobs change the bits. Or your "
        "own net: PATH.py:Name, an nn.Module subclass (or a function returning one) built "
        "with no arguments, returning one score per class (logits); it runs only once you "
        "trust the file (naming it yourself does; `tui-trainer trust FILE`).", "speed",
        bits=True, setting="model", choices=("grokking", "examples", "fast", "resnet"))
    amp: str = knob(
        "off", "Automatic mixed precision: fp16 (CUDA only, with a GradScaler against underflow) "
        "or bf16 (CUDA or CPU, no scaler needed). Faster on tensor-core GPUs; changes the "
        "numbers.", "speed",
        bits=True, setting="amp", choices=("off", "fp16", "bf16"))
    channels_last: bool = knob(
        False, "Store the model and inputs in channels_last (NHWC) memory format: faster "
        "convolutions on tensor-core GPUs, and on some CPUs too (oneDNN); measure it.",
        "speed",
        bits=True, setting="channels_last")
    malloc: str = knob(
        "system", "glibc's malloc and the large blocks a step frees: system (as it comes) gives "
        "them back, and the next step faults them in again, zeroed (pytorch/examples' net on "
        "a CPU here: 4,000-11,000 faults, up to a third of a step); keep raises its mmap and "
        "trim thresholds (mallopt) so they stay, as jemalloc and tcmalloc do. The same bits; "
        "the process keeps its peak memory. glibc only (a run records what took).", "speed",
        setting="malloc", setting_before="system", choices=("system", "keep"))
    compile: str = knob(
        "off", "torch.compile the model: a slow first step while it compiles, then often faster "
        "steps. Needs a C++ compiler on the CPU. on: its default mode. reduce-overhead (CUDA "
        "only): also captures the compiled forward and backward as CUDA graphs and replays "
        "them each step, with no kernel launched one by one from Python (static shapes; the "
        "graphs' memory is held while the run lives; captured again after a resume). "
        "max-autotune: also times kernel choices while compiling (a much slower first step; "
        "on CUDA with CUDA graphs too).", "speed",
        bits=True, setting="compile",
        choices=("off", "on", "reduce-overhead", "max-autotune"))
    cuda_graph: str = knob(
        "off", "step (CUDA only): the speed records' static graph without torch.compile. "
        "After 3 steps run as usual, the whole training step (forward, loss, backward, the "
        "gradient norm, the optimizer's update with capturable=True and its learning rate in "
        "a tensor the schedule fills) is captured as CUDA graphs once and replayed for every "
        "later step: no kernel launched one by one from Python, no sync between log points. "
        "Needs one shape per step (drop_last = true where the last batch is smaller), adam "
        "or adamw, grad_accum_steps = 1, compile = off, amp off or bf16 and one process. "
        "The graphs' memory is held while the run lives; captured again after a resume. The "
        "step's phases are still timed apart (three graphs: forward, backward, optimizer). "
        "auto: step where the run's device is CUDA, off where it is not (a preset that also "
        "runs on a CPU); the run's settings record which.", "speed",
        bits=True, setting="cuda_graph", setting_before="off",
        why="a captured step updates with the capturable optimizer, its learning rate a float32 "
        "tensor on the device: it may round otherwise than the step launched op by op",
        choices=("off", "step", "auto"))
    float32_matmul_precision: str = knob(
        "highest", "torch.set_float32_matmul_precision: highest computes float32 matrix "
        "products in float32; high lets them use TF32 (CUDA Ampere and newer; oneDNN on "
        "CPUs that have it), medium even bfloat16. Faster, and other numbers.", "speed",
        bits=True, process_wide=True, setting="float32_matmul_precision",
        setting_before="highest", why="high or medium let float32 matrix products run in "
        "TF32 or bfloat16: other numbers",
        choices=("highest", "high", "medium"))
    cudnn_allow_tf32: bool = knob(
        True, "Let cuDNN convolutions use TF32 on Ampere and newer GPUs "
        "(torch.backends.cudnn.allow_tf32; on by default in PyTorch, unlike matrix "
        "products): faster float32 convolutions with a 10-bit mantissa. No effect on the "
        "CPU.", "speed",
        bits=True, process_wide=True, setting="cudnn_allow_tf32", setting_before=True,
        why="TF32 convolutions on Ampere and newer GPUs: other numbers")
    eval_mode: str = knob(
        "no_grad", "How evaluation runs without autograd: torch.no_grad, or "
        "torch.inference_mode (no version counters or views tracking: a little faster; its "
        "tensors cannot be used in autograd later). The notes show both.", "speed",
        setting="eval_mode",
        choices=("no_grad", "inference_mode"))
    activation_checkpointing: str = knob(
        "off", "Trade compute for memory (torch.utils.checkpoint, non-reentrant): full keeps "
        "only each block's input and recomputes the block in backward; selective keeps the "
        "convolution and linear outputs and recomputes the cheap ops (ReLU, pooling, dropout). "
        "Changes memory and time, not the bits (with preserve_rng_state on).", "speed",
        setting="activation_checkpointing",
        choices=("off", "full", "selective"))
    preserve_rng_state: bool = knob(
        True, "With activation checkpointing: a recomputed block draws the same dropout masks "
        "as its forward did (the RNG state is saved and restored around it). Off, backward "
        "uses other masks than forward: other gradients (PyTorch checks only shapes).",
        "speed",
        setting="preserve_rng_state")

    # --- optimisation ----------------------------------------------------------------------
    optimizer: str = knob(
        "sgd", "sgd (with momentum), adadelta (pytorch/examples' choice, lr 1.0), adam or "
        "adamw (decoupled weight decay).", "optimisation",
        bits=True, setting="optimizer",
        choices=("sgd", "adadelta", "adam", "adamw"))
    lr: float = knob(0.03, "Learning rate at the start.", "optimisation",
        bits=True, lo=0, hi=100,
                     lo_open=True)
    momentum: float = knob(0.9, "SGD momentum (sgd only).", "optimisation",
        bits=True, lo=0, hi=1,
                           hi_open=True)
    weight_decay: float = knob(0.0, "Weight decay (L2 penalty; decoupled for adamw).",
                               "optimisation",
        bits=True, lo=0, hi=1)
    no_decay_bias: bool = knob(
        False, "Keep biases and normalisation parameters out of weight decay (the common "
        "practice: decaying them only hurts).", "optimisation",
        bits=True)
    lr_step_gamma: float = knob(
        0.7, "Multiply the learning rate by this after every epoch (StepLR, as in "
        "pytorch/examples); 1 keeps it constant. With lr_schedule = step only.",
        "optimisation",
        bits=True, lo=0, hi=1, lo_open=True)
    lr_schedule: str = knob(
        "step", "How the learning rate moves. step: times lr_step_gamma after every epoch "
        "(StepLR). onecycle: up from lr/25 to lr over the first 30% of the run's steps, then "
        "down to lr/25e4 (OneCycleLR, the speed records' choice). cosine: from lr down to 0 "
        "along a half cosine (CosineAnnealingLR), after warmup_steps. onecycle and cosine "
        "move every step, over the run's steps (epochs x steps an epoch, or max_steps).",
        "optimisation",
        bits=True, setting="lr_schedule", choices=("step", "onecycle", "cosine"))
    warmup_steps: int = knob(
        0, "With lr_schedule = cosine: the learning rate rises linearly to lr over the first "
        "N steps, then the cosine follows over the rest (onecycle warms up by itself).",
        "optimisation",
        bits=True, lo=0, hi=10**9)
    adam_beta1: float = knob(
        0.9, "Adam's and AdamW's beta1: how long the running mean of the gradients remembers "
        "(PyTorch's 0.9; the fastest MNIST recipe uses 0.7).", "optimisation",
        bits=True, lo=0, hi=1,
        hi_open=True)
    adam_beta2: float = knob(
        0.999, "Adam's and AdamW's beta2: how long the running mean of the squared gradients "
        "remembers (PyTorch's 0.999; the fastest MNIST recipe uses 0.9).", "optimisation",
        bits=True,
        lo=0, hi=1, hi_open=True)
    optimizer_impl: str = knob(
        "auto", "How the optimizer updates the parameters: for-loop (one small kernel per "
        "tensor and operation), foreach (each operation over all tensors at once), fused (the "
        "whole update in one kernel; sgd, adam and adamw), auto (PyTorch's choice: foreach "
        "on CUDA, for-loop on the CPU). The same maths in another order: other bits.",
        "optimisation",
        bits=True, setting="optimizer_impl",
        why="a for-loop, foreach or fused optimizer does the same update in another order of "
        "float operations", choices=("auto", "for-loop", "foreach", "fused"))
    grad_accum_steps: int = knob(
        1, "Micro-batches whose gradients are summed before one optimizer step: an effective "
        "batch of batch_size x grad_accum_steps in the memory of one micro-batch.",
        "optimisation",
        bits=True, lo=1, hi=4096)
    clip_grad_norm: float = knob(
        0.0, "Clip the gradients' total L2 norm to this before each step; 0 = no clipping.",
        "optimisation",
        bits=True, lo=0, hi=1e9)
    epochs: int = knob(2, "Passes over the training set.", "optimisation", lo=1, hi=100000)
    max_steps: int = knob(
        0, "Stop after this many optimizer steps in all, even inside an epoch; 0 = no limit.",
        "optimisation", lo=0, hi=10**9)

    # --- data-parallel -------------------------------------------------------------------
    nproc: int = knob(
        1, "Training processes on this machine. 1 trains in one process; more launches the run "
        "through torchrun (torch.distributed.run) as DistributedDataParallel, each process "
        "taking its shard of the data (DistributedSampler) and the gradients averaged by "
        "all-reduce. On CUDA, one GPU per process.", "parallel", lo=1, hi=256)
    nnodes: int = knob(
        1, "Machines the run spans. Above 1 the other machines join with `tui-trainer join` "
        "(see the user guide); this machine, holding the session, is node 0.", "parallel",
        lo=1, hi=1024)
    rdzv_endpoint: str = knob(
        "", "HOST:PORT where the processes of a multi-machine run meet (torchrun's rendezvous, "
        "on node 0, reachable from every machine); needed when nnodes > 1. On one machine a "
        "free local port is used.", "parallel")
    dist_backend: str = knob(
        "auto", "The collective backend: auto picks nccl on CUDA and gloo on the CPU; gloo "
        "works on both, nccl needs CUDA.", "parallel",
        choices=("auto", "gloo", "nccl"), bits=True, setting="dist_backend",
        why="another all-reduce implementation sums in another order")
    dist_timeout: int = knob(
        300, "Seconds a process waits for the others in one collective (the gradients' "
        "all-reduce, a barrier) before the run fails saying so: a hung or stopped process "
        "ends the run instead of holding it forever (PyTorch's own default is 30 minutes). "
        "Keep it above the longest step, evaluation or checkpoint write.", "parallel",
        lo=10, hi=86400)

    # --- bookkeeping -----------------------------------------------------------------------
    device: str = knob(
        "auto", "auto (CUDA when there is one, else the CPU), cpu, cuda, cuda:N or mps.",
        "bookkeeping",
        bits=True, setting="device")
    eval_every: int = knob(
        1, "Evaluate every N epochs (and when training ends); 0 = never.", "bookkeeping",
        lo=0, hi=100000)
    log_every: int = knob(
        10, "Record loss, learning rate, gradient norm, throughput, timings and memory every N "
        "steps. Only then does the loop wait for the device (loss.item() is a sync).",
        "bookkeeping", lo=1, hi=10**9)
    fingerprint_every: int = knob(
        50, "Every N steps, record a SHA-256 of all parameters' bytes (exact identity between "
        "runs) and their L2 norm; 0 = only when training ends.", "bookkeeping", lo=0, hi=10**9)
    checkpoint_every: int = knob(
        200, "Write a checkpoint every N steps, so a crash loses at most N steps; 0 = at the "
        "end of each epoch only. One is always written at step 0 and when training ends or is "
        "stopped.", "bookkeeping", lo=0, hi=10**9)
    keep_checkpoints: int = knob(
        3, "How many of a run's newest checkpoints to keep on disk. The one at step 0 and "
        "each one a resume started from are kept besides: explain replays from them (one "
        "more file per run, the size of a checkpoint: the parameters and the optimizer's "
        "state; `tui-trainer memory` shows it).", "bookkeeping",
        lo=1, hi=10000)

    # ---------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> RunConfig:
        return from_dict({**self.to_dict(), **changes})


FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(RunConfig)}
DEFAULTS = RunConfig()


def doc(key: str) -> str:
    return FIELDS[key].metadata["doc"]


def group(key: str) -> str:
    return FIELDS[key].metadata["group"]


def choices(key: str) -> tuple[str, ...] | None:
    return FIELDS[key].metadata["choices"]


def kind(key: str) -> str:
    """One of bool, int, float, choice, seed, device, text."""
    if key == "seed":
        return "seed"
    if key == "device":
        return "device"
    if FIELDS[key].metadata["choices"]:
        return "choice"
    return {bool: "bool", int: "int", float: "float"}.get(type(FIELDS[key].default), "text")


def allowed(key: str) -> str:
    """Says in words what values `key` takes."""
    meta = FIELDS[key].metadata
    k = kind(key)
    if k == "choice":
        mine = ", or PATH.py:Name (a net of your own file)" if key == "model" else \
            ", or folder:PATH (your own images)" if key == "dataset" else ""
        return "one of " + ", ".join(meta["choices"]) + mine
    if k == "bool":
        return "true or false"
    if k == "device":
        return "auto, cpu, cuda, cuda:N or mps"
    if k == "text":
        return "a string"
    lo, hi = meta["lo"], meta["hi"]
    noun = "an integer" if k in ("int", "seed") else "a number"
    left = ">" if meta["lo_open"] else ">="
    right = "<" if meta["hi_open"] else "<="
    text = f"{noun} {left} {_fmt(lo)} and {right} {_fmt(hi)}"
    return text + (', or "none"' if k == "seed" else "")


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


# --- parsing and validation --------------------------------------------------------------

_TRUE = {"true", "on", "yes", "1"}
_FALSE = {"false", "off", "no", "0"}


def unknown_key(key: str) -> ConfigError:
    """The refusal of a key that is not a knob: the nearest knob first, when one is near."""
    import difflib
    near = difflib.get_close_matches(key.lower(), list(FIELDS), n=1, cutoff=0.6)
    if near:
        return ConfigError(key, f"unknown key; did you mean {near[0]}? (`tui-trainer config` "
                                "lists every key)")
    return ConfigError(key, f"unknown key; known keys: {', '.join(FIELDS)}")


def parse_value(key: str, text: str) -> Any:
    """Turns the text of `--set KEY=VALUE` (or a form field) into a typed value."""
    if key not in FIELDS:
        raise unknown_key(key)
    k = kind(key)
    t = text.strip()
    try:
        if k == "bool":
            if t.lower() in _TRUE:
                return True
            if t.lower() in _FALSE:
                return False
            raise ValueError
        if k == "seed":
            return None if t.lower() == "none" else int(t)
        if k == "int":
            return int(t)
        if k == "float":
            return float(t)
    except ValueError:
        raise ConfigError(key, f"must be {allowed(key)}, got {text!r}") from None
    return t


# A net of the user's own file (core/settings/user_models.py): "path/to/net.py:Name".
FILE_MODEL = re.compile(r"^(?P<path>[^\x00-\x1f]+\.py):(?P<name>[A-Za-z_][A-Za-z0-9_]*)$")


def is_file_model(value: Any) -> bool:
    return isinstance(value, str) and FILE_MODEL.match(value) is not None


# The user's own images: "folder:PATH", an ImageFolder tree (engine/data.py).
FOLDER = "folder:"


def is_folder_dataset(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(FOLDER) and \
        bool(value[len(FOLDER):].strip())


def anchored(key: str, value: Any, folder: Path) -> Any:
    """A file model's or folder dataset's relative path read from a TOML file, made relative
    to that file's folder (`folder`), so that a config names the files beside it wherever
    the command runs; absolute paths, ~ paths and every other value unchanged. (On the
    command line and in the form a relative path is relative to where the command runs.)"""
    if key == "model" and is_file_model(value):
        m = FILE_MODEL.match(value)
        path, name = m.group("path"), m.group("name")
        return value if Path(path).expanduser().is_absolute() else \
            f"{os.path.normpath(folder / path)}:{name}"
    if key == "dataset" and is_folder_dataset(value):
        path = value[len(FOLDER):]
        return value if Path(path.strip()).expanduser().is_absolute() else \
            FOLDER + os.path.normpath(folder / path.strip())
    return value


def absolute_paths(cfg: "RunConfig") -> "RunConfig":
    """The config with its relative paths made absolute against where this command runs:
    what a TOML file written elsewhere (a saved preset) must say to name the same files."""
    return dataclasses.replace(cfg, **{k: anchored(k, getattr(cfg, k), Path.cwd())
                                       for k in ("model", "dataset")})


def file_folder(path: Path) -> Path:
    """The folder relative paths in a TOML file are relative to: the file's own (absolute,
    links in its name kept as written)."""
    return Path(os.path.abspath(path)).parent


def check_value(key: str, value: Any) -> Any:
    """Validates one typed value (from TOML or parse_value); returns it normalised."""
    if key not in FIELDS:
        raise unknown_key(key)
    meta = FIELDS[key].metadata
    k = kind(key)
    bad = ConfigError(key, f"must be {allowed(key)}, got {value!r}")
    if key == "dataset" and is_folder_dataset(value):     # the user's own images
        if any(unicodedata.category(ch) in ("Cc", "Cf") for ch in value):
            raise ConfigError(key, "must not contain control characters")
        return value
    if key == "model" and is_file_model(value):      # a net of the user's own file
        if any(unicodedata.category(ch) in ("Cc", "Cf") for ch in value):
            raise ConfigError(key, "must not contain control characters")
        return value
    if k == "bool":
        if not isinstance(value, bool):
            raise bad
        return value
    if k == "choice":
        if isinstance(value, bool) and {"on", "off"} <= set(meta["choices"]):
            value = "on" if value else "off"
        if not isinstance(value, str) or value not in meta["choices"]:
            raise bad
        return value
    if k == "device":
        if not isinstance(value, str) or not _DEVICE_RE.match(value):
            raise bad
        return value
    if k == "text":
        if not isinstance(value, str):
            raise bad
        if any(unicodedata.category(ch) in ("Cc", "Cf") for ch in value):
            raise ConfigError(key, "must not contain control characters")
        return value
    if k == "seed" and (value is None or (isinstance(value, str) and value.lower() == "none")):
        return None
    if isinstance(value, bool):
        raise bad
    if k in ("int", "seed"):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            raise bad
    elif k == "float":
        if not isinstance(value, (int, float)):
            raise bad
        value = float(value)
        if not math.isfinite(value):       # NaN passes every range comparison
            raise ConfigError(key, f"must be a finite number, {allowed(key)}; got {value!r}")
    lo, hi = meta["lo"], meta["hi"]
    if lo is not None and (value < lo or (meta["lo_open"] and value == lo)):
        raise bad
    if hi is not None and (value > hi or (meta["hi_open"] and value == hi)):
        raise bad
    return value


def check_combination(cfg: RunConfig) -> None:
    """Rules that involve more than one key."""
    if cfg.persistent_workers and cfg.num_workers == 0:
        raise ConfigError("persistent_workers", "needs num_workers > 0 (there are no workers "
                          "to keep); set num_workers or persistent_workers = false")
    world = cfg.nproc * cfg.nnodes
    if cfg.batch_size % world:
        raise ConfigError("batch_size", f"is the global batch and must divide evenly among "
                          f"nproc x nnodes = {world} processes; got {cfg.batch_size} (e.g. "
                          f"{max(world, cfg.batch_size // world * world)})")
    if cfg.nnodes > 1 and not _ENDPOINT_RE.match(cfg.rdzv_endpoint):
        raise ConfigError("rdzv_endpoint", "must be HOST:PORT on node 0 (e.g. "
                          "10.0.0.1:29400) when nnodes > 1; got "
                          f"{cfg.rdzv_endpoint!r}")
    if cfg.rdzv_endpoint and not _ENDPOINT_RE.match(cfg.rdzv_endpoint):
        raise ConfigError("rdzv_endpoint", f"must be HOST:PORT or empty; got "
                          f"{cfg.rdzv_endpoint!r}")
    if cfg.rdzv_endpoint and not 1 <= int(cfg.rdzv_endpoint.rsplit(":", 1)[1]) <= 65535:
        raise ConfigError("rdzv_endpoint", "its PORT must be 1 to 65535; got "
                          f"{cfg.rdzv_endpoint!r}")
    if world > 1 and re.match(r"^cuda:\d+$", cfg.device):
        raise ConfigError("device", "must be cuda or auto with nproc x nnodes > 1: each "
                          f"process takes the GPU of its local rank; got {cfg.device!r}")
    if cfg.warmup_steps and cfg.lr_schedule != "cosine":
        raise ConfigError("warmup_steps", f"is for lr_schedule = cosine (onecycle warms up by "
                          f"itself, step does not); got lr_schedule = {cfg.lr_schedule}: set "
                          "warmup_steps = 0")
    if cfg.optimizer_impl == "fused" and cfg.optimizer == "adadelta":
        raise ConfigError("optimizer_impl", "fused exists for sgd, adam and adamw, not "
                          "adadelta; use auto, for-loop or foreach")
    if cfg.model == "resnet" and cfg.activation_checkpointing != "off":
        raise ConfigError("activation_checkpointing", "must be off with model = resnet: a "
                          "recomputed block would update its BatchNorm running statistics a "
                          "second time (other statistics than the run without it)")
    if cfg.cuda_graph != "off":
        graph_problem(cfg)
    if cfg.loader == "resident" and cfg.num_workers > 0:
        raise ConfigError("num_workers", "must be 0 with loader = resident (batches are "
                          "taken by index from one tensor; there is nothing for workers to do)")


def graph_step(cfg: RunConfig, cuda: bool) -> bool:
    """Whether the run's step is captured as CUDA graphs (cuda_graph step or auto, on CUDA;
    step without CUDA is refused in core.settings.machine)."""
    return cuda and cfg.cuda_graph != "off"


def graph_problem(cfg: RunConfig) -> None:
    """What cuda_graph = step (or auto) cannot replay: a step whose work Python decides each
    time. Refused whatever the device, auto too: what a run may do must not hang on which
    machine it lands."""
    needs = [("grad_accum_steps", cfg.grad_accum_steps == 1, "be 1",
              "one micro-batch a step: the graph is one step's work", cfg.grad_accum_steps),
             ("optimizer", cfg.optimizer in ("adam", "adamw"), "be adam or adamw",
              "their update is capturable, its learning rate a tensor the schedule fills",
              cfg.optimizer),
             ("compile", cfg.compile == "off", "be off",
              "compile = reduce-overhead is torch.compile's own way to CUDA graphs",
              cfg.compile),
             ("amp", cfg.amp != "fp16", "be off or bf16",
              "fp16's GradScaler decides on the host whether to skip a step", cfg.amp),
             ("nproc", cfg.nproc * cfg.nnodes == 1, "be 1 (and nnodes 1)",
              "DDP's all-reduce is not captured here", f"nproc {cfg.nproc}, nnodes {cfg.nnodes}")]
    for key, ok, want, why, got in needs:
        if not ok:
            raise ConfigError(key, f"must {want} with cuda_graph = {cfg.cuda_graph} ({why}); "
                              f"got {got}; "
                              "or set cuda_graph = off")


def validate_all(values: dict[str, Any]) -> dict[str, str]:
    """Every problem in `values`, as {key: reason}: for forms that mark each field."""
    problems: dict[str, str] = {}
    clean: dict[str, Any] = {}
    for key, value in values.items():
        try:
            clean[key] = check_value(key, value)
        except ConfigError as e:
            problems[key] = e.reason
    if not problems:
        try:
            check_combination(RunConfig(**{**DEFAULTS.to_dict(), **clean}))
        except ConfigError as e:
            problems[e.key] = e.reason
    return problems


def world_size(values: dict[str, Any]) -> int:
    """Processes a stored config trains with (nproc x nnodes); 1 when its values are not
    numbers (a damaged session's config is read, never trusted)."""
    try:
        return int(values.get("nproc", 1)) * int(values.get("nnodes", 1))
    except (TypeError, ValueError):
        return 1


def from_dict(values: dict[str, Any]) -> RunConfig:
    """A validated RunConfig from a (possibly partial) mapping; raises the first ConfigError."""
    clean = {key: check_value(key, value) for key, value in values.items()}
    cfg = RunConfig(**{**DEFAULTS.to_dict(), **clean})
    check_combination(cfg)
    return cfg


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(key or pair, f"--set takes KEY=VALUE, got {pair!r}")
        out[key] = parse_value(key, text)
    return out


def read_toml(path: str | Path) -> dict[str, Any]:
    return read_preset(path)[0]


def read_preset(path: str | Path) -> tuple[dict[str, Any], list[str]]:
    """A config file's values, and the knobs it lets each machine choose (its `fit` list:
    core/settings/fit.py)."""
    from .presets import resolve
    p = resolve(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError("--config", f"no such file: {p}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError("--config", f"cannot read {p}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("--config", f"{p} is not valid TOML: {e}") from None
    # An A/B study file's [ab] table is read by `tui-trainer ab`; its base config runs as is.
    if isinstance(data.get("ab"), dict):
        del data["ab"]
    fitted = data.pop("fit", [])
    if not isinstance(fitted, list) or not all(isinstance(k, str) and k in FIELDS
                                               for k in fitted):
        raise ConfigError("fit", f"in {p} must be a list of knob names (those chosen per "
                          f"machine: core/settings/fit.py), got {shown(fitted, 200)}")
    for key, value in data.items():
        if isinstance(value, dict):
            raise ConfigError(key, "tables are not used; keys are flat (see `tui-trainer config`)")
    return {k: anchored(k, v, file_folder(p)) for k, v in data.items()}, fitted


def load(config_file: str | Path | None = None, overrides: list[str] | None = None,
         base: RunConfig | None = None) -> RunConfig:
    """The config of a file and --set overrides, as written: a preset's `fit` knobs keep
    the file's values (`load_fitted` chooses them for this machine)."""
    values: dict[str, Any] = {}
    if config_file is not None:
        values.update(read_toml(config_file))
    values.update(parse_overrides(overrides or []))
    start = (base or DEFAULTS).to_dict()
    return from_dict({**start, **values})
