"""`tui-trainer explain A B`: real runs in a real session, replayed from their checkpoints in
the real `explain` process; each case is a cause the explanation must name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import QUICK, db_rows, ranks_device, sets, tt
from tui_trainer.core.analysis.explain import evidence_lines, explanation_text

# 12 steps, fingerprints every 5 (0, 5, 10, 12): the replay searches steps 1 to 5.
SHORT = [*QUICK, "max_steps=12", "fingerprint_every=5"]


def _runs(session, *variants: list[str]) -> None:
    for extra in variants:
        r = tt("run", "--session", str(session), *sets(*SHORT, *extra))
        assert r.rc == 0, r.err


def _explain(session, a: int = 1, b: int = 2):
    """The command's --json answer, and its words as the command prints them (one replay:
    the printed text is core.analysis.explain's words of that answer, checked once below)."""
    from tui_trainer.core.analysis.explain import explanation_text
    r = tt("explain", str(a), str(b), "--session", str(session), "--json")
    assert r.err == "", r.err
    result = json.loads(r.out)
    return r.rc, result, explanation_text(result)


def test_another_seed_parts_at_step_0_without_a_replay(tmp_path):
    _runs(tmp_path, ["seed=1"], ["seed=2"])
    rc, result, text = _explain(tmp_path)
    assert rc == 3 and result["verdict"] == "initial" and "replay" not in result
    assert text.startswith("Runs 1 (A) and 2 (B) part at step 0: their initial parameters "
                           "differ (seed 1 vs 2)"), text
    printed = tt("explain", "1", "2", "--session", str(tmp_path), "--evidence")
    lines = printed.out.splitlines()
    assert printed.rc == 3 and lines[0].startswith(text.rsplit(" Cost:", 1)[0])
    assert "  parameter hashes different at step 0 (A " in printed.out
    assert "  config seed: A 1, B 2" in lines


def test_identical_runs_say_so_in_one_line_without_a_replay(tmp_path):
    _runs(tmp_path, [], [])
    rc, result, text = _explain(tmp_path)
    assert rc == 0 and result["verdict"] == "identical" and "replay" not in result
    printed = tt("explain", "1", "2", "--session", str(tmp_path))
    assert printed.rc == 0 and printed.out.strip() == text
    assert text.count("\n") == 0 and "no divergence" in text and "4 common" in text


def test_another_thread_count_is_named_down_to_the_op_and_the_setting(tmp_path):
    """Same seed and data, 1 vs 2 threads: everything going into the first differing step
    agrees, one op of it gives other bits on the same inputs, each thread count does so
    every time, and switching num_threads alone turns A's result into B's. On the CPU: the
    thread count does not touch CUDA's kernels."""
    _runs(tmp_path, ["num_threads=1", "device=cpu"], ["num_threads=2", "device=cpu"])
    rc, result, text = _explain(tmp_path)
    assert rc == 3 and result["verdict"] == "op", result
    assert result["last_identical"] < result["step"] <= result["first_different"]
    assert result["replay"]["reproduced"] == [True, True]
    op = result["op"]
    assert op["inputs_agree"] and op["other"] is None
    assert op["phase"] in ("forward", "backward") and op["name"].startswith("aten.")
    assert op["module"].startswith("GrokkingNet") and "models.py" in op["source"]
    assert op["difference"]["elements"] > 0 and op["difference"]["max_ulps"] > 0
    assert op["why"] == {"self_consistent": [True, True], "kind": "setting",
                         "follows": [{"key": "num_threads", "a": 1, "b": 2}]}
    assert f"part at step {result['step']}, in the {op['phase']} of `" in text
    assert "follows num_threads (1 vs 2)" in text and "deterministic on its own" in text
    # kept in the session on B, whole, for the Divergence tab and the exports
    kept = db_rows(tmp_path, "SELECT run_id, data FROM events WHERE kind = 'explanation'")
    assert [(r, json.loads(d)) for r, d in kept] == [(2, result)]
    evidence = evidence_lines(result)
    assert f"replay A: from its checkpoint at step {result['replay']['from_checkpoints'][0]}, " \
        f"{result['replay']['steps'][0]} steps, reproduced its recorded hash" in evidence
    assert "switched num_threads 1 -> 2 alone: A's op gives B's result" in evidence


