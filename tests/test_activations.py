"""What a net sees in a digit (`activations`, the Model tab): real runs of the shipped sample
on the CPU (device=cpu: the maps are checked against the model recomputed here), the PNG,
the command's refusals, a hostile session's kept maps, and the tab through Pilot."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import QUICK, db_rows, sets, tt
from tui_trainer.core.analysis import activations
from tui_trainer.core.session.store import SessionStore

FIXTURES = Path(__file__).parent / "fixtures"
# 6 steps, a checkpoint at 0, 3 and 6; the CPU (the recomputation below runs here).
SHORT = [*QUICK, "max_steps=6", "checkpoint_every=3", "device=cpu"]


def _train(session: Path, *extra: str) -> None:
    r = tt("run", "--session", str(session), *sets(*SHORT, *extra))
    assert r.rc == 0, r.err


def _seen(session: Path, *args: str) -> dict:
    r = tt("activations", *args, "--session", str(session), "--json")
    assert r.rc == 0, r.err
    return json.loads(r.out)


def _recomputed(session: Path, run_id: int, step: int, digit: int):
    """The run's model at that checkpoint, recomputed here: the eval digit's conv1 output
    and the probabilities, and every eval digit's prediction and confidence."""
    import torch
    from tui_trainer.core.settings.config import from_dict
    from tui_trainer.engine.checkpoint import load_checkpoint
    from tui_trainer.engine.data import _resident_tensors, load_datasets
    from tui_trainer.engine.models import build_model
    store = SessionStore(session, create=False, readonly=True)
    cfg = from_dict(store.run(run_id)["config"])
    path = next(c["path"] for c in store.usable_checkpoints(run_id) if c["step"] == step)
    model = build_model(cfg.model)
    model.load_state_dict(load_checkpoint(path)["model"])
    model.eval()
    _, ev, info = load_datasets(cfg)
    x, y = _resident_tensors(ev, info, torch.device("cpu"))
    with torch.no_grad():
        conv1 = model.conv1(x[digit:digit + 1])[0].numpy()
        probs = model(x).exp()
    return conv1, probs[digit].tolist(), probs, y


