"""The figures shown for a run, each defined once: the CLI, the run table, Compare, A/B and
the exports all take them from here.

- samples/s: TRAINING throughput, the median of the logged interval rates with the first
  interval left out (start-up: workers spawning, first allocations, cudnn.benchmark trials,
  compilation). A median, so an evaluation or a checkpoint that falls inside an interval
  does not drag it down. It is not the whole-run average (samples / wall time), which mixes
  in start-up and evaluation; that one is `wall_s` next to it. Each phase's milliseconds
  per step are medians over the same intervals (WINDOW), so the two tell one story.
- peak memory: the CUDA peak allocated where the run recorded one, else the process's peak
  resident set size (RSS: its high-water mark per log interval, on Linux); `kind` says
  which. The tensors of the training state alone are `tensor_bytes` (plotted, exported).
- loss: the evaluation loss (on the held-out set, at the last evaluation) and the smoothed
  training loss (an exponential moving average of the logged mini-batch losses, debiased as
  TensorBoard does, weight SMOOTHING). One mini-batch's loss is never shown as "the" loss.
- identity: two runs' parameter hashes compared at every step both recorded.

`Figures` is built incrementally (`add_step`, `add_eval`): the dashboard feeds it new rows
as they arrive, so its cost per tick is the number of new rows, not the length of the run.

Core layer: imports neither torch nor textual.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

# The definition's version: raised whenever a figure's definition changes, so that figures
# kept for an ended run (SessionStore.figures_of) by another definition are computed again
# from the rows.
VERSION = 1
SMOOTHING = 0.8          # the EMA weight of the smoothed training loss (as TensorBoard's 0.8)
# A run that does not learn: its smoothed training loss at chance, CHANCE_BAND around ln 10
# (what a net that guesses among the 10 digits gets; a fresh net's loss lies a little above
# it), or its gradient norm 0, for NOT_LEARNING_STEPS steps or more. (Every net starts at
# chance; one that learns leaves it within some 20 steps.)
CHANCE_LOSS = math.log(10)
CHANCE_BAND = (-0.05, 0.10)
NOT_LEARNING_STEPS = 50

# Where a step's time goes, in the order a step spends it: waiting for the loader, copying
# the batch to the device, forward (and loss), backward (a data-parallel run's all-reduce
# included), optimizer (clipping, the step, zero_grad), and the loop's own recording (rows,
# fingerprints, checkpoints, progress). Each logged row holds the seconds of each phase
# since the previous row (`data_s`, `copy_s`, ...); `compute_s` is the device phases'.
PHASES = ("data", "copy", "forward", "backward", "optimizer", "record")
DEVICE_PHASES = ("copy", "forward", "backward", "optimizer")

# How each figure is written, where it is written as text. Accuracy is a fraction (0.9731)
# everywhere it is kept or computed, and written in percent ("97.31") under a "%" heading:
# PERCENT names the figures shown that way (fmt scales them; nothing else does).
PERCENT = frozenset({"accuracy"})
FORMATS = {"samples_per_s": ",.0f", "data_wait_s": ".2f", "peak_memory_mib": ",.0f",
           "eval_loss": ".4f", "train_loss": ".4f", "accuracy": ".2f", "wall_s": ".1f"}
LABELS = {"samples_per_s": "samples/s (training)", "data_wait_s": "data wait s",
          "peak_memory_mib": "peak memory MiB",
          "eval_loss": "eval loss", "train_loss": "train loss (smoothed)",
          "accuracy": "eval accuracy %", "wall_s": "wall time s"}
# The window of every per-step figure (samples/s and each phase's ms per step), said once
# wherever they are shown together; and what wall time holds, which is not in that window.
WINDOW = ("samples/s and ms/step: the median of the logged intervals, the first (start-up) "
          "left out")
WALL = "wall time: the whole run, start-up, evaluations and checkpoints included"
EXPLAINED = (
    "samples/s: training throughput, the median of the logged intervals with the first "
    "(start-up) left out (each phase's ms/step too); peak memory: GPU peak allocated on CUDA, else the run's RSS (its "
    "process's, plus what its DataLoader workers and other ranks hold alone, their USS; the "
    "workers' part in brackets); eval "
    "loss/accuracy: the last evaluation on the held-out set; train loss: logged mini-batch "
    f"losses smoothed (EMA {SMOOTHING}).")


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


class Smoother:
    """Debiased exponential moving average, one value at a time; NaN/inf are skipped (the
    run's divergence is said elsewhere; a NaN here would hide every value after it)."""

    def __init__(self, weight: float = SMOOTHING) -> None:
        self.weight, self.avg, self.norm = weight, 0.0, 0.0

    def add(self, y: Any) -> float | None:
        if finite(y):
            self.avg = self.weight * self.avg + (1 - self.weight) * y
            self.norm = self.weight * self.norm + (1 - self.weight)
        return self.value

    @property
    def value(self) -> float | None:
        return self.avg / self.norm if self.norm else None


def smooth(ys: Iterable[Any], weight: float = SMOOTHING) -> list[float | None]:
    """The smoothed curve of a series (None where nothing finite came yet)."""
    s = Smoother(weight)
    return [s.add(y) for y in ys]


@dataclass
class Figures:
    """A run's figures, fed its rows in step order (a resumed run's re-recorded steps replace
    the old ones: feed `reset()` and the rows again, or only new rows)."""

    steps: int = 0
    elapsed: float | None = None
    train_loss: float | None = None
    last_loss: float | None = None          # one mini-batch: shown only as "last batch"
    eval_loss: float | None = None
    accuracy: float | None = None           # a fraction (fmt writes it in percent)
    eval_step: int | None = None
    peak_cuda: float | None = None
    peak_rss: float | None = None
    # the whole run's host memory: the (lead) process's RSS, plus what its DataLoader
    # workers and other ranks hold alone (USS); and the workers' part of it
    peak_tree: float | None = None
    peak_workers: float | None = None
    grad_norm: float | None = None
    data_wait_s: float = 0.0                # total time the loop waited for batches
    # seconds per phase and the steps they cover, the first (start-up) interval left out
    phase_s: dict[str, float] = field(default_factory=dict)
    phase_steps: int = 0
    last_phase_ms: dict[str, float] | None = None   # ms per step by phase, the last interval
    _rates: list[float] = field(default_factory=list)   # sorted, first interval left out
    # each phase's ms per step in the same intervals as _rates, sorted (phase_ms: medians)
    _phase_rates: dict[str, list[float]] = field(default_factory=dict)
    _first_seen: bool = False
    _smoother: Smoother = field(default_factory=Smoother)
    frozen: bool = False        # restored from a summary: more rows need every row again
    # the first step of the current stretch at chance (smoothed loss), or of zero gradients
    chance_from: int | None = None
    zero_grad_from: int | None = None

    STATE = ("steps", "elapsed", "train_loss", "last_loss", "eval_loss", "accuracy",
             "eval_step", "peak_cuda", "peak_rss", "grad_norm", "data_wait_s", "phase_s",
             "phase_steps", "last_phase_ms", "chance_from", "zero_grad_from", "peak_tree",
             "peak_workers")

    def state(self) -> dict[str, Any]:
        """What is kept of a run's figures (SessionStore.figures_of), so that a reader need
        not read its rows again (`restore`)."""
        return {**{k: getattr(self, k) for k in self.STATE},
                "samples_per_s": self.samples_per_s, "phase_ms": self.phase_ms}

    @classmethod
    def restore(cls, state: Mapping[str, Any]) -> "Figures":
        """The figures a `state()` was taken of (valid_state says whether one can be)."""
        f = cls(frozen=True, **{k: state.get(k) for k in cls.STATE
                                if k not in ("data_wait_s", "phase_s", "phase_steps",
                                             "last_phase_ms")},
                data_wait_s=state.get("data_wait_s") or 0.0,
                phase_s=dict(state.get("phase_s") or {}),
                phase_steps=state.get("phase_steps") or 0,
                last_phase_ms=_phases_or_none(state.get("last_phase_ms")))
        if finite(state.get("samples_per_s")):
            f._rates = [state["samples_per_s"]]
        phases = _phases_or_none(state.get("phase_ms"))     # (a summary before the medians
        if phases is not None:                              # has the sums alone: their mean)
            f._phase_rates = {k: [v] for k, v in phases.items()}
        return f

    def add_step(self, row: Mapping[str, Any]) -> None:
        covered = row["step"] - self.steps
        if self._first_seen and covered > 0 and \
                all(finite(row.get(f"{k}_s")) for k in PHASES):
            for k in PHASES:
                self.phase_s[k] = self.phase_s.get(k, 0.0) + row[f"{k}_s"]
            self.phase_steps += covered
            self.last_phase_ms = {k: 1000 * row[f"{k}_s"] / covered for k in PHASES}
            for k, ms in self.last_phase_ms.items():
                bisect.insort(self._phase_rates.setdefault(k, []), ms)
        self.steps = row["step"]
        self.elapsed = row.get("elapsed", self.elapsed)
        self.last_loss = row.get("loss")
        self.train_loss = self._smoother.add(row.get("loss"))
        if isinstance(self.last_loss, float) and not math.isfinite(self.last_loss):
            self.train_loss = self.last_loss     # a diverged run's loss is NaN/inf: shown
        rate = row.get("samples_per_s")
        if finite(rate):
            if self._first_seen:
                bisect.insort(self._rates, rate)
            self._first_seen = True
        if finite(row.get("cuda_peak")) and row["cuda_peak"] > 0:
            self.peak_cuda = max(self.peak_cuda or 0.0, row["cuda_peak"])
        # the process's high-water mark of the interval where recorded (else its RSS then)
        rss = row.get("peak_rss") if finite(row.get("peak_rss")) else row.get("rss_bytes")
        if finite(rss):
            self.peak_rss = max(self.peak_rss or 0.0, rss)
            workers = row.get("workers_uss") if finite(row.get("workers_uss")) else 0.0
            ranks = row.get("ranks_uss") if finite(row.get("ranks_uss")) else 0.0
            self.peak_tree = max(self.peak_tree or 0.0, rss + workers + ranks)
            if workers > 0:
                self.peak_workers = max(self.peak_workers or 0.0, workers)
        if finite(row.get("data_s")):
            self.data_wait_s += row["data_s"]
        if row.get("grad_norm") is not None:
            self.grad_norm = row["grad_norm"]
            zero = finite(self.grad_norm) and self.grad_norm == 0
            self.zero_grad_from = (self.zero_grad_from if self.zero_grad_from is not None
                                   else row["step"]) if zero else None
        at_chance = finite(self.train_loss) and \
            CHANCE_BAND[0] <= self.train_loss - CHANCE_LOSS <= CHANCE_BAND[1]
        self.chance_from = (self.chance_from if self.chance_from is not None
                            else row["step"]) if at_chance else None

    @property
    def not_learning(self) -> tuple[str, int] | None:
        """("zero_grad" or "chance", for how many steps) once a run has not learned for
        NOT_LEARNING_STEPS steps; None while it learns (or has not run that long)."""
        for kind, since in (("zero_grad", self.zero_grad_from), ("chance", self.chance_from)):
            if since is not None and self.steps - since >= NOT_LEARNING_STEPS:
                return kind, self.steps - since
        return None

    def add_eval(self, row: Mapping[str, Any]) -> None:
        self.eval_step = row["step"]
        self.eval_loss = row.get("loss")
        self.accuracy = row.get("accuracy")

    @property
    def samples_per_s(self) -> float | None:
        return _median(self._rates)

    @property
    def phase_ms(self) -> dict[str, float] | None:
        """Milliseconds per step in each phase (PHASES): the median over the same logged
        intervals as samples_per_s (WINDOW: the first, start-up, left out), so that a
        phase's ratio and the speed's tell one story; None for a run that recorded no
        phases (before they existed) or too few rows."""
        if set(self._phase_rates) == set(PHASES):
            return {k: _median(self._phase_rates[k]) for k in PHASES}
        if not self.phase_steps or set(self.phase_s) != set(PHASES):
            return None
        return {k: 1000 * self.phase_s[k] / self.phase_steps for k in PHASES}

    @property
    def peak_memory(self) -> tuple[float | None, str | None]:
        """(bytes, "GPU" or "RSS"). RSS: the whole run's host memory, its process's resident
        set plus what its DataLoader workers and other ranks hold alone (USS; a page shared
        with the process is counted once, in its RSS)."""
        if self.peak_cuda:
            return self.peak_cuda, "GPU"
        if self.peak_tree or self.peak_rss:
            return max(self.peak_tree or 0.0, self.peak_rss or 0.0), "RSS"
        return None, None

    @property
    def workers_mib(self) -> float | None:
        """The DataLoader workers' part of the host memory (their USS at its peak), MiB."""
        return None if self.peak_workers is None else self.peak_workers / 2**20

    @property
    def peak_memory_mib(self) -> float | None:
        b, _ = self.peak_memory
        return None if b is None else b / 2**20

    def as_dict(self, wall_s: float | None = None) -> dict[str, Any]:
        """The shown figures by name (the keys of FORMATS and LABELS)."""
        return {"samples_per_s": self.samples_per_s, "peak_memory_mib": self.peak_memory_mib,
                "memory_kind": self.peak_memory[1], "eval_loss": self.eval_loss,
                "train_loss": self.train_loss, "accuracy": self.accuracy,
                "data_wait_s": self.data_wait_s if self.steps else None,
                "phase_ms": self.phase_ms,
                "wall_s": wall_s if wall_s is not None else self.elapsed,
                "workers_mib": self.workers_mib,
                "not_learning": list(self.not_learning) if self.not_learning else None}


def valid_state(state: Any) -> bool:
    """Whether a kept `Figures.state()` (read back from a session: untrusted) can be
    restored: every figure a number or None, the step counts whole numbers."""
    def number(v: Any) -> bool:
        return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))

    def whole(v: Any, none: bool = True) -> bool:
        return (none and v is None) or (isinstance(v, int) and not isinstance(v, bool))
    if not isinstance(state, dict) or not whole(state.get("steps"), none=False):
        return False
    if not all(whole(state.get(k)) for k in ("eval_step", "phase_steps", "chance_from",
                                              "zero_grad_from")):
        return False
    spans = ("phase_s", "last_phase_ms", "phase_ms")
    if not all(number(state.get(k)) for k in (*Figures.STATE, "samples_per_s")
               if k not in spans and k not in ("steps",)):
        return False
    return all(state.get(k) is None or (isinstance(state[k], dict) and all(
        isinstance(p, str) and number(v) and v is not None for p, v in state[k].items()))
        for k in spans)


