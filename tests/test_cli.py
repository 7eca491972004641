"""The headless CLI: what `run`, `resume` and `runs` print, and their exit statuses."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import QUICK, db_rows, kept_agrees, on_cuda, sets, tt, wait_for_row
from tui_trainer.core.session.store import SessionStore

REQUIRED = {"run_id", "status", "steps", "epochs", "final_loss", "train_loss", "eval_loss",
            "eval_accuracy", "samples_per_s", "wall_samples_per_s", "param_sha256",
            "checkpoint", "dataset"}


def test_run_json_describes_the_run_and_the_store_holds_everything(tmp_path):
    r = tt("run", "--session", str(tmp_path), "--name", "first", "--json",
           *sets(*QUICK, "epochs=2", "checkpoint_every=0", "keep_checkpoints=1"))
    assert r.rc == 0, r.err
    d = r.json
    assert REQUIRED <= d.keys()
    assert (d["run_id"], d["status"], d["steps"], d["epochs"]) == (1, "finished", 20, 2.0)
    assert d["dataset"] == "mnist-sample" and 0 < d["eval_accuracy"] <= 1
    assert d["final_loss"] > 0 and d["samples_per_s"] > 0
    assert Path(d["checkpoint"]).is_file() and d["checkpoint"].startswith(str(tmp_path))
    assert len(d["param_sha256"]) == 64
    # Every log point, with timing and memory; evaluations; fingerprints.
    steps = db_rows(tmp_path, "SELECT step, lr, grad_norm, samples_per_s, data_s, compute_s, "
                              "rss_bytes, cuda_alloc FROM steps ORDER BY step")
    assert [s[0] for s in steps] == list(range(2, 21, 2))
    # samples/s is training throughput (core.analysis.figures): the median logged interval rate,
    # the first (start-up) left out; the whole-run average, evaluation included, is lower.
    assert d["samples_per_s"] == pytest.approx(statistics.median(s[3] for s in steps[1:]))
    # The whole-run figure is every sample over the wall time (start-up and evaluation in).
    assert d["wall_samples_per_s"] == pytest.approx(20 * 64 / d["elapsed_s"], rel=1e-3)
    assert all(s[1] > 0 and s[2] > 0 and s[3] > 0 and s[4] >= 0 and s[5] > 0 and s[6] > 1e6
               for s in steps)
    if on_cuda(tmp_path, 1):                       # CUDA's allocator: the state at least
        params = SessionStore(tmp_path, create=False, readonly=True).run(1)["settings"][
            "parameters"]
        assert all(s[7] >= 8 * params for s in steps), steps
    else:                                          # no CUDA: no CUDA memory figures
        assert all(s[7] is None for s in steps)
    lrs = sorted({round(s[1], 8) for s in steps})
    assert lrs == [round(0.03 * 0.7, 8), 0.03]     # StepLR after the first epoch
    assert db_rows(tmp_path, "SELECT step FROM evals ORDER BY step") == [(10,), (20,)]
    assert db_rows(tmp_path, "SELECT step FROM fingerprints ORDER BY step")[-1] == (20,)
    # keep_checkpoints=1: the newest file stays, and the replay root at step 0 besides.
    files = (tmp_path / "checkpoints" / "run-1").glob("*.pt")
    assert sorted(f.name for f in files) == ["step-00000000.pt", "step-00000020.pt"]
    # The fingerprint records the effective settings and the data used.
    fp = json.loads(db_rows(tmp_path, "SELECT fingerprint FROM runs")[0][0])
    assert fp["deterministic_algorithms"] is True and fp["pin_memory"] is False
    assert fp["data"]["name"] == "mnist-sample" and fp["data"]["train_size"] == 640
    for key in ("torch", "cuda", "cudnn", "num_threads", "device_name",
                "cublas_workspace_config"):
        assert key in fp
    kinds = {k for (k,) in db_rows(tmp_path, "SELECT kind FROM events")}
    assert {"checkpoint", "eval"} <= kinds
    log = (tmp_path / "logs" / "run-1.log").read_text()
    assert "eval" in log and "finished" in log
    # Resuming the finished run trains nothing: it still reports the run's evaluation.
    again = tt("resume", "1", "--session", str(tmp_path))
    assert again.rc == 0, again.err
    assert f"eval accuracy {d['eval_accuracy']:.2%}" in again.out, again.out
    assert f"eval loss {d['eval_loss']:.4f}" in again.out, again.out


def test_runs_lists_every_run_with_status_and_figures(tmp_path):
    assert tt("run", "--session", str(tmp_path), *sets(*QUICK, "max_steps=4")).rc == 0
    assert tt("run", "--session", str(tmp_path), "--name", "second",
              *sets(*QUICK, "max_steps=6")).rc == 0
    r = tt("runs", "--session", str(tmp_path), "--json")
    rows = json.loads(r.out)
    assert [(x["run_id"], x["name"], x["status"], x["steps"]) for x in rows] == \
        [(1, "run-1", "finished", 4), (2, "second", "finished", 6)]
    table = tt("runs", "--session", str(tmp_path)).out.splitlines()
    assert table[0].split()[:4] == ["id", "name", "status", "step"]
    assert table[2].split()[:4] == ["2", "second", "finished", "6"]
    # Each finished run's figures were kept when it ended: the ones listed (issue 56).
    for run_id in (1, 2):
        kept_agrees(tmp_path, run_id)


def test_a_failure_while_training_exits_1_marks_the_run_crashed_with_its_traceback(tmp_path):
    SessionStore(tmp_path).close()
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "run-1").write_text("a file where a directory should be")
    r = tt("run", "--session", str(tmp_path), "--json", *sets(*QUICK, "checkpoint_every=3"))
    assert r.rc == 1
    assert "training failed" in r.err
    # The step-0 checkpoint is the first write into checkpoints/run-1.
    assert db_rows(tmp_path, "SELECT status, step FROM runs") == [("crashed", 0)]
    (message, data), = db_rows(tmp_path, "SELECT message, data FROM events "
                                         "WHERE kind = 'failure'")
    assert "FileExistsError" in message or "NotADirectoryError" in message
    assert "Traceback" in json.loads(data)["traceback"]
    assert "Traceback" in (tmp_path / "logs" / "run-1.log").read_text()


def test_resume_of_an_unknown_run_or_one_without_checkpoint(tmp_path):
    SessionStore(tmp_path).create_run({}, name="never-started")
    r = tt("resume", "1", "--session", str(tmp_path))
    assert r.rc == 2 and "no usable checkpoint" in r.err and "--restart" in r.err
    r = tt("resume", "9", "--session", str(tmp_path))
    assert r.rc == 2 and "no run 9" in r.err


def test_no_arguments_prints_help():
    r = tt()
    assert r.rc == 0 and "run" in r.out and "resume" in r.out


@pytest.mark.parametrize("name", ["baseline", "fastest-cpu", "fastest-gpu", "amp"])
def test_experiments_run_as_they_are(tmp_path, name):
    cfg = Path(__file__).parent.parent / "experiments" / f"{name}.toml"
    r = tt("run", "--session", str(tmp_path), "--config", str(cfg), "--json",
           "--set", "max_steps=3", "--set", "eval_samples=500")
    assert r.rc == 0, r.err
    assert r.json["steps"] == 3 and r.json["status"] == "finished"
    # what the run did is recorded: cuda_graph = auto (fastest-gpu) is step on CUDA only
    settings = SessionStore(tmp_path, create=False, readonly=True).run(1)["settings"]
    asked = tomllib.loads(cfg.read_text()).get("cuda_graph", "off")
    cuda = settings["device"].startswith("cuda")
    assert settings["cuda_graph"] == ("step" if asked != "off" and cuda else "off")


def test_ctrl_c_to_the_process_group_with_workers_stops_once_and_cleanly(tmp_path):
    """A terminal's Ctrl-C reaches the DataLoader workers too; only the trainer acts on it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tui_trainer", "run", "--session", str(tmp_path), "--json",
         *sets(*QUICK, "epochs=50", "num_workers=2", "augment=numpy")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_for_row(tmp_path, "SELECT 1 FROM runs WHERE step >= 15")
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=180)
    # Stopped, not finished: a script tells them apart by the exit status (130, as Ctrl-C).
    assert proc.returncode == 130, err
    assert json.loads(out.strip().splitlines()[-1])["status"] == "stopped"
    log = (tmp_path / "logs" / "run-1.log").read_text()
    assert log.count("SIGINT: stopping") == 1


