"""A/B studies: the price of each knob, measured on this machine.

A study trains a base config and one variant per value of each varied key, for the same
number of steps, one run after another (never side by side, so timings do not disturb each
other). Its table compares every variant with the base: samples/s, time waiting for data,
peak memory, final loss, accuracy, each also as a ratio to the base, and whether the variant
is bit-identical to the base.

Core layer: imports neither torch nor textual. The training itself is done by the CLI
(`tui-trainer ab`), one process per variant.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import BadInput
from ..processes import contention
from ..session.store import SessionStore
from ..settings import config
from ..settings.config import ConfigError
from ..text import name_problem, shown
from . import figures, sequential, stats

DEFAULT_STEPS = 200
# Rounds of an A/B study: enough for a 15% speed difference to come out of this machine's
# timing noise (benchmarks/ab_noise.py measures the noise; docs/benchmarks.md).
DEFAULT_REPEATS = 6
DEFAULT_SEEDS = 5
# Runs of a study trained at a time: at most one per core.
MAX_JOBS = os.cpu_count() or 1
MAX_ROUNDS = 1000       # rounds of a study, seeds of a sweep: each is a whole run per arm

# (key, heading, format) of each figure in the table; ratio_of marks those with a ratio. (key,
# heading, format) of each figure in the table, every one as defined in core.analysis.figures.
FIGURES = (("samples_per_s", "samples/s", figures.FORMATS["samples_per_s"]),
           ("data_wait_s", "data wait s", figures.FORMATS["data_wait_s"]),
           ("peak_memory_mib", "peak mem MiB", figures.FORMATS["peak_memory_mib"]),
           ("train_loss", "train loss", figures.FORMATS["train_loss"]),
           ("eval_loss", "eval loss", figures.FORMATS["eval_loss"]),
           ("accuracy", "accuracy %", figures.FORMATS["accuracy"]))


# Knobs that go together in one arm: `pin_memory=on+non_blocking=on` (a "+" before the next
# KEY=): one variant with both set, one value each.
_JOINED = re.compile(r"\+(?=\s*[A-Za-z_][A-Za-z0-9_]*\s*=)")


def parse_vary(specs: list[str]) -> list[tuple[str, list[Any]]]:
    """`KEY=V1,V2` strings -> [(key, [typed values])], each value checked like --set. A
    joined arm, `K1=V+K2=W`, is one variant setting both: ("K1+K2", [{K1: V, K2: W}])."""
    out: list[tuple[str, list[Any]]] = []
    for spec in specs:
        parts = _JOINED.split(spec)
        joined: dict[str, Any] = {}
        for part in parts:
            key, sep, text = part.partition("=")
            key = key.strip()
            if not sep or not key or not text.strip():
                raise ConfigError("--vary", f"takes KEY=V1,V2,... (values separated by "
                                  f"commas) or K1=V+K2=W (one arm setting both), got {spec!r}")
            if key in config.TRAINING_LENGTH_KEYS:
                raise ConfigError("--vary", f"{key} cannot be varied: every variant trains for "
                                  "the same steps (use --steps)")
            values = [config.check_value(key, config.parse_value(key, v))
                      for v in text.split(",") if v.strip()]
            if len(parts) > 1:
                if len(values) != 1 or key in joined:
                    raise ConfigError("--vary", f"{spec!r} joins knobs into one arm: each key "
                                      "once, with one value (K1=V+K2=W)")
                joined[key] = values[0]
            else:
                joined = {}
                out_key, out_values = key, values
        if joined:
            out_key, out_values = "+".join(joined), [joined]
        if any(out_key == k for k, _ in out):
            raise ConfigError("--vary", f"{out_key} is given twice; put all its values in one "
                              f"--vary {out_key}=V1,V2")
        out.append((out_key, out_values))
    if not out:
        raise ConfigError("--vary", "give at least one KEY=V1,V2 to vary")
    return out


def read_study_file(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A study file: a run config (the base) plus an [ab] table with `vary` (a list of
    "KEY=V1,V2" strings), and optionally `steps`, `repeats` and `name`. Returns (config
    values, ab)."""
    from ..settings.presets import resolve
    p = resolve(path, study=True)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError("--config", f"no such file: {p}") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError("--config", f"cannot read {p}: {e}") from None
    # A preset's knobs chosen per machine (core/settings/fit.py) are a study's base as the
    # file writes them: its arms price them against that
    data.pop("fit", None)
    ab = data.pop("ab", {})
    if not isinstance(ab, dict):
        raise ConfigError("ab", "must be a table: [ab] with vary = [\"KEY=V1,V2\", ...]")
    unknown = set(ab) - {"vary", "steps", "repeats", "name", "about"}
    if unknown:
        raise ConfigError(f"ab.{sorted(unknown)[0]}", "unknown; an [ab] table takes vary, "
                          "steps, repeats, name and about")
    vary = ab.get("vary", [])
    if not isinstance(vary, list) or not all(isinstance(v, str) for v in vary):
        raise ConfigError("ab.vary", 'must be a list of "KEY=V1,V2" strings')
    steps = ab.get("steps")
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool)
                              or steps < 1):
        raise ConfigError("ab.steps", f"must be an integer >= 1, got {steps!r}")
    repeats = ab.get("repeats")
    if repeats is not None and (not isinstance(repeats, int) or isinstance(repeats, bool)
                                or not 1 <= repeats <= MAX_ROUNDS):
        raise ConfigError("ab.repeats", f"must be an integer from 1 to {MAX_ROUNDS}, "
                          f"got {repeats!r}")
    for key in ("name", "about"):
        value = ab.get(key)
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"ab.{key}", f"must be a string, got {value!r}"[:200])
    if isinstance(ab.get("name"), str) and (problem := name_problem(ab["name"])):
        raise ConfigError("ab.name", problem)
    for key, value in data.items():
        if isinstance(value, dict):
            raise ConfigError(key, "tables other than [ab] are not used; keys are flat")
    # the file's relative paths (a net of the user's own file, a folder of images) are
    # relative to its folder, in its base config and its arms alike
    folder = config.file_folder(p)
    if vary:
        ab["vary"] = [_anchored_arm(spec, folder) for spec in vary]
    return {k: config.anchored(k, v, folder) for k, v in data.items()}, ab


