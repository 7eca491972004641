"""Datasets and loaders: which data a run uses, and the two ways of feeding it.

- `torchvision` loader: torchvision datasets with per-sample transforms in a DataLoader, as
  pytorch/examples does it.
- `resident` loader: the whole split decoded and normalized once into one tensor on the
  device; batches are taken by index, augmentation is done for the whole batch at once.
"""

from __future__ import annotations

import random
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torchvision.transforms.functional as TF
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset
from torchvision import datasets, transforms

from ..core.settings import datafiles
from ..core.settings.config import ConfigError, RunConfig
from ..core.settings.datafiles import DataUnavailable  # noqa: F401  (raised by datafiles.prepare)
from ..core.settings.machine import offline

MEAN_STD = {"mnist": (0.1307, 0.3081), "fashion-mnist": (0.2860, 0.3530),
            "synthetic": (0.5, 0.25), "folder": (0.5, 0.5), "kmnist": (0.1918, 0.3483),
            "emnist": (0.1751, 0.3332), "cifar10": (0.4734, 0.2516)}
MAX_SHIFT = 2


@dataclass
class DataInfo:
    name: str            # mnist, fashion-mnist, mnist-sample, synthetic or folder
    description: str
    root: str
    train_size: int
    eval_size: int
    shape: tuple[int, int, int] = (1, 28, 28)    # an image: channels, height, width
    classes: int = 10

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        if self.shape == (1, 28, 28) and self.classes == 10:    # as every run recorded it
            del out["shape"], out["classes"]
        else:
            out["shape"] = list(self.shape)
        return out


# --- where the data come from (core/settings/datafiles.py makes them ready on disk)
# ----------------

def _try_download_mnist(root: Path) -> bool:
    if offline():
        return False
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(10)
    try:
        datasets.MNIST(str(root), train=True, download=True)
        datasets.MNIST(str(root), train=False, download=True)
        return True
    except Exception:  # noqa: BLE001 - any failure means "not available"; we fall back
        return False
    finally:
        socket.setdefaulttimeout(previous)


DESCRIPTIONS = {
    "mnist": "MNIST (60,000 train / 10,000 test)",
    "mnist-sample": "MNIST sample shipped with tui-trainer: the 10,000 real MNIST test "
                    "digits, split 8,000 train / 2,000 eval",
    "fashion-mnist": "Fashion-MNIST (60,000 train / 10,000 test)",
    "synthetic": "synthetic: random images and labels (for speed tests; nothing to learn)",
    "folder": "your images",
    "kmnist": "KMNIST, Kuzushiji-MNIST (60,000 train / 10,000 test)",
    "emnist": "EMNIST balanced: handwritten digits and letters, 47 classes (112,800 train / "
              "18,800 test)",
    "cifar10": "CIFAR-10: colour 32x32 images, 10 classes (50,000 train / 10,000 test)",
}
# Each dataset's images (channels, height, width) and classes, where not MNIST's.
SHAPES = {"emnist": ((1, 28, 28), 47), "cifar10": ((3, 32, 32), 10)}
SPLIT_OFF = 5       # a folder without val/: one image in five is held out for evaluation


