"""The figures shown for a run (core.analysis.figures), the plot data (core.analysis.plotdata),
the run table's rows and the Compare and Divergence texts: pure functions, checked without any
process."""

from __future__ import annotations

import math
import statistics

import pytest

from tui_trainer.core.analysis import figures
from tui_trainer.core.analysis.divergence import divergence
from tui_trainer.core.analysis.plotdata import PlotOptions, plot_lines
from tui_trainer.core.session.reader import RunRow, RunSeries
from tui_trainer.core.analysis.verdicts import divergence_text
from tui_trainer.ui.panels.compare import settings_rows, summary_rows
from tui_trainer.ui.panels.runs import matches, progress_text, sort_key


def steps(rates, losses=None, cuda=None):
    losses = losses or [1.0] * len(rates)
    return [{"step": i + 1, "elapsed": float(i + 1), "loss": loss, "samples_per_s": r,
             "rss_bytes": 100.0 * (i + 1), "cuda_peak": cuda, "data_s": 0.5,
             "grad_norm": 2.0}
            for i, (r, loss) in enumerate(zip(rates, losses, strict=True))]


def test_samples_per_s_is_the_median_interval_with_the_first_left_out():
    rates = [10.0, 1000.0, 3000.0, 2000.0, 50.0]     # start-up, then an evaluation's dip
    f = figures.figures(steps(rates))
    assert f.samples_per_s == statistics.median(rates[1:]) == 1500.0
    assert figures.figures(steps([10.0])).samples_per_s is None     # only start-up: no figure
    # Fed one row at a time (the dashboard), it agrees with the whole series at every point.
    g = figures.Figures()
    for i, row in enumerate(steps(rates)):
        g.add_step(row)
        expect = statistics.median(rates[1:i + 1]) if i else None
        assert g.samples_per_s == expect


def test_peak_memory_is_the_gpu_peak_where_recorded_else_rss():
    assert figures.figures(steps([1.0, 2.0])).peak_memory == (200.0, "RSS")
    assert figures.figures(steps([1.0, 2.0], cuda=5e8)).peak_memory == (5e8, "GPU")
    assert figures.Figures().peak_memory == (None, None)


def test_the_memory_plot_shows_the_gpus_memory_first_where_recorded():
    """One definition for the dashboard's memory plot and the exported figure: on CUDA the
    allocator's peak (bold) and its cache's reserved peak, then the host's RSS and the
    state's tensors (faint); on the CPU the RSS peak (bold; a row without a high-water mark
    reads its RSS then)."""
    cpu = [{"step": 1, "peak_rss": 2**30, "rss_bytes": 2**29, "tensor_bytes": 2**20},
           {"step": 2, "peak_rss": None, "rss_bytes": 2**29, "tensor_bytes": 2**20}]
    assert figures.memory_lines(cpu) == [("RSS peak", [1024.0, 512.0], False),
                                         ("state tensors", [1.0, 1.0], True)]
    cuda = [{**r, "cuda_peak": 3 * 2**20, "cuda_reserved": 4 * 2**20} for r in cpu]
    assert [(w, ys[0], faint) for w, ys, faint in figures.memory_lines(cuda)] == [
        ("GPU peak", 3.0, False), ("GPU reserved", 4.0, True), ("RSS peak", 1024.0, True),
        ("state tensors", 1.0, True)]
    lines = plot_lines({7: RunSeries(steps=cuda)}, [7], {}, PlotOptions(width=100))
    assert [ln.label for ln in lines["plot-memory"]] == [
        "7 GPU peak", "7 GPU reserved", "7 RSS peak", "7 state tensors"]


def test_train_loss_is_smoothed_and_a_diverged_loss_shows_as_nan():
    f = figures.figures(steps([1.0] * 3, losses=[3.0, 1.0, 2.0]))
    assert f.train_loss == pytest.approx(figures.smooth([3.0, 1.0, 2.0])[-1])
    assert f.last_loss == 2.0 and f.train_loss != f.last_loss
    diverged = figures.figures(steps([1.0] * 3, losses=[1.0, 2.0, math.nan]))
    assert math.isnan(diverged.train_loss)
    # NaN does not poison the smoothing of what came before it
    assert figures.smooth([1.0, math.nan, 1.0]) == [1.0, 1.0, 1.0]


def test_eval_figures_come_from_the_last_evaluation():
    f = figures.figures([], [{"step": 5, "loss": 0.5, "accuracy": 0.5},
                       {"step": 9, "loss": 0.25, "accuracy": 0.9}])
    assert (f.eval_loss, f.accuracy, f.eval_step) == (0.25, 0.9, 9)    # one unit: a fraction
    assert figures.fmt(f.accuracy, "accuracy") == "90.00"                    # shown in percent


