"""Bit-for-bit reproducibility on the CPU with deterministic = on: two runs of one config, and
a run killed mid-epoch and resumed, against the run that never stopped."""

from __future__ import annotations

import json
import signal

import pytest

from conftest import QUICK, db_rows, fingerprints, kept_agrees, sets, tt, tt_popen, wait_for_row

# 3 epochs of 10 steps; checkpoints every 7 steps land inside epochs (7, 14, 21, 28).
RESUMABLE = QUICK + ["epochs=3", "checkpoint_every=7", "deterministic=on"]


def _run(session, *extra: str, kill_at: int | None = None):
    args = ["run", "--session", str(session), "--json", *sets(*RESUMABLE, *extra)]
    if kill_at is not None:
        args += ["--kill-at-step", str(kill_at)]
    return tt(*args)


def test_two_runs_of_one_config_are_bit_identical(tmp_path):
    a = _run(tmp_path, "augment=torch")
    b = _run(tmp_path, "augment=torch")
    assert a.rc == 0 and b.rc == 0, a.err + b.err
    fa, fb = fingerprints(tmp_path, 1), fingerprints(tmp_path, 2)
    assert sorted(fa) == list(range(0, 31, 3))   # step 0: the initial parameters
    assert fa == fb
    assert a.json["param_sha256"] == b.json["param_sha256"] == fa[30]
    # Same bits, so the same losses at every logged step.
    la = db_rows(tmp_path, "SELECT step, loss FROM steps WHERE run_id = 1 ORDER BY step")
    lb = db_rows(tmp_path, "SELECT step, loss FROM steps WHERE run_id = 2 ORDER BY step")
    assert la == lb and len(la) == 15


@pytest.mark.parametrize("change", ["seed=2", "seed=none"])
def test_runs_that_really_differ_are_told_apart(tmp_path, change):
    a = _run(tmp_path)
    b = _run(tmp_path, change)
    assert a.rc == 0 and b.rc == 0, a.err + b.err
    fa, fb = fingerprints(tmp_path, 1), fingerprints(tmp_path, 2)
    assert fa.keys() == fb.keys()
    assert all(fa[s] != fb[s] for s in fa)
    # The fingerprint records the seed as applied.
    seeds = db_rows(tmp_path, "SELECT json_extract(fingerprint, '$.seed') FROM runs ORDER BY id")
    assert seeds[0][0] == 1 and seeds[1][0] == (2 if change == "seed=2" else None)


RESUME_CASES = {
    "workers0-numpy-augment": ["num_workers=0", "augment=numpy", "seed_workers=true"],
    "workers2-numpy-augment": ["num_workers=2", "augment=numpy", "seed_workers=true"],
    "workers2-torch-augment": ["num_workers=2", "augment=torch", "seed_workers=true"],
    # 660 samples: each epoch's last batch of 20 dropped (drop_last), 10 steps an epoch
    "workers2-persistent-drop-last": ["num_workers=2", "augment=numpy", "seed_workers=true",
                                      "persistent_workers=true", "train_samples=660",
                                      "drop_last=true"],
    # with the speed record's recipe: its net, Adam's betas, a fused update and one-cycle
    # (the scheduler's state moves every step and must come back exactly), in whole batches
    "resident-torch-augment-onecycle-drop-last": [
        "loader=resident", "augment=torch", "model=fast", "optimizer=adam", "lr=0.01",
        "adam_beta1=0.7", "adam_beta2=0.9", "optimizer_impl=fused", "lr_schedule=onecycle",
        "train_samples=660", "drop_last=true"],
    "unseeded-workers-accumulation-cosine": ["num_workers=0", "augment=torch",
                                             "seed_workers=false", "grad_accum_steps=2",
                                             "clip_grad_norm=1.0", "lr_schedule=cosine",
                                             "warmup_steps=4", "optimizer_impl=foreach"],
}


