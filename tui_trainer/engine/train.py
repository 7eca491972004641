"""The training loop of one run, and its step.

`Trainer.train` is the loop, one iteration per optimizer step:

    for batch in self.steps():        # epochs, the resume's fast-forward, an epoch's end
        done = self.step(batch)       # forward, backward, optimizer, with the knobs applied
        self.record(done)             # rows at log points, fingerprints, checkpoints
        if status := self.should_stop():
            break

`step` is the whole computation of a step and nothing else (what it computes: engine/step.py):
replaying a step from a restored state runs this same code. What the loop adds to
pytorch/examples' mnist/main.py is bookkeeping (engine/bookkeeping.py): metrics into the
session store at log points only (every `.item()` is a device sync), parameter fingerprints,
checkpoints that allow bit-exact resume. The process around the loop (a run start to end,
signals, the heartbeat) is engine/host.py; the optimizer and schedules engine/optim.py.
"""

from __future__ import annotations

import math
import os
import signal
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, TextIO

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..core.processes import contention, supervisor
from ..core.analysis import figures
from ..core.analysis.figures import PHASES
from ..core.settings import recorded
from ..core.settings.config import ConfigError, RunConfig, graph_step
from ..core.errors import BadInput, CheckpointError
from ..core.session.store import SessionStore
from .bookkeeping import Bookkeeping, Position, Summary
from .cuda_start import CudaStart
from .data import Loaders, make_loaders
from .distributed import Group, use_backend
from .graphs import StepGraph
from .meter import Meter
from .models import build_model
from .knobs import (ParamSketch, apply_knobs, capture_rng, check_device_knobs,
                    effective_settings, resolve_device, restore_rng)
from .optim import make_optimizer, make_scheduler, schedule_end
from .recorder import Recorder, RunLog
from .step import batch_in, eval_sums, forward_loss


@dataclass
class Step:
    """One optimizer step's micro-batches, `size` of them (grad_accum_steps, fewer at the
    end of an epoch), fetched as the step uses them."""
    size: int
    micro_batches: Iterator[Any]


@dataclass
class StepDone:
    loss: torch.Tensor                  # the step's loss, on the device (no sync)
    grad_norm: torch.Tensor | None      # at log points, or with gradient clipping


@dataclass
class Clock:
    """Where the steps' time went since the last log point, phase by phase (core.analysis.figures
    PHASES): waiting for data, copying the batch to the device, forward, backward,
    optimizer, and the loop's own recording (rows, fingerprints, checkpoints). On the CPU
    each boundary is a perf_counter; on CUDA the device phases are CUDA events, read only
    at the log point (whose loss.item() synchronises anyway): never a sync per step."""

    def __init__(self, cuda: bool = False) -> None:
        self.cuda = cuda
        self.since = 0.0
        self.samples = 0
        self.spent = dict.fromkeys(PHASES, 0.0)
        self._t = 0.0
        self._events: list[tuple[str, Any, Any]] = []     # CUDA: (phase, start, end)
        self._open: Any = None

    @property
    def data_s(self) -> float:
        return self.spent["data"]

    def add(self, phase: str, seconds: float) -> None:
        self.spent[phase] += seconds

    def start(self) -> None:
        """A device phase starts now."""
        if self.cuda:
            self._open = torch.cuda.Event(enable_timing=True)
            self._open.record()
        else:
            self._t = time.perf_counter()

    def done(self, phase: str) -> None:
        """The device phase started last ends now; the next starts."""
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events.append((phase, self._open, end))
            self._open = end
        else:
            now = time.perf_counter()
            self.spent[phase] += now - self._t
            self._t = now

    def lap(self, samples: int) -> tuple[float, int, dict[str, float]]:
        """(seconds, samples, seconds per phase) since the last lap; restarts."""
        if self._events:
            self._events[-1][2].synchronize()
            for phase, a, b in self._events:
                self.spent[phase] += a.elapsed_time(b) / 1000
            self._events.clear()
        now = time.perf_counter()
        out = (now - self.since, samples - self.samples, self.spent)
        self.since, self.samples, self.spent = now, samples, dict.fromkeys(PHASES, 0.0)
        return out


