"""`tui-trainer profile`: where a run's step time goes, operator by operator; real runs of the
shipped sample, a real torch.profiler, the trace file read back."""

from __future__ import annotations

import json

from conftest import QUICK, db_rows, sets, tt
from tui_trainer.core.analysis import profiling
from tui_trainer.core.settings import hardware
from tui_trainer.core.session.export import export_runs
from tui_trainer.core.session.store import SessionStore


def test_profile_of_a_pair_by_operator_phase_module_and_memory_with_its_trace_and_diff(
        tmp_path):
    for extra in ([], ["amp=bf16"]):
        r = tt("run", "--session", str(tmp_path), "--json", *sets(*QUICK, "max_steps=4", *extra))
        assert r.rc == 0, r.err
    steps_before = db_rows(tmp_path, "SELECT count(*) FROM steps")
    r = tt("profile", "1", "2", "--steps", "2", "--warmup", "1", "--session", str(tmp_path),
           "--json")
    assert r.rc == 0, r.err
    out = json.loads(r.out)
    assert db_rows(tmp_path, "SELECT count(*) FROM steps") == steps_before   # runs untouched
    a, b = out["profiles"]
    for p in (a, b):
        selfs = [o["self_ms"] for o in p["ops"]]
        assert selfs == sorted(selfs, reverse=True) and selfs[0] > 0
        assert 0.5 < sum(o["share"] for o in p["ops"]) <= 1.0 + 1e-9
        # the convolutions are among what the device spends most on: the CPU's self time,
        # or on CUDA the GPU time of the kernels each operator launched. Not so for bf16 on
        # a CPU that emulates it (AVX2 only: issue 65, where this failed): there the casts
        # and the emulated bf16 arithmetic lead, and the casts are what it spends most on
        top = [o["op"] for o in profiling.ranked(profiling.read(p))[:10]]
        emulated = p is b and p["device"] == "cpu" and not hardware.this_cpu().bf16
        # (a convolution by any kernel's name: aten::convolution, mkldnn_convolution, or
        # _slow_conv2d_forward where oneDNN has no kernel for the dtype at the CPU's ISA)
        assert any(("to_copy" if emulated else "conv") in op for op in top), top
        if p["device"].startswith("cuda"):
            assert p["device_ms"] > 0 and p["kernels"][0]["device_ms"] > 0
            # the operators' own kernel time partitions the kernels' (on the H100 it summed
            # to 1.8% over: the profiler's self times of the scopes left out, the modules'
            # record_function ranges, need not add up exactly)
            assert sum(o["device_ms"] for o in p["ops"]) <= p["device_ms"] * 1.05
        else:
            assert p["device_ms"] is None and p["kernels"] == []
        assert all(o["calls"] > 0 for o in p["ops"])
        assert p["phases_ms"]["forward"] > 0 and p["phases_ms"]["backward"] > 0
        # the phases are the engine's clock over the profiled steps: they fit in a step
        assert sum(p["phases_ms"].values()) <= p["wall_ms"] * 1.02
        assert {"conv1", "conv2", "fc1"} <= {m["module"] for m in p["modules"]}
        assert p["memory"]["categories"]["parameters"] > 0 and p["from_checkpoint"]
        trace = profiling.trace_path(tmp_path, p)
        assert trace is not None and trace.parent == tmp_path / "logs"
        events = json.loads(trace.read_text())["traceEvents"]
        assert any(str(e.get("name", "")).startswith("aten::") for e in events)
    # bf16's autocast casts: operators B has that A has not, or much more of them
    diff = out["diff"]
    changes = [abs(d["change_ms"]) for d in diff]
    assert changes == sorted(changes, reverse=True)
    # (counted by calls: two profiled steps' self times swap places on a loaded machine)
    casts = [sum(o["calls"] for o in p["ops"] if "to_copy" in o["op"]) for p in (a, b)]
    assert casts[1] > casts[0], casts
    assert any("to_copy" in d["op"] and d["b_ms"] for d in diff)
    kept = db_rows(tmp_path, "SELECT run_id FROM events WHERE kind = ?", (profiling.EVENT,))
    assert kept == [(1,), (2,)]
    text = "\n".join(profiling.lines(a, 1, tmp_path))
    assert "Operators by self time" in text and "By phase (ms per step): data" in text
    assert f"ui.perfetto.dev): {profiling.trace_path(tmp_path, a)}" in text
    assert "Operators whose self time changed most, 1 -> 2" in \
        profiling.diff_lines(a, b, ids=(1, 2))[0]
    # At 78 columns (the tab at 80x24) the tables fit, the names cut; a figure as wide as
    # its column keeps a space before it (issue 55: "64.33184.70x").
    wide = {**b, "ops": [{**o, "self_ms": o["self_ms"] * 300} for o in b["ops"]]}
    table = [x for x in profiling.diff_lines(a, wide, ids=(1, 2), width=78)[1:]
             if x.startswith("  ")]
    assert table and all(len(x) <= 78 for x in table), table
    for row in table[1:]:
        cells = row[2 + profiling.name_width(78, 4):]
        assert len(cells.split()) == 4 and all(cells[i] == " " for i in (0, 9, 18, 27)), row
    assert all(len(x) <= 78 for x in profiling.lines(a, 1, None, 78) if x.startswith("  "))
    # ctrl+e's export carries the words and the trace; a kept path that leads out of the
    # session (a hostile or foreign session) is not followed, and damage is said
    with SessionStore(tmp_path, create=False) as store:
        written = {p.name for p in export_runs(store, [1], tmp_path / "export")}
        assert {"run-1-profile.txt", "run-1-profile-trace.json"} <= written
        store.add_event(1, profiling.EVENT, "hostile", data={**a, "trace": "../../etc/hostname"})
        store.add_event(2, profiling.EVENT, "damaged", data={"ops": "x", "steps": 2})
        written = {p.name for p in export_runs(store, [1], tmp_path / "export2")}
        assert "run-1-profile.txt" in written and "run-1-profile-trace.json" not in written
        # the damaged one is passed over: the newest that reads is the real one
        assert profiling.newest(store.events(2, (profiling.EVENT,))) == profiling.read(b)
    assert profiling.lines({"ops": "x"}) == ["the profile kept cannot be read (damaged)"]


