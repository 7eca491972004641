"""Claims about CUDA: real runs on the machine's GPU (`device=cuda`), skipped cleanly where
torch sees none (conftest). On a GPU machine: `./scripts/test -m gpu` runs just these.

What each asserts is what the first run on an H100 saw (../shared/gpu/h100-2026-11-25.md):
exact resume with fp16, workers and augmentation; the defaults bit-identical; the allocator's
memory at every log point and in the dashboard; explain naming cuDNN's convolution; nproc
checked against the GPUs; memory and profile with the GPU's own time."""

from __future__ import annotations

import json

import pytest

from conftest import QUICK, cuda_count, db_rows, fingerprints, sets, tt
from tui_trainer.core.analysis import profiling
from tui_trainer.core.session.store import SessionStore

pytestmark = pytest.mark.gpu

CUDA = [*QUICK, "device=cuda"]


def _state(session, run_id: int, step: int) -> dict:
    import torch
    path = session / "checkpoints" / f"run-{run_id}" / f"step-{step:08d}.pt"
    return torch.load(path, weights_only=True)


# (first in this file: a lease whose budget cuts the gpu tests short still runs it)
def test_cuda_graph_step_replays_a_learning_step_and_a_killed_run_resumes_bit_exact(
        tmp_path):
    """cuda_graph = step: after 3 eager steps the whole step (forward with dropout, backward,
    the norm, a capturable Adam at a one-cycle rate) is captured and replayed. Killed at step
    14 and resumed, the new process runs steps 15-17 eagerly where the first replayed them,
    captures again, and every later fingerprint equals the run that never stopped. The
    replayed steps learn as the eager run does (the rate the schedule moves reaches the
    captured update), and a last batch of another shape is refused before anything runs."""
    graph = [*CUDA, "epochs=3", "optimizer=adam", "lr=0.003", "lr_schedule=onecycle",
             "fingerprint_every=5"]
    r = tt("repro", "--session", str(tmp_path), "--json", "--resume-at", "14",
           *sets(*graph, "cuda_graph=step"))
    assert r.rc == 0, r.err
    v = json.loads(r.out)
    assert v["mode"] == "resume" and v["identical"] is True, v
    straight, killed = v["runs"]
    store = SessionStore(tmp_path, create=False, readonly=True)
    assert store.run(killed)["settings"]["cuda_graph"] == "step"
    logs = [store.log_path(run).read_text() for run in (straight, killed)]
    assert "step 4 captured as CUDA graphs" in logs[0], logs[0]
    assert "step 18 captured as CUDA graphs" in logs[1], logs[1]
    # the replayed steps move the parameters at every fingerprint, and learn as eager ones
    prints = fingerprints(tmp_path, straight)
    assert len(set(prints.values())) == len(prints), prints
    r = tt("run", "--session", str(tmp_path), "--json", *sets(*graph))
    assert r.rc == 0, r.err
    eager = json.loads(r.out.strip().splitlines()[-1])["run_id"]
    ours, theirs = (db_rows(tmp_path, "SELECT step, loss FROM steps WHERE run_id = ? ORDER "
                            "BY step", (run,)) for run in (straight, eager))
    assert [s for s, _ in ours] == [s for s, _ in theirs] and ours[-1][0] == 30
    assert all(abs(a - b) <= 0.05 * max(1.0, abs(b)) for (_, a), (_, b) in zip(ours, theirs))
    same = fingerprints(tmp_path, straight) == fingerprints(tmp_path, eager)
    print(f"cuda_graph = step against off, same settings: bit-identical: {same}")
    # explain, graph run against eager run: where they part, explain's op-by-op copy of the
    # graph run reads the schedule's rate as its captured update did (DeviceRates), so each
    # side's replay gives its own run's recorded bits
    r = tt("explain", str(straight), str(eager), "--session", str(tmp_path), "--json")
    result = json.loads(r.out)
    print(f"explain, cuda_graph = step against off: {result['verdict']}")
    if same:
        assert r.rc == 0 and result["verdict"] == "identical", result
    else:
        assert r.rc == 3 and result["replay"]["reproduced"] == [True, True], result
        assert result["verdict"] in ("op", "unexplained"), result
    r = tt("run", "--session", str(tmp_path / "odd"), *sets(*graph, "cuda_graph=step",
                                                            "train_samples=650"))
    assert r.rc == 2 and "drop_last: must be true with cuda_graph = step" in r.err, r.err
    assert not (tmp_path / "odd").exists()
    # auto (fastest-gpu's) is step on CUDA, and the run records step
    r = tt("run", "--session", str(tmp_path / "auto"), *sets(*graph, "cuda_graph=auto",
                                                             "max_steps=6"))
    assert r.rc == 0, r.err
    auto = SessionStore(tmp_path / "auto", create=False, readonly=True)
    assert auto.run(1)["settings"]["cuda_graph"] == "step"
    assert "step 4 captured as CUDA graphs" in auto.log_path(1).read_text()