# The `compile` knob's values, as torch.compile's modes.
COMPILE_MODES = {"on": "default", "reduce-overhead": "reduce-overhead",
                 "max-autotune": "max-autotune"}


def compiled(module: nn.Module, how: str) -> Any:
    """The module as the compile knob says: itself (off), or torch.compile'd in its mode."""
    return module if how == "off" else torch.compile(module, mode=COMPILE_MODES[how])


class Trainer(Bookkeeping):
    """One run's training. `setup()` checks and builds everything without touching the
    session; `attach()` then ties it to its row in the store."""

    def __init__(self, cfg: RunConfig, *, checkpoint: dict[str, Any] | None = None,
                 progress: bool = False, kill_at_step: int | None = None,
                 group: Group | None = None, sampler_seed: int | None = None,
                 recorded: dict[str, Any] | None = None):
        self.cfg = cfg
        # The settings its run recorded (a resume, a replay): a net of the user's own file
        # is built from the file and content it trained with (engine/models.py)
        self.recorded = recorded
        # A data-parallel run: this process's rank; only the lead (rank 0) touches the store.
        self.group = group or Group()
        self.lead = self.group.lead
        if checkpoint is not None and "sampler" in checkpoint:
            sampler_seed = int(checkpoint["sampler"]["seed"])
        self.sampler_seed = sampler_seed if sampler_seed is not None else (cfg.seed or 0)
        self.replicas_drift_at: int | None = None
        self.rank_peaks: dict[int, dict[str, float | None]] = {}
        self.resume_state = checkpoint
        self.progress = progress
        self.kill_at_step = kill_at_step
        self.stop_requested = False
        # What the loop does besides training steps, for the heartbeat (None: stepping): a
        # step that stands still while it evaluates is no stall.
        self.busy: str | None = "starting"
        # Its seconds per step (a moving average within epochs, data waits included): the
        # pace its stall window follows.
        self.pace_s: float | None = None
        self._paced_at: float | None = None
        self.pos = Position()
        self.last_loss: float | None = None
        self.last_eval: dict[str, float] | None = None
        self.final_figures: figures.Figures | None = None    # the lead's, where it ended
        self.last_checkpoint: Path | None = None
        self.last_checkpoint_step = -1
        self.last_eval_step = -1
        self.last_fingerprint: tuple[int, str] | None = None
        self.resume_matches = 0
        self.resume_mismatches = 0
        self._positioned = False
        # (step, what) once the loss or the parameters are NaN/inf: the run ends "diverged".
        self.diverged: tuple[int, str] | None = None
        self.limit = cfg.max_steps or math.inf
        self.clock = Clock()          # made again for CUDA once the device is known
        self.bar: Any = None
        self.recorder = Recorder(None, 0)     # attach() gives the lead its session's
        self.log = RunLog(None, None)         # a copy (explain, memory, profile) says nothing
        self.t_start = time.perf_counter()

    def attach(self, store: SessionStore | None, run_id: int, echo: TextIO | None) -> None:
        """Ties the trainer to its run: the lead to the store and the run's log file, any
        other rank of a data-parallel run to nothing but its stderr."""
        self.run_id = run_id
        self.recorder = Recorder(store, run_id)
        if store is None:
            self.log = RunLog(None, echo)
        elif self.group.active:
            # The launcher writes the ranks' labelled stderr into the run's log.
            self.log = RunLog(None, echo)
        else:
            self.log = RunLog(store.log_path(run_id), echo)

    # --- set-up ----------------------------------------------------------------------------
    def setup(self) -> None:
        """Builds everything, checking what can be refused. In a data-parallel run every
        rank builds its part, then all learn whether any failed (one refusing would leave
        the others waiting for it), and only then is the model wrapped in DDP."""
        g = self.group
        if not g.active:
            self._build()
            return
        failure: tuple[str, str, str] | None = None
        try:
            self._build()
        except Exception as e:  # noqa: BLE001 - said to every rank, then raised on each
            failure = (type(e).__name__, getattr(e, "key", ""), getattr(e, "reason", str(e)))
            mine = e
        failures = g.all_gather(failure)
        for rank, f in enumerate(failures):
            if f is None:
                continue
            if rank == g.rank:
                raise mine
            kind, key, reason = f
            where = f" (on rank {rank})"
            if kind in ("ConfigError", "DataUnavailable"):
                raise ConfigError(key, reason + where)
            if kind == "CheckpointError":
                raise CheckpointError(reason + where)
            if kind == "BadInput":              # (a net that cannot take the data's images)
                raise BadInput(reason + where)
            raise RuntimeError(f"rank {rank} could not set up: {kind}: {reason}")
        # DDP broadcasts rank 0's parameters now and averages the gradients in backward.
        use_backend(g, self.cfg.dist_backend, self.device)
        self.ddp = DistributedDataParallel(
            self.model, device_ids=[self.device.index] if self.cuda else None,
            process_group=g.ddp_group)
        self.forward = compiled(self.ddp, self.cfg.compile)
        self.settings.update(dist_backend=g.backend)

    def _build(self) -> None:
        cfg = self.cfg
        g = self.group
        self.device = resolve_device(cfg)
        if self.device.type == "cuda" and g.active:
            self.device = torch.device("cuda", g.local_rank)    # one GPU per process
            torch.cuda.set_device(self.device)
        check_device_knobs(cfg, self.device)
        self.cuda = self.device.type == "cuda"
        apply_knobs(cfg, self.device, rank=g.rank)
        # CUDA's start (context, cuBLAS, cuDNN, the kernels of the run's shapes) in a thread
        # while this one loads the data and builds the model; joined before the run starts
        # (its handles then go back to torch's pools, which this thread takes them from:
        # nothing made twice)
        early = CudaStart(self.device, cfg, g.world, make_optimizer) if self.cuda else None
        self.loaders: Loaders = make_loaders(cfg, self.device, g.rank, g.world,
                                             self.sampler_seed)
        self.batches_per_epoch = len(self.loaders.train)   # fixed for the run; not per batch
        if self.batches_per_epoch == 0:             # (only drop_last leaves an epoch empty)
            raise ConfigError("drop_last", f"leaves no batch: batch_size {cfg.batch_size} is "
                              f"more than the {self.loaders.info.train_size:,} training "
                              "samples, and drop_last drops the only, smaller batch; use "
                              "drop_last = false or a smaller batch_size")
        if graph_step(cfg, self.cuda) and not cfg.drop_last \
                and self.loaders.info.train_size % cfg.batch_size:
            raise ConfigError("drop_last", f"must be true with cuda_graph = {cfg.cuda_graph} "
                              f"here: the {self.loaders.info.train_size:,} training samples "
                              f"in batches of {cfg.batch_size} leave a smaller last batch, "
                              "another shape than the captured step's; or set cuda_graph = off")
        info = self.loaders.info
        model = build_model(cfg.model, cfg.activation_checkpointing, cfg.preserve_rng_state,
                            cfg.init, self.recorded, info.shape, info.classes).to(self.device)
        # a net of the user's own file: what it was built from, for the run's record
        self.model_file: dict[str, Any] | None = getattr(model, "model_file", None)
        if cfg.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model
        self.sketch = ParamSketch(model) if self.lead else None
        self.optimizer = make_optimizer(cfg, model)
        # the run's optimizer steps, for the schedules that move every step
        per_epoch = -(-self.batches_per_epoch // cfg.grad_accum_steps)
        self.total_steps = min(cfg.epochs * per_epoch, cfg.max_steps or math.inf)
        self.scheduler = make_scheduler(cfg, self.optimizer, self.total_steps)
        self.schedule_per_step = cfg.lr_schedule != "step"
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.amp == "fp16")
        # The compiled module shares the parameters; hashes and checkpoints use `model`.
        self.forward = compiled(model, cfg.compile)
        # CUDA graphs (compile = reduce-overhead, and max-autotune on CUDA): each step is a
        # new iteration of the graphs; what a step keeps of their outputs it computes anew.
        self.graphs = self.cuda and cfg.compile in ("reduce-overhead", "max-autotune")
        # cuda_graph = step: the whole step captured once and replayed (engine/graphs.py);
        # the copies that trace ops one by one (explain, memory, profile) set it to None
        self.step_graph = StepGraph(self) if graph_step(cfg, self.cuda) else None
        self.eval_forward = self.forward      # evaluation never goes through DDP
        self.ddp: DistributedDataParallel | None = None
        self.non_blocking = cfg.non_blocking and self.cuda
        self.clock = Clock(self.cuda)
        # The first step whose loss is NaN/inf (-1: none yet), on the device.
        self.first_bad_step = torch.full((), -1, dtype=torch.long, device=self.device)
        self.meter = Meter(self.device, rank=g.active)   # the memory figures of log points
        self.machine_at_start: contention.Snapshot | None = None
        self.rng_first_epoch: dict[str, Any] | None = None
        self.rng_epoch_start: dict[str, Any] | None = None
        self.elapsed_before = 0.0
        if self.resume_state is not None:
            self._load_state(self.resume_state)
        if early is not None:
            early.join()
        self.cuda_start = early
        self.settings = effective_settings(cfg, self.device, self.loaders.info.to_dict(),
                                           self.loaders.pin_memory, model)
        self.settings.update(world_size=g.world, dist_backend=None,
                             batch_per_process=cfg.batch_size // g.world)
        if self.model_file is not None:
            self.settings.update(model_file=self.model_file["path"],
                                 model_sha256=self.model_file["sha256"])

    def _load_state(self, state: dict[str, Any]) -> None:
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            self.scaler.load_state_dict(state["scaler"])
        except (RuntimeError, KeyError, ValueError) as e:
            raise CheckpointError(f"the checkpoint does not fit this run's model or optimizer "
                                  f"({str(e).splitlines()[0]})") from None
        world = int(state.get("world_size", 1))
        if world != self.group.world:
            raise CheckpointError(
                f"the checkpoint was written by a run of {world} process(es) and this one has "
                f"{self.group.world}: every process's RNG state and data shard is in it, so "
                "it continues only with as many")
        self.pos = Position(epoch=state["epoch"], batch=state["batch_in_epoch"],
                            step=state["step"], samples=state["samples_seen"])
        mine = state["ranks"][self.group.rank] if state.get("ranks") else state
        self.resume_rng = mine["rng"]
        self.rng_first_epoch = mine["rng_first_epoch"]
        self.rng_epoch_start = mine["rng_epoch_start"]
        self.elapsed_before = float(state["elapsed"])
        self.last_checkpoint_step = state["step"]
        self.last_eval_step = state.get("last_eval_step", -1)

    # --- bookkeeping -----------------------------------------------------------------------
    def _rng(self) -> dict[str, Any]:
        return capture_rng(self.loaders.generator, self.cuda)

    def _restore(self, state: dict[str, Any]) -> None:
        restore_rng(state, self.loaders.generator)

    def elapsed(self) -> float:
        return self.elapsed_before + (time.perf_counter() - self.t_start)

    def _epoch_float(self) -> float:
        return self.pos.epoch + self.pos.batch / max(1, self.batches_per_epoch)

    def evaluate(self) -> None:
        """The evaluation set, whole, by the lead alone (with the unwrapped model), without
        autograd as eval_mode says: the same figure as a single-process run's. The other
        ranks wait at their next collective."""
        if not self.lead:
            self.last_eval_step = self.pos.step
            return
        grad_off = torch.inference_mode() if self.cfg.eval_mode == "inference_mode" \
            else torch.no_grad()
        with grad_off, self._doing("evaluating"):
            self._evaluate()

    def _evaluate(self) -> None:
        self.model.eval()
        total_loss = torch.zeros((), device=self.device)
        correct = torch.zeros((), device=self.device, dtype=torch.long)
        n = 0
        for x, y in self.loaders.eval:
            x = batch_in(self.cfg, x.to(self.device, non_blocking=self.non_blocking))
            y = y.to(self.device, non_blocking=self.non_blocking)
            batch_loss, batch_correct = eval_sums(self.cfg, self.eval_forward, x, y)
            total_loss += batch_loss
            correct += batch_correct
            n += len(y)
        self.model.train()
        loss, acc = total_loss.item() / max(n, 1), correct.item() / max(n, 1)
        self.last_eval = {"loss": loss, "accuracy": acc}
        self.last_eval_step = self.pos.step
        self.recorder.evaluation({"step": self.pos.step, "epoch": self._epoch_float(),
                                  "loss": loss, "accuracy": acc},
                                 f"evaluation at step {self.pos.step}: loss {loss:.4f}, "
                                 f"accuracy {figures.accuracy_text(acc)}")
        self.log(f"eval  step {self.pos.step:>6}  epoch {self._epoch_float():.2f}  "
                 f"loss {loss:.4f}  accuracy {figures.accuracy_text(acc)}")

    # --- data position ---------------------------------------------------------------------
    def _epoch_iterator(self) -> Any:
        """The data iterator for the current epoch, positioned at self.pos.batch.

        A fresh epoch snapshots the RNG first. The first epoch after a resume rebuilds the
        iterator from the epoch's start snapshot, fast-forwards it (workers really load and
        augment the skipped batches, so their RNG streams advance exactly as before), and
        only then restores the RNG states of the moment of the checkpoint."""
        loader = self.loaders.train
        state = self.resume_state
        self.loaders.set_epoch(self.pos.epoch)     # a data-parallel run's shard of this epoch
        if state is None or self._positioned:
            self.rng_epoch_start = self._rng()
            if self.rng_first_epoch is None:
                self.rng_first_epoch = self.rng_epoch_start
            return iter(loader)
        self._positioned = True
        if getattr(loader, "persistent_workers", False) and self.pos.epoch > 0:
            # Persistent workers keep their RNG streams across epochs: replay the data of
            # every earlier epoch through one set of workers, as the original run did.
            self._restore(self.rng_first_epoch)
            for epoch in range(self.pos.epoch):
                self.loaders.set_epoch(epoch)
                for _batch in loader:
                    pass
            self.loaders.set_epoch(self.pos.epoch)
        if self.pos.batch == 0:
            # Checkpointed at an epoch boundary: the next epoch starts from its RNG state.
            self._restore(self.resume_rng)
            self.rng_epoch_start = self._rng()
            if self.rng_first_epoch is None:       # resumed from the step-0 checkpoint
                self.rng_first_epoch = self.rng_epoch_start
            return iter(loader)
        self._restore(self.rng_epoch_start)
        it = iter(loader)
        for _ in range(self.pos.batch):
            next(it)
        self._restore(self.resume_rng)
        return it

    # --- the loop --------------------------------------------------------------------------
    def train(self) -> Summary:
        """One iteration, one optimizer step: its batches, the step, what is kept of it, and
        whether the run ends there."""
        self._begin()
        status = None
        for batch in self.steps():
            done = self.step(batch)
            t = time.perf_counter()
            self.record(done)
            self.clock.add("record", time.perf_counter() - t)
            self._pace()
            if status := self.should_stop():
                break
        if self.bar is not None:
            self.bar.close()
            self.log.bar = None
        return self._finish(status or "finished")

    @contextmanager
    def _doing(self, what: str) -> Iterator[None]:
        """The loop's work besides stepping, for the heartbeat (Trainer.busy): local work
        only, never a collective (a hung rank must read stalled at the step's pace)."""
        before, self.busy = self.busy, what
        try:
            yield
        finally:
            self.busy = before

    def _pace(self) -> None:
        """One more step done: the time since the step before (within an epoch; steps()
        forgets the last one at each epoch's start) into the run's pace."""
        now = time.perf_counter()
        if self._paced_at is not None:
            sample = now - self._paced_at
            self.pace_s = sample if self.pace_s is None else 0.8 * self.pace_s + 0.2 * sample
        self._paced_at = now

    def _begin(self) -> None:
        self.t_start = time.perf_counter()
        if self.resume_state is not None:
            self.log(f"resuming run {self.run_id} from step {self.pos.step} "
                     f"(epoch {self.pos.epoch}, batch {self.pos.batch})")
            assumed = recorded.as_recorded(dict(self.resume_state.get("config") or {}))[1]
            if assumed:     # written before those knobs: read as that version ran it
                self.log("its checkpoint was written by an earlier version: read with "
                         f"{recorded.words(assumed)} (what that version did)")
        self.bar = self._progress_bar()
        self.clock.lap(self.pos.samples)
        self.meter.start()
        # What else took the CPU while this run was timed (core.processes.contention), the
        # processes of the study that started it not counted; one process of a data-parallel run
        # cannot tell its peers from strangers: not recorded there.
        self.machine_at_start = None if self.group.active else \
            contention.snapshot(supervisor.owner())
        self.model.train()
        if self.resume_state is None:
            self.record_fingerprint()     # step 0: were the two runs even initialised alike?
            # A crash before the first periodic checkpoint can still be continued (exactly).
            self.write_checkpoint()

    def steps(self) -> Iterator[Step]:
        """The optimizer steps left to train, each as its micro-batches. Owns the epochs:
        each epoch's data (its shard, set_epoch), the resume's fast-forward to the batch of
        the checkpoint (_epoch_iterator), and an epoch's end: the scheduler, the evaluation,
        the epoch's checkpoint. Leaving the loop early leaves the epoch unfinished, as a
        checkpoint of that moment records it."""
        cfg = self.cfg
        while self.pos.epoch < cfg.epochs and self.pos.step < self.limit:
            self.busy = "starting the epoch's data loading"     # (workers start here)
            self._paced_at = None
            it = self._epoch_iterator()
            first = self._next_batch(it)
            while first is not None:
                size = min(cfg.grad_accum_steps, self.batches_per_epoch - self.pos.batch)
                self.busy = None
                yield Step(size, self._rest_of_step(first, it, size))
                first = self._next_batch(it)
            self.busy = None        # (the epoch's end marks its evaluation and checkpoint)
            self._end_epoch()

    def _next_batch(self, it: Iterator[Any]) -> Any:
        """The loader's next batch (None at the epoch's end); waiting for it is data time."""
        t = time.perf_counter()
        batch = next(it, None)
        self.clock.add("data", time.perf_counter() - t)
        return batch

    def _rest_of_step(self, first: Any, it: Iterator[Any], size: int) -> Iterator[Any]:
        """A step's micro-batches, each fetched only when the step is ready for it: data
        loading and computing draw their random numbers in one order, the training's."""
        yield first
        for _ in range(size - 1):
            batch = self._next_batch(it)
            if batch is None:
                return
            yield batch

    def _end_epoch(self) -> None:
        cfg = self.cfg
        self.pos.epoch += 1
        self.pos.batch = 0
        if not self.schedule_per_step:
            self.scheduler.step()
        if cfg.eval_every and self.pos.epoch % cfg.eval_every == 0:
            self.evaluate()
        if cfg.checkpoint_every == 0 and self.pos.epoch < cfg.epochs \
                and self.pos.step < self.limit:
            self.write_checkpoint()
        self.log(f"epoch {self.pos.epoch}/{cfg.epochs} done at step {self.pos.step}")

    def step(self, batch: Step) -> StepDone:
        """One optimizer step with the knobs applied: each micro-batch copied to the device
        (non_blocking, channels_last), forward under autocast, backward through the loss
        scaler, DDP's gradient all-reduce on the last micro-batch only; then the optimizer
        (gradient clipping, the norm at log points). Callable on its own from a restored
        state: replaying step N runs this same code. With cuda_graph = step its first steps
        run here, on the graphs' stream; every later one replays CUDA graphs of the same
        forward, loss, backward and update (engine/graphs.py)."""
        if self.step_graph is not None:
            if self.step_graph.warm:
                return StepDone(*self.step_graph.replay(batch))
            with self.step_graph.warming():
                return self._step(batch)
        return self._step(batch)

    def _step(self, batch: Step) -> StepDone:
        cfg, clock = self.cfg, self.clock
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()
        step_loss = None
        for k, (x, y) in enumerate(batch.micro_batches):   # (fetching one: data time)
            clock.start()
            x = batch_in(cfg, x.to(self.device, non_blocking=self.non_blocking))
            y = y.to(self.device, non_blocking=self.non_blocking)
            clock.done("copy")
            last = k + 1 == batch.size
            sync = nullcontext() if self.ddp is None or last else self.ddp.no_sync()
            with sync:
                loss = forward_loss(cfg, self.forward, x, y)   # (engine/step.py)
                if cfg.grad_accum_steps > 1:    # (a division by 1: an op per step, no bit)
                    loss = loss / cfg.grad_accum_steps
                clock.done("forward")
                self.scaler.scale(loss).backward()      # (DDP's all-reduce included)
                clock.done("backward")
            step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
            self.pos.batch += 1
            self.pos.samples += len(y) * self.group.world   # every rank takes as many
        norm = self._optimizer_step(want_norm=(self.pos.step + 1) % cfg.log_every == 0)
        self.pos.step += 1
        self.first_bad_step = self.nan_watch(step_loss, self.pos.step)
        clock.done("optimizer")
        return StepDone(step_loss, norm)

    def record(self, done: StepDone) -> None:
        """What is kept of a step: a row at log points (the loss's one sync), fingerprints
        and checkpoints when due, the run's progress."""
        if self.pos.step % self.cfg.log_every == 0 or self.pos.step >= self.limit:
            self._log_step(done.loss, done.grad_norm)
            if self.bar is not None:
                self.bar.set_postfix(loss=f"{self.last_loss:.4f}", refresh=False)
        if self.bar is not None:
            self.bar.update(1)
        cfg, step = self.cfg, self.pos.step
        if cfg.fingerprint_every and step % cfg.fingerprint_every == 0:
            self.record_fingerprint()
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
            self.write_checkpoint()
        self.recorder.progress(step, self._epoch_float())

    def should_stop(self) -> str | None:
        """How the run ends after this step ("stopped", "diverged", "finished"), or None to
        go on. Every rank of a data-parallel run stops at the same step, whichever was asked
        or diverged: the agreed flag decides (a SIGTERM whose handler ran during the
        all-reduce stays requested on its rank and is agreed on next step)."""
        stop_now = self.stop_requested
        if self.group.active:
            stop_now, gone = self.group.agree(self.stop_requested, self.diverged is not None)
            self.stop_requested = self.stop_requested or stop_now
            if gone and self.diverged is None:
                self._diverge(self.pos.step, "another rank's parameters became NaN/inf "
                              f"(noticed at step {self.pos.step})")
        if self.kill_at_step is not None and self.pos.step >= self.kill_at_step:
            if self.group.active:         # a crash of the launcher: its ranks die with it
                os.kill(os.getppid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)        # a crash, on purpose
        if not (stop_now or self.pos.step >= self.limit or self.diverged):
            return None
        return "diverged" if self.diverged else "stopped" if self.stop_requested \
            else "finished"

    def _optimizer_step(self, want_norm: bool) -> torch.Tensor | None:
        norm = self.grad_norm() if self.cfg.clip_grad_norm > 0 or want_norm else None
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.advance_schedule()
        return norm

    def nan_watch(self, step_loss: torch.Tensor, step: int | torch.Tensor) -> torch.Tensor:
        """The first step whose loss is NaN/inf (-1: none yet), with this step's loss
        seen: kept on the device, no sync per step (read at log points)."""
        return torch.where(torch.isfinite(step_loss) | (self.first_bad_step >= 0),
                           self.first_bad_step, step)

    def grad_norm(self) -> torch.Tensor:
        """The gradients' total L2 norm (unscaled first under fp16's scaler), clipped to
        clip_grad_norm where that is set. No sync."""
        self.scaler.unscale_(self.optimizer)
        if self.cfg.clip_grad_norm > 0:
            return nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_grad_norm)
        return nn.utils.get_total_norm(
            [p.grad for p in self.model.parameters() if p.grad is not None])

    def advance_schedule(self) -> None:
        """A per-step schedule's next rate. A run continued past its planned steps keeps the
        schedule's last rate (OneCycleLR refuses to step past its end; a cosine would rise
        again)."""
        if self.schedule_per_step and self.scheduler.last_epoch < schedule_end(self.scheduler):
            self.scheduler.step()
