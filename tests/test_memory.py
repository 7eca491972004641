"""Activation checkpointing and the memory training needs: real runs of the shipped sample."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import QUICK, db_rows, fingerprints, sets, tt
from tui_trainer.core.session.store import SessionStore
from tui_trainer.core.analysis.verdicts import verdict

# 12 steps, fingerprints every 3, deterministic algorithms on.
SHORT = [*QUICK, "max_steps=12", "deterministic=on"]


def _run(session, *extra: str) -> dict:
    r = tt("run", "--session", str(session), "--json", *sets(*SHORT, *extra))
    assert r.rc == 0, r.err
    return json.loads(r.out.strip().splitlines()[-1])


def test_checkpointing_changes_memory_and_time_not_the_bits_nor_do_the_notes_knobs(
        tmp_path):
    """off, full and selective: bit-identical at every fingerprint, dropout included (the
    recomputed blocks draw the forward's masks). With preserve_rng_state off they are not,
    and the verdict names that setting. The notes' last knobs against the same base run:
    init is another start, named by the verdict; eval_mode inference_mode gives the same
    bits and evaluation as no_grad; the TF32 and cuDNN switches are applied and recorded
    (on this CPU they change no kernel)."""
    for mode in ("off", "full", "selective"):
        _run(tmp_path, f"activation_checkpointing={mode}")
    store = SessionStore(tmp_path, create=False, readonly=True)
    v = verdict(store, [1, 2, 3])
    assert v.identical and v.fingerprints_compared == len(fingerprints(tmp_path, 1)) == 5
    assert store.run(2)["settings"]["activation_checkpointing"] == "full"
    _run(tmp_path, "activation_checkpointing=full", "preserve_rng_state=false")
    v = verdict(store, [1, 4])
    assert not v.identical and v.first_difference == 3
    assert any(e.startswith("preserve_rng_state = off with activation checkpointing")
               for e in v.explanations), v.explanations
    _run(tmp_path, "init=xavier")
    _run(tmp_path, "eval_mode=inference_mode")
    _run(tmp_path, "float32_matmul_precision=high", "cudnn_allow_tf32=false",
         "cudnn_enabled=false")
    v = verdict(store, [1, 5])
    assert not v.identical and v.first_difference == 0
    assert any(e.startswith("init differs between the runs: 'default', 'xavier'")
               for e in v.explanations), v.explanations
    assert fingerprints(tmp_path, 6) == fingerprints(tmp_path, 1)
    assert store.evals(6)[-1]["loss"] == store.evals(1)[-1]["loss"]
    assert store.run(6)["settings"]["eval_mode"] == "inference_mode"
    s = store.run(7)["settings"]
    assert (s["float32_matmul_precision"], s["cudnn_allow_tf32"], s["cudnn_enabled"]) == \
        ("high", False, False)
    assert store.run(1)["settings"]["float32_matmul_precision"] == "highest"


def test_checkpointing_keeps_the_bits_with_amp_channels_last_and_accumulation(tmp_path):
    """The examples net, bf16 autocast, channels_last, two micro-batches a step: selective
    against off, bit-identical."""
    extra = ["model=examples", "amp=bf16", "channels_last=true", "grad_accum_steps=2",
             "max_steps=6"]
    _run(tmp_path, *extra)
    _run(tmp_path, *extra, "activation_checkpointing=selective")
    assert fingerprints(tmp_path, 1) == fingerprints(tmp_path, 2)


def test_memory_breaks_a_step_down_by_category_and_module_and_keeps_it(tmp_path):
    """`memory RUN`: one step of a copy of the run (the run untouched), by category and
    module; full checkpointing keeps fewer activations for backward than off."""
    from tui_trainer.core.analysis.memory import EVENT
    found = {}
    for rid, mode in ((1, "off"), (2, "full")):
        _run(tmp_path, "max_steps=4", f"activation_checkpointing={mode}")
        steps_before = db_rows(tmp_path, "SELECT count(*) FROM steps")
        r = tt("memory", str(rid), "--session", str(tmp_path), "--json")
        assert r.rc == 0, r.err
        found[mode] = json.loads(r.out)
        assert db_rows(tmp_path, "SELECT count(*) FROM steps") == steps_before
    off, full = found["off"], found["full"]
    params = SessionStore(tmp_path, create=False, readonly=True).run(1)["settings"]["parameters"]
    from tui_trainer.engine.models import build_model
    tensors = len(list(build_model("grokking").parameters()))
    for b in (off, full):
        cats = b["categories"]
        # MemTracker counts what the allocator holds: on the CPU a tensor's bytes, on CUDA
        # each block rounded up to 512 bytes (the parameters of 4 * 21,840 bytes in 8
        # tensors take 89,600); gradients and momentum as it counts their storages: within
        # 2% of that
        rounding = 512 * tensors if b["device"].startswith("cuda") else 0
        assert 4 * params <= cats["parameters"] <= 4 * params + rounding, (cats, b["device"])
        for key in ("gradients", "optimizer state"):
            assert abs(cats[key] - cats["parameters"]) <= 0.02 * 4 * params, (key, cats)
        assert b["total"] == sum(cats.values()) and b["from_checkpoint"]
        assert [m["module"] for m in b["modules"]][:3] == ["GrokkingNet", "GrokkingNet.conv1",
                                                          "GrokkingNet.conv2"]
    assert 0 < full["categories"]["activations (kept for backward)"] < \
        off["categories"]["activations (kept for backward)"]
    kept = db_rows(tmp_path, "SELECT run_id, message FROM events WHERE kind = ?", (EVENT,))
    assert [r for r, _ in kept] == [1, 2] and kept[0][1].startswith("peak ")
    printed = tt("memory", "1", "--session", str(tmp_path))
    assert printed.rc == 0 and "Tensors at the step's peak:" in printed.out
    assert "activations (kept for backward)" in printed.out and "GrokkingNet.fc1" in printed.out


def test_checkpointing_under_compile_is_named_as_a_cause():
    """Compiled, checkpointing re-partitions and re-fuses the graph (seen on this CPU: the
    compiled runs with and without it part at the first fingerprint): a verdict names it;
    eager, it is no cause."""
    from tui_trainer.core.analysis.verdicts import explain
    runs = [{"config": {"compile": c, "activation_checkpointing": a}, "settings": {}}
            for c, a in (("on", "off"), ("on", "full"))]
    assert any(r.startswith("activation checkpointing differs under compile = on")
               for r in explain(runs))
    eager = [{"config": {**r["config"], "compile": "off"}, "settings": {}} for r in runs]
    assert not any("checkpointing" in r for r in explain(eager))
    assert not any(r.startswith("compile") for r in explain(eager))
    # every compile mode is named; max-autotune's timing of kernels too
    modes = [{"config": {"compile": c}, "settings": {}} for c in ("on", "max-autotune")]
    said = [r for r in explain(modes) if r.startswith("compile = ")]
    assert len(said) == 1 and said[0].startswith("compile = max-autotune, on: generated "
                                                  "kernels") and "timing them" in said[0]


def test_the_memory_figure_counts_the_workers_and_shows_their_part(tmp_path):
    """Host memory of a run with two DataLoader workers: every log point records what the
    workers hold alone (their USS), the run's host figure is its process's RSS plus that,
    and `runs`, the run table and Compare show the workers' part; a run without workers
    has none. (On CUDA the run's figure is the GPU's, and the workers' part is host memory
    beside it.)"""
    from tui_trainer.core.session.reader import SessionReader
    from tui_trainer.ui.panels.compare import summary_rows
    from tui_trainer.ui.panels.runs import cells
    for workers in (0, 2):
        r = tt("run", "--session", str(tmp_path),
               *sets(*QUICK, f"num_workers={workers}", "max_steps=12"))
        assert r.rc == 0, r.err
    rows = {run: db_rows(tmp_path, "SELECT peak_rss, workers_uss FROM steps WHERE run_id = ? "
                                   "ORDER BY step", (run,)) for run in (1, 2)}
    assert all(w == 0 for _, w in rows[1])
    assert all(w > 1e6 for _, w in rows[2]), rows[2]        # two processes' own pages
    listed = {r["run_id"]: r for r in tt("runs", "--session", str(tmp_path), "--json").json}
    assert listed[1]["workers_mib"] is None
    workers_mib = max(w for _, w in rows[2]) / 2**20
    assert listed[2]["workers_mib"] == workers_mib
    if listed[2]["memory_kind"] == "RSS":
        assert listed[2]["peak_memory_mib"] >= max(p + w for p, w in rows[2]) / 2**20 - 1e-6
    reader = SessionReader(SessionStore(tmp_path, create=False, readonly=True))
    reader.tick()
    assert cells(reader.rows[2], False, "finished")["mem"].plain.endswith(
        f"({workers_mib:,.0f} workers)")
    assert "workers" not in cells(reader.rows[1], False, "finished")["mem"].plain
    part = [row for row in summary_rows([reader.rows[1], reader.rows[2]])
            if row[0].strip().startswith("of it, workers")]
    assert part and part[0][2] == f"{workers_mib:,.0f}"
    # and the exported points carry it
    import csv
    assert tt("export", "2", "--session", str(tmp_path)).rc == 0
    with open(tmp_path / "exports" / "run-2-steps.csv", newline="") as f:
        assert [float(r["workers_uss"]) for r in csv.DictReader(f)] == [w for _, w in rows[2]]


def test_memory_draws_the_steps_timeline_by_category_on_the_cpu_and_exports_it(tmp_path):
    """device=cpu: `memory` notes the memory by category after every operator of the step
    (MemTracker's accounting): the phases come in the order the step runs them, the
    parameters hold still, the timeline's highest point is the breakdown's peak, and the
    words say that the allocator's own history is CUDA-only. Exports carry it as CSV and
    PNG; the dashboard's memory view (b) draws it."""
    import csv
    from PIL import Image
    from tui_trainer.core.analysis import memory
    _run(tmp_path, "max_steps=4", "device=cpu")
    r = tt("memory", "1", "--session", str(tmp_path), "--json")
    assert r.rc == 0, r.err
    b = json.loads(r.out)
    t = memory.timeline(b)
    assert t is not None and b["snapshot"] is None
    phases = [p[0] for p in t["points"]]
    order = [ph for i, ph in enumerate(phases) if i == 0 or phases[i - 1] != ph]
    assert order == ["forward", "backward", "between", "optimizer", "after"], order
    params = [p[3 + t["categories"].index("parameters")] for p in t["points"]]
    assert len(set(params)) == 1 and params[0] == b["categories"]["parameters"]
    assert max(sum(p[3:]) for p in t["points"]) == b["total"]
    acts = t["categories"].index("activations (kept for backward)")
    forward = [p[3 + acts] for p in t["points"] if p[0] == "forward"]
    assert forward[0] == 0 < max(forward)            # the forward keeps activations ...
    assert t["points"][-1][3 + acts] < 1024          # ... and the step ends without them
    #                                                  (a few scalars of its own bookkeeping)
    assert any("GrokkingNet.conv1" == p[1] for p in t["points"])
    words = "\n".join(memory.lines(b))
    assert "Timeline of the step" in words and "is CUDA-only" in words
    r = tt("export", "1", "--session", str(tmp_path), "--json")
    assert r.rc == 0, r.err
    files = {Path(f).name: Path(f) for f in json.loads(r.out)["files"]}
    with open(files["run-1-memory-timeline.csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(t["points"]) and rows[0]["phase"] == "forward"
    assert int(rows[0]["parameters"]) == params[0]
    with Image.open(files["run-1-memory-timeline.png"]) as img:
        assert img.format == "PNG" and img.size == (1000, 600)
    assert "Timeline of the step" in files["run-1-memory.txt"].read_text()


def test_memory_of_a_run_that_replays_graphs_says_its_copy_stepped_op_by_op():
    """The memory command's copy follows each op; a run with cuda_graph = step replays its
    step from CUDA graphs and holds their pool: the text says which was measured."""
    from tui_trainer.core.analysis import memory
    kept = {"device": "cuda:0", "batch": 256, "world": 1, "checkpointing": "off",
            "from_checkpoint": True, "categories": {"parameters": 2**20}, "total": 2**21,
            "modules": []}
    assert not any("op by op" in line for line in memory.lines(kept))
    assert memory.lines({**kept, "graphs_replayed": True})[1].startswith(
        "Measured op by op: the run itself replays its step from CUDA graphs")
