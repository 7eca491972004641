"""Modal screens: help, an explanation's evidence, quit with runs training, open a session,
name prompts."""

from __future__ import annotations

import time
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from rich.console import Group
from rich.table import Table
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, OptionList, Static
from textual.widgets.option_list import Option

from ..core.session.paths import sessions_dir
from ..core.errors import SessionError
from ..core.session.schema import DB_NAME
from ..core.session.store import SessionStore
from ..core.text import shown
from .widgets.inputs import Input

# The help, as data: drawn once into one widget (a Markdown document of widgets cost the
# dashboard a third of a second on every F1).
HELP_INTRO = ("Configure a run in the form (on the left; under 120x30 a drawer over the whole "
              "width; F9 shows or hides it), start it (F2), and watch it in the run table and "
              "the tabs. Every run trains in a process of its own and writes into the "
              "session; quitting never loses anything. Press escape (or F1) to close this "
              "help; ctrl+p finds every action by name.")
HELP_KEYS = (
    ("F2", "start a run with the form's config"),
    ("F3", "stop the run under the cursor (it finishes its step and writes a checkpoint)"),
    ("F4", "continue the run under the cursor from its newest good checkpoint: a dialog "
           "asks how far (epochs and max_steps, the run's own to start with; the form is not "
           "read); with no checkpoint, it offers to train the run again from step 0"),
    ("F5", "repeat: start a twin with the same config, paired with it for divergence"),
    ("F6", "compare the pair: two marked runs, or a run and its twin"),
    ("F7", "determinism verdict: train a twin of the run under the cursor and say whether the "
           "two are bit-identical, and if not, from which step and why"),
    ("F8", "resume check: kill a twin of the run at a step you choose, resume it from its "
           "checkpoint, and compare it with the run"),
    ("F9", "show or hide the form (on a small terminal, a drawer over the whole width)"),
    ("ctrl+t", "the next tab: Plots, Divergence, Compare, A/B, Profile, Model, Log (the palette "
               "names each)"),
    ("ctrl+e", "export PNG figures and CSVs (every point) of the marked runs, the pair, or "
               "the A/B study shown, into the session's exports/"),
    ("ctrl+s", "save the session as a new one"),
    ("ctrl+o", "open another session"),
    ("ctrl+p", "command palette: every action by name"),
    ("F1", "this help"),
    ("ctrl+q", "quit (asks what to do with runs still training)"),
    ("run table", "space marks a run (plots, the pair; unmarked, it leaves the pair), u "
                  "clears every mark and the pair, / filters, s sorts (S reverses), "
                  "c config columns, a every column (a narrow table shows the most important "
                  "ones; ←/→ scroll), h hides (H shows hidden), r renames, n notes, t tags, "
                  "delete deletes, T on a crowded run puts the thread count that fits the "
                  "free cores into the form"),
    ("knob search", "typing filters the form's knobs; enter or ↓ goes to the first match, "
                    "escape clears"),
    ("plots", "m smoothing, x the x axis, l log scale, w all steps or the last ones, 1-8 one "
              "panel alone"),
    ("memory", "b (Plots tab): where the memory of the run under the cursor goes: one step of "
               "a copy of it by category (parameters, gradients, optimizer state, activations, "
               "temporaries) and module"),
    ("divergence", "x explains where the pair parts and why (the exact step, the first input "
                   "or op that differs, the setting it follows; it replays both runs from "
                   "their checkpoints), e shows what the answer rests on"),
    ("profile", "p (Profile tab): where the step time of the run under the cursor (or of both "
                "runs of the pair) goes: a copy trained under torch.profiler, by operator, "
                "phase and module, with a Chrome/Perfetto trace; a pair is diffed by operator"),
    ("model", "Model tab: g shows what the net of the run under the cursor (or both runs of "
              "the pair) sees in a digit at its newest checkpoint; d a digit by index, D a "
              "random one, w the one the run gets most confidently wrong, [ ] the checkpoint "
              "before or after, + - the maps' size, v one layer or all"),
)
HELP_PANELS = (
    ("Plots", "loss (raw and smoothed), throughput, memory (the process's resident memory; "
              "GPU memory on CUDA), time waiting for data against time computing, evaluation "
              "accuracy, learning rate, for the marked runs (or the run under the cursor)."),
    ("Divergence", "for the pair, |Δloss| per step, the distance between their parameters "
                   "(estimated from a 256-number sketch of all parameters), whether the "
                   "parameter hashes are still identical and the first step where they "
                   "differ; below, where they part and why (x, and after F7/F8)."),
    ("Compare", "the configs' differences (effective settings that can break bit-equality "
                "are marked ⚠), the loss curves overlaid, and a summary with the ratio of B "
                "to A."),
    ("A/B", "the price of each knob: the form's config is the base, each KEY=V1,V2 in the "
            "vary field adds one variant per value (or pick a ready study); every arm trains "
            "once per round and the table gives samples/s, data wait, peak memory, loss and "
            "accuracy as ratios to the base (with an interval and a verdict from 6 rounds "
            "on), and whether each variant is bit-identical to the base (enter on a row pairs "
            "it with the base)."),
    ("Profile", "the newest profile of the run under the cursor, or the pair's operators "
                "whose self time changed most (p profiles)."),
    ("Model", "what the net sees in one digit: the digit, every channel of each "
              "convolution's output and the ten class probabilities, at a kept checkpoint; "
              "for the pair side by side on one colour scale a layer, with their difference "
              "(g computes it in the background; `tui-trainer activations` gives the PNG)."),
    ("Log", "what the run's process printed, tracebacks included."),
)
HELP_STATUSES = ("created, starting, running, finished, stopped (F3: it wrote a checkpoint), "
                 "crashed (its process failed or died: the reason is in the notification, the "
                 "Log tab and `tui-trainer runs`), diverged (the loss or the parameters became "
                 "NaN/inf: every row is kept and the newest checkpoint is the last finite one), "
                 "copied (training in another session when this one was copied from it: this "
                 "copy keeps it as it was). A read-only session opens for viewing and export "
                 "only. The why column also says when a CPU run's torch threads outnumber the "
                 "cores the rest of the machine leaves it (each step then waits on a starved "
                 "thread): while it trains, and over its whole run once it ends.")
