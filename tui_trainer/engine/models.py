"""The MNIST nets a run can train, their initial weights, and activation checkpointing.

Each net's forward is a few blocks (`blocks()`), run one after the other by `Blocks.forward`.
That is where the `activation_checkpointing` knob is applied: `off` keeps every activation
for backward; `full` keeps only each block's input and recomputes the block in backward
(torch.utils.checkpoint, non-reentrant); `selective` recomputes only the cheap ops of each
block (ReLU, pooling, dropout, log-softmax) and keeps the outputs of the convolutions and
matrix products (a selective-checkpoint policy). `preserve_rng_state` makes a recomputed
block draw the same dropout masks as its forward did. Parameter names are those of plain
modules (conv1.weight, ...), whatever the knob.
"""

from __future__ import annotations

import sys
import types
from functools import partial
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint,
                                    create_selective_checkpoint_contexts)

from ..core.errors import BadInput
from ..core.settings import user_models
from ..core.settings.config import ConfigError, is_file_model
from ..core.text import shown

# What `selective` keeps: the outputs of the ops that cost the most to recompute.
# (an op a build lacks, e.g. oneDNN's convolution, is left out rather than fail the import)
KEPT_OPS = {getattr(getattr(torch.ops.aten, name, None), "default", None)
            for name in ("convolution", "_convolution", "mkldnn_convolution", "mm", "addmm")
            } - {None}


def _keep_expensive(ctx: object, op: object, *args: object, **kwargs: object
                    ) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in KEPT_OPS else CheckpointPolicy.PREFER_RECOMPUTE


class Blocks(nn.Module):
    """A net whose forward is its blocks in order, each checkpointed as the knob says."""

    checkpointing = "off"           # off, full or selective
    preserve_rng_state = True

    def blocks(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], ...]:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        recompute = self.checkpointing != "off" and self.training and torch.is_grad_enabled()
        for block in self.blocks():
            if not recompute:
                x = block(x)
            elif self.checkpointing == "full":
                x = checkpoint(block, x, use_reentrant=False,
                               preserve_rng_state=self.preserve_rng_state)
            else:
                x = checkpoint(block, x, use_reentrant=False,
                               preserve_rng_state=self.preserve_rng_state,
                               context_fn=partial(create_selective_checkpoint_contexts,
                                                  _keep_expensive))
        return x