@pytest.mark.parametrize("case", RESUME_CASES, ids=list(RESUME_CASES))
def test_resume_after_sigkill_mid_epoch_is_bit_identical(tmp_path, case):
    extra = RESUME_CASES[case]
    straight = _run(tmp_path, *extra)
    assert straight.rc == 0, straight.err
    steps_per_epoch = 10 // (2 if "grad_accum_steps=2" in extra else 1)
    # Killed inside an epoch, 3 or 4 steps past a checkpoint.
    killed = _run(tmp_path, *extra, kill_at=17 if steps_per_epoch == 10 else 11)
    assert killed.rc == -signal.SIGKILL
    listing = tt("runs", "--session", str(tmp_path), "--json")
    assert listing.rc == 0 and listing.json[1]["status"] == "crashed"   # the dead process
    status = db_rows(tmp_path, "SELECT status FROM runs WHERE id = 2")[0][0]
    assert status == "running"          # ... seen by reading, which never writes
    # Newest checkpoint sits inside an epoch, not at a boundary.
    ckpt = db_rows(tmp_path, "SELECT step, batch_in_epoch FROM checkpoints WHERE run_id = 2 "
                             "AND removed = 0 ORDER BY step DESC LIMIT 1")[0]
    resumed = tt("resume", "2", "--session", str(tmp_path), "--json")
    assert resumed.rc == 0, resumed.err
    assert ckpt[1] != 0 and ckpt[0] % steps_per_epoch != 0
    assert resumed.json["resumed_from_step"] == ckpt[0]
    fa, fb = fingerprints(tmp_path, 1), fingerprints(tmp_path, 2)
    later = [s for s in fa if s > ckpt[0]]
    assert later, "the resume must cover fingerprints after the checkpoint"
    assert fa == fb
    assert resumed.json["param_sha256"] == straight.json["param_sha256"]
    assert resumed.json["status"] == "finished"
    kept_agrees(tmp_path, 2)            # the resumed run's figures, kept when it ended again
    lrs = [lr for (lr,) in db_rows(tmp_path, "SELECT lr FROM steps WHERE run_id = 2 "
                                             "ORDER BY step")]
    assert lrs == [lr for (lr,) in db_rows(tmp_path, "SELECT lr FROM steps WHERE run_id = 1 "
                                                     "ORDER BY step")]
    if any(k.startswith("lr_schedule=") for k in extra):     # it moves every step
        top = lrs.index(max(lrs))
        assert 0 < top < len(lrs) - 1 and lrs[-1] < lrs[0] / 10, lrs


def test_resume_after_external_sigkill_while_training(tmp_path):
    """A kill from outside at an arbitrary moment (workers running), not at a chosen step."""
    extra = ["num_workers=2", "augment=numpy", "epochs=6", "checkpoint_every=3"]
    straight = _run(tmp_path, *extra)
    assert straight.rc == 0, straight.err
    proc = tt_popen("run", "--session", str(tmp_path), *sets(*RESUMABLE, *extra))
    wait_for_row(tmp_path, "SELECT 1 FROM checkpoints WHERE run_id = 2 AND step >= 13")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    ckpt_step = db_rows(tmp_path, "SELECT max(step) FROM checkpoints WHERE run_id = 2")[0][0]
    assert ckpt_step < 60, "the run was killed before it finished"
    resumed = tt("resume", "2", "--session", str(tmp_path), "--json")
    assert resumed.rc == 0, resumed.err
    assert fingerprints(tmp_path, 1) == fingerprints(tmp_path, 2)
    assert resumed.json["param_sha256"] == straight.json["param_sha256"]


@pytest.mark.slow
def test_sigterm_stops_cleanly_with_a_checkpoint_and_continues_exactly(tmp_path):
    extra = ["epochs=8", "checkpoint_every=0"]
    straight = _run(tmp_path, *extra)
    assert straight.rc == 0, straight.err
    proc = tt_popen("run", "--session", str(tmp_path), "--json", *sets(*RESUMABLE, *extra))
    wait_for_row(tmp_path, "SELECT 1 FROM runs WHERE id = 2 AND step >= 12")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, err          # stopped before its end
    stopped = json.loads(out.strip().splitlines()[-1])
    assert stopped["status"] == "stopped" and 12 <= stopped["steps"] < 80
    assert stopped["checkpoint"].endswith(f"step-{stopped['steps']:08d}.pt")
    assert db_rows(tmp_path, "SELECT status FROM runs WHERE id = 2")[0][0] == "stopped"
    resumed = tt("resume", "2", "--session", str(tmp_path), "--json")
    assert resumed.rc == 0, resumed.err
    assert resumed.json["steps"] == 80
    assert resumed.json["param_sha256"] == straight.json["param_sha256"]


def test_resume_can_extend_a_finished_run(tmp_path):
    straight = _run(tmp_path, "epochs=2")
    short = _run(tmp_path, "epochs=2", "max_steps=13")
    assert straight.rc == 0 and short.rc == 0
    assert short.json["steps"] == 13 and short.json["status"] == "finished"
    longer = tt("resume", "2", "--session", str(tmp_path), "--json", "--set", "max_steps=0")
    assert longer.rc == 0, longer.err
    assert longer.json["steps"] == 20
    assert longer.json["param_sha256"] == straight.json["param_sha256"]