def _anchored_arm(spec: str, folder: Path) -> str:
    """A vary string of a study file with its relative paths made relative to the file's
    folder (config.anchored); its syntax is checked later, by parse_vary."""
    parts = []
    for part in _JOINED.split(spec):
        key, sep, text = part.partition("=")
        parts.append(part if not sep else f"{key}=" + ",".join(
            str(config.anchored(key.strip(), v.strip(), folder)) if v.strip() else v
            for v in text.split(",")))
    return "+".join(parts)


def changes(key: str, value: Any) -> dict[str, Any]:
    """What a variant of `key` = `value` sets: one knob, or each of a joined arm's
    (K1=V+K2=W: key "K1+K2", value {K1: V, K2: W})."""
    return dict(value) if isinstance(value, dict) else {key: value}


def _label(key: str, value: Any) -> str:
    if isinstance(value, dict):                  # a joined arm: K1=V+K2=W
        return "+".join(_label(k, v) for k, v in value.items())
    if isinstance(value, bool):
        text = "on" if value else "off"
    elif value is None:
        text = "none"
    else:
        text = str(value)
    return f"{key}={text}"


def plan(base: config.RunConfig, vary: list[tuple[str, list[Any]]], steps: int,
         repeats: int = 1, level: float = stats.DEFAULT_LEVEL
         ) -> tuple[list[dict[str, Any]], list[str]]:
    """The runs to train, in training order, each for `steps` steps; and notes on values
    left out (a value equal to the base's is the base). Every variant is validated here, so
    a bad combination stops the study before anything trains.

    The base and each variant are the study's arms (arm 0 is the base). With `repeats` > 1
    every arm trains once per round, rounds one after the other, the arms' order reversed
    every other round (base, B, C / C, B, base / ...) so that no arm always trains first or
    last; round r trains seed + r in every arm, so a round's base and variant start alike
    and the spread between rounds is seed noise. With no variant at all that is a seed
    sweep: the base alone, once per seed."""
    if repeats < 1:
        raise ConfigError("--repeats", f"must be >= 1, got {repeats}")
    # max_steps decides; epochs only has to be enough (an epoch has at least one step).
    length = {"max_steps": steps, "epochs": min(steps, config.FIELDS["epochs"].metadata["hi"])}
    base_cfg = base.replace(**length)
    arms = [{"label": "base", "key": None, "value": None, "config": base_cfg}]
    notes: list[str] = []
    for key, values in vary:
        if "seed" in key.split("+") and repeats > 1:
            raise ConfigError("--vary", "seed cannot be varied with --repeats above 1: the "
                              "repeats vary it already (round r trains seed + r); "
                              "`tui-trainer sweep` shows seed-to-seed noise")
        for value in values:
            sets = changes(key, value)
            if all(v == getattr(base_cfg, k) for k, v in sets.items()):
                notes.append(f"{_label(key, value)} is the base's value: the base row shows it")
                continue
            try:
                cfg = base_cfg.replace(**sets)
            except ConfigError as e:
                raise ConfigError(e.key, f"{e.reason} (in the variant {_label(key, value)})") \
                    from None
            arms.append({"label": _label(key, value), "key": key, "value": value,
                         "config": cfg})
    if len(arms) == 1 and (vary or repeats == 1):
        raise ConfigError("--vary", "every value given is the base's own; nothing to compare"
                          if vary else "give at least one KEY=V1,V2 to vary")
    if 1 < repeats < stats.min_pairs(level) and len(arms) > 1:
        notes.append(f"{repeats} rounds give each round's ratio but no interval or verdict: "
                     f"a {level:.0%} interval needs {stats.min_pairs(level)} rounds or more")
    if repeats > 1 and base_cfg.seed is None:
        notes.append("seed = none: every run draws its own seed, so a round's base and "
                     "variants do not start alike (the intervals are wider)")
    runs = []
    for r in range(repeats):
        order = range(len(arms)) if r % 2 == 0 else range(len(arms) - 1, -1, -1)
        for i in order:
            cfg = arms[i]["config"]
            if repeats > 1 and cfg.seed is not None:
                cfg = cfg.replace(seed=base_cfg.seed + r)
            runs.append({**arms[i], "config": cfg.to_dict(), "arm": i, "round": r})
    return runs, notes


