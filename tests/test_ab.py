"""A/B studies: `tui-trainer ab`, its table, the ready studies and their exports."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import pytest
from PIL import Image

from conftest import QUICK, db_rows, fingerprints, sets, tt
from tui_trainer.core.export import FIG_DPI, FIG_SIZE_IN

STUDIES = sorted((Path(__file__).parent.parent / "experiments" / "ab").glob("*.toml"))
FIGURES = ("samples_per_s", "data_wait_s", "peak_memory_mib", "train_loss", "eval_loss",
           "accuracy")


def _identical(session: Path, a: int, b: int) -> bool:
    fa, fb = fingerprints(session, a), fingerprints(session, b)
    common = fa.keys() & fb.keys()
    assert common
    return all(fa[s] == fb[s] for s in common)


def test_ab_table_holds_every_variant_with_figures_and_exports(tmp_path):
    r = tt("ab", "--session", str(tmp_path), "--json", *sets(*QUICK),
           "--vary", "deterministic=off", "--vary", "batch_size=32,64",
           "--vary", "amp=fp16", "--steps", "6")
    assert r.rc == 0, r.err
    study = json.loads(r.out)
    rows = {row["label"]: row for row in study["rows"]}
    # batch_size=64 is the base's own value: it is the base row, not a run of its own.
    assert list(rows) == ["base", "deterministic=off", "batch_size=32", "amp=fp16"]
    assert any("batch_size=64" in n for n in study["notes"])
    base = rows["base"]
    trained = [row for row in study["rows"] if row["run_id"] is not None]
    cuda = rows["amp=fp16"]["run_id"] is not None
    assert len(trained) == (4 if cuda else 3)
    if not cuda:       # fp16 needs CUDA: on a CPU the study says so and goes on
        assert rows["amp=fp16"]["status"] == "skipped" and "amp" in rows["amp=fp16"]["note"]
    for row in trained:
        assert row["status"] == "finished" and row["steps"] == 6
        assert row["samples_per_s"] > 0 and row["data_wait_s"] >= 0
        assert row["peak_memory_mib"] > 0 and math.isfinite(row["train_loss"])
        assert 0 <= row["accuracy"] <= 100
        for key in FIGURES:
            if base[key]:
                assert row["ratios"][key] == pytest.approx(row[key] / base[key])
        # bit-identical to the base or not, as the stored hashes say
        assert row["bit_identical"] == _identical(tmp_path, base["run_id"], row["run_id"])
        # The figures as core.figures defines them, checked against the stored rows: the
        # median interval rate with the first left out; the eval loss of the last evaluation;
        # the smoothed training loss lies within the logged losses.
        stored = db_rows(tmp_path, "SELECT loss, samples_per_s FROM steps WHERE run_id = ? "
                         "ORDER BY step", (row["run_id"],))
        assert row["samples_per_s"] == pytest.approx(
            statistics.median(rate for _, rate in stored[1:]))
        losses = [loss for loss, _ in stored]
        assert min(losses) <= row["train_loss"] <= max(losses)
        evals = db_rows(tmp_path, "SELECT loss FROM evals WHERE run_id = ? ORDER BY step",
                        (row["run_id"],))
        assert row["eval_loss"] == evals[-1][0]
    assert rows["batch_size=32"]["bit_identical"] is False   # another data order
    assert all(base["ratios"][k] == 1 for k in FIGURES)

    # every run of the study is a run of the session, named after its variant
    names = [n for (n,) in db_rows(tmp_path, "SELECT name FROM runs ORDER BY id")]
    assert names[:3] == ["ab1-base", "ab1-deterministic=off", "ab1-batch_size=32"]

    # export: the table, every point of every run, and figures of the stated size
    r = tt("export", "--study", str(study["study_id"]), "--session", str(tmp_path), "--json")
    assert r.rc == 0, r.err
    files = [Path(p) for p in json.loads(r.out)["files"]]
    assert all(f.parent == tmp_path / "exports" and f.is_file() for f in files)
    with open(tmp_path / "exports" / "study-1-table.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [row["variant"] for row in table] == list(rows)
    assert float(table[1]["samples_per_s_ratio"]) == \
        pytest.approx(rows["deterministic=off"]["ratios"]["samples_per_s"])
    for row in trained:
        with open(tmp_path / "exports" / f"run-{row['run_id']}-steps.csv", newline="") as f:
            assert len(list(csv.DictReader(f))) == db_rows(
                tmp_path, "SELECT count(*) FROM steps WHERE run_id = ?", (row["run_id"],))[0][0]
    pngs = sorted(f.name for f in files if f.suffix == ".png")
    assert pngs == [f"study-1-{n}.png" for n in
                    ("divergence", "loss", "memory", "ratios", "throughput")]
    for name in pngs:
        with Image.open(tmp_path / "exports" / name) as img:
            assert img.format == "PNG"
            assert img.size == (int(FIG_SIZE_IN[0] * FIG_DPI), int(FIG_SIZE_IN[1] * FIG_DPI))


def test_ab_prints_a_table_with_ratios(tmp_path):
    r = tt("ab", "--session", str(tmp_path), *sets(*QUICK), "--vary", "seed=2",
           "--steps", "3")
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    header = next(line for line in lines if line.startswith("variant"))
    for heading in ("samples/s", "data wait s", "peak mem MiB", "train loss", "eval loss",
                    "accuracy %", "bit-identical to base"):
        assert heading in header
    base = next(line for line in lines if line.startswith("base "))
    variant = next(line for line in lines if line.startswith("seed=2 "))
    assert "(base)" in base and "x)" not in base
    assert variant.count("x)") == 6 and variant.endswith("no, from step 0")


@pytest.mark.parametrize("args, key", [
    (["--vary", "batch_size"], "--vary"),
    (["--vary", "batch_size=0"], "batch_size"),
    (["--vary", "amp=fp8"], "amp"),
    (["--vary", "epochs=1,2"], "--vary"),
    (["--vary", "colour=red"], "colour"),
    (["--vary", "persistent_workers=on"], "persistent_workers"),
    (["--vary", "seed=1"], "--vary"),
    ([], "--vary"),
    (["--vary", "seed=2", "--steps", "0"], "--steps"),
])
def test_bad_ab_input_exits_2_before_training(tmp_path, args, key):
    r = tt("ab", "--session", str(tmp_path), *args)
    assert r.rc == 2
    assert key in r.err and r.err.count("\n") == 1
    assert not (tmp_path / "session.sqlite").exists()


def test_a_bad_study_file_names_the_field(tmp_path):
    bad = tmp_path / "study.toml"
    bad.write_text('seed = 1\n[ab]\nvary = "amp=bf16"\n')
    r = tt("ab", "--session", str(tmp_path / "s"), "--config", str(bad))
    assert r.rc == 2 and "ab.vary" in r.err


@pytest.mark.parametrize("study", STUDIES, ids=[s.stem for s in STUDIES])
def test_ready_studies_run_as_they_are(tmp_path, study):
    r = tt("ab", "--session", str(tmp_path), "--config", str(study), "--json",
           "--steps", "2", "--set", "eval_samples=200")
    assert r.rc == 0, r.err
    rows = json.loads(r.out)["rows"]
    assert len(rows) >= 3
    assert all(row["status"] in ("finished", "skipped") for row in rows)
    # The base config of a study file also runs as a plain run (its [ab] table is skipped).
    r = tt("config", "--config", str(study), "--plain")
    assert r.rc == 0, r.err



def test_a_stopped_study_stops_its_run_cleanly_and_continues(tmp_path):
    import signal
    import time

    from conftest import tt_popen, wait_for_row
    proc = tt_popen("ab", "--session", str(tmp_path), *sets(*QUICK), "--vary", "seed=2",
                    "--steps", "200", "--json")
    wait_for_row(tmp_path, "SELECT 1 FROM runs WHERE id = 1 AND step >= 10")
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["status"] == "stopped"
    assert db_rows(tmp_path, "SELECT status FROM studies") == [("stopped",)]
    # the run in progress stopped with a checkpoint; the variant never started
    assert db_rows(tmp_path, "SELECT id, status FROM runs") == [(1, "stopped")]
    assert db_rows(tmp_path, "SELECT count(*) FROM checkpoints WHERE run_id = 1")[0][0] >= 1
    r = tt("ab", "--study", "1", "--session", str(tmp_path), "--json")
    assert r.rc == 0, r.err
    study = json.loads(r.out)
    assert study["status"] == "finished"
    assert [(row["label"], row["status"], row["steps"]) for row in study["rows"]] == \
        [("base", "finished", 200), ("seed=2", "finished", 200)]
