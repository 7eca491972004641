"""The Model tab: what the net sees in one digit (`tui-trainer activations`). For the run
under the cursor, or both runs of the marked pair: the digit, every channel of each
convolution's output (one colour scale per layer, shared by the two runs, and their
difference on a scale of its own) and the ten class probabilities, at a kept checkpoint.

Keys (this panel's, which the app binds while this tab shows): g show it (digit 0 at each run's newest checkpoint,
or the choice below), d a digit by index, D a random one, w the one the run gets wrong with
the highest confidence, [ and ] the checkpoint before or after, + and - the size of each
map, v one layer or all. Each choice is computed by a background command (the engine,
which imports torch; the dashboard never does) and kept in the session, where it is shown
from then on."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from ...core.analysis import activations
from ...core.session.reader import Snapshot
from ...core.text import shown, shown_lines
from ..jobs import Job, TabJob, job_said
from ..screens import NameScreen
from .common import Tick

ZOOMS = (1 / 2.25, 1 / 1.5, 1.0, 1.5, 2.25, 3.375)   # + and -: the maps' size against
ZOOM = 2                                            # the size that fits (this one)
WIDE = 150                                 # cells: from here the views of a layer sit side by side
HINT = ("g: what the net sees in a digit: the run under the cursor (or the marked pair, "
        "side by side with their difference) at its newest checkpoint. d a digit by index, "
        "D a random one, w the one the run gets most confidently wrong, [ ] the checkpoint "
        "before or after, + - the size of the maps, v one layer or all.")
KEYS = ("keys: g show · d digit · D random · w worst · [ ] checkpoint · + - size · "
        "v layer")


@dataclass(frozen=True)
class Choice:
    """What the next computation shows: the digit (how, index) and the checkpoint step
    (None: each run's newest)."""
    how: str = "index"
    index: int | None = 0
    step: int | None = None

    def args(self) -> list[str]:
        digit = str(self.index) if self.how == "index" else self.how
        return ["--digit", digit] + (["--step", str(self.step)] if self.step is not None
                                     else [])


class ModelPanel(VerticalScroll):
    TAB, TITLE, PANEL_ID = "tab-model", "Model", "model-panel"
    TAB_KEYS = [Binding("g", "model('show')", "Show", show=False),
                Binding("d", "model('digit')", "Digit", show=False),
                Binding("D", "model('random')", "Random digit", show=False),
                Binding("w", "model('worst')", "Worst digit", show=False),
                Binding("left_square_bracket", "model('earlier')", "Earlier checkpoint",
                        show=False),
                Binding("right_square_bracket", "model('later')", "Later checkpoint",
                        show=False),
                Binding("plus", "model('bigger')", "Bigger", show=False),
                Binding("minus", "model('smaller')", "Smaller", show=False),
                Binding("v", "model('layer')", "Layer", show=False)]
    # Each key in the palette too: "Model: " and what it does.
    COMMANDS = [(f"Model: {b.description.lower()}", f"The Model tab's {b.key} key: "
                 + {"show": "what the net sees in a digit, for the run or the pair",
                    "digit": "a digit by its index", "random": "a digit at random",
                    "worst": "the digit the net gets most wrong",
                    "earlier": "the checkpoint before", "later": "the checkpoint after",
                    "bigger": "bigger maps", "smaller": "smaller maps",
                    "layer": "one layer, or all"}[b.action[7:-2]], b.action)
                for b in TAB_KEYS]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._key: Any = None
        self._built_key: Any = None
        self.target: tuple[int, ...] = ()           # the runs the tab is about
        self.shown: dict[str, Any] | None = None    # the kept answer drawn
        self.zoom: int | None = None                # index into ZOOMS (None: by width)
        self.one_layer: int | None = None               # one layer (its index), or all
        self._status = ""
        self._reveal = False        # scroll to the maps once they are drawn again (+ - v)
        self.digits: int | None = None   # the target's evaluation set's size, where known
        self.activating = TabJob(self)      # the computation under way

    def compose(self) -> ComposeResult:
        yield Static(HINT, id="model-status")
        yield Static("", id="model-picture")      # the words, the digit, the probabilities
        yield Static("", id="model-layers")       # each convolution's maps

    # --- what the tick says -------------------------------------------------------------
    def draw(self, tick: Tick) -> None:
        sel = tick.selection
        pair = sel.current_pair(tick.runs)
        cursor = sel.cursor
        self.target = tuple(pair) if pair else ((cursor,) if cursor is not None else ())
        sizes = [_eval_size(tick.runs.get(r)) for r in self.target]
        self.digits = None if not sizes or None in sizes else min(sizes)
        found = activations.newest(tick.snap.checks.get(self.target[0], []), self.target) \
            if self.target else None
        busy = self.activating.now()
        key = (self.target, repr(found)[:2000], busy and (busy[0], int(busy[1])))
        if key == self._key:
            return
        self._key = key
        status: list[str] = []
        if busy:
            runs = " and ".join(str(r) for r in busy[0])
            status.append(f"Computing what run{'s' if len(busy[0]) > 1 else ''} {runs} "
                          f"see{'' if len(busy[0]) > 1 else 's'} ({int(busy[1])} s so far: "
                          "a background command restores the checkpoint and runs the digit "
                          "through it) ...")
        if not self.target:
            status.append("No run selected.")
        elif found is None and not busy:
            who = " and ".join(f"run {r}" for r in self.target)
            status.append(f"Nothing shown yet for {who}.")
        if not busy:
            status.append(HINT if found is None else KEYS)
        self._status = "\n".join(status)
        self.query_one("#model-status", Static).update(Text(shown_lines(self._status)))
        self.shown = found
        self._build()

    def on_resize(self) -> None:
        self._build()

    # --- the pictures, built in a thread ------------------------------------------------
    def _width(self) -> int:
        return max(20, self.size.width - 2)

    def _zoom(self) -> float:
        return ZOOMS[ZOOM if self.zoom is None else self.zoom]

    def _build(self) -> None:
        meta = self.shown
        picture = self.query_one("#model-picture", Static)
        if meta is None:
            self._built_key = None
            picture.update("")
            self.query_one("#model-layers", Static).update("")
            return
        width = self._width()
        key = (repr(meta)[:4000], width, self._zoom(), self.one_layer)
        if key == self._built_key:
            return
        self._built_key = key
        session = getattr(self.app, "session_dir", None)
        zoom, layer = self._zoom(), self.one_layer

        def build() -> None:
            try:
                arrays = activations.load(session, meta)
                drawn: Any = compose(meta, arrays, width, zoom, layer)
            except (ValueError, TypeError, KeyError, IndexError) as e:
                drawn = Text(shown(str(e), 300), style="red")
            self.app.call_from_thread(self._show, key, drawn)

        self.run_worker(build, thread=True, exclusive=True, group="model-build")

    def _show(self, key: Any, drawn: Any) -> None:
        if key != self._built_key:
            return
        head, layers = drawn if isinstance(drawn, tuple) else (drawn, "")
        self.query_one("#model-picture", Static).update(head)
        self.query_one("#model-layers", Static).update(layers)
        if self._reveal:        # + - v change the maps, often below the view: shown
            self._reveal = False
            self.call_after_refresh(self.scroll_to_widget, self.query_one("#model-layers"),
                                    animate=False, top=True)

    # --- keys (bound by the app while this tab shows) -----------------------------------
    def action_model(self, what: str) -> None:
        """Show, a digit (by index, at random, the worst), the checkpoint before or after,
        the maps' size, one layer or all."""
        if what == "show":
            self.ask()
        elif what == "digit":
            self.ask_digit()
        elif what in ("random", "worst"):
            self.ask_how(what)
        elif what in ("earlier", "later"):
            runs = self.target
            if not runs or not self.app.writable("no other checkpoint shown"):
                return

            def kept(store: Any, _: Any) -> list[int]:
                steps = [{c["step"] for c in store.usable_checkpoints(r)} for r in runs]
                return sorted(set.intersection(*steps))

            self.app.write(kept, lambda steps: self.ask_step(steps, what == "later"),
                           failed="the kept checkpoints could not be read")
        elif what in ("bigger", "smaller"):
            self.resize_maps(what == "bigger")
        elif what == "layer":
            self.next_layer()

    def _compute(self, runs: tuple[int, ...], choice: Choice) -> None:
        """What `runs` see, as `choice` says: `tui-trainer activations` in the background;
        its answer lands in the session and this tab shows it."""
        app = self.app
        if not app.writable("not shown"):
            return
        if self.activating.job is not None:
            app.notify("already computing what run(s) "
                       f"{', '.join(map(str, self.activating.job.runs))} see",
                       severity="warning")
            return
        args = choice.args()
        self.activating.start(runs, lambda sup: sup.activations(runs, args), "not shown")
        app.draw_tab()

    def settle(self, snap: Snapshot) -> None:
        """After each tick: an answer that landed lets the job go; a command that ended
        without one is said to have failed, with its first refusal line (a digit out of
        range, a run with no checkpoint) from its log."""
        def failed(job: Job) -> None:
            name = f"logs/activations-{'-'.join(map(str, job.runs))}.log"
            self.app.notify(f"what run(s) {', '.join(map(str, job.runs))} see was not "
                            f"computed: {job_said(self.app.session_dir / name)} (its "
                            f"output: {name})", severity="error", timeout=12)

        self.activating.settle(
            lambda job: activations.newest(snap.checks.get(job.runs[0], []), job.runs,
                                           since=job.wall), None, failed)

    def current(self) -> Choice:
        m = self.shown
        if m is None:
            return Choice()
        return Choice("index", m["digit"], m["steps"][0] if len(set(m["steps"])) == 1 else None)

    def ask(self, choice: Choice | None = None) -> None:
        if not self.target:
            self.notify("no run selected", severity="warning")
            return
        self._compute(self.target, choice or self.current())

    def ask_digit(self) -> None:
        if not self.target:
            self.notify("no run selected", severity="warning")
            return

        n = self.digits
        allowed = f"0 to {n - 1:,}" if n else "0, 1, ..."

        def chosen(text: str | None) -> None:
            if text is None:
                return
            try:
                index = int(text.replace(",", "").replace("_", ""))
                if index < 0 or (n is not None and index >= n):
                    raise ValueError
            except ValueError:      # refused here: the range is known, nothing is started
                self.notify(f"digit: give an index {allowed} into the evaluation set"
                            + (f" ({n:,} digits)" if n else "") + f", not "
                            f"{shown(text, 20)!r}", severity="error")
                return
            self.ask(Choice("index", index, self.current().step))

        self.app.push_screen(NameScreen(f"Which digit of the evaluation set? Its index, "
                                        f"{allowed}.", str(self.current().index or 0)), chosen)

    def ask_how(self, how: str) -> None:
        self.ask(Choice(how, None, self.current().step))

    def ask_step(self, steps: list[int], later: bool) -> None:
        """[ or ]: the kept checkpoint before or after the one shown (steps: those every
        run of the target keeps)."""
        now = self.shown["steps"][0] if self.shown else None
        if not steps:
            self.notify("no checkpoint kept by " + " and ".join(
                f"run {r}" for r in self.target), severity="warning")
            return
        if now is None:
            pick = steps[-1]
        else:
            after = [s for s in steps if s > now] if later else [s for s in steps if s < now]
            if not after:
                self.notify(f"no kept checkpoint {'after' if later else 'before'} step {now} "
                            f"(kept: {', '.join(map(str, steps[-12:]))})", severity="warning")
                return
            pick = after[0] if later else after[-1]
        self.ask(Choice("index", self.current().index or 0, pick))

    def resize_maps(self, bigger: bool) -> None:
        i = ZOOM if self.zoom is None else self.zoom
        self.zoom = max(0, min(len(ZOOMS) - 1, i + (1 if bigger else -1)))
        if self.zoom == i:
            self.notify(f"the maps are at their {'largest' if bigger else 'smallest'} size",
                        severity="warning")
        self._reveal = self.shown is not None
        self._build()

    def next_layer(self) -> None:
        n = len(self.shown["layers"]) if self.shown else 0
        self.one_layer = None if not n or self.one_layer == n - 1 else \
            (0 if self.one_layer is None else self.one_layer + 1)
        self._reveal = self.shown is not None
        self._build()


def _eval_size(run: Any) -> int | None:
    """How many digits a run's evaluation set holds, as its settings recorded it (None for
    a run that has not started, or settings that do not say: untrusted)."""
    data = (getattr(run, "settings", None) or {}).get("data") if run is not None else None
    size = data.get("eval_size") if isinstance(data, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


# --- what is drawn (a thread; nothing here touches the screen) ---------------------------

def tiles(shape: list[int], views: int, width: int, zoom: float
          ) -> tuple[int, int, int, bool]:
    """How a layer's maps are laid out: each map's width and height in pixels (a cell is
    one pixel wide and two high, so a map looks square), the maps a row, and whether the
    views (each run's, their difference) sit side by side (from WIDE cells) or one under
    the other. The size that fits: side by side, a near-square grid of maps in each
    view's share of the width; one under the other, maps at half their pixels (at least 8)
    as many to a row as the width takes. `zoom` scales it (+ and -)."""
    c, h, w = shape
    side = width >= WIDE
    room = (width - 3 * (views - 1)) // views if side else width
    if side:
        fit = (room + 1) // math.ceil(math.sqrt(c)) - 1
    else:
        fit = max(8, round(w / 2))
    tw = max(4, min(room, round(max(4, min(fit, 2 * w)) * zoom)))
    th = 2 * max(2, round(tw * h / w / 2))        # whole cells: the gaps fall between them
    return tw, th, max(1, (room + 1) // (tw + 1)), side


def compose(meta: dict[str, Any], arrays: dict[str, Any], width: int, zoom: float,
            layer: int | None) -> tuple[Group, Group]:
    """The words and the digit beside the probabilities; then each convolution (or one):
    its line of scale and the views of it (each run's maps, their difference), side by
    side where the width allows."""
    import numpy as np
    from ..widgets.pictures import image_picture, legend, picture, probability_table, \
        resized
    words = activations.lines(meta)
    head = [Text(shown(line, None)) for line in
            words[:1 + len(meta["runs"]) + (meta.get("same_start") is False)]]
    top = Table.grid(padding=(0, 2))
    top.add_row(image_picture(arrays["input"]), probability_table(meta))
    parts: list[Any] = []
    layers = meta["layers"] if layer is None else meta["layers"][layer:layer + 1]
    for L in layers:
        views = activations.views(meta, arrays, L["name"])
        tw, th, cols, side = tiles(L["shape"], len(views), width, zoom)
        cells = []
        for title, maps, cmap, lo, hi in views:
            small = np.stack([resized(m, tw, th) for m in maps])
            cells.append(Group(Text(shown(title, 60), style="bold"),
                               picture(activations.mosaic(small, cols, 1, 2), cmap, lo, hi),
                               legend(cmap, lo, hi)))
        parts += [Text(""), Text(shown(activations.layer_line(meta, L), None), style="bold")]
        if side:
            grid = Table.grid(padding=(0, 3))
            grid.add_row(*cells)
            parts.append(grid)
        else:
            parts += cells
    if layer is not None and meta["layers"]:
        parts.append(Text(f"(layer {layer + 1} of {len(meta['layers'])}: v for the next, "
                          "or all)", style="dim"))
    return Group(*head, Text(""), top), Group(*parts)

