"""core.settings.machine: whether this machine can train a config, judged without importing torch,
and the probe that gets the facts from a child process."""

from __future__ import annotations

import json

import pytest

from conftest import QUICK, sets, tt
from tui_trainer.core.settings import machine

CPU = machine.Machine(torch="2.x", cuda=False)
TWO_GPUS = machine.Machine(torch="2.x", cuda=True, cuda_devices=2, cuda_names=("H100", "H100"))


def problem(m: machine.Machine, **config) -> tuple[str, str] | None:
    found = machine.problem({"dataset": "synthetic", **config}, m)
    return None if found is None else (found.key, found.reason)


def test_devices_this_machine_lacks_are_refused_naming_the_key_and_what_to_use():
    assert problem(CPU, device="cpu") is None and problem(CPU, device="auto") is None
    key, reason = problem(CPU, device="cuda")
    assert key == "device" and "no usable CUDA" in reason and "device = cpu or auto" in reason
    assert problem(TWO_GPUS, device="cuda:1") is None
    key, reason = problem(TWO_GPUS, device="cuda:2")
    assert key == "device" and "2 CUDA device(s): cuda:0 to cuda:1" in reason
    assert problem(CPU, device="mps")[0] == "device"
    assert machine.device_type("auto", TWO_GPUS) == "cuda"
    assert machine.device_type("auto", machine.Machine(mps=True)) == "mps"


def test_fp16_needs_cuda_and_bf16_does_not():
    key, reason = problem(CPU, amp="fp16")
    assert key == "amp" and "bf16" in reason
    assert problem(CPU, amp="bf16") is None
    assert problem(TWO_GPUS, amp="fp16", device="auto") is None
    assert problem(TWO_GPUS, amp="fp16", device="cpu")[0] == "amp"


def test_cuda_graphs_need_cuda_and_the_other_compile_modes_do_not():
    key, reason = problem(CPU, compile="reduce-overhead")
    assert key == "compile" and "CUDA graphs" in reason and "use compile = on" in reason
    assert problem(CPU, compile="max-autotune") is None and problem(CPU, compile="on") is None
    assert problem(TWO_GPUS, compile="reduce-overhead", device="auto") is None
    assert problem(TWO_GPUS, compile="reduce-overhead", device="cpu")[0] == "compile"
    # cuda_graph: step asks for CUDA; auto captures where the device is CUDA, else not
    key, reason = problem(CPU, cuda_graph="step")
    assert key == "cuda_graph" and "use cuda_graph = off" in reason
    assert problem(CPU, cuda_graph="auto") is None
    assert problem(TWO_GPUS, cuda_graph="step", device="auto") is None


@pytest.mark.parametrize("config, device", [
    ({}, "auto"), ({"device": "auto"}, "auto"), ({"device": "cuda"}, "cuda"),
    ({"device": "cuda:1"}, "cuda:1"), ({"device": "cpu"}, None), ({"device": "mps"}, None),
    ({"device": "auto", "nproc": 2}, None), ({"device": "cuda", "nnodes": 2}, None),
    ({"device": "cuda", "nproc": "two"}, "cuda"),    # a damaged config: read as one process
    (["device", "cuda"], None), (None, None)])
def test_a_run_starts_cuda_itself_only_on_auto_or_cuda_in_one_process(config, device):
    """Which runs the warm launcher may give its spare (which started CUDA's driver), and
    on which device: a group's agent leaves CUDA to its ranks, a CPU run never starts it."""
    assert machine.cuda_device(config) == device


def test_a_dataset_that_is_not_on_disk_is_refused_before_a_run_exists(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "FASHION_SYSTEM_DIR", tmp_path / "no-system-copy")
    key, reason = problem(CPU, dataset="fashion-mnist", data_dir=str(tmp_path))
    assert key == "dataset" and "apt-get install dataset-fashion-mnist" in reason
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for name in machine.IDX_FILES:
        (raw / f"{name}.gz").write_bytes(b"")
    assert problem(CPU, dataset="fashion-mnist", data_dir=str(tmp_path)) is None
    # Full MNIST missing: refused offline; online it may still be downloaded.
    monkeypatch.setenv("TUI_TRAINER_OFFLINE", "1")
    assert problem(CPU, dataset="mnist", data_dir=str(tmp_path))[0] == "dataset"
    monkeypatch.delenv("TUI_TRAINER_OFFLINE")
    assert problem(CPU, dataset="mnist", data_dir=str(tmp_path)) is None
    # The shipped sample is always there.
    monkeypatch.setenv("TUI_TRAINER_OFFLINE", "1")
    assert problem(CPU, dataset="mnist-sample", data_dir=str(tmp_path)) is None
    afile = tmp_path / "a-file"
    afile.write_text("x")
    key, reason = problem(CPU, dataset="mnist-sample", data_dir=str(afile))
    assert key == "data_dir" and "is a file" in reason


def test_the_probe_reports_what_torch_sees_in_a_child_process():
    import torch
    m = machine.probe()
    assert m.torch == torch.__version__
    assert m.cuda == torch.cuda.is_available()
    assert m.cuda_devices == (torch.cuda.device_count() if m.cuda else 0)


def test_the_machine_command_checks_a_config(tmp_path):
    r = tt("machine", "--json", "--set", "device=cpu", "--set", "dataset=mnist-sample")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["problem"] is None
    r = tt("machine", "--set", "amp=fp16", "--set", "device=cpu")
    assert r.rc == 2 and "amp: fp16 needs a CUDA device" in r.err


def test_a_run_on_the_cpu_never_asks_cuda(tmp_path):
    """device = cpu: the run, its checks and its setup never ask torch about CUDA (asking
    starts CUDA's driver: time, and a socket to its daemon, in a run that does not use it).
    A tripwire on torch's two questions, in a real run of a few steps (any machine)."""
    import subprocess
    import sys
    code = ("import sys, torch\n"
            "def asked(*a, **k):\n"
            "    raise SystemExit('a run on the CPU asked torch about CUDA')\n"
            "torch.cuda.is_available = torch.cuda.device_count = asked\n"
            "from tui_trainer.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    p = subprocess.run([sys.executable, "-c", code, "run", "--session", str(tmp_path),
                        *sets(*QUICK, "device=cpu", "max_steps=4")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "asked torch about CUDA" not in p.stderr
