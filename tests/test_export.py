"""Exports: CSVs hold every stored point; PNGs open as images of the stated size."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from PIL import Image

from conftest import QUICK, db_rows, sets, tt
from tui_trainer.core.session.export import FIG_DPI, FIG_SIZE_IN


def test_export_two_runs_writes_complete_csvs_and_figures(tmp_path):
    for seed in (1, 2):
        r = tt("run", "--session", str(tmp_path), *sets(*QUICK, "epochs=3", "log_every=1",
                                                          f"seed={seed}"))
        assert r.rc == 0, r.err
    r = tt("export", "1", "2", "--session", str(tmp_path), "--json")
    assert r.rc == 0, r.err
    files = [Path(p) for p in json.loads(r.out)["files"]]
    assert all(f.parent == tmp_path / "exports" and f.is_file() for f in files)
    for run_id in (1, 2):
        for table in ("steps", "evals", "fingerprints"):
            path = tmp_path / "exports" / f"run-{run_id}-{table}.csv"
            with open(path, newline="") as f:
                rows = list(csv.DictReader(f))
            stored = db_rows(tmp_path, f"SELECT step FROM {table} WHERE run_id = ? "
                                       "ORDER BY step", (run_id,))
            assert [int(row["step"]) for row in rows] == [s for (s,) in stored]
        assert len(stored) > 0
    steps = db_rows(tmp_path, "SELECT count(*) FROM steps WHERE run_id = 1")[0][0]
    assert steps == 30                                   # log_every=1: no downsampling
    pngs = sorted(f.name for f in files if f.suffix == ".png")
    assert pngs == ["runs-1-2-divergence.png", "runs-1-2-loss.png", "runs-1-2-memory.png",
                    "runs-1-2-throughput.png"]
    assert not any(f.suffix == ".txt" for f in files)       # not explained yet: no words
    # once explained, the words and what they rest on go with the pair's exports
    explained = tt("explain", "1", "2", "--session", str(tmp_path))
    assert explained.rc == 3, explained.err
    r = tt("export", "1", "2", "--session", str(tmp_path), "--json")
    text = (tmp_path / "exports" / "runs-1-2-explanation.txt").read_text()
    assert str(tmp_path / "exports" / "runs-1-2-explanation.txt") in json.loads(r.out)["files"]
    assert text.startswith(explained.out.strip() + "\n\nWhat it rests on:\n- ")
    assert "- config seed: A 1, B 2\n" in text
    for name in pngs:
        with Image.open(tmp_path / "exports" / name) as img:
            assert img.format == "PNG"
            assert img.size == (int(FIG_SIZE_IN[0] * FIG_DPI), int(FIG_SIZE_IN[1] * FIG_DPI))


def test_export_of_an_unknown_run_writes_nothing(tmp_path):
    assert tt("run", "--session", str(tmp_path), *sets(*QUICK, "max_steps=2")).rc == 0
    r = tt("export", "1", "7", "--session", str(tmp_path))
    assert r.rc == 2 and "no run 7" in r.err
    assert not (tmp_path / "exports").exists()