def _median(values: list[float]) -> float | None:
    """The median of a sorted list (None for an empty one)."""
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def memory_lines(rows: Iterable[Mapping[str, Any]]) -> list[tuple[str, list[float | None], bool]]:
    """A run's memory over its logged rows, in MiB, as the memory plot and the exported
    figure draw it: (what, one value per row or None, faint). On CUDA the GPU's first
    (the allocator's peak, the peak its cache reserved), then the training state's tensors
    and the process's resident set (host memory: the data, the loader's buffers); on the
    CPU the resident set's peak first."""
    rows = list(rows)

    def mib(key: str, fallback: str | None = None) -> list[float | None]:
        out = []
        for r in rows:
            v = r.get(key) if finite(r.get(key)) and r.get(key) else \
                r.get(fallback) if fallback else None
            out.append(v / 2**20 if finite(v) and v else None)
        return out
    rss, tensors = mib("peak_rss", "rss_bytes"), mib("tensor_bytes")
    workers = mib("workers_uss")
    gpu = mib("cuda_peak")
    lines: list[tuple[str, list[float | None], bool]] = []
    if any(v is not None for v in gpu):
        lines += [("GPU peak", gpu, False), ("GPU reserved", mib("cuda_reserved"), True)]
    lines.append(("RSS peak", rss, bool(lines)))
    if any(v for v in workers):
        # the process and its DataLoader workers (what they hold alone), and the workers
        lines.append(("RSS + workers", [r + w if r is not None and w is not None else None
                                        for r, w in zip(rss, workers)], bool(lines[:-1])))
        lines.append(("workers (USS)", workers, True))
    if any(v is not None for v in tensors):
        lines.append(("state tensors", tensors, True))
    return lines