@dataclass
class Planned:
    """A study ready to be stored (SessionStore.create_study(kind, name, spec, runs))."""
    kind: str                      # "ab" or "sweep"
    name: str
    spec: dict[str, Any]
    runs: list[dict[str, Any]]
    notes: list[str]


DEFAULT_MAX_ROUNDS = 30    # --until-sure's bound on rounds unless given
QUIET_WAIT_S = 60.0        # how long a study waits for a quiet machine before a re-run


def check_margin(decide: float) -> None:
    """A deciding study's margin (whole runs or windows) is checked here alone."""
    if not 0.005 <= decide <= 0.5:
        raise ConfigError("--decide", "must be the margin within which two arms are the "
                          f"same, from 0.005 to 0.5 (0.05: ±5%), got {decide}")


def prepare(base: config.RunConfig, vary: list[tuple[str, list[Any]]], steps: int, *,
            repeats: int, name: str, level: float | None = None, jobs: int = 1,
            file: str | None = None, rerun_loaded: int | None = None,
            until_sure: float | None = None, max_rounds: int | None = None,
            max_time_s: float | None = None, quiet_wait_s: float | None = None,
            decide: float | None = None, spread: float | None = None) -> Planned:
    """An A/B study (or, with no vary, a seed sweep of `repeats` seeds), planned and
    checked; the one place the CLI and the dashboard build a study's spec.

    `rerun_loaded`: how many rounds that shared the CPU with another process may be trained
    again once the machine is quiet (default: as many as there are rounds; 0: none).
    `until_sure`: add rounds until every variant's samples/s interval is at most this wide
    (high / low - 1, e.g. 0.05), or `max_rounds` / `max_time_s` is reached.
    `decide`: the margin of a study that decides (core.analysis.sequential): its first
    look's rounds trained, then more up to `max_rounds` (the cap, 20 unless given) until
    every variant's samples/s is faster, slower or the same within ±margin.
    `spread`: a seed sweep that decides (no vary): its first look's seeds, then more up to
    `max_rounds` (20 unless given) until its accuracies' sd over the seeds is under or over
    `spread` (a fraction: 0.005 is 0.5 points), kept in its spec as `decide`."""
    if spread is not None:
        if vary or decide is not None or until_sure is not None:
            raise ConfigError("--decide", "a seed sweep decides on its seeds' spread alone")
        if not 0.0001 <= spread <= 0.5:
            raise ConfigError("--decide", "must be the accuracy's sd over seeds to decide "
                              "on, in points from 0.01 to 50 (0.5: half a point), got "
                              f"{spread * 100:g}")
        if base.eval_every == 0:
            raise ConfigError("--decide", "decides on the seeds' accuracy, and eval_every = "
                              "0 never evaluates: set eval_every to 1 or more")
        cap = max_rounds if max_rounds is not None else sequential.SEED_LOOKS[-1]
        if not 3 <= cap <= MAX_ROUNDS:
            raise ConfigError("--seeds", f"with --decide is the most seeds, 3 to "
                              f"{MAX_ROUNDS}, got {cap}")
        repeats, max_rounds = sequential.looks(cap, sequential.SEED_LOOKS)[0], None
    if decide is not None:
        check_margin(decide)
        if until_sure is not None:
            raise ConfigError("--decide", "decides when to stop by itself; give it or "
                              "--until-sure, not both")
        if not vary:
            raise ConfigError("--decide", "needs a variant to decide on (--vary)")
        cap = max_rounds if max_rounds is not None else sequential.LOOKS[-1]
        if not sequential.LOOKS[0] <= cap <= MAX_ROUNDS:
            raise ConfigError("--max-rounds", f"with --decide must be {sequential.LOOKS[0]} "
                              f"(the first look) to {MAX_ROUNDS}, got {cap}")
        repeats = sequential.looks(cap)[0]
        max_rounds = None
    if rerun_loaded is not None and not 0 <= rerun_loaded <= MAX_ROUNDS:
        raise ConfigError("--rerun-loaded", f"must be 0 to {MAX_ROUNDS} (rounds trained "
                          f"again at most), got {rerun_loaded}")
    if until_sure is not None and not 0.001 <= until_sure <= 10:
        raise ConfigError("--until-sure", "must be the interval's width to reach, as a "
                          f"fraction from 0.001 to 10 (0.05: 5%), got {until_sure}")
    if max_rounds is not None and not 1 <= max_rounds <= MAX_ROUNDS:
        raise ConfigError("--max-rounds", f"must be 1 to {MAX_ROUNDS}, got {max_rounds}")
    if quiet_wait_s is not None and not 0 <= quiet_wait_s <= 3600:
        raise ConfigError("--quiet-wait", f"must be 0 to 3600 seconds, got {quiet_wait_s}")
    if max_time_s is not None and not max_time_s > 0:
        raise ConfigError("--max-time", f"must be seconds > 0, got {max_time_s}")
    if (max_rounds is not None or max_time_s is not None) and until_sure is None \
            and decide is None and spread is None:
        raise ConfigError("--max-rounds" if max_rounds is not None else "--max-time",
                          "bounds --until-sure; give --until-sure WIDTH with it")
    if until_sure is not None and not vary:
        raise ConfigError("--until-sure", "needs a variant to be sure of (--vary)")
    kind = "ab" if vary else "sweep"
    if kind == "sweep" and repeats < 2:
        raise ConfigError("--seeds", f"a seed sweep needs at least 2 seeds, got {repeats}")
    if repeats > MAX_ROUNDS:
        raise ConfigError("--seeds" if kind == "sweep" else "--repeats",
                          f"must be at most {MAX_ROUNDS}, got {repeats}")
    if not 1 <= jobs <= MAX_JOBS:
        raise ConfigError("--jobs", f"must be 1 to {MAX_JOBS} (the cores of this machine), "
                          f"got {jobs}")
    if steps < 1:
        raise ConfigError("--steps", f"must be >= 1, got {steps}")
    if repeats < 1:
        raise ConfigError("--repeats", f"must be >= 1, got {repeats}")
    runs, notes = plan(base, vary, steps, repeats, check_level(level))
    spec = {"vary": [[k, v] for k, v in vary], "steps": steps, "notes": notes, "file": file,
            "repeats": repeats, "level": check_level(level), "jobs": jobs,
            "layout": [[v["arm"], v["round"]] for v in runs],
            "rerun_loaded": repeats if rerun_loaded is None else rerun_loaded,
            "quiet_wait_s": QUIET_WAIT_S if quiet_wait_s is None else quiet_wait_s}
    if until_sure is not None:
        spec.update(until_sure=until_sure, max_time_s=max_time_s,
                    max_rounds=max(repeats, max_rounds or DEFAULT_MAX_ROUNDS))
    if decide is not None or spread is not None:
        spec.update(decide=decide if spread is None else spread, max_rounds=cap,
                    max_time_s=max_time_s)
    return Planned(kind, name, spec, runs, notes)