_HELP: Group | None = None


def help_renderable() -> Group:
    """The help as one renderable, built once."""
    global _HELP
    if _HELP is None:
        tables = []
        for rows in (HELP_KEYS, HELP_PANELS):
            table = Table(box=None, show_header=False, expand=True, padding=(0, 1))
            table.add_column(style="bold", no_wrap=True)
            table.add_column(ratio=1)
            for key, what in rows:
                table.add_row(key, what)
            tables.append(table)
        _HELP = Group(Text("tui-trainer", style="bold"), Text(HELP_INTRO), Text(""),
                      Text("Keys", style="bold underline"), tables[0], Text(""),
                      Text("Panels", style="bold underline"), tables[1], Text(""),
                      Text("Statuses", style="bold underline"), Text(HELP_STATUSES))
    return _HELP


class HelpScreen(ModalScreen[None]):
    """Installed once (TrainerApp.SCREENS): every F1 shows the same screen again."""

    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box", classes="dialog"):
            with VerticalScroll(id="help-text"):
                yield Static(help_renderable())
            yield Button("Close", id="help-close", variant="primary", compact=True)

    @on(Button.Pressed, "#help-close")
    def _close(self) -> None:
        self.dismiss(None)


class TextScreen(ModalScreen[bool]):
    """Lines of text from data (shown as text) under a title, in a dialog; with `again`, a
    second button (and its key) that closes it answering True."""

    def __init__(self, title: str, lines: list[str], name: str,
                 again: str | None = None) -> None:
        super().__init__()
        self.title_text, self.lines, self.box, self.again = title, lines, name, again

    def compose(self) -> ComposeResult:
        with Vertical(id=f"{self.box}-box", classes="dialog"):
            yield Static(Text(shown(self.title_text, 200), style="bold"))
            with VerticalScroll(id=f"{self.box}-text"):
                yield Static(Text("\n".join(shown(line, 400) for line in self.lines)))
            with Horizontal(classes="buttons"):
                yield Button("Close", id="text-close", variant="primary", compact=True)
                if self.again:
                    yield Button(self.again, id="text-again", compact=True)

    @on(Button.Pressed, "#text-close")
    def _close(self) -> None:
        self.dismiss(False)

    @on(Button.Pressed, "#text-again")
    def _again(self) -> None:
        self.dismiss(True)


