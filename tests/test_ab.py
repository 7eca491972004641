"""A/B studies: `tui-trainer ab`, its table, the ready studies and their exports."""

from __future__ import annotations

import csv
import json
import math
import os
import sqlite3
import statistics
from pathlib import Path

import pytest
from PIL import Image

from tui_trainer.core.analysis.figures import PHASES
from conftest import QUICK, cuda_count, db_rows, fingerprints, sets, tt
from tui_trainer.core.session.export import FIG_DPI, FIG_SIZE_IN
from tui_trainer.core.session.store import SessionStore

STUDIES = sorted((Path(__file__).parent.parent / "experiments" / "ab").glob("*.toml"))
FIGURES = ("samples_per_s", "data_wait_s", "peak_memory_mib", "train_loss", "eval_loss",
           "accuracy")


def _identical(session: Path, a: int, b: int) -> bool:
    fa, fb = fingerprints(session, a), fingerprints(session, b)
    common = fa.keys() & fb.keys()
    assert common
    return all(fa[s] == fb[s] for s in common)


def test_ab_table_holds_every_variant_with_figures_and_exports(tmp_path):
    r = tt("ab", "--session", str(tmp_path), "--json", *sets(*QUICK), "--repeats", "1",
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
        # where the time went: ms per step by phase, and (a variant) each as a ratio
        assert set(row["phase_ms"]) == set(PHASES) and row["phase_ms"]["forward"] > 0
        if row is not base:
            assert row["phase_ratios"]["forward"] == pytest.approx(
                row["phase_ms"]["forward"] / base["phase_ms"]["forward"])
        # The figures as core.analysis.figures defines them, checked against the stored rows:
        # the median interval rate with the first left out; the eval loss of the last
        # evaluation; the smoothed training loss lies within the logged losses.
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
    # the price explain quotes for a setting that fixes an op: this study's ratio, for a run
    # of the base's config whatever its length or seed; none for another config or value
    from tui_trainer.core.analysis.study import price
    store = SessionStore(tmp_path, create=False, readonly=True)
    config = store.run(base["run_id"])["config"]
    quoted = price(store, {**config, "seed": 9, "max_steps": 500}, "deterministic", "off")
    assert quoted is not None and quoted["study"] == study["study_id"]
    assert quoted["ratio"] == pytest.approx(rows["deterministic=off"]["ratios"]["samples_per_s"])
    assert quoted["low"] is None and quoted["rounds"] == 1          # one round: no interval
    assert price(store, {**config, "lr": 0.5}, "deterministic", "off") is None
    assert price(store, config, "deterministic", "warn") is None
    for name in pngs:
        with Image.open(tmp_path / "exports" / name) as img:
            assert img.format == "PNG"
            assert img.size == (int(FIG_SIZE_IN[0] * FIG_DPI), int(FIG_SIZE_IN[1] * FIG_DPI))


def test_ab_prints_a_table_with_ratios(tmp_path):
    r = tt("ab", "--session", str(tmp_path), *sets(*QUICK), "--vary", "seed=2",
           "--steps", "3", "--repeats", "1")
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    header = next(line for line in lines if line.startswith("variant"))
    for heading in ("samples/s", "data wait s", "peak mem MiB", "train loss", "eval loss",
                    "accuracy %", "bit-identical to base"):
        assert heading in header
    base = next(line for line in lines if line.startswith("base "))
    variant = next(line for line in lines if line.startswith("seed=2 "))
    assert "(base)" in base and "x)" not in base
    # the name, the study's own figure (samples/s), bit-identity, the other figures by
    # importance, the run last
    assert variant.count("x)") == 6 and variant.split()[3:7] == ["no,", "from", "step", "0"]
    assert header.split()[:5] == ["variant", "samples/s", "bit-identical", "to", "base"]


@pytest.mark.parametrize("args, key", [
    (["--vary", "batch_size"], "--vary"),
    (["--vary", "batch_size=0"], "batch_size"),
    (["--vary", "amp=fp8"], "amp"),
    (["--vary", "epochs=1,2"], "--vary"),
    (["--vary", "colour=red"], "colour"),
    (["--vary", "persistent_workers=on"], "persistent_workers"),
    (["--vary", "seed=1"], "--vary"),
    (["--vary", "amp=fp16,bf16+channels_last=on"], "--vary"),     # joined: one value each
    (["--vary", "amp=bf16+lr=0"], "lr"),
    ([], "--vary"),
    (["--vary", "seed=2", "--steps", "0"], "--steps"),
    (["--vary", "seed=2"], "--vary"),           # the rounds vary the seed already
    (["--vary", "lr=0.1", "--repeats", "0"], "--repeats"),
    (["--vary", "lr=0.1", "--level", "1.2"], "--level"),
    (["--vary", "lr=0.1", "--jobs", "0"], "--jobs"),
    (["--vary", "lr=0.1", "--repeats", "100000000"], "--repeats"),
    (["--vary", "lr=0.1", "--name", os.fsdecode(b"a\xffb")], "--name"),    # not UTF-8
])
def test_bad_ab_input_exits_2_before_training(tmp_path, args, key):
    r = tt("ab", "--session", str(tmp_path / "s"), *args)
    assert r.rc == 2
    assert key in r.err and r.err.count("\n") == 1
    assert not (tmp_path / "s").exists()


def test_a_sweep_of_too_many_seeds_is_refused(tmp_path):
    r = tt("sweep", "--session", str(tmp_path / "s"), "--seeds", "100000000", timeout=180)
    assert r.rc == 2 and "--seeds: must be at most" in r.err
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("ab, key", [('vary = "amp=bf16"', "ab.vary"),
                                     ('vary = ["lr=0.1"]\nname = 5', "ab.name"),
                                     ('vary = ["lr=0.1"]\nname = ["x"]', "ab.name"),
                                     ('vary = ["lr=0.1"]\nabout = 1.5', "ab.about"),
                                     ('vary = ["lr=0.1"]\nrepeats = 100000000', "ab.repeats")])
def test_a_bad_study_file_names_the_field(tmp_path, ab, key):
    bad = tmp_path / "study.toml"
    bad.write_text(f"seed = 1\n[ab]\n{ab}\n")
    r = tt("ab", "--session", str(tmp_path / "s"), "--config", str(bad), timeout=180)
    assert r.rc == 2 and key in r.err, r.err
    assert not (tmp_path / "s").exists()


def test_the_gpu_study_plans_every_gpu_knob_and_says_what_cannot_run_here(tmp_path):
    """`ab --plan` on the GPU study: every knob of the GPU's, joined where they act
    together, and without CUDA the fp16 arm named as not possible here (the study then
    skips it and trains the rest, as the amp study shows training); nothing is written.
    (Trained on this CPU it takes 30-50 s of the suite, most of it compiling: by hand,
    docs/benchmarks.md.)"""
    r = tt("ab", "--session", str(tmp_path / "s"), "--config", "gpu", "--plan", "--json")
    assert r.rc == 0, r.err
    plan = json.loads(r.out)
    arms = {arm["label"]: arm for arm in plan["arms"]}
    assert list(arms) == [
        "base", "cudnn_benchmark=on", "deterministic=off+cudnn_deterministic=off",
        "pin_memory=on+non_blocking=on", "amp=fp16", "amp=bf16", "channels_last=on",
        "compile=on", "compile=reduce-overhead",
        "float32_matmul_precision=high+cudnn_allow_tf32=on"]
    assert arms["pin_memory=on+non_blocking=on"]["changes"] == {"pin_memory": True,
                                                                "non_blocking": True}
    assert plan["runs"] == 10 * plan["repeats"] and plan["steps"] == 200
    fp16 = arms.pop("amp=fp16")["not_possible"]
    assert (fp16 is None) == (cuda_count() > 0), fp16
    if fp16 is not None:
        assert fp16.startswith("amp: fp16 needs a CUDA device")
    graphs = arms.pop("compile=reduce-overhead")["not_possible"]     # CUDA graphs
    assert (graphs is None) == (cuda_count() > 0), graphs
    if graphs is not None:
        assert graphs.startswith("compile: reduce-overhead captures CUDA graphs, which need "
                                 "a CUDA device; this run's device is cpu")
    assert all(arm["not_possible"] is None for arm in arms.values())
    assert not (tmp_path / "s").exists()
    printed = tt("ab", "--session", str(tmp_path / "s"), "--config", "gpu", "--plan")
    assert printed.rc == 0 and "10 arms x 6 rounds of 200 steps = 60 runs" in printed.out
    assert tt("ab", "--study", "1", "--plan", "--session", str(tmp_path)).rc == 2


def test_the_graphs_study_plans_the_captured_step_against_reduce_overhead(tmp_path):
    """`ab --plan` on the graphs' study: the whole step captured (cuda_graph) and compile's
    graphs, each against the same steps launched op by op; without CUDA both are named as
    not possible here, with it both can run; nothing is written."""
    r = tt("ab", "--session", str(tmp_path / "s"), "--config", "gpu-graphs", "--plan",
           "--json")
    assert r.rc == 0, r.err
    plan = json.loads(r.out)
    arms = {arm["label"]: arm for arm in plan["arms"]}
    assert list(arms) == ["base", "cuda_graph=step", "compile=reduce-overhead"]
    assert arms["cuda_graph=step"]["changes"] == {"cuda_graph": "step"}
    assert arms["base"]["not_possible"] is None
    why = arms["cuda_graph=step"]["not_possible"]
    assert (why is None) == (cuda_count() > 0), why
    if why is not None:
        assert why.startswith("cuda_graph: step captures CUDA graphs, which need a CUDA "
                              "device; this run's device is cpu")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("study", [s for s in STUDIES if not s.stem.startswith("gpu")],
                         ids=[s.stem for s in STUDIES if not s.stem.startswith("gpu")])
def test_ready_studies_run_as_they_are(tmp_path, study):
    # (the small net for every study: each arm's two steps on the examples net at batch
    # 1024 cost the suite seconds and prove nothing more about the file)
    r = tt("ab", "--session", str(tmp_path), "--config", str(study), "--json",
           "--steps", "2", "--set", "eval_samples=200", "--set", "model=grokking",
           "--repeats", "1")
    assert r.rc == 0, r.err
    rows = json.loads(r.out)["rows"]
    assert len(rows) >= 3
    assert all(row["status"] in ("finished", "skipped") for row in rows)
    # The base config of a study file also runs as a plain run (its [ab] table is skipped).
    r = tt("config", "--config", str(study), "--plain")
    assert r.rc == 0, r.err


@pytest.mark.slow
def test_a_stopped_study_stops_its_run_cleanly_and_continues(tmp_path):
    import signal
    import time

    from conftest import tt_popen, wait_for_row
    proc = tt_popen("ab", "--session", str(tmp_path), *sets(*QUICK), "--vary", "seed=2",
                    "--steps", "200", "--json", "--repeats", "1")
    wait_for_row(tmp_path, "SELECT 1 FROM runs WHERE id = 1 AND step >= 10")
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err          # a stopped study, as a stopped run
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


@pytest.mark.slow
def test_a_killed_study_leaves_no_run_training_and_continues_alone(tmp_path):
    """SIGKILL of `ab`: its run in flight (forked by ab's own launcher) stops itself with a
    checkpoint instead of training on as an orphan, and `ab --study 1` then trains each arm
    with nothing of the study beside it."""
    from conftest import tt_popen, wait_for_row
    proc = tt_popen("ab", "--session", str(tmp_path), *sets(*QUICK), "--vary", "seed=2",
                    "--steps", "120", "--json", "--repeats", "1")
    wait_for_row(tmp_path, "SELECT 1 FROM runs WHERE id = 1 AND step >= 10")
    proc.kill()
    proc.communicate(timeout=180)
    # the orphan sees its owner gone and stops
    wait_for_row(tmp_path, "SELECT 1 FROM runs WHERE id = 1 AND status != 'running'")
    assert db_rows(tmp_path, "SELECT status FROM runs WHERE id = 1") == [("stopped",)]
    step = db_rows(tmp_path, "SELECT step FROM runs WHERE id = 1")[0][0]
    assert step < 120
    r = tt("ab", "--study", "1", "--session", str(tmp_path), "--json")
    assert r.rc == 0, r.err
    study = json.loads(r.out)
    assert [(row["label"], row["status"], row["steps"]) for row in study["rows"]] == \
        [("base", "finished", 120), ("seed=2", "finished", 120)]
    assert db_rows(tmp_path, "SELECT step, status FROM runs WHERE id = 1") == \
        [(step, "stopped")]                    # the orphan did not train on beside them


# --- repeats: intervals and verdicts -------------------------------------------------------

def _figures(session: Path, run_ids: list[int]) -> dict[int, dict]:
    """Each run's figures as core.analysis.figures reads them from the stored rows."""
    from tui_trainer.core.analysis.figures import run_figures
    from tui_trainer.core.session.store import SessionStore
    with SessionStore(session, create=False, readonly=True) as store:
        return {r: run_figures(store, r) for r in run_ids}


def test_t_quantiles_and_the_t_interval_match_the_textbook():
    from tui_trainer.core.analysis import stats
    # Student's t table, two-sided 95% (0.975 quantile) and 90%.
    for df, p, t in [(1, 0.975, 12.706), (2, 0.975, 4.303), (4, 0.975, 2.776),
                     (9, 0.975, 2.262), (30, 0.975, 2.042), (4, 0.95, 2.132)]:
        assert stats.t_quantile(p, df) == pytest.approx(t, abs=1e-3)
    # The t interval of the geometric mean of paired ratios (kept to compare), by hand.
    pairs = [(100, 110), (100, 121), (100, 99), (200, 230)]
    logs = [math.log(v / b) for b, v in pairs]
    m, sd = statistics.mean(logs), statistics.stdev(logs)
    half = 3.182446 * sd / 2
    iv = stats.t_interval(pairs)
    assert (iv.ratio, iv.low, iv.high) == pytest.approx(
        (math.exp(m), math.exp(m - half), math.exp(m + half)), rel=1e-5)
    assert iv.method == "t"


def test_the_rank_interval_matches_the_signed_rank_tables():
    from tui_trainer.core.analysis import stats
    # Critical values of the two-sided 5% Wilcoxon signed-rank test (any table): the
    # interval runs from the (T+1)-th smallest to the (T+1)-th largest Walsh average.
    for n, critical in [(6, 0), (8, 3), (10, 8), (15, 25), (20, 52), (30, 137)]:
        k, coverage = stats._rank_cut(n, 0.95)
        assert k == critical + 1 and coverage >= 0.95
    assert [stats.min_pairs(level) for level in (0.8, 0.9, 0.95, 0.99)] == [4, 5, 6, 8]
    assert stats.signed_rank_cdf(3) == pytest.approx([1 / 8, 2 / 8, 3 / 8, 5 / 8, 6 / 8,
                                                      7 / 8, 1.0])
    # The ratio is the median of the Walsh averages of the logs (Hodges-Lehmann), the
    # interval their k-th smallest and largest, computed by hand for 8 rounds.
    ratios = [1.24, 1.12, 1.00, 1.00, 1.30, 1.28, 0.99, 1.01]
    logs = [math.log(r) for r in ratios]
    walsh = sorted((logs[i] + logs[j]) / 2 for i in range(8) for j in range(i, 8))
    iv = stats.ratio_interval([(100, 100 * r) for r in ratios])
    assert iv.ratio == pytest.approx(math.exp(statistics.median(walsh)))
    assert (iv.low, iv.high) == pytest.approx((math.exp(walsh[3]), math.exp(walsh[-4])))
    assert iv.coverage == pytest.approx(1 - 2 * 5 / 256)    # P(W+ <= 3) = 5 / 256
    assert iv.width == iv.high / iv.low - 1
    # One round 30% off moves neither end much: the t interval's mean moves with it.
    quiet = [(100, 110 + d) for d in (0.5, -0.4, 0.3, -0.2, 0.1, 0.0, -0.3)]
    loud = quiet[:-1] + [(100, 110 * 1.3)]
    assert stats.ratio_interval(loud).ratio == pytest.approx(
        stats.ratio_interval(quiet).ratio, rel=0.01)
    assert stats.t_interval(loud).ratio > stats.t_interval(quiet).ratio * 1.03
    clear = stats.ratio_interval([(100, 115 + i) for i in range(6)])
    assert clear.verdict("faster", "slower") == "faster" and clear.low > 1
    assert stats.ratio_interval([(100, 80 + i) for i in range(6)]).verdict(
        "faster", "slower") == "slower"
    # Fewer rounds than a 95% interval needs give no interval and no verdict: the rounds'
    # own ratios instead, and how many rounds a verdict needs.
    two = stats.ratio_interval([(100, 80), (100, 125)])
    assert two.low is None and two.high is None and two.ratios == pytest.approx((0.8, 1.25))
    assert two.verdict("faster", "slower") == "no verdict: 2 rounds, a 95% interval needs " \
        "6 or more"
    assert two.text() == "1.00x; rounds 0.80 1.25"
    five = stats.ratio_interval([(100, 115 + i) for i in range(5)])
    assert five.low is None and "5 rounds" in five.verdict()
    assert stats.ratio_interval([(100, 115 + i) for i in range(5)], 0.9).low is not None
    # Missing and non-finite values are left out; one pair gives no interval.
    one = stats.ratio_interval([(100, 110), (None, 3), (float("nan"), 1)])
    assert one.n == 1 and one.low is None and "no verdict: 1 round," in one.verdict()
    assert stats.ratio_interval([]) is None
    # Many rounds: the normal approximation joins the exact count where they meet.
    assert stats._rank_cut(61, 0.95)[0] == pytest.approx(stats._rank_cut(60, 0.95)[0]
                                                         * 61 * 62 / 60 / 61, rel=0.03)
    assert stats.ratio_interval([(1, 1 + (i % 7) / 100) for i in range(200)]).low > 1
    # More noise needs more rounds for the same effect, never fewer than an interval needs.
    assert stats.pairs_needed(0.001, 1.15) == 6
    assert stats.pairs_needed(0.06, 1.15) < stats.pairs_needed(0.12, 1.15) \
        < stats.pairs_needed(0.12, 1.05)


def heavy_tailed_noise(rng, n: int) -> list[float]:
    """This machine's log-ratio noise as measured (docs/benchmarks.md): most rounds within
    2%, one in five 10 to 30% off because another process took the core in the base's run
    or the variant's (either, with equal chance)."""
    out = []
    for _ in range(n):
        if rng.random() < 0.2:
            out.append(rng.choice((-1, 1)) * rng.uniform(0.1, 0.3))
        else:
            out.append(rng.gauss(0.0, 0.01))
    return out


def test_the_95_percent_interval_covers_the_true_ratio_on_heavy_tailed_noise():
    """Synthetic studies with a known ratio (1.15) and this machine's kind of noise: the
    nominal 95% interval must hold the true ratio in at least 93% of them, at the default
    6 rounds and at 10 and 20."""
    import random
    from tui_trainer.core.analysis import stats
    rng = random.Random(23)
    true = 1.15
    for n in (6, 10, 20):
        trials, covered = 1500, 0
        for _ in range(trials):
            pairs = [(100.0, 100.0 * true * math.exp(e)) for e in heavy_tailed_noise(rng, n)]
            iv = stats.ratio_interval(pairs)
            covered += iv.low <= true <= iv.high
        assert covered / trials >= 0.93, (n, covered / trials)


def test_rounds_are_interleaved_with_one_seed_per_round():
    from tui_trainer.core.settings import config
    from tui_trainer.core.analysis import study
    base = config.DEFAULTS.replace(seed=7)
    runs, _ = study.plan(base, [("batch_size", [32]), ("amp", ["bf16"])], 10, repeats=4)
    order = [(v["label"], v["round"], v["config"]["seed"]) for v in runs]
    arms = ["base", "batch_size=32", "amp=bf16"]
    expected = []
    for r in range(4):               # ABC CBA ABC CBA: no arm always first or last
        for label in (arms if r % 2 == 0 else arms[::-1]):
            expected.append((label, r, 7 + r))
    assert order == expected
    assert all(v["config"]["batch_size"] == 32 for v in runs if v["label"] == "batch_size=32")
    # a seed sweep: the base alone, one seed each
    sweep = study.prepare(base, [], 10, repeats=3, name="s")
    assert sweep.kind == "sweep" and [v["config"]["seed"] for v in sweep.runs] == [7, 8, 9]
    for kwargs, key in [({"repeats": 1}, "--seeds"), ({"repeats": 3, "jobs": 999}, "--jobs"),
                        ({"repeats": 3, "level": 1.5}, "--level")]:
        with pytest.raises(config.ConfigError) as e:
            study.prepare(base, [], 10, name="s", **kwargs)
        assert e.value.key == key
    with pytest.raises(config.ConfigError, match="repeats vary it"):
        study.plan(base, [("seed", [2])], 10, repeats=2)


@pytest.mark.slow
def test_ab_with_two_rounds_gives_each_rounds_ratio_and_no_interval(tmp_path):
    """Two rounds of base and a variant that cannot change the training (eval_batch_size):
    each round's ratio is the one its two stored runs give; two rounds give no interval
    (one degree of freedom says nothing), and the table, the JSON and the export say how
    many rounds a verdict needs instead of printing [0.00-40260.93]."""
    from tui_trainer.core.analysis import stats
    r = tt("ab", "--session", str(tmp_path), "--json", *sets(*QUICK), "--steps", "6",
           "--vary", "eval_batch_size=100", "--repeats", "2", "--jobs", "2")
    assert r.rc == 0, r.err
    study = json.loads(r.out)
    assert study["repeats"] == 2 and study["jobs"] == 2
    base, variant = study["rows"]
    assert base["done"] == variant["done"] == 2 and len(variant["runs"]) == 2
    runs = db_rows(tmp_path, "SELECT id, name, json_extract(config, '$.seed') FROM runs "
                   "ORDER BY id")
    # ABBA: base r1, variant r1, variant r2, base r2; seeds 1, 1, 2, 2
    assert [(n.split("-", 1)[1], s) for _, n, s in runs] == [
        ("base-r1", 1), ("eval_batch_size=100-r1", 1), ("eval_batch_size=100-r2", 2),
        ("base-r2", 2)]
    assert variant["runs"] == [runs[1][0], runs[2][0]] and base["runs"] == [runs[0][0],
                                                                            runs[3][0]]
    assert variant["bit_identical"] is True
    per_run = _figures(tmp_path, [run_id for run_id, _, _ in runs])
    for key in ("samples_per_s", "accuracy"):
        pairs = [(per_run[b][key], per_run[v][key])
                 for b, v in zip(base["runs"], variant["runs"], strict=True)]
        iv = stats.ratio_interval(pairs)
        got = variant["intervals"][key]
        assert got["ratio"] == pytest.approx(iv.ratio)
        assert got["ratios"] == pytest.approx([v / b for b, v in pairs])
        assert got["low"] is None and got["high"] is None
        assert base[key] == pytest.approx(statistics.mean(per_run[b][key]
                                                          for b in base["runs"]))
    assert variant["intervals"]["accuracy"]["ratios"] == pytest.approx([1.0, 1.0])
    assert variant["verdicts"]["accuracy"].startswith("no verdict: 2 rounds")
    # the printed table of the same study: each round's ratio, no interval, the rounds needed
    r = tt("ab", "--study", "1", "--session", str(tmp_path), "--json")
    assert json.loads(r.out)["rows"][1]["intervals"] == variant["intervals"]
    r = tt("ab", "--study", "1", "--session", str(tmp_path))
    assert r.rc == 0, r.err
    line = next(x for x in r.out.splitlines() if x.startswith("eval_batch_size=100"))
    assert "2/2" in line and "no verdict: 2 of 6 rounds" in line and "; rounds 1.00 1.00" in line
    assert "eval_batch_size=100: no verdict: 2 rounds, a 95% interval needs 6" in r.out
    assert "x [" not in r.out and "needs 6 rounds or more" in r.out
    assert "2 at a time" in r.out
    # at 80 columns (a terminal's): the study's own figure kept beside its verdict, and
    # the verdict cell's "+N" points to what the line under the table says
    from tui_trainer.core.analysis import study as studies_, study_text as text_
    with SessionStore(tmp_path) as store:
        _, rows = studies_.table(store, 1)
    lines = text_.format_table(rows, width=80)
    assert all(len(x) <= 80 for x in lines[:len(rows) + 1]), lines
    assert "samples/s" in lines[0] and "verdict" in lines[0], lines[0]
    cell = text_.short_verdict(rows[1])
    assert " +" not in cell.replace("(+", "") and ("below)" in cell or "+" not in cell), cell
    # the export: one row per arm with the interval and verdict, the points of every round
    r = tt("export", "--study", "1", "--session", str(tmp_path), "--json")
    assert r.rc == 0, r.err
    with open(tmp_path / "exports" / "study-1-table.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [row["variant"] for row in table] == ["base", "eval_batch_size=100"]
    assert table[1]["samples_per_s_ratio_low"] == table[1]["samples_per_s_ratio_high"] == ""
    assert float(table[1]["samples_per_s_ratio"]) == pytest.approx(
        variant["intervals"]["samples_per_s"]["ratio"])
    assert table[1]["accuracy_verdict"].startswith("no verdict: 2 rounds")
    assert table[1]["runs"].split() == [str(x) for x in variant["runs"]]
    for run_id, _, _ in runs:
        assert (tmp_path / "exports" / f"run-{run_id}-steps.csv").is_file()
    # Had the variant crashed after its steps, the steps it recorded still match the base's:
    # that is no bit-identity (it read "crashed, yes (in every round)").
    import sqlite3

    from tui_trainer.core.analysis import study, study_text
    with sqlite3.connect(tmp_path / "session.sqlite") as db:
        db.execute("UPDATE runs SET status = 'crashed' WHERE id IN (?, ?)", variant["runs"])
    with SessionStore(tmp_path) as store:
        _, (_, crashed) = study.table(store, 1)
    assert crashed.status == "crashed" and crashed.bit_identical is None
    assert study_text.identity_text(crashed) == "crashed, not known (it did not finish)"


def test_a_seed_sweep_its_table_spread_and_band_come_from_its_runs(tmp_path):
    """`sweep`: one run per seed, the table's mean and sd, the Divergence tab's seed spread
    and the Plots tab's band, all from the runs' stored rows."""
    from types import SimpleNamespace

    from tui_trainer.core.analysis.divergence import seed_spread, spread_text
    from tui_trainer.core.analysis.figures import smooth
    from tui_trainer.core.analysis.plotdata import PlotOptions, plot_lines
    from tui_trainer.core.session.store import SessionStore
    from tui_trainer.core.analysis.study import sweep_groups
    r = tt("sweep", "--session", str(tmp_path), "--json", *sets(*QUICK), "--steps", "8",
           "--seeds", "3", "--set", "seed=5")
    assert r.rc == 0, r.err
    study = json.loads(r.out)
    assert study["kind"] == "sweep" and len(study["rows"]) == 1
    row = study["rows"][0]
    assert row["done"] == 3
    seeds = db_rows(tmp_path, "SELECT json_extract(config, '$.seed'), name FROM runs "
                    "ORDER BY id")
    assert [s for s, _ in seeds] == [5, 6, 7] and seeds[0][1] == "sweep1-seed5"
    accs = [f["accuracy"] for f in _figures(tmp_path, [1, 2, 3]).values()]
    assert row["accuracy"] == pytest.approx(statistics.mean(accs))
    assert row["spread"]["accuracy"] == pytest.approx(statistics.stdev(accs))
    r = tt("sweep", "--session", str(tmp_path), "--seeds", "1")
    assert r.rc == 2 and "--seeds" in r.err
    with SessionStore(tmp_path, create=False, readonly=True) as store:
        groups = sweep_groups(store.studies())
        assert groups == [("sweep 1", (1, 2, 3))]
        series = {i: SimpleNamespace(steps=store.steps(i), evals=store.evals(i),
                                     fingerprints=store.fingerprints(i)) for i in (1, 2, 3)}
    sp = seed_spread(list(series.values()))
    smoothed = [smooth([row["loss"] for row in s.steps]) for s in series.values()]
    last = [ys[-1] for ys in smoothed]
    assert sp.steps[-1] == 8 and sp.loss_sd[-1] == pytest.approx(statistics.stdev(last))
    assert sp.loss_min[-1] == min(last) and sp.loss_max[-1] == max(last)
    # different seeds: parameters apart from the first fingerprint on
    assert sp.fp_steps[0] == 0 and all(v > 0 for v in sp.param_spread)
    assert "3 seeds" in spread_text(sp, "runs 1-3")
    lines = plot_lines(series, [1, 2, 3], {}, PlotOptions(width=400), groups)["plot-loss"]
    assert [ln.label for ln in lines] == ["sweep 1 min", "sweep 1 max", "sweep 1 mean"]
    assert lines[2].ys[-1] == pytest.approx(statistics.mean(last))
    # a run outside the sweep keeps its own lines
    alone = plot_lines(series, [1, 2, 3], {}, PlotOptions(width=400), [("sweep 1", (2, 3))])
    assert [ln.label for ln in alone["plot-accuracy"]] == ["sweep 1 min", "sweep 1 max",
                                                           "sweep 1 mean", "1"]


def test_a_study_beside_a_permanent_hog_waits_once_and_keeps_its_loaded_rounds_marked(
        tmp_path):
    """device=cpu, real CPU hogs (one a core but one) all along: every round is measured
    under load, and no wait finds the machine freer than when a round was measured. The
    study waits once (at most a round's time, not --quiet-wait's 60 s), says so, and waits
    no more while --until-sure adds its rounds: it ends with every loaded round kept and
    marked, its re-runs unspent (issue 54: before, it waited again after every round)."""
    import subprocess
    import sys
    import time
    from conftest import tt_popen
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(max(1, (os.cpu_count() or 2) - 1))]
    try:
        t0 = time.monotonic()
        proc = tt_popen("ab", "--session", str(tmp_path), "--json",
                        *sets(*QUICK, "device=cpu", "num_threads=1"),
                        "--steps", "6", "--vary", "eval_batch_size=100", "--repeats", "2",
                        "--quiet-wait", "60", "--until-sure", "0.001", "--max-rounds", "3")
        out, err = proc.communicate(timeout=400)
        took = time.monotonic() - t0
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert proc.returncode == 0, err
    result = json.loads(out)
    waits = len(result["waits"])
    assert result["repeats"] == 3 and result["ended_by"].startswith("bound: 3 rounds")
    if not result["reruns"]:        # (another test process may have ended meanwhile)
        assert waits == 1, err
        assert any("still busy" in n and "every round measured under load" in n
                   for n in result["notes"]), result["notes"]
        assert result["rows"][1]["loaded_rounds"], result["rows"][1]
    assert 1 <= waits <= len(result["reruns"]) + 1, result["waits"]
    # a wait of at most a round's time so far, not the 60 s --quiet-wait allows
    per_round = took / (3 + len(result["reruns"]))
    assert all(w["waited_s"] <= w["limit_s"] + 3 and w["limit_s"] <= 1.5 * per_round < 60
               for w in result["waits"]), (result["waits"], took)
    assert all(w["busy_then"] > 0.5 for w in result["waits"]), result["waits"]


def test_rounds_beside_a_cpu_hog_are_marked_trained_again_and_until_sure_stops_at_its_bound(
        tmp_path):
    """Real CPU hogs beside the first two rounds (one process a core but one: a single one
    leaves a 16-core machine with cores to spare, rightly not loaded; as nice as the runs;
    CPU runs, which they slow): every run records what else took the CPU (others' cores,
    own, load, frequency), the rounds are marked, the verdict says so, the first marked
    round is trained again once the hog is gone (or kept, said so, when the machine stays
    busy: the other test worker may be training), and --until-sure adds rounds until its
    bound, saying what ended it."""
    import subprocess
    import sys
    from conftest import tt_popen, wait_until
    from tui_trainer.core.processes import contention
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(max(1, (os.cpu_count() or 2) - 1))]
    try:
        proc = tt_popen("ab", "--session", str(tmp_path), "--json",
                        *sets(*QUICK, "device=cpu"),     # the CPU the hogs take from
                        "--steps", "6", "--vary", "eval_batch_size=100", "--repeats", "2",
                        "--rerun-loaded", "1", "--quiet-wait", "5", "--until-sure", "0.001",
                        "--max-rounds", "3")
        def finished() -> int:
            if not (tmp_path / "session.sqlite").exists():
                return 0                           # (connecting would create it)
            try:
                return len(db_rows(tmp_path, "SELECT id FROM runs WHERE status = 'finished'"))
            except sqlite3.OperationalError:      # not created yet
                return 0
        # the planned rounds are trained (or the study ended): the hog goes
        wait_until(lambda: proc.poll() is not None or finished() >= 4, timeout=300)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    result = json.loads(out)
    first = [json.loads(s) for (s,) in db_rows(tmp_path, "SELECT summary FROM runs ORDER BY id "
                                                "LIMIT 4")]
    for summary in first:                       # the hog took about a core all along
        c = contention.read(summary["contention"])
        assert c["others_cores"] > 0.5 and contention.loaded(c), c
        assert c["own_cores"] > 0.2 and c["load1"][0] is not None
        # the study that started it was known (its own processes are not others'), and the
        # hog, a stranger to it, is others'
        assert c["study_cores"] is not None and c["cores"] >= 1
    variant = result["rows"][1]
    assert result["repeats"] == 3 and variant["done"] == 3
    assert result["ended_by"].startswith("bound: 3 rounds (--max-rounds)"), result["ended_by"]
    assert 1 in variant["loaded_rounds"]         # round 2: no re-run left for it
    names = [n for (n,) in db_rows(tmp_path, "SELECT name FROM runs ORDER BY id")]
    if result["reruns"]:                          # quiet once the hog was gone: round 1 again
        (rerun,) = result["reruns"]
        assert rerun["round"] == 0 and rerun["replaced"] == [1, 2]
        assert {"ab1-base-r1-again1", "ab1-eval_batch_size=100-r1-again1"} <= set(names)
        assert variant["runs"][0] not in (1, 2)     # (the other test worker may load it)
    else:                                         # still busy: kept, marked, and said
        assert any("still busy" in n for n in result["notes"]) and 0 in variant["loaded_rounds"]
    assert len(names) == 6 + 2 * len(result["reruns"])
    # continued, the study may still train round 1 again (its re-run was not spent) when
    # the machine now has room; what it prints is what it then holds
    r = tt("ab", "--study", "1", "--session", str(tmp_path))
    assert "--until-sure ended: bound: 3 rounds" in r.out
    from tui_trainer.core.analysis.study import table
    _, rows = table(SessionStore(tmp_path, create=False, readonly=True), 1)
    assert rows[1].loaded_rounds and set(rows[1].loaded_rounds) <= set(variant["loaded_rounds"])
    assert f"measured under load: {len(rows[1].loaded_rounds)} of 3 rounds shared the CPU" \
        in " ".join(r.out.split())


