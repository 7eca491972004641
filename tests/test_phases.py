"""Where a step's time goes: the phases a real training process records at log points."""

from __future__ import annotations

from conftest import QUICK, db_rows, sets, tt
from tui_trainer.core.figures import PHASES


def test_the_phases_of_a_logged_interval_add_up_to_its_time(tmp_path):
    """Each row's phases (data, copy, forward, backward, optimizer, record) cover the
    interval's wall time: the loop spends nearly nothing outside them."""
    r = tt("run", "--session", str(tmp_path), *sets(*QUICK, "max_steps=30", "log_every=10",
                                                    "train_samples=2000"))
    assert r.rc == 0, r.err
    cols = ", ".join(f"{k}_s" for k in PHASES)
    rows = db_rows(tmp_path, f"SELECT step, samples_per_s, compute_s, {cols} FROM steps "
                             "ORDER BY step")
    assert [row[0] for row in rows] == [10, 20, 30]
    for step, rate, compute, *phases in rows[1:]:
        interval = 10 * 64 / rate
        assert all(p >= 0 for p in phases) and phases[2] > 0 and phases[3] > 0
        assert 0.8 * interval <= sum(phases) <= 1.02 * interval, (step, interval, phases)
        assert abs(compute - sum(phases[1:5])) < 1e-9
