"""The training process around the loop: `run_training` (one run, start to end, in this
process), the signals that stop it, the heartbeat thread that says it is alive, and the
watch for threads that outnumber the free cores (Crowding). A data-parallel rank's own
entry is engine/rank.py, which calls run_training with its group.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, TextIO

from ..core.processes import contention, supervisor
from ..core.settings import fit, hardware
from ..core.settings.config import RunConfig
from ..core.errors import DiskFull, is_disk_full
from ..core.processes.liveness import HEARTBEAT_S
from ..core.processes.proctitle import set_title, title
from ..core.session.store import SessionStore
from .bookkeeping import Summary
from .checkpoint import sweep
from .distributed import Group, PeerLost, peer_lost
from .knobs import determinism_refusal
from .train import Trainer


class _Heartbeat(threading.Thread):
    """Beats from its own thread and its own connection, so a long step, an evaluation or
    torch.compile never makes a live run look dead. Each beat also says when the loop
    (`position`: its step, and what it does besides stepping, Trainer.busy) last moved,
    the run's own seconds per step so far, and what it is busy with: a run that beats but
    does not train (a data-parallel rank hung, its peers waiting in a collective) reads as
    stalled once its step has stood still for its stall window (core.processes.liveness)."""

    def __init__(self, session_dir: Path, run_id: int,
                 position: Callable[[], tuple[int, str | None, float | None]],
                 crowding: "Crowding | None" = None):
        super().__init__(daemon=True, name="heartbeat")
        self.session_dir, self.run_id, self.position = session_dir, run_id, position
        self.crowding = crowding
        self.halt = threading.Event()

    def run(self) -> None:
        store = SessionStore(self.session_dir, create=False, verify=False)  # checked already
        seen, moved = self.position()[:2], time.time()
        try:
            while not self.halt.wait(HEARTBEAT_S):
                step, busy, pace = self.position()
                if (step, busy) != seen:
                    seen, moved = (step, busy), time.time()
                crowded = self.crowding.beat() if self.crowding is not None else ...
                store.heartbeat(self.run_id, moved, pace, busy, crowded)
        finally:
            store.close()


class Crowding:
    """Whether a CPU run's torch threads outnumber the cores the rest of the machine leaves
    it (core.processes.contention.crowded), judged while it trains from what it records anyway: the
    machine's and its own CPU time over the last CROWDED_WINDOW_S. `beat` (each heartbeat)
    returns the note while crowded, None once it is not, Ellipsis when nothing changed; a
    change is said in the run's log."""

    def __init__(self, threads: int, say: Callable[[str], None]):
        self.threads, self.say = threads, say
        self.snaps: list[contention.Snapshot] = []
        self.shown: int | None = None        # the thread count the shown note suggests

    def beat(self) -> Any:
        snap = contention.snapshot(supervisor.owner())
        if snap is None:
            return ...
        self.snaps.append(snap)
        while len(self.snaps) > 2 and \
                self.snaps[1].wall <= snap.wall - contention.CROWDED_WINDOW_S:
            self.snaps.pop(0)
        c = contention.between(self.snaps[0], snap)
        note = contention.crowded(c, self.threads, "cpu")
        fit = contention.suggested_threads(note)
        if fit == self.shown:
            return ...
        self.shown = fit
        self.say(note if note else f"{self.threads} threads fit the cores free again "
                 f"({contention.text(c)})")
        return note


