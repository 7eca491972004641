"""The words and table of a memory breakdown (engine.memory.breakdown measures it; the
`memory` command prints it, the dashboard shows it, the session keeps it). Core layer: no
torch, no textual."""

from __future__ import annotations

from typing import Any

from .explain import UNREADABLE
from .store import SessionStore

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


def lines(result: dict[str, Any]) -> list[str]:
    """The breakdown as text: the peak by category, then each module's own peak."""
    try:
        total = result["total"] or 0
        out = [f"One training step measured on a copy of the run ({result['device']}, batch "
               f"{result['batch']}"
               + (f" per rank of {result['world']}" if result.get("world", 1) > 1 else "")
               + f", activation_checkpointing {result.get('checkpointing', 'off')}, from "
               + ("its newest checkpoint" if result.get("from_checkpoint") else "its config")
               + "), under torch's MemTracker.",
               f"At the step's peak: {_mib(total)} MiB",
               f"  {'category':<34}{'MiB':>10}{'share':>8}"]
        for name, b in sorted(result["categories"].items(), key=lambda kv: -kv[1]):
            share = f"{100 * b / total:.0f}%" if total else "-"
            out.append(f"  {name:<34}{_mib(b):>10}{share:>8}")
        out += ["By module (its own peak: while it ran forward or backward):",
                f"  {'module':<34}{'params MiB':>11}{'outputs MiB':>12}{'peak MiB':>10}"]
        for m in result["modules"]:
            out.append(f"  {str(m['module'])[:34]:<34}{_mib(m['parameters']):>11}"
                       f"{_mib(m['outputs']):>12}{_mib(m['peak']):>10}")
        return out
    except UNREADABLE as e:
        return [f"the memory breakdown kept cannot be read (damaged: {type(e).__name__} {e})"]
