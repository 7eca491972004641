"""Starting, stopping and continuing runs as background processes.

Each run trains in its own process (`tui-trainer run --run-id N` or `tui-trainer resume N`),
in a process session of its own, with stdout and stderr going to the run's log file: the
dashboard never shares a GIL with training, a crash in training cannot take it down, and
runs keep training after the dashboard quits (it reattaches through the session store).

Core layer: imports neither torch nor textual.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Protocol, Sequence

from ..settings import fit, machine, user_data, user_models
from . import gpus, trust
from ..errors import EXIT_BAD_INPUT, NotFound
from ..settings.config import world_size
from .liveness import is_live, process_alive, starting
from ..session.store import SessionStore

# How the tool's processes share the CPU (issue 54). On Linux each process session is a
# scheduling group (autogroup): the scheduler shares the CPU between groups first, as
# equals, and a nice value ranks a process only among the processes of its own group. The
# runs the dashboard starts stay in the dashboard's session (the launcher and each run a
# process group of their own, out of the terminal's reach), at nice 19: below the dashboard
# within its group, so its keys answer however many train (a run takes what the dashboard
# leaves of the group's share, all of it while no key is pressed), and as a group equal to
# any other program of the machine. Before, each run led a session of its own whose group
# was niced to 10 against the whole machine: beside one busy program a run got a tenth of
# a core (185 samples/s where the same run typed into a shell had 1,454). A study or a run
# started from a shell is not niced: no dashboard to answer for. Where sessions are not
# the scheduler's groups (autogroup off, or a cgroup with the CPU controller above the
# process), a nice value would rank runs below everything else: nothing is niced there.
TRAINING_NICE = 19


def ranked_by_session(proc: Path = Path("/proc"), cgroups: Path = Path("/sys/fs/cgroup")
                      ) -> bool:
    """Whether Linux's autogroup decides how this process's session shares the CPU: it is
    on, this session has an autogroup of its own (not the root group that every process
    without one shares: the kernel then writes nothing in /proc/self/autogroup, as in CI's
    containers), and no cgroup of this process's own has the CPU controller (a cgroup v1
    `cpu` hierarchy, or a v2 parent that delegates `cpu`: systemd's user slices may).
    (`proc`, `cgroups`: where the kernel's files are read from.)"""
    try:
        if (proc / "sys/kernel/sched_autogroup_enabled").read_text().strip() != "1" \
                or "nice" not in (proc / "self/autogroup").read_text():
            return False      # (an empty file: this session is in the machine's root group)
        for line in (proc / "self/cgroup").read_text().splitlines():
            _, controllers, where = line.split(":", 2)
            if where in ("", "/"):
                continue
            if controllers and "cpu" in controllers.split(","):
                return False
            if not controllers:           # v2: the cpu controller, if the parent enables it
                parent = Path(str(cgroups) + where).parent
                if "cpu" in (parent / "cgroup.subtree_control").read_text().split():
                    return False
    except (OSError, ValueError):
        return False
    return True


def dashboard_nice() -> int:
    """The nice value of the runs the dashboard starts (TRAINING_NICE where it ranks them
    only among the dashboard's own session, else 0)."""
    return TRAINING_NICE if ranked_by_session() else 0


# How torch's idle OpenMP threads wait (GNU OpenMP, which torch's CPU ops run on): spinning
# GOMP_SPINCOUNT times, then asleep. libgomp spins 300,000 times by default; beside another
# busy program the spinning thread holds a core while the thread it waits for shares the
# other one with that program, and every parallel region waits for that thread's turn:
# 2 threads beside one busy program on 2 cores trained 218 samples/s, against 2,400 with
# 1,000 spins (docs/benchmarks.md, issue 54). It decides only how a thread waits, never what
# it computes: the bits are the same. Read by libgomp when torch loads it, so it is in the
# environment of every process the tool starts (and of the `tui-trainer` command itself,
# before a command imports torch); a user's own GOMP_SPINCOUNT or OMP_WAIT_POLICY wins.
THREAD_WAIT = {"GOMP_SPINCOUNT": "1000"}


def niced(nice: int) -> list[str]:
    """The command prefix that starts a process at `nice` (nothing for 0)."""
    which = shutil.which("nice")
    return [which, "-n", str(nice)] if nice and which else []


def thread_wait_env(environ: Any = None) -> dict[str, str]:
    """THREAD_WAIT, or nothing where `environ` (os.environ) says how threads wait already."""
    environ = os.environ if environ is None else environ
    if "GOMP_SPINCOUNT" in environ or "OMP_WAIT_POLICY" in environ:
        return {}
    return dict(THREAD_WAIT)


OWNER_ENV = "TUI_TRAINER_OWNER"     # "PID START": the process whose end ends this one


def owner_env() -> dict[str, str]:
    """For a child that must not outlive this process (a study's or a check's run)."""
    return {OWNER_ENV: f"{os.getpid()} {trust.start_time(os.getpid()) or 0}"}


_owner: list[tuple[int, int]] = []     # (pid, start time) of this process's owner, if any


def owner() -> int | None:
    """The pid of the process that started this one with `owner_env` (a study, a check),
    while that same process lives; None otherwise."""
    if _owner and trust.same_process(_owner[0][0], _owner[0][1] or None):
        return _owner[0][0]
    return None


def watch_owner(poll_s: float = 0.5) -> None:
    """In a child started with `owner_env`: once that owner is gone (a study killed with
    SIGKILL: its runs, forked by a launcher or started cold, would train on as orphans, and
    a continued study would time its next run beside them), this process gets SIGTERM and
    stops as asked, with its checkpoint. A daemon thread; nothing without the variable."""
    value = os.environ.pop(OWNER_ENV, "")
    try:
        pid, started = (int(x) for x in value.split())
    except ValueError:
        return
    if pid <= 0 or pid == os.getpid():
        return
    _owner[:] = [(pid, started)]

    def watch() -> None:
        while trust.same_process(pid, started or None):
            time.sleep(poll_s)
        print(f"tui-trainer: the process that started this run (pid {pid}) has ended; "
              "stopping", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    import threading
    threading.Thread(target=watch, name="owner-watch", daemon=True).start()


def _terminate(pid: int | None) -> bool:
    """SIGTERM: the process finishes its step, writes a checkpoint and exits."""
    if not pid:
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    return True


def stop_target(run: dict[str, Any]) -> int:
    """The process that Stop signals for a live run: the run's own process; for a
    data-parallel run, torchrun's agent that started its ranks on this machine (the parent
    of rank 0, which the session names, when it is ours). The agent passes SIGTERM to every
    rank (they agree on a step, checkpoint and end) and kills those that have not ended
    STOP_GRACE_S later, so a group stuck in a collective ends too. Rank 0 itself when
    there is no such agent (its launcher gone)."""
    pid = run["pid"]
    if world_size(run.get("config") or {}) > 1 and run.get("host") == socket.gethostname():
        agent = trust.parent_of(pid)
        if agent is not None and agent > 1 and agent != os.getpid() and trust.owned(agent):
            return agent
    return pid


def exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"its process was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"its process was killed by signal {-code}"
    return f"its process exited with status {code}"


# --- child commands: built here and nowhere else
# -----------------------------------------------

def train_args(run_id: int, kill_at_step: int | None = None, new: bool = False) -> list[str]:
    """Trains run `run_id` (created in the session already) from step 0 (`new`: a refusal
    before its first step removes it, lifecycle.start_created)."""
    args = ["run", "--run-id", str(run_id)] + (["--new"] if new else [])
    return args + (["--kill-at-step", str(kill_at_step)] if kill_at_step is not None else [])


def resume_args(run_id: int, overrides: dict[str, Any] | None = None,
                restart: bool = False) -> list[str]:
    """Continues run `run_id` from its newest usable checkpoint (or from step 0, `restart`);
    `overrides` may only change how long it trains (epochs, max_steps)."""
    args = ["resume", str(run_id)] + (["--restart"] if restart else [])
    for key, value in (overrides or {}).items():
        args += ["--set", f"{key}={value}"]
    return args


def repro_args(run_id: int, resume_at: int | None = None) -> list[str]:
    """A determinism verdict of run `run_id` (a twin trained again), or with `resume_at` a
    resume check (a twin killed at that step and resumed)."""
    args = ["repro", "--run", str(run_id), "--json"]
    return args + (["--resume-at", str(resume_at)] if resume_at is not None else [])


def explain_args(a: int, b: int) -> list[str]:
    """Explains where runs A and B part; the answer is kept in the session."""
    return ["explain", str(a), str(b), "--json"]


def study_args(study_id: int, then: Sequence[int] = ()) -> list[str]:
    """Trains the planned study `study_id`, its runs one after the other (then, once it
    has finished, each study of `then` in turn)."""
    return ["ab", "--study", str(study_id), *(a for t in then for a in ("--then", str(t)))]


def worker_args(session: Path | None, run_id: int | None, *, checkpoint: Path | None = None,
                overrides: dict[str, Any] | None = None, events: list | None = None,
                kill_at_step: int | None = None) -> list[str]:
    """What every rank of a data-parallel run runs (`tui-trainer worker`, started by
    torchrun). Only node 0's ranks get the session; rank 0 reads the run from it and hands
    the config and checkpoint to the others."""
    args = ["worker"]
    if session is not None:
        args += ["--session", str(session), "--run-id", str(run_id)]
    if checkpoint is not None:
        args += ["--checkpoint", str(checkpoint)]
    for key, value in (overrides or {}).items():
        args += ["--set", f"{key}={value}"]
    if events:
        args += ["--events", json.dumps(events)]
    if kill_at_step is not None:
        args += ["--kill-at-step", str(kill_at_step)]
    return args


RENDEZVOUS_S = 300     # how long the nodes of a run wait for one another
# How long a data-parallel run's processes have to stop with their checkpoint once asked
# (Stop, a signal to its launcher); torchrun kills the ones still there after it: a rank
# waiting in a collective for a hung peer never gets to see the signal.
STOP_GRACE_S = 15


TORCHRUN_GRACE_S = 30   # torchrun's own grace, where it has no --shutdown-timeout


def stop_grace_s() -> int:
    """How long a data-parallel run's processes have once asked to stop, here."""
    return STOP_GRACE_S if torchrun_knows("--shutdown-timeout") else TORCHRUN_GRACE_S


@functools.lru_cache(maxsize=None)
def torchrun_knows(flag: str) -> bool:
    """Whether this machine's torchrun takes `flag` (read from its source, torch not
    imported): torch 2.11's has no --shutdown-timeout, and refused the whole command."""
    import importlib.util
    try:
        spec = importlib.util.find_spec("torch")
        where = spec.submodule_search_locations if spec is not None else None
        text = (Path(list(where)[0]) / "distributed" / "run.py").read_text() if where else ""
    except (ImportError, OSError, ValueError, IndexError):
        return False
    return f'"{flag}"' in text


def rank_label(rank: int) -> str:
    """How a rank's output lines are labelled in a run's log: "[rank N] " where torchrun
    takes a prefix template; torch 2.11's has none (it refused the whole command on the
    H100 machine) and labels them with its own "[default<local rank>]:"."""
    return f"[rank {rank}] " if torchrun_knows("--log-line-prefix-template") \
        else f"[default{rank}]:"


def torchrun_args(nproc: int, nnodes: int, endpoint: str, worker: list[str], log_dir: Path,
                  node_rank: int = 0, rendezvous_s: int = RENDEZVOUS_S) -> list[str]:
    """torchrun's command line for one data-parallel run: nproc processes here; on one
    machine a standalone rendezvous on a free port, across machines a static one at
    `endpoint` on node 0 (node ranks fixed, so rank 0 is on the machine with the session).
    Every rank's output is labelled [rank N] and kept per rank under `log_dir`; no restarts
    (a failed rank ends the run, which is then continued from its checkpoint). A torchrun
    without --shutdown-timeout (torch 2.11) keeps its own grace (TORCHRUN_GRACE_S), one
    without --log-line-prefix-template its own labels (`rank_label`)."""
    grace = ["--shutdown-timeout", str(STOP_GRACE_S)] if stop_grace_s() == STOP_GRACE_S \
        else []
    args = ["--nproc-per-node", str(nproc), "--nnodes", str(nnodes), "--max-restarts", "0",
            *grace, "--tee", "3", "--log-dir", str(log_dir)]
    if torchrun_knows("--log-line-prefix-template"):
        args += ["--log-line-prefix-template", "[rank ${rank}] "]
    if nnodes == 1 and not endpoint:
        args.append("--standalone")
    else:
        args += ["--rdzv-backend", "static", "--rdzv-endpoint", endpoint,
                 "--node-rank", str(node_rank), "--rdzv-conf", f"timeout={rendezvous_s}"]
    return args + ["-m", "tui_trainer", *worker]


class Forker(Protocol):
    """A warm launcher as launch() uses it: launcher/client.py's WarmLauncher, which forks a
    run from a process that has imported torch already (core does not import it: the
    launcher's wing sits above the engine)."""
    nice: int

    def ready(self) -> bool: ...

    def env(self) -> dict[str, str]: ...

    def spawn(self, args: list[str], stdout: int, stderr: int, detach: bool,
              env: dict[str, str], out: int | None = None, spare: str | None = None,
              cublas: str | None = None, config: dict[str, Any] | None = None) -> Any: ...


# A run's process: a cold start's subprocess.Popen, or what a Forker forked
# (launcher/client.py's WarmChild, used alike: pid, poll, wait, send_signal, communicate).
Process = Any


def launch(session: Path, args: list[str], log_path: Path, *, detach: bool = True,
           capture: bool = False, warm: Forker | None = None,
           env: dict[str, str] | None = None, spare: str | None = None,
           cublas: str | None = None, config: dict[str, Any] | None = None
           ) -> Process:
    """The one way a child `tui-trainer` process starts: `python -m tui_trainer ARGS
    --session SESSION`, stdin closed, output appended to `log_path` (with `capture`, stdout
    comes back to the caller and only stderr goes to the log), unbuffered, at the nice
    value of `warm` (the dashboard's launcher: dashboard_nice(); see above). `detach` puts
    it in a process group of its own, in the caller's session and so in its scheduling
    group: it outlives the dashboard, and the terminal's signals (Ctrl-C, a hang-up) reach
    only the terminal's foreground group. With a ready `warm` launcher the process is
    forked from it (no imports to wait for), else started cold. `env` adds to the
    environment the process gets. `spare`: the device setting of a
    run that starts CUDA (core.settings.machine.cuda_device), which the launcher may give the spare
    it keeps; `cublas`: the cuBLAS workspace that run sets for itself
    (core.settings.machine.cublas_workspace); `config`: that run's config (a dict: which spare suits
    it, and which the next spares are made for)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = [*args, "--session", str(session)]
    env = {**os.environ, **thread_wait_env(), "PYTHONUNBUFFERED": "1",
           **(warm.env() if warm else {}), **(env or {})}
    if warm is not None and warm.ready():
        with open(log_path, "ab") as log:
            if capture:
                read_end, write_end = os.pipe()
                child = warm.spawn(argv, write_end, log.fileno(), detach, env, out=read_end,
                                   spare=spare, cublas=cublas, config=config)
                os.close(write_end)
                if child is None:
                    os.close(read_end)
            else:
                child = warm.spawn(argv, log.fileno(), log.fileno(), detach, env,
                                   spare=spare, cublas=cublas, config=config)
        if child is not None:
            return child
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [*niced(warm.nice if warm is not None else 0), sys.executable, "-m",
             "tui_trainer", *argv],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if capture else log,
            stderr=log if capture else subprocess.STDOUT, text=capture,
            process_group=0 if detach else None, env=env)


REFUSAL = re.compile(r"^(?:\[rank \d+\] )?tui-trainer: (.*)$")    # a process's refusal


class Supervisor:
    def __init__(self, store: SessionStore, warm: Forker | None = None):
        self.store = store
        self.warm = warm
        self._children: dict[int, Process] = {}
        self._jobs: list[Process] = []
        self._studies: dict[int, Process] = {}
        self._stopped_studies: set[int] = set()
        self._after: dict[int, int] = {}        # a study started after another: that one
        self._new: dict[int, Any] = {}      # runs started new (start): their config
        # (run, line, config): a new run refused by its process before its first step
        # (removed, as `run` stores nothing), for the dashboard to say; it takes them
        self.refused: list[tuple[int, str, Any]] = []

    def _spawn(self, args: list[str], log_path: Path) -> Process:
        return launch(self.store.dir, args, log_path, warm=self.warm)

    def _spawn_run(self, run_id: int, args: list[str], config: Any) -> None:
        """Starts the run's process; `config` is what it trains with (its device decides
        whether the launcher's spare may take it, and which GPUs it is put on)."""
        held = self.gpus_for(config)
        proc = launch(self.store.dir, args, self.store.log_path(run_id), warm=self.warm,
                      spare=machine.cuda_device(config),
                      cublas=machine.cublas_workspace(config),
                      config=config if isinstance(config, dict) else None,
                      env=gpus.visible_env(held, config))
        self._children[run_id] = proc
        # From now on a run whose process dies before it starts training reads as crashed.
        self.store.set_launcher(run_id, proc.pid)
        self.store.set_gpus(run_id, held)

    def gpus_for(self, config: Any) -> list[int]:
        """The GPUs a run of `config` is put on (core.processes.gpus): free ones, none of
        them held by a live run of this session; [] for a run that starts no CUDA, or
        where this machine has no GPU (its facts are probed once, in a child process)."""
        if gpus.wanted(config)[0] == 0:
            return []
        try:
            here = gpus.gpu_list(machine.facts().cuda_devices)
        except (RuntimeError, OSError, ValueError, subprocess.SubprocessError):
            return []
        held = gpus.held_by(self.store.runs(), lambda r: is_live(r) or starting(r))
        return gpus.choose(config, here, held)

    def _job(self, args: list[str], name: str) -> subprocess.Popen:
        """A background command that trains runs of its own, its output in logs/NAME.log."""
        proc = self._spawn(args, self.store.logs_dir / f"{name}.log")
        self._jobs.append(proc)
        return proc

    def check(self, run_id: int, resume_at: int | None = None) -> subprocess.Popen:
        """A determinism verdict (or, with `resume_at`, a resume check) of a run, in the
        background; the twin it trains is recorded on the run as a `check_twin` event."""
        self._twin_of(self.store.run(run_id))               # refused before it starts
        return self._job(repro_args(run_id, resume_at), f"repro-run-{run_id}")

    def explain(self, a: int, b: int) -> subprocess.Popen:
        """Where runs A and B part, and why (`tui-trainer explain`), in the background: the
        answer (or why there is none) is kept in the session as an `explanation` event on B."""
        return self._job(explain_args(a, b), f"explain-{a}-{b}")

    def memory(self, run_id: int) -> subprocess.Popen:
        """Where a run's memory goes (`tui-trainer memory`), measured on a copy of it in the
        background; kept in the session as a `memory_breakdown` event on the run."""
        self._code_of(run_id)
        return self._job(["memory", str(run_id), "--json"], f"memory-run-{run_id}")

    def profile(self, runs: tuple[int, ...]) -> subprocess.Popen:
        """Where runs' step time goes (`tui-trainer profile`), measured on copies of them in
        the background; kept in the session as a `profile` event on each run."""
        self._code_of(*runs)
        ids = [str(r) for r in runs]
        return self._job(["profile", *ids, "--json"], f"profile-{'-'.join(ids)}")

    def activations(self, runs: tuple[int, ...], choice: list[str]) -> subprocess.Popen:
        """What runs see in a digit (`tui-trainer activations`, `choice` its --digit and
        --step), in the background; kept in the session as an `activations` event on the
        first run."""
        self._code_of(*runs)
        ids = [str(r) for r in runs]
        return self._job(["activations", *ids, *choice, "--no-png", "--json"],
                         f"activations-{'-'.join(ids)}")

    def study(self, study_id: int, then: Sequence[int] = ()) -> subprocess.Popen:
        """Trains a planned A/B study in the background (then the studies of `then`, one
        after the other, in the same process: stopping any of them stops the rest)."""
        proc = self._job(study_args(study_id, then), f"study-{study_id}")
        for before, one in zip((study_id, *then), (study_id, *then)[1:]):
            self._after[one] = before
        for one in (study_id, *then):
            self._studies[one] = proc
        return proc

    def fit(self, sets: list[str]) -> subprocess.Popen:
        """The machine fit (`tui-trainer fit`) of a config (its --set pairs) in the
        background: its studies land in the session, its preset in the user's presets."""
        return self._job(["fit", *(a for kv in sets for a in ("--set", kv))], "fit")

    def jobs_running(self) -> int:
        return sum(1 for p in self._jobs if p.poll() is None)

    def stop_study(self, study_id: int) -> bool:
        """Asks a study to stop: its current run stops with a checkpoint. A study this
        dashboard has just started, whose process has not yet marked it running, is asked
        through that process (Stop pressed right after Run study is not lost)."""
        study = self.store.study(study_id)
        if study["status"] == "running":
            # The session names the pid: signalled only while it is the process it was.
            return process_alive(study["pid"], study["pid_started"]) and \
                _terminate(study["pid"])
        proc = self._studies.get(study_id)
        if study["status"] == "created" and proc is not None and proc.poll() is None:
            self._stopped_studies.add(study_id)
            proc.terminate()
            return True
        return False

    def start(self, config: dict[str, Any], name: str | None = None,
              twin_of: int | None = None, chosen: Any = ()) -> int:
        """Creates the run in the session and starts training it in the background.
        `chosen`: what its preset chose for this machine (core.settings.fit), kept on it."""
        run_id = self.store.create_run(config, name=name, twin_of=twin_of)
        fit.record(self.store, run_id, list(chosen))
        self._new[run_id] = config
        self._spawn_run(run_id, train_args(run_id, new=True), config)
        return run_id

    def _code_of(self, *run_ids: int) -> None:
        """Copies of runs of a net of the user's own file are refused here, in one line,
        before their process starts, unless the file holds the code each trained with and
        this user trusts it (core/settings/user_models.py); their process checks again."""
        for run_id in run_ids:
            run = self.store.run(run_id)
            user_models.check_code(run)
            user_data.check_in(run["config"])       # its folder of images, named here

    @staticmethod
    def _twin_of(run: dict[str, Any]) -> None:
        """A twin of a recorded run trains its code and reads its images: the file it
        recorded, trusted, and a folder this user named (else one line, before it is
        made)."""
        user_models.check_twin(run)
        user_data.check_in(run["config"])

    def repeat(self, run_id: int) -> int:
        """A twin: the same config, paired with the original for divergence (refused before
        it is created where a net of the user's file is not the code the run trained with,
        or is not trusted)."""
        run = self.store.run(run_id)
        self._twin_of(run)
        return self.start(run["config"], name=f"{run['name']}-twin", twin_of=run_id)

    def resume(self, run_id: int, overrides: dict[str, Any] | None = None,
               restart: bool = False) -> None:
        self._code_of(run_id)           # (its own process checks again, as `resume` does)
        # A run that just stopped may still be closing its process; let it finish first.
        previous = self._children.get(run_id)
        if previous is not None:
            try:
                previous.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        config = self.store.run(run_id)["config"]
        if isinstance(config, dict):
            config = {**config, **(overrides or {})}
        self._spawn_run(run_id, resume_args(run_id, overrides, restart), config)

    def stop(self, run_id: int) -> bool:
        """Asks a live run to stop: it finishes its step and writes a checkpoint. A
        data-parallel run is asked through its launcher (see stop_target)."""
        run = self.store.run(run_id)
        return is_live(run) and _terminate(stop_target(run))

    def live_runs(self) -> list[int]:
        """Runs training now, including ones this dashboard launched that are still starting."""
        live = {r["id"] for r in self.store.runs() if is_live(r)}
        live |= {run_id for run_id in self._children if self.starting(run_id)}
        return sorted(live)

    def reap(self) -> dict[int, int]:
        """Collects exit statuses of children that ended (no zombies); {run_id: status}. A
        run left 'created' or 'running' by its ended child is stored as crashed, with how
        the process ended."""
        ended = {}
        for run_id, proc in list(self._children.items()):
            code = proc.poll()
            if code is not None:
                ended[run_id] = code
                self._children.pop(run_id, None)
                if run_id in self._new and code == EXIT_BAD_INPUT and self._withdrawn(run_id):
                    continue
                if not self.store.readonly:
                    self.store.reconcile(run_id, reason=exit_text(code))
        self._new = {r: c for r, c in self._new.items() if r in self._children}
        self._jobs = [p for p in self._jobs if p.poll() is None]
        for study_id, proc in list(self._studies.items()):
            code = proc.poll()
            if code is None:
                continue
            del self._studies[study_id]
            if not self.store.readonly and self.store.study(study_id)["status"] == "created":
                # Its process ended before it marked the study running (a Stop that came
                # before its signal handler did, or a crash at start): said, not left planned.
                asked = study_id in self._stopped_studies
                before = self._after.get(study_id)
                ended_first = None if before is None else self.store.study(before)["status"]
                if ended_first not in (None, "finished", "created"):
                    # (the study before it stopped or failed: this one was never begun)
                    self.store.set_study_status(
                        study_id, "stopped", f"not started: study {before} before it ended "
                        f"{ended_first}; run it again to start it")
                else:
                    self.store.set_study_status(
                        study_id, "stopped" if asked else "crashed",
                        "stopped before its first run; run it again to start it" if asked
                        else f"ended before its first run: {exit_text(code)}")
            self._stopped_studies.discard(study_id)
            self._after.pop(study_id, None)
        return ended

    def _withdrawn(self, run_id: int) -> bool:
        """A new run its process refused and removed: its refusal (the log's last line, a
        file this supervisor made) kept for the dashboard, and the log removed."""
        try:
            self.store.run(run_id)
            return False
        except NotFound:
            pass
        log = self.store.log_path(run_id)
        try:
            with open(log, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
                tail = f.read().decode("utf-8", "replace")
        except OSError:
            tail = ""
        said = [line for line in tail.splitlines() if line.strip()]
        # its refusal is the CLI's one line (a warning printed as it exited may follow it),
        # a data-parallel run's by a rank ("[rank 1] tui-trainer: ...")
        found = [m.group(1) for x in said if (m := REFUSAL.match(x))]
        line = found[-1] if found else said[-1] if said else "refused by its process"
        self.refused.append((run_id, line, self._new.get(run_id)))
        log.unlink(missing_ok=True)
        return True

    def children(self) -> list[int]:
        """Runs whose process this supervisor started and that still run (no SQLite)."""
        return [r for r, p in list(self._children.items()) if p.poll() is None]

    def starting_cached(self, run_id: int) -> bool:
        """True while a child launched by us for this run is alive (no SQLite: the caller
        knows the run still reads 'created')."""
        proc = self._children.get(run_id)
        return proc is not None and proc.poll() is None

    def starting(self, run_id: int) -> bool:
        """True while a child launched by us has not yet marked its run running."""
        proc = self._children.get(run_id)
        return proc is not None and proc.poll() is None \
            and self.store.run(run_id)["stored_status"] == "created"