def test_a_misspelt_key_or_command_gets_the_nearest_one_and_internal_commands_stay_hidden():
    r = tt("config", "--set", "seeed=3")
    assert r.rc == 2 and "seeed: unknown key; did you mean seed?" in r.err, r.err
    assert "cudnn_benchmark" not in r.err          # the suggestion, not all 42 keys
    r = tt("config", "--set", "colour=red")        # nothing near: every key is listed
    assert r.rc == 2 and "known keys: seed, " in r.err
    r = tt("rnu")
    assert r.rc == 2 and "did you mean run?" in r.err, r.err
    assert "worker" not in r.err and "warm" not in r.err and "resume" in r.err
    help_text = tt("--help").out
    assert " repro " in help_text and " worker " not in help_text and " warm " not in help_text


def test_every_commands_help_reads_as_written():
    """Each command's --help as argparse prints it: a percent sign is one (argparse
    formats argument help with %, not a description: a `%%` there is printed as typed)."""
    import argparse
    import contextlib
    import io
    from tui_trainer.cli import build_parser
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(sub.choices) > 10
    for name, command in {"": parser, **sub.choices}.items():
        text = command.format_help()
        assert "%%" not in text and "%(" not in text, (name, text)
    with contextlib.redirect_stdout(io.StringIO()) as out, pytest.raises(SystemExit):
        parser.parse_args(["fit", "--help"])
    assert "within ±5%, or unknown" in out.getvalue()