def test_a_study_stopped_before_it_runs_and_one_after_it_in_its_job_say_so(tmp_path):
    """device=cpu. Stop right after the dashboard starts a study, before its process has
    marked it running: the study is stopped through that process and said "stopped", not
    left as created (before, the supervisor looked for a status no study has). Two studies
    run as one job (`ab --study A --then B`, as the tab's Decide a price trains whole runs
    after its windows): the first stopped, the second is never begun and says why."""
    from conftest import wait_until
    from tui_trainer.core.analysis import study
    from tui_trainer.core.processes.supervisor import Supervisor
    from tui_trainer.core.settings import config
    base = config.from_dict({**config.DEFAULTS.to_dict(), "dataset": "mnist-sample",
                             "device": "cpu", "train_samples": 640, "eval_samples": 200})
    with SessionStore(tmp_path) as store:
        ids = []
        for _ in range(3):
            planned = study.prepare(base, [("batch_size", [32])], 2000, repeats=2, name="s")
            ids.append(store.create_study(planned.kind, "s", planned.spec, planned.runs))
        sup = Supervisor(store)
        sup.study(ids[0])
        assert sup.stop_study(ids[0])          # its process has not even started Python yet
        sup.study(ids[1], then=(ids[2],))
        assert wait_until(lambda: store.study(ids[1])["status"] == "running", 120)
        assert sup.stop_study(ids[1])
        assert wait_until(lambda: (sup.reap(), sup.jobs_running() == 0)[1], 120)
        sup.reap()
        first, second, third = (store.study(i) for i in ids)
        assert first["status"] == "stopped" and "before its first run" in first["message"]
        assert second["status"] == "stopped", second["status"]
        assert third["status"] == "stopped" and third["message"] == \
            f"not started: study {ids[1]} before it ended stopped; run it again to start it"
    r = tt("ab", "--session", str(tmp_path), "--then", str(ids[2]))
    assert r.rc == 2 and "give --study ID" in r.err and len(r.err.strip().splitlines()) == 1