def run_training(cfg: RunConfig, session_dir: Path, *, name: str | None = None,
                 run_id: int | None = None, checkpoint: dict[str, Any] | None = None,
                 progress: bool = False, echo: TextIO | None = sys.stderr,
                 kill_at_step: int | None = None,
                 events: list[tuple[Any, ...]] = (),
                 group: Group | None = None, sampler_seed: int | None = None,
                 recorded: dict[str, Any] | None = None) -> Summary:
    """Trains one run in this process, recording everything into the session.

    Everything that can be refused (device, AMP, missing data, a checkpoint that does not
    fit) is checked before the session is opened, so bad input writes nothing. A new run is
    created unless `run_id` names one to continue; either way this process claims it (one
    writer per run) before writing anything of it, then records `events`. Any failure while
    training marks the run crashed, records the traceback, and re-raises.

    In a data-parallel run every rank calls this with its `group`; only the lead (rank 0)
    opens the session, the others train and say what they have to say on stderr.
    """
    group = group or Group()
    trainer = Trainer(cfg, checkpoint=checkpoint, progress=progress, kill_at_step=kill_at_step,
                      group=group, sampler_seed=sampler_seed, recorded=recorded)
    trainer.setup()
    if not group.lead:
        return _train_rank(trainer, run_id if run_id is not None else 0, echo)
    store = SessionStore(session_dir)
    try:
        if run_id is None:
            run_id = store.create_run(cfg.to_dict(), name=name)
        # One writer per run, claimed atomically before anything of the run is written.
        store.claim(run_id)
        set_title(title(run_id, store.run(run_id)["name"], session_dir, group.rank,
                        group.world))
        store.touch()
        store.set_config(run_id, cfg.to_dict())
        for kind, message, step, *data in events:  # what the caller found, now that we own it
            store.add_event(run_id, kind, message, step=step, data=data[0] if data else None)
        for stale in sweep(store, run_id):
            store.add_event(run_id, "swept", f"removed {stale.name}, left by an interrupted "
                            "checkpoint write")
        trainer.attach(store, run_id, echo)
        store.set_settings(run_id, trainer.settings, trainer.loaders.info.name)
        mine = trainer.model_file
        if mine is not None and (recorded or {}).get("model_sha256") != mine["sha256"]:
            # A copy of the code it trains with, for the record: never executed from here.
            store.add_event(run_id, "model_source", f"the model: {mine['name']} of "
                            f"{mine['path']} (sha256 {mine['sha256'][:16]}), its source kept "
                            "with the run", data=dict(mine))
    except BaseException:
        store.close()
        raise
    if checkpoint is not None:
        store.add_event(run_id, "resumed", f"resumed from the checkpoint at step "
                        f"{checkpoint['step']}", step=int(checkpoint["step"]))
    processes = (f", {group.world} processes (DistributedDataParallel over "
                 f"{group.backend}), {cfg.batch_size // group.world} samples each per "
                 "micro-batch" if group.active else "")
    trainer.log(f"run {run_id} on {trainer.settings['device']} "
                f"({trainer.settings['device_name']}){processes}, data: "
                f"{trainer.loaders.info.description}")
    trainer.log(f"machine: {hardware.Cpu.from_dict(trainer.settings['cpu']).describe()}"
                + (f"; {trainer.settings['device_name']} (compute capability "
                   f"{trainer.settings['cuda_capability']})"
                   if trainer.settings.get("cuda_capability") else ""))
    if checkpoint is None:
        for e in store.events(run_id, fit.EVENT):     # what its preset chose for this machine
            trainer.log(e["message"])
    if trainer.cuda_start is not None and (said := trainer.cuda_start.said()):
        trainer.log(said)
    # CPU runs only (a CUDA step does not wait on torch's CPU threads); one process of a
    # data-parallel run cannot tell its peers from strangers
    crowding = None if group.active or trainer.device.type != "cpu" else \
        Crowding(trainer.settings["num_threads"], trainer.log)
    heartbeat = _Heartbeat(store.dir, run_id,
                           lambda: (trainer.pos.step, trainer.busy, trainer.pace_s), crowding)
    heartbeat.start()
    restore = _listen(trainer)
    try:
        summary = trainer.train()
        store.end_run(run_id, summary.status, summary.to_dict(), trainer.final_figures)
        return summary
    except BaseException as e:
        tb = traceback.format_exc()
        if is_disk_full(e) and not isinstance(e, DiskFull):
            e = DiskFull(getattr(e, "filename", None) or store.dir)
        consequence = peer_lost(e) if group.active else None
        if isinstance(e, DiskFull) or consequence:
            trainer.log.to_file(tb.rstrip())
        else:
            trainer.log(tb.rstrip())
        if consequence:
            trainer.log(f"stopping: {consequence}")
        reason = str(e) if isinstance(e, DiskFull) else consequence or \
            determinism_refusal(e) or f"{type(e).__name__}: {e}"
        # The status and its reason first, each write on its own: on a full disk the small
        # update may still fit where the rows measured since the last flush, or the event
        # with its traceback, do not (under load the event failed first and the run was
        # later read as "gone", its reason lost). Then what was measured up to the failure
        # and how far it got (its figures kept with them, by the writer).
        for write in (lambda: store.end_run(run_id, "crashed", {"error": reason}),
                      lambda: trainer.recorder.progress(trainer.pos.step,
                                                        trainer._epoch_float(), flush=True),
                      lambda: store.add_event(run_id, "failure", f"training failed: {reason}",
                                              step=trainer.pos.step, data={"traceback": tb})):
            try:
                write()
            except Exception:  # noqa: BLE001 - a full disk: what fits is kept
                pass
        if isinstance(e, DiskFull):
            raise e from None
        if consequence:
            raise PeerLost(1) from None
        raise
    finally:
        restore()
        heartbeat.halt.set()
        heartbeat.join()
        trainer.log.close()
        store.close()


def _listen(trainer: Trainer) -> Any:
    """SIGTERM/SIGINT stop the run after this step with a checkpoint (a second one stops at
    once); warnings go to the run's log. Returns what puts things back."""
    owner = os.getpid()

    def request_stop(signum: int, frame: Any) -> None:
        if os.getpid() != owner:
            return       # a forked DataLoader worker: the training process decides for it
        if trainer.stop_requested:           # a second signal: stop now
            raise KeyboardInterrupt
        trainer.stop_requested = True
        trainer.log(f"{signal.Signals(signum).name}: stopping after this step, with a "
                    "checkpoint (send it again to stop at once)")

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    previous_showwarning = warnings.showwarning

    def log_warning(message: Any, category: type, filename: str, lineno: int,
                    file: Any = None, line: Any = None) -> None:
        # e.g. deterministic = warn: which ops have no deterministic implementation.
        trainer.log(f"warning: {category.__name__}: {message} ({filename}:{lineno})")

    warnings.showwarning = log_warning

    def restore() -> None:
        for s, handler in previous.items():
            signal.signal(s, handler)
        warnings.showwarning = previous_showwarning

    return restore


def _train_rank(trainer: Trainer, run_id: int, echo: TextIO | None) -> Summary:
    """A rank other than the lead: trains in step with the others, records nothing itself;
    a failure is said on stderr (labelled by torchrun, in the run's log) and re-raised."""
    trainer.attach(None, run_id, echo)
    restore = _listen(trainer)
    try:
        return trainer.train()
    except BaseException as e:
        consequence = peer_lost(e)
        if consequence is None:
            trainer.log(traceback.format_exc().rstrip())
            raise
        # Another rank ended first (its own words say why): one line, no traceback.
        trainer.log(f"stopping: {consequence}")
        raise PeerLost(1) from None
    finally:
        restore()
        trainer.log.close()
