"""What a training process is called in `ps`, `top`, `htop` and `nvidia-smi`: its run, name
and session (and its rank, in a data-parallel run), not "python3 -m tui_trainer.launcher ...".
setproctitle, the library made for it, rewrites the process's command line; without it (an
image that lacks it) the title stays as it was.

Core layer: imports neither torch nor textual."""

from __future__ import annotations

from pathlib import Path

from ..text import shown

PREFIX = "tui-trainer"


def title(run_id: int, name: str | None = None, session: Path | str | None = None,
          rank: int | None = None, world: int = 1, ranks: int | None = None) -> str:
    """`tui-trainer run 3 "lr-sweep" rank 1/4 (session ~/s)`; with `ranks`, the launcher of
    a data-parallel run: `tui-trainer run 3 launcher of 2 ranks (session ~/s)`. The parts
    known, as text (a name from the session is data: no control characters)."""
    parts = [PREFIX, "run", str(run_id)]
    if ranks is not None:
        parts.append(f"launcher of {ranks} ranks")
    if name:
        parts.append(f'"{shown(name, 40)}"')
    if world > 1 and rank is not None:
        parts.append(f"rank {rank}/{world}")
    if session is not None:
        home = Path.home()
        where = Path(session)
        where = Path("~") / where.relative_to(home) if where.is_relative_to(home) else where
        parts.append(f"(session {shown(str(where), 240)})")
    return " ".join(parts)


def set_title(text: str) -> bool:
    """Names this process `text`; False where setproctitle is not installed."""
    try:
        from setproctitle import setproctitle
    except ImportError:
        return False
    setproctitle(text)
    return True
