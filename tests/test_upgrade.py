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
           "2-before-fill-uninitialized": "fill_uninitialized = true, image_size = 0"}


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
    db.commit()
    db.close()
    before = tree_digest(s)
    r = tt("resume", "1", "--session", str(s), "--set", "max_steps=16")
    assert r.rc == 2, r.err
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "newer tui-trainer" in lines[0] \
        and "label_smoothing" in lines[0], r.err
    assert tree_digest(s) == before