def test_resuming_from_an_older_checkpoint_verifies_the_recorded_hashes(tmp_path):
    """Replaying a finished run from an earlier checkpoint recomputes steps whose hashes are
    stored, compares each, and records the verdict."""
    done = _run(tmp_path, "keep_checkpoints=10")
    assert done.rc == 0, done.err
    recorded = fingerprints(tmp_path, 1)
    older = db_rows(tmp_path, "SELECT path FROM checkpoints WHERE run_id = 1 AND step = 7")[0][0]
    replay = tt("resume", "1", "--session", str(tmp_path), "--json",
                "--checkpoint", str(tmp_path / older))
    assert replay.rc == 0, replay.err
    after_7 = [s for s in recorded if s > 7]
    assert replay.json["resume_fingerprints_matched"] == len(after_7) == 8
    assert replay.json["resume_fingerprints_differed"] == 0
    (message,), = db_rows(tmp_path, "SELECT message FROM events WHERE kind = 'resume_check'")
    assert message.startswith("resume exact: 8 parameter hashes")
    assert fingerprints(tmp_path, 1) == recorded


def test_a_resume_that_does_not_reproduce_a_recorded_hash_says_so(tmp_path):
    done = _run(tmp_path, "keep_checkpoints=10")
    assert done.rc == 0, done.err
    import sqlite3
    conn = sqlite3.connect(tmp_path / "session.sqlite")
    with conn:
        conn.execute("UPDATE fingerprints SET sha256 = 'tampered' WHERE run_id = 1 AND step = 15")
    conn.close()
    older = db_rows(tmp_path, "SELECT path FROM checkpoints WHERE run_id = 1 AND step = 7")[0][0]
    replay = tt("resume", "1", "--session", str(tmp_path), "--json",
                "--checkpoint", str(tmp_path / older))
    assert replay.rc == 0, replay.err
    assert (replay.json["resume_fingerprints_matched"],
            replay.json["resume_fingerprints_differed"]) == (7, 1)
    (step, data), = db_rows(tmp_path, "SELECT step, data FROM events "
                                      "WHERE kind = 'resume_mismatch'")
    assert step == 15 and json.loads(data)["before"] == "tampered"
    (message,), = db_rows(tmp_path, "SELECT message FROM events WHERE kind = 'resume_check'")
    assert message.startswith("resume NOT exact")


@pytest.mark.parametrize("schedule", [["lr_schedule=onecycle"],
                                      ["lr_schedule=cosine", "warmup_steps=3"]])
def test_a_run_continued_past_its_schedule_keeps_its_last_rate(tmp_path, schedule):
    """One epoch of a per-step schedule, continued for a second: the schedule is the one the
    run started (its length from the checkpoint), and the second epoch trains at its last
    rate (OneCycleLR would refuse to step past its end; a cosine would rise again)."""
    first = tt("run", "--session", str(tmp_path), "--json",
               *sets(*QUICK, "epochs=1", "log_every=1", *schedule))
    assert first.rc == 0, first.err
    more = tt("resume", "1", "--session", str(tmp_path), "--json", "--set", "epochs=2")
    assert more.rc == 0 and more.json["steps"] == 20, more.err
    lrs = [lr for (lr,) in db_rows(tmp_path, "SELECT lr FROM steps ORDER BY step")]
    assert len(lrs) == 20 and max(lrs[:10]) > 10 * lrs[9]
    assert lrs[10:] == [lrs[9]] * 10, lrs


def test_an_op_deterministic_on_refuses_is_named_in_one_line_with_the_knob():
    """PyTorch's own refusal (max_unpool1d has no deterministic implementation, on the CPU
    too) becomes the run's one-line reason, naming the op and what to set."""
    import torch
    import torch.nn.functional as F
    from tui_trainer.engine.knobs import determinism_refusal
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(RuntimeError) as raised:
            F.max_unpool1d(torch.rand(1, 1, 4), torch.tensor([[[0, 2, 4, 6]]]), 2)
    finally:
        torch.use_deterministic_algorithms(before)
    line = determinism_refusal(raised.value)
    assert line is not None and "\n" not in line
    assert line.startswith("deterministic = on refused max_unpooling")
    assert "set deterministic = warn" in line
    assert determinism_refusal(RuntimeError("CUDA out of memory")) is None