def test_a_cuda_run_killed_mid_epoch_resumes_bit_exact_with_fp16_workers_and_augmentation(
        tmp_path):
    """SIGKILLed at step 14 (inside epoch 2), continued from its checkpoint: every later
    fingerprint equals the run that never stopped. The checkpoint holds CUDA's generator
    states and the GradScaler's state; a resume that lost CUDA's generator state is not
    exact, and explain names that generator."""
    import torch
    knobs = [*CUDA, "epochs=3", "amp=fp16", "num_workers=2", "augment=torch"]
    r = tt("repro", "--session", str(tmp_path), "--json", "--resume-at", "14", *sets(*knobs))
    assert r.rc == 0, r.err
    v = json.loads(r.out)
    assert v["mode"] == "resume" and v["identical"] is True, v
    straight, killed = v["runs"]
    assert db_rows(tmp_path, "SELECT min(step), batch_in_epoch FROM checkpoints "
                             "WHERE run_id = ? AND step > 0", (killed,))[0] == (14, 4)
    later = {s: h for s, h in fingerprints(tmp_path, killed).items() if s > 14}
    assert later and v["fingerprints_compared"] == len(later)
    assert all(fingerprints(tmp_path, straight)[s] == h for s, h in later.items())
    store = SessionStore(tmp_path, create=False, readonly=True)
    assert store.run(killed)["settings"]["device"].startswith("cuda")
    assert store.run(killed)["settings"]["grad_scaler"] is True
    state = _state(tmp_path, killed, 14)
    cuda_rng = state["rng"]["cuda"]
    assert len(cuda_rng) == cuda_count() and all(isinstance(t, torch.Tensor) for t in cuda_rng)
    assert state["scaler"]["scale"] > 0 and "_growth_tracker" in state["scaler"]

    # the same kill, with the CUDA generator's seed in the checkpoint replaced (what a
    # checkpoint that did not keep it would do): dropout draws other masks after the resume
    session = tmp_path / "lost"
    base = [*CUDA, "max_steps=12", "fingerprint_every=5", "checkpoint_every=3"]
    assert tt("run", "--session", str(session), *sets(*base)).rc == 0
    assert tt("run", "--session", str(session), "--kill-at-step", "7", *sets(*base)).rc != 0
    path = session / "checkpoints" / "run-2" / "step-00000006.pt"
    state = torch.load(path, weights_only=True)
    seed = state["rng"]["cuda"][0].clone()           # CUDA's Philox state: seed, offset
    seed[:8] = torch.tensor(list((99).to_bytes(8, "little")), dtype=torch.uint8)
    state["rng"]["cuda"][0] = seed
    torch.save(state, path)
    assert tt("resume", "2", "--session", str(session)).rc == 0
    assert fingerprints(session, 1)[5] == fingerprints(session, 2)[5]
    assert fingerprints(session, 1)[10] != fingerprints(session, 2)[10]
    r = tt("explain", "1", "2", "--session", str(session), "--json")
    result = json.loads(r.out)
    assert r.rc == 3 and result["verdict"] == "input" and result["step"] == 7, result
    # the generator of the run's device (cuda = cuda:0), named per device (seen on the H100)
    assert result["input"] == {"item": "rng", "name": "cuda.0"}