@pytest.mark.parametrize("a, b, since, expect", [
    ({0: "x", 5: "y"}, {0: "x", 5: "y"}, -1, (True, None, None)),
    ({0: "x", 5: "y", 9: "z"}, {0: "x", 5: "q", 9: "z"}, -1, (False, 5, 0)),
    ({0: "x", 5: "y"}, {0: "o", 5: "y"}, -1, (False, 0, None)),
    ({0: "x", 5: "y"}, {0: "o", 5: "y"}, 0, (True, None, None)),   # only after step 0
    ({0: "x"}, {3: "x"}, -1, (None, None, None)),
])
def test_identity_compares_hashes_at_common_steps(a, b, since, expect):
    same = figures.identity(a, b, since)
    assert (same.identical, same.first_difference, same.last_identical) == expect


def test_progress_takes_whichever_limit_comes_first_and_estimates_the_time_left():
    assert figures.progress({"epochs": 4, "max_steps": 0}, 10, 1.0, 30.0) == (0.25, 90.0)
    assert figures.progress({"epochs": 10, "max_steps": 100}, 50, 1.0, 10.0) == (0.5, 10.0)
    assert figures.progress({"epochs": 1}, 0, 0.0, None) == (0.0, None)
    assert figures.progress({"epochs": 1}, 9, 1.0, 5.0) == (1.0, 0.0)
    assert figures.duration(3725) == "1:02:05" and figures.duration(None) == "-"


def test_plot_lines_reduce_smooth_window_and_axes():
    rows = steps([float(i) for i in range(1, 1001)], losses=[1.0 / i for i in range(1, 1001)])
    s = RunSeries(steps=rows, evals=[{"step": 500, "loss": 0.1, "accuracy": 0.5}])
    cfg = {1: {"batch_size": 64, "grad_accum_steps": 2}}
    lines = plot_lines({1: s}, [1], cfg, PlotOptions(width=50))
    raw, smoothed = lines["plot-loss"]
    assert raw.faint and not smoothed.faint and raw.label == "1 raw"
    assert len(raw.xs) <= 100                        # about the panel's width
    assert max(raw.ys) == 1.0                        # the spike at step 1 survives reduction
    assert lines["plot-accuracy"][0].ys == [50.0]
    last = plot_lines({1: s}, [1], cfg, PlotOptions(last=100, smoothing=0.0))
    assert min(last["plot-loss"][0].xs) == 901 and len(last["plot-loss"]) == 1
    samples = plot_lines({1: s}, [1], cfg, PlotOptions(x="samples"))
    assert samples["plot-loss"][0].xs[0] == 128      # step x batch x accumulation
    log = plot_lines({1: s}, [1], cfg, PlotOptions(log_y=True, smoothing=0.0))
    assert log["plot-loss"][0].ys[0] == 0.0          # log10(1)


def _row(**kw):
    base = dict(id=1, name="a", status="finished", step=10, epoch=1.0, config={"seed": 1},
                settings={"num_threads": 2}, twin_of=None, created=0.0, reason=None,
                train_loss=0.5, eval_loss=0.4, accuracy=0.9, samples_per_s=1000.0,
                peak_memory_mib=100.0, memory_kind="RSS", elapsed=10.0, progress=1.0,
                eta_s=None)
    return RunRow(**{**base, **kw})


def test_run_table_rows_filter_sort_and_progress():
    a = _row(tags=("fast",), notes="try amp")
    b = _row(id=2, name="b", samples_per_s=None, config={"seed": 2}, status="running",
             progress=0.5, eta_s=65.0)
    assert matches(a, "fast") and matches(a, "AMP") and not matches(b, "fast")
    assert matches(b, "seed=2") and not matches(a, "seed=2 fast")
    assert sorted([b, a], key=lambda r: sort_key(r, "sps")) == [a, b]   # none sorts last
    assert progress_text(b) == "████░░░░  50% 1:05 left"
    assert progress_text(a).startswith("████████ 100%")


def test_compare_rows_give_ratios_to_the_first_run_and_flag_relevant_settings():
    a, b, c = _row(), _row(id=2, samples_per_s=2000.0, settings={"num_threads": 1}), \
        _row(id=3, samples_per_s=500.0, config={"seed": 1, "lr": 0.1})
    rows = {r[0]: r for r in summary_rows([a, b, c])}
    assert rows["samples/s (training)"] == ["samples/s (training)", "1,000", "2,000", "500",
                                            "2.00x", "0.50x"]
    settings = settings_rows([a, b, c])
    assert ["lr", "None", "None", "0.1"] in settings
    assert ["⚠ num_threads (effective)", "2", "1", "2"] in settings