def test_a_spares_algorithm_flags_are_the_configs_inside_and_back_after():
    """The launcher's spare loads a run's kernels under that run's algorithm knobs, with
    cuDNN's heuristics choosing (engine/knobs.py `algorithms_of`, engine/cuda_start.py): in
    the block every flag is the config's, cudnn.benchmark off; after it, also when the block
    raises, every flag is what it was. Flags only: holds on both devices."""
    import torch
    from tui_trainer.core.settings import config
    from tui_trainer.engine.knobs import algorithms_of

    def flags():
        cudnn = torch.backends.cudnn
        return (torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(), cudnn.deterministic,
                cudnn.benchmark, cudnn.enabled, torch.get_float32_matmul_precision(),
                cudnn.allow_tf32)
    before = flags()
    cfg = config.from_dict({"deterministic": "warn", "cudnn_deterministic": True,
                            "cudnn_benchmark": True, "cudnn_enabled": False,
                            "float32_matmul_precision": "medium", "cudnn_allow_tf32": False})
    with pytest.raises(ValueError):
        with algorithms_of(cfg, cudnn_benchmark=False):
            assert flags() == (True, True, True, False, False, "medium", False)
            raise ValueError("the kernels' loading failed")
    assert flags() == before


@pytest.mark.parametrize("knobs", [
    {"model": "grokking"},                      # dropout (functional and a module)
    {"model": "examples", "optimizer": "sgd", "optimizer_impl": "for-loop",
     "eval_mode": "inference_mode", "train_samples": 100, "eval_samples": 300},
    {"model": "fast", "optimizer": "adam", "optimizer_impl": "fused", "amp": "bf16",
     "channels_last": True, "batch_size": 256, "eval_batch_size": 2000},
    {"model": "resnet", "optimizer": "adamw", "optimizer_impl": "foreach",
     "batch_size": 32, "eval_batch_size": 64},     # BatchNorm's buffers
], ids=["grokking", "examples-sgd", "fast-bf16-fused", "resnet"])
def test_warming_the_runs_shapes_draws_no_random_number_beside_the_setup(knobs):
    """CUDA's start warms the run's kernels (engine/cuda_start.py warm_shapes: a training
    step and an evaluation batch of the run's shapes on a net of constants) in a thread
    while the run's own thread builds its model from the seeded generator: it must draw
    nothing, or the run's initial weights would depend on the thread. Here on the CPU, the
    device whose generator model building draws from: the generator is where it was, and a
    net built beside it, thread running, has the bits of one built alone (device=cpu)."""
    import threading
    import torch
    from tui_trainer.core.settings.config import DEFAULTS
    from tui_trainer.engine.cuda_start import warm_shapes
    from tui_trainer.engine.knobs import param_fingerprint
    from tui_trainer.engine.models import build_model
    from tui_trainer.engine.optim import make_optimizer
    cfg = DEFAULTS.replace(device="cpu", **knobs)
    cpu = torch.device("cpu")
    torch.manual_seed(7)
    before = torch.get_rng_state()
    shapes = warm_shapes(cfg, cpu, 2, make_optimizer)
    assert torch.equal(torch.get_rng_state(), before)
    train_batch = min(cfg.batch_size // 2, cfg.train_samples or cfg.batch_size)
    assert shapes == (train_batch, min(cfg.eval_batch_size, cfg.eval_samples or 10**9))

    torch.manual_seed(7)
    alone = param_fingerprint(build_model(cfg.model))
    torch.manual_seed(7)
    thread = threading.Thread(target=lambda: [warm_shapes(cfg, cpu, 1, make_optimizer)
                                              for _ in range(3)])
    thread.start()
    beside = [param_fingerprint(build_model(cfg.model)) for _ in range(5)]
    thread.join(120)
    assert not thread.is_alive()
    torch.manual_seed(7)
    assert beside == [param_fingerprint(build_model(cfg.model)) for _ in range(5)]
    assert beside[0] == alone


@pytest.mark.parametrize("value", ["", "0", "yes", "\x1b[31mred"])
def test_cuda_is_started_by_the_run_unless_a_thread_is_asked_for(monkeypatch, value):
    """TUI_TRAINER_CUDA_START unset, 0 or unknown: no thread (the run starts CUDA in its own
    thread, as it reaches it); an unknown value is named in the run's log with what is
    allowed, shown as text. Nothing of CUDA is touched to decide it (any device)."""
    import torch
    from tui_trainer.core.settings.config import DEFAULTS
    from tui_trainer.engine.cuda_start import CudaStart
    from tui_trainer.engine.optim import make_optimizer
    monkeypatch.setenv("TUI_TRAINER_CUDA_START", value)
    start = CudaStart(torch.device("cuda"), DEFAULTS, 1, make_optimizer)
    assert start.thread is None
    start.join()
    said = start.said()
    if value in ("", "0"):
        assert said is None
    else:
        assert said.startswith("TUI_TRAINER_CUDA_START=") and "\x1b" not in said
        assert "is not one of shapes, handles, 0" in said
