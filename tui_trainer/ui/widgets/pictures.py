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

from ...core.analysis.activations import colours, input_rgba
from ...core.text import shown

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


def image_picture(image: np.ndarray, most: int = 32) -> Picture:
    """The input image as a person sees it (grey H x W or colour H x W x 3, 0 to 1), made
    at most `most` cells wide (a box mean per cell: a large image of the user's fits)."""
    h, w = image.shape[:2]
    if w > most:
        size = (most, max(2, round(h * most / w)))
        image = resized(image, *size) if image.ndim == 2 else \
            np.stack([resized(image[..., i], *size) for i in range(3)], axis=2)
    return Picture(input_rgba(image))


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
    """The classes (all, or the likeliest and the label: activations.listed), a bar and a
    percentage per run, the label marked."""
    from ...core.analysis.activations import class_name, listed
    runs = meta["runs"]
    at = listed(meta)
    width = max(5, *(len(class_name(meta, c)) for c in at))
    text = Text(f"{'class':<{width}}" + "".join(f"  {'run ' + str(r):<15}" for r in runs)
                + "\n", no_wrap=True, style="bold")
    columns = [bars([p[c] for c in at]) for p in meta["probs"]]
    for i, c in enumerate(at):
        text.append(f"{class_name(meta, c):<{width}}" if meta.get("classes") else f"{c:>5}",
                    style="bold" if c == meta["label"] else "")
        for k, p in enumerate(meta["probs"]):
            style = "green" if c == meta["label"] else ("red" if c == meta["predicted"][k]
                                                        else "")
            text.append(f"  {columns[k][i]}", style=style)
            text.append(f" {100 * p[c]:5.1f}%")
        text.append(" ← label\n" if c == meta["label"] else "\n")
    if len(at) < len(meta["probs"][0]):
        text.append(f"({len(at)} likeliest of {len(meta['probs'][0])} classes)", style="dim")
    return text


def stacked(t: dict[str, Any], width: int, height: int) -> Text:
    """A memory timeline (core.analysis.memory.timeline) as a stacked chart in half blocks: a column
    per slice of the step's operators (its highest point), the categories stacked bottom to
    top in their colours, the peak's MiB on the left; below, the phases and the legend."""
    from ...core.analysis.memory import COLOURS, PHASE_COLOURS, columns, peak_point
    cats = t["categories"]
    top = max(1, sum(peak_point(t)[3:]))
    label = f"{top / 2**20:,.1f} MiB"
    pad = len(label) + 1
    cols = columns(t, max(8, width - pad))
    levels = 2 * height
    # the category at each pixel (None: above the column's total), bottom row first
    grid = []
    for p in cols:
        edges, run = [], 0
        for b in p[3:]:
            run += b
            edges.append(run)
        column = []
        for level in range(levels):
            mid = (level + 0.5) * top / levels
            column.append(next((cats[i] for i, e in enumerate(edges) if mid < e), None))
        grid.append(column)
    text = Text(no_wrap=True, overflow="crop")
    for row in range(height):
        lower, upper = 2 * (height - 1 - row), 2 * (height - 1 - row) + 1
        text.append(label.rjust(pad - 1) + " " if row == 0 else
                    ("0 MiB".rjust(pad - 1) + " " if row == height - 1 else " " * pad))
        for column in grid:
            lo, up = column[lower], column[upper]
            if lo is None:
                text.append(" ")
                continue
            style = "rgb({},{},{})".format(*COLOURS.get(lo, (128, 128, 128)))
            if up is not None:
                style += " on rgb({},{},{})".format(*COLOURS.get(up, (128, 128, 128)))
            text.append("▄", style=style)
        text.append("\n")
    text.append(" " * pad)
    for p in cols:
        text.append("━", style="rgb({},{},{})".format(*PHASE_COLOURS[p[0]]))
    text.append("\n" + " " * pad)
    for phase, rgb in PHASE_COLOURS.items():
        if any(p[0] == phase for p in cols):
            text.append("━ ", style="rgb({},{},{})".format(*rgb))
            text.append(f"{phase}  ")
    text.append("\n" + " " * pad)
    for c in cats:
        text.append("█ ", style="rgb({},{},{})".format(*COLOURS.get(c, (128, 128, 128))))
        text.append(f"{shown(c, 40)}  ")
    return text