def test_other_augmentation_draws_are_named_as_the_batch(tmp_path):
    """seed_workers on vs off with two workers and numpy augmentation: the workers draw
    other numbers, so the first batch already holds other pixels."""
    extra = ["num_workers=2", "augment=numpy"]
    _runs(tmp_path, [*extra, "seed_workers=true"], [*extra, "seed_workers=false"])
    rc, result, text = _explain(tmp_path)
    assert rc == 3 and result["verdict"] == "input" and result["step"] == 1, result
    assert result["input"]["item"] == "batch" and result["input"]["samples"]
    assert "the batch of step 1 differs" in text and "seed_workers True vs False" in text


def test_one_batch_against_two_accumulated_halves_is_named_as_how_the_step_computed(
        tmp_path):
    """batch_size 64 against 32 with grad_accum_steps 2: each step consumes the same 64
    samples; the answer compares what the whole step took and names the accumulation, not
    "32 of 64 samples differ" from A's batch against B's first half (issue 55)."""
    _runs(tmp_path, ["batch_size=64", "device=cpu"],
          ["batch_size=32", "grad_accum_steps=2", "device=cpu"])
    rc, result, text = _explain(tmp_path)
    assert rc == 3 and result["verdict"] == "input" and result["step"] == 1, result
    assert result["input"] == {"item": "partition", "samples": 64, "a": [64], "b": [32, 32]}
    assert "both steps consume the same 64 samples in the same order, computed otherwise: " \
        "A as one batch of 64, B as 2 micro-batches of 32 whose gradients are added " \
        "(gradient accumulation)" in text
    assert "batch_size 64 vs 32, grad_accum_steps 1 vs 2" in text
    assert "samples differ" not in text


def test_runs_not_comparable_are_refused_and_lost_checkpoints_replayed_from_the_config(
        tmp_path):
    """On the CPU: run 3 differs from run 1 by its thread count (on CUDA it would not)."""
    _runs(tmp_path, ["device=cpu"], ["model=examples", "device=cpu"],
          ["num_threads=2", "keep_checkpoints=1", "checkpoint_every=2", "device=cpu"])
    r = tt("explain", "1", "2", "--session", str(tmp_path))
    assert r.rc == 2 and "not comparable" in r.err and "model (grokking vs examples)" in r.err

    # run 3 keeps its newest checkpoint (step 12) and, whatever keep_checkpoints says, its
    # replay root at step 0; with that root removed (by hand, or a session of an older
    # tui-trainer) it is replayed from its seeded config, which must then reproduce its
    # recorded hash (a seeded run's start is exact)
    assert _checkpoint_steps(tmp_path, 3) == [0, 12]
    _remove_checkpoints(tmp_path, 3, [0])
    rc, result, text = _explain(tmp_path, 1, 3)
    assert rc == 3 and result["verdict"] == "op", result
    assert result["replay"]["from_config"] == [False, True]
    assert result["replay"]["reproduced"] == [True, True]
    assert "Replayed from A's checkpoint at step 0 and B's seeded config (no checkpoint kept " \
        "that early), which reproduced" in text