def load_datasets(cfg: RunConfig) -> tuple[Dataset, Dataset, DataInfo]:
    """The raw train and eval datasets (PIL images, no transform yet) and what they are.
    A data_dir that cannot be used (a file, a name too long, no permission, a full disk) is
    refused naming the key, before anything is written to the session (datafiles.prepare,
    which also fetches full MNIST where it is missing and can be)."""
    name, root, fallback = datafiles.prepare(cfg.to_dict(), _try_download_mnist)
    with datafiles.refusing(cfg.to_dict()):        # their files read: the same refusals
        if name in ("mnist", "mnist-sample"):
            train = datasets.MNIST(str(root), train=True, download=False)
            test = datasets.MNIST(str(root), train=False, download=False)
        elif name == "fashion-mnist":
            train = datasets.FashionMNIST(str(root), train=True, download=False)
            test = datasets.FashionMNIST(str(root), train=False, download=False)
        elif name == "folder":
            return _folder(cfg, root)
        elif name == "kmnist":
            train = datasets.KMNIST(str(root), train=True, download=False)
            test = datasets.KMNIST(str(root), train=False, download=False)
        elif name == "emnist":
            train = datasets.EMNIST(str(root), "balanced", train=True, download=False)
            test = datasets.EMNIST(str(root), "balanced", train=False, download=False)
        elif name == "cifar10":
            train = datasets.CIFAR10(str(root), train=True, download=False)
            test = datasets.CIFAR10(str(root), train=False, download=False)
        else:  # synthetic
            n_train = cfg.train_samples or 8000
            n_eval = cfg.eval_samples or 2000
            # FakeData draws each image from a generator seeded by its index: fixed data.
            train = datasets.FakeData(n_train, (1, 28, 28), 10, random_offset=0)
            test = datasets.FakeData(n_eval, (1, 28, 28), 10, random_offset=n_train)
    if cfg.train_samples and cfg.train_samples < len(train):
        train = Subset(train, range(cfg.train_samples))
    if cfg.eval_samples and cfg.eval_samples < len(test):
        test = Subset(test, range(cfg.eval_samples))
    shape, classes = SHAPES.get(name, ((1, 28, 28), 10))
    if name == "cifar10" and cfg.augment != "off":
        raise ConfigError("augment", "shifts grayscale images; cifar10's are colour: "
                          "augment = off")
    info = DataInfo(name=name, description=DESCRIPTIONS[name] + fallback, root=str(root),
                    train_size=len(train), eval_size=len(test), shape=shape,
                    classes=classes)
    return train, test, info


def _base(ds: Dataset) -> Dataset:
    while isinstance(ds, Subset):
        ds = ds.dataset
    return ds


def _mean_std(info: DataInfo) -> tuple[float, float]:
    return MEAN_STD.get(info.name, MEAN_STD["mnist"])


# --- the user's own images (dataset = folder:PATH) ----------------------------------------

class Folder(datasets.ImageFolder):
    """An ImageFolder whose images come converted (grayscale "L" or colour "RGB") and
    resized as the run asks, leaving out the folders that hold the split (val/, train/)."""

    def __init__(self, root: Path, mode: str, size: int, skip: tuple[str, ...] = ()):
        self.mode, self.size, self.skip = mode, size, skip
        super().__init__(str(root), loader=self._load)

    def find_classes(self, directory: str) -> tuple[list[str], dict[str, int]]:
        return _classes(Path(directory), self.skip)

    def _load(self, path: str) -> Any:
        from PIL import Image
        with open(path, "rb") as f:
            img = Image.open(f).convert(self.mode)
        return img.resize((self.size, self.size)) if self.size else img


def _classes(directory: Path, skip: tuple[str, ...]) -> tuple[list[str], dict[str, int]]:
    """The class folders of a tree, in order (hidden ones and `skip` left out); a tree
    without any is refused naming the key."""
    classes = sorted(e.name for e in directory.iterdir() if e.is_dir()
                     and not e.name.startswith(".") and e.name not in skip)
    if not classes:
        raise ConfigError("dataset", f"{directory} has no class folders: give a folder "
                          "holding one folder of images per class")
    return classes, {c: i for i, c in enumerate(classes)}


def _scan(root: Path, skip: tuple[str, ...]) -> tuple[str, set[tuple[int, int]], int]:
    """What the images of a tree are: colour or grayscale, their sizes, how many (each
    image's header read, not its pixels)."""
    from PIL import Image
    _, to_idx = _classes(root, skip)
    files = datasets.folder.make_dataset(str(root), to_idx, allow_empty=True,
                                         extensions=datasets.folder.IMG_EXTENSIONS)
    colour, sizes = False, set()
    for path, _ in files:
        with Image.open(path) as img:
            sizes.add(img.size)
            colour = colour or img.mode not in ("1", "L", "LA", "I", "I;16", "F")
    return ("RGB" if colour else "L"), sizes, len(files)


# Folders that hold a split of the images, never a class: PATH/train/ is what is trained on,
# PATH/val/ (else PATH/test/) what is evaluated on.
SPLITS = ("train", "val", "test")