def test_the_defaults_trained_twice_on_cuda_are_bit_identical(tmp_path):
    r = tt("repro", "--session", str(tmp_path), "--json", "--repeats", "2",
           *sets(*CUDA, "epochs=2"))
    assert r.rc == 0, r.err
    v = json.loads(r.out)
    assert v["identical"] is True and v["fingerprints_compared"] == \
        len(fingerprints(tmp_path, 1)) >= 7
    settings = SessionStore(tmp_path, create=False, readonly=True).run(1)["settings"]
    assert settings["device"].startswith("cuda") and settings["deterministic_algorithms"]
    assert settings["cudnn_deterministic"] and not settings["cudnn_benchmark"]


async def test_a_cuda_log_point_records_the_allocators_memory_and_the_dashboard_shows_it(
        tmp_path):
    """allocated, reserved and peak at every log point; the peak-memory figure is the
    allocator's peak (GPU), in the run table and as the memory plot's GPU line."""
    from tui_trainer.core.analysis import figures
    from tui_trainer.ui.app import TrainerApp
    from tui_trainer.ui.widgets.plots import MetricPlot
    r = tt("run", "--session", str(tmp_path), *sets(*CUDA, "max_steps=20"))
    assert r.rc == 0, r.err
    store = SessionStore(tmp_path, create=False, readonly=True)
    params = store.run(1)["settings"]["parameters"]
    rows = db_rows(tmp_path, "SELECT cuda_alloc, cuda_reserved, cuda_peak FROM steps")
    assert len(rows) == 10
    assert all(reserved >= peak >= alloc >= 8 * params for alloc, reserved, peak in rows), rows
    f = figures.run_figures(store, 1)
    assert f["memory_kind"] == "GPU"
    assert f["peak_memory_mib"] == max(peak for *_, peak in rows) / 2**20
    shown = figures.fmt(f["peak_memory_mib"], "peak_memory_mib")

    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=(180, 55)) as pilot:
        await pilot.app.ready()
        await app.poll_now()
        await pilot.pause()
        table = app.query_one("#runs")
        table.focus()
        await pilot.press("a")                       # every column (peak MiB among them)
        await app.poll_now()
        await pilot.pause()
        assert str(table.get_cell("1", "mem")) == f"{shown} GPU"
        await pilot.press("space")                           # mark it: its lines are drawn
        assert app.marked == [1]
        await app.poll_now()
        await pilot.pause()
        lines = app.query_one("#plot-memory", MetricPlot)._pending
        assert [s.label for s in lines] == ["1 GPU peak", "1 GPU reserved", "1 RSS peak",
                                            "1 state tensors"]
        assert not lines[0].faint and max(lines[0].ys) == max(p for *_, p in rows) / 2**20


def test_explain_names_cudnns_convolution_and_the_setting(tmp_path):
    """cudnn_enabled on vs off: both deterministic, they part at the first step, in conv1's
    forward, and the difference follows cudnn_enabled (seen on an H100: 226,537 of 368,640
    elements, at most 9.5e-07)."""
    for extra in ([], ["cudnn_enabled=false"]):
        r = tt("run", "--session", str(tmp_path), *sets(*CUDA, "max_steps=12",
                                                         "fingerprint_every=5", *extra))
        assert r.rc == 0, r.err
    r = tt("explain", "1", "2", "--session", str(tmp_path), "--json")
    result = json.loads(r.out)
    assert r.rc == 3 and result["verdict"] == "op", result
    op = result["op"]
    assert "convolution" in op["name"] and op["phase"] == "forward", op
    assert op["inputs_agree"] and op["difference"]["elements"] > 0
    assert op["why"]["follows"] == [{"key": "cudnn_enabled", "a": True, "b": False}]
    assert result["replay"]["reproduced"] == [True, True]


