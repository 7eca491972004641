"""A study is session data: its spec and what it kept may come from another tool or
version, or be edited by hand. Every field the tool reads is checked before it is read on:
a bad one is refused in one line naming the field and what it may be, before anything
trains, and what is shown of it is shown as text."""

from __future__ import annotations

import pytest

from conftest import price_arms, tt
from tui_trainer.core.errors import BadInput
from tui_trainer.core.session.store import SessionStore


def test_a_stored_study_with_a_hostile_spec_is_refused_in_one_line_naming_the_field(tmp_path):
    """A study's spec is session data (edited, another tool's or version's): a field that
    the table or the runner reads and that is not what it may be is refused in one line
    naming the field and what it may be, before anything trains, and the study is left as
    it was; the dashboard shows it as damaged (tests/test_ui_hostile.py). Before, such a
    study ended "training failed: TypeError ..." or trained with jobs = 1e300, and the
    dashboard's reader raised on it."""
    from tui_trainer.core.analysis import study
    from tui_trainer.core.settings import config
    base = config.from_dict({**config.DEFAULTS.to_dict(), "dataset": "mnist-sample",
                             "device": "cpu", "train_samples": 640, "eval_samples": 200})
    ab = study.prepare(base, [("batch_size", [32])], 20, repeats=2, name="s")
    sweep = study.prepare(base, [], 20, repeats=2, name="s")
    record = {"id": 7, "kind": "ab", "variants": ab.runs}
    assert study.stored_problem({**record, "spec": ab.spec}) is None
    assert study.stored_problem({**record, "kind": "sweep", "variants": sweep.runs,
                                 "spec": {**sweep.spec, "decide": 0.005}}) is None
    assert study.stored_problem({**record, "spec": {**ab.spec, "reruns": [{"round": 1}],
                                                    "layout": ab.spec["layout"] + [[1, 1]]},
                                 "variants": ab.runs + ab.runs[-1:]}) is None   # trained again
    bad = {"steps": ["x", 0, None, 2.5], "repeats": [True, 0, 10**6], "jobs": [-1, 1e300, "2"],
           "layout": [[[0, 0]] * 4, [[0, 0], [1, 0], [1, 1], [2, 1]], "x", [[0, 0]]],
           "level": [None, 1.0, "x"], "decide": [-1, "x", 0.9], "gpus": [None, [1]],
           "quiet_wait_s": [None, -1], "until_sure": [0, [1]], "max_rounds": [0, "x"],
           "max_time_s": [0, "x"], "vary": [[["amp"]], "x"], "notes": [None, [1]],
           "file": [1], "reruns": [None], "waits": [{"a": 1}], "rerun_loaded": [None, -1]}
    for name, values in bad.items():
        for value in values:
            problem = study.stored_problem({**record, "spec": {**ab.spec, name: value}})
            assert problem is not None and problem.startswith(f"study 7: its {name} is "), \
                (name, value, problem)
    assert study.stored_problem({**record, "spec": ["junk"]}) == \
        "study 7: its spec is ['junk']; a study's spec is a mapping"
    # a run's config that is not a mapping, in any kind of study (a price's too)
    for kind in ("ab", "price"):
        junk = [{**ab.runs[0], "config": "junk"}] + ab.runs[1:]
        assert study.stored_problem({**record, "kind": kind, "spec": ab.spec,
                                     "variants": junk}) == \
            "study 7: the config of its run 'base' is 'junk'; a run's config is a mapping " \
            "of its settings"
    # through the command, as a session edited by hand gives it
    with SessionStore(tmp_path) as store:
        ids = [store.create_study(p.kind, "s", {**p.spec, name: value}, p.runs)
               for p, name, value in ((ab, "jobs", 1e300), (ab, "level", "x"),
                                      (sweep, "layout", "x"), (sweep, "notes", 5))]
    for sid, name, command in zip(ids, ("jobs", "level", "layout", "notes"),
                                  ("ab", "ab", "sweep", "sweep")):
        r = tt(command, "--session", str(tmp_path), "--study", str(sid))
        lines = [line for line in r.err.splitlines() if line.strip()]
        assert r.rc == 2 and len(lines) == 1 and f"study {sid}: its {name} is " in lines[0] \
            and "a study's " in lines[0], r.err
    with SessionStore(tmp_path, create=False) as store:
        assert all(store.study(sid)["status"] == "created" for sid in ids)
        assert store.runs() == []


