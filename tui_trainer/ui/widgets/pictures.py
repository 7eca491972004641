"""Pictures in the terminal: arrays drawn through a matplotlib colour map into half-block
cells by rich-pixels (two pixels a cell, one above the other: works in every terminal that
shows colour, through tmux and in Textual's snapshots; docs/pictures.md says why this and
not textual-image or a renderer of our own). Built in worker threads: nothing here touches
the screen."""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.text import Text
from rich_pixels import Pixels

from ...core.activations import colours

LEGEND_CELLS = 16


class Picture:
    """A picture of a known width in cells (rich-pixels' Pixels says none, which a table
    would squeeze)."""

    def __init__(self, rgba: np.ndarray) -> None:
        if rgba.shape[0] % 2:               # two pixels a cell: an even height
            rgba = np.concatenate([rgba, np.zeros((1, *rgba.shape[1:]), np.uint8)])
        self.width, self.height = rgba.shape[1], rgba.shape[0] // 2
        self.pixels = Pixels.from_image(Image.fromarray(rgba, "RGBA"))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.pixels

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(self.width, self.width)


def resized(values: np.ndarray, width: int, height: int) -> np.ndarray:
    """A 2-D array at another size: the mean of each box when smaller, nearest when
    larger (a pixel stays a sharp square)."""
    h, w = values.shape
    if (h, w) == (height, width):
        return values
    how = Image.Resampling.BOX if width < w else Image.Resampling.NEAREST
    img = Image.fromarray(np.ascontiguousarray(values, np.float32), mode="F")
    return np.asarray(img.resize((width, height), how), np.float32)


def picture(values: np.ndarray, cmap: str, lo: float, hi: float) -> Picture:
    return Picture(colours(values, cmap, lo, hi))


def legend(cmap: str, lo: float, hi: float) -> Text:
    """`lo ████ hi`: the colour scale as cells of its colours."""
    from matplotlib import colormaps
    out = Text(f"{lo:.3g} ", no_wrap=True)
    for i in range(LEGEND_CELLS):
        r, g, b, _ = (np.asarray(colormaps[cmap](i / (LEGEND_CELLS - 1))) * 255).astype(int)
        out.append("█", style=f"rgb({r},{g},{b})")
    out.append(f" {hi:.3g}")
    return out


def bars(values: list[float], width: int = 8) -> list[str]:
    """Probabilities as bars of eighth blocks."""
    out = []
    for v in values:
        eighths = int(round(max(0.0, min(1.0, v)) * width * 8))
        full, part = divmod(eighths, 8)
        out.append(("█" * full + (" ▏▎▍▌▋▊▉"[part] if part else "")).ljust(width))
    return out


def probability_table(meta: dict[str, Any]) -> Text:
    """The ten classes, a bar and a percentage per run, the label marked."""
    runs = meta["runs"]
    text = Text("class" + "".join(f"  {'run ' + str(r):<15}" for r in runs) + "\n",
                no_wrap=True, style="bold")
    columns = [bars(p) for p in meta["probs"]]
    for c in range(10):
        text.append(f"{c:>5}", style="bold" if c == meta["label"] else "")
        for k, p in enumerate(meta["probs"]):
            style = "green" if c == meta["label"] else ("red" if c == meta["predicted"][k]
                                                        else "")
            text.append(f"  {columns[k][c]}", style=style)
            text.append(f" {100 * p[c]:5.1f}%")
        text.append(" ← label\n" if c == meta["label"] else "\n")
    return text
