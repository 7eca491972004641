"""What a training process keeps of its run in the session: metric rows, evaluations,
parameter fingerprints, events, checkpoints and its progress.

Rank 0 (the lead, the one process of a run that opens the session) has a Recorder on the
store; every other rank of a data-parallel run has one on nothing (`Recorder(None, ...)`),
which keeps nothing and reads nothing back. The loop calls it the same way on every rank.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, TextIO

from ..core.analysis import figures
from ..core.session.store import SessionStore
from ..core.session.writer import BatchedWriter
from .checkpoint import fault_point, save_checkpoint


class Recorder:
    def __init__(self, store: SessionStore | None, run_id: int):
        self.store, self.run_id = store, run_id
        self.writer = BatchedWriter(store, run_id) if store is not None else None

    @property
    def keeps(self) -> bool:
        """True on the lead: what is given to it is written to the session."""
        return self.store is not None

    # --- writing -------------------------------------------------------------------------
    def row(self, row: dict[str, Any]) -> None:
        if self.writer is not None:
            self.writer.step(row)

    def evaluation(self, row: dict[str, Any], message: str) -> None:
        if self.writer is not None and self.store is not None:
            self.writer.eval(row)
            self.store.add_event(self.run_id, "eval", message, step=row["step"],
                                 data={"loss": row["loss"], "accuracy": row["accuracy"]})

    def fingerprint(self, row: dict[str, Any]) -> None:
        if self.writer is not None:
            self.writer.fingerprint(row)

    def event(self, kind: str, message: str, step: int | None = None,
              data: dict[str, Any] | None = None) -> None:
        if self.store is not None:
            self.store.add_event(self.run_id, kind, message, step=step, data=data)

    def progress(self, step: int, epoch: float, flush: bool = False) -> None:
        """How far the run is (the dashboard's progress); written at most once a second
        with the rows, or now with `flush`."""
        if self.writer is not None:
            self.writer.progress(step, epoch)
            if flush:
                self.writer.flush()
            else:
                self.writer.maybe_flush()

    def checkpoint(self, step: int, epoch: int, batch: int, state: Callable[[], dict[str, Any]],
                   keep: int) -> Path | None:
        """Writes `state()` as the checkpoint of `step` and records it, then removes the
        oldest beyond `keep`, but never the run's replay roots (SessionStore.replay_roots):
        unlisted first, deleted second, so a kill in between leaves an unlisted file (swept
        when the run next starts), never a listed checkpoint without its file. `state` is
        called only here, on the lead. Returns the file."""
        if self.store is None or self.writer is None:
            return None
        path = self.store.checkpoint_dir(self.run_id) / f"step-{step:08d}.pt"
        save_checkpoint(path, state())
        fault_point("file-in-place")
        self.writer.flush()
        self.store.add_checkpoint(self.run_id, step, epoch, batch, path)
        fault_point("recorded")
        roots = self.store.replay_roots(self.run_id)        # kept whatever `keep` says
        for old in [c for c in self.store.usable_checkpoints(self.run_id)[keep:]
                    if c["step"] not in roots]:
            self.store.mark_checkpoint_removed(old["id"])
            fault_point("unlisted")
            Path(old["path"]).unlink(missing_ok=True)
        return path

    # --- reading back (the lead's summary, an exact resume's check) ------------------------
    def fingerprint_at(self, step: int) -> str | None:
        """The hash recorded at `step` before this process (a resumed run's earlier one)."""
        return self.store.fingerprint_at(self.run_id, step) if self.store is not None else None

    def figures(self) -> figures.Figures:
        """The run's figures from every row it recorded (core.analysis.figures, the one definition):
        as its writer kept them while writing them, else read from the rows."""
        assert self.store is not None and self.writer is not None
        self.writer.flush()
        if self.writer.live is not None:
            return self.writer.live
        return figures.figures(self.store.steps(self.run_id), self.store.evals(self.run_id))

    def newest_checkpoint(self) -> str | None:
        assert self.store is not None
        newest = self.store.usable_checkpoints(self.run_id)
        return newest[0]["path"] if newest else None

    def name(self) -> str:
        assert self.store is not None
        return self.store.run(self.run_id)["name"]


def _same_file(a: TextIO, b: TextIO) -> bool:
    try:
        sa, sb = os.fstat(a.fileno()), os.fstat(b.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


class RunLog:
    """What the training process says: to the run's log file, and to stderr. A rank of a
    data-parallel run has no file of its own (`path` None): it says everything on stderr,
    which torchrun labels with its rank and the launcher writes to the run's log."""

    def __init__(self, path: Path | None, echo: TextIO | None = sys.stderr):
        self._file: TextIO | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8", buffering=1)
        # A run started in the background has its stderr going into this same file already
        # (for tracebacks): echoing there too would write every line twice.
        self._echo = None if echo is not None and self._file is not None \
            and _same_file(echo, self._file) else echo
        self.bar: Any = None

    def __call__(self, message: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        if self._file is None:
            if self._echo is not None:
                print(f"{stamp} {message}", file=self._echo, flush=True)
            return
        try:
            self._file.write(f"{stamp} {message}\n")
        except OSError:
            pass        # e.g. a full disk: the store and stderr still say what happened
        if self._echo is not None:
            if self.bar is not None:
                self.bar.write(message, file=self._echo)
            else:
                print(message, file=self._echo, flush=True)

    def to_file(self, message: str) -> None:
        """Only into the log file (a traceback of an expected failure: the user gets one
        line, the log keeps the details). Nothing without one (rank 0 of a data-parallel
        run, whose stderr is the terminal's too: the failure event keeps the traceback)."""
        if self._file is None:
            return
        try:
            self._file.write(f"{time.strftime('%H:%M:%S')} {message}\n")
        except OSError:
            pass

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