class EvidenceScreen(TextScreen):
    """What an explanation rests on (the Divergence tab's e): one fact a line."""

    BINDINGS = [Binding("escape,e,q", "dismiss(False)", "Close")]

    def __init__(self, title: str, lines: list[str]) -> None:
        super().__init__(title, lines, "evidence")


class MemoryScreen(TextScreen):
    """A run's memory breakdown (the Plots tab's b): the step's timeline as a stacked
    chart by category (when the breakdown has one), the peak by category and module; m
    measures it again."""

    BINDINGS = [Binding("escape,b,q", "dismiss(False)", "Close"),
                Binding("m", "dismiss(True)", "Measure again")]

    def __init__(self, title: str, result: dict, resident_mib: float | None = None) -> None:
        from ..core.analysis import memory
        super().__init__(title, memory.lines(result, resident_mib), "memory",
                         again="Measure again (m)")
        self.timeline = memory.timeline(result)

    def on_mount(self) -> None:
        if self.timeline is not None:
            self.call_after_refresh(self._chart)    # once the dialog has its width

    def _chart(self) -> None:
        from .widgets.pictures import stacked
        box = self.query_one("#memory-text")
        width = max(30, box.scrollable_content_region.width - 4)
        height = max(4, min(12, self.app.size.height // 4))
        box.mount(Static(stacked(self.timeline, width, height), id="memory-timeline"),
                  before=0)


class QuitScreen(ModalScreen[str]):
    """Runs are training: stop them, leave them training, or do not quit."""

    BINDINGS = [Binding("escape", "dismiss('cancel')", "Cancel")]

    def __init__(self, live: list[int]) -> None:
        super().__init__()
        self.live = live

    def compose(self) -> ComposeResult:
        runs = ", ".join(str(r) for r in self.live)
        with Vertical(classes="dialog", id="quit-box"):
            yield Label(f"{len(self.live)} run(s) still training ({runs}).")
            yield Label("Stop them (each writes a checkpoint), or leave them training? "
                        "Reopening the session reattaches to runs that are still going.")
            with Horizontal(classes="buttons"):
                yield Button("Stop them and quit", id="quit-stop", variant="error")
                yield Button("Leave training and quit", id="quit-leave", variant="primary")
                yield Button("Cancel", id="quit-cancel")

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss({"quit-stop": "stop", "quit-leave": "leave"}.get(event.button.id or "",
                                                                      "cancel"))


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question about something that cannot be undone."""

    BINDINGS = [Binding("escape", "dismiss(False)", "Cancel")]

    def __init__(self, question: str, yes: str) -> None:
        super().__init__()
        self.question, self.yes = question, yes

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="confirm-box"):
            yield Label(Text(self.question))
            with Horizontal(classes="buttons"):
                yield Button(self.yes, id="confirm-yes", variant="warning")
                yield Button("Cancel", id="confirm-no")

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")


class NameScreen(ModalScreen[str | None]):
    """Asks for a name (a new session, a preset)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, prompt: str, value: str = "") -> None:
        super().__init__()
        self.prompt, self.value = prompt, value

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="name-box"):
            yield Label(self.prompt)
            yield Input(value=self.value, id="name-input")
            with Horizontal(classes="buttons"):
                yield Button("OK", id="name-ok", variant="primary")
                yield Button("Cancel", id="name-cancel")

    @on(Input.Submitted)
    @on(Button.Pressed, "#name-ok")
    def _ok(self) -> None:
        name = self.query_one("#name-input", Input).value.strip()
        if name:
            self.dismiss(name)

    @on(Button.Pressed, "#name-cancel")
    def _cancel(self) -> None:
        self.dismiss(None)