def test_a_price_study_read_from_a_hostile_session_is_shown_as_text():
    """What a price study kept is session data: words with markup and control characters
    come out escaped, a figure that is not a number is left out, nothing raises."""
    from tui_trainer import pricing
    kept = {"done": True, "words": "[bold]x\x1b[2J", "seconds": "oops", "ratio": 1,
            "low": None, "high": 2, "startup_text": "\x07bell", "loaded_pairs": 3,
            "pairs": 8, "steps_a_window": 9}
    lines = pricing.stored_lines("amp=bf16", kept)
    assert not any(c in "".join(lines) for c in "\x1b\x07"), lines
    assert "[bold]x\\x1b[2J" in lines[0] and " in " not in lines[0].split(",")[1]
    assert pricing.interval_text(kept) == "-" and pricing.stored_lines("x", "junk") == \
        ["x: not priced"]
    # nothing kept yet: measured now, or waiting while the study runs, never priced once
    # it has ended
    assert pricing.stored_lines("x", {}, "running") == ["x: waiting its turn"]
    assert pricing.stored_lines("x", {}, "running", True, 8) == \
        ["x: its first pairs are being measured (the first look at 8 pairs)"]
    assert pricing.stored_lines("x", None, "stopped") == \
        ["x: not priced: the study stopped before its turn"]
    variants = [{"label": "base"}, {"label": "a"}, {"label": "b"}]
    assert pricing.pricing_now(variants, {"a": {"done": True}, "b": "junk"}, "running") == "b"
    assert pricing.pricing_now(variants, {"a": {"pairs": 8}}, "running") == "a"
    assert pricing.pricing_now(variants, ["junk"], "running") == "a"
    assert pricing.pricing_now(variants, {}, "stopped") is None
    bare = pricing.stored_lines("x", {"done": True, "words": {"a": 1}, "steps_a_window": "9",
                                      "startup_text": None})
    assert bare == ["x: no verdict kept, samples/s of the variant over the base"], bare


def test_a_price_study_with_a_hostile_spec_is_refused_in_one_line(tmp_path):
    """A price study's margin, cap and kept prices come from its session: one that is not a
    margin, a cap or a mapping of prices (edited, another tool's) is refused in one line naming it, before any arm starts,
    and the study is left as it was."""
    from tui_trainer import pricing
    from tui_trainer.core.settings import config
    arms = pricing.plan(config.from_dict({"dataset": "mnist-sample"}), [("amp", ["bf16"])])
    bad = [({"decide": "y"}, "its decide is 'y'"), ({"decide": True}, "its decide is True"),
           ({"cap": "x"}, "its cap is 'x'"), ({"cap": 1e300}, "its cap is 1e+300"),
           ({"cap": 7}, "its cap is 7"), ({"prices": ["x"]}, "its prices are ['x']"),
           ({"prices": {"amp=bf16": "x"}}, "its prices are {'amp=bf16': 'x'}")]
    with SessionStore(tmp_path) as store:
        ids = [store.create_study("price", f"s{i}", {"windows": True, "decide": 0.05,
                                                     "cap": None, **spec}, arms)
               for i, (spec, _) in enumerate(bad)]
    for sid, (_, said) in zip(ids, bad):
        r = tt("ab", "--session", str(tmp_path), "--study", str(sid))
        lines = [line for line in r.err.splitlines() if line.strip()]
        assert r.rc == 2 and len(lines) == 1 and f"study {sid}: {said};" in lines[0], r.err
        assert not price_arms()
    with SessionStore(tmp_path, create=False) as store:
        assert all(store.study(sid)["status"] == "created" for sid in ids)
    assert pricing.spec_figures(1, {"decide": 0.1, "cap": 12.0}) == (0.1, 12)
    assert pricing.spec_figures(1, {"decide": None}) == (0.05, None)
    with pytest.raises(BadInput, match=r"^study 1: its spec is 'junk'; a price study's spec "
                       "is a mapping$"):
        pricing.spec_figures(1, "junk")