def _phases_or_none(value: Any) -> dict[str, float] | None:
    """A kept phase split (a summary is untrusted): every phase a finite number, else None."""
    if isinstance(value, dict) and all(finite(value.get(k)) and value[k] >= 0 for k in PHASES):
        return {k: float(value[k]) for k in PHASES}
    return None


PHASE_SHORT = {"data": "data", "copy": "copy", "forward": "fwd", "backward": "bwd",
               "optimizer": "opt", "record": "rec"}


def split_text(ms: Mapping[str, float] | None, least: float = 0.01) -> str:
    """`21.2 ms: data 6% fwd 47% bwd 44% opt 3%`: a step's time and each phase's share (the
    phases under `least` of it left out); "-" when none was recorded."""
    if not ms:
        return "-"
    total = sum(ms.values())
    if total <= 0:
        return "-"
    parts = [f"{PHASE_SHORT.get(k, k)} {v / total:.0%}" for k, v in ms.items()
             if v >= least * total]
    return f"{total:.1f} ms: " + " ".join(parts)


def figures(steps: Iterable[Mapping[str, Any]], evals: Iterable[Mapping[str, Any]] = ()
            ) -> Figures:
    f = Figures()
    for row in steps:
        f.add_step(row)
    for row in evals:
        f.add_eval(row)
    return f