# --- rounds added after the plan
# ---------------------------------------------------------------

def add_round(store: SessionStore, study_id: int) -> list[int]:
    """One more round of every arm (--until-sure), planned like the others: seed + r, the
    arms' order reversed every other round. Returns the positions to train."""
    study = store.study(study_id)
    spec = study["spec"]
    places = spec["layout"]
    rnd = spec["repeats"]
    firsts: dict[int, dict[str, Any]] = {}
    for v, (arm, r) in zip(study["variants"], places, strict=True):
        if r == 0:
            firsts.setdefault(arm, v)
    arms = sorted(firsts)
    order = arms if rnd % 2 == 0 else arms[::-1]
    new = []
    for arm in order:
        v = firsts[arm]
        cfg = dict(v["config"])
        if cfg.get("seed") is not None:
            cfg["seed"] = cfg["seed"] + rnd
        new.append({**v, "config": cfg})
    spec = {**spec, "repeats": rnd + 1, "layout": places + [[arm, rnd] for arm in order]}
    return store.add_study_runs(study_id, new, spec)


def rerun_round(store: SessionStore, study_id: int, rnd: int, why: str) -> list[int]:
    """Round `rnd` of every arm trained again (same configs and seeds, same order); the new
    runs take the round's place in the table, the old ones stay in the session and in the
    spec's `reruns`. Returns the positions to train."""
    study = store.study(study_id)
    spec = study["spec"]
    places = spec["layout"]
    cells: dict[int, dict[str, Any]] = {}
    for v, (arm, r) in zip(study["variants"], places, strict=True):
        if r == rnd:
            cells[arm] = v          # the newest of each arm's round
    order = sorted(cells) if rnd % 2 == 0 else sorted(cells, reverse=True)
    new = [{**cells[arm], "run_id": None, "note": None} for arm in order]
    replaced = [cells[arm]["run_id"] for arm in order]
    spec = {**spec, "layout": places + [[arm, rnd] for arm in order],
            "reruns": [*spec.get("reruns", []),
                       {"round": rnd, "replaced": replaced, "why": why}]}
    return store.add_study_runs(study_id, new, spec)


# --- the table -------------------------------------------------------------------------------

# What the interval of each figure says, in words: (above 1, below 1). Accuracy and loss
# vary with the seed, which the rounds change: their noise is seed noise.
VERDICT_WORDS = {"samples_per_s": ("faster", "slower"),
                 "data_wait_s": ("more wait", "less wait"),
                 "peak_memory_mib": ("more memory", "less memory"),
                 "train_loss": ("higher train loss", "lower train loss"),
                 "eval_loss": ("higher eval loss", "lower eval loss"),
                 "accuracy": ("higher accuracy", "lower accuracy")}
