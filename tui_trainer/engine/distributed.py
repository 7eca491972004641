"""Data-parallel runs: the launcher (torchrun, in this process) and the process group.

A run with nproc x nnodes > 1 trains as DistributedDataParallel in processes started by
PyTorch's own launcher, `torch.distributed.run` (torchrun). The process that was asked to train
the run (by the dashboard's supervisor, or `tui-trainer run` in a terminal) becomes torchrun's
agent: `launch_group` runs torchrun with the arguments core.processes.supervisor builds and
returns how each failed rank ended, so the run can be marked crashed naming the rank.

One rank's life is engine/rank.py's `run_rank` (the hidden `worker` command): rank 0 reads
the run and its checkpoint from the session and hands them to every rank, all train, only
rank 0 records.

Inside a rank, `Group` is the little the loop needs from torch.distributed: who leads (rank
0: the one process that reads and writes the session), a flag agreed by every rank, a mean
at log points, objects gathered to the lead or broadcast from it. With one process it does
no communication at all.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn, TextIO

import torch
import torch.distributed as dist


PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """A rank dies with its launcher (Linux): a SIGKILLed agent must not leave ranks training
    on their own, still writing to the session. `sig` is the signal it gets then (SIGTERM
    for a process that has something to clean up)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:                     # the launcher died before prctl took effect
        os.kill(os.getpid(), sig)


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ


# Set by launch_group in the agent's environment, which torchrun hands to its ranks: the
# agent's pid, which a rank checks against its parent (however the agent was started: the
# installed `tui-trainer` script, `python -m tui_trainer`, a fork of the warm launcher).
AGENT_ENV = "TUI_TRAINER_AGENT_PID"