def test_nproc_above_the_gpus_is_refused_and_one_process_with_nccl_trains(tmp_path):
    many = cuda_count() + 1
    r = tt("run", "--session", str(tmp_path / "s"), *sets(*CUDA, f"nproc={many}"))
    assert r.rc == 2 and "nproc:" in r.err and "CUDA device(s)" in r.err, r.err
    assert not (tmp_path / "s" / "session.sqlite").exists() or \
        not db_rows(tmp_path / "s", "SELECT id FROM runs WHERE status = 'running'")
    r = tt("run", "--session", str(tmp_path), "--json",
           *sets(*CUDA, "max_steps=6", "nproc=1", "dist_backend=nccl"))
    assert r.rc == 0, r.err
    assert r.json["status"] == "finished" and r.json["steps"] == 6


def test_memory_and_profile_of_a_cuda_run_hold_the_gpus_own_figures(tmp_path):
    r = tt("run", "--session", str(tmp_path), *sets(*CUDA, "max_steps=4"))
    assert r.rc == 0, r.err
    r = tt("memory", "1", "--session", str(tmp_path), "--json")
    assert r.rc == 0, r.err
    mem = json.loads(r.out)
    assert mem["device"].startswith("cuda") and mem["categories"]["parameters"] > 0
    r = tt("profile", "1", "--steps", "3", "--warmup", "1", "--session", str(tmp_path),
           "--json")
    assert r.rc == 0, r.err
    p = json.loads(r.out)["profiles"][0]
    assert p["device"].startswith("cuda")
    # the GPU's side: kernel time in all, per kernel, and per operator that launched it
    assert p["device_ms"] > 0 and p["kernels"] and p["kernels"][0]["device_ms"] > 0
    ranked = profiling.ranked(profiling.read(p))
    assert ranked[0]["device_ms"] > 0
    assert any("convolution" in o["op"] for o in ranked[:10]), ranked[:10]
    text = "\n".join(profiling.lines(p, 1, tmp_path))
    assert "CUDA time by operator" in text and "Kernels by CUDA time" in text
    trace = profiling.trace_path(tmp_path, p)
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events)


def test_resnet_with_determinism_off_is_answered_op_by_op_and_deterministic_on_refuses(
        tmp_path):
    """The residual net on CUDA with deterministic off and cuDNN's autotuner on, trained
    twice (`repro`): the runs are identical, or explain names an op of the net that this
    machine computes two ways on identical inputs. With deterministic = on (the default) the
    stem's adaptive average pooling has no deterministic backward on CUDA: the run is refused
    at its first backward in one line naming the op and the knob. (Not yet run on a GPU.)"""
    knobs = [*CUDA, "model=resnet", "deterministic=off", "cudnn_deterministic=false",
             "cudnn_benchmark=true", "max_steps=12", "fingerprint_every=5"]
    r = tt("repro", "--session", str(tmp_path), "--json", *sets(*knobs))
    v = json.loads(r.out)
    if v["identical"]:
        assert r.rc == 0 and "explanation" not in v
    else:
        assert r.rc == 3, r.err
        e = v["explanation"]
        assert e["verdict"] in ("nondeterministic", "op"), e
        op = e["hunt"]["op"] if e["verdict"] == "nondeterministic" else e["op"]
        assert op["module"].startswith("ResNet") and op["inputs_agree"], op
        assert op["difference"]["elements"] > 0 and op["device"].startswith("cuda")
    r = tt("run", "--session", str(tmp_path), *sets(*CUDA, "model=resnet", "max_steps=3"))
    assert r.rc != 0
    failed = db_rows(tmp_path, "SELECT message FROM events WHERE kind = 'failure'")
    assert failed and "deterministic = on refused adaptive_avg_pool2d_backward_cuda" in \
        failed[-1][0], failed