def test_a_resume_that_was_not_exact_is_named_by_the_state_it_lost(tmp_path):
    """B is killed at step 7 and continued from its checkpoint at step 6, whose torch RNG
    state was replaced (what a checkpoint that dropped it would do): B parts from A at step
    7, and what differs going into it is that generator, not an op. On the CPU: that
    generator draws the CPU's dropout masks (on CUDA, CUDA's generator does)."""
    import torch
    cpu = ["checkpoint_every=3", "device=cpu"]
    _runs(tmp_path, cpu)
    killed = tt("run", "--session", str(tmp_path), "--kill-at-step", "7", *sets(*SHORT, *cpu))
    assert killed.rc != 0
    path = tmp_path / "checkpoints" / "run-2" / "step-00000006.pt"
    state = torch.load(path, weights_only=True)
    state["rng"]["torch"] = torch.Generator().manual_seed(99).get_state()
    torch.save(state, path)
    assert tt("resume", "2", "--session", str(tmp_path)).rc == 0
    rc, result, text = _explain(tmp_path)
    assert rc == 3 and result["verdict"] == "input", result
    assert result["replay"]["from_checkpoints"] == [6, 6] and result["step"] == 7
    assert result["input"] == {"item": "rng", "name": "torch"}
    assert "the random state going into step 7 differs: torch's CPU generator" in text
    # the same, keeping only the newest checkpoint: nothing to replay B's resume from, and
    # its config does not reproduce it; the missing checkpoint and the knob are named
    killed = tt("run", "--session", str(tmp_path), "--kill-at-step", "7",
                *sets(*SHORT, *cpu, "keep_checkpoints=1"))
    path = tmp_path / "checkpoints" / "run-3" / "step-00000006.pt"
    state = torch.load(path, weights_only=True)
    state["rng"]["torch"] = torch.Generator().manual_seed(99).get_state()
    torch.save(state, path)
    assert tt("resume", "3", "--session", str(tmp_path)).rc == 0
    # keep_checkpoints=1 prunes neither step 0 nor step 6, where the resume started
    assert _checkpoint_steps(tmp_path, 3) == [0, 6, 12]
    _remove_checkpoints(tmp_path, 3, [0, 6])
    rc, result, text = _explain(tmp_path, 1, 3)
    assert rc == 3 and result["verdict"] == "not_reproduced", result
    assert result["replay"]["reproduced"] == [True, False]
    assert "run 3 has no checkpoint at or before step 6, where its replay should start (it " \
        "keeps steps 12; its checkpoint at step 0 and those its resumes started from are " \
        "never pruned" in text
    assert "replaying B did not reproduce its recorded hash at step 10" in text
    # this machine, asked, computes B's steps deterministically: the difference is not here
    hunt = result["hunt"]
    assert (hunt["side"], hunt["agree"], hunt["from_config"], hunt["steps"]) == \
        ("B", True, True, 10)
    assert hunt["elsewhere"] == []                  # trained here, with these libraries
    assert "3 replays from B's seeded config agree with each other at every op of 10 steps: " \
        "this machine computes them deterministically, so the difference came from " \
        "elsewhere: its recorded settings show this machine" in text


def _checkpoint_steps(session, run_id: int) -> list[int]:
    return sorted(int(p.stem.split("-")[1])
                  for p in (session / "checkpoints" / f"run-{run_id}").glob("step-*.pt"))


def _remove_checkpoints(session, run_id: int, steps: list[int]) -> None:
    """As a session of an older tui-trainer (which pruned them), or a user's rm, leaves it."""
    import sqlite3
    with sqlite3.connect(session / "session.sqlite") as conn:
        for step in steps:
            conn.execute("UPDATE checkpoints SET removed = 1 WHERE run_id = ? AND step = ?",
                         (run_id, step))
            (session / "checkpoints" / f"run-{run_id}" / f"step-{step:08d}.pt").unlink()


PLANT = Path(__file__).parent / "plant"


def planted(*args: str) -> subprocess.CompletedProcess:
    """`tui-trainer ARGS` started cold, it and every process it starts with tests/plant on
    PYTHONPATH (its sitecustomize adds the model `planted`, whose op plant::shuffled_sum
    sums in an order drawn from os.urandom): not the test session's warm launcher (whose
    forks lack it), but one of its own, started with the plant."""
    env = {k: v for k, v in os.environ.items() if k != "TUI_TRAINER_WARM"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PLANT), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "tui_trainer", *args], capture_output=True,
                          text=True, timeout=300, env=env)


