"""Following a session as it changes: what the dashboard shows, read incrementally.

One `SessionReader` lives in the dashboard's polling thread, with its own read-only
connection (reading never writes). Each `tick()` costs what changed, not what is stored:

- new metric rows of every run come from one query per table over the rows after a global
  cursor (the tables' integer primary keys), so 4 runs or 200, 100 steps or 100,000, a tick
  reads only the rows written since the last one;
- the runs table is re-read only for runs that are new or were live at the last tick (a
  finished run changes only through this dashboard, which asks for a full re-read then, or
  through another process, which the periodic full re-read every FULL_EVERY_S catches);
- each run's figures (core.analysis.figures) are fed the new rows, and a run's series are kept only
  for the runs the screen shows.

Core layer: imports neither torch nor textual.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..processes import contention
from ..analysis import figures
from ..settings.config import DEFAULTS, world_size
from ..analysis.activations import EVENT as SEEN
from ..analysis.explain import EVENT as EXPLAINED
from ..processes.liveness import stall_window
from ..analysis.memory import EVENT as MEASURED
from ..analysis.profiling import EVENT as PROFILED
from .schema import ENDED
from .store import SessionStore

FULL_EVERY_S = 10.0
CATCH_UP_S = 0.2            # of each tick, for an older session's runs (SessionReader._catch_up)
# The events of the runs a tick checks (the pair, the cursor's, a check's): determinism
# verdicts, the twins checks made, replicas that drifted apart, explanations, memory
# breakdowns, profiles, what a net sees in a digit, the source of a net of the user's own
# file (its verdicts say how two runs' code differs).
CHECK_EVENTS = ("repro_verdict", "check_twin", "replicas_drift", EXPLAINED, MEASURED,
                PROFILED, SEEN, "model_source")


def reason_of(summary: dict[str, Any]) -> str | None:
    """Why a run ended as it did (crashed, diverged), or what it was when copied."""
    return summary.get("error") or summary.get("diverged") or summary.get("copied")


def shown_status(status: str, stalled_s: float | None) -> str:
    """A run's status as the table and `runs` say it: a live run whose step has not moved
    for STALL_S (core.processes.liveness.stalled_for) reads stalled."""
    return "stalled" if stalled_s else status


def stall_note(run: dict[str, Any]) -> str | None:
    """What a stalled run's reading says: how long, where, and what ends it."""
    idle = run.get("stalled_s")
    if not idle:
        return None
    config = run.get("config") or {}
    if world_size(config) > 1:
        timeout = config.get("dist_timeout", DEFAULTS.dist_timeout)   # older runs: the default
        why = ("a process of its group may be hung or stopped, the others waiting for it in "
               f"a collective; they give up after dist_timeout ({timeout} s)")
    else:
        why = "its loop is stuck (a data-loader worker, a long operation)"
    pace = run.get("pace_s")
    expected = (f"; it stepped every {f'{pace:.2g} s' if pace < 60 else figures.duration(pace)}"
                f", so {figures.duration(stall_window(run))} without a step reads stalled"
                if isinstance(pace, (int, float)) and not isinstance(pace, bool) and pace > 0
                and not run.get("busy") else "")
    return (f"no step for {figures.duration(idle)} (at step {run['step']}{expected}) though "
            f"its process beats: {why}. Stop ends it")


@dataclass(frozen=True)
class RunRow:
    """One run as the run table shows it."""
    id: int
    name: str
    status: str               # effective: a run whose process is gone reads crashed
    step: int
    epoch: float
    config: dict[str, Any]
    settings: dict[str, Any] | None
    twin_of: int | None
    created: float
    reason: str | None        # why it crashed or diverged, what it was when copied, or why
    #                           it reads stalled
    train_loss: float | None
    eval_loss: float | None
    accuracy: float | None    # a fraction, as stored (figures.fmt writes it in percent)
    samples_per_s: float | None
    peak_memory_mib: float | None
    memory_kind: str | None
    elapsed: float | None
    progress: float | None
    eta_s: float | None
    notes: str = ""
    tags: tuple[str, ...] = ()
    hidden: bool = False
    dataset: str | None = None
    stalled_s: float | None = None   # a live run's step has not moved for this long
    phase_ms: tuple[tuple[str, float], ...] | None = None   # ms per step by phase (figures)
    not_learning: str | None = None  # why it reads "not learning" (figures.not_learning_text)
    workers_mib: float | None = None  # its DataLoader workers' part of peak_memory_mib
    last_phase_ms: tuple[tuple[str, float], ...] | None = None   # ... its last interval
    crowded: str | None = None   # its threads outnumber the free cores (contention.run_crowded)
    loaded: str | None = None    # others took the CPU while it trained (contention.run_loaded)

    @property
    def live(self) -> bool:
        return self.status in ("created", "running")