class GrokkingNet(Blocks):
    """The small net of the "Grokking PyTorch" notes (and of early pytorch/examples)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def blocks(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], ...]:
        return (self.features1, self.features2, self.classifier)

    def features1(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(F.max_pool2d(self.conv1(x), 2))

    def features2(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))

    def classifier(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


class ExamplesNet(Blocks):
    """The net of pytorch/examples mnist/main.py."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def blocks(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], ...]:
        return (self.features1, self.features2, self.classifier)

    def features1(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv1(x))

    def features2(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        return self.dropout1(x)

    def classifier(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


class FastNet(Blocks):
    """The net of the fastest published MNIST recipe (tuomaso/train_mnist_fast, its final
    notebook): 24 5x5 and 32 3x3 filters, pooling before ReLU (a quarter of the ReLU's
    work), no dropout, 0.22M parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 24, 5, 1)
        self.conv2 = nn.Conv2d(24, 32, 3, 1)
        self.fc1 = nn.Linear(800, 256)
        self.fc2 = nn.Linear(256, 10)

    def blocks(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], ...]:
        return (self.features1, self.features2, self.classifier)

    def features1(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(F.max_pool2d(self.conv1(x), 2))

    def features2(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(F.max_pool2d(self.conv2(x), 2))

    def classifier(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return F.log_softmax(self.fc2(x), dim=1)


class BasicBlock(nn.Module):
    """A residual block: two 3x3 convolutions with BatchNorm, the input added back (through
    a 1x1 convolution where the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(Blocks):
    """A small residual net of the kind trained on GPUs, sized for MNIST: a 3x3 stem with
    BatchNorm, adaptive average pooling from 28x28 to 12x12, three residual stages (16, 32
    and 64 channels at 12, 6 and 3 pixels), global average pooling and one linear layer;
    0.08M parameters. The stem's pooling windows overlap (28 is no multiple of 12): on CUDA
    its backward adds into shared inputs with atomics, in no fixed order, which PyTorch
    documents as nondeterministic (deterministic = on refuses it there); cuDNN's choice of
    convolution algorithms (cudnn_benchmark, cudnn_deterministic) acts on its convolutions.
    BatchNorm keeps running statistics (buffers) for evaluation."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = BasicBlock(16, 16, 1)
        self.layer2 = BasicBlock(16, 32, 2)
        self.layer3 = BasicBlock(32, 64, 2)
        self.fc = nn.Linear(64, 10)

    def blocks(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], ...]:
        return (self.stem, self.layer1, self.layer2, self.layer3, self.head)

    def stem(self, x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(F.relu(self.bn1(self.conv1(x))), 12)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)       # global average pooling
        return F.log_softmax(self.fc(x), dim=1)


MODELS = {"grokking": GrokkingNet, "examples": ExamplesNet, "fast": FastNet, "resnet": ResNet}


@torch.no_grad()
def init_weights(model: nn.Module, how: str) -> None:
    """The `init` knob: every convolution and linear layer initialised as the notes'
    init_weights does (default: leave PyTorch's own)."""
    if how == "default":
        return
    for m in model.modules():
        if not isinstance(m, (nn.Conv2d, nn.Linear)):
            continue
        if how == "normal":
            nn.init.normal_(m.weight, 0.0, 0.02)
        elif how == "xavier":
            nn.init.xavier_uniform_(m.weight)
        else:
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
        if m.bias is not None:              # (resnet's convolutions have none)
            m.bias.fill_(0.01) if how == "xavier" else nn.init.zeros_(m.bias)


# What a net of this project's datasets takes and gives: MNIST-sized images, ten classes.
INPUT_SHAPE, CLASSES = (1, 28, 28), 10


def build_model(name: str, checkpointing: str = "off", preserve_rng_state: bool = True,
                init: str = "default", recorded: dict[str, Any] | None = None,
                shape: tuple[int, ...] = INPUT_SHAPE, classes: int = CLASSES) -> nn.Module:
    """The run's net: one of MODELS, or a net of the user's own file (`PATH.py:Name`,
    `load_file_model`; `recorded`: the settings a run recorded, whose file and hash it must
    be built from again), for images of `shape` (C, H, W) in `classes` classes: the
    built-in nets take MNIST's."""
    if is_file_model(name):
        model = load_file_model(name, recorded, tuple(shape), classes)
        if checkpointing != "off":
            _checkpoint_children(model, checkpointing, preserve_rng_state)
        init_weights(model, init)
        return model
    else:
        if tuple(shape) != INPUT_SHAPE or classes != CLASSES:
            # image_size only where it would help: grayscale images of another size in 10
            # classes
            resize = shape[0] == 1 and tuple(shape[1:]) != INPUT_SHAPE[1:] and \
                classes == CLASSES
            raise ConfigError("model", f"{name} takes 1x28x28 images in 10 classes; this "
                              f"dataset's are {'x'.join(map(str, shape))} in {classes} "
                              "classes: use a net of your own file (model = FILE.py:Name)"
                              + (", or resize them: image_size = 28" if resize else ""))
        model = MODELS[name]()
    init_weights(model, init)
    model.checkpointing = checkpointing
    model.preserve_rng_state = preserve_rng_state
    return model


def _checkpoint_children(net: nn.Module, how: str, preserve_rng_state: bool) -> None:
    """Activation checkpointing on a net of the user's own file: an nn.Sequential has its
    children recomputed in backward, one block each, as the built-in nets' blocks are (its
    parameters and their names unchanged); any other net is refused naming the field."""
    if not isinstance(net, nn.Sequential):
        raise ConfigError("activation_checkpointing", f"recomputes each child of an "
                          f"nn.Sequential; this net is a {type(net).__name__}, whose blocks "
                          "it cannot know: set it off, or make the net an nn.Sequential")
    children = list(net)
    context = {} if how == "full" else {
        "context_fn": partial(create_selective_checkpoint_contexts, _keep_expensive)}

    def forward(x: torch.Tensor) -> torch.Tensor:
        recompute = net.training and torch.is_grad_enabled()
        for child in children:
            x = checkpoint(child, x, use_reentrant=False,
                           preserve_rng_state=preserve_rng_state, **context) \
                if recompute else child(x)
        return x
    net.forward = forward


def load_file_model(spec: str, recorded: dict[str, Any] | None = None,
                    shape: tuple[int, ...] = INPUT_SHAPE, classes: int = CLASSES) -> nn.Module:
    """The user's net `PATH.py:Name`, built in this process, the one that trains (or replays)
    it: the file's bytes read once, hashed, and run only when this user trusts that content
    (core/settings/user_models.py; else BadInput naming `tui-trainer trust`, nothing run).
    A run that recorded its file (`recorded`: model_file, model_sha256) is built from that
    file again, and only from the same content (else BadInput naming both hashes). `Name`
    is an nn.Module subclass or a function returning one, built with no arguments; its
    output must be one score per class for a batch of the dataset's images (checked on a
    batch of zeros, in eval mode: no random number drawn, no statistic updated). The module
    keeps what was built (`model_file`: path, name, sha256, source) for the run's record."""
    _, name = user_models.parse(spec)
    path, data, sha = user_models.checked(spec, recorded)
    module = types.ModuleType(f"tui_trainer_model_{sha[:16]}")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module       # (classes defined there can be found again)
    try:
        exec(compile(data, str(path), "exec", dont_inherit=True), module.__dict__)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's code, said in one line
        raise BadInput(f"model: importing {shown(path, 200)} raised {type(e).__name__}: "
                       f"{shown(e, 200)}") from None
    obj = module.__dict__.get(name)
    if obj is None:
        raise BadInput(f"model: {shown(path, 200)} defines no {name}")
    if not callable(obj) or (isinstance(obj, type) and not issubclass(obj, nn.Module)):
        raise BadInput(f"model: {name} in {shown(path, 200)} is not an nn.Module subclass "
                       "or a function returning one")
    try:
        net = obj()
    except (Exception, SystemExit) as e:  # noqa: BLE001
        raise BadInput(f"model: {name}() in {shown(path, 200)} raised {type(e).__name__}: "
                       f"{shown(e, 200)} (it is built with no arguments)") from None
    if not isinstance(net, nn.Module):
        raise BadInput(f"model: {name}() in {shown(path, 200)} returned a "
                       f"{type(net).__name__}, not an nn.Module")
    was_training = net.training
    net.eval()
    try:
        with torch.no_grad():
            out = net(torch.zeros(2, *shape))
    except (Exception, SystemExit) as e:  # noqa: BLE001
        raise BadInput(f"model: {name} in {shown(path, 200)} cannot take a batch of the "
                       f"dataset's images (2 x {' x '.join(map(str, shape))}): "
                       f"{type(e).__name__}: {shown(e, 200)}") from None
    finally:
        net.train(was_training)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise BadInput(f"model: {name} in {shown(path, 200)} returns {got} for a batch of 2 "
                       f"images; it must return one score per class: (2, {classes})")
    net.model_file = {"path": str(path), "name": name, "sha256": sha,
                      "source": data.decode("utf-8", "replace")}
    return net
