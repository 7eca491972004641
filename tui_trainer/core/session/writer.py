"""A training process's writer of its rows: batched, at most one transaction a second,
and its run's figures followed as the rows are written (kept with them).

Core layer: imports neither torch nor textual.
"""

from __future__ import annotations

import time

from ..analysis import figures
from .schema import EVAL_COLUMNS, STEP_COLUMNS, as_read
from .store import SessionStore


class BatchedWriter:
    """Buffers metric rows of one run and writes them in one transaction at most every
    `interval` seconds (or when asked), so a fast loop does not pay a commit per step."""

    def __init__(self, store: SessionStore, run_id: int, interval: float = 1.0):
        self.store = store
        self.run_id = run_id
        self.interval = interval
        self._steps: list[dict] = []
        self._evals: list[dict] = []
        self._fps: list[dict] = []
        self._last = time.monotonic()
        self._progress: tuple[int, float] | None = None
        self._first_step = True
        # The run's figures from every row it has (core.analysis.figures), fed each row as it is
        # written; None while they cannot be (a resumed run re-recording steps it had
        # before: they are computed from the rows again once it is past them, _past).
        self.live: figures.Figures | None = None
        self._seeded = False
        self._past = -1

    def step(self, row: dict) -> None:
        self._steps.append(row)
        self._progress = (row["step"], row["epoch"])
        if self._first_step:          # written at once: the dashboard shows the run going
            self._first_step = False
            self.flush()
        else:
            self.maybe_flush()

    def eval(self, row: dict) -> None:
        self._evals.append(row)
        self.flush()

    def fingerprint(self, row: dict) -> None:
        self._fps.append(row)
        self.maybe_flush()

    def progress(self, step: int, epoch: float) -> None:
        self._progress = (step, epoch)

    def maybe_flush(self) -> None:
        if time.monotonic() - self._last >= self.interval:
            self.flush()

    def flush(self) -> None:
        if self._steps or self._evals or self._fps or self._progress is not None:
            self._follow()
            self.store.write_batch(self.run_id, self._steps, self._evals, self._fps,
                                   self._progress, self.live)
            if self.live is None and self._steps and self._steps[-1]["step"] > self._past:
                # past what it re-recorded: from the rows once, then followed again
                self.live = self.store._from_rows(self.run_id)
                self.store.write_batch(self.run_id, [], [], [], None, self.live)
            self._steps, self._evals, self._fps = [], [], []
            self._progress = None
        self._last = time.monotonic()

    def _follow(self) -> None:
        """Feeds the rows about to be written to the live figures, which then stay those
        of every row of the run (rows come in step order; a row for a step already stored
        replaces it, which a running figure cannot undo)."""
        if not self._seeded:                # what the run has already (a resumed run's)
            self._seeded = True
            last = self.store.last_step(self.run_id)
            self._past = last["step"] if last is not None else -1
            if self._steps and self._steps[0]["step"] <= self._past:
                self.live = None            # re-recording steps it had: no use reading them
            else:
                self.live = self.store._from_rows(self.run_id)
        for r in self._steps:
            if self.live is not None and r["step"] > self.live.steps:
                self.live.add_step(as_read(r, STEP_COLUMNS))
            else:
                self.live = None
        for r in self._evals:
            if self.live is not None and (self.live.eval_step is None
                                          or r["step"] >= self.live.eval_step):
                self.live.add_eval(as_read(r, EVAL_COLUMNS))
            else:
                self.live = None
