"""A run's life from the command line: started (new, or created by the dashboard), continued,
and trained in one process or as a data-parallel group. The one place that decides which.

cli.py parses and prints; this module starts, resumes and trains, and says how the run
ended (`Ended`). One rank of a group runs engine.rank.run_rank; the group's launcher
(torchrun's agent) is runner.train_group. torch is imported only when training starts.
"""

from __future__ import annotations

import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import runner
from .core.settings import config, fit, recorded, user_models
from .core.processes import supervisor
from .core.settings.config import ConfigError
from .core.errors import EXIT_BAD_INPUT, EXIT_FAILED, BadInput, CheckpointError, RunBusy
from .core.processes.proctitle import set_title, title
from .core.processes.liveness import is_live
from .core.session.store import SessionStore

Event = tuple[str, str, int | None]       # (kind, message, step): recorded by the run


@dataclass(frozen=True)
class Ended:
    """How a training command ended: the run's summary, or an exit status and a line."""
    summary: dict[str, Any] | None = None
    code: int | None = None
    failure: str | None = None          # said as "training failed: ..."


def parallel(cfg: config.RunConfig) -> bool:
    return cfg.nproc * cfg.nnodes > 1


def start(session: Path, cfg: config.RunConfig, name: str | None = None,
          kill_at_step: int | None = None, progress: bool = False,
          chosen: list[fit.Choice] = ()) -> Ended:
    """A new run: one process trains it here, or this process launches its group. `chosen`:
    what its preset chose for this machine (core.settings.fit), kept on the run."""
    SessionStore.check(session)              # a damaged session is refused before the slow part
    if not parallel(cfg):
        return _train_here(cfg, session, name=name, kill_at_step=kill_at_step,
                           progress=progress,
                           events=[(fit.EVENT, f"{fit.SAID}{c.line()}", None, c.to_dict())
                                   for c in chosen])
    preflight(cfg)                           # bad input writes nothing, as for one process
    with SessionStore(session) as store:
        run_id = store.create_run(cfg.to_dict(), name=name)
        fit.record(store, run_id, chosen)
        store.set_launcher(run_id, os.getpid())
    return _unless_refused(session, run_id, _train_group(session, run_id, cfg,
                           supervisor.worker_args(session, run_id, kill_at_step=kill_at_step)))


def start_created(session: Path, run_id: int, config_path: str | None, sets: list[str],
                  kill_at_step: int | None = None, progress: bool = False,
                  new: bool = False) -> Ended:
    """A run created before its process (by the dashboard, or a study). A refusal is
    recorded on it (crashed, the reason as a failure event), or, `new` (the dashboard's
    Start), the run is removed: refused before anything is stored, as `run` is, the
    refusal this process's last line (which the dashboard reads from its log)."""
    with SessionStore(session, create=False) as store:
        run = store.run(run_id)
        if run["stored_status"] != "created":
            raise BadInput(f"run {run_id} was started before (status {run['status']}); "
                           "use `tui-trainer resume` to continue it")
        try:
            cfg = config.load(config_path, sets, base=recorded.run_config(run))
            if parallel(cfg):
                preflight(cfg)
                store.set_config(run_id, cfg.to_dict())
                store.set_launcher(run_id, os.getpid())
            else:
                return _train_here(cfg, session, run_id=run_id, kill_at_step=kill_at_step,
                                   progress=progress)
        except (ConfigError, CheckpointError, BadInput) as e:
            store.refused_to_start(run_id, str(e), new=new)
            raise
    ended = _train_group(session, run_id, cfg, supervisor.worker_args(
        session, run_id, kill_at_step=kill_at_step))
    return _unless_refused(session, run_id, ended, keep_log=True) if new else ended


def _unless_refused(session: Path, run_id: int, ended: Ended, keep_log: bool = False) -> Ended:
    """A data-parallel run whose ranks all refused before its first step (the model, the
    data: what only building them tells) is removed, as one process's refusal stores
    nothing; `keep_log`: the dashboard reads the refusal there (then removes it)."""
    if ended.code != EXIT_BAD_INPUT:
        return ended
    with SessionStore(session, create=False) as store:
        if store.run(run_id)["step"] == 0 and not store.checkpoints(run_id):
            store.delete_run(run_id, refused=True)
            shutil.rmtree(store.logs_dir / f"run-{run_id}-ranks", ignore_errors=True)
            if not keep_log:
                store.log_path(run_id).unlink(missing_ok=True)
    return ended