def test_drop_last_that_would_leave_an_epoch_empty_is_refused_in_one_line(tmp_path):
    """50 training samples in batches of 64: drop_last would drop the only batch. Refused
    before anything is kept, naming the field and what would do (holds on any device)."""
    r = tt("run", "--session", str(tmp_path), "--json",
           *sets("dataset=mnist-sample", "train_samples=50", "eval_samples=100",
                 "drop_last=true"))
    assert r.rc == 2, r.err
    said = [line for line in r.err.splitlines() if "drop_last" in line]
    assert len(said) == 1 and "leaves no batch: batch_size 64 is more than the 50 training " \
        "samples" in said[0] and "drop_last = false or a smaller batch_size" in said[0], r.err
    assert "Traceback" not in r.err
    assert not (tmp_path / "session.sqlite").exists()      # checked before the session opens


@pytest.mark.parametrize("args", [["config"], ["runs"], ["machine"]])
def test_output_into_a_closed_reader_ends_quietly_with_the_shells_status(tmp_path, args):
    """`tui-trainer runs | head`: the reader gone before the output is written; the command
    ends with no word on stderr and SIGPIPE's status (141), as `yes | head` does."""
    if args == ["runs"]:
        args = ["runs", "--session", str(tmp_path)]
        assert tt("run", "--session", str(tmp_path), *sets(*QUICK, "max_steps=2",
                                                           "device=cpu")).rc == 0
    p = subprocess.Popen([sys.executable, "-m", "tui_trainer", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()                      # the reader went away before a line was written
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and err == "", err


def test_a_cold_commands_end_says_nothing_more(tmp_path):
    """device=cpu. A command started from a shell (not forked: its interpreter ends as
    Python's do) that trained ends with its own lines only: cli._quick_end spares the end
    from walking torch's objects once more, but not where triton is loaded (torchvision
    brings it), whose nanobind bindings would then call every object still alive a leak."""
    r = subprocess.run([sys.executable, "-m", "tui_trainer", "run", "--session", str(tmp_path),
                        *sets(*QUICK, "max_steps=2", "device=cpu")], capture_output=True,
                       text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "finished: 2 steps" in r.stderr + r.stdout
    assert "leaked" not in r.stderr and "nanobind" not in r.stderr, r.stderr[-2000:]
