"""What a real training process records at each log point about where a step's time goes
and what memory it holds."""

from __future__ import annotations

from conftest import QUICK, db_rows, on_cuda, sets, tt
from tui_trainer.core.analysis import figures
from tui_trainer.core.analysis.figures import PHASES
from tui_trainer.core.session.reader import SessionReader
from tui_trainer.core.session.store import SessionStore
from tui_trainer.ui.panels.runs import cells


def test_a_log_point_records_its_intervals_phases_and_the_memory_held(tmp_path):
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

    # memory: the interval's high-water mark is at least the resident set read with it; the
    # training state's tensors are the parameters and SGD's momentum (gradients are freed
    # by zero_grad before the log point), 4 bytes each; the peak-memory figure is the
    # largest high-water mark: the process's (RSS) on the CPU, the allocator's on CUDA,
    # where the allocator's peak holds at least the training state and its cache at least
    # what is allocated
    store = SessionStore(tmp_path, create=False, readonly=True)
    params = store.run(1)["settings"]["parameters"]
    mem = db_rows(tmp_path, "SELECT rss_bytes, peak_rss, tensor_bytes, cuda_alloc, "
                            "cuda_reserved, cuda_peak FROM steps")
    assert all(peak >= rss > 0 and tensors == 8 * params for rss, peak, tensors, *_ in mem)
    f = figures.run_figures(store, 1)
    if on_cuda(tmp_path, 1):
        assert all(reserved >= cpeak >= tensors and alloc >= tensors
                   for _, _, tensors, alloc, reserved, cpeak in mem), mem
        assert f["memory_kind"] == "GPU"
        assert f["peak_memory_mib"] == max(row[5] for row in mem) / 2**20
    else:
        assert all(row[3:] == (None, None, None) for row in mem)
        assert f["memory_kind"] == "RSS"
        assert f["peak_memory_mib"] == max(peak for _, peak, *_ in mem) / 2**20

    # the run table's "step time (last log)": the last row's phases over the 10 steps it
    # covers, read through the dashboard's reader (from the finished run's summary)
    row = SessionReader(store).tick().runs[0]
    last = dict(row.last_phase_ms)
    assert last == {k: 1000 * v / 10 for k, v in zip(PHASES, rows[-1][3:])}
    text = cells(row, False, row.status)["split"].plain
    assert text.startswith(f"{sum(last.values()):.1f} ms: ") and " fwd " in text
