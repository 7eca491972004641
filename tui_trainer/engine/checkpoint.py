"""Checkpoints: one plain dict of state, written atomically, read with weights_only=True.

A checkpoint holds everything needed to continue bit-for-bit: model, optimizer, scheduler,
GradScaler, the position (epoch, batches consumed in it, optimizer steps), and the RNG states
of torch, CUDA, numpy, Python and the loader's generator, both now and at the start of the
current epoch (the data iterator is rebuilt from the latter and fast-forwarded).
"""

from __future__ import annotations

import io
import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

from ..core.settings import config
from ..core.settings.recorded import as_recorded
from ..core.errors import CheckpointError, DiskFull, SessionError, is_disk_full
from ..core.processes.liveness import process_alive
from ..core.session.store import SessionStore

FORMAT = "tui-trainer-checkpoint"
VERSION = 1
REQUIRED = ("format", "version", "config", "step", "epoch", "batch_in_epoch", "model",
            "optimizer", "scheduler", "scaler", "rng", "rng_epoch_start", "rng_first_epoch",
            "elapsed", "samples_seen")


# Where a kill can fall between the writes of one checkpoint; tests/test_trust.py kills the
# process at each (TUI_TRAINER_FAULT=POINT[:N]) and checks that nothing is lost.
FAULT_POINTS = ("tmp-written", "file-in-place", "recorded", "unlisted")
_reached: dict[str, int] = {}