def test_memory_of_a_cuda_run_keeps_the_allocators_snapshot_of_its_step(tmp_path):
    """On CUDA, `memory` records the allocator's history for the step it measures: the
    snapshot lies beside the run's log, holds the device's segments and its trace of
    allocations and frees (what https://pytorch.org/memory_viz opens), and exports copy
    it; the timeline by category is there too, its peak the breakdown's."""
    import pickle
    from tui_trainer.core.analysis import memory
    r = tt("run", "--session", str(tmp_path), *sets(*CUDA, "max_steps=4"))
    assert r.rc == 0, r.err
    r = tt("memory", "1", "--session", str(tmp_path), "--json")
    assert r.rc == 0, r.err
    b = json.loads(r.out)
    assert b["device"].startswith("cuda") and b["snapshot"].startswith("logs/run-1-memory-")
    path = tmp_path / b["snapshot"]
    with open(path, "rb") as f:          # written by the test's own run: trusted here
        snap = pickle.load(f)
    assert snap["segments"] and any(snap["device_traces"])
    actions = {e["action"] for trace in snap["device_traces"] for e in trace}
    assert {"alloc", "free_completed"} <= actions, actions
    t = memory.timeline(b)
    assert t is not None and max(sum(p[3:]) for p in t["points"]) == b["total"]
    assert "pytorch.org/memory_viz" in "\n".join(memory.lines(b))
    r = tt("export", "1", "--session", str(tmp_path), "--json")
    assert r.rc == 0, r.err
    assert any(f.endswith("run-1-memory-snapshot.pickle") for f in json.loads(r.out)["files"])


def test_cuda_graphs_train_and_a_run_killed_mid_epoch_resumes_bit_exact(tmp_path):
    """compile = reduce-overhead: the compiled forward and backward replayed as CUDA
    graphs. Killed at step 14 and resumed (its graphs captured again in the new process),
    every later fingerprint equals the run that never stopped; the setting is recorded."""
    knobs = [*CUDA, "epochs=3", "compile=reduce-overhead", "fingerprint_every=5"]
    r = tt("repro", "--session", str(tmp_path), "--json", "--resume-at", "14", *sets(*knobs))
    assert r.rc == 0, r.err
    v = json.loads(r.out)
    assert v["mode"] == "resume" and v["identical"] is True, v
    store = SessionStore(tmp_path, create=False, readonly=True)
    settings = store.run(v["runs"][1])["settings"]
    assert settings["compile"] == "reduce-overhead" and settings["device"].startswith("cuda")


CONTEXTS = """
import json, torch
from tui_trainer.engine import cuda_start
from tui_trainer.launcher import server, spare
said = cuda_start.start_cuda()
before = cuda_start.primary_contexts()
held = cuda_start.start_cuda(context=True, cudnn=CUDNN)   # TUI_TRAINER_SPARE=context's spare
made = cuda_start.primary_contexts()
untouched = torch.cuda.memory_reserved() == 0 and torch.cuda.max_memory_allocated() == 0 \
    and torch.cuda.max_memory_reserved() == 0 and torch.cuda.memory_allocated() == 0
print(json.dumps({"said": said, "before": before, "held": held, "made": made,
                  "untouched": untouched}))
"""


def _launcher_and_its_spare():
    """A warm launcher (its spares as TUI_TRAINER_SPARE says) and its spare's pid, once the
    spare has loaded cuDNN (its CUDA start under way); the caller closes the launcher."""
    from tui_trainer.launcher.client import WarmLauncher
    warm = WarmLauncher()
    warm.start()
    try:
        assert warm.wait_ready(120)
        spare = _its_spare(warm)
    except BaseException:
        warm.close()
        raise
    return warm, spare


def _its_spare(warm):
    """The launcher's spare (its only child), once it has loaded cuDNN."""
    from conftest import wait_until
    from conftest import live_children as _children
    assert wait_until(lambda: len(_children(warm._proc.pid)) == 1)
    (spare,) = _children(warm._proc.pid)
    assert wait_until(lambda: "libcudnn_engines" in open(f"/proc/{spare}/maps").read(),
                      timeout=60)
    return spare