@dataclass
class Group:
    """This process's place in the run: rank, world size, and the collectives of the loop."""
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    backend: str | None = None          # the backend of the gradients' all-reduce
    ddp_group: Any = None               # the process group DDP uses (None: the default)
    node_rank: int = 0
    timeout_s: float = 300.0            # the longest wait in one collective (dist_timeout)

    @property
    def lead(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def agree(self, *flags: bool) -> tuple[bool, ...]:
        """Each flag true on any rank is true on all of them afterwards (one all-reduce)."""
        if not self.active:
            return flags
        t = torch.tensor([int(f) for f in flags], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return tuple(bool(v) for v in t.tolist())

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        """The mean of a scalar tensor over the ranks (on the CPU, through the default group)."""
        if not self.active:
            return t
        c = t.detach().to("cpu", torch.float64).reshape(1).clone()
        dist.all_reduce(c)
        return (c / self.world).to(t.device, t.dtype).reshape(t.shape)

    def first_step(self, step: torch.Tensor) -> torch.Tensor:
        """The smallest non-negative value over the ranks (-1 when all are -1)."""
        if not self.active:
            return step
        big = 2**62
        c = step.detach().to("cpu", torch.int64).reshape(1).clone()
        c[c < 0] = big
        dist.all_reduce(c, op=dist.ReduceOp.MIN)
        c[c == big] = -1
        return c.to(step.device).reshape(step.shape)

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's `obj`, in rank order, on the lead; None elsewhere."""
        if not self.active:
            return [obj]
        out: list[Any] | None = [None] * self.world if self.lead else None
        dist.gather_object(obj, out, dst=0)
        return out

    def all_gather(self, obj: Any) -> list[Any]:
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """The lead's `obj`, on every rank."""
        if not self.active:
            return obj
        box = [obj if self.lead else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def settle(self, timeout_s: float = 120.0) -> None:
        """Every rank meets here before the group is torn down: a rank that destroyed its
        gloo group while rank 0 was still evaluating aborted now and then at exit
        ("terminate called without an active exception", SIGABRT). Bounded: a peer that is
        gone or late by more than `timeout_s` is let go, the run's result stands."""
        if self.active and dist.is_initialized():
            try:
                dist.monitored_barrier(timeout=timedelta(seconds=timeout_s))
            except RuntimeError:
                pass

    def close(self) -> None:
        if self.active and dist.is_initialized():
            dist.destroy_process_group()


def join_group(timeout_s: float) -> Group:
    """The process group of a rank started by torchrun (gloo for the control messages, which
    are small CPU tensors and objects); a plain Group outside torchrun. `timeout_s` bounds
    every collective (the run's dist_timeout): a rank that waits longer for a peer (hung,
    stopped, gone) fails with "Timed out waiting" instead of waiting on."""
    if not under_torchrun():
        return Group()
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    group = Group(rank=rank, world=world, local_rank=local_rank,
                  node_rank=int(os.environ.get("GROUP_RANK", "0")), timeout_s=timeout_s)
    if world > 1:
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    return group


def use_backend(group: Group, wanted: str, device: torch.device) -> None:
    """Picks the backend of the gradients' all-reduce (dist_backend: auto is nccl on CUDA,
    gloo on the CPU) and makes its group: the default gloo group already serves gloo."""
    if not group.active:
        return
    backend = wanted if wanted != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    group.backend = backend
    if backend == "nccl":
        group.ddp_group = dist.new_group(backend="nccl",
                                         timeout=timedelta(seconds=group.timeout_s))


# --- the launcher
# ------------------------------------------------------------------------------

@dataclass
class RankFailure:
    rank: int
    local_rank: int
    exitcode: int
    pid: int
    host: str
    signal: str | None         # the signal that killed it, if one did

    def describe(self) -> str:
        how = (f"was killed by {self.signal}" if self.signal
               else f"exited with status {self.exitcode}")
        return f"rank {self.rank} (pid {self.pid} on {self.host}) {how}"


STDERR_TAIL_LINES = 4
STDERR_TAIL_CHARS = 600


def stderr_tail(log_dir: Path, local_rank: int) -> str:
    """The last lines a rank wrote to stderr in its newest launch (torchrun keeps them in
    LOG_DIR/<run>/attempt_N/<local rank>/stderr.log): why it failed in its own words, a
    native abort's message included. Empty when there are none."""
    home = log_dir.resolve()
    files = [f for f in log_dir.glob(f"*/attempt_*/{local_rank}/stderr.log")
             if f.is_file() and f.resolve().is_relative_to(home)]   # a link out is not read
    if not files:
        return ""
    newest = max(files, key=lambda f: f.stat().st_mtime)
    try:
        with open(newest, "rb") as f:
            f.seek(max(0, newest.stat().st_size - 16384))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    # Python's carets under a traceback's line say nothing here.
    lines = [line.strip() for line in text.splitlines() if line.strip(" \t^~")]
    tail = " | ".join(lines[-STDERR_TAIL_LINES:])
    return tail if len(tail) <= STDERR_TAIL_CHARS else "…" + tail[-STDERR_TAIL_CHARS:]


# What a rank says when a collective failed because another rank's end closed its connection.
ENDED_FIRST = "another rank ended first"


def root_cause(failures: list[RankFailure],
               said: dict[int, str] | None = None) -> RankFailure | None:
    """The rank whose end most likely took the others down. A rank whose own last words
    (`said`, by local rank) say that another rank ended first is a consequence, whatever
    signal it died of later; among the others: one killed by a signal other than the SIGTERM
    the agent sends to the survivors, else one that exited with an error, else the first."""
    if not failures:
        return None
    said = said or {}
    own = [f for f in failures if ENDED_FIRST not in said.get(f.local_rank, "")] or failures
    killed = [f for f in own if f.signal and f.signal not in ("SIGTERM", "SIGINT")]
    return (killed or own)[0]


# What gloo says when a collective waited dist_timeout for a peer.
TIMED_OUT = "Timed out waiting"
# What it says when the rank at the other end of a connection is gone.
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def peer_lost(e: BaseException) -> str | None:
    """What a rank says, in one line instead of a traceback, when a collective failed
    because of another rank: it ended first (the cause is in its own words), or it did not
    answer within dist_timeout. None for any other failure."""
    if not isinstance(e, RuntimeError):          # gloo's errors (DistBackendError) are
        return None
    text = str(e)
    if TIMED_OUT in text:
        return ("gave up waiting for another rank: "
                + text[text.index(TIMED_OUT):].splitlines()[0])
    if any(words in text for words in PEER_GONE):
        return f"{ENDED_FIRST} (its connection closed); its own output says why"
    return None


class PeerLost(SystemExit):
    """Raised (status 1) by a rank that stopped because of another rank (peer_lost), once it
    has said so in one line and, on the lead, recorded it: run_rank then leaves at once."""


def leave_at_once(code: int) -> NoReturn:
    """How a rank whose peer is gone ends: without tearing its group down. gloo aborts now
    and then (SIGABRT, "terminate called without an active exception") when a group with a
    broken connection is destroyed, in destroy_process_group or at the interpreter's exit;
    the launcher then read the consequence's SIGABRT and named it instead of the rank that
    failed first. Nothing is left to save here (the run's log and store are closed, a rank
    other than the lead records nothing); torchrun's agent ends the rank's process group
    (its loader workers) after it."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _own_words(said: str) -> str:
    """A rank's last lines, or only the last when that is tui-trainer's one-line message
    (the whole explanation, e.g. a full disk)."""
    last = said.rsplit(" | ", 1)[-1]
    return last.removeprefix("tui-trainer: ") if last.startswith("tui-trainer: ") else said


def failure_reason(failures: list[RankFailure], log_dir: Path, nproc: int,
                   dist_timeout: int) -> str | None:
    """Why a group failed, in words, from how its ranks ended and their last lines on
    stderr: the rank that took it down, or, when a rank gave up waiting in a collective,
    that the group hung (the rank that did not answer may well have been killed after)."""
    tails = {f.local_rank: stderr_tail(log_dir, f.local_rank) for f in failures}
    cause = root_cause(failures, tails)
    if cause is None:
        return None
    said = _own_words(tails[cause.local_rank])
    if TIMED_OUT not in said:
        for f in failures:
            words = tails[f.local_rank] if f is not cause else ""
            if TIMED_OUT in words:
                cause, said = f, words
                break
    if TIMED_OUT in said:
        others = [f.describe() for f in failures if f is not cause]
        gloo = said[said.index(TIMED_OUT):].split(" | ")[0]
        return (f"the group hung: rank {cause.rank} waited {dist_timeout} s (dist_timeout) "
                f"in a collective for a rank that did not answer, and gave up (gloo: {gloo})"
                + (f"; then {', '.join(others)}" if others else ""))
    reason = cause.describe() + (
        "; the other ranks were stopped" if len(failures) > 1 or nproc > 1 else "")
    return reason + (f"; its last words: {said}" if said else "")


class _Tee:
    """Writes to the terminal and to the run's log file (the ranks' labelled lines, when the
    launcher runs in a terminal rather than with its output going to the log already)."""

    def __init__(self, a: TextIO, b: TextIO):
        self.a, self.b = a, b

    def write(self, text: str) -> int:
        for f in (self.a, self.b):
            try:
                f.write(text)
                f.flush()
            except (OSError, ValueError):
                pass
        return len(text)

    def flush(self) -> None:
        for f in (self.a, self.b):
            try:
                f.flush()
            except (OSError, ValueError):
                pass

    def isatty(self) -> bool:
        return False


def launch_group(torchrun_argv: list[str], log_file: TextIO | None = None
                 ) -> tuple[list[RankFailure], str | None]:
    """Runs torchrun (torch.distributed.run) in this process with `torchrun_argv` and waits
    for every rank. Returns (the ranks that failed, the signal that stopped the launcher
    itself, if one did). With `log_file`, what the ranks print also goes there."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.multiprocessing.api import SignalException

    args = torchrun.get_args_parser().parse_args(torchrun_argv)
    os.environ[AGENT_ENV] = str(os.getpid())
    saved = sys.stdout, sys.stderr
    if log_file is not None:
        sys.stdout, sys.stderr = _Tee(saved[0], log_file), _Tee(saved[1], log_file)
    try:
        torchrun.run(args)
        return [], None
    except ChildFailedError as e:
        failures = []
        for rank, f in sorted(e.failures.items()):
            name = None
            if f.exitcode is not None and f.exitcode < 0:
                try:
                    name = signal.Signals(-f.exitcode).name
                except ValueError:
                    name = f"signal {-f.exitcode}"
            failures.append(RankFailure(rank=rank, local_rank=f.local_rank,
                                        exitcode=f.exitcode, pid=f.pid,
                                        host=socket.gethostname(),
                                        signal=name))
        return failures, None
    except SignalException as e:
        return [], signal.Signals(e.sigval).name
    finally:
        sys.stdout, sys.stderr = saved