def test_divergence_text_says_where_runs_part_and_what_can_explain_it():
    fa = [{"step": s, "sha256": "x", "sketch": None} for s in (0, 5, 10)]
    fb = [{"step": 0, "sha256": "x", "sketch": None}, {"step": 5, "sha256": "x",
                                                       "sketch": None},
          {"step": 10, "sha256": "y", "sketch": None}]
    la = [{"step": s, "loss": 1.0} for s in (5, 10)]
    lb = [{"step": 5, "loss": 1.0}, {"step": 10, "loss": 1.5}]
    d = divergence(la, lb, fa, fb)
    runs = [{"config": {"seed": 1}, "settings": {"num_threads": 2}},
            {"config": {"seed": 1}, "settings": {"num_threads": 1}}]
    text = "".join(t for t, _ in divergence_text("A, B", d, [], (1, 2), False, runs))
    assert "identical at step 5, different at step 10" in text
    assert "largest |Δloss| 0.5 at step 10" in text and "num_threads differs" in text
    check = {"kind": "repro_verdict", "data": {"runs": [1, 2], "mode": "repeat",
                                               "identical": False}}
    pieces = divergence_text("A, B", d, [check], (1, 2), False, runs)
    assert ("NOT identical", True) in pieces


def test_phase_time_per_step_leaves_out_the_start_up_interval():
    """ms per step by phase: the rows' seconds summed and divided by the steps they cover,
    the first row (start-up) left out; none for rows from before phases were recorded."""
    rows = [{"step": 10 * (i + 1), "loss": 1.0, "samples_per_s": 100.0,
             **{f"{k}_s": (5.0 if i == 0 else 0.01 * (n + 1)) for n, k in
                enumerate(figures.PHASES)}} for i in range(3)]
    f = figures.figures(rows)
    assert f.phase_steps == 20
    assert f.phase_ms == pytest.approx({k: 1000 * 2 * 0.01 * (n + 1) / 20
                                        for n, k in enumerate(figures.PHASES)})
    assert figures.figures([{k: v for k, v in r.items() if k != "record_s"}
                            for r in rows]).phase_ms is None
    restored = figures.Figures.restore(f.state())
    assert restored.phase_ms == f.phase_ms


def test_phases_and_samples_per_s_come_from_one_window_and_tell_one_story():
    """Each phase's ms/step is the median over the intervals samples/s takes its median
    of: one slow interval (an evaluation, a pause) moves neither, and a run whose steps take
    half the time reads twice the samples/s and half the ms/step (issue 55: Compare read
    samples/s 1.42x beside forward 0.51x, means beside a median)."""
    def run(step_s: float) -> list[dict]:
        rows = []
        for i in range(7):
            s = 8.0 if i == 0 else 40 * step_s if i == 3 else 10 * step_s   # start-up; a pause
            rows.append({"step": 10 * (i + 1), "loss": 1.0, "samples_per_s": 640 / s,
                         **{f"{k}_s": s / len(figures.PHASES) for k in figures.PHASES}})
        return rows
    a, b = figures.figures(run(0.02)), figures.figures(run(0.01))
    speed = b.samples_per_s / a.samples_per_s
    assert speed == pytest.approx(2.0)
    for k in figures.PHASES:
        assert b.phase_ms[k] / a.phase_ms[k] == pytest.approx(1 / speed)
        assert a.phase_ms[k] == pytest.approx(1000 * 0.02 / len(figures.PHASES))
    assert figures.Figures.restore(a.state()).phase_ms == pytest.approx(a.phase_ms)
    # a summary written before the medians has the sums alone: their mean is read
    old = {k: v for k, v in a.state().items() if k != "phase_ms"}
    assert figures.Figures.restore(old).phase_ms["data"] == pytest.approx(
        1000 * (5 * 0.2 + 0.8) / 60 / len(figures.PHASES))