async def test_one_config_parted_by_a_nondeterministic_op_is_named_by_replays_of_one_state(
        tmp_path):
    """On the CPU (the planted op is a CPU op): one config trained twice parts; `repro` goes
    on to explain, whose replay of A does not give A's bits; replays of one state side by
    side, op by op, name the op that differs on identical inputs, where it is and what
    deterministic=on does to it (nothing: it is the op's own code)."""
    r = planted("repro", "--session", str(tmp_path), "--json",
                *sets(*SHORT, "model=planted", "device=cpu", "deterministic=off"))
    assert r.returncode == 3, r.stderr
    result = json.loads(r.stdout)["explanation"]
    assert result["verdict"] == "nondeterministic", result
    hunt = result["hunt"]
    op = hunt["op"]
    assert (hunt["side"], hunt["replays"], hunt["from_checkpoint"], hunt["step"]) == \
        ("A", 3, 0, 1)
    assert (op["name"], op["phase"], op["module"]) == \
        ("plant.shuffled_sum.default", "forward", "PlantedNet")
    assert op["source"].endswith("(classifier)") and "sitecustomize.py" in op["source"]
    assert op["inputs_agree"] and op["differing_replays"] >= 1
    assert 0 < op["difference"]["elements"] <= op["difference"]["of"] == 64   # one per sample
    fixes = hunt["fixes"]
    assert fixes["alone_differs"] is True
    assert fixes["tried"] == [{"key": "deterministic", "value": "on", "result": "differs"}]
    text = explanation_text(result)
    assert text.startswith("Runs 1 (A) and 2 (B): parameter hashes identical at step 0, "
                           "different at step 5. Replaying A did not reproduce its own "
                           "recorded hash, so this machine was asked: 3 replays from A's "
                           "checkpoint at step 0 part at step 1, in the forward of "
                           "`PlantedNet` (plant.shuffled_sum.default, float32 on cpu, called "
                           "from "), text
    assert "nondeterministic on this machine" in text
    assert "Deterministic=on leaves it differing." in text
    # kept on B for the Divergence tab and the exports, in the same words
    kept = db_rows(tmp_path, "SELECT run_id, message FROM events WHERE kind = 'explanation'")
    assert kept == [(2, text)]
    # the dashboard's Divergence tab shows it for the pair, and e what it rests on
    from textual.widgets import DataTable
    from tui_trainer.ui.app import TrainerApp
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        await app.poll_now()
        app.query_one("#runs", DataTable).focus()
        await pilot.press("space", "down", "space")
        assert app.pair == [1, 2]
        app.query_one("#tabs").active = "tab-divergence"
        await pilot.pause()
        await app.poll_now()
        await pilot.pause()
        shown = str(app.query_one("#explanation").render())
        assert "nondeterministic on this machine" in shown and "plant.shuffled_sum" in shown
        await pilot.press("e")
        await pilot.pause()
        evidence = str(app.screen.query_one("#evidence-text Static").render())
        assert "nondeterministic op #" in evidence and "with deterministic=on: differs" in \
            evidence


def test_autocast_is_named_at_its_first_op_with_the_dtypes(tmp_path):
    _runs(tmp_path, [], ["amp=bf16"])
    rc, result, text = _explain(tmp_path)
    op = result["op"]
    assert rc == 3 and result["verdict"] == "op" and op["phase"] == "forward", result
    assert op["other"] is not None and "bfloat16" in op["other"]["dtypes"]
    assert "float32" in op["dtypes"] and "bfloat16" not in op["dtypes"]
    assert f"A runs {op['name']} (float32) where B runs {op['other']['name']} (bfloat16)" \
        in text


def test_another_optimizer_implementation_is_named_in_the_optimizer(tmp_path):
    """for-loop against fused Adam: the same state goes into the step (the implementation's
    flags are not state), the optimizer runs other ops, and the knob is named."""
    _runs(tmp_path, ["optimizer=adam", "optimizer_impl=for-loop"],
          ["optimizer=adam", "optimizer_impl=fused"])
    rc, result, text = _explain(tmp_path)
    op = result["op"]
    assert rc == 3 and result["verdict"] == "op" and result["step"] == 1, result
    assert op["phase"] == "optimizer" and op["other"] is not None and "_optimizer_step" in \
        op["source"], op
    assert "in the optimizer: A runs " in text
    assert "The two configs differ in optimizer_impl for-loop vs fused." in text


