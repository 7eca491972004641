"""The words and table of a memory breakdown (engine.probes.memory.breakdown measures it; the
`memory` command prints it, the dashboard shows it, the session keeps it). Core layer: no
torch, no textual."""

from __future__ import annotations

from typing import Any

from .explain import UNREADABLE
from ..session.store import SessionStore
from ..text import shown

# The event a breakdown is kept as, on its run.
EVENT = "memory_breakdown"


def record(store: SessionStore, run_id: int, result: dict[str, Any]) -> None:
    store.add_event(run_id, EVENT, summary(result), step=result.get("step"), data=result)


def newest(events: list[dict[str, Any]], since: float | None = None
           ) -> dict[str, Any] | None:
    """The newest breakdown among a run's events (one that reads as one; kept at or after
    the time `since`, when given)."""
    mine = [e["data"] for e in events if e.get("kind") == EVENT
            and isinstance(e.get("data"), dict)
            and (since is None or (isinstance(e.get("t"), (int, float)) and e["t"] >= since))]
    return mine[-1] if mine else None


def _mib(b: Any) -> str:
    return f"{b / 2**20:,.1f}" if isinstance(b, (int, float)) else "-"


def summary(result: dict[str, Any]) -> str:
    """One line: the peak and its largest parts."""
    cats = sorted(result["categories"].items(), key=lambda kv: -kv[1])
    parts = ", ".join(f"{name} {_mib(b)}" for name, b in cats if b)
    return (f"peak {_mib(result['total'])} MiB on {result['device']} at batch "
            f"{result['batch']}: {parts}")


def lines(result: dict[str, Any], resident_mib: float | None = None) -> list[str]:
    """The breakdown as text: the peak by category, then each module's own peak. The peak is
    of tensors alone; `resident_mib` (the run's peak memory where it is the process's
    resident set, as the run table shows it) is named beside it: the two differ by the
    process's Python, libraries and data (issue 55: 4.1 beside 519 MiB, unexplained)."""
    try:
        total = result["total"] or 0
        out = [f"One training step measured on a copy of the run ({result['device']}, batch "
               f"{result['batch']}"
               + (f" per rank of {result['world']}" if result.get("world", 1) > 1 else "")
               + f", activation_checkpointing {result.get('checkpointing', 'off')}, from "
               + ("its newest checkpoint" if result.get("from_checkpoint") else "its config")
               + "), under torch's MemTracker.",
               *(["Measured op by op: the run itself replays its step from CUDA graphs "
                  "(cuda_graph = step), whose memory pool it holds while it lives; the "
                  "run's own figures are in its rows."]
                 if result.get("graphs_replayed") is True else []),
               f"Tensors at the step's peak: {_mib(total)} MiB"
               + (f" (the run's peak memory in the run table, {resident_mib:,.0f} MiB, is "
                  "its process's resident memory: Python, torch's libraries, the data and "
                  "these tensors)" if resident_mib is not None else ""),
               f"  {'category':<34}{'MiB':>10}{'share':>8}"]
        for name, b in sorted(result["categories"].items(), key=lambda kv: -kv[1]):
            share = f"{100 * b / total:.0f}%" if total else "-"
            out.append(f"  {name:<34}{_mib(b):>10}{share:>8}")
        out += ["By module (its own peak: while it ran forward or backward):",
                f"  {'module':<34}{'params MiB':>11}{'outputs MiB':>12}{'peak MiB':>10}"]
        for m in result["modules"]:
            out.append(f"  {str(m['module'])[:34]:<34}{_mib(m['parameters']):>11}"
                       f"{_mib(m['outputs']):>12}{_mib(m['peak']):>10}")
        return out + [""] + timeline_lines(result)
    except UNREADABLE as e:
        return [f"the memory breakdown kept cannot be read (damaged: {type(e).__name__} {e})"]


# --- the step's timeline -------------------------------------------------------------------

PHASES = ("forward", "backward", "between", "optimizer", "after")
# Bottom to top in a stacked chart, and their colours (matplotlib's tab10, RGB).
ORDER = ("parameters", "buffers", "optimizer state", "gradients",
         "activations (kept for backward)", "temporaries", "other")
COLOURS = {"parameters": (31, 119, 180), "buffers": (23, 190, 207),
           "optimizer state": (44, 160, 44), "gradients": (255, 127, 14),
           "activations (kept for backward)": (214, 39, 40), "temporaries": (148, 103, 189),
           "other": (140, 86, 75)}
PHASE_COLOURS = {"forward": (31, 119, 180), "backward": (214, 39, 40),
                 "between": (188, 189, 34), "optimizer": (44, 160, 44),
                 "after": (127, 127, 127)}


def timeline(result: dict[str, Any]) -> dict[str, Any] | None:
    """A breakdown's timeline, checked (a kept answer is untrusted): category names, and
    points of phase, module, operator and a byte count per category. None when there is
    none (kept by an older tui-trainer) or it does not read as one."""
    t = result.get("timeline") if isinstance(result, dict) else None
    try:
        cats = [str(c) for c in t["categories"]]
        points = [p for p in t["points"] if len(p) == 3 + len(cats) and p[0] in PHASES
                  and all(isinstance(b, int) and b >= 0 for b in p[3:])]
    except (TypeError, KeyError):
        return None
    if not points:
        return None
    order = sorted(range(len(cats)), key=lambda i: ORDER.index(cats[i])
                   if cats[i] in ORDER else len(ORDER))
    return {"categories": [cats[i] for i in order],
            "points": [[*p[:3], *[p[3 + i] for i in order]] for p in points]}


def columns(t: dict[str, Any], width: int) -> list[list[Any]]:
    """The timeline in `width` columns: each the point of the highest total among those it
    covers (a peak is never averaged away); fewer points than columns are stretched."""
    pts = t["points"]
    n = len(pts)
    out = []
    for j in range(width):
        lo = j * n // width
        hi = max(lo + 1, (j + 1) * n // width)
        out.append(max(pts[lo:hi], key=lambda p: sum(p[3:])))
    return out


def peak_point(t: dict[str, Any]) -> list[Any]:
    return max(t["points"], key=lambda p: sum(p[3:]))


def timeline_lines(result: dict[str, Any]) -> list[str]:
    """The timeline in words: how many operators, where the peak falls and what it holds,
    and where the CUDA allocator's snapshot is (or why there is none)."""
    t = timeline(result)
    if t is None:
        return ["No timeline in this breakdown (measured by an older tui-trainer): m "
                "measures again."]
    p = peak_point(t)
    total = sum(p[3:])
    at = t["points"].index(p)
    parts = ", ".join(f"{c} {_mib(b)}" for c, b in zip(t["categories"], p[3:]) if b)
    out = [f"Timeline of the step: the memory by category after each of its "
           f"{len(t['points'])} operators (MemTracker's accounting of tensors). Peak "
           f"{_mib(total)} MiB at operator {at + 1} ({shown(p[2], 40)} in {shown(p[1], 40)}, "
           f"{p[0]}): {parts}."]
    snap = result.get("snapshot")
    if isinstance(snap, str) and snap:
        out.append(f"The CUDA allocator's history of this step: {shown(snap, 200)} (in the "
                   "session; open it at https://pytorch.org/memory_viz).")
    elif str(result.get("device", "")).startswith("cuda"):
        out.append("(no allocator snapshot kept: the session was read-only)")
    else:
        out.append("The allocator's own history (a snapshot for PyTorch's memory_viz) is "
                   "CUDA-only: on the CPU the timeline is MemTracker's.")
    return out
