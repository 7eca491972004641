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

import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from . import config as C
from . import figures as F
from .config import ConfigError
from .store import SessionStore

DEFAULT_STEPS = 200

# (key, heading, format) of each figure in the table; ratio_of marks those with a ratio.
# (key, heading, format) of each figure in the table, every one as defined in core.figures.
FIGURES = (("samples_per_s", "samples/s", F.FORMATS["samples_per_s"]),
           ("data_wait_s", "data wait s", F.FORMATS["data_wait_s"]),
           ("peak_memory_mib", "peak mem MiB", F.FORMATS["peak_memory_mib"]),
           ("train_loss", "train loss", F.FORMATS["train_loss"]),
           ("eval_loss", "eval loss", F.FORMATS["eval_loss"]),
           ("accuracy", "accuracy %", F.FORMATS["accuracy"]))


def parse_vary(specs: list[str]) -> list[tuple[str, list[Any]]]:
    """`KEY=V1,V2` strings -> [(key, [typed values])], each value checked like --set."""
    out: list[tuple[str, list[Any]]] = []
    for spec in specs:
        key, sep, text = spec.partition("=")
        key = key.strip()
        if not sep or not key or not text.strip():
            raise ConfigError("--vary", f"takes KEY=V1,V2,... (values separated by commas), "
                              f"got {spec!r}")
        if key in C.TRAINING_LENGTH_KEYS:
            raise ConfigError("--vary", f"{key} cannot be varied: every variant trains for the "
                              "same steps (use --steps)")
        if any(key == k for k, _ in out):
            raise ConfigError("--vary", f"{key} is given twice; put all its values in one "
                              f"--vary {key}=V1,V2")
        values = [C.check_value(key, C.parse_value(key, v)) for v in text.split(",")
                  if v.strip()]
        out.append((key, values))
    if not out:
        raise ConfigError("--vary", "give at least one KEY=V1,V2 to vary")
    return out


