"""Sessions written by earlier versions of this tree (tests/fixtures/sessions, made with the
old code by their make.sh), opened by this one: resumed to the bits of a run that never
stopped, explained, exported; told once what was assumed; a newer version's refused.
Every claim is about the CPU (device=cpu: the sessions trained there)."""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from conftest import fingerprints, tt

FIXTURES = Path(__file__).parent / "fixtures" / "sessions"
KEPT = sorted(p.name for p in FIXTURES.iterdir() if (p / "session.sqlite").is_file())
# What each kept session's runs lack, assumed as the version that wrote them ran them.
ASSUMED = {"1-before-kept-figures": "fill_uninitialized = true, image_size = 0",
           "2-before-fill-uninitialized": "fill_uninitialized = true, image_size = 0",
           "3-version-0.2.0": 'malloc = "system"'}


def copy(name: str, tmp_path: Path) -> Path:
    dest = tmp_path / name
    shutil.copytree(FIXTURES / name, dest)
    return dest


def same_machine(name: str) -> bool:
    """Whether this machine computes as the one that made the session did: its CPU, the
    instruction set torch dispatches to, and torch's version (another kind of CPU sums in
    another order: other bits from the same state)."""
    import torch
    made = json.loads((FIXTURES / name / "MANIFEST.json").read_text())
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                  if line.startswith("model name")), "?")
    return (made["cpu_model"], made["cpu_capability"], made["torch"]) == \
        (model, torch.backends.cpu.get_cpu_capability(), torch.__version__)