SEED_NOISE = frozenset({"train_loss", "eval_loss", "accuracy"})


@dataclass
class Row:
    """One arm of a study (the base or a variant): its figures (the mean over its rounds),
    each as a ratio to the base, with an interval and a verdict when it trained in rounds."""
    position: int                  # the arm: 0 is the base
    label: str
    run_id: int | None             # its first round's run (the one Enter pairs)
    status: str                    # queued, starting, running, finished, stopped, crashed, skipped
    steps: int = 0
    samples_per_s: float | None = None
    data_wait_s: float | None = None
    peak_memory_mib: float | None = None
    memory_kind: str | None = None   # "GPU" (CUDA peak allocated) or "RSS" (process)
    train_loss: float | None = None  # smoothed
    eval_loss: float | None = None
    accuracy: float | None = None    # a fraction (figures.fmt writes it in percent)
    bit_identical: bool | None = None
    first_difference: int | None = None
    note: str | None = None
    ratios: dict[str, float | None] | None = None
    runs: list[int | None] = field(default_factory=list)   # each round's run
    rounds: int = 1
    done: int = 0                  # rounds finished
    intervals: dict[str, stats.Interval | None] | None = None
    verdicts: dict[str, str] | None = None
    spread: dict[str, float | None] | None = None          # sd over the rounds
    workers_mib: float | None = None     # the DataLoader workers' part of peak memory
    # milliseconds per step in each phase (core.analysis.figures.PHASES), the mean over its
    # rounds, and (a variant) each phase's ratio to the base, with an interval in rounds
    phase_ms: dict[str, float] | None = None
    phase_ratios: dict[str, stats.Interval | float | None] | None = None
    # the rounds (0-based) in which this arm's run, or the base's, shared the CPU with
    # another process (core.processes.contention), and how many rounds the verdicts rest on
    loaded_rounds: list[int] = field(default_factory=list)
    compared_rounds: int = 0
    # the rounds in which this arm's run had more torch threads than the machine left it
    # free cores (core.processes.contention.crowded), and the first such run's note
    crowded_rounds: list[int] = field(default_factory=list)
    crowded: str | None = None
    # a deciding study's answer for samples/s so far (core.analysis.sequential)
    decision: sequential.Decision | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _arm_status(statuses: list[str]) -> str:
    for status in ("running", "starting", "crashed", "copied", "stopped", "queued"):
        if status in statuses:
            return status
    if statuses and all(s == "skipped" for s in statuses):
        return "skipped"
    return "finished" if statuses else "queued"


def round_load(store: SessionStore, study_id: int, rnd: int
               ) -> tuple[float | None, float | None]:
    """(need, busy) of round `rnd` as its runs recorded them: the most cores one of its runs
    kept busy (what a re-run needs free beside whatever else runs), and the most cores of
    other work (others and steal) beside one of them (how busy the rest of the machine was
    while it was measured); None where none says."""
    study = store.study(study_id)
    places = study["spec"].get("layout") or [[i, 0] for i in range(len(study["variants"]))]
    need = busy = None
    for v, (_, r) in zip(study["variants"], places, strict=True):
        if r != rnd or v["run_id"] is None:
            continue
        summary = store.run(v["run_id"])["summary"]
        c = contention.read(summary.get("contention") if isinstance(summary, dict) else None)
        if c is None:
            continue
        busy = max(busy or 0.0, c["others_cores"] + (c.get("steal_cores") or 0.0))
        if c.get("own_cores") is not None:
            need = max(need or 0.0, c["own_cores"])
    return need, busy


def loaded_of(run: dict[str, Any]) -> bool:
    """Whether a stored run was timed while another process took the CPU (its summary
    says)."""
    summary = run["summary"]
    return contention.loaded(contention.read(summary.get("contention")
                                             if isinstance(summary, dict) else None))


