"""What a run records, and how a run recorded by an earlier version is read.

Every table here is built from each knob's one declaration (`config.knob`: bits,
process_wide, setting, before, setting_before, why) and from the facts a run records beside
its knobs (FACTS): which settings can change the bits, what an older run reads a setting as,
the verdict's words. A run stored by an earlier version lacks the knobs added since: it is
read with each one's `before`, the value that does what that version did, and the user is
told once which were assumed. A run stored by a newer version has knobs this one does not
know: it is refused, by name, before anything changes.

Core layer: imports neither torch nor textual.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ... import __version__
from ..errors import BadInput
from ..text import shown
from . import config
from .toml_text import toml_value


@dataclass(frozen=True)
class Fact:
    """A recorded setting that is not a knob: what the machine, the versions and the run's
    processes were."""
    bits: bool = False      # another value can change the bits
    before: Any = None      # what a run recorded before it read it as (None: not known)
    why: str = ""


# Every setting a run records besides its knobs' (engine/knobs.py:effective_settings and
# engine/train.py add them; tests/test_upgrade.py checks that nothing else is recorded).
FACTS: dict[str, Fact] = {
    "deterministic_warn_only": Fact(), "cuda_matmul_allow_tf32": Fact(),
    "num_interop_threads": Fact(), "omp_wait": Fact(), "grad_scaler": Fact(),
    "parameters": Fact(), "device_name": Fact(bits=True), "cpu": Fact(),
    "cpu_capability": Fact(bits=True, why="torch's CPU kernels dispatch to another "
                           "instruction set: other vector widths sum in another order; runs "
                           "of two CPU kinds"),
    "cuda_capability": Fact(), "torch": Fact(bits=True), "torchvision": Fact(),
    "numpy": Fact(), "python": Fact(), "cuda": Fact(bits=True), "cudnn": Fact(bits=True),
    "cublas_workspace_config": Fact(bits=True), "platform": Fact(), "data": Fact(bits=True),
    "world_size": Fact(bits=True, before=1, why=(
        "processes of a data-parallel run: each step's batch is split over them in "
        "DistributedSampler's order, their gradients are averaged by an all-reduce, another "
        "summation order, and each rank draws its own dropout and augmentation numbers")),
    "batch_per_process": Fact(), "model_file": Fact(), "model_sha256": Fact(bits=True),
    "tui_trainer": Fact(),
}


def _meta(key: str) -> Any:
    return config.FIELDS[key].metadata


# The knobs whose applied value a run's settings record, by the setting's name.
SETTING_OF = {k: _meta(k)["setting"] for k in config.FIELDS if _meta(k)["setting"]}
KNOB_OF = {s: k for k, s in SETTING_OF.items()}
# The knobs that can change the bits, and those torch holds for the whole process.
BIT_KNOBS = tuple(k for k in config.FIELDS if _meta(k)["bits"])
PROCESS_WIDE = tuple(k for k in config.FIELDS if _meta(k)["process_wide"])
# The recorded settings that can change the bits of a run when they differ between runs.
BIT_RELEVANT_SETTINGS = tuple([SETTING_OF[k] for k in BIT_KNOBS if k in SETTING_OF]
                              + [f for f, fact in FACTS.items() if fact.bits])
# What a setting reads as for a run recorded before it was.
SETTING_DEFAULTS = {**{s: _meta(k)["setting_before"] for k, s in SETTING_OF.items()
                       if _meta(k)["setting_before"] is not None},
                    **{f: fact.before for f, fact in FACTS.items() if fact.before is not None}}
# The verdict's words on why a difference changes the bits, by knob and by setting.
WHY = {**{k: _meta(k)["why"] for k in config.FIELDS if _meta(k)["why"]},
       **{SETTING_OF[k]: _meta(k)["why"] for k in SETTING_OF if _meta(k)["why"]},
       **{f: fact.why for f, fact in FACTS.items() if fact.why}}


def before(key: str) -> Any:
    """A knob's value for a run recorded before it existed."""
    return _meta(key)["before"]


def as_recorded(values: Any) -> tuple[Any, dict[str, Any], list[str]]:
    """A stored config (a run's, a study arm's, a checkpoint's) with every knob it lacks
    filled in as the version that stored it ran it; the knobs so assumed; and the keys it
    has that this version does not know (a newer version's knobs). Anything but a mapping
    (a damaged record) comes back as it is."""
    if not isinstance(values, dict):
        return values, {}, []
    assumed = {k: before(k) for k in config.FIELDS if k not in values}
    newer = [str(k) for k in values if k not in config.FIELDS]
    return {**values, **assumed}, assumed, newer


def settings_as_recorded(settings: Any) -> Any:
    """A run's effective settings with each setting it lacks and whose older value is known
    filled in (an older run against a newer one reads `True vs True`, not `None vs True`)."""
    if not isinstance(settings, dict):
        return settings
    return {**{k: v for k, v in SETTING_DEFAULTS.items() if k not in settings}, **settings}


def words(assumed: dict[str, Any]) -> str:
    """`fill_uninitialized = true, image_size = 0`."""
    return ", ".join(f"{k} = {toml_value(v)}" for k, v in assumed.items())


def newer_refusal(run: dict[str, Any]) -> BadInput | None:
    """The refusal of a run stored by a newer tui-trainer (knobs this one does not know),
    or None."""
    newer = run.get("newer_knobs") or []
    if not newer:
        return None
    shown = ", ".join(k[:40] for k in newer[:5]) + (" ..." if len(newer) > 5 else "")
    return BadInput(f"run {run.get('id')} was trained by a newer tui-trainer: its config has "
                    f"{shown}, which tui-trainer {__version__} does not know. Nothing was "
                    "changed; use that version (or newer) for it")


def run_config(run: dict[str, Any], overrides: dict[str, Any] | None = None
               ) -> config.RunConfig:
    """The config of a stored run (filled in as read: SessionStore), with `overrides`;
    refused in one line where a newer version stored it."""
    refusal = newer_refusal(run)
    if refusal is not None:
        raise refusal
    return config.from_dict({**run["config"], **(overrides or {})})


def version_key(text: Any) -> tuple[int, ...]:
    """`0.2.0` as (0, 2, 0); anything else as (): older than every version."""
    try:
        return tuple(int(p) for p in str(text).split("."))
    except ValueError:
        return ()


def upgrade_note(runs_assumed: dict[int, dict[str, Any]], written_by: str | None) -> str:
    """The one line that says what this version assumed about a session's older runs."""
    keys: dict[str, Any] = {}
    for assumed in runs_assumed.values():
        keys.update(assumed)
    by = f"tui-trainer {shown(written_by, 40)}" if written_by else "an earlier tui-trainer"
    n = len(runs_assumed)
    return (f"this session was written by {by}: {n} run{'s' if n != 1 else ''} recorded "
            f"before some knobs existed {'are' if n != 1 else 'is'} read with {words(keys)} "
            "(what that version did)")
