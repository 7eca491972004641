"""A net from the user's own file: `model = "path/to/net.py:Name"`.

`Name` is an nn.Module subclass, or a function returning one, built with no arguments; it
takes a batch of the dataset's images and returns one score per class (logits). The path
is relative to where the command runs, or absolute; in a TOML file, relative to the file's
folder (config.anchored: read_toml makes it absolute).

Code from a file is trusted explicitly, never because a session names it (a session is
data, and may come from someone else): a file runs only once this user has trusted its
exact content on this machine. Naming it yourself (on the command line, in a TOML file you
give) trusts it; `tui-trainer trust FILE` does too. What is trusted lives in the user's
config folder (core.session.paths.config_dir), by the content's SHA-256, never in the
session. Everything else that would import such a file (Continue, resume, repro of a
recorded run, explain, a study from the session, ...) refuses in one line that says how to
trust it, and imports nothing. Only a run's own process imports the file
(engine/models.py); this module reads bytes and hashes them.

Core layer: imports neither torch nor textual.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from ..errors import BadInput
from .config import FILE_MODEL
from ..session.paths import config_dir
from ..text import shown

TRUST_FILE = "trusted-models.json"
MAX_SOURCE = 4 << 20        # a model file is source code: a few MiB at most


def parse(value: str) -> tuple[str, str]:
    """(path as written, name) of a file model's spec."""
    m = FILE_MODEL.match(value)
    if m is None:
        raise BadInput(f"model: {shown(value, 80)!r} is not PATH.py:Name")
    return m.group("path"), m.group("name")


def resolve(path: str, cwd: Path | None = None) -> Path:
    """The file a spec's path names: ~ expanded, relative to `cwd` (else where this
    command runs), links followed."""
    p = Path(path).expanduser()
    if not p.is_absolute():
        p = (cwd or Path.cwd()) / p
    return p.resolve()