def table(store: SessionStore, study_id: int,
          figures_of: Callable[[int], dict[str, Any]] | None = None,
          hashes_of: Callable[[int], dict[int, str]] | None = None,
          study: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[Row]]:
    """The study and its rows, one per arm, figures so far included (it may still be
    running). The figures and parameter hashes of its runs come from the store, or from
    `figures_of` / `hashes_of` where the caller keeps them already (the dashboard's
    reader, which also gives the `study` as it read it: the store's may already name a
    run its figures do not hold yet)."""
    figures_of = figures_of or (lambda r: figures.run_figures(store, r))
    study = study if study is not None else store.study(study_id)
    check_stored(study)
    side_by_side = study["spec"].get("jobs", 1) > 1
    marks: dict[int, tuple[bool, str | None]] = {}

    def marks_of(cell: Any) -> tuple[bool, str | None]:
        """A finished cell's run, read once: (loaded, its crowded note). Runs trained side
        by side share the CPU by design (the title says so): their neighbours are the
        study's own runs, not a mark against a round."""
        run_id = cell[0]["run_id"] if cell is not None else None
        if run_id is None or not _finished(cell):
            return False, None
        if run_id not in marks:
            run = store.run(run_id)
            marks[run_id] = (not side_by_side and loaded_of(run), contention.run_crowded(run))
        return marks[run_id]

    hashes_of = hashes_of or (lambda r: figures.hashes(store.fingerprints(r)))
    spec = study["spec"]
    level = spec.get("level", stats.DEFAULT_LEVEL)
    places = spec.get("layout") or [[i, 0] for i in range(len(study["variants"]))]
    repeats = spec.get("repeats", 1)
    n_arms = max(a for a, _ in places) + 1
    # grid[arm][round]: (planned run, its figures or None)
    grid: list[list[tuple[dict[str, Any], dict[str, Any] | None] | None]] = \
        [[None] * repeats for _ in range(n_arms)]
    for v, (arm, rnd) in zip(study["variants"], places, strict=True):
        grid[arm][rnd] = (v, figures_of(v["run_id"]) if v["run_id"] is not None else None)
    rows: list[Row] = []
    for arm, cells in enumerate(grid):
        first = next(c for c in cells if c is not None)[0]
        statuses = []
        for c in cells:
            v, fig = c  # type: ignore[misc]
            statuses.append(fig["status"] if fig else "skipped" if v["note"] else "queued")
        runs = [c[0]["run_id"] for c in cells]  # type: ignore[index]
        row = Row(position=arm, label=first["label"],
                  run_id=next((r for r in runs if r is not None), None),
                  status=_arm_status(statuses), runs=runs, rounds=repeats,
                  done=statuses.count("finished"),
                  note=next((c[0]["note"] for c in cells if c[0]["note"]), None))  # type: ignore
        notes = [(r, marks_of(c)[1]) for r, c in enumerate(cells)]
        row.crowded_rounds = [r for r, note in notes if note]
        row.crowded = next((note for _, note in notes if note), None)
        figs = [c[1] for c in cells if c[1] is not None]  # type: ignore[index]
        if figs:
            row.steps = max(f["steps"] or 0 for f in figs)
            row.memory_kind = next((f["memory_kind"] for f in figs if f["memory_kind"]), None)
            row.spread = {}
            for key, _, _ in FIGURES:
                mean, sd, _ = stats.mean_sd([f[key] for f in figs])
                setattr(row, key, mean)
                row.spread[key] = sd
            row.workers_mib = stats.mean_sd([f.get("workers_mib") for f in figs])[0] \
                if any(f.get("workers_mib") for f in figs) else None
            stuck = [f["not_learning"] for f in figs if f.get("not_learning")]
            if stuck and row.note is None:
                row.note = (f"not learning in {len(stuck)} of {len(figs)} finished or "
                            "running round" + ("s" if len(figs) > 1 else "") + ": " +
                            ("its loss stayed at chance (ln 10)" if any(
                                k == "chance" for k, _ in stuck) else
                             "its gradient norm stayed 0") +
                            f" for {figures.NOT_LEARNING_STEPS} steps or more; "
                            "its runs' rows say why")
            phased = [f["phase_ms"] for f in figs if f.get("phase_ms")]
            if phased:
                row.phase_ms = {k: stats.mean_sd([p[k] for p in phased])[0]
                                for k in figures.PHASES}
        rows.append(row)
    if study["kind"] == "sweep" and spec.get("decide") is not None and rows:
        # a deciding sweep: its finished seeds' accuracies, their spread judged at the
        # looks (core.analysis.sequential)
        rows[0].decision = sequential.decide_spread(
            [c[1]["accuracy"] for c in grid[0] if _finished(c)],  # type: ignore[index]
            spec["decide"], spec.get("max_rounds"))
    base = rows[0] if rows and rows[0].run_id is not None else None
    for arm, row in enumerate(rows):
        if base is None or row.run_id is None:
            continue
        row.ratios = {key: figures.ratio(getattr(row, key), getattr(base, key))
                      for key, _, _ in FIGURES}
        if row is base:
            row.bit_identical = True
            continue
        row.phase_ratios = _phase_ratios(grid, arm, row, base, repeats, level)
        same, first_diff, compared, unfinished = True, None, 0, False
        for rnd in range(repeats):
            a, b = grid[0][rnd], grid[arm][rnd]
            if a is None or b is None or a[0]["run_id"] is None or b[0]["run_id"] is None:
                continue
            ident = figures.identity(hashes_of(a[0]["run_id"]), hashes_of(b[0]["run_id"]))
            if ident.identical is None:
                continue
            compared += 1
            # The steps a crashed run recorded can match; "identical" needs whole runs.
            unfinished |= not (_finished(a) and _finished(b))
            if not ident.identical:
                same = False
                if ident.first_difference is not None:
                    first_diff = ident.first_difference if first_diff is None else \
                        min(first_diff, ident.first_difference)
        row.bit_identical = (None if same and unfinished else same) if compared else None
        row.first_difference = first_diff
        if repeats > 1:
            both = [r for r in range(repeats) if _finished(grid[0][r]) and
                    _finished(grid[arm][r])]
            row.compared_rounds = len(both)
            row.loaded_rounds = [r for r in both
                                 if marks_of(grid[0][r])[0] or marks_of(grid[arm][r])[0]]
            row.intervals, row.verdicts = {}, {}
            for key, _, _ in FIGURES:
                pairs = [(grid[0][r][1][key], grid[arm][r][1][key])   # type: ignore[index]
                         for r in range(repeats)
                         if _finished(grid[0][r]) and _finished(grid[arm][r])]
                interval = stats.ratio_interval(pairs, level)
                row.intervals[key] = interval
                if key == "samples_per_s" and spec.get("decide") is not None:
                    # a deciding study: its looks and their corrected levels
                    # (core.analysis.sequential), never the uncorrected interval
                    d = row.decision = sequential.decide(pairs, spec["decide"],
                                                         spec.get("max_rounds"))
                    row.intervals[key] = interval = d.interval
                    busy = len(row.loaded_rounds) * 2 > max(1, row.compared_rounds)
                    if interval is not None:
                        row.verdicts[key] = (
                            "unknown: the machine was too busy" if d.verdict == "unknown"
                            and busy else d.verdict) or \
                            f"deciding: the next look at {d.next_look} rounds"
                        row.ratios[key] = interval.ratio
                    continue
                if interval is not None:
                    up, down = VERDICT_WORDS[key]
                    same_words = "within seed noise" if key in SEED_NOISE else "within noise"
                    row.verdicts[key] = interval.verdict(up, down, same_words)
                    row.ratios[key] = interval.ratio
    return study, rows