def test_the_launchers_spare_holds_no_gpu_memory_and_gives_a_cuda_run_its_driver(
        tmp_path, monkeypatch):
    """Issue 34: the driver's spare (TUI_TRAINER_SPARE=driver: the default until the
    suspended one, named here so that a suite run under any spare checks it) has started
    CUDA's driver and loaded cuDNN before Start, without a context: nvidia-smi lists no
    process for it while it waits, and the driver's own check (which sees the context
    TUI_TRAINER_SPARE=context's spare makes) finds none. A CUDA run given it trains and
    says so in its log."""
    import os
    import subprocess
    import sys

    from conftest import wait_until
    from conftest import launch_config as _config
    from tui_trainer.core.processes.supervisor import launch, train_args
    from tui_trainer.launcher.client import SPARE_LINE
    from tui_trainer.engine.cuda_start import cublas_size_settable
    sized = ("workspace size set to 32768 KiB until Start, then the run's own"
             if cublas_size_settable() else "workspace :4096:8")
    for cudnn in (False, True):
        r = subprocess.run([sys.executable, "-c", f"CUDNN = {cudnn}\n" + CONTEXTS],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        assert got["before"] == 0 and "no CUDA context" in got["said"]
        # the context spare's context (made without the allocator), and the cudnn spare's
        # handles (whose product's and convolution's memory, cuBLAS's workspaces with it,
        # went back): the run's figures start at 0
        assert got["made"] == 1 and got["untouched"], got
        assert (f"a CUDA context, cuBLAS's ({sized}) and cuDNN's handles made"
                if cudnn else "a CUDA context made") in got["held"], got["held"]
    monkeypatch.setenv("TUI_TRAINER_SPARE", "driver")
    warm, spare = _launcher_and_its_spare()         # its CUDA started
    try:
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,"
                               "noheader"], capture_output=True, text=True, timeout=60)
        assert apps.returncode == 0 and str(spare) not in apps.stdout.split()
        with SessionStore(tmp_path) as store:
            run_id = store.create_run(_config(device="cuda"), name="given the spare")
            proc = launch(tmp_path, train_args(run_id), store.log_path(run_id), warm=warm,
                          spare="cuda")
            assert proc.pid == spare and proc.wait(timeout=180) == 0
            log = store.log_path(run_id).read_text()
        assert SPARE_LINE in log and "no CUDA context" in log, log
        assert len(fingerprints(tmp_path, run_id)) >= 4
    finally:
        warm.close()
    assert wait_until(lambda: not os.path.exists(f"/proc/{spare}"))


@pytest.mark.parametrize("mode, deterministic", [("cudnn", "on"), ("cudnn", "off"),
                                                  ("suspended", "on")])
