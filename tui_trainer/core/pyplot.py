"""matplotlib for the PNGs core draws (exports, the pictures): imported only when a figure
is drawn, always with the Agg backend (no display)."""

from __future__ import annotations

from typing import Any

FIG_SIZE_IN = (10.0, 6.0)
FIG_DPI = 100           # 1000 x 600 pixels


def pyplot() -> Any:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
