"""What a net sees in one digit, run against run: the words, the shared colour scales, the
mosaics of feature maps, the PNG, and how the session keeps it. engine.probes.activations measures
it; the `activations` command and the Model tab show it. Core layer: no torch, no textual
(numpy for the maps; matplotlib only for the PNG and the colour maps).

What is kept: an `activations` event on the first run (its `data` is the metadata below)
and the maps in an .npz beside the run's log (`file`, relative to the session; read with
allow_pickle=False, its size and shapes checked against the metadata).

    runs, steps, models        one entry per run (one or two)
    dataset, digit, how, label the image (a digit in MNIST): its index in the evaluation
                               set, how it was chosen, its class
    classes                    the classes' names, where they are not the digits (optional)
    probs, predicted           per run: each class's probability, the class predicted
    layers                     per convolution: name, shape (C, H, W), the colour scale
                               shared by the runs (lo, hi), and for two runs of the same
                               shape the largest |A - B| (diff; None otherwise)
    file, png                  the maps, and the PNG drawn of them
"""

from __future__ import annotations

import math
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..settings.config import model_words
from ..session.store import SessionStore
from ..text import shown

if TYPE_CHECKING:
    import numpy as np

EVENT = "activations"
MAPS_CMAP = "viridis"           # a layer's maps, one scale for both runs
DIFF_CMAP = "RdBu_r"            # A - B: blue where B is higher, red where A is
MAX_FILE = 64 * 2**20           # an .npz larger than this is not read (a hostile session),
MAX_ARRAYS = 256 * 2**20        # nor one whose arrays would unpack to more than this
HOW_WORDS = {"index": "chosen by index", "random": "drawn at random",
             "worst": "the one {run} gets wrong with the highest confidence"}
MAX_CLASSES = 4096
LISTED = 10                     # classes listed at most: the likeliest, and the label


# --- from the engine's answer to what is kept -----------------------------------------------

def combine(runs: list[int], steps: list[int], models: list[str], seen: list[dict[str, Any]],
            digit: dict[str, Any], same_start: bool | None = None
            ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The metadata and the arrays of one digit seen by one or two runs. `same_start`: two
    runs' step-0 fingerprints agree (True), differ (False: channel k of one net is not
    channel k of the other, so no difference is drawn), or are not both kept (None)."""
    import numpy as np
    arrays: dict[str, np.ndarray] = {"input": np.asarray(digit.pop("image"), np.float32)}
    names: list[str] = []
    for k, s in enumerate(seen):
        for name, m in s["maps"].items():
            arrays[f"{k}:{name}"] = np.asarray(m, np.float32)
            if name not in names:
                names.append(name)
    layers = []
    for name in names:
        mine = [arrays.get(f"{k}:{name}") for k in range(len(seen))]
        present = [m for m in mine if m is not None]
        lo, hi = _span(np.concatenate([m.ravel() for m in present]))
        diff = None
        if len(mine) == 2 and all(m is not None for m in mine) and \
                mine[0].shape == mine[1].shape and same_start is not False:
            diff = _span(np.abs(mine[0] - mine[1]).ravel())[1]
        layers.append({"name": name, "shape": list(present[0].shape), "lo": lo, "hi": hi,
                       "diff": diff, "in": [m is not None for m in mine]})
    meta = {"runs": runs, "steps": steps, "models": models, **digit,
            "probs": [s["probs"] for s in seen], "predicted": [s["predicted"] for s in seen],
            "layers": layers, **({"same_start": same_start} if len(runs) == 2 else {})}
    return meta, arrays


def _span(values: np.ndarray) -> tuple[float, float]:
    """The least and greatest finite values (0, 0 when none is: a run that diverged)."""
    import numpy as np
    finite = values[np.isfinite(values)]
    return (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)


def stem(meta: dict[str, Any]) -> str:
    """The files' common name: runs, steps, digit ("run-1-..." for one run, "runs-1-2-..." for
    two, as every export of several runs is named)."""
    runs = "-".join(str(r) for r in meta["runs"])
    steps = "-".join(str(s) for s in meta["steps"])
    return f"run{'s' if len(meta['runs']) > 1 else ''}-{runs}-activations-step-{steps}-" \
        f"digit-{meta['digit']}"


def keep(store: SessionStore, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """The maps beside the first run's log, and the event that names them."""
    import numpy as np
    path = store.log_path(meta["runs"][0]).with_name(
        f"{stem(meta)}-{time.strftime('%Y%m%d-%H%M%S')}.npz")
    np.savez_compressed(path, **{k.replace(":", "__"): v for k, v in arrays.items()})
    meta["file"] = str(path.relative_to(store.dir))
    png = Path(meta.get("png") or "")
    if png.is_absolute() and png.is_relative_to(store.dir):
        meta["png"] = str(png.relative_to(store.dir))      # the session can move
    store.add_event(meta["runs"][0], EVENT, summary(meta), step=meta["steps"][0], data=meta)


