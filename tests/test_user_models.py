"""A net of the user's own file (issue 59, points 1-4 and 6): it trains, its twins are
identical, it resumes bit-exact after SIGKILL, explain names a line of that file; its code
runs only once this user trusted its content (naming it yourself does), never because a
session names it, and never from another content than the run trained with. device=cpu:
these are claims about the lab's machinery on a net of the user's, run on the CPU."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from conftest import QUICK, db_rows, sets, tt

NET = '''import torch
from torch import nn


class Net(nn.Module):
    """As a user would write it: two convolutions and a linear layer, logits out."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.conv2 = nn.Conv2d(6, 12, 5)
        self.fc = nn.Linear(12 * 4 * 4, 10)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


def small():
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10))
'''
# a forward that adds a little noise drawn from the OS: two runs part, and explain must name
# the line below (the op that makes the noise) in this file
NOISY = NET.replace("        return self.fc(torch.flatten(x, 1))",
                    "        noise = torch.tensor(float(os.urandom(1)[0]) * 1e-6)\n"
                    "        return self.fc(torch.flatten(x, 1)) + noise")
NOISY = "import os\n" + NOISY
RUN = [*QUICK, "device=cpu", "max_steps=12", "checkpoint_every=4"]


def _file(tmp_path: Path, text: str, name: str = "net.py") -> Path:
    path = tmp_path / "models" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_net_of_your_own_file_trains_with_its_code_kept_and_is_reproducible(tmp_path):
    """Named on the command line it is trusted and trains; the run records its path, hash
    and a copy of its source; twins are bit-identical, and a twin killed by SIGKILL and
    resumed is bit-identical to one trained straight through."""
    net = _file(tmp_path, NET)
    s = tmp_path / "s"
    r = tt("run", "--session", str(s), "--json", *sets(*RUN, f"model={net}:Net"))
    assert r.rc == 0, r.err
    assert json.loads(r.out)["status"] == "finished"
    settings = json.loads(db_rows(s, "SELECT fingerprint FROM runs")[0][0])
    import hashlib
    assert settings["model_file"] == str(net)
    assert settings["model_sha256"] == hashlib.sha256(net.read_bytes()).hexdigest()
    (data,) = db_rows(s, "SELECT data FROM events WHERE kind = 'model_source'")[0]
    assert json.loads(data)["source"] == NET
    r = tt("repro", "--session", str(tmp_path / "twins"), "--json",
           *sets(*RUN, f"model={net}:small"))
    assert r.rc == 0, r.err
    assert json.loads(r.out)["identical"] is True
    r = tt("repro", "--session", str(tmp_path / "resumed"), "--json", "--resume-at", "6",
           *sets(*RUN, f"model={net}:Net"))
    assert r.rc == 0, r.err
    v = json.loads(r.out)
    assert v["mode"] == "resume" and v["identical"] is True


def test_explain_names_the_line_of_your_file_where_two_runs_part(tmp_path):
    net = _file(tmp_path, NOISY, "noisy.py")
    s = tmp_path / "s"
    for _ in range(2):
        assert tt("run", "--session", str(s), *sets(*RUN, f"model={net}:Net")).rc == 0
    r = tt("explain", "1", "2", "--session", str(s), "--json")
    assert r.rc in (0, 3), r.err
    found = json.loads(r.out)
    op = (found.get("hunt") or {}).get("op") or found.get("op") or {}
    line = NOISY.splitlines().index(
        "        noise = torch.tensor(float(os.urandom(1)[0]) * 1e-6)") + 1
    # the line that draws the noise, or the one that adds it into the step's computation
    assert any(f"noisy.py:{n} " in (op.get("source") or "") for n in (line, line + 1)), found


def test_code_named_by_a_session_never_runs_until_you_trust_it(tmp_path, monkeypatch):
    """A session from someone else: its runs' file leaves a mark when imported, and this
    user has not trusted it. Listing, export, explain of identical runs, the dashboard's
    open read it and import nothing; Continue, a twin and a copy of a run refuse in one line
    naming `tui-trainer trust`; nothing of the file runs until this user trusts it."""
    mark = tmp_path / "ran"
    evil = _file(tmp_path, f"open({str(mark)!r}, 'a').write('x')\n" + NET, "evil.py")
    s = tmp_path / "s"
    for _ in range(2):          # on its author's machine, who named it
        assert tt("run", "--session", str(s), *sets(*RUN, f"model={evil}:Net")).rc == 0
    # and a study of it, planned there (not trained: `ab --plan` stores nothing, so plan it
    # into the session as the A/B tab does)
    from tui_trainer.core.analysis import study
    from tui_trainer.core.settings import config
    from tui_trainer.core.session.store import SessionStore
    base = config.load(overrides=[*RUN, f"model={evil}:Net"])
    planned = study.prepare(base, study.parse_vary(["lr=0.5"]), 6, repeats=1, name="s")
    with SessionStore(s) as store:
        store.create_study(planned.kind, "s", planned.spec, planned.runs)
    mark.unlink()
    monkeypatch.setenv("TUI_TRAINER_HOME", str(tmp_path / "another-user"))   # trusts nothing
    assert tt("runs", "--session", str(s)).rc == 0
    assert tt("export", "--session", str(s), "1", "2").rc == 0
    assert tt("explain", "1", "2", "--session", str(s)).rc == 0   # identical: no replay

    said: list[str] = []

    async def dashboard() -> None:
        """Its keys on run 1 (a twin, the verdict, the resume check, continue, the memory
        breakdown) refuse in one line each, before a run or a process is made."""
        from tui_trainer.ui.app import TrainerApp
        app = TrainerApp(s, poll=True)
        notify = app.notify
        app.notify = lambda message, **kw: (said.append(str(message)), notify(message, **kw))
        async with app.run_test(size=(120, 40)) as pilot:
            await app.ready()
            await app.poll_now()
            app.cursor_run = 1
            for keys in (["f5"], ["f7"], ["f8", "enter"], ["f4", "enter"], ["b"]):
                if keys == ["b"]:                       # the Plots tab's memory breakdown
                    app.query_one("#tabs").active = "tab-plots"
                    await pilot.pause()
                start = len(said)
                await pilot.press(*keys)
                for _ in range(400):
                    if any("not trusted" in m for m in said[start:]):
                        break
                    await pilot.pause(0.05)
                assert any("is not trusted on this machine" in m and "tui-trainer trust" in m
                           for m in said[start:]), (keys, said[start:])
            from tui_trainer.ui.panels.runs import RunTable
            assert app.query_one(RunTable).awaiting_twin is None    # no verdict is awaited
    import asyncio
    asyncio.run(dashboard())
    assert db_rows(s, "SELECT count(*) FROM runs") == [(2,)]        # no twin was made
    refusals = [tt("resume", "1", "--session", str(s), "--set", "max_steps=16"),
                tt("repro", "--session", str(s), "--run", "1", "--json"),
                tt("memory", "1", "--session", str(s)),
                tt("ab", "--session", str(s), "--study", "1")]
    for r in refusals:
        assert r.rc == 2, (r.rc, r.err)
        assert "is not trusted on this machine" in r.err and "tui-trainer trust" in r.err
        assert "Traceback" not in r.err
    assert not mark.exists()
    # trusted by this user, the same file runs
    assert tt("trust", str(evil)).rc == 0
    assert tt("resume", "1", "--session", str(s), "--set", "max_steps=16").rc == 0
    assert mark.exists()


def test_a_file_a_session_names_is_not_read_until_its_content_is_trusted(tmp_path,
                                                                         monkeypatch):
    """A session's record names a file outside it: where this user does not trust the
    content the run recorded, the refusal comes from the record alone, the file unread
    (a path that is no file, or a file of other content, is refused the same way, naming
    the recorded hash); once trusted, the file is read and checked."""
    net = _file(tmp_path, NET)
    s = tmp_path / "s"
    assert tt("run", "--session", str(s), *sets(*RUN, f"model={net}:Net")).rc == 0
    (recorded,) = db_rows(s, "SELECT fingerprint FROM runs")[0]
    sha = json.loads(recorded)["model_sha256"]
    monkeypatch.setenv("TUI_TRAINER_HOME", str(tmp_path / "another-user"))
    for elsewhere in (tmp_path / "no" / "such.py", tmp_path, net):
        conn = sqlite3.connect(s / "session.sqlite")
        conn.execute("UPDATE runs SET fingerprint = ?", (json.dumps(
            {**json.loads(recorded), "model_file": str(elsewhere)}),))
        conn.commit()
        conn.close()
        r = tt("resume", "1", "--session", str(s), "--set", "max_steps=16")
        assert r.rc == 2 and f"(sha256 {sha[:16]}) is not trusted" in r.err, r.err
        assert "is not a file" not in r.err
    assert tt("trust", str(net)).rc == 0
    assert tt("resume", "1", "--session", str(s), "--set", "max_steps=16").rc == 0


def test_a_changed_file_is_refused_for_resume_naming_both_hashes(tmp_path):
    net = _file(tmp_path, NET)
    s = tmp_path / "s"
    assert tt("run", "--session", str(s), *sets(*RUN, f"model={net}:Net")).rc == 0
    import hashlib
    before = hashlib.sha256(net.read_bytes()).hexdigest()
    net.write_text(NET + "\n# an edit\n")
    after = hashlib.sha256(net.read_bytes()).hexdigest()
    assert tt("trust", str(net)).rc == 0           # trusted: the change is what refuses
    r = tt("resume", "1", "--session", str(s), "--set", "max_steps=16")
    assert r.rc == 2 and before[:16] in r.err and after[:16] in r.err, r.err
    assert "is not the code run 1 trained with" in r.err


def test_a_twin_trains_the_file_its_run_trained_or_none_is_made(tmp_path, monkeypatch):
    """A run named its net by a relative path; from another folder that path names another
    file (here one with the same name and other code): its twin (the verdict's, F5's) is
    refused in one line naming both files before a twin is created, and made from the
    folder the run ran in."""
    first, other = tmp_path / "a", tmp_path / "b"
    net = _file(first, NET)
    _file(other, NET.replace("12 * 4 * 4, 10", "12 * 4 * 4, 10, bias=False"))
    s = tmp_path / "s"
    monkeypatch.chdir(first)
    assert tt("run", "--session", str(s), *sets(*RUN, "model=models/net.py:Net")).rc == 0
    monkeypatch.chdir(other)
    assert tt("trust", "models/net.py").rc == 0
    r = tt("repro", "--session", str(s), "--run", "1", "--json")
    assert r.rc == 2 and str(other / "models" / "net.py") in r.err and str(net) in r.err, r.err
    assert "the file run 1 trained with" in r.err
    assert db_rows(s, "SELECT count(*) FROM runs") == [(1,)]
    monkeypatch.chdir(first)
    r = tt("repro", "--session", str(s), "--run", "1", "--json")
    assert r.rc == 0 and json.loads(r.out)["identical"] is True, r.err


@pytest.mark.parametrize("text, name, said", [
    (None, "Net", "is not a file"),
    ("this is not python(", "Net", "is not Python"),
    ("raise RuntimeError('no GPU for me')\n", "Net", "raised RuntimeError: no GPU for me"),
    ("import torch\nNet = 3\n", "Net", "is not an nn.Module subclass or a function"),
    ("from torch import nn\nclass Net(nn.Module):\n    def forward(self, x):\n"
     "        return x.flatten(1)[:, :7]\n", "Net", "must return one score per class"),
    (NET, "Missing", "defines no Missing")])
def test_a_bad_model_file_is_one_line_naming_the_field_and_nothing_is_stored(
        tmp_path, text, name, said):
    path = tmp_path / "models" / "bad.py"
    if text is not None:
        _file(tmp_path, text, "bad.py")
    s = tmp_path / "s"
    r = tt("run", "--session", str(s), *sets(*RUN, f"model={path}:{name}"))
    assert r.rc == 2, (r.rc, r.err)
    assert r.err.startswith("tui-trainer: model: ") and said in r.err, r.err
    assert "Traceback" not in r.err and r.err.count("\n") == 1
    assert not (s / "session.sqlite").exists() or db_rows(s, "SELECT id FROM runs") == []


async def test_the_dashboard_asks_before_a_file_runs_and_never_imports_it(tmp_path):
    """The form takes FILE.py:Name; the first Start asks, naming the file and its hash; the
    run trains it in its own process, and the dashboard never imported it."""
    import hashlib
    import sys

    from textual.widgets import Label

    from test_ui import until
    from tui_trainer.core.settings import config, user_models
    from tui_trainer.core.session.store import SessionStore
    from tui_trainer.ui.app import TrainerApp
    from tui_trainer.ui.panels.launch import LaunchPanel
    from tui_trainer.ui.screens import ConfirmScreen
    net = _file(tmp_path, NET)
    sha = hashlib.sha256(net.read_bytes()).hexdigest()
    s = tmp_path / "s"
    values = {k: config.parse_value(k, v) for k, v in (p.split("=") for p in RUN)}
    app = TrainerApp(s, poll=True)
    async with app.run_test(size=(200, 50)) as pilot:
        await app.ready()
        launch = app.query_one(LaunchPanel)
        launch.form.set_config({**values, "model": f"{net}:Net", "max_steps": 4})
        await pilot.pause()
        assert launch.form.problems == {}
        launch.action_start()
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), timeout=60)
        asked = str(app.screen.query_one(Label).render())
        assert str(net) in asked and sha[:16] in asked
        await pilot.click("#confirm-yes")

        def finished() -> bool:
            with SessionStore(s, create=False, readonly=True) as store:
                runs = store.runs()
            return bool(runs) and runs[0]["status"] == "finished"
        await until(pilot, finished, timeout=120)
    assert user_models.is_trusted(sha)
    assert not [m for m in sys.modules if m.startswith("tui_trainer_model_")]


async def test_the_dashboard_refuses_a_net_that_cannot_take_the_images_and_stores_nothing(
        tmp_path):
    """A net of 3-channel images started on 1-channel digits from the dashboard, and a
    built-in net on a folder of 2 classes (issue 68, point 4): as `run` does, nothing is
    stored (no run, no log), the line `run` says is said, and the field it names shows it
    until its value changes. device=cpu: the refusal is the model's first forward, here on
    the CPU."""
    from PIL import Image
    from test_ui import notifications, until
    from tui_trainer.core.settings import config
    from tui_trainer.ui.app import TrainerApp
    from tui_trainer.ui.panels.launch import LaunchPanel
    net = _file(tmp_path, "from torch import nn\n\n\ndef rgb():\n    return nn.Sequential("
                "nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(10))\n", "rgb.py")
    s = tmp_path / "s"
    values = {k: config.parse_value(k, v) for k, v in (p.split("=") for p in RUN)}
    cli = tt("run", "--session", str(tmp_path / "cli"), *sets(*RUN, f"model={net}:rgb"))
    assert cli.rc == 2 and cli.err.startswith("tui-trainer: model: "), cli.err
    app = TrainerApp(s, poll=True)
    said = notifications(app)
    async with app.run_test(size=(200, 50)) as pilot:
        await app.ready()
        launch = app.query_one(LaunchPanel)
        launch.form.set_config({**values, "model": f"{net}:rgb"})
        await pilot.pause()
        launch.action_start()           # (no question: naming it to `run` trusted it)
        await until(pilot, lambda: any("not started" in m for m in said), timeout=120,
                    seen=lambda: said)
        line = cli.err.strip().removeprefix("tui-trainer: ")
        assert [m for m in said if "not started" in m] == [
            f"not started (run 1 removed, nothing stored): {line}"], said
        await until(pilot, lambda: 1 not in app.runs, timeout=30)
        assert db_rows(s, "SELECT count(*) FROM runs") == [(0,)]
        assert not (s / "logs" / "run-1.log").exists()
        assert not any("crashed" in m for m in said), said
        # at the field, until its value changes; Start is refused meanwhile, as for any field
        assert launch.form.problems["model"] == line.removeprefix("model: ")
        assert app.query_one("#start").disabled
        launch.form.set_config({**values, "model": "fast"})
        launch.form.recheck()
        await pilot.pause()
        assert "model" not in launch.form.problems and not app.query_one("#start").disabled
        # a built-in net on a folder of 2 classes: `run`'s "bad config: model: ..." line
        folder = tmp_path / "pictures"
        for c in ("cat", "dog"):
            (folder / "train" / c).mkdir(parents=True)
            for i in range(4):
                Image.new("L", (28, 28), 40 * i).save(folder / "train" / c / f"{i}.png")
        two = {**values, "model": "grokking", "dataset": f"folder:{folder}"}
        cli = tt("run", "--session", str(tmp_path / "cli"), *sets(*RUN, "model=grokking",
                                                                 f"dataset=folder:{folder}"))
        assert cli.rc == 2 and cli.err.startswith("tui-trainer: bad config: model: ")
        launch.form.set_config(two)
        await pilot.pause()
        said.clear()
        launch.action_start()
        await until(pilot, lambda: any("not started" in m for m in said), timeout=120,
                    seen=lambda: said)
        line = cli.err.strip().removeprefix("tui-trainer: ")
        assert said[-1] == f"not started (run 1 removed, nothing stored): {line}", said
        assert launch.form.problems["model"] == line.removeprefix("bad config: model: ")
        assert db_rows(s, "SELECT count(*) FROM runs") == [(0,)]


def test_what_a_run_of_your_net_shows_activations_memory_and_profile(tmp_path):
    """The Model tab's pictures (its Conv2d layers by their names in your module, or a
    clear word that it has none), memory by module and the profile, on a net of yours."""
    net = _file(tmp_path, NET)
    s = tmp_path / "s"
    for name in ("Net", "small"):
        assert tt("run", "--session", str(s), *sets(*RUN, f"model={net}:{name}")).rc == 0
    r = tt("activations", "1", "--session", str(s), "--no-png", "--json")
    assert r.rc == 0, r.err
    assert [L["name"] for L in json.loads(r.out)["layers"]] == ["conv1", "conv2"]
    r = tt("activations", "2", "--session", str(s), "--no-png")
    assert r.rc == 0 and "this net has no convolutions" in r.out, r.err
    r = tt("memory", "1", "--session", str(s), "--json")
    assert r.rc == 0, r.err
    modules = {m["module"] for m in json.loads(r.out)["modules"]}
    assert {"Net.conv1", "Net.conv2", "Net.fc"} <= modules
    r = tt("profile", "1", "--session", str(s), "--json")
    assert r.rc == 0, r.err
    assert "conv" in r.out


def test_two_runs_of_other_code_in_one_file_are_said_to_differ_in_their_code(tmp_path):
    """The file changed between two runs: explain and the determinism verdict name "model
    code differs" as the cause, with the first lines of the diff, and replay nothing."""
    from tui_trainer.core.analysis.verdicts import verdict
    from tui_trainer.core.session.store import SessionStore
    net = _file(tmp_path, NET)
    s = tmp_path / "s"
    assert tt("run", "--session", str(s), *sets(*RUN, f"model={net}:Net")).rc == 0
    net.write_text(NET.replace("nn.Conv2d(6, 12, 5)", "nn.Conv2d(6, 12, 5, bias=False)"))
    assert tt("run", "--session", str(s), *sets(*RUN, f"model={net}:Net")).rc == 0
    r = tt("explain", "1", "2", "--session", str(s), "--json")
    assert r.rc in (0, 3), r.err
    found = json.loads(r.out)
    assert found["verdict"] == "model_code" and "replay" not in found
    assert "model code differs" in found["model_code"]
    assert "bias=False" in found["model_code"]              # the diff's first lines
    with SessionStore(s, create=False, readonly=True) as store:
        said = " ".join(verdict(store, [1, 2]).explanations)
    assert "model code differs" in said and "bias=False" in said


def test_an_ab_study_prices_knobs_on_your_net(tmp_path):
    """`ab --vary` on a net of your own file: every arm trains it, and the table says each
    one's figures and whether it is bit-identical to the base."""
    net = _file(tmp_path, NET)
    r = tt("ab", "--session", str(tmp_path / "s"), "--json",
           *sets(*RUN, f"model={net}:Net"), "--steps", "6", "--repeats", "1",
           "--vary", "channels_last=true", "--vary", "amp=bf16", "--vary", "init=kaiming")
    assert r.rc == 0, r.err
    rows = json.loads(r.out)["rows"]
    assert [row["label"] for row in rows] == ["base", "channels_last=on", "amp=bf16",
                                              "init=kaiming"]
    assert all(row["done"] == 1 and row["samples_per_s"] for row in rows)
    assert rows[3]["bit_identical"] is False        # other initial weights


def test_activation_checkpointing_recomputes_the_children_of_your_sequential(tmp_path):
    """An nn.Sequential of yours has each child recomputed in backward, and trains the same
    bits as without (device=cpu); any other net is refused naming the field."""
    net = _file(tmp_path, NET)
    hashes = []
    for how in ("off", "full", "selective"):
        r = tt("run", "--session", str(tmp_path / how), "--json",
               *sets(*RUN, f"model={net}:small", f"activation_checkpointing={how}"))
        assert r.rc == 0, r.err
        hashes.append(json.loads(r.out)["param_sha256"])
    assert hashes[0] == hashes[1] == hashes[2]
    r = tt("run", "--session", str(tmp_path / "net"),
           *sets(*RUN, f"model={net}:Net", "activation_checkpointing=full"))
    assert r.rc == 2 and "activation_checkpointing: recomputes each child of an " \
        "nn.Sequential; this net is a Net" in r.err, r.err


def test_a_data_parallel_run_of_your_net_resumes_only_from_its_own_code(tmp_path):
    """nproc = 2: every rank builds the net the run recorded, so a changed file is refused
    for its resume as for one process (naming both hashes), and the same file resumes."""
    import hashlib
    net = _file(tmp_path, NET)
    s = tmp_path / "s"
    r = tt("run", "--session", str(s), *sets(*RUN, f"model={net}:small", "nproc=2",
                                              "max_steps=8"))
    assert r.rc == 0, r.err
    before = hashlib.sha256(net.read_bytes()).hexdigest()
    net.write_text(NET + "\n# an edit\n")
    assert tt("trust", str(net)).rc == 0
    r = tt("resume", "1", "--session", str(s), "--set", "max_steps=12")
    assert r.rc == 2 and before[:16] in r.err and "is not the code run 1" in r.err, r.err
    net.write_text(NET)
    r = tt("resume", "1", "--session", str(s), "--set", "max_steps=12")
    assert r.rc == 0, r.err


def test_paths_in_a_config_file_are_relative_to_its_folder(tmp_path, monkeypatch):
    """A TOML file naming a net (or a folder of images) by a relative path names the one
    beside it, from wherever the command runs: a run config, a study's base and its arms;
    a preset saved from the form keeps naming the files the form named."""
    from tui_trainer.core.analysis import study
    from tui_trainer.core.settings import config
    net = _file(tmp_path, NET)
    cfg = tmp_path / "configs" / "mine.toml"
    cfg.parent.mkdir()
    cfg.write_text('model = "../models/net.py:Net"\ndataset = "folder:../images"\n'
                   '[ab]\nvary = ["model=../models/net.py:small+lr=0.1", "seed=2,3"]\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    values = config.read_toml(cfg)
    assert values["model"] == f"{net}:Net"
    assert values["dataset"] == f"folder:{tmp_path / 'images'}"
    base, ab = study.read_study_file(cfg)
    assert base["model"] == f"{net}:Net"
    assert study.parse_vary(ab["vary"]) == [("model+lr", [{"model": f"{net}:small",
                                                            "lr": 0.1}]), ("seed", [2, 3])]
    # the form's relative path (where the dashboard runs) is written absolute in a preset
    form = config.load(overrides=["model=net.py:Net"])
    assert config.absolute_paths(form).model == f"{elsewhere / 'net.py'}:Net"
    # and a run from elsewhere trains the net the file names
    (tmp_path / "configs" / "run.toml").write_text('model = "../models/net.py:small"\n')
    r = tt("run", "--session", str(tmp_path / "s"), "--json", "--config",
           str(tmp_path / "configs" / "run.toml"), *sets(*RUN, "max_steps=2"))
    assert r.rc == 0, r.err
    settings = json.loads(db_rows(tmp_path / "s", "SELECT fingerprint FROM runs")[0][0])
    assert settings["model_file"] == str(net)


def test_the_shipped_index_add_config_runs_by_name_from_anywhere(tmp_path, monkeypatch):
    """`repro --config gpu-parting-index-add` (issue 58): the shipped net of a file beside
    the preset, found from another folder; on a CPU its index_add_ adds in index order, so
    the two runs are bit-identical (on CUDA its atomic adds may part them: gpu_parting.py)."""
    monkeypatch.chdir(tmp_path)
    r = tt("repro", "--session", str(tmp_path / "s"), "--json", "--config",
           "gpu-parting-index-add", *sets("device=cpu", "max_steps=6", "eval_samples=256"))
    assert r.rc == 0, r.err
    assert json.loads(r.out)["identical"] is True
    settings = json.loads(db_rows(tmp_path / "s", "SELECT fingerprint FROM runs")[0][0])
    assert settings["model_file"].endswith("models/index_add.py")
