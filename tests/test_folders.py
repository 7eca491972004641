"""Your own images (issue 59, point 5): `dataset = "folder:PATH"`, an ImageFolder tree.
device=cpu: claims about reading the user's images and training on them here."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import db_rows, sets, tt
from tui_trainer.core.settings.datafiles import sample_gz_dir

RUN = ["device=cpu", "batch_size=32", "log_every=2", "fingerprint_every=3", "max_steps=12",
       "checkpoint_every=4"]


def digits(root: Path, per_class: int = 30, val: int = 0) -> Path:
    """An ImageFolder tree of the shipped sample's digits, one folder per label (PNGs);
    with `val`, a val/ folder of that many more per class."""
    d = sample_gz_dir()
    x = np.frombuffer(gzip.open(d / "t10k-images-idx3-ubyte.gz").read()[16:],
                      np.uint8).reshape(-1, 28, 28)
    y = np.frombuffer(gzip.open(d / "t10k-labels-idx1-ubyte.gz").read()[8:], np.uint8)
    for c in range(10):
        idx = np.flatnonzero(y == c)[:per_class + val]
        for j, i in enumerate(idx):
            folder = root / ("val" if j >= per_class else "") / str(c)
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(x[i]).save(folder / f"{i}.png")
    return root


def test_a_folder_of_the_samples_digits_trains_and_resumes_exactly(tmp_path):
    """The built-in nets train on a folder of 28x28 grayscale digits; without val/ a fifth
    is held out by a split the seed draws (said in the run's data); with two workers and
    numpy augmentation, a run killed by SIGKILL and resumed is bit-identical."""
    tree = digits(tmp_path / "digits")
    s = tmp_path / "s"
    r = tt("run", "--session", str(s), "--json", *sets(*RUN, f"dataset=folder:{tree}"))
    assert r.rc == 0, r.err
    data = json.loads(db_rows(s, "SELECT fingerprint FROM runs")[0][0])["data"]
    assert data["name"] == "folder" and data["train_size"] == 240 and data["eval_size"] == 60
    assert "split seeded 1" in data["description"] and "10 classes" in data["description"]
    r = tt("repro", "--session", str(tmp_path / "r"), "--json", "--resume-at", "6",
           *sets(*RUN, f"dataset=folder:{tree}", "num_workers=2", "augment=numpy"))
    assert r.rc == 0, r.err
    assert json.loads(r.out)["identical"] is True


def test_a_val_folder_is_the_evaluation_and_colour_needs_a_net_of_your_own(tmp_path):
    """Colour images of another size and three classes, with val/: the built-in nets are
    refused naming model; a net of the user's file for 3x16x16 trains and evaluates on
    val/; augmentation (grayscale shifts) is refused naming augment."""
    import random
    rnd = random.Random(0)
    root = tmp_path / "colours"
    for split, n in (("", 20), ("val", 5)):
        for c, name in enumerate(("red", "green", "blue")):
            d = root / split / name
            d.mkdir(parents=True)
            for i in range(n):
                rgb = [rnd.randint(0, 80)] * 3
                rgb[c] = rnd.randint(150, 255)
                Image.new("RGB", (16, 16), tuple(rgb)).save(d / f"{i}.png")
    net = tmp_path / "cnet.py"
    net.write_text("from torch import nn\n\n\nclass Net(nn.Module):\n"
                   "    def __init__(self):\n        super().__init__()\n"
                   "        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), "
                   "nn.Flatten(), nn.Linear(4 * 14 * 14, 3))\n\n"
                   "    def forward(self, x):\n        return self.body(x)\n")
    s = tmp_path / "s"
    cfg = [*RUN, f"dataset=folder:{root}", "batch_size=10"]
    r = tt("run", "--session", str(s), *sets(*cfg))
    assert r.rc == 2 and "model: grokking takes 1x28x28 images in 10 classes" in r.err
    r = tt("run", "--session", str(s), *sets(*cfg, f"model={net}:Net", "augment=torch"))
    assert r.rc == 2 and "augment:" in r.err
    r = tt("run", "--session", str(s), "--json", *sets(*cfg, f"model={net}:Net"))
    assert r.rc == 0, r.err
    data = json.loads(db_rows(s, "SELECT fingerprint FROM runs")[0][0])["data"]
    assert data["shape"] == [3, 16, 16] and data["classes"] == 3 and data["eval_size"] == 15
    assert "evaluated on val/" in data["description"]
    # what the net sees in one of them (the Model tab's answer): the colour image, the
    # three folders' names as the classes, three probabilities; drawn at 80 columns
    r = tt("activations", "1", "--session", str(s), "--digit", "7", "--json")
    assert r.rc == 0, r.err
    from tui_trainer.core.analysis import activations
    from tui_trainer.core.session.store import SessionStore
    with SessionStore(s, create=False, readonly=True) as store:
        meta = activations.newest(store.events(1))
    assert meta is not None and meta["classes"] == ["blue", "green", "red"]
    assert len(meta["probs"][0]) == 3 and meta["label"] == 1      # val/'s 8th: green
    arrays = activations.load(s, meta)
    image = arrays["input"]
    assert image.shape == (16, 16, 3) and image[..., 1].mean() > image[..., 0].mean()
    from rich.console import Console
    from tui_trainer.ui.panels.model import compose
    console = Console(width=80, record=True, color_system="truecolor", file=io.StringIO())
    for part in compose(meta, arrays, 80, 1.0, None):
        console.print(part)
    text = console.export_text(clear=False)
    assert "Image 7 of the folder evaluation set" in text and "1 green" in text
    green = activations.input_rgba(image)[0, 0]
    assert f"#{green[0]:02x}{green[1]:02x}{green[2]:02x}" in console.export_html()


@pytest.mark.parametrize("make, key, said", [
    (lambda r: None, "dataset", "is not a folder"),
    (lambda r: r.mkdir(), "dataset", "has no class folders"),
    (lambda r: [(r / c).mkdir(parents=True) for c in "ab"], "dataset",
     "has class folders but no images"),
    (lambda r: [Image.new("L", (s, s)).save(_mk(r / c) / "1.png") for c, s in
                (("a", 28), ("b", 20))], "image_size", "have 2 sizes"),
    # a split folder among the classes, where it cannot be the split: said to be one
    (lambda r: [Image.new("L", (28, 28)).save(_mk(r / "train" / c) / "1.png")
                for c in ("a", "test")], "dataset", "has a class folder named test")])
def test_a_bad_folder_is_one_line_naming_the_field_and_nothing_is_stored(
        tmp_path, make, key, said):
    root = tmp_path / "images"
    make(root)
    s = tmp_path / "s"
    r = tt("run", "--session", str(s), *sets(*RUN, f"dataset=folder:{root}"))
    assert r.rc == 2, (r.rc, r.err)
    assert f"{key}: " in r.err and said in r.err and "Traceback" not in r.err, r.err
    assert not (s / "session.sqlite").exists() or db_rows(s, "SELECT id FROM runs") == []


def _mk(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def test_a_torchvision_dataset_on_disk_is_named_and_a_missing_one_says_where(tmp_path):
    """kmnist read from data_dir in torchvision's layout (here: the sample's digits in its
    files) trains; emnist and cifar10 absent are refused in one line naming where they
    were looked for, nothing stored, nothing downloaded."""
    from tui_trainer.core.settings.datafiles import extract_idx
    data = tmp_path / "data"
    extract_idx(sample_gz_dir(), data / "KMNIST" / "raw")
    s = tmp_path / "s"
    r = tt("run", "--session", str(s), "--json",
           *sets(*RUN, "dataset=kmnist", f"data_dir={data}", "train_samples=640",
                 "eval_samples=200"))
    assert r.rc == 0, r.err
    info = json.loads(db_rows(s, "SELECT fingerprint FROM runs")[0][0])["data"]
    assert info["name"] == "kmnist" and info["train_size"] == 640
    for name, where in (("emnist", "EMNIST/raw"), ("cifar10", "cifar-10-batches-py")):
        r = tt("run", "--session", str(tmp_path / name),
               *sets(*RUN, f"dataset={name}", f"data_dir={data}"))
        assert r.rc == 2 and "dataset: " in r.err and str(data / where) in r.err, r.err
        assert "never downloaded" in r.err and not (tmp_path / name).exists()


def test_a_folder_a_session_names_is_read_only_once_you_named_it(tmp_path, monkeypatch):
    """A session from someone else names a folder of images on this machine: listing and
    export read the session only; continuing a run, its twin and what its net sees refuse
    in one line naming the folder and `tui-trainer trust`, before anything is read or made;
    once this user names the folder, they work."""
    tree = digits(tmp_path / "digits")
    s = tmp_path / "s"
    assert tt("run", "--session", str(s), *sets(*RUN, f"dataset=folder:{tree}")).rc == 0
    monkeypatch.setenv("TUI_TRAINER_HOME", str(tmp_path / "another-user"))
    assert tt("runs", "--session", str(s)).rc == 0
    assert tt("export", "--session", str(s), "1").rc == 0
    for r in (tt("resume", "1", "--session", str(s), "--set", "max_steps=16"),
              tt("repro", "--session", str(s), "--run", "1", "--json"),
              tt("activations", "1", "--session", str(s), "--no-png")):
        assert r.rc == 2, (r.rc, r.err)
        assert f"dataset: {tree} was named by a session, not by you" in r.err, r.err
        assert f"tui-trainer trust {tree}" in r.err and "Traceback" not in r.err
    assert db_rows(s, "SELECT count(*) FROM runs") == [(1,)]         # no twin made
    r = tt("trust", str(tree), "--json")
    assert r.rc == 0 and json.loads(r.out) == {"folder": str(tree)}
    assert tt("resume", "1", "--session", str(s), "--set", "max_steps=16").rc == 0



def two_classes(root: Path, splits: tuple[str, ...], per_class: int = 20) -> Path:
    """200 PNGs in all: 28x28 grayscale digits of two classes (0 and 1) under each split
    folder (train/, val/, test/), `per_class` a class in each."""
    d = sample_gz_dir()
    x = np.frombuffer(gzip.open(d / "t10k-images-idx3-ubyte.gz").read()[16:],
                      np.uint8).reshape(-1, 28, 28)
    y = np.frombuffer(gzip.open(d / "t10k-labels-idx1-ubyte.gz").read()[8:], np.uint8)
    for k, split in enumerate(splits):
        for c in (0, 1):
            for i in np.flatnonzero(y == c)[k * per_class:(k + 1) * per_class]:
                folder = root / split / str(c)
                folder.mkdir(parents=True, exist_ok=True)
                Image.fromarray(x[i]).save(folder / f"{i}.png")
    return root


NET = '''import torch.nn as nn
def Two():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 2))
'''


@pytest.mark.parametrize("splits, train, evaluated", [
    (("train",), 32, 8),                      # train/ alone: a fifth held out
    (("train", "val"), 40, 40), (("train", "test"), 40, 40)])
def test_train_val_and_test_folders_are_the_split_not_classes(tmp_path, splits, train,
                                                              evaluated):
    """device=cpu. A tree of train/ (with val/, test/ or neither) and two classes in each:
    two classes, not one called "train"; a net with two outputs trains on it; the built-in
    net is refused without a suggestion that would not help (the images are 28x28)."""
    root = two_classes(tmp_path / "images", splits)
    (tmp_path / "two.py").write_text(NET)
    s = tmp_path / "s"
    r = tt("run", "--session", str(s), "--json", *sets(
        *RUN, f"dataset=folder:{root}", f"model={tmp_path / 'two.py'}:Two"))
    assert r.rc == 0, r.err
    data = json.loads(db_rows(s, "SELECT fingerprint FROM runs")[0][0])["data"]
    assert data["classes"] == 2 and data["train_size"] == train \
        and data["eval_size"] == evaluated, data
    r = tt("run", "--session", str(tmp_path / "b"), *sets(*RUN, f"dataset=folder:{root}"))
    assert r.rc == 2 and "model: " in r.err and "in 2 classes" in r.err, r.err
    assert "image_size" not in r.err, r.err