def read_study_file(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A study file: a run config (the base) plus an [ab] table with `vary` (a list of
    "KEY=V1,V2" strings), and optionally `steps` and `name`. Returns (config values, ab)."""
    from .presets import resolve
    p = resolve(path, study=True)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError("--config", f"no such file: {p}") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError("--config", f"cannot read {p}: {e}") from None
    ab = data.pop("ab", {})
    if not isinstance(ab, dict):
        raise ConfigError("ab", "must be a table: [ab] with vary = [\"KEY=V1,V2\", ...]")
    unknown = set(ab) - {"vary", "steps", "name", "about"}
    if unknown:
        raise ConfigError(f"ab.{sorted(unknown)[0]}", "unknown; an [ab] table takes vary, "
                          "steps, name and about")
    vary = ab.get("vary", [])
    if not isinstance(vary, list) or not all(isinstance(v, str) for v in vary):
        raise ConfigError("ab.vary", 'must be a list of "KEY=V1,V2" strings')
    steps = ab.get("steps")
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool)
                              or steps < 1):
        raise ConfigError("ab.steps", f"must be an integer >= 1, got {steps!r}")
    for key, value in data.items():
        if isinstance(value, dict):
            raise ConfigError(key, "tables other than [ab] are not used; keys are flat")
    return data, ab


def _label(key: str, value: Any) -> str:
    if isinstance(value, bool):
        text = "on" if value else "off"
    elif value is None:
        text = "none"
    else:
        text = str(value)
    return f"{key}={text}"


def plan(base: C.RunConfig, vary: list[tuple[str, list[Any]]], steps: int
         ) -> tuple[list[dict[str, Any]], list[str]]:
    """The variants to train, base first, each for `steps` steps; and notes on values left
    out (a value equal to the base's is the base). Every variant is validated here, so a bad
    combination stops the study before anything trains."""
    # max_steps decides; epochs only has to be enough (an epoch has at least one step).
    length = {"max_steps": steps, "epochs": min(steps, C.FIELDS["epochs"].metadata["hi"])}
    base_cfg = base.replace(**length)
    variants = [{"label": "base", "key": None, "value": None, "config": base_cfg.to_dict()}]
    notes: list[str] = []
    for key, values in vary:
        for value in values:
            if value == getattr(base_cfg, key):
                notes.append(f"{_label(key, value)} is the base's value: the base row shows it")
                continue
            try:
                cfg = base_cfg.replace(**{key: value})
            except ConfigError as e:
                raise ConfigError(e.key, f"{e.reason} (in the variant {_label(key, value)})") \
                    from None
            variants.append({"label": _label(key, value), "key": key, "value": value,
                             "config": cfg.to_dict()})
    if len(variants) == 1:
        raise ConfigError("--vary", "every value given is the base's own; nothing to compare")
    return variants, notes


# --- the table -------------------------------------------------------------------------------

@dataclass
class Row:
    position: int
    label: str
    run_id: int | None
    status: str                    # queued, starting, running, finished, stopped, crashed, skipped
    steps: int = 0
    samples_per_s: float | None = None
    data_wait_s: float | None = None
    peak_memory_mib: float | None = None
    memory_kind: str | None = None   # "GPU" (CUDA peak allocated) or "RSS" (process)
    train_loss: float | None = None  # smoothed
    eval_loss: float | None = None
    accuracy: float | None = None    # percent
    bit_identical: bool | None = None
    first_difference: int | None = None
    note: str | None = None
    ratios: dict[str, float | None] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def table(store: SessionStore, study_id: int,
          figures_of: Callable[[int], dict[str, Any]] | None = None,
          hashes_of: Callable[[int], dict[int, str]] | None = None
          ) -> tuple[dict[str, Any], list[Row]]:
    """The study and its rows, figures so far included (it may still be running). The
    figures and parameter hashes of its runs come from the store, or from `figures_of` /
    `hashes_of` where the caller keeps them already (the dashboard's reader)."""
    figures_of = figures_of or (lambda r: F.run_figures(store, r))
    hashes_of = hashes_of or (lambda r: F.hashes(store.fingerprints(r)))
    study = store.study(study_id)
    rows: list[Row] = []
    for v in study["variants"]:
        row = Row(position=v["position"], label=v["label"], run_id=v["run_id"],
                  status="queued", note=v["note"])
        if v["run_id"] is not None:
            figures = figures_of(v["run_id"])
            for key in ("status", "steps", "memory_kind", *(k for k, _, _ in FIGURES)):
                setattr(row, key, figures[key])
        elif v["note"]:
            row.status = "skipped"
        rows.append(row)
    base = rows[0] if rows and rows[0].run_id is not None else None
    for row in rows:
        if base is None or row.run_id is None:
            continue
        if row is base:
            row.bit_identical = True
        else:
            same = F.identity(hashes_of(base.run_id), hashes_of(row.run_id))
            row.bit_identical, row.first_difference = same.identical, same.first_difference
        row.ratios = {key: F.ratio(getattr(row, key), getattr(base, key))
                      for key, _, _ in FIGURES}
    return study, rows


HEADINGS = ("variant", "run") + tuple(h for _, h, _ in FIGURES) + ("bit-identical to base",)


def row_cells(r: Row) -> list[str]:
    """A row as text cells under HEADINGS: each figure with its ratio to the base."""
    cells = [r.label, "-" if r.run_id is None else str(r.run_id)]
    for key, _, _ in FIGURES:
        value = getattr(r, key)
        ratio = (r.ratios or {}).get(key)
        cell = F.fmt(value, key)
        if value is not None and ratio is not None and r.position:
            cell += f" ({ratio:.2f}x)"
        cells.append(cell)
    cells.append(identity_text(r))
    return cells


def format_table(rows: list[Row]) -> list[str]:
    """The table as aligned text lines."""
    lines = [list(HEADINGS)] + [row_cells(r) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADINGS))]
    last = len(HEADINGS) - 1
    return ["  ".join(c.rjust(w) if 1 < i < last else c.ljust(w)
                      for i, (c, w) in enumerate(zip(line, widths, strict=True))).rstrip()
            for line in lines]


def identity_text(r: Row) -> str:
    if r.status == "skipped":
        return f"not run: {r.note}"
    if r.run_id is None:
        return r.status
    if r.status not in ("finished",):
        prefix = f"{r.status}, "
    else:
        prefix = ""
    if r.position == 0:
        return prefix + "(base)"
    return prefix + F.Identity(r.bit_identical, [], r.first_difference, None).text()