# Config keys a price does not depend on: the run's length, its seed and its bookkeeping.
PRICE_IGNORES = ("seed", "epochs", "max_steps", "log_every", "eval_every", "fingerprint_every",
                 "checkpoint_every", "keep_checkpoints")


def price(store: SessionStore, cfg: dict[str, Any], key: str, value: Any
          ) -> dict[str, Any] | None:
    """What switching `key` to `value` costs a run of config `cfg` in samples/s, as the
    newest A/B study of that config measured it (its base equal to `cfg` in all but the
    run's length, seed and bookkeeping, one variant that key at that value): the study,
    the ratio, its interval and verdict where it trained in rounds. None where none did."""
    for study in reversed(store.studies()):
        variants = study["variants"]
        if study["kind"] != "ab" or not variants or stored_problem(study):
            continue
        base = variants[0]["config"]
        if any(base.get(k) != cfg.get(k) for k in set(base) | set(cfg)
               if k not in PRICE_IGNORES):
            continue
        label = _label(key, value)
        _, rows = table(store, study["id"])
        row = next((r for r in rows if r.label == label), None)
        if row is None or not row.ratios or row.ratios.get("samples_per_s") is None:
            continue
        iv = (row.intervals or {}).get("samples_per_s")
        return {"study": study["id"], "label": label, "rounds": row.done,
                "ratio": row.ratios["samples_per_s"],
                "low": iv.low if iv is not None else None,
                "high": iv.high if iv is not None else None,
                "verdict": (row.verdicts or {}).get("samples_per_s")}
    return None


def _phase_ratios(grid: list, arm: int, row: Row, base: Row, repeats: int, level: float
                  ) -> dict[str, stats.Interval | float | None] | None:
    """Each phase's time per step as a ratio to the base: with an interval over the rounds
    where both finished (in rounds), else the ratio of the means."""
    if row.phase_ms is None or base.phase_ms is None:
        return None
    out: dict[str, stats.Interval | float | None] = {}
    for k in figures.PHASES:
        pairs = [(grid[0][r][1]["phase_ms"][k], grid[arm][r][1]["phase_ms"][k])
                 for r in range(repeats) if _finished(grid[0][r]) and _finished(grid[arm][r])
                 and grid[0][r][1].get("phase_ms") and grid[arm][r][1].get("phase_ms")]
        interval = stats.ratio_interval(pairs, level) if repeats > 1 else None
        out[k] = interval if interval is not None else \
            figures.ratio(row.phase_ms[k], base.phase_ms[k])
    return out


MAX_STORED_JOBS = 1024     # runs a stored study may have trained at a time (another machine's)


