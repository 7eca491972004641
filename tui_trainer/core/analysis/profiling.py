"""The words, tables and diffs of a profile (engine.probes.profile measures it; the `profile`
command prints it, the dashboard's Profile tab shows it, the session keeps it as an event
on the run, exports copy its trace). Core layer: no torch, no textual.

A kept profile is read back as untrusted (another tool, an old version or a hostile
session may have written it): `read` keeps what has the right shape, and the trace's path
must resolve inside the session.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .figures import PHASES
from ..processes import contention
from ..session.store import SessionStore
from ..text import shown

EVENT = "profile"            # the event a profile is kept as, on its run
SHOWN_OPS = 15               # operators a table shows


def record(store: SessionStore, run_id: int, result: dict[str, Any]) -> None:
    store.add_event(run_id, EVENT, summary(result), data=result)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) \
        and math.isfinite(v) else None


def read(data: Any) -> dict[str, Any] | None:
    """A kept profile with the shape this module reads, or None."""
    if not isinstance(data, dict) or not isinstance(data.get("ops"), list):
        return None
    steps = data.get("steps")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        return None
    ops = []
    for o in data["ops"]:
        if isinstance(o, dict) and isinstance(o.get("op"), str) and \
                _num(o.get("self_ms")) is not None:
            ops.append({"op": o["op"], "self_ms": _num(o["self_ms"]),
                        "calls": _num(o.get("calls")) or 0.0,
                        "share": _num(o.get("share")) or 0.0,
                        "device_ms": _num(o.get("device_ms")),
                        "device_share": _num(o.get("device_share")) or 0.0})
    kernels = [{"kernel": k["kernel"], "device_ms": _num(k["device_ms"]),
                "calls": _num(k.get("calls")) or 0.0}
               for k in data.get("kernels") or []
               if isinstance(k, dict) and isinstance(k.get("kernel"), str)
               and _num(k.get("device_ms")) is not None] \
        if isinstance(data.get("kernels"), list) else []
    modules = [{"module": m["module"], "ms": _num(m.get("ms")) or 0.0}
               for m in data.get("modules") or []
               if isinstance(m, dict) and isinstance(m.get("module"), str)]
    phases = data.get("phases_ms") if isinstance(data.get("phases_ms"), dict) else {}
    memory = data.get("memory") if isinstance(data.get("memory"), dict) else {}
    cats = memory.get("categories") if isinstance(memory.get("categories"), dict) else {}
    return {"steps": steps, "warmup": data.get("warmup") if isinstance(data.get("warmup"), int)
            else None, "device": str(data.get("device", "?")),
            "batch": data.get("batch") if isinstance(data.get("batch"), int) else None,
            "from_step": data.get("from_step") if isinstance(data.get("from_step"), int)
            else None, "wall_ms": _num(data.get("wall_ms")), "self_ms": _num(data.get("self_ms")),
            "phases_ms": {k: _num(phases.get(k)) for k in PHASES},
            "ops": ops, "modules": modules, "kernels": kernels,
            "device_ms": _num(data.get("device_ms")),
            "memory": {str(k): v for k, v in cats.items() if _num(v) is not None},
            "memory_total": _num(memory.get("total")),
            "memory_error": memory.get("error") if isinstance(memory.get("error"), str) else None,
            "trace": data.get("trace") if isinstance(data.get("trace"), str) else None,
            "graphs_replayed": data.get("graphs_replayed") is True,
            "machine": contention.read(data.get("machine"))}


def busy(p: dict[str, Any]) -> str | None:
    """A read profile's warning when the machine was busy while its steps were profiled
    (another process took CPU the copy could have used: contention.loaded), or None."""
    if not contention.loaded(p["machine"]):
        return None
    return (f"Profiled on a busy machine ({contention.text(p['machine'])}): its times are "
            "slower than on a quiet one.")


def newest(events: list[dict[str, Any]], since: float | None = None) -> dict[str, Any] | None:
    """The newest profile among a run's events that reads as one (kept at or after
    `since`, when given)."""
    for e in reversed(events):
        if e.get("kind") != EVENT:
            continue
        if since is not None and not (isinstance(e.get("t"), (int, float)) and e["t"] >= since):
            continue
        got = read(e.get("data"))
        if got is not None:
            return got
    return None


def trace_path(session: Path, result: dict[str, Any]) -> Path | None:
    """The trace file of a profile, when it exists inside the session (a path that leads
    out of it is not followed)."""
    rel = result.get("trace")
    if not isinstance(rel, str) or not rel:
        return None
    root = Path(session).resolve()
    path = (root / rel).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        return None
    return path


def ranked(p: dict[str, Any]) -> list[dict[str, Any]]:
    """A read profile's operators by what the device spent on them: their kernels' CUDA
    time where the profile holds it (a CUDA run), else their self time on the CPU."""
    if p.get("device_ms") is not None:
        return sorted((o for o in p["ops"] if o.get("device_ms") is not None),
                      key=lambda o: -o["device_ms"])
    return sorted(p["ops"], key=lambda o: -o["self_ms"])


def summary(result: dict[str, Any]) -> str:
    top = ", ".join(f"{shown(o['op'], 40)} {o['share']:.0%}" for o in result["ops"][:3])
    return (f"profiled {result['steps']} steps on {result['device']}: "
            f"{result['wall_ms']:.1f} ms per step; top operators by self time: {top}")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}" if v < 100 else f"{v:,.0f}"


def _cells(name: str, cells: tuple[str, ...], name_w: int) -> str:
    """A table line: the name cut to name_w, then each cell right-aligned in 9 columns with
    at least one space before it (a wide figure never runs into its neighbour)."""
    return f"  {shown(name, name_w):<{name_w}}" + "".join(f" {c:>8}" for c in cells)


def name_width(width: int | None, cells: int) -> int:
    """How wide the operator column can be for tables `width` columns wide (44 without)."""
    if width is None:
        return 44
    return max(16, min(44, width - 2 - 9 * cells))


def lines(result: dict[str, Any], run_id: int | None = None, session: Path | None = None,
          width: int | None = None) -> list[str]:
    """The profile as text: what was profiled, the phases, the operators by self time, the
    modules' forward time, the memory peak by category, and where the trace is (its tables
    fit `width` columns, the operators' names cut)."""
    name_w = name_width(width, 3)
    p = read(result)
    if p is None:
        return ["the profile kept cannot be read (damaged)"]
    who = f"run {run_id}" if run_id is not None else "the run"
    out = [f"Profile of a copy of {who}: {p['steps']} steps after {p['warmup']} of warm-up, "
           f"from step {p['from_step']}, on {shown(p['device'], 20)}, batch {p['batch']}, "
           f"under torch.profiler: {_ms(p['wall_ms'])} ms per step."]
    if (warning := busy(p)) is not None:
        out.append(warning)
    if p["graphs_replayed"]:
        out.append("Profiled op by op: the run itself replays its step from CUDA graphs "
                   "(cuda_graph = step), which this copy's steps do not; the run's own step "
                   "time is in its rows.")
    phases = [(k, v) for k, v in p["phases_ms"].items() if v is not None and v > 0]
    if phases:
        total = sum(v for _, v in phases)
        out.append("By phase (ms per step): " + ", ".join(
            f"{k} {_ms(v)} ({v / total:.0%})" for k, v in phases))
    out += ["Operators by self time (ms per step; share of all operators' self time):",
            _cells("operator", ("self ms", "share", "calls"), name_w)]
    for o in p["ops"][:SHOWN_OPS]:
        out.append(_cells(o["op"], (_ms(o["self_ms"]), f"{o['share']:.1%}",
                                    f"{o['calls']:.0f}"), name_w))
    if p["device_ms"] is not None:
        out += [f"CUDA time by operator (ms per step: the kernels it launched; share of all "
                f"{_ms(p['device_ms'])} ms of kernel time):",
                _cells("operator", ("CUDA ms", "share", "calls"), name_w)]
        for o in ranked(p)[:SHOWN_OPS]:
            out.append(_cells(o["op"], (_ms(o["device_ms"]), f"{o['device_share']:.1%}",
                                        f"{o['calls']:.0f}"), name_w))
        if p["kernels"]:
            out.append("Kernels by CUDA time (ms per step): " + ", ".join(
                f"{shown(k['kernel'], 60)} {_ms(k['device_ms'])}" for k in p["kernels"][:5]))
    if p["modules"]:
        out.append("Forward by module (ms per step, its ops included): " + ", ".join(
            f"{shown(m['module'], 30)} {_ms(m['ms'])}" for m in p["modules"][:10]))
    if p["memory"]:
        out.append("Tensors at the step's peak (MiB; MemTracker, one more step; the "
                   "process's resident memory is more): "
                   + ", ".join(f"{shown(k, 30)} {v / 2**20:,.1f}"
                               for k, v in sorted(p["memory"].items(), key=lambda kv: -kv[1])
                               if v))
    elif p["memory_error"]:
        out.append(f"Memory by category: not measured ({shown(p['memory_error'], 200)})")
    trace = trace_path(session, p) if session is not None else None
    if trace is not None:
        out.append(f"Trace (Chrome/Perfetto: chrome://tracing or ui.perfetto.dev): {trace}")
    return out