class ContinueScreen(ModalScreen[dict | None]):
    """Continue a run: how far (its own epochs and max_steps to start with)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, run_id: int, step: int, epochs: int, max_steps: int) -> None:
        super().__init__()
        self.run_id, self.step, self.epochs, self.max_steps = run_id, step, epochs, max_steps

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="continue-box"):
            yield Label(Text(f"Continue run {self.run_id} from its newest checkpoint (it is "
                             f"at step {self.step}). Train until:"))
            with Horizontal(classes="dialog-field"):
                yield Label("epochs", classes="dialog-field-name")
                yield Input(str(self.epochs), id="continue-epochs", type="integer")
            with Horizontal(classes="dialog-field"):
                yield Label("max_steps (0: none)", classes="dialog-field-name")
                yield Input(str(self.max_steps), id="continue-max-steps", type="integer")
            yield Label("", id="continue-error")
            with Horizontal(classes="buttons"):
                yield Button("Continue", id="continue-ok", variant="primary")
                yield Button("Cancel", id="continue-cancel")

    @on(Input.Submitted)
    @on(Button.Pressed, "#continue-ok")
    def _ok(self) -> None:
        try:
            epochs = int(self.query_one("#continue-epochs", Input).value)
            max_steps = int(self.query_one("#continue-max-steps", Input).value or 0)
            if epochs < 1 or max_steps < 0:
                raise ValueError
        except ValueError:
            self.query_one("#continue-error", Label).update(
                "epochs must be a whole number >= 1, max_steps >= 0")
            return
        self.dismiss({"epochs": epochs, "max_steps": max_steps})

    @on(Button.Pressed, "#continue-cancel")
    def _cancel(self) -> None:
        self.dismiss(None)


def list_sessions(extra: Path | None = None
                  ) -> list[tuple[Path, int | None, float | None, str | None]]:
    """(directory, run count, last use, problem) for every session under the sessions
    directory; read only. A damaged session is listed with what is wrong with it."""
    dirs = {p.parent for p in sessions_dir().glob(f"*/{DB_NAME}")}
    if extra is not None:
        dirs.add(extra)
    out: list[tuple[Path, int | None, float | None, str | None]] = []
    for d in sorted(dirs):
        try:
            with SessionStore(d, create=False, readonly=True) as s:
                last = s.meta("last_used")
                out.append((d, len(s.runs()), float(last) if last else None, None))
        except (SessionError, ValueError) as e:
            out.append((d, None, None, str(e)))
    return out


class OpenScreen(ModalScreen[Path | None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, current: Path) -> None:
        super().__init__()
        self.current = current
        self.sessions: list[tuple[Path, int | None, float | None, str | None]] = []

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="open-box"):
            yield Label("Open a session (enter to open, escape to cancel)")
            yield OptionList(id="open-list")
            yield Label(Text(f"in {shown(sessions_dir(), 100)}; or any folder by its path "
                             "(a new folder becomes a new session):"))
            yield Input(placeholder="/path/to/session", id="open-path")
            with Grid(classes="buttons"):
                yield Button("Cancel", id="open-cancel")

    def on_mount(self) -> None:
        self._list()

    @work(thread=True, group="open-list")
    def _list(self) -> None:
        """Each session's database is opened to count its runs: in a worker, not on the UI
        thread."""
        sessions = list_sessions(self.current)
        self.app.call_from_thread(self._fill, sessions)

    def _fill(self, sessions: list[tuple[Path, int | None, float | None, str | None]]) -> None:
        self.sessions = sessions
        options = []
        for d, n, last, problem in sessions:
            name = shown(d.name, 24)
            if problem is not None:
                options.append(Option(Text(f"{name:<24} damaged: {shown(problem, 90)}"),
                                      id=str(d), disabled=True))
                continue
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(last)) if last else "-"
            here = "  (open now)" if d == self.current else ""
            options.append(Option(Text(f"{name:<24} {n:>3} runs   last used {when}{here}"
                                       f"   {shown(d, 60)}"), id=str(d)))
        self.query_one("#open-list", OptionList).add_options(options)

    @on(Input.Submitted, "#open-path")
    def _path(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if text:
            self.dismiss(Path(text).expanduser().resolve())

    @on(OptionList.OptionSelected)
    def _selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(Path(event.option.id or ""))

    @on(Button.Pressed, "#open-cancel")
    def _cancel(self) -> None:
        self.dismiss(None)