def stored_problem(study: dict[str, Any]) -> str | None:
    """What makes a stored study unreadable, in one line naming the field and what it may
    be; None where it can be read and trained. Its spec and its runs' configs are session
    data (edited, another tool's or version's): for an A/B study or a seed sweep every
    field the table and the runner read is checked here, once, before either does (a price
    study's own fields: pricing.spec_figures)."""
    spec, n = study["spec"], len(study["variants"])
    if not isinstance(spec, dict):
        return f"study {study['id']}: its spec is {text_of(spec)}; a study's spec is a mapping"
    for v in study["variants"]:
        if not isinstance(v["config"], dict):
            return (f"study {study['id']}: the config of its run {text_of(v['label'])} is "
                    f"{text_of(v['config'])}; a run's config is a mapping of its settings")
    if study["kind"] == "price":
        return None

    def whole(x: Any, lo: int, hi: int) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi

    def number(x: Any, lo: float, hi: float) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and lo <= x <= hi

    def pairs(x: Any) -> bool:
        return isinstance(x, list) and all(isinstance(p, list) and len(p) == 2 for p in x)
    if n == 0:
        return f"study {study['id']}: it has no runs; a study has a base and its variants"
    repeats = spec.get("repeats", 1)
    margin = (0.0001, 0.5) if study["kind"] == "sweep" else (0.005, 0.5)

    def layout_ok() -> bool:      # every arm's every round filled (a re-run: its place again)
        places = spec.get("layout")
        if not places:
            return repeats == 1         # (an old study's: one round, arms in order)
        return pairs(places) and len(places) == n and all(
            whole(a, 0, n - 1) and whole(r, 0, repeats - 1) for a, r in places) and \
            {(a, r) for a, r in places} == {(a, r) for a in range(max(a for a, _ in places) + 1)
                                            for r in range(repeats)}
    rules: list[tuple[str, Callable[[], bool], str]] = [
        ("steps", lambda: whole(spec.get("steps"), 1, 10**12),
         "a whole number of steps, 1 or more"),
        ("repeats", lambda: whole(repeats, 1, MAX_ROUNDS), f"1 to {MAX_ROUNDS} rounds"),
        ("layout", layout_ok, f"one [arm, round] for each of its {n} runs, every arm from 0 "
         "on in every round under its repeats"),
        ("jobs", lambda: "jobs" not in spec or whole(spec["jobs"], 1, MAX_STORED_JOBS),
         f"1 to {MAX_STORED_JOBS} runs at a time"),
        ("gpus", lambda: "gpus" not in spec or whole(spec["gpus"], 0, MAX_STORED_JOBS),
         "a count of GPUs"),
        ("level", lambda: "level" not in spec or number(spec["level"], 0.5, 0.999999),
         "a confidence level from 0.5 to 0.999"),
        ("rerun_loaded", lambda: "rerun_loaded" not in spec or whole(spec["rerun_loaded"], 0,
                                                                      MAX_ROUNDS),
         f"0 to {MAX_ROUNDS} rounds"),
        ("quiet_wait_s", lambda: "quiet_wait_s" not in spec or
         number(spec["quiet_wait_s"], 0, 3600), "0 to 3600 seconds"),
        ("until_sure", lambda: spec.get("until_sure") is None or
         number(spec["until_sure"], 0.001, 10), "an interval's width from 0.001 to 10, or none"),
        ("decide", lambda: spec.get("decide") is None or number(spec["decide"], *margin),
         f"a margin from {margin[0]} to {margin[1]}, or none"),
        ("max_rounds", lambda: spec.get("max_rounds") is None or
         whole(spec["max_rounds"], 1, MAX_ROUNDS), f"1 to {MAX_ROUNDS} rounds, or none"),
        ("max_time_s", lambda: spec.get("max_time_s") is None or
         number(spec["max_time_s"], 1e-9, 1e12), "seconds over 0, or none"),
        ("vary", lambda: "vary" not in spec or pairs(spec["vary"]) and all(
            isinstance(k, str) and isinstance(v, list) for k, v in spec["vary"]),
         "a list of [knob, [values]]"),
        ("notes", lambda: "notes" not in spec or isinstance(spec["notes"], list) and all(
            isinstance(x, str) for x in spec["notes"]), "a list of lines"),
        ("file", lambda: spec.get("file") is None or isinstance(spec["file"], str),
         "a path, or none"),
        ("reruns", lambda: "reruns" not in spec or isinstance(spec["reruns"], list),
         "a list of rounds trained again"),
        ("waits", lambda: "waits" not in spec or isinstance(spec["waits"], list),
         "a list of waits for a quiet machine"),
    ]
    for name, ok, allowed in rules:
        if not ok():
            return (f"study {study['id']}: its {name} is {text_of(spec.get(name))}; a "
                    f"study's {name} is {allowed}")
    return None


def check_stored(study: dict[str, Any]) -> None:
    """`stored_problem`, refused in one line (exit status 2)."""
    problem = stored_problem(study)
    if problem is not None:
        raise BadInput(problem)


def text_of(x: Any) -> str:     # a stored value in a message: as Python writes it, as text
    return shown(repr(x), 40)


def _finished(cell: tuple[dict[str, Any], dict[str, Any] | None] | None) -> bool:
    return cell is not None and cell[1] is not None and cell[1]["status"] == "finished"


def check_level(level: float | None) -> float:
    if level is None:
        return stats.DEFAULT_LEVEL
    if not 0.5 <= level < 1.0:
        raise ConfigError("--level", f"must be a confidence level from 0.5 to 0.999 (e.g. "
                          f"0.95), got {level}")
    return level


def sweep_groups(studies: Any) -> list[tuple[str, tuple[int, ...]]]:
    """(label, run ids) of every seed sweep: the runs a plot draws as one band."""
    return [(f"sweep {st['id']}", tuple(v["run_id"] for v in st["variants"]
                                        if v["run_id"] is not None))
            for st in studies if st["kind"] == "sweep"]