def diff(a: dict[str, Any], b: dict[str, Any], by: str = "self_ms") -> list[dict[str, Any]]:
    """Each operator's self time per step in A and in B (`by="device_ms"`: its kernels' CUDA
    time), the largest changes first (an operator outside one profile's kept list counts as
    not seen there: None)."""
    pa, pb = read(a), read(b)
    if pa is None or pb is None:
        return []
    ia = {o["op"]: o[by] for o in pa["ops"] if o[by] is not None}
    ib = {o["op"]: o[by] for o in pb["ops"] if o[by] is not None}
    rows = []
    for op in ia.keys() | ib.keys():
        x, y = ia.get(op), ib.get(op)
        rows.append({"op": op, "a_ms": x, "b_ms": y,
                     "ratio": y / x if x and y is not None else None,
                     "change_ms": (y or 0.0) - (x or 0.0)})
    rows.sort(key=lambda r: -abs(r["change_ms"]))
    return rows


def diff_lines(a: dict[str, Any], b: dict[str, Any], ids: tuple[Any, Any] = ("A", "B"),
               limit: int = SHOWN_OPS, width: int | None = None) -> list[str]:
    """The operators whose self time changed most between two profiles, both figures (the
    table `width` columns wide at most, the names cut)."""
    name_w = name_width(width, 4)
    pa, pb = read(a), read(b)
    if pa is None or pb is None:
        return ["one of the two profiles cannot be read (damaged)"]
    loaded = [str(i) for i, p in zip(ids, (pa, pb)) if busy(p) is not None]
    out = [f"Operators whose self time changed most, {ids[0]} -> {ids[1]} (ms per step): "
           f"step {_ms(pa['wall_ms'])} -> {_ms(pb['wall_ms'])}"
           + (f" (the machine was busy while {' and '.join(loaded)} "
              f"{'were' if len(loaded) > 1 else 'was'} profiled: a change may be the load's)"
              if loaded else ""),
           _cells("operator", (str(ids[0]), str(ids[1]), "B/A", "change"), name_w)]
    tables = [("self_ms", out)]
    if pa["device_ms"] is not None and pb["device_ms"] is not None:
        tables.append(("device_ms", [
            f"Operators whose CUDA time changed most, {ids[0]} -> {ids[1]} (ms per step): "
            f"kernels {_ms(pa['device_ms'])} -> {_ms(pb['device_ms'])}", out[1]]))
    for by, table in tables:
        for r in diff(a, b, by)[:limit]:
            q, change = r["ratio"], r["change_ms"]
            ratio = "-" if q is None else f"{q:.2f}x" if q < 100 else f"{q:,.0f}x"
            table.append(_cells(r["op"], (_ms(r["a_ms"]), _ms(r["b_ms"]), ratio,
                                          f"{change:+.2f}" if abs(change) < 1000
                                          else f"{change:+,.0f}"), name_w))
    return [line for _, table in tables for line in table]
