"""Data: the shipped sample, the two loaders feeding the same numbers, augmentation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF
from torchvision import datasets

from tui_trainer.core.settings import datafiles, machine
from tui_trainer.core.settings.config import RunConfig
from tui_trainer.engine import data


def test_shipped_sample_is_real_mnist_split_8000_2000(tmp_path):
    train, test, info = data.load_datasets(RunConfig(dataset="mnist-sample",
                                                     data_dir=str(tmp_path)))
    assert (info.name, info.train_size, info.eval_size) == ("mnist-sample", 8000, 2000)
    assert isinstance(train, datasets.MNIST)
    labels = torch.cat([train.targets, test.targets])
    # Together they are the MNIST test set: its known class counts and pixel mean.
    assert torch.bincount(labels).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028,
                                               974, 1009]
    pixels = torch.cat([train.data, test.data]).float() / 255
    assert abs(pixels.mean().item() - 0.1325) < 5e-4
    # Both parts hold every class in about the same share.
    share = torch.bincount(test.targets) / torch.bincount(train.targets)
    assert share.min() > 0.24 and share.max() < 0.26


def test_auto_falls_back_to_the_sample_offline_and_says_so(tmp_path):
    _, _, info = data.load_datasets(RunConfig(dataset="auto", data_dir=str(tmp_path)))
    assert info.name == "mnist-sample"
    assert "shipped with tui-trainer" in info.description
    assert str(tmp_path / "MNIST" / "raw") in info.description   # where full MNIST would go


def test_auto_uses_full_mnist_when_it_is_in_data_dir(tmp_path):
    # Lay out MNIST/raw with files of the IDX format (here: the sample's, renamed as full).
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in machine.IDX_FILES:
        (raw / f"{name}.gz").write_bytes((datafiles.sample_gz_dir() / f"{name}.gz").read_bytes())
    train, _, info = data.load_datasets(RunConfig(dataset="auto", data_dir=str(tmp_path)))
    assert info.name == "mnist" and len(train) == 8000


def test_resident_and_torchvision_loaders_feed_the_same_normalized_images(tmp_path):
    cfg = RunConfig(dataset="mnist-sample", data_dir=str(tmp_path), eval_samples=300,
                    eval_batch_size=300)
    tv = data.make_loaders(cfg, torch.device("cpu"))
    res = data.make_loaders(cfg.replace(loader="resident"), torch.device("cpu"))
    (x1, y1), = list(tv.eval)
    (x2, y2), = list(res.eval)
    assert torch.equal(y1, y2)
    assert torch.allclose(x1, x2, atol=1e-6)


def test_batch_shift_matches_torchvision_affine_shift():
    shifts = [(dx, dy) for dx in range(-data.MAX_SHIFT, data.MAX_SHIFT + 1)
              for dy in range(-data.MAX_SHIFT, data.MAX_SHIFT + 1)]
    img = torch.rand(len(shifts), 1, 28, 28)
    for fill in (0.0, -0.4242):           # the resident loader fills with normalized black
        out = data.shift_batch(img, torch.tensor(shifts), fill=fill)
        for i, (dx, dy) in enumerate(shifts):
            ref = TF.affine(img[i], angle=0.0, translate=[dx, dy], scale=1.0, shear=[0.0],
                            fill=[fill])
            assert torch.equal(out[i], ref), (dx, dy, fill)


def test_workers_draw_their_own_numpy_streams_even_without_seed_workers(tmp_path):
    """The old pitfall (forked workers repeating one numpy state) is gone: PyTorch >= 1.9
    seeds numpy in each worker. This test keeps `tui-trainer config`'s claim honest."""
    def batches(seed_workers: bool) -> list[torch.Tensor]:
        cfg = RunConfig(dataset="mnist-sample", data_dir=str(tmp_path), train_samples=64,
                        batch_size=32, num_workers=2, augment="numpy",
                        seed_workers=seed_workers)
        np.random.seed(0)
        loaders = data.make_loaders(cfg, torch.device("cpu"))
        data._base(loaders.train.dataset).transform.transforms[0] = _RecordShift()
        return [x for x, _ in loaders.train]

    for seed_workers in (False, True):
        first, second = batches(seed_workers)     # one batch from each worker
        assert not torch.equal(first, second), seed_workers