def split_of(root: Path) -> tuple[Path, Path | None, tuple[str, ...]]:
    """(the tree trained on, the one evaluated on or None, the folders of the first that
    are not classes): train/ with val/ or test/; train/ alone (a fifth held out); the tree
    with val/ or test/ beside its classes; the tree alone. A class folder named train,
    val or test where it cannot be the split is refused, naming it."""
    held = next((root / n for n in ("val", "test") if (root / n).is_dir()), None)
    if (root / "train").is_dir():
        train_dir, skip = root / "train", ()
    else:
        train_dir, skip = root, (held.name,) if held is not None else ()
    named = [c for c in _classes(train_dir, skip)[0] if c in SPLITS]
    if named:
        raise ConfigError("dataset", f"{train_dir} has a class folder named "
                          f"{', '.join(named)}: train/, val/ and test/ hold a split of the "
                          "images, never a class; rename it, or put the class folders "
                          f"under {root / 'train'}/")
    return train_dir, held, skip


def _folder(cfg: RunConfig, root: Path) -> tuple[Dataset, Dataset, DataInfo]:
    """The user's ImageFolder tree, split as `split_of` says; where nothing is held for
    evaluation, one image in SPLIT_OFF is held out by a split drawn from the run's seed (0
    without one), recorded in the description."""
    train_dir, val_dir, skip = split_of(root)
    mode, sizes, count = _scan(train_dir, skip)
    if val_dir is not None:
        vmode, vsizes, _ = _scan(val_dir, ())
        mode = "RGB" if "RGB" in (mode, vmode) else "L"
        sizes |= vsizes
    if count == 0:
        raise ConfigError("dataset", f"{train_dir} has class folders but no images in them")
    if len(sizes) > 1 and not cfg.image_size:
        some = ", ".join(f"{w}x{h}" for w, h in sorted(sizes)[:3])
        raise ConfigError("image_size", f"the images of {root} have {len(sizes)} sizes "
                          f"({some}, ...); set image_size to the square size to resize "
                          "them to")
    w, h = (cfg.image_size, cfg.image_size) if cfg.image_size else next(iter(sizes))
    full = Folder(train_dir, mode, cfg.image_size, skip)
    if val_dir is not None:
        test: Dataset = Folder(val_dir, mode, cfg.image_size)
        if test.classes != full.classes:
            raise ConfigError("dataset", f"{val_dir} holds other classes than {train_dir} "
                              f"({', '.join(test.classes[:5])} against "
                              f"{', '.join(full.classes[:5])})")
        train: Dataset = full
        how = f"evaluated on {val_dir.name}/"
    else:
        seed = cfg.seed if cfg.seed is not None else 0
        g = torch.Generator()
        g.manual_seed(seed)
        order = torch.randperm(len(full), generator=g).tolist()
        held = max(1, len(full) // SPLIT_OFF)
        test = Subset(full, sorted(order[:held]))
        train = Subset(full, sorted(order[held:]))
        how = (f"no val/ or test/: one in {SPLIT_OFF} held out for evaluation by a split "
               f"seeded {seed}")
    if cfg.train_samples and cfg.train_samples < len(train):
        train = Subset(train, range(cfg.train_samples))
    if cfg.eval_samples and cfg.eval_samples < len(test):
        test = Subset(test, range(cfg.eval_samples))
    channels = 3 if mode == "RGB" else 1
    if channels == 3 and cfg.augment != "off":
        raise ConfigError("augment", f"shifts grayscale images; the images of {root} are "
                          "colour: augment = off")
    info = DataInfo(name="folder", root=str(root), train_size=len(train),
                    eval_size=len(test), shape=(channels, h, w), classes=len(full.classes),
                    description=f"your images in {root}: {len(full.classes)} classes, "
                    f"{'colour' if channels == 3 else 'grayscale'} {w}x{h}, {how} "
                    f"({len(train):,} train / {len(test):,} eval)")
    return train, test, info


# --- augmentation ------------------------------------------------------------------------

def draw_shift(rng: str) -> tuple[int, int]:
    """A random (dx, dy) in [-MAX_SHIFT, MAX_SHIFT], from torch's or numpy's global RNG:
    inside a DataLoader worker that is the worker's own RNG."""
    if rng == "numpy":
        dx, dy = np.random.randint(-MAX_SHIFT, MAX_SHIFT + 1, size=2)
        return int(dx), int(dy)
    dx, dy = torch.randint(-MAX_SHIFT, MAX_SHIFT + 1, (2,)).tolist()
    return dx, dy


class RandomShift:
    """Shifts an image by a few whole pixels, filling with black."""

    def __init__(self, rng: str):
        self.rng = rng

    def __call__(self, img: Any) -> Any:
        dx, dy = draw_shift(self.rng)
        return TF.affine(img, angle=0.0, translate=[dx, dy], scale=1.0, shear=[0.0])

    def __repr__(self) -> str:
        return f"RandomShift(max_shift={MAX_SHIFT}, rng={self.rng})"


def shift_batch(x: torch.Tensor, dxy: torch.Tensor, fill: float) -> torch.Tensor:
    """Shifts each image of x (N, 1, H, W) by its own (dx, dy): one gather from the padded
    images by flat index (3.6x faster than advanced indexing with three index tensors on a
    batch of 512, the same values: the profiler found `aten::index` at 6% of a step)."""
    n, _, h, w = x.shape
    p = MAX_SHIFT
    padded = torch.nn.functional.pad(x, (p, p, p, p), value=fill).reshape(n, -1)
    dxy = dxy.to(x.device)
    rows = torch.arange(h, device=x.device)[None, :] + p - dxy[:, 1:2]   # (N, H)
    cols = torch.arange(w, device=x.device)[None, :] + p - dxy[:, 0:1]   # (N, W)
    flat = (rows[:, :, None] * (w + 2 * p) + cols[:, None, :]).reshape(n, h * w)
    return padded.gather(1, flat).view(n, 1, h, w)


# --- loaders -----------------------------------------------------------------------------

def seed_worker(worker_id: int) -> None:
    """worker_init_fn: numpy and random get the worker's own torch seed (base seed + id)."""
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)