def test_the_last_intervals_split_is_its_own_rows_phases_and_reads_as_shares():
    rows = [{"step": s, "loss": 1.0, "samples_per_s": 100.0,
             **{f"{k}_s": v for k, v in zip(figures.PHASES, phases)}}
            for s, phases in ((10, (9, 0, 0, 0, 0, 0)),              # start-up: left out
                              (20, (0.06, 0.0, 0.47, 0.44, 0.03, 0.0)),
                              (25, (0.02, 0.0, 0.04, 0.03, 0.01, 0.0)))]
    f = figures.figures(rows[:2])
    assert f.last_phase_ms == pytest.approx({"data": 6, "copy": 0, "forward": 47,
                                             "backward": 44, "optimizer": 3, "record": 0})
    assert figures.split_text(f.last_phase_ms) == "100.0 ms: data 6% fwd 47% bwd 44% opt 3%"
    f.add_step(rows[2])                                          # 5 steps this time
    assert f.last_phase_ms["forward"] == pytest.approx(8.0)
    assert figures.split_text(f.last_phase_ms).startswith("20.0 ms: data 20% fwd 40%")
    assert figures.Figures.restore(f.state()).last_phase_ms == f.last_phase_ms
    assert figures.figures(rows[:1]).last_phase_ms is None       # start-up alone: no split
    assert figures.split_text(None) == "-"
    # a summary is untrusted: a split with a phase missing, not a number or negative is none
    for bad in ({"data": 1.0}, {k: "1" for k in figures.PHASES},
                {k: -1.0 for k in figures.PHASES}, [1, 2]):
        assert figures.Figures.restore({**f.state(), "last_phase_ms": bad}).last_phase_ms \
            is None


def test_not_learning_is_a_stretch_of_steps_at_chance_or_of_zero_gradients():
    chance = math.log(10)
    f = figures.Figures()
    for step in range(2, 51, 2):
        f.add_step({"step": step, "loss": chance, "grad_norm": 0.0})
    assert f.not_learning is None                         # 48 steps: not yet
    f.add_step({"step": 52, "loss": chance, "grad_norm": 0.0})
    assert f.not_learning == ("zero_grad", 50)
    # a gradient again ends the stretch of zeros; the loss is still at chance
    f.add_step({"step": 54, "loss": chance, "grad_norm": 0.5})
    assert f.not_learning == ("chance", 52)
    # a finished run's summary keeps it
    assert figures.Figures.restore(f.state()).not_learning == ("chance", 52)
    text = figures.not_learning_text(f, {"init": "kaiming", "lr": 0.03, "optimizer": "sgd"})
    assert text.startswith("not learning: its loss has stayed at chance (2.30, ln 10 = 2.30")
    assert "init = kaiming with this seed" in text and "lr = 0.03 with sgd" in text
    # a loss that leaves chance ends it (the smoothed loss follows within a few points)
    for step in range(56, 80, 2):
        f.add_step({"step": step, "loss": 1.0, "grad_norm": 0.5})
    assert f.not_learning is None and figures.not_learning_text(f, {}) is None


def test_a_run_that_does_not_learn_says_so_with_what_usually_causes_it(tmp_path):
    """device=cpu: lr 1e-6 leaves the net where it started, at chance, for its 60 steps;
    `repro` (its verdict beside), `runs`, its JSON and the run table say "not learning", why
    and what usually causes it; the same run at lr 0.03 learns and says nothing of it."""
    import json
    from conftest import QUICK, sets, tt
    from tui_trainer.core.session.reader import SessionReader
    from tui_trainer.core.session.store import SessionStore
    from tui_trainer.ui.panels.runs import cells
    slow = sets(*QUICK, "device=cpu", "max_steps=60", "epochs=20")
    r = tt("repro", "--session", str(tmp_path), "--json", *slow, "--set", "lr=0.000001")
    assert r.rc == 0, r.err                                 # identical, and not learning
    said = json.loads(r.out)["not_learning"]
    assert set(said) == {"1", "2"} and said["1"].startswith("not learning: its loss"), said
    r = tt("run", "--session", str(tmp_path), *slow, "--set", "lr=0.03")
    assert r.rc == 0, r.err
    stuck, _, fine = tt("runs", "--session", str(tmp_path), "--json").json
    assert fine["not_learning"] is None
    why = stuck["not_learning"]
    assert why.startswith("not learning: its loss has stayed at chance (2.3"), why
    assert "lr = 1e-06 with sgd" in why and "eval accuracy" in why
    assert f"run 1 finished, {why}" in tt("runs", "--session", str(tmp_path)).out
    reader = SessionReader(SessionStore(tmp_path, create=False, readonly=True))
    reader.tick()
    row = cells(reader.rows[1], False, "finished")
    assert row["status"].plain == "finished, not learning"
    assert row["reason"].plain.rstrip("…") == why[:79]
    assert cells(reader.rows[3], False, "finished")["status"].plain == "finished"
    assert matches(reader.rows[1], "not learning") and not matches(reader.rows[3],
                                                                    "not learning")