def test_a_profile_of_a_run_that_replays_graphs_says_its_copy_stepped_op_by_op():
    """The profile's copy runs each op (its modules are timed by hooks); a run with
    cuda_graph = step replays its step from CUDA graphs: the text says which it profiled."""
    kept = {"steps": 3, "warmup": 1, "device": "cuda:0", "batch": 256, "from_step": 4,
            "wall_ms": 2.0, "self_ms": 1.0,
            "ops": [{"op": "aten::mm", "self_ms": 1.0, "calls": 3, "share": 1.0}]}
    assert not any("op by op" in line for line in profiling.lines(kept))
    text = profiling.lines({**kept, "graphs_replayed": True})
    assert text[1].startswith("Profiled op by op: the run itself replays its step from CUDA "
                              "graphs (cuda_graph = step)")


def test_a_profile_taken_on_a_busy_machine_says_so(tmp_path):
    """Other processes taking every core while the steps are profiled: the profile keeps what
    else the machine did, its words and the pair's diff say the times are the load's; a kept
    record of the machine that is no record reads as none (device=cpu: a CPU step is what a
    busy CPU slows)."""
    import os
    import subprocess
    import sys
    r = tt("run", "--session", str(tmp_path), "--json",
           *sets(*QUICK, "device=cpu", "max_steps=4"))
    assert r.rc == 0, r.err
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 2)]
    try:
        r = tt("profile", "1", "1", "--steps", "6", "--warmup", "1", "--session",
               str(tmp_path), "--json")
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert r.rc == 0, r.err
    a, b = json.loads(r.out)["profiles"]
    assert a["machine"]["others_cores"] > 0.2, a["machine"]
    words = profiling.lines(a, 1)
    assert words[1].startswith("Profiled on a busy machine (others "), words
    assert "(the machine was busy while 1 and 1 were profiled: a change may be the load's)" \
        in profiling.diff_lines(a, b, ids=(1, 1))[0]
    for hostile in ("x", {"others_cores": "9", "wall_s": 1}, {"others_cores": -3.0,
                                                               "wall_s": 1.0}):
        p = profiling.read({**a, "machine": hostile})
        assert p["machine"] is None and profiling.busy(p) is None