def read(path: Path) -> tuple[bytes, str]:
    """The file's content and its SHA-256; BadInput naming the field where it is missing,
    not a file, too large, or not Python text."""
    try:
        if not path.is_file():
            raise BadInput(f"model: {shown(path, 200)} is not a file (give PATH.py:Name, the "
                           "path relative to where the command runs, or absolute)")
        if path.stat().st_size > MAX_SOURCE:
            raise BadInput(f"model: {shown(path, 200)} is larger than {MAX_SOURCE >> 20} MiB; "
                           "a model file is Python source")
        data = path.read_bytes()
    except OSError as e:
        raise BadInput(f"model: {shown(path, 200)} cannot be read ({e.strerror or e})") from None
    try:
        compile(data, str(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:
        where = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
        raise BadInput(f"model: {shown(path, 200)} is not Python{where}: "
                       f"{shown(getattr(e, 'msg', e), 120)}") from None
    return data, hashlib.sha256(data).hexdigest()


def load_store(name: str) -> dict[str, Any]:
    """A JSON table of the user's config folder (what this user trusts), {} where there is
    none or it does not read as one."""
    try:
        raw = json.loads((config_dir() / name).read_text())
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def save_store(name: str, table: dict[str, Any]) -> None:
    """Writes a JSON table into the user's config folder, whole or not at all (mode 600)."""
    store = config_dir() / name
    store.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".trusted-", dir=store.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(table, f, indent=1)
        os.chmod(tmp, 0o600)
        os.replace(tmp, store)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def trusted() -> dict[str, dict[str, Any]]:
    """{sha256: {"path", "at"}} of every content this user trusted (read as untrusted:
    anything else in the file is ignored)."""
    return {k: v for k, v in load_store(TRUST_FILE).items()
            if isinstance(k, str) and re.fullmatch(r"[0-9a-f]{64}", k) and isinstance(v, dict)}


def is_trusted(sha: str) -> bool:
    return sha in trusted()


def trust(path: Path) -> str:
    """Trusts the file's content as it is now (its SHA-256, with the path, in the user's
    config folder, written whole or not at all); returns the hash."""
    _, sha = read(path)
    known = trusted()
    known[sha] = {"path": str(path), "at": time.time()}
    save_store(TRUST_FILE, known)
    return sha


def refusal(path: Path, sha: str) -> str:
    """The one line that says a file is not trusted here, and how to trust it."""
    return (f"model: {shown(path, 200)} (sha256 {sha[:16]}) is not trusted on this machine: "
            "code named by a session never runs until you trust it; read it, then "
            f"`tui-trainer trust {shown(path, 200)}`")


def changed(path: Path, recorded: str, now: str, run_id: int) -> str:
    """The one line that says a file is not the code a run trained with."""
    return (f"model: {shown(path, 200)} is not the code run {run_id} trained with (sha256 "
            f"{recorded[:16]} then, {now[:16]} now); put that code back, or start a new run")


def sources(events_of: Any, run_ids: list[int]) -> dict[int, str]:
    """Each run's recorded copy of its model's source (its newest `model_source` event;
    `events_of(run_id, kind)`: the store's events), read as untrusted, never executed."""
    out: dict[int, str] = {}
    for r in run_ids:
        kept = [e.get("data") for e in events_of(r, "model_source")]
        kept = [d for d in kept if isinstance(d, dict) and isinstance(d.get("source"), str)]
        if kept:
            out[r] = kept[-1]["source"]
    return out


def code_differs(runs: list[dict[str, Any]], kept: dict[int, str] | None = None) -> str | None:
    """"model code differs", with each run's file and hash and the first lines of the diff
    of their recorded sources, for runs of nets of the user's own files whose content
    differs; None where it does not (or a run has no such net)."""
    settings = [r.get("settings") or {} for r in runs]
    shas = [s.get("model_sha256") for s in settings]
    if None in shas or len(set(shas)) < 2:
        return None
    said = "; ".join(f"run {r['id']}: {shown(s.get('model_file'), 120)} (sha256 "
                     f"{shown(s.get('model_sha256'), 12)})" for r, s in zip(runs, settings))
    text = f"model code differs ({said})"
    kept = kept or {}
    a, b = runs[0]["id"], runs[1]["id"]
    if a in kept and b in kept:
        import difflib
        lines = [line for line in difflib.unified_diff(
            kept[a].splitlines(), kept[b].splitlines(), lineterm="", n=0)
            if not line.startswith(("---", "+++", "@@"))][:6]
        if lines:
            text += "; the diff begins: " + " | ".join(shown(x, 100) for x in lines)
    return text


def recorded(run: dict[str, Any]) -> dict[str, Any]:
    """What a run recorded of its net, for a copy of it to be built from (its settings, with
    its id for the messages): the file and the content it trained with."""
    settings = run.get("settings")
    return {**(settings if isinstance(settings, dict) else {}), "run_id": run.get("id")}


def checked(spec: str, was: dict[str, Any] | None = None) -> tuple[Path, bytes, str]:
    """A file net's path, content and hash, once it may run: the file a run recorded
    (`was`, from `recorded`) and only with the content it trained with, else the spec's
    path; and only content this user trusts. BadInput otherwise, in one line (both hashes,
    or how to trust it). Reads (a recorded file only once its recorded content is trusted
    here); runs nothing."""
    was = was or {}
    recorded_file, recorded_sha = was.get("model_file"), was.get("model_sha256")
    path = Path(recorded_file) if isinstance(recorded_file, str) and recorded_file else \
        resolve(parse(spec)[0])
    if recorded_sha and not (isinstance(recorded_sha, str) and is_trusted(recorded_sha)):
        # the content the run trained with is not trusted here: the file a session names
        # (outside it) is not even read
        raise BadInput(refusal(path, shown(recorded_sha, 64)))
    data, sha = read(path)
    if recorded_sha and recorded_sha != sha:        # (a session's record: shown as text)
        raise BadInput(changed(path, shown(recorded_sha, 64), sha, was.get("run_id", "?")))
    if not is_trusted(sha):
        raise BadInput(refusal(path, sha))
    return path, data, sha


def _spec(run: dict[str, Any]) -> Any:
    """The model a recorded run names (read as untrusted: a config that is no table names
    none)."""
    config = run.get("config")
    return config.get("model") if isinstance(config, dict) else None


def check_code(run: dict[str, Any]) -> None:
    """Before a recorded run of a net of the user's own file is continued, or copied to be
    measured (memory, profile, what it sees): `checked`, so that a refusal comes before
    anything starts."""
    spec = _spec(run)
    if isinstance(spec, str) and FILE_MODEL.match(spec):
        checked(spec, recorded(run))


def check_twin(run: dict[str, Any]) -> None:
    """Before a twin of a recorded run trains (F5, a check's twin: a new run of its config,
    whose process resolves the spec where it starts, here): the spec must name, from here,
    the file the run recorded, with the content it trained with, trusted (`checked`); else
    one line, before the twin is created."""
    spec = _spec(run)
    if not (isinstance(spec, str) and FILE_MODEL.match(spec)):
        return
    path, _, _ = checked(spec, recorded(run))
    here = resolve(parse(spec)[0])
    if here != path:
        raise BadInput(f"model: {shown(spec, 200)} names {shown(here, 200)} from here, not "
                       f"{shown(path, 200)}, the file run {run.get('id')} trained with: start "
                       "its twin from the folder it ran in")