class _RecordShift:
    """Stands for RandomShift and returns its numpy draw as the image, to compare draws."""

    def __call__(self, img):
        from PIL import Image
        dx, dy = data.draw_shift("numpy")
        return Image.fromarray(np.full((28, 28), (dx + 2) * 5 + (dy + 2), dtype=np.uint8))


def test_seed_workers_decouples_the_data_order_from_the_global_rng(tmp_path):
    def order(seed_workers: bool, draws_before: int) -> list[int]:
        torch.manual_seed(1)
        cfg = RunConfig(dataset="mnist-sample", data_dir=str(tmp_path), train_samples=256,
                        batch_size=256, seed_workers=seed_workers)
        loaders = data.make_loaders(cfg, torch.device("cpu"))
        torch.rand(draws_before)          # e.g. a bigger model's initialisation
        (_, y), = list(loaders.train)
        return y.tolist()

    assert order(True, 10) == order(True, 1000)
    assert order(False, 10) != order(False, 1000)


@pytest.mark.skipif(not machine.FASHION_SYSTEM_DIR.exists(),
                    reason="Debian's dataset-fashion-mnist is not installed")
def test_fashion_mnist_from_the_debian_package(tmp_path):
    train, test, info = data.load_datasets(RunConfig(dataset="fashion-mnist",
                                                  data_dir=str(tmp_path)))
    assert (info.train_size, info.eval_size) == (60000, 10000)
    assert isinstance(train, datasets.FashionMNIST)


def test_missing_fashion_mnist_names_data_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "FASHION_SYSTEM_DIR", Path(tmp_path / "none"))
    with pytest.raises(data.DataUnavailable) as e:
        data.load_datasets(RunConfig(dataset="fashion-mnist", data_dir=str(tmp_path)))
    assert e.value.key == "dataset" and "data_dir" in str(e.value)


@pytest.mark.parametrize("loader", ["torchvision", "resident"])
def test_drop_last_keeps_every_batch_whole_and_the_same_as_without_it(tmp_path, loader):
    """660 samples in batches of 64: ten whole batches and one of 20; drop_last keeps the ten,
    the very same ones (the order is drawn as without it), and drops the 20. On the CPU,
    where both loaders are built here; the loaders do the same on any device."""
    cfg = RunConfig(dataset="mnist-sample", data_dir=str(tmp_path), train_samples=660,
                    batch_size=64, loader=loader, seed_workers=True, seed=3)
    kept = data.make_loaders(cfg.replace(drop_last=True), torch.device("cpu")).train
    every = data.make_loaders(cfg, torch.device("cpu")).train
    assert (len(kept), len(every)) == (10, 11)
    a, b = list(kept), list(every)
    assert [len(y) for _, y in a] == [64] * 10
    assert [len(y) for _, y in b] == [64] * 10 + [20]
    assert all(torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b))


def test_a_resident_epoch_is_gathered_once_and_its_batches_are_its_slices():
    """device=cpu. The resident loader's batches hold the values of the split gathered in
    the epoch's shuffled order (the order its generator draws, as before), and every batch
    of an epoch is a slice of one copy: no index op per step. In order (the evaluation's),
    they are slices of the split itself."""
    from tui_trainer.engine.data import ResidentLoader
    x, y = torch.randn(50, 1, 28, 28), torch.arange(50)
    loader = ResidentLoader(x, y, 16, shuffle=True, augment="off", fill=0.0,
                            generator=torch.Generator().manual_seed(7), drop_last=True)
    order = torch.randperm(50, generator=torch.Generator().manual_seed(7))
    batches = list(loader)
    assert len(batches) == 3 and all(len(b) == 16 for _, b in batches)
    for k, (bx, by) in enumerate(batches):
        assert torch.equal(by, order[16 * k:16 * (k + 1)])
        assert torch.equal(bx, x[order[16 * k:16 * (k + 1)]])
    storage = {bx.untyped_storage().data_ptr() for bx, _ in batches}
    assert len(storage) == 1 and x.untyped_storage().data_ptr() not in storage
    in_order = ResidentLoader(x, y, 20, shuffle=False, augment="off", fill=0.0,
                              generator=None)
    assert [len(b) for _, b in in_order] == [20, 20, 10]
    assert all(bx.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
               for bx, _ in in_order)