def resume(session: Path, run_id: int, sets: list[str], checkpoint: str | None = None,
           restart: bool = False, kill_at_step: int | None = None, progress: bool = False,
           say: Callable[[str], None] = print) -> Ended:
    """Continues a run from its newest usable checkpoint (or `checkpoint`); with `restart`,
    a run without one trains again from step 0. Only the training length and launch keys
    may change. What was passed over is said now and recorded by the run."""
    overrides = config.parse_overrides(sets)
    may_change = config.TRAINING_LENGTH_KEYS + config.LAUNCH_KEYS
    for key in overrides:
        if key in ("nproc", "nnodes"):
            raise ConfigError(key, "cannot change when continuing a run: its checkpoint holds "
                              "every process's RNG state and data position, so a run "
                              "continues with as many processes as it was trained with "
                              "(start a new run to try another count)")
        if key not in may_change:
            raise ConfigError(key, "cannot change when continuing a run (it would no longer "
                              f"be the same run); only {', '.join(may_change)} may change")
    SessionStore.check(session)
    with SessionStore(session, create=False) as store:
        store.reconcile(run_id)
        run = store.run(run_id)
        if is_live(run):
            raise RunBusy(f"run {run_id} is being trained by process {run['pid']}; stop it "
                          "before continuing it")
        cfg = recorded.run_config(run, overrides)
        user_models.check_code(run)     # a net of the user's own file: its code, trusted
        from .engine.checkpoint import choose_checkpoint, load_named
        state, notes, path = None, [], None
        if checkpoint:
            path = Path(checkpoint)
            state = load_named(store, run, cfg, path)
        else:
            try:
                state, path, notes = choose_checkpoint(store, run, cfg)
            except CheckpointError:
                if not restart:
                    raise
    # Said now, recorded as events by the training process once it holds the run.
    events: list[Event] = [("checkpoint_refused", f"checkpoint passed over: {note}", None)
                           for note in notes]
    if state is not None and notes:
        events.append(("checkpoint_fallback", f"resuming from the previous good checkpoint, "
                       f"at step {state['step']}, instead of the newest ({len(notes)} passed "
                       "over)", state["step"]))
    if state is None:
        events.append(("restarted", f"run {run_id} has no usable checkpoint: training it "
                       "again from step 0 (--restart); its recorded rows are replaced as it "
                       "goes", 0))
    for _, message, _ in events:
        say(message)
    if parallel(cfg):
        return _train_group(session, run_id, cfg, supervisor.worker_args(
            session, run_id, checkpoint=path if state is not None else None,
            overrides=overrides, events=events, kill_at_step=kill_at_step))
    return _train_here(cfg, session, run_id=run_id, checkpoint=state, events=events,
                       kill_at_step=kill_at_step, progress=progress,
                       recorded=user_models.recorded(run))


def join(endpoint: str, nnodes: int, node_rank: int, nproc: int, timeout_s: int,
         dist_timeout: int, waiting: Callable[[], None] = lambda: None) -> str | None:
    """This machine's ranks of a run started on node 0 (`tui-trainer join`): checked, then
    torchrun's agent until the group ends. None when they ended cleanly, else why not."""
    if nnodes < 2:
        raise ConfigError("--nnodes", f"must be 2 or more to join a run, got {nnodes}")
    if not 1 <= node_rank < nnodes:
        raise ConfigError("--node-rank", f"must be 1 to {nnodes - 1} (node 0 is the machine "
                          f"holding the session), got {node_rank}")
    if not 1 <= timeout_s <= 86400:
        raise ConfigError("--timeout", f"must be 1 to 86400 seconds, got {timeout_s}")
    cfg = config.from_dict({"nproc": nproc, "nnodes": nnodes, "rdzv_endpoint": endpoint,
                            "batch_size": nproc * nnodes, "dist_timeout": dist_timeout})
    host, port = endpoint.rsplit(":", 1)
    try:
        socket.getaddrinfo(host.strip("[]"), int(port))
    except (OSError, UnicodeError) as e:
        raise ConfigError("HOST:PORT", f"{host!r} is not a host this machine can find "
                          f"({getattr(e, 'strerror', None) or e})") from None
    # PyTorch's store client logs every failed connection attempt with its C++ frames (200+
    # lines while node 0 is not there yet); what is waited for is said by the command, once.
    # Quiet in this process only: the level is read when torch loads, and the ranks it
    # starts get the environment as it was.
    before = os.environ.get("TORCH_CPP_LOG_LEVEL")
    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    import torch  # noqa: F401
    if before is None:
        del os.environ["TORCH_CPP_LOG_LEVEL"]
    else:
        os.environ["TORCH_CPP_LOG_LEVEL"] = before
    waiting()                           # said once the arguments are known to be good
    try:
        result = runner.train_group(None, None, cfg, supervisor.worker_args(None, None),
                                    node_rank=node_rank, rendezvous_s=timeout_s)
    except runner.RendezvousFailed as e:
        return f"join: {e}"
    return f"join failed: {result.reason}" if result.failures else None


def _train_here(cfg: config.RunConfig, session: Path, **kw: Any) -> Ended:
    """One process: this one."""
    from .engine.host import run_training   # torch is imported here, not before
    return Ended(summary=run_training(cfg, session, **kw).to_dict())


def preflight(cfg: config.RunConfig) -> None:
    """What a single process checks in its set-up (device, knobs, data), checked before the
    processes are launched, so that bad input is refused in one line and writes nothing."""
    from .core.settings import datafiles
    from .engine.knobs import check_device_knobs, machine_facts, resolve_device
    device = resolve_device(cfg)
    check_device_knobs(cfg, device)
    if device.type == "cuda" and cfg.nproc > (gpus := machine_facts().cuda_devices):
        raise ConfigError("nproc", f"is {cfg.nproc}, but this machine has {gpus} CUDA "
                          "device(s) and each process takes one; lower nproc or use "
                          "device = cpu")
    # The data made ready once, here, before the ranks (which each load them): without
    # torchvision (2 s of imports before any rank starts) unless full MNIST must be fetched.
    if datafiles.prepare(cfg.to_dict()) is None:
        from .engine.data import load_datasets
        load_datasets(cfg)


def _train_group(session: Path, run_id: int, cfg: config.RunConfig,
                 worker: list[str]) -> Ended:
    """Launches the run's ranks through torchrun (runner.train_group), waits, and says how
    the run ended."""
    set_title(title(run_id, session=session, ranks=cfg.nproc))
    result = runner.train_group(session, run_id, cfg, worker)
    run = result.run or {}
    if result.failures or result.reason:
        if result.refused:                  # the ranks said why
            return Ended(code=max(f.exitcode for f in result.failures))
        return Ended(code=EXIT_FAILED, failure=result.reason)   # or stopped by force
    summary = run.get("summary") or {}
    if "status" not in summary:
        return Ended(code=EXIT_FAILED, failure=(
            f"run {run_id} ended without a summary (status {run.get('status')}); its log: "
            f"{session / 'logs'}"))
    return Ended(summary=summary)