# --- reading it back (untrusted: a session may come from anywhere) ---------------------------

def newest(events: list[dict[str, Any]], runs: tuple[int, ...] | None = None,
           since: float | None = None) -> dict[str, Any] | None:
    """The newest kept answer among a run's events (for exactly these runs, when given; kept
    at or after `since`, when given) that reads as one."""
    for e in reversed(events):
        d = e.get("data")
        if e.get("kind") != EVENT or not readable(d):
            continue
        if runs is not None and tuple(d["runs"]) != tuple(runs):
            continue
        if since is not None and not (isinstance(e.get("t"), (int, float)) and e["t"] >= since):
            continue
        return d
    return None


def _ints(xs: Any, lo: int, hi: int) -> bool:
    return all(isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi for x in xs)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def readable(d: Any) -> bool:
    """Whether kept metadata reads as an answer (a session may come from anywhere): every
    field of the type and range the drawing uses."""
    try:
        n = len(d["runs"])
        k = len(d["probs"][0])
        names = d.get("classes")
        return (1 <= n <= 2 and _ints(d["runs"], 0, 2**62) and _ints(d["steps"], 0, 2**62)
                and all(len(d[key]) == n for key in ("steps", "models", "probs", "predicted"))
                and 2 <= k <= MAX_CLASSES
                and all(len(p) == k and all(_number(x) for x in p) for p in d["probs"])
                and _ints(d["predicted"], 0, k - 1) and _ints([d["label"]], 0, k - 1)
                and _ints([d["digit"]], 0, 2**31) and isinstance(d["file"], str)
                and (names is None or (isinstance(names, list) and len(names) == k
                                       and all(isinstance(x, str) for x in names)))
                and all(isinstance(L["name"], str) and len(L["shape"]) == 3
                        and _ints(L["shape"][:1], 1, 4096) and _ints(L["shape"][1:], 1, 1024)
                        and _number(L["lo"]) and _number(L["hi"])
                        and (L["diff"] is None or _number(L["diff"]))
                        and len(L["in"]) == n and all(isinstance(x, bool) for x in L["in"])
                        and any(L["in"]) for L in d["layers"])
                and d.get("same_start") in (None, True, False))
    except (KeyError, TypeError, IndexError):
        return False