@dataclass
class RunSeries:
    """Every logged point of one run, in step order (a resumed run's re-recorded steps
    replace the old ones)."""
    steps: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    fingerprints: list[dict[str, Any]] = field(default_factory=list)
    version: int = 0

    def add(self, table: str, row: dict[str, Any]) -> None:
        rows = getattr(self, table)
        if rows and row["step"] <= rows[-1]["step"]:
            # A re-recorded step: a new list (a reader of the old one is not disturbed).
            rows = [r for r in rows if r["step"] < row["step"]]
            setattr(self, table, rows)
        rows.append(row)

    def column(self, name: str) -> tuple[list[int], list[Any]]:
        rows = self.steps
        return [r["step"] for r in rows], [r.get(name) for r in rows]


@dataclass(frozen=True)
class Snapshot:
    """What one tick found. `runs` is the whole table (a new tuple only when a row changed);
    `series` holds the watched runs' points; `runs_version` and each series' version say
    whether anything is new, so a panel redraws only when its data changed."""
    runs: tuple[RunRow, ...]
    runs_version: int
    series: dict[int, RunSeries]
    studies: tuple[dict[str, Any], ...]
    study: dict[str, Any] | None            # the study shown, with its table rows
    # repro verdicts, check twins and replica drifts (data-parallel runs), by run
    checks: dict[int, list[dict[str, Any]]]
    read_ms: float