def tree_digest(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def test_the_kept_sessions_are_there():
    """At least three: from before the kept figures, from just before fill_uninitialized,
    and one of this version (a new one whenever a session's or a checkpoint's shape
    changes: tests/fixtures/sessions/README.md)."""
    assert len(KEPT) >= 3, KEPT
    assert set(ASSUMED) <= set(KEPT)
    versions = [json.loads((FIXTURES / n / "MANIFEST.json").read_text())["version"]
                for n in KEPT]
    from tui_trainer import __version__
    assert __version__ in versions          # one written by this version


@pytest.mark.parametrize("name", KEPT)
def test_an_earlier_versions_run_resumes_to_the_bits_of_one_that_never_stopped(tmp_path,
                                                                                name):
    """device=cpu. Run 1 stopped at step 8; resumed here to step 16 it must hold, at every
    fingerprint, the bits of run 2, which the old version trained to 16 without stopping
    (where this machine computes as the one that made it); elsewhere, the same bits as
    the same run resumed twice (12, then 16): the old checkpoint continues exactly."""
    s = copy(name, tmp_path)
    r = tt("resume", "1", "--session", str(s), "--set", "max_steps=16")
    assert r.rc == 0, r.err
    assert "parameters sha256" in r.out
    if name in ASSUMED:
        assert ASSUMED[name] in r.err, r.err        # what was assumed, said
    resumed = fingerprints(s, 1)
    assert max(resumed) == 16
    if same_machine(name):
        straight = fingerprints(s, 2)
        assert {k: resumed[k] for k in straight} == straight
        return
    twice = copy(name, tmp_path / "twice")
    for steps in (12, 16):
        r = tt("resume", "1", "--session", str(twice), "--set", f"max_steps={steps}")
        assert r.rc == 0, r.err
    assert fingerprints(twice, 1) == resumed


def test_an_earlier_session_is_explained_compared_and_exported_with_what_was_assumed(
        tmp_path):
    """device=cpu. The old runs read with the values their version ran (no `None` against
    a newer run's value), and told once: the second open says nothing."""
    s = copy("2-before-fill-uninitialized", tmp_path)
    first = tt("runs", "--session", str(s))
    assert first.rc == 0, first.err
    assert ASSUMED["2-before-fill-uninitialized"] in first.err
    again = tt("runs", "--session", str(s))
    assert again.rc == 0 and "assumed" not in again.err and "earlier" not in again.err, \
        again.err
    events = sqlite3.connect(s / "session.sqlite").execute(
        "SELECT message FROM events WHERE kind = 'upgrade'").fetchall()
    assert len(events) == 1 and "fill_uninitialized = true" in events[0][0]
    # a run of this version beside them: compared on what each ran
    r = tt("run", "--session", str(s), "--config", str(FIXTURES / "fixture.toml"),
           "--set", "max_steps=8")
    assert r.rc == 0, r.err
    r = tt("explain", "1", "3", "--session", str(s), "--json")
    assert r.rc in (0, 3), r.err
    settings = json.loads(r.out)["settings"]
    assert not [d for d in settings if d["key"] in ("fill_uninitialized",
                                                    "fill_uninitialized_memory",
                                                    "image_size")], settings
    assert not [d for d in settings if d["a"] is None and d["b"] is not None
                and d["of"] == "config"], settings
    out = tmp_path / "export"
    r = tt("export", "1", "2", "3", "--session", str(s), "--out", str(out))
    assert r.rc == 0, r.err
    rows = {row["run_id"]: row for row in csv.DictReader(open(out / "runs-1-2-3-summary.csv"))}
    assert sorted(rows) == ["1", "2", "3"] and rows["1"]["steps"] == "8", rows


def test_a_session_of_a_newer_version_is_refused_and_left_as_it_was(tmp_path):
    """A newer schema: refused when opened, in one line. A run whose config has a knob
    this version does not know (a newer version trained it): its resume refused by name.
    Neither changes a byte."""
    s = copy(KEPT[-1], tmp_path)
    db = sqlite3.connect(s / "session.sqlite")
    db.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    db.commit()
    db.close()
    before = tree_digest(s)
    r = tt("runs", "--session", str(s))
    assert r.rc != 0
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "newer tui-trainer" in lines[0], r.err
    assert tree_digest(s) == before

    s = copy(KEPT[-1], tmp_path / "knob")
    db = sqlite3.connect(s / "session.sqlite")
    (text,) = db.execute("SELECT config FROM runs WHERE id = 1").fetchone()
    db.execute("UPDATE runs SET config = ? WHERE id = 1",
               (json.dumps({**json.loads(text), "label_smoothing": 0.1}),))
    (knobs,) = db.execute("SELECT value FROM meta WHERE key = 'knobs'").fetchone()
    from tui_trainer.core.settings import config   # that version knows all of this one's
    db.execute("UPDATE meta SET value = ? WHERE key = 'knobs'",     # as that version
               (",".join(sorted({*knobs.split(","), *config.FIELDS, "label_smoothing"})),))
    db.commit()
    db.close()
    before = tree_digest(s)
    r = tt("resume", "1", "--session", str(s), "--set", "max_steps=16")
    assert r.rc == 2, r.err
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "newer tui-trainer" in lines[0] \
        and "label_smoothing" in lines[0], r.err
    assert tree_digest(s) == before


ROOT = Path(__file__).parent.parent
# What docs/architecture.md's "to add a knob" says, and nothing more: its declaration in
# RunConfig, and its use in the one engine place (what a step computes: engine/step.py).
KNOB = '''    label_smoothing: float = knob(
        0.0, "Cross-entropy label smoothing: each label's target spread over the other "
        "classes by this much.", "optimisation", lo=0, hi=1, hi_open=True, bits=True)
'''
STEP_BEFORE = "        return loss(forward(x), y, logits=is_file_model(cfg.model))\n"
STEP_AFTER = '''        out = forward(x)
        if cfg.label_smoothing:         # (log-probabilities: log_softmax leaves them as they are)
            return F.cross_entropy(out, y, label_smoothing=cfg.label_smoothing)
        return loss(out, y, logits=is_file_model(cfg.model))
'''
SEEN_BY_THE_FORM = '''
import asyncio, sys
from tui_trainer.ui.app import TrainerApp
from tui_trainer.ui.widgets.config_form import ConfigForm
from tui_trainer.core.settings import config, recorded
from tui_trainer.core.analysis import verdicts
from tui_trainer.core.session.store import SessionStore

async def main():
    app = TrainerApp(sys.argv[1], poll=False)
    async with app.run_test(size=(200, 50)) as pilot:
        await app.ready()
        await pilot.pause(1.0)
        form = app.query_one(ConfigForm)
        form.focus_knob("label_smoothing")
        await pilot.pause(0.5)
        assert app.focused is form.query_one("#field-label_smoothing"), app.focused
        assert config.doc("label_smoothing") in str(app.query_one("#knob-help").render())
        await pilot.press("end", "backspace", "backspace", "backspace", "2")
        for _ in range(50):
            await pilot.pause(0.1)
            if "label_smoothing" in form.problems:
                break
        assert "label_smoothing" in form.problems, form.problems
    with SessionStore(sys.argv[1], create=False, readonly=True) as store:
        runs = [store.run(2), store.run(3)]       # (run 1's resume stored its config whole)
    assert runs[0]["assumed"]["label_smoothing"] == 0.0, runs[0]["assumed"]
    reasons = verdicts.explain(runs)
    assert any(r.startswith("label_smoothing differs between the runs: 0.0, 0.1")
               for r in reasons), reasons
    print("form and verdict saw it")

asyncio.run(main())
'''


def test_a_knob_declared_once_is_seen_by_the_form_config_set_the_verdict_explain_and_resume(
        tmp_path):
    """device=cpu. label_smoothing added to a copy of the tree by its declaration and one
    engine line: `config` documents it, `--set` takes and refuses it, the form shows and
    checks it, the verdict and explain name it when runs differ in it, and a run saved
    before it existed resumes (read with label_smoothing = 0.0, said) to its old bits."""
    import os
    import subprocess
    import sys
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "tui_trainer", tree / "tui_trainer",
                    ignore=shutil.ignore_patterns("__pycache__"))
    cfg_py = tree / "tui_trainer" / "core" / "settings" / "config.py"
    text = cfg_py.read_text()
    anchor = "    grad_accum_steps: int = knob("
    cfg_py.write_text(text.replace(anchor, KNOB + anchor, 1))
    step_py = tree / "tui_trainer" / "engine" / "step.py"
    assert STEP_BEFORE in step_py.read_text()
    step_py.write_text(step_py.read_text().replace(STEP_BEFORE, STEP_AFTER, 1))
    env = {**os.environ, "PYTHONPATH": str(tree)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tui_trainer", *args], cwd=tree, env=env,
                              capture_output=True, text=True, timeout=300)

    r = run("config", "label_smoothing")
    assert r.returncode == 0 and r.stdout.startswith("label_smoothing = 0.0"), r
    assert "Cross-entropy label smoothing" in r.stdout
    r = run("run", "--session", str(tmp_path / "bad"), "--set", "label_smoothing=2")
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "label_smoothing" in lines[0] \
        and "< 1" in lines[0], r.stderr
    assert not (tmp_path / "bad" / "session.sqlite").exists() or not \
        sqlite3.connect(tmp_path / "bad" / "session.sqlite").execute(
            "SELECT count(*) FROM runs").fetchone()[0]
    # a session saved by this version before the knob: resumed to its old bits
    name = KEPT[-1]
    s = copy(name, tmp_path)
    r = run("resume", "1", "--session", str(s), "--set", "max_steps=16")
    assert r.returncode == 0, r.stderr
    assert "label_smoothing = 0.0" in r.stderr, r.stderr
    if same_machine(name):
        straight = fingerprints(s, 2)
        assert {k: v for k, v in fingerprints(s, 1).items() if k in straight} == straight
    # a run with it on: explain names the difference, the verdict too, and the form has it
    r = run("run", "--session", str(s), "--config", str(FIXTURES / "fixture.toml"),
            "--set", "max_steps=8", "--set", "label_smoothing=0.1")
    assert r.returncode == 0, r.stderr
    r = run("explain", "1", "3", "--session", str(s), "--json")
    assert r.returncode == 3, r.stderr
    differ = [d for d in json.loads(r.stdout)["settings"] if d["key"] == "label_smoothing"]
    assert differ == [{"key": "label_smoothing", "a": 0.0, "b": 0.1, "of": "config"}], differ
    p = subprocess.run([sys.executable, "-c", SEEN_BY_THE_FORM, str(s)], cwd=tree, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "form and verdict saw it" in p.stdout, p.stderr[-3000:]