def load(session: Path, meta: dict[str, Any]) -> dict[str, np.ndarray]:
    """The kept maps, checked: the file lies inside the session, is at most MAX_FILE bytes,
    holds arrays only (no pickles) of the shapes the metadata gives. ValueError says what
    is wrong."""
    import numpy as np
    root = Path(session).resolve()
    path = (root / meta["file"]).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"the kept maps' path {meta['file']!r} leads outside the session")
    if not path.is_file():
        raise ValueError(f"the kept maps ({meta['file']}) are gone from the session")
    if path.stat().st_size > MAX_FILE:
        raise ValueError(f"the kept maps ({meta['file']}) are larger than "
                         f"{MAX_FILE // 2**20} MiB; not read")
    try:
        with np.load(path, allow_pickle=False) as z:
            unpacked = sum(info.file_size for info in z.zip.infolist())
            if unpacked > MAX_ARRAYS:
                raise ValueError(f"its arrays would take {unpacked // 2**20:,} MiB unpacked, "
                                 f"more than {MAX_ARRAYS // 2**20} MiB; not read")
            out = {k.replace("__", ":"): np.asarray(z[k], np.float32) for k in z.files}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise ValueError(f"the kept maps ({meta['file']}) cannot be read: {e}") from None
    image = out.get("input", np.zeros(0))
    if not (image.ndim == 2 or (image.ndim == 3 and image.shape[2] == 3)):
        raise ValueError(f"the kept maps ({meta['file']}) hold no input image")
    for L in meta["layers"]:
        for k, here in enumerate(L["in"]):
            m = out.get(f"{k}:{L['name']}")
            if here and (m is None or list(m.shape) != list(L["shape"])):
                raise ValueError(f"the kept maps ({meta['file']}) do not match their "
                                 f"description (layer {L['name']})")
    return out


# --- what is drawn ----------------------------------------------------------------------

def mosaic(maps: np.ndarray, cols: int, gap: int = 1, vgap: int | None = None
           ) -> np.ndarray:
    """A layer's C maps (C x H x W) as one image of `cols` tiles a row, NaN between tiles
    (drawn as the background): `gap` pixels across, `vgap` down (default the same)."""
    import numpy as np
    c, h, w = maps.shape
    v = gap if vgap is None else vgap
    cols = max(1, min(cols, c))
    rows = math.ceil(c / cols)
    out = np.full((rows * (h + v) - v, cols * (w + gap) - gap), np.nan, np.float32)
    for i in range(c):
        r, q = divmod(i, cols)
        out[r * (h + v):r * (h + v) + h, q * (w + gap):q * (w + gap) + w] = maps[i]
    return out


def views(meta: dict[str, Any], arrays: dict[str, np.ndarray], name: str
          ) -> list[tuple[str, np.ndarray, str, float, float]]:
    """What one layer's row shows, left to right: each run's maps on the layer's shared
    scale, then A - B on a symmetric scale of its own: (title, maps, colour map, lo, hi)."""
    L = next(x for x in meta["layers"] if x["name"] == name)
    out = []
    for k, here in enumerate(L["in"]):
        if here:
            out.append((f"run {meta['runs'][k]} (step {meta['steps'][k]})",
                        arrays[f"{k}:{name}"], MAPS_CMAP, L["lo"], L["hi"]))
    if L["diff"] is not None:
        d = L["diff"] or 1e-12
        a, b = meta["runs"]
        out.append((f"run {a} - run {b}", arrays[f"0:{name}"] - arrays[f"1:{name}"],
                    DIFF_CMAP, -d, d))
    return out


def colours(values: np.ndarray, cmap: str, lo: float, hi: float) -> np.ndarray:
    """RGBA bytes (H x W x 4) of values on [lo, hi] through a matplotlib colour map; NaN is
    transparent."""
    import numpy as np
    from matplotlib import colormaps
    span = (hi - lo) or 1.0
    norm = np.clip((values - lo) / span, 0.0, 1.0)
    rgba = (colormaps[cmap](np.nan_to_num(norm)) * 255).astype(np.uint8)
    rgba[np.isnan(values)] = 0
    return rgba


def class_name(meta: dict[str, Any], c: int) -> str:
    """Class c as the dataset names it: the digit, or (Fashion-MNIST, a folder of the
    user's images, ...) "c name"; a name from a session is shown as text."""
    names = meta.get("classes")
    if isinstance(names, list) and len(names) == len(meta["probs"][0]):
        return f"{c} {shown(names[c], 14)}"
    return str(c)