def test_channels_last_is_named_as_the_layout_the_difference_follows(tmp_path):
    _runs(tmp_path, [], ["channels_last=true"])
    rc, result, text = _explain(tmp_path)
    op = result["op"]
    assert rc == 3 and result["verdict"] == "op" and op["inputs_agree"], result
    assert not op["same_strides"] and op["why"]["follows"] == [
        {"key": "channels_last", "a": False, "b": True}]
    assert "same input values in another memory layout" in text


def test_one_process_against_two_names_the_shards_and_the_all_reduce(tmp_path):
    """nproc 1 vs 2 at the same global batch. B's ranks are replayed in this process, one
    after the other with DDP's gradient average, and must reproduce B's recorded hashes.
    Step 1's batch already differs (each rank takes its DistributedSampler shard), and on
    B's own samples one backward against two averaged gives other sums as well. Two
    processes: one GPU each where there are two, else the CPU (gloo)."""
    device = ranks_device(2)
    _runs(tmp_path, [device], ["nproc=2", device])
    rc, result, text = _explain(tmp_path)
    assert rc == 3 and result["verdict"] == "input" and result["step"] == 1, result
    assert result["replay"]["reproduced"] == [True, True] and result["worlds"] == [1, 2]
    assert result["input"]["item"] == "batch" and not result["input"]["same_samples_reordered"]
    sums = result["sums"]
    assert sums["run"] == "B" and sums["per_rank"] == [32, 32] and sums["samples"] == 64
    assert 0 < sums["elements"] <= sums["of"] and sums["first"] in sums["params"]
    assert sums["difference"]["max_ulps"] > 0
    assert "B's 2 processes each take a shard (DistributedSampler)" in text
    assert "follows nproc 1 vs 2" in text
    assert "one backward over all 64 and the average of 2 backwards over 32 each" in text
    assert f"first in `{sums['first']}`" in text


def test_the_words_for_a_batch_tell_order_pixels_and_samples_apart():
    """core.analysis.explain's words for the three ways a batch differs (the engine's findings as
    the command gives them; the pieces each case reads are the ones set here)."""
    from tui_trainer.core.analysis.explain import explanation_text
    base = {"runs": [1, 2], "verdict": "input", "step": 4, "first_different": 5,
            "last_identical": 0, "settings": [{"key": "seed_workers", "a": True, "b": False,
                                               "of": "config"}]}
    item = {"item": "batch", "micro_batches": 1, "micro_batch": 0, "of": 4,
            "samples": [0, 1, 2, 3], "labels_a": [1, 2, 3, 4], "labels_b": [2, 1, 4, 3]}
    reordered = explanation_text({**base, "input": {**item, "same_samples_reordered": True}})
    assert "the batch of step 4 differs: the same samples in another order; what the batch " \
        "holds follows seed_workers True vs False." in reordered
    pixels = explanation_text({**base, "input": {**item, "same_samples_reordered": False,
                                                 "same_labels": True}})
    assert "4 of 4 samples hold other pixels under the same labels" in pixels
    other = explanation_text({**base, "input": {**item, "same_samples_reordered": False,
                                                "same_labels": False}})
    assert "4 of 4 samples differ (digits 1 2 3 4 in A, 2 1 4 3 in B)" in other


def test_runs_whose_epochs_differ_in_length_part_where_one_drops_its_last_batch(tmp_path):
    """660 samples in batches of 64 (QUICK's 640 and 20 more): with drop_last an epoch is 10
    steps, without it 11. The two agree for 10 steps, then B starts its second epoch where A
    takes its batch of 20: explain says where each replay is and names drop_last (the data's
    position holds on any device)."""
    _runs(tmp_path, ["train_samples=660"], ["train_samples=660", "drop_last=true"])
    rc, result, text = _explain(tmp_path)
    assert rc == 3 and result["step"] == 11, result
    assert result["input"]["item"] == "position"
    assert "A at epoch 0 batch 10, B at epoch 1 batch 0" in text
    assert "an epoch's length follows drop_last False vs True" in text, text