@dataclass
class Shard:
    """One process's share of a data-parallel run's training set, as DistributedSampler
    takes it: every rank draws the same permutation (seed + epoch), pads it to a multiple of
    the world size by repeating its start, and takes every world-th index from its rank."""
    rank: int
    world: int
    seed: int
    epoch: int = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def indices(self, n: int) -> torch.Tensor:
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        order = torch.randperm(n, generator=g)
        total = -(-n // self.world) * self.world
        if total > n:
            order = torch.cat([order, order[:total - n]])
        return order[self.rank:total:self.world]


class ResidentLoader:
    """The whole split as one normalized tensor on the device; batches by index."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, shuffle: bool,
                 augment: str, fill: float, generator: torch.Generator | None,
                 shard: Shard | None = None, drop_last: bool = False):
        self.x, self.y = x, y
        self.drop_last = drop_last
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.augment = augment
        self.fill = fill
        self.generator = generator
        self.shard = shard

    def _size(self) -> int:
        return len(self.x) if self.shard is None else -(-len(self.x) // self.shard.world)

    def __len__(self) -> int:
        if self.drop_last:
            return self._size() // self.batch_size
        return (self._size() + self.batch_size - 1) // self.batch_size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # The epoch's samples gathered once, in its order: each batch is then a slice, the
        # values its own gather would give, without an index op per step (a step's host
        # work where a step is short). The order is drawn as without drop_last: the
        # batches kept are the same.
        if self.shard is not None:
            order = self.shard.indices(len(self.x))
        elif self.shuffle:
            order = torch.randperm(self._size(), generator=self.generator)
        else:
            order = None                    # in order: slices of the split itself
        if order is None:
            xs, ys = self.x, self.y
        else:
            order = order.to(self.x.device)
            xs, ys = self.x[order], self.y[order]
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            x = xs[start:start + self.batch_size]
            if self.augment == "torch":
                x = shift_batch(x, torch.randint(-MAX_SHIFT, MAX_SHIFT + 1, (len(x), 2)),
                                self.fill)
            elif self.augment == "numpy":
                dxy = torch.from_numpy(np.random.randint(-MAX_SHIFT, MAX_SHIFT + 1,
                                                         size=(len(x), 2)))
                x = shift_batch(x, dxy, self.fill)
            yield x, ys[start:start + self.batch_size]


def _resident_tensors(ds: Dataset, info: DataInfo, device: torch.device
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    base = _base(ds)
    idx = list(ds.indices) if isinstance(ds, Subset) else None
    if isinstance(base, datasets.MNIST):  # FashionMNIST is a subclass
        data, targets = base.data, base.targets
        if idx is not None:
            data, targets = data[idx], targets[idx]
        x = data.unsqueeze(1).float().div_(255)
    else:  # FakeData: render each image once through the same ToTensor as the loader
        to_tensor = transforms.ToTensor()
        pairs = [ds[i] for i in range(len(ds))]
        x = torch.stack([to_tensor(img) for img, _ in pairs])
        targets = torch.tensor([int(t) for _, t in pairs])
    mean, std = _mean_std(info)
    x = (x - mean) / std
    return x.to(device), targets.long().to(device)


@dataclass
class Loaders:
    train: Any
    eval: Any
    info: DataInfo
    generator: torch.Generator | None   # the training loader's own RNG, if it has one
    pin_memory: bool                     # as applied (only true on CUDA)
    sampler: Any = None                  # a data-parallel run's DistributedSampler or Shard

    def set_epoch(self, epoch: int) -> None:
        """A data-parallel run's shuffle depends on the epoch (DistributedSampler.set_epoch);
        a single process's comes from the loader's generator and needs nothing."""
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)


def make_loaders(cfg: RunConfig, device: torch.device, rank: int = 0, world: int = 1,
                 sampler_seed: int = 0) -> Loaders:
    """The training and evaluation loaders. In a data-parallel run (world > 1) each process
    loads only its shard of the training set (DistributedSampler, seeded with sampler_seed,
    the run's seed) in batches of batch_size / world, so that one optimizer step sees
    batch_size samples in all, as with one process."""
    train_ds, eval_ds, info = load_datasets(cfg)
    batch = cfg.batch_size // world
    mean, std = _mean_std(info)
    # The training shuffle (and the workers' base seed) come from a generator of their own
    # when seed_workers is on; otherwise from the global torch RNG, as in a plain DataLoader.
    generator = None
    if cfg.seed_workers and cfg.seed is not None:
        generator = torch.Generator()
        generator.manual_seed(cfg.seed)
    # Evaluation never draws from the training RNG streams, so how often a run evaluates does
    # not change its training bits.
    eval_generator = torch.Generator()
    eval_generator.manual_seed(0)
    pin = cfg.pin_memory and device.type == "cuda"

    if cfg.loader == "resident":
        fill = (0.0 - mean) / std
        x, y = _resident_tensors(train_ds, info, device)
        ex, ey = _resident_tensors(eval_ds, info, device)
        shard = Shard(rank, world, sampler_seed) if world > 1 else None
        train = ResidentLoader(x, y, batch, True, cfg.augment, fill, generator, shard,
                               drop_last=cfg.drop_last)
        ev = ResidentLoader(ex, ey, cfg.eval_batch_size, False, "off", fill, None)
        return Loaders(train, ev, info, generator, pin_memory=False, sampler=shard)

    steps: list[Any] = [RandomShift(cfg.augment)] if cfg.augment != "off" else []
    channels = info.shape[0]
    to_tensor = [transforms.ToTensor(), transforms.Normalize((mean,) * channels,
                                                            (std,) * channels)]
    _base(train_ds).transform = transforms.Compose(steps + to_tensor)
    _base(eval_ds).transform = transforms.Compose(to_tensor)
    workers = cfg.num_workers
    sampler = DistributedSampler(train_ds, num_replicas=world, rank=rank, shuffle=True,
                                 seed=sampler_seed, drop_last=False) if world > 1 else None
    train = DataLoader(
        train_ds, batch_size=batch, shuffle=sampler is None, sampler=sampler,
        drop_last=cfg.drop_last, num_workers=workers, pin_memory=pin,
        persistent_workers=cfg.persistent_workers and workers > 0,
        worker_init_fn=seed_worker if cfg.seed_workers else None, generator=generator)
    ev = DataLoader(eval_ds, batch_size=cfg.eval_batch_size, shuffle=False,
                    num_workers=workers, pin_memory=pin, generator=eval_generator)
    return Loaders(train, ev, info, generator, pin_memory=pin, sampler=sampler)
