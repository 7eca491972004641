"""What the lead of a run keeps while it trains, and says when the run ends: checkpoints,
parameter fingerprints, the watch for NaN/inf (divergence), the rows of log points, the
run's summary and its progress bar.

`Trainer` (engine/train.py) is a `Bookkeeping`: these methods read the loop's state (its
position, model, optimizer, data) and write through its Recorder (engine/recorder.py),
which on the other ranks of a data-parallel run keeps nothing.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..core.processes import contention, supervisor
from ..core.analysis import figures
from ..core.analysis.figures import DEVICE_PHASES, PHASES
from .knobs import param_fingerprint


@dataclass
class Position:
    """Where the loop is: what a checkpoint records and a resume starts from."""
    epoch: int = 0            # the epoch being trained (epochs completed so far)
    batch: int = 0            # batches of this epoch consumed
    step: int = 0             # optimizer steps in all
    samples: int = 0          # training samples seen in all


@dataclass
class Summary:
    run_id: int
    name: str
    status: str
    steps: int
    epochs: float
    final_loss: float | None          # the last logged mini-batch's loss
    train_loss: float | None          # the logged losses smoothed (core.analysis.figures)
    eval_accuracy: float | None
    eval_loss: float | None
    samples_per_s: float | None       # training throughput (core.analysis.figures)
    wall_samples_per_s: float | None  # samples / wall time, start-up and evaluation included
    elapsed_s: float
    param_sha256: str | None
    checkpoint: str | None
    dataset: str
    device: str
    resumed_from_step: int | None = None
    diverged_at_step: int | None = None
    diverged: str | None = None
    resume_fingerprints_matched: int | None = None
    resume_fingerprints_differed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.update(d.pop("extra"))
        return d


class Bookkeeping:
    """The Trainer's bookkeeping (the module's docstring); mixed into Trainer."""

    def write_checkpoint(self) -> None:
        """Writes a checkpoint of now, unless the run has diverged: the newest checkpoint
        then stays the last finite one. In a data-parallel run every rank takes part (its
        RNG states are gathered) and the lead writes the one file."""
        if self._check_finite(parameters=True):
            return
        mine = {"rng": self._rng(), "rng_epoch_start": self.rng_epoch_start,
                "rng_first_epoch": self.rng_first_epoch}
        ranks = self.group.gather(mine)        # (a collective: a hung rank holds it here)
        p = self.pos
        with self._doing("writing a checkpoint"):
            path = self._checkpoint_file(p, mine, ranks)
        self.last_checkpoint, self.last_checkpoint_step = path, p.step

    def _checkpoint_file(self, p: Position, mine: dict[str, Any], ranks: Any) -> Path | None:
        return self.recorder.checkpoint(p.step, p.epoch, p.batch, lambda: {
            "run_id": self.run_id, "config": self.cfg.to_dict(),
            "step": p.step, "epoch": p.epoch, "batch_in_epoch": p.batch,
            "samples_seen": p.samples, "elapsed": self.elapsed(),
            "last_eval_step": self.last_eval_step,
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
            **mine,
            # Data-parallel runs: every rank's RNG states, and the shuffle's seed (the epoch
            # and the batches consumed in it are the position above).
            "world_size": self.group.world,
            **({"ranks": ranks, "sampler": {"seed": self.sampler_seed, "epoch": p.epoch}}
               if self.group.active else {}),
        }, keep=self.cfg.keep_checkpoints)

    def record_fingerprint(self) -> None:
        """A hash of the parameters. In a data-parallel run every rank hashes its replica and
        the lead compares them: replicas that drift apart are recorded (`replicas_drift`)."""
        step = self.pos.step
        sha, l2 = param_fingerprint(self.model)
        shas = self.group.gather(sha)             # every rank's, on the lead; else None
        differ = [r for r, other in enumerate(shas or ()) if other != sha]
        if differ and self.replicas_drift_at is None:
            self.replicas_drift_at = step
            self.recorder.event(
                "replicas_drift",
                f"the replicas drifted apart: at step {step} the parameters of rank(s) "
                f"{', '.join(map(str, differ))} differ from rank 0's (DDP keeps them equal "
                "only while every rank applies the same averaged gradients)", step=step,
                data={"ranks": differ, "sha256": shas})
        # Steps past a resumed run's checkpoint were recorded before the stop: an exact
        # resume reproduces their hashes.
        before = self.recorder.fingerprint_at(step) if self.resume_state is not None else None
        if before is not None and before == sha:
            self.resume_matches += 1
        elif before is not None:
            self.resume_mismatches += 1
            self.recorder.event("resume_mismatch", f"after resuming, the parameters at step "
                                f"{step} differ from those recorded before the stop",
                                step=step, data={"before": before, "after": sha})
        if self.sketch is not None:               # the lead's: it is what gets recorded
            self.recorder.fingerprint({"step": step, "sha256": sha, "l2": l2,
                                       "sketch": self.sketch(self.model)})
        self.last_fingerprint = (step, sha)
        if not math.isfinite(l2) and self.diverged is None:
            self._diverge(step, f"the parameters hold NaN/inf at step {step}")

    def _diverge(self, step: int, what: str) -> None:
        self.diverged = (step, what)
        if self.recorder.keeps:
            self.log(f"diverged: {what}; every row so far is kept, and the newest checkpoint "
                     "stays the last finite one")
        self.recorder.event("diverged", what, step=step)

    def _check_finite(self, parameters: bool = False) -> bool:
        """True once the run has diverged. Reads the device-side flag of the first step
        with a non-finite loss (one sync, at log and checkpoint points only) and, with
        `parameters`, checks the parameters themselves."""
        g = self.group
        if g.active:
            # Every rank must come to the same answer, or one would leave the loop alone.
            (known,) = g.agree(self.diverged is not None)
            if known:
                if self.diverged is None:
                    self._diverge(self.pos.step, "another rank's loss or parameters became "
                                  f"NaN/inf (noticed at step {self.pos.step})")
                return True
        if self.diverged is None:
            bad = int(g.first_step(self.first_bad_step).item())
            finite = True
            if bad < 0 and parameters:
                finite = bool(torch.stack(
                    [p.isfinite().all() for p in self.model.parameters()]).all())
                (broken,) = g.agree(not finite)
                finite = not broken
            if bad >= 0:
                self._diverge(bad, f"the loss became NaN/inf at step {bad}")
            elif not finite:
                self._diverge(self.pos.step,
                              f"the parameters hold NaN/inf at step {self.pos.step}")
        return self.diverged is not None

    def _log_step(self, step_loss: torch.Tensor, norm: torch.Tensor | None) -> None:
        # The loss of a data-parallel step is the mean over the ranks (each rank's is the
        # mean of its shard); the gradient norm is already of the averaged gradients.
        # the sync of a log point (+ 0.0: a loss of -0.0, a batch predicted with p = 1, reads 0)
        self.last_loss = self.group.mean(step_loss).item() + 0.0
        dt, samples, spent = self.clock.lap(self.pos.samples)
        memory = self.meter.read(self.model, self.optimizer)
        per_rank = self.group.gather(memory)
        if per_rank is not None:        # on the lead
            if self.group.active:       # each rank's peak; the row: the most loaded rank
                for rank, m in enumerate(per_rank):
                    peak = self.rank_peaks.setdefault(rank, {})
                    for key, value in m.items():
                        if value is not None:
                            peak[key] = max(peak.get(key) or 0.0, value)
                memory = {k: max((m[k] for m in per_rank if m[k] is not None), default=None)
                          for k in memory}
                # the whole group: every rank's workers, and what each rank past the first
                # holds alone (core.analysis.figures adds them to the lead's RSS)
                memory["workers_uss"] = sum(m["workers_uss"] or 0.0 for m in per_rank)
                others = [m["own_uss"] for m in per_rank[1:]]
                memory["ranks_uss"] = None if None in others else sum(others)
            memory.pop("own_uss", None)
            row = {"step": self.pos.step, "epoch": self._epoch_float(),
                   "elapsed": self.elapsed(), "loss": self.last_loss,
                   "lr": self.optimizer.param_groups[0]["lr"],
                   "grad_norm": norm.item() if norm is not None else None,
                   "samples_per_s": samples / dt if dt > 0 else None,
                   "data_s": spent["data"], **{f"{k}_s": spent[k] for k in PHASES[1:]},
                   "compute_s": sum(spent[k] for k in DEVICE_PHASES), **memory}
            self.recorder.row(row)
        self._check_finite()

    def _finish(self, status: str) -> Summary:
        cfg = self.cfg
        machine = contention.between(self.machine_at_start,
                                     contention.snapshot(supervisor.owner())) \
            if self.machine_at_start is not None else None
        if self.last_fingerprint is None or self.last_fingerprint[0] != self.pos.step:
            self.record_fingerprint()
        self._check_finite(parameters=True)      # every rank, so that all agree
        if self.diverged is not None:
            status = "diverged"        # no evaluation of NaN weights, no NaN checkpoint
        elif cfg.eval_every and self.last_eval_step != self.pos.step:
            self.evaluate()
        if self.last_checkpoint_step != self.pos.step:
            self.write_checkpoint()
        if not self.recorder.keeps:   # another rank: the lead's summary is the run's
            return Summary(run_id=self.run_id, name="", status=status, steps=self.pos.step,
                           epochs=self._epoch_float(), final_loss=self.last_loss,
                           train_loss=None, eval_accuracy=None, eval_loss=None,
                           samples_per_s=None, wall_samples_per_s=None,
                           elapsed_s=self.elapsed(), param_sha256=None, checkpoint=None,
                           dataset=self.loaders.info.name, device=str(self.device))
        self.recorder.progress(self.pos.step, self._epoch_float(), flush=True)
        elapsed = self.elapsed()
        figs = self.final_figures = self.recorder.figures()     # kept by end_run
        last_eval = self.last_eval
        if last_eval is None and figs.eval_step == self.pos.step and figs.accuracy is not None:
            # Evaluated at this step by the process before (a finished run resumed with
            # nothing left to train): the recorded evaluation is this run's.
            last_eval = {"loss": figs.eval_loss, "accuracy": figs.accuracy}
        summary = Summary(
            run_id=self.run_id, name=self.recorder.name(), status=status,
            steps=self.pos.step, epochs=round(self._epoch_float(), 4),
            final_loss=self.last_loss, train_loss=figs.train_loss,
            eval_accuracy=last_eval["accuracy"] if last_eval else None,
            eval_loss=last_eval["loss"] if last_eval else None,
            samples_per_s=figs.samples_per_s,
            wall_samples_per_s=figures.wall_samples_per_s(self.pos.samples, elapsed),
            elapsed_s=elapsed,
            param_sha256=self.last_fingerprint[1] if self.last_fingerprint else None,
            checkpoint=self.recorder.newest_checkpoint(),
            dataset=self.loaders.info.name, device=str(self.device))
        if machine is not None:
            summary.extra["contention"] = machine
        if self.group.active:
            summary.extra.update(world_size=self.group.world, rank_peaks={
                str(r): m for r, m in sorted(self.rank_peaks.items())},
                replicas_drift_at=self.replicas_drift_at)
        if self.diverged is not None:
            summary.diverged_at_step, summary.diverged = self.diverged
        if self.resume_state is not None:
            summary.resumed_from_step = int(self.resume_state["step"])
            summary.resume_fingerprints_matched = self.resume_matches
            summary.resume_fingerprints_differed = self.resume_mismatches
            if self.resume_matches or self.resume_mismatches:
                verdict = "exact" if not self.resume_mismatches else "NOT exact"
                self.recorder.event(
                    "resume_check",
                    f"resume {verdict}: {self.resume_matches} parameter hashes recorded before "
                    f"the stop were reproduced, {self.resume_mismatches} differed",
                    data={"matched": self.resume_matches, "differed": self.resume_mismatches})
        fmt = figures.fmt              # the one way figures are written
        self.log(f"{status}: {self.pos.step} steps, train loss (smoothed) "
                 f"{fmt(summary.train_loss, 'train_loss')}, eval loss "
                 f"{fmt(summary.eval_loss, 'eval_loss')}, eval accuracy "
                 f"{figures.accuracy_text(summary.eval_accuracy)}, "
                 f"{fmt(summary.samples_per_s, 'samples_per_s')} samples/s (training)")
        crowded = contention.crowded(contention.read(machine), self.settings["num_threads"],
                                     self.device.type)
        if crowded:
            self.log(f"over the whole run: {crowded}")
        return summary

    def _progress_bar(self) -> Any:
        if not self.progress:
            return None
        from tqdm import tqdm
        cfg = self.cfg
        per_epoch = math.ceil(self.batches_per_epoch / cfg.grad_accum_steps)
        total = per_epoch * cfg.epochs
        if cfg.max_steps:
            total = min(total, cfg.max_steps)
        bar = tqdm(total=total, initial=self.pos.step, unit="step", file=sys.stderr,
                   dynamic_ncols=True, mininterval=0.25, leave=True)
        self.log.bar = bar
        return bar