def fault_point(name: str) -> None:
    """SIGKILLs this process the N-th time it reaches `name` when TUI_TRAINER_FAULT says
    NAME:N (a fault-injection hook for tests; a no-op otherwise)."""
    spec = os.environ.get("TUI_TRAINER_FAULT")
    if not spec:
        return
    point, _, nth = spec.partition(":")
    if point == name:
        _reached[name] = _reached.get(name, 0) + 1
        if _reached[name] >= int(nth or 1):
            import signal
            os.kill(os.getpid(), signal.SIGKILL)


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Writes to a temporary file beside `path`, syncs it, then renames it into place: a
    crash at any moment leaves either the old file or the new one, never half of one."""
    # Serialised in memory, then written with plain writes: a full disk then says ENOSPC
    # (torch.save's own zip writer reports it as an opaque "enforce fail").
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, "version": VERSION, **state}, buffer)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(buffer.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        fault_point("tmp-written")
        os.replace(tmp, path)
    except OSError as e:
        if is_disk_full(e):
            tmp.unlink(missing_ok=True)       # first, so the free space said is the real one
            raise DiskFull(path, f"a checkpoint of {buffer.tell():,} bytes") from None
        raise
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Reads and checks a checkpoint. weights_only=True: the unpickler accepts tensors and
    plain containers only, so a file from elsewhere can never run code."""
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"checkpoint {p} does not exist")
    corrupt = f"checkpoint {p} is truncated or corrupt and cannot be read"
    if not zipfile.is_zipfile(p):
        # torch.save always writes a zip archive; a cut-off file loses its central directory.
        raise CheckpointError(f"{corrupt} (not a complete torch.save archive)")
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        text = str(e)
        if "global" in text.lower():
            found = next((line.strip() for line in text.splitlines()
                          if "global" in line.lower()), "")
            raise CheckpointError(
                f"checkpoint {p} was refused: it holds objects other than tensors and plain "
                f"data, which could run code when loaded, so nothing of it was loaded ({found})"
            ) from None
        raise CheckpointError(f"{corrupt} ({_first_line(e)})") from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile, KeyError) as e:
        raise CheckpointError(f"{corrupt} ({_first_line(e)})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = f"a dict with keys {sorted(map(str, state))[:6]}" if isinstance(state, dict) \
            else f"a {type(state).__name__}"
        raise CheckpointError(f"{p} is not a tui-trainer checkpoint (it holds {found})")
    if not isinstance(state.get("version"), int) or state["version"] > VERSION:
        raise CheckpointError(f"checkpoint {p} has format version {state.get('version')!r}; "
                              f"this tui-trainer reads version {VERSION} and older")
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        raise CheckpointError(f"checkpoint {p} is incomplete: it lacks {', '.join(missing)}")
    return state


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def check_fits(state: dict[str, Any], path: Path, run: dict[str, Any],
               cfg: config.RunConfig, recorded: dict[str, Any] | None) -> None:
    """Refuses a checkpoint that is not the one the session recorded: another run's, another
    step's (an older file put under the newest name), or one written with other settings."""
    if state.get("run_id") != run["id"]:
        raise CheckpointError(f"checkpoint {path} belongs to run {state.get('run_id')}, "
                              f"not to run {run['id']}")
    if recorded is not None:
        where = (state.get("step"), state.get("epoch"), state.get("batch_in_epoch"))
        expected = (recorded["step"], recorded["epoch"], recorded["batch_in_epoch"])
        if where != expected:
            raise CheckpointError(
                f"checkpoint {path} holds step {where[0]} (epoch {where[1]}, batch {where[2]}) "
                f"but the session recorded step {expected[0]} (epoch {expected[1]}, batch "
                f"{expected[2]}) under that name: the file was replaced")
    keep = set(config.TRAINING_LENGTH_KEYS) | set(config.LAUNCH_KEYS)
    mine = {k: v for k, v in cfg.to_dict().items() if k not in keep}
    # (one of an earlier version lacks the knobs added since: read as that version ran it)
    theirs = {k: v for k, v in as_recorded(dict(state["config"]))[0].items()
              if k not in keep}
    if mine != theirs:
        diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        raise CheckpointError(f"checkpoint {path} was written with another config "
                              f"(differs in: {', '.join(diff)})")


def load_named(store: SessionStore, run: dict[str, Any], cfg: config.RunConfig,
               path: Path) -> dict[str, Any]:
    """The checkpoint at `path` (`resume --checkpoint`), loaded and checked against the run
    (and against the session's record of it, when the session lists that file)."""
    state = load_checkpoint(path)
    listed = [c for c in store.usable_checkpoints(run["id"]) if Path(c["path"]) == path.resolve()]
    check_fits(state, path, run, cfg, listed[0] if listed else None)
    return state


def choose_checkpoint(store: SessionStore, run: dict[str, Any], cfg: config.RunConfig
                      ) -> tuple[dict[str, Any], Path, list[str]]:
    """The newest recorded checkpoint of `run` that loads and fits it, with a note for every
    newer one passed over (missing, corrupt, replaced, outside the session). Raises
    CheckpointError naming every reason when none is usable."""
    notes: list[str] = []
    for c in store.checkpoints(run["id"]):
        if c["path"] is None:
            notes.append(f"step {c['step']}: {c['refused']}")
            continue
        path = Path(c["path"])
        try:
            state = load_checkpoint(path)
            check_fits(state, path, run, cfg, c)
        except CheckpointError as e:
            notes.append(f"step {c['step']}: {e}")
            continue
        return state, path, notes
    raise CheckpointError(
        f"run {run['id']} has no usable checkpoint"
        + (f" ({'; '.join(notes)})" if notes else "")
        + f". `tui-trainer resume {run['id']} --restart` trains it again from step 0 "
        "(its recorded rows are replaced as it goes)")


_TMP = re.compile(r"^\..+\.(\d+)\.tmp$")


def sweep(store: SessionStore, run_id: int) -> list[Path]:
    """Removes what interrupted writes left in the run's checkpoint folder: temporary files
    of processes that are gone, and checkpoint files the session no longer lists (a kill
    between writing a file and recording it, or between unlisting it and deleting it).
    Only the run's claimed writer calls this."""
    folder = store.checkpoint_dir(run_id)
    if not folder.is_dir():
        return []
    listed = {c["path"] for c in store.usable_checkpoints(run_id)}
    removed = []
    for f in folder.iterdir():
        m = _TMP.match(f.name)
        stale_tmp = m is not None and not process_alive(int(m.group(1)), None)
        orphan = m is None and f.suffix == ".pt" and str(f.resolve()) not in listed
        if (stale_tmp or orphan) and f.is_file() and not f.is_symlink():
            try:
                store.inside(str(f.relative_to(store.dir)))
                f.unlink()
                removed.append(f)
            except (OSError, SessionError, ValueError):
                continue
    return removed