def not_learning_text(f: Figures, config: Mapping[str, Any]) -> str | None:
    """Why a run reads "not learning", with what usually causes it and what the config
    shows of it; None while it learns."""
    stuck = f.not_learning
    if stuck is None:
        return None
    kind, steps = stuck
    acc = (f"; eval accuracy {accuracy_text(f.accuracy)}" if finite(f.accuracy)
           and f.accuracy < 0.2 else "")
    init, lr, opt = config.get("init", "default"), config.get("lr"), config.get("optimizer")
    if kind == "zero_grad":
        what = (f"not learning: its gradient norm has been 0 for {steps} steps (nothing "
                "reaches the parameters)")
    else:
        what = (f"not learning: its loss has stayed at chance ({f.train_loss:.2f}, ln 10 = "
                f"2.30: guessing among 10 digits) for {steps} steps{acc}")
    causes = [f"a dead start (init = {init} with this seed: ReLUs that never fire; try "
              "another seed or init = default)" if init != "default" else
              "a dead start (ReLUs that never fire: try another seed)",
              f"an lr too high or too low (lr = {lr} with {opt})"]
    return f"{what}; usually {causes[0]}, or {causes[1]}"


def run_figures(store: Any, run_id: int, run: Mapping[str, Any] | None = None,
                f: Figures | None = None) -> dict[str, Any]:
    """A run's shown figures, by name: for the CLI, studies and exports. An ended run's
    come as kept when it ended (SessionStore.figures_of), a live one's from its rows; the
    dashboard keeps a Figures per run and feeds it new rows."""
    run = run if run is not None else store.run(run_id)
    f = f if f is not None else store.run_figures(run)
    summary = run["summary"] or {}
    return {"status": run["status"], "steps": run["step"],
            **f.as_dict(wall_s=summary.get("elapsed_s", f.elapsed)),
            "not_learning_text": not_learning_text(f, run["config"] or {})}