def test_a_run_given_a_cudnn_spare_trains_the_bits_and_memory_figures_of_a_forked_one(
        tmp_path, monkeypatch, mode, deterministic):
    """TUI_TRAINER_SPARE=cudnn (asked for: the spare holds CUDA's context and cuDNN's
    handles before Start), and =suspended (the same, then moved into the spare's host memory
    by CUDA's checkpoint API, called by a helper process, the spare's child: while it waits
    the driver says it is checkpointed, holding no GPU memory, and it is restored at Start;
    the run has its CUDA suspended again before it ends, NVIDIA/cuda-checkpoint issue #53's
    workaround, and its helper ends with it): a run given it trains the bits of one
    forked at Start (the default net draws dropout masks from the device's generator), with
    the same allocated, reserved and peak memory at every log point, and its log says what
    the spare did. With deterministic off (torch's default cuBLAS workspace, where the
    spare made its handles under the deterministic one's size) the same memory figures say
    the run sized its workspace as a fresh process does: where torch can set the size the
    spare let it go at Start; elsewhere the first spare is replaced by one of the run's
    workspace (a run forked first). Bits are compared where the runs are deterministic."""
    from conftest import wait_until
    from conftest import alive as _alive, launch_config as _config, live_children as _children
    from tui_trainer.core.processes.supervisor import launch, train_args
    from tui_trainer.launcher.client import SPARE_LINE
    from tui_trainer.core.processes.cuda_checkpoint import CudaCheckpoint
    from tui_trainer.core.settings.machine import cublas_workspace
    from tui_trainer.engine.cuda_start import cublas_size_settable
    monkeypatch.setenv("TUI_TRAINER_SPARE", mode)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    warm, spare = _launcher_and_its_spare()     # (its handles follow in the same start)
    try:
        if deterministic == "off" and not cublas_size_settable():
            # this torch reads the workspace's size once: a run of torch's default is
            # forked, and the spare made with the deterministic one's size is replaced
            with SessionStore(tmp_path / "first") as store:
                cfg = _config(device="cuda", max_steps=2, deterministic="off")
                run_id = store.create_run(cfg, name="forked, the spare replaced")
                proc = launch(tmp_path / "first", train_args(run_id),
                              store.log_path(run_id), warm=warm, spare="cuda", cublas=None,
                              config=cfg)
                assert proc.pid != spare and proc.wait(timeout=180) == 0
            assert wait_until(lambda: not _alive(spare), timeout=60)
            spare = _its_spare(warm)                 # the next: the run's workspace
        helpers = set()
        if mode == "suspended":
            asked = CudaCheckpoint(spare)           # (cuInit, no context: asks the driver)
            assert wait_until(lambda: asked.state() == "checkpointed", timeout=60), \
                asked.state()
            helpers = _children(spare)              # the helper that suspended it
            assert len(helpers) == 1, helpers
        with SessionStore(tmp_path) as store:
            ids = []
            for how in ("spare", "forked"):
                cfg = _config(device="cuda", max_steps=20, fingerprint_every=5, log_every=2,
                              deterministic=deterministic)
                run_id = store.create_run(cfg, name=how)
                proc = launch(tmp_path, train_args(run_id), store.log_path(run_id),
                              warm=warm, spare="cuda" if how == "spare" else None,
                              cublas=cublas_workspace(cfg), config=cfg)
                assert (proc.pid == spare) == (how == "spare")
                assert proc.wait(timeout=180) == 0
                ids.append(run_id)
            logs = [store.log_path(r).read_text() for r in ids]
        assert SPARE_LINE in logs[0] and ("cuDNN's handles made before Start" in logs[0]
                                          if mode == "cudnn" else
                                          "suspended by CUDA's checkpoint API" in logs[0]
                                          and "restored at Start" in logs[0]
                                          and "its CUDA suspended again before it ended"
                                          in logs[0]), logs[0]
        # the kernels of the default config's shapes loaded before Start (the launcher's
        # first spare; a later one, the last run's), and a suspended spare's stack limit
        # lowered for its suspension and set back at Start
        assert "; the kernels of a run of" in logs[0] and " loaded (a training step of " \
            in logs[0], logs[0]
        assert mode != "suspended" or ("its stack limit lowered first" in logs[0] and
                                       "its stack limit set back to" in logs[0]), logs[0]
        assert SPARE_LINE not in logs[1]
        assert not any(_alive(pid) for pid in helpers), helpers    # ended with its run
        prints = [fingerprints(tmp_path, r) for r in ids]
        assert len(prints[0]) >= 4 and (prints[0] == prints[1] or deterministic == "off")
        memory = [db_rows(tmp_path, "SELECT step, cuda_alloc, cuda_reserved, cuda_peak FROM "
                          f"steps WHERE run_id = {r} ORDER BY step") for r in ids]
        assert memory[0] == memory[1] and memory[0], memory
    finally:
        warm.close()