def test_the_same_digit_through_two_runs_as_a_png_kept_and_refused_where_wrong(tmp_path):
    _train(tmp_path, "seed=1")
    _train(tmp_path, "seed=1", "lr=0.05")          # the same start, other steps
    meta = _seen(tmp_path, "1", "2", "--digit", "5")
    assert meta["same_start"] is True
    assert meta["runs"] == [1, 2] and meta["steps"] == [6, 6] and meta["digit"] == 5
    assert [L["name"] for L in meta["layers"]] == ["conv1", "conv2"]
    assert [L["shape"] for L in meta["layers"]] == [[10, 24, 24], [20, 8, 8]]
    # The maps kept are each run's conv1 output for that digit, recomputed here; one colour
    # scale spans both runs; the difference is theirs.
    arrays = activations.load(tmp_path, meta)
    for k, rid in enumerate((1, 2)):
        conv1, probs, _, y = _recomputed(tmp_path, rid, 6, 5)
        np.testing.assert_allclose(arrays[f"{k}:conv1"], conv1, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(meta["probs"][k], probs, atol=1e-6)
        assert meta["label"] == int(y[5])
    both = np.concatenate([arrays["0:conv1"].ravel(), arrays["1:conv1"].ravel()])
    L = meta["layers"][0]
    assert (L["lo"], L["hi"]) == pytest.approx((both.min(), both.max()))
    assert L["diff"] == pytest.approx(np.abs(arrays["0:conv1"] - arrays["1:conv1"]).max())
    assert L["diff"] > 0                                  # another lr: other weights
    # The PNG: a real image, named in the answer and printed by the text form.
    png = Path(meta["png"])
    assert png.is_file() and png.parent == tmp_path / "exports"
    with Image.open(png) as img:
        assert img.format == "PNG" and img.size[0] >= 1000 and img.size[1] >= 600
    r = tt("activations", "1", "--session", str(tmp_path), "--step", "3", "--digit", "worst",
           "--out", str(tmp_path / "elsewhere"))
    assert r.rc == 0, r.err
    assert "PNG: " + str(tmp_path / "elsewhere") in r.out
    assert "(the one run 1 gets wrong with the highest confidence)" in r.out
    # worst: the digit the run gets wrong with the highest confidence at step 3
    found = activations.newest(SessionStore(tmp_path, create=False,
                                            readonly=True).events(1), (1,))
    assert found["steps"] == [3] and found["how"] == "worst"
    _, _, probs, y = _recomputed(tmp_path, 1, 3, 0)
    top, pred = probs.max(1)
    wrong = (pred != y).nonzero().flatten().tolist()
    assert found["digit"] in wrong
    assert float(top[found["digit"]]) == pytest.approx(max(float(top[i]) for i in wrong))
    # One run against itself: the difference is exactly nothing, and says so.
    same = _seen(tmp_path, "1", "1")
    assert all(L["diff"] == 0 for L in same["layers"])
    assert "identical" in activations.layer_line(same, same["layers"][0])
    # Two seeds: other initial weights, so channel k of one is not channel k of the other;
    # no difference is drawn, and the words say why (issue 55).
    _train(tmp_path, "seed=2")
    other = _seen(tmp_path, "1", "3")
    assert other["same_start"] is False and all(L["diff"] is None for L in other["layers"])
    assert [v[0] for v in activations.views(other, activations.load(tmp_path, other),
                                            "conv1")] == ["run 1 (step 6)", "run 3 (step 6)"]
    words = " ".join(activations.lines(other))
    assert "Runs 1 and 3 started from other initial weights" in words
    assert "(other initial weights: no difference drawn)" in words
    kinds = db_rows(tmp_path, "SELECT count(*) FROM events WHERE kind = 'activations'")
    assert kinds == [(4,)]
    # Exports of the pair draw its kept view again (and each run's own: run 1's worst).
    r = tt("export", "1", "2", "--session", str(tmp_path), "--out", str(tmp_path / "x"),
           "--json")
    assert r.rc == 0, r.err
    names = {Path(f).name for f in json.loads(r.out)["files"]}
    assert {"runs-1-2-activations-step-6-6-digit-5.png",
            f"run-1-activations-step-3-digit-{found['digit']}.png"} <= names, names
    # Refused, naming what is wrong, with nothing kept: a digit out of range (the eval set
    # holds 200), not a digit, negative; a step with no checkpoint; a run with none.
    store = SessionStore(tmp_path)
    bare = store.create_run(store.run(1)["config"], name="never-trained")
    store.close()
    for args, said in (
            (["1", "--digit", "200"], "--digit 200 is out of range: the evaluation set of "
                                      "mnist-sample has 200 digits, 0 to 199"),
            (["1", "--digit", "seven"], "--digit: must be an index into the evaluation set"),
            (["1", "--digit", "-1"], "--digit: must be 0 or more"),
            (["1", "--step", "4"], "run 1 keeps no checkpoint at that step; it keeps step(s) "
                                   "0, 3, 6"),
            (["1", str(bare)], f"run {bare} has no checkpoint in the session"),
            (["9"], "9")):
        r = tt("activations", *args, "--session", str(tmp_path))
        assert r.rc == 2 and said in r.err and len(r.err.strip().splitlines()) == 1, \
            (args, r.rc, r.err)
    assert db_rows(tmp_path, "SELECT count(*) FROM events WHERE kind = 'activations'") == \
        [(4,)]


def test_runs_of_different_evaluation_sets_are_not_compared(tmp_path):
    _train(tmp_path, "max_steps=1")
    _train(tmp_path, "max_steps=1", "eval_samples=100")
    r = tt("activations", "1", "2", "--session", str(tmp_path))
    assert r.rc == 2 and "evaluate on different digits (mnist-sample, 200 against " \
        "mnist-sample, 100)" in r.err, r.err


def _session_with(tmp_path: Path, meta: dict) -> SessionStore:
    """Runs 1 and 2, marked as the pair, with `meta` kept on run 1."""
    from tui_trainer.core.settings.config import DEFAULTS
    store = SessionStore(tmp_path)
    for name in ("a", "b"):
        store.create_run(DEFAULTS.to_dict(), name=name)
    (tmp_path / "logs").mkdir(exist_ok=True)
    store.add_event(1, activations.EVENT, "kept", data={**meta, "runs": [1, 2]})
    store.set_meta("ui_state", json.dumps({"marked": [1, 2], "pair": [1, 2], "cursor": 1,
                                           "tab": "tab-model"}))
    return store


def test_kept_maps_from_a_hostile_session_are_refused_naming_why(tmp_path, monkeypatch):
    meta = json.loads((FIXTURES / "activations-grokking.json").read_text())
    npz = FIXTURES / "activations-grokking.npz"
    (tmp_path / "logs").mkdir()
    shutil.copy(npz, tmp_path / "logs" / "activations-grokking.npz")
    assert set(activations.load(tmp_path, meta)) == {"input", "0:conv1", "1:conv1", "0:conv2",
                                                     "1:conv2"}
    outside = tmp_path.parent / f"{tmp_path.name}-outside.npz"
    shutil.copy(npz, outside)
    try:
        for change, said in (
                ({"file": f"../{outside.name}"}, "leads outside the session"),
                ({"file": "logs/none.npz"}, "are gone from the session"),
                ({"layers": [{**meta["layers"][0], "shape": [10, 24, 23]}]},
                 "do not match their description (layer conv1)")):
            with pytest.raises(ValueError, match=re.escape(said)):
                activations.load(tmp_path, {**meta, **change})
    finally:
        outside.unlink()
    # an array of Python objects (a pickle) is never loaded
    np.savez(tmp_path / "logs" / "pickled.npz", input=np.array([{"x": 1}], dtype=object))
    with pytest.raises(ValueError, match="cannot be read"):
        activations.load(tmp_path, {**meta, "file": "logs/pickled.npz"})
    # arrays that would unpack to more than the bound are not unpacked (a small file of
    # compressed zeros can hold gigabytes)
    monkeypatch.setattr(activations, "MAX_ARRAYS", 1000)
    with pytest.raises(ValueError, match="would take 0 MiB unpacked, more than 0 MiB"):
        activations.load(tmp_path, meta)
    monkeypatch.undo()
    big = tmp_path / "logs" / "big.npz"
    with open(big, "wb") as f:
        f.truncate(activations.MAX_FILE + 1)
    with pytest.raises(ValueError, match="larger than 64 MiB"):
        activations.load(tmp_path, {**meta, "file": "logs/big.npz"})
    # Metadata that does not read as an answer is passed over, not shown.
    events = [{"kind": activations.EVENT, "data": {**meta, "probs": [[0.1] * 10, [0.1] * 9]}},
              {"kind": activations.EVENT, "data": {**meta, "probs": [[0.1] * 5] * 2}},
              {"kind": activations.EVENT, "data": {**meta, "classes": ["a"] * 9}},
              {"kind": activations.EVENT, "data": {**meta, "probs": [["x"] * 10] * 2}},
              {"kind": activations.EVENT, "data": {**meta, "predicted": [11, 0]}},
              {"kind": activations.EVENT, "data": {**meta, "layers": [
                  {**meta["layers"][0], "shape": [10, 24, 10**9]}]}},
              {"kind": activations.EVENT, "data": {**meta, "runs": ["1", 2]}}]
    assert activations.newest(events) is None
    assert activations.newest([{"kind": activations.EVENT, "data": meta}]) == meta


# --- the Model tab (Pilot) ----------------------------------------------------------------

async def _until(pilot, predicate, timeout: float = 120.0, seen=None) -> None:
    import asyncio
    import time
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, f"timed out; {seen() if seen else ''}"
        await pilot.app.poll_now()
        await asyncio.sleep(0.1)


def _segments(app) -> list:
    """What the tab's picture draws, at the tab's width (Rich's segments: text and style)."""
    import io
    from rich.console import Console
    panel = app.query_one("#model-panel")
    console = Console(width=panel._width(), color_system="truecolor", file=io.StringIO())
    return list(console.render(panel.query_one("#model-picture").content))


def _picture(app) -> str:
    """The words, the digit and the probabilities, then the layers' maps."""
    if not app.query("#model-picture"):
        return ""
    import io
    from rich.console import Console
    panel = app.query_one("#model-panel")
    console = Console(width=panel._width(), file=io.StringIO())
    return "".join(s.text for s in _segments(app)) + "".join(
        s.text for s in console.render(panel.query_one("#model-layers").content))


def _status(app) -> str:
    return str(app.query_one("#model-status").render())


async def test_the_model_tab_shows_a_real_runs_checkpoint_and_its_keys_choose(tmp_path):
    """At 80x24: g computes what the run under the cursor sees (digit 0, its newest
    checkpoint) and shows it; w the worst digit; [ the checkpoint before; each kept. The
    pictures' colours are the colour map's for the kept values."""
    from textual.widgets import DataTable
    from tui_trainer.ui.app import TrainerApp
    _train(tmp_path)
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await app.ready()
        app.query_one("#tabs").active = "tab-model"
        await _until(pilot, lambda: app.query("#model-status") and
                     "g: what the net sees" in _status(app))
        assert "Nothing shown yet for run 1" in _status(app)
        app.query_one("#runs", DataTable).focus()
        await pilot.press("g")
        await _until(pilot, lambda: "Digit 0 of the mnist-sample" in _picture(app))
        text = _picture(app)
        assert "Run 1, checkpoint at step 6 (small two-conv net, 10 and 20 5x5 filters " \
            "(model = grokking))" in " ".join(text.split())        # (wrapped to the width)
        assert "conv1: 10 channel(s) of 24x24" in text and "conv2: 20 channel(s)" in text
        assert "▄" in text and "← label" in text
        panel = app.query_one("#model-panel")
        meta = panel.shown
        assert meta["runs"] == [1] and meta["digit"] == 0 and meta["steps"] == [6]
        # The digit's picture comes first: its top-left cell is drawn in the grey of its two
        # pixels (the lower one as the half block, the upper one behind it).
        digit = activations.load(tmp_path, meta)["input"]
        grey = activations.colours(digit[:2, :1], "gray", 0.0, 1.0)[:, 0, :3]
        seg = next(s for s in _segments(app) if s.text == "▄")
        assert (tuple(seg.style.color.triplet), tuple(seg.style.bgcolor.triplet)) == \
            (tuple(grey[1]), tuple(grey[0]))
        assert digit.max() == pytest.approx(1.0, abs=0.01) and digit.min() == 0.0
        await pilot.press("w")
        await _until(pilot, lambda: panel.shown is not None and panel.shown["how"] == "worst")
        assert "(the one run 1 gets wrong with the highest confidence)" in \
            _picture(app).replace("\n", " ")
        assert panel.shown["predicted"][0] != panel.shown["label"]
        worst = panel.shown["digit"]
        await pilot.press("left_square_bracket")
        await _until(pilot, lambda: panel.shown["steps"] == [3])
        assert panel.shown["digit"] == worst           # the same digit, an earlier checkpoint
        await pilot.press("d")          # a digit by index: the dialog gives the range, and
        await _until(pilot, lambda: app.screen.__class__.__name__ == "NameScreen", 10)
        assert "Its index, 0 to 199." in str(app.screen.query_one("Label").render())
        app.screen.query_one("Input").value = "99999"   # one outside it is refused at once
        await pilot.press("enter")
        await pilot.pause(0.3)
        assert not panel.activating.busy and panel.shown["steps"] == [3]
        assert any("give an index 0 to 199 into the evaluation set (200 digits), not '99999'"
                   in n.message for n in app._notifications)
        await pilot.press("d")                          # one inside, at that checkpoint
        await _until(pilot, lambda: app.screen.__class__.__name__ == "NameScreen", 10)
        app.screen.query_one("Input").value = "7"
        await pilot.press("enter")
        await _until(pilot, lambda: panel.shown["digit"] == 7)
        assert panel.shown["steps"] == [3] and "Digit 7 of the mnist-sample" in _picture(app)
        panel.scroll_home(animate=False)
        await pilot.pause(0.3)
        layers = app.query_one("#model-layers")
        assert not panel.region.contains(layers.region.x, layers.region.y)  # below the view
        await pilot.press("plus")       # bigger maps: fewer to a row, scrolled into view
        await _until(pilot, lambda: panel.region.contains(layers.region.x, layers.region.y)
                     and panel.scroll_y > 0, 30)
        await pilot.press("v")                          # one layer
        await _until(pilot, lambda: "layer 1 of 2" in _picture(app))
        assert "conv2:" not in _picture(app)
    assert db_rows(tmp_path, "SELECT count(*) FROM events WHERE kind = 'activations'") == \
        [(4,)]


async def test_the_model_tab_shows_a_hostile_sessions_names_as_text_and_its_refusal(tmp_path):
    meta = json.loads((FIXTURES / "activations-grokking.json").read_text())
    meta["layers"][0]["name"] = "[bold red]conv\x1b[31m"
    store = _session_with(tmp_path, {**meta, "file": "../../etc/passwd"})
    store.close()
    from tui_trainer.ui.app import TrainerApp
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await app.ready()
        app.query_one("#tabs").active = "tab-model"
        await _until(pilot, lambda: "leads outside the session" in _picture(app), 30)
    # the same maps under the hostile name
    with np.load(FIXTURES / "activations-grokking.npz") as z:
        np.savez(tmp_path / "logs" / "hostile.npz",
                 **{k.replace("conv1", meta["layers"][0]["name"]): z[k] for k in z.files})
    store = SessionStore(tmp_path)
    store.add_event(1, activations.EVENT, "kept", data={**meta, "runs": [1, 2], "file":
                                                        "logs/hostile.npz"})
    store.close()
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=(200, 50)) as pilot:
        await app.ready()
        app.query_one("#tabs").active = "tab-model"
        # drawn for the tab's width once its layout is done (a busy machine can show a
        # first drawing at the width before it, wrapped narrow)
        await _until(pilot, lambda: "[bold red]conv\\x1b[31m: 10 channel(s) of 24x24"
                     in _picture(app), 30, lambda: _picture(app)[:3000])