def fmt(value: Any, key: str) -> str:
    """A figure as text: '-' for none, 'nan' for NaN."""
    if value is None:
        return "-"
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if key in PERCENT and finite(value):
        value = 100 * value
    return format(value, FORMATS.get(key, ".4g"))


def accuracy_text(value: Any) -> str:
    """An accuracy (a fraction) as a line of text shows it: '97.31%', '-' for none."""
    return "-" if value is None else fmt(value, "accuracy") + "%"


def wall_samples_per_s(samples: int, elapsed_s: float) -> float | None:
    """Samples per second of wall time, start-up and evaluation included (the summary's
    second throughput, beside the training-only samples_per_s)."""
    return samples / elapsed_s if finite(elapsed_s) and elapsed_s > 0 else None


def ratio(value: Any, base: Any) -> float | None:
    return value / base if finite(value) and finite(base) and base else None


# --- parameter identity: the one hash comparison ----------------------------------------------

@dataclass
class Identity:
    identical: bool | None          # None: no step both runs fingerprinted
    compared: list[int]             # steps compared (both runs have a hash), ascending
    first_difference: int | None    # first compared step whose hashes differ
    last_identical: int | None      # the last compared step before it

    def text(self) -> str:
        if self.identical is None:
            return "no common fingerprint yet"
        if self.identical:
            return "yes"
        return f"no, from step {self.first_difference}"


def identity(hashes_a: Mapping[int, str], hashes_b: Mapping[int, str],
             since_step: int = -1) -> Identity:
    """Compares two runs' parameter hashes ({step: sha256}) at every step both have after
    `since_step`."""
    common = sorted(s for s in hashes_a.keys() & hashes_b.keys() if s > since_step)
    first = next((s for s in common if hashes_a[s] != hashes_b[s]), None)
    if not common:
        return Identity(None, [], None, None)
    if first is None:
        return Identity(True, common, None, None)
    before = [s for s in common if s < first]
    return Identity(False, common, first, before[-1] if before else None)


def hashes(fingerprint_rows: Iterable[Mapping[str, Any]]) -> dict[int, str]:
    return {r["step"]: r["sha256"] for r in fingerprint_rows}


# --- progress ---------------------------------------------------------------------------------

def progress(config: Mapping[str, Any], step: int, epoch: float, elapsed: float | None
             ) -> tuple[float | None, float | None]:
    """(fraction done, seconds left) of a run at `step` / `epoch` after `elapsed` seconds of
    training: it ends at max_steps or after `epochs`, whichever comes first. The time left
    assumes the pace so far holds."""
    fracs = []
    if config.get("max_steps"):
        fracs.append(step / int(config["max_steps"]))
    if config.get("epochs"):
        fracs.append(epoch / float(config["epochs"]))
    if not fracs:
        return None, None
    frac = min(1.0, max(fracs))
    if frac >= 1.0:
        return 1.0, 0.0
    if not frac or not elapsed:
        return frac, None
    return frac, elapsed * (1 - frac) / frac


def duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