def test_a_run_given_a_suspended_spare_and_killed_leaves_no_helper_and_resumes_bit_exact(
        tmp_path, monkeypatch):
    """TUI_TRAINER_SPARE=suspended (the default; named here so that a suite run under
    another spare checks it too): a run given the suspended spare and killed by SIGKILL at
    step 8 cannot have its CUDA suspended again before it ends (NVIDIA/cuda-checkpoint
    issue #53's workaround runs after its exit functions), so it ends as a live restored
    process. Its helper ends with it (its pipe closes), nvidia-smi
    lists neither, the GPU trains the runs after it, and the run continued from its
    checkpoint trains the bits of one that never stopped."""
    import signal
    import subprocess

    from conftest import wait_until
    from conftest import alive as _alive, launch_config as _config, live_children as _children
    from tui_trainer.core.processes.cuda_checkpoint import CudaCheckpoint
    from tui_trainer.core.settings.machine import cublas_workspace
    from tui_trainer.core.processes.supervisor import launch, train_args
    from tui_trainer.launcher.client import SPARE_LINE
    monkeypatch.setenv("TUI_TRAINER_SPARE", "suspended")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    warm, spare = _launcher_and_its_spare()
    try:
        asked = CudaCheckpoint(spare)               # (cuInit, no context: asks the driver)
        assert wait_until(lambda: asked.state() == "checkpointed", timeout=60), asked.state()
        helpers = _children(spare)
        assert len(helpers) == 1, helpers
        with SessionStore(tmp_path) as store:
            cfg = _config(device="cuda", max_steps=12, fingerprint_every=2,
                          checkpoint_every=4)
            killed = store.create_run(cfg, name="given the spare, killed")
            proc = launch(tmp_path, train_args(killed, kill_at_step=8),
                          store.log_path(killed), warm=warm, spare="cuda",
                          cublas=cublas_workspace(cfg), config=cfg)
            assert proc.pid == spare
            assert proc.wait(timeout=180) == -signal.SIGKILL
            log = store.log_path(killed).read_text()
            assert SPARE_LINE in log and "restored at Start" in log, log
            assert "its CUDA suspended again before it ended" not in log, log
            assert wait_until(lambda: not any(_alive(pid) for pid in helpers), timeout=30), \
                helpers
            apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid",
                                   "--format=csv,noheader"], capture_output=True, text=True,
                                  timeout=60)
            assert apps.returncode == 0
            assert not {str(spare), *map(str, helpers)} & set(apps.stdout.split()), apps.stdout
            straight = store.create_run(cfg, name="never stopped")
            assert launch(tmp_path, train_args(straight), store.log_path(straight),
                          warm=warm).wait(timeout=180) == 0
        r = tt("resume", str(killed), "--session", str(tmp_path), "--json")
        assert r.rc == 0, r.err
        later = {s: h for s, h in fingerprints(tmp_path, killed).items() if s > 8}
        assert later and all(fingerprints(tmp_path, straight)[s] == h
                             for s, h in later.items()), later
    finally:
        warm.close()


def test_cuda_started_beside_the_setup_changes_no_bit_and_no_memory_figure(tmp_path):
    """CUDA's start in a thread beside the run's setup (engine/cuda_start.py) with the
    handles and the run's shapes (TUI_TRAINER_CUDA_START=shapes), with the handles only,
    and as it comes (unset: the run starts CUDA in its own thread): the same bits at
    every fingerprint (the default net draws dropout masks from the device's generator), the
    same allocated, reserved and peak memory at every log point; the run's log says which
    it did."""
    import os
    import subprocess
    import sys
    args = ["run", "--session", str(tmp_path), *sets(*CUDA, "max_steps=20",
                                                     "fingerprint_every=5")]
    modes = ("shapes", "handles", None)
    for value in modes:
        env = {k: v for k, v in os.environ.items() if k != "TUI_TRAINER_CUDA_START"}
        p = subprocess.run([sys.executable, "-m", "tui_trainer", *args], capture_output=True,
                           text=True, timeout=300,
                           env={**env, **({"TUI_TRAINER_CUDA_START": value} if value else {})})
        assert p.returncode == 0, p.stderr
    runs = range(1, len(modes) + 1)
    prints = [fingerprints(tmp_path, run) for run in runs]
    assert prints[0] == prints[1] == prints[2] and len(prints[0]) >= 4
    memory = [db_rows(tmp_path, "SELECT step, cuda_alloc, cuda_reserved, cuda_peak FROM steps "
                      f"WHERE run_id = {run} ORDER BY step") for run in runs]
    assert memory[0] == memory[1] == memory[2] and memory[0], memory
    logs = [(tmp_path / "logs" / f"run-{run}.log").read_text() for run in runs]
    shapes = "CUDA's context, cuBLAS, cuDNN and the run's kernels (a training step of 64 and " \
        "an evaluation batch of 200 on a net of constants) started beside the data's loading"
    handles = "CUDA's context, cuBLAS and cuDNN started beside the data's loading"
    assert shapes in logs[0] and handles not in logs[0]
    assert handles in logs[1] and shapes not in logs[1]
    assert "beside the data's loading" not in logs[2]