def listed(meta: dict[str, Any]) -> list[int]:
    """The classes a table lists, in order: every one, or where there are more than LISTED,
    the likeliest in any run and the label (LISTED in all)."""
    k = len(meta["probs"][0])
    if k <= LISTED:
        return list(range(k))
    top = sorted(range(k), key=lambda c: -max(p[c] for p in meta["probs"]))
    keep = [c for c in top if c != meta["label"]][:LISTED - 1] + [meta["label"]]
    return sorted(keep)


def noun(meta: dict[str, Any]) -> str:
    """What the picked image is called: a digit in MNIST, an image elsewhere."""
    return "digit" if meta.get("dataset") in ("mnist", "mnist-sample") else "image"


def input_rgba(image: np.ndarray) -> np.ndarray:
    """RGBA bytes (H x W x 4) of the input image as a person sees it: grey (H x W) or colour
    (H x W x 3), values 0 to 1."""
    import numpy as np
    if image.ndim == 2:
        return colours(image, "gray", 0.0, 1.0)
    rgb = (np.clip(np.nan_to_num(image), 0.0, 1.0) * 255).astype(np.uint8)
    return np.concatenate([rgb, np.full(rgb.shape[:2] + (1,), 255, np.uint8)], axis=2)


NO_CONVOLUTIONS = ("this net has no convolutions: no maps to show (each nn.Conv2d layer's output "
                   "is drawn)")


def _pct(p: float) -> str:
    return f"{100 * p:.1f}%"


def summary(meta: dict[str, Any]) -> str:
    runs = " and ".join(f"run {r} at step {s}" for r, s in zip(meta["runs"], meta["steps"]))
    said = ", ".join(f"{class_name(meta, c)} ({_pct(p[c])})"
                     for c, p in zip(meta["predicted"], meta["probs"]))
    return (f"{noun(meta)} {meta['digit']} (label {class_name(meta, meta['label'])}) "
            f"through {runs}: "
            f"predicted {said}; "
            + (f"{len(meta['layers'])} convolution(s)" if meta["layers"] else
               NO_CONVOLUTIONS))


def lines(meta: dict[str, Any]) -> list[str]:
    """The words beside the pictures: which digit, which checkpoints, what each run predicts,
    the ten probabilities, and each layer's scale."""
    runs, steps = meta["runs"], meta["steps"]
    how = HOW_WORDS.get(meta.get("how"), "").format(run=f"run {runs[0]}")
    out = [f"{noun(meta).capitalize()} {meta['digit']} of the {meta.get('dataset', '?')} "
           "evaluation set"
           + (f" ({how})" if how else "") + f", labelled {class_name(meta, meta['label'])}."]
    for r, s, m, c, p in zip(runs, steps, meta["models"], meta["predicted"], meta["probs"]):
        mark = "right" if c == meta["label"] else "wrong"
        out.append(f"Run {r}, checkpoint at step {s} ({model_words(m)}): predicts "
                   f"{class_name(meta, c)} with "
                   f"{_pct(p[c])} ({mark}).")
    if meta.get("same_start") is False:
        a, b = runs
        out.append(f"Runs {a} and {b} started from other initial weights (their step-0 "
                   "fingerprints differ: another seed, or another model): channel k of one "
                   "net is not channel k of the other, so their maps are shown side by side "
                   "without a difference.")
    shown_classes = listed(meta)
    width = max(5, *(len(class_name(meta, c)) for c in shown_classes))
    head = f"{'class':<{width}} " + "".join(f"{'run ' + str(r):>10}" for r in runs) + \
        (f"{'A - B':>9}" if len(runs) == 2 else "")
    out += ["", head]
    k = len(meta["probs"][0])
    if len(shown_classes) < k:
        out.insert(-1, f"(the {len(shown_classes)} likeliest of {k} classes, the label "
                       "among them)")
    for c in shown_classes:
        row = f"{class_name(meta, c):<{width}} " + \
            "".join(f"{_pct(p[c]):>10}" for p in meta["probs"])
        if len(runs) == 2:
            row += f"{100 * (meta['probs'][0][c] - meta['probs'][1][c]):>+8.1f}"
        out.append(row + ("   <- label" if c == meta["label"] else ""))
    for L in meta["layers"]:
        out.append("")
        out.append(layer_line(meta, L))
    if not meta["layers"]:
        out += ["", NO_CONVOLUTIONS]
    return out