def test_fashion_mnists_classes_are_named_and_a_sessions_names_are_text():
    """Fashion-MNIST's classes are clothes: the words, the table and the PNG's ticks name
    them beside their number; names kept in a session are shown as text."""
    from tui_trainer.ui.widgets.pictures import probability_table
    meta = json.loads((FIXTURES / "activations-grokking.json").read_text())
    names = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
             "Sneaker", "Bag", "Ankle \x1b[31mboot"]
    fashion = {**meta, "dataset": "fashion-mnist", "classes": names}
    text = "\n".join(activations.lines(fashion))
    assert "labelled 6 Shirt." in text and "predicts 6 Shirt with 14.2%" in text
    assert "0 T-shirt/top" in text and "9 Ankle \\x1b[31…" in text and "\x1b" not in text
    table = probability_table(fashion).plain
    assert "1 Trouser" in table and "\x1b" not in table
    plain = "\n".join(activations.lines(meta))          # MNIST: the digits alone
    assert "labelled 6." in plain and "T-shirt" not in plain


def test_of_many_classes_the_likeliest_and_the_label_are_listed():
    """A net of 47 classes (EMNIST balanced, a folder of the user's): the words and the
    table list ten of them, the likeliest in either run and the label, in order, and say
    so; the PNG's bars are the same ten."""
    from tui_trainer.ui.widgets.pictures import probability_table
    meta = json.loads((FIXTURES / "activations-grokking.json").read_text())
    probs = [[0.001] * 47 for _ in meta["runs"]]
    for c, p in ((40, 0.5), (3, 0.2), (12, 0.05)):
        probs[0][c] = p
    probs[1][30] = 0.9
    many = {**meta, "dataset": "emnist", "probs": probs, "predicted": [40, 30], "label": 46}
    assert activations.readable(many)
    at = activations.listed(many)
    assert len(at) == 10 and at == sorted(at) and {3, 12, 30, 40, 46} <= set(at)
    text = "\n".join(activations.lines(many))
    assert "(the 10 likeliest of 47 classes, the label among them)" in text
    assert "Image 7 of the emnist evaluation set" in text and "labelled 46." in text
    rows = [line for line in text.splitlines() if line.split(" ")[0].isdigit()]
    assert [int(line.split()[0]) for line in rows] == at
    assert "10 likeliest of 47 classes" in probability_table(many).plain