class SessionReader:
    def __init__(self, store: SessionStore):
        self.store = store
        self.cursors = {"steps": 0, "evals": 0, "fingerprints": 0}
        self.figures: dict[int, figures.Figures] = {}
        self.series: dict[int, RunSeries] = {}
        self.hashes: dict[int, dict[int, str]] = {}     # read when asked for (hashes_of)
        self._seeded_upto: dict[int, dict[str, int]] = {}
        # ended runs' figures computed from their rows, not kept yet (for the poller's writer)
        self.unkept: list[tuple[dict[str, Any], figures.Figures]] = []
        self._behind: list[int] = []        # shown from an older summary's figures (_catch_up)
        self._started = False
        self.rows: dict[int, RunRow] = {}
        self.raw: dict[int, dict[str, Any]] = {}
        self.version = 0
        self._tuple: tuple[RunRow, ...] = ()
        self._full_at = 0.0
        self._max_id = 0
        self._force_full = True
        self._study_key: Any = None
        self._study: dict[str, Any] | None = None
        self._labels: dict[int, dict[str, Any]] = {}
        self._studies: tuple[dict[str, Any], ...] = ()
        self._studies_at = 0.0

    def invalidate(self) -> None:
        """The next tick re-reads the runs table (after a rename, a delete, new labels)."""
        self._force_full = True

    # --- one tick ------------------------------------------------------------------------
    def tick(self, watched: tuple[int, ...] = (), study: int | None = None,
             checks_for: tuple[int, ...] = ()) -> Snapshot:
        t0 = time.perf_counter()
        if not self._started:
            # Rows stored before the first tick are read per run when it is first seen (or
            # not at all: an ended run's figures are kept in the session); the tick reads only
            # rows written after this point.
            self._started = True
            self.cursors = {t: self.store.last_row_id(t) for t in self.cursors}
        changed_runs = self._read_runs()
        touched = self._read_rows() | self._catch_up()
        for rid in set(watched) - set(self.series):
            self._load_series(rid)
        for rid in list(self.series):
            if rid not in watched:
                del self.series[rid]
        for rid in changed_runs | touched:
            run = self.raw.get(rid)
            if run is None:
                continue
            before = self.rows.get(rid)
            row = self._row(run)
            if row != before:
                self.rows[rid] = row
                changed_runs.add(rid)
        for rid in [r for r in self.rows if r not in self.raw]:
            del self.rows[rid]
            changed_runs.add(rid)
        if changed_runs:
            self.version += 1
            self._tuple = tuple(self.rows[r] for r in sorted(self.rows))
        snap = Snapshot(
            runs=self._tuple, runs_version=self.version,
            series={r: self.series[r] for r in watched if r in self.series},
            studies=self._read_studies(),
            study=self._read_study(study),
            checks={r: self.store.events(r, CHECK_EVENTS) for r in checks_for if r in self.raw},
            read_ms=(time.perf_counter() - t0) * 1000)
        return snap

    def _read_studies(self) -> tuple[dict[str, Any], ...]:
        """The studies, re-read at most once a second (and on a full read)."""
        now = time.monotonic()
        if now - self._studies_at >= 1.0:
            self._studies_at = now
            self._studies = tuple(self.store.studies())
        return self._studies

    # --- the runs table ----------------------------------------------------------------------
    def _read_runs(self) -> set[int]:
        now = time.monotonic()
        if self._force_full or now - self._full_at >= FULL_EVERY_S:
            self._force_full, self._full_at, self._studies_at = False, now, 0.0
            runs = self.store.runs()
            labels = self.store.labels()
            fresh = {r["id"]: r for r in runs}
            changed = {rid for rid, r in fresh.items() if self.raw.get(rid) != r
                       or labels.get(rid) != self._labels.get(rid)}
            self._labels = labels
            changed |= set(self.raw) - set(fresh)
            self.raw = fresh
            self._max_id = max(fresh, default=0)
            return changed
        live = [rid for rid, row in self.rows.items() if row.live]
        fresh_runs = self.store.runs_where(after_id=self._max_id, ids=live)
        changed = set()
        for r in fresh_runs:
            if self.raw.get(r["id"]) != r:
                self.raw[r["id"]] = r
                changed.add(r["id"])
            self._max_id = max(self._max_id, r["id"])
        return changed

    def _row(self, run: dict[str, Any]) -> RunRow:
        rid = run["id"]
        f = self.figures.get(rid)
        if f is None:
            f = self.figures[rid] = self._seed_figures(run)
        summary = run["summary"] or {}
        elapsed = summary.get("elapsed_s") if run["status"] in ENDED else None
        elapsed = elapsed if elapsed is not None else f.elapsed
        progress, eta = figures.progress(run["config"] or {}, run["step"], run["epoch"], f.elapsed)
        labels = self._labels.get(rid, {})
        return RunRow(
            id=rid, name=run["name"], status=run["status"], step=run["step"],
            epoch=run["epoch"], config=run["config"] or {}, settings=run["settings"],
            twin_of=run["twin_of"], created=run["created"],
            reason=stall_note(run) or reason_of(summary), stalled_s=run.get("stalled_s"),
            train_loss=f.train_loss, eval_loss=f.eval_loss, accuracy=f.accuracy,
            samples_per_s=f.samples_per_s, peak_memory_mib=f.peak_memory_mib,
            memory_kind=f.peak_memory[1], elapsed=elapsed,
            progress=progress, eta_s=eta if run["status"] == "running" else None,
            notes=labels.get("notes", ""), tags=tuple(labels.get("tags", ())),
            hidden=labels.get("hidden", False), dataset=run["dataset"],
            phase_ms=tuple(f.phase_ms.items()) if f.phase_ms else None,
            last_phase_ms=tuple(f.last_phase_ms.items()) if f.last_phase_ms else None,
            not_learning=figures.not_learning_text(f, run["config"] or {}),
            workers_mib=f.workers_mib, crowded=contention.run_crowded(run),
            loaded=contention.run_loaded(run))

    def _seed_figures(self, run: dict[str, Any]) -> figures.Figures:
        """A run seen for the first time: an ended run's figures as kept when it ended
        (SessionStore.figures_of), else from every row it has so far (indexed reads of that
        run, once); later rows come through the tick. An ended run's figures computed here
        (a session from before they were kept) wait in `unkept` for a writer to keep."""
        if run.get("stored_status") in ENDED:
            kept = self.store.kept_figures(run)
            if kept is not None:
                return kept
            legacy = (run.get("summary") or {}).get("figures")
            if figures.valid_state(legacy) and legacy.get("steps") == run.get("step"):
                # A session from before figures were kept: its summary's (the definition of
                # its day) until computed from its rows, a few runs per tick (_catch_up).
                self._behind.append(run["id"])
                return figures.Figures.restore(legacy)
            f = self._figures_from_rows(run["id"])
            self.unkept.append((run, f))
            return f
        return self._figures_from_rows(run["id"])

    def _catch_up(self) -> set[int]:
        """Ended runs shown from their summary's figures (an older session), computed from
        their rows now, for CATCH_UP_S of each tick at most: the first screen of a session
        with a long history does not wait for all of it (1,000 such runs of 2,000 steps
        take some 46 s here). Each goes to `unkept`, for the writer to keep."""
        done: set[int] = set()
        end = time.perf_counter() + CATCH_UP_S
        while self._behind and time.perf_counter() < end:
            rid = self._behind.pop(0)
            run, f = self.raw.get(rid), self.figures.get(rid)
            if run is None or f is None or not f.frozen:
                continue            # deleted, or trained on since: computed from its rows
            f = self.figures[rid] = self._figures_from_rows(rid)
            if run.get("stored_status") in ENDED:
                self.unkept.append((run, f))
            done.add(rid)
        return done

    def _figures_from_rows(self, rid: int) -> figures.Figures:
        steps, evals = self.store.steps(rid), self.store.evals(rid)
        self._seeded_upto[rid] = {"steps": max((r["id"] for r in steps), default=0),
                                  "evals": max((r["id"] for r in evals), default=0)}
        return figures.figures(steps, evals)

    def hashes_of(self, rid: int) -> dict[int, str]:
        """A run's parameter hashes by step, read when first asked for."""
        if rid not in self.hashes:
            self.hashes[rid] = figures.hashes(self.store.fingerprints(rid))
        return self.hashes[rid]

    # --- metric rows
    # ---------------------------------------------------------------------------
    def _read_rows(self) -> set[int]:
        touched: set[int] = set()
        for table in ("steps", "evals", "fingerprints"):
            rows = self.store.rows_after(table, self.cursors[table])
            for r in rows:
                self.cursors[table] = max(self.cursors[table], r["id"])
                rid = r["run_id"]
                s = self.series.get(rid)
                if s is not None:
                    s.add(table, r)
                    s.version += 1
                if table == "fingerprints":
                    if rid in self.hashes:
                        self.hashes[rid][r["step"]] = r["sha256"]
                    continue
                if rid not in self.figures:
                    continue        # its figures are seeded from the store when first seen
                touched.add(rid)
                if r["id"] <= self._seeded_upto.get(rid, {}).get(table, 0):
                    continue        # the seeding read it already
                f = self.figures[rid]
                if table == "steps":
                    if f.frozen or r["step"] <= f.steps:
                        # Restored from a summary and trained on, or re-recorded after a
                        # resume: from every row again (this row included).
                        self.figures[rid] = self._figures_from_rows(rid)
                    else:
                        f.add_step(r)
                elif f.frozen:
                    self.figures[rid] = self._figures_from_rows(rid)
                else:
                    f.add_eval(r)
        return touched

    def _load_series(self, rid: int) -> None:
        s = RunSeries(steps=self.store.steps(rid), evals=self.store.evals(rid),
                      fingerprints=self.store.fingerprints(rid), version=1)
        self.series[rid] = s

    # --- studies ---------------------------------------------------------------------------
    def _read_study(self, study_id: int | None) -> dict[str, Any] | None:
        from ..analysis.study import stored_problem, table as study_table
        if study_id is None:
            return None
        known = {s["id"]: s for s in self._studies}
        if study_id not in known:
            return None
        st = known[study_id]
        problem = stored_problem(st)
        if problem is not None:         # (session data: shown as damaged, never read on)
            key = (study_id, st["status"], problem)
            if key != self._study_key:
                self._study_key, self._study = key, {**st, "rows": [], "damaged": problem}
            return self._study
        if st["kind"] == "price":       # priced in windows: what its spec keeps (pricing.py)
            key = (study_id, st["status"], repr(st["spec"].get("prices")))
            if key != self._study_key:
                self._study_key, self._study = key, {**st, "rows": []}
            return self._study
        if any(v["run_id"] is not None and v["run_id"] not in self.rows
               for v in st["variants"]):
            return self._study          # a run the table has not read yet: next tick
        runs = tuple((v["run_id"], self.rows[v["run_id"]] if v["run_id"] else None, v["note"])
                     for v in st["variants"])
        key = (study_id, st["status"], runs)
        if key != self._study_key:
            self._study_key = key
            # From the figures and hashes this reader keeps: no step row is read again.
            study, rows = study_table(
                self.store, study_id,
                figures_of=lambda r: {"status": self.rows[r].status, "steps": self.rows[r].step,
                                      **self.figures[r].as_dict()},
                hashes_of=self.hashes_of, study=st)
            self._study = {**study, "rows": rows}
        return self._study