def layer_line(meta: dict[str, Any], L: dict[str, Any]) -> str:
    c, h, w = L["shape"]
    who = [f"run {r}" for r, here in zip(meta["runs"], L["in"]) if here]
    text = (f"{L['name']}: {c} channel(s) of {h}x{w}; colour {L['lo']:.3g} (dark) to "
            f"{L['hi']:.3g} (yellow)" + (", one scale for both runs" if len(who) == 2 else ""))
    if L["diff"] is not None:
        text += (f"; run {meta['runs'][0]} - run {meta['runs'][1]}: identical" if L["diff"] == 0
                 else f"; run {meta['runs'][0]} - run {meta['runs'][1]} up to "
                      f"{L['diff']:.3g} (red: A higher, blue: B higher)")
    elif len(meta["runs"]) == 2:
        text += f" (only in {who[0]}: no difference drawn)" if len(who) == 1 else \
            " (other initial weights: no difference drawn)" \
            if meta.get("same_start") is False else " (shapes differ: no difference drawn)"
    return text


# --- the PNG ------------------------------------------------------------------------------

def png(meta: dict[str, Any], arrays: dict[str, np.ndarray], path: Path) -> Path:
    """The same views as one PNG (matplotlib): the digit and the probabilities, then one row
    a convolution: each run's maps on one shared scale and their difference, each with
    its colour bar."""
    import numpy as np
    from ..pyplot import FIG_DPI, pyplot
    plt = pyplot()
    n = len(meta["runs"])
    cols = n + (1 if n == 2 else 0)
    rows = 1 + len(meta["layers"])
    heights = [1.0] + [_aspect(L) for L in meta["layers"]]
    fig = plt.figure(figsize=(5.0 * max(cols, 2), 3.2 * sum(heights)), dpi=FIG_DPI)
    grid = fig.add_gridspec(rows, max(cols, 2), height_ratios=heights)
    ax = fig.add_subplot(grid[0, 0])
    ax.imshow(input_rgba(arrays["input"]))
    ax.set_title(f"{noun(meta)} {meta['digit']} (label {class_name(meta, meta['label'])})")
    ax.axis("off")
    ax = fig.add_subplot(grid[0, 1:])
    width = 0.8 / n
    at = listed(meta)
    for k, (r, p) in enumerate(zip(meta["runs"], meta["probs"])):
        ax.bar(np.arange(len(at)) + (k - (n - 1) / 2) * width, [p[c] for c in at], width,
               label=f"run {r} (step {meta['steps'][k]})")
    ax.set_xticks(range(len(at)), [class_name(meta, c) for c in at],
                  rotation=30 if meta.get("classes") else 0)
    ax.set_ylim(0, 1)
    ax.set_title("class probabilities")
    ax.legend(fontsize="small")
    for i, L in enumerate(meta["layers"], start=1):
        for j, (title, maps, cmap, lo, hi) in enumerate(views(meta, arrays, L["name"])):
            ax = fig.add_subplot(grid[i, j])
            img = mosaic(maps, math.ceil(math.sqrt(maps.shape[0])))
            shown = ax.imshow(np.ma.masked_invalid(img), cmap=cmap, vmin=lo, vmax=hi,
                              interpolation="nearest")
            ax.set_title(f"{L['name']}: {title}", fontsize="small")
            ax.axis("off")
            fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.02)
    fig.suptitle(summary(meta), fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=FIG_DPI)
    plt.close(fig)
    return path


def _aspect(L: dict[str, Any]) -> float:
    c, h, w = L["shape"]
    cols = math.ceil(math.sqrt(c))
    return max(0.6, (math.ceil(c / cols) * (h + 1)) / (cols * (w + 1)))
