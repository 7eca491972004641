"""The dashboard: the layout, the keys, the app's state, and two threads that do the work.

- One polling thread (`_poll_loop`) reads the session with its own read-only connection
  (core.reader: only what changed), computes what the visible tab draws, and posts one
  replaceable `Polled` message per tick. The UI thread never runs SQLite.
- Everything that writes (start, stop, continue, delete, rename, the saved screen state,
  reconciling statuses) runs in worker threads through `Writer`, one at a time.
- The panels (ui/panels/) draw what a snapshot holds and post typed messages for what the
  user asks; this class wires them together.

State the user sees (marked runs, the pair, the run under the cursor, the study and tab shown,
the form) is reactive, and saved into the session whenever it changes.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from textual import events, on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.reactive import var
from textual.screen import Screen
from textual.widgets import Button, Footer, Header, TabbedContent, TabPane
from textual.worker import get_current_worker

from ..core import config as C
from ..core import machine
from ..core import presets
from ..core import study as ab
from ..core.errors import ReadOnlySession
from ..core.paths import default_session_dir, sessions_dir
from ..core.plotdata import PlotOptions, plot_lines
from ..core.reader import ENDED, SessionReader, Snapshot
from ..core.store import SessionError, SessionStore
from ..core.supervisor import Supervisor, WarmLauncher
from ..core.text import name_problem, shown, shown_lines
from . import heap
from .panels.ab import ABPanel
from .panels.common import COLOURS, label
from .panels.compare import ComparePanel
from .panels.divergence import DivergencePanel
from .panels.launch import LaunchPanel
from .panels.log import LogPanel, LogTail
from .panels.plots import PlotsPanel
from .panels.runs import RunTable
from .screens import (ConfirmScreen, ContinueScreen, HelpScreen, NameScreen, OpenScreen,
                      QuitScreen)

LAZY_TABS: dict[str, Callable[[], Any]] = {
    "tab-divergence": lambda: DivergencePanel(id="divergence-panel"),
    "tab-compare": lambda: ComparePanel(id="compare-panel"),
    "tab-ab": lambda: ABPanel(id="ab-panel"),
    "tab-log": lambda: LogPanel(id="log"),
}
LAZY_PANELS = (DivergencePanel, ComparePanel, ABPanel, LogPanel)
TABS = (("tab-plots", "Plots"), ("tab-divergence", "Divergence"), ("tab-compare", "Compare"),
        ("tab-ab", "A/B"), ("tab-log", "Log"))
W = TypeVar("W")
STATE_SAVE_S = 0.5      # the screen state is written at most twice a second
INPUT_QUIET_S = 0.4     # charts are built this long after the last key, not while keys come
POLL_S = 0.5            # the session is read, and the visible tab redrawn, twice a second
SEVERITY = {"finished": "information", "stopped": "information", "copied": "information",
            "crashed": "error", "diverged": "warning"}


@dataclass(frozen=True)
class Request:
    """What the polling thread reads for the screen, set by the UI thread."""
    watched: tuple[int, ...] = ()
    plotted: tuple[int, ...] = ()
    tab: str = "tab-plots"
    study: int | None = None
    checks_for: tuple[int, ...] = ()
    log_run: int | None = None
    options: PlotOptions = field(default_factory=PlotOptions)


class Polled(Message):
    """One tick's snapshot; a newer one replaces it if the app has not handled it yet."""

    def __init__(self, snap: Snapshot, lines: dict | None, seq: int) -> None:
        self.snap, self.lines, self.seq = snap, lines, seq
        super().__init__()

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, Polled)


class LogLines(Message):
    def __init__(self, run_id: int | None, reset: bool, lines: list[str]) -> None:
        self.run_id, self.reset, self.lines = run_id, reset, lines
        super().__init__()


class StableFooter(Footer):
    """Textual's footer, composed again only when the keys it shows change. It rebuilds its
    keys whenever a screen's bindings are announced, also when a dialog closes and the
    dashboard's keys are the same as before: a dozen widgets mounted and styled on every
    escape (tens of milliseconds, more while runs train)."""

    _shown: tuple = ()

    def bindings_changed(self, screen: Screen) -> None:
        if screen is self.screen and self._bindings_ready:
            shown = tuple((b.key, b.description, enabled)
                          for _, b, enabled, _ in screen.active_bindings.values() if b.show)
            if shown == self._shown:
                return
            self._shown = shown
        super().bindings_changed(screen)


class Writer:
    """The session's one writable connection and the supervisor, used from worker threads,
    one call at a time. None of it runs on the UI thread."""

    def __init__(self, directory: Path, warm: WarmLauncher | None = None):
        store = None
        try:
            store = SessionStore(directory)
            store.touch()
            self.readonly = False
        except ReadOnlySession:
            if store is not None:
                store.close()
            # Viewing needs no writes: a session on a read-only disk opens for looking.
            store = SessionStore(directory, create=False, readonly=True)
            self.readonly = True
        self.store = store
        self.supervisor = Supervisor(store, warm)
        self.lock = threading.Lock()

    def __call__(self, fn: Callable[[SessionStore, Supervisor], Any]) -> Any:
        with self.lock:
            return fn(self.store, self.supervisor)

    def close(self) -> None:
        with self.lock:
            self.store.close()


class TrainerApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "tui-trainer"
    SCREENS = {"help": HelpScreen}      # made once, shown again on every F1

    # The footer shows these in this order and cuts what does not fit: the way to the rest
    # (F1 help, F9 the form, and the palette on the right) comes first.
    BINDINGS = [
        Binding("f1", "help", "Help"),
        Binding("f9", "toggle_form", "Form"),
        Binding("f2", "start", "Start"),
        Binding("f3", "stop", "Stop"),
        Binding("f4", "continue_run", "Continue"),
        Binding("f5", "repeat", "Repeat"),
        Binding("f6", "compare", "Compare"),
        Binding("f7", "verdict", "Verdict"),
        Binding("f8", "resume_check", "Resume check"),
        Binding("ctrl+e", "export", "Export"),
        Binding("ctrl+s", "save_as", "Save as"),
        Binding("ctrl+o", "open_session", "Open"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
        # The next tab from anywhere (no text box uses ctrl+t; alt+digits do not arrive as
        # such from every terminal); the palette names each tab too.
        Binding("ctrl+t", "next_tab", "Next tab", show=False),
    ]

    marked: var[list[int]] = var(list)
    pair: var[list[int]] = var(list)
    cursor_run: var[int | None] = var(None)
    study_shown: var[int | None] = var(None)
    tab: var[str] = var("tab-plots")

    def get_driver_class(self) -> type:
        """Textual's driver for this terminal; on Linux and macOS the one that decides a lone
        Escape within ESCDELAY (ui/driver.py)."""
        chosen = super().get_driver_class()
        from textual.drivers.linux_driver import LinuxDriver
        if chosen is LinuxDriver:
            from .driver import Driver
            return Driver
        return chosen

    def __init__(self, session_dir: Path | None = None, poll: bool = True) -> None:
        super().__init__()
        self.session_dir = Path(session_dir or default_session_dir()).expanduser().resolve()
        self.poll_enabled = poll
        # Runs are forked from a process that has imported torch already (started after the
        # first screen): a run's first step comes within a second of Start.
        self.warm = None if os.environ.get(WarmLauncher.ENV) == "0" else WarmLauncher()
        self.writer = Writer(self.session_dir, self.warm)  # SessionError for a damaged one
        self.session_dir = self.writer.store.dir
        self.runs: dict[int, Any] = {}
        self.snapshot: Snapshot | None = None
        self._statuses: dict[int, str] = {}
        self._await_twin: int | None = None
        self._wake = threading.Event()
        self._seq = 0
        self._applied = 0
        self._restoring = True
        self._saved_state: str | None = None
        self._state_text: str | None = None
        self._panels: dict[type, Any] = {}
        self._save_pending = False
        self._form_values: dict[str, Any] | None = None
        self._req = Request()
        self._invalidate = False        # the next tick re-reads the runs table
        self._lines: dict | None = None  # the plot lines drawn last
        self.last_input = 0.0           # monotonic time of the last key or mouse press
        self._log_again = False         # the Log tab missed lines: tail its log from the start
        self._set_title()

    @property
    def store(self) -> SessionStore:
        return self.writer.store

    def _set_title(self) -> None:
        self.sub_title = shown(self.session_dir, 120) + (" (read-only)" if
                                                          self.writer.readonly else "")

    # --- layout ----------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            yield LaunchPanel(id="left")
            with Vertical(id="right"):
                yield RunTable(id="runs")
                with Horizontal(id="run-actions"):
                    yield Button("Stop (F3)", id="stop", variant="warning", compact=True)
                    yield Button("Continue (F4)", id="continue", compact=True)
                    yield Button("Repeat (F5)", id="repeat", compact=True)
                    yield Button("Compare (F6)", id="compare", compact=True)
                with TabbedContent(id="tabs"):
                    with TabPane("Plots", id="tab-plots"):
                        yield PlotsPanel(id="plots-panel")
                    # The other tabs' panels are mounted when first shown (_show_tab).
                    for tab, title in TABS[1:]:
                        yield TabPane(title, id=tab)
        yield StableFooter(compact=True)

    def on_mount(self) -> None:
        # The first tick and the saved state are read at once, in two threads; the state,
        # once applied, tells the poller what else to read.
        self._start_poller()
        self._load_state()

    async def on_event(self, event: Any) -> None:
        if isinstance(event, (events.Key, events.MouseDown, events.MouseScrollDown,
                              events.MouseScrollUp)):
            self.last_input = time.monotonic()   # background drawing waits (input_quiet)
        await super().on_event(event)

    def input_quiet(self, seconds: float = INPUT_QUIET_S) -> float:
        """How much longer background work should wait for the user: the screen answers a
        key first, the charts (pure Python, sharing the GIL) are built after."""
        return max(0.0, self.last_input + seconds - time.monotonic())

    def wait_for_quiet(self, limit: float) -> None:
        """In a worker thread: waits while keys come (input_quiet), `limit` seconds at most,
        so that Python work sharing the GIL with the UI thread comes after the key's answer."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and (quiet := self.input_quiet()) > 0:
            time.sleep(min(quiet, 0.05))

    def on_resize(self) -> None:
        # A small terminal gets the form as a drawer (F9) and the plots one at a time.
        small = self.size.width < 120 or self.size.height < 30
        self.set_class(small, "-small")
        self.set_class(self.size.width >= 240 and self.size.height >= 60, "-wide")

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for title, help_text, action in (
                ("Start run", "Start a run with the form's config", self.action_start),
                ("Stop run", "Stop the run under the cursor, with a checkpoint",
                 self.action_stop),
                ("Continue run", "Continue the run under the cursor from its checkpoint",
                 self.action_continue_run),
                ("Repeat run", "Start a twin of the run under the cursor",
                 self.action_repeat),
                ("Compare pair", "Compare the marked runs side by side", self.action_compare),
                ("Determinism verdict", "Train a twin of the run under the cursor and say "
                 "whether the two are bit-identical", self.action_verdict),
                ("Resume check", "Kill a twin of the run under the cursor at a step, resume "
                 "it, and say whether it matches the run", self.action_resume_check),
                ("New run from this run's config", "Load the config of the run under the "
                 "cursor into the form", self.action_config_from_run),
                ("Export", "PNG figures and CSVs of the runs, the pair or the A/B study shown",
                 self.action_export),
                ("Save session as", "Copy this session under a new name", self.action_save_as),
                ("Open session", "Open another session (any folder)",
                 self.action_open_session),
                ("Show or hide the form", "The form as a drawer (F9)",
                 self.action_toggle_form),
                *((f"{title} tab", f"Show the {title} tab (ctrl+t: the next tab)",
                   lambda tab=tab: self.action_show_tab(tab)) for tab, title in TABS),
                ("Help", "Keys and panels", self.action_help)):
            yield SystemCommand(title, help_text, action)

    # --- state, saved with the session -------------------------------------------------------
    @work(thread=True, group="state")
    def _load_state(self) -> None:
        raw = self.writer(lambda s, _: s.meta("ui_state"))
        runs = self.writer(lambda s, _: {r["id"] for r in s.runs()})
        studies = self.writer(lambda s, _: [x["id"] for x in s.studies()])
        self.call_from_thread(self._apply_state, json.loads(raw) if raw else {}, runs, studies)

    def _apply_state(self, state: dict[str, Any], ids: set[int], studies: list[int]) -> None:
        self.marked = [r for r in state.get("marked", []) if r in ids]
        self.pair = [r for r in state.get("pair", []) if r in ids]
        self.cursor_run = state.get("cursor") if state.get("cursor") in ids else None
        self.study_shown = state.get("study") if state.get("study") in studies else \
            (max(studies) if studies else None)
        if state.get("plots"):
            try:
                self._plots().set_options(PlotOptions(**state["plots"]))
            except TypeError:
                pass
        if state.get("form"):
            try:
                self.query_one(LaunchPanel).set_config(C.from_dict(state["form"]).to_dict())
            except C.ConfigError:
                pass        # a form saved by another version: the defaults
        if state.get("tab"):
            self._tabs().active = state["tab"]
        self._restoring = False
        self._save_state()
        self.refresh_all()

    def _state(self) -> dict[str, Any]:
        opts = self._plots().options
        return {"marked": self.marked, "pair": self.pair, "cursor": self.cursor_run,
                "tab": self._tabs().active,
                "study": self.study_shown, "form": self._form_values,
                "plots": {"x": opts.x, "smoothing": opts.smoothing, "last": opts.last,
                          "log_y": opts.log_y}}

    def _save_state(self) -> None:
        """Called by every watcher of the state: the state goes into the session (in a
        worker), and the polling thread is told what to read."""
        if self._restoring or not self.is_mounted or self.panel(TabbedContent) is None:
            return                      # restoring, or the app is closing
        self._update_request()
        self._state_text = json.dumps(self._state())
        if not self._save_pending and not self.writer.readonly:
            # A burst of changes (a key held down in the run table) is written once.
            self._save_pending = True
            self.set_timer(STATE_SAVE_S, self._flush_state)

    def _flush_state(self, now: bool = False) -> None:
        self._save_pending = False
        text = self._state_text
        if text is None or text == self._saved_state or self.writer.readonly:
            return
        self._saved_state = text
        if now:
            self.writer(lambda s, _: s.set_meta("ui_state", text))
        else:
            self._write(lambda s, _: s.set_meta("ui_state", text))

    def watch_marked(self) -> None:
        self._save_state()

    def watch_pair(self) -> None:
        self._save_state()

    def watch_cursor_run(self) -> None:
        self._save_state()

    def watch_study_shown(self) -> None:
        self._save_state()

    @on(TabbedContent.TabActivated)
    async def _tab(self, event: TabbedContent.TabActivated) -> None:
        self.tab = self._tabs().active
        await self._show_tab(self.tab)
        self._save_state()
        self._draw()
        self.refresh_all()

    @on(PlotsPanel.OptionsChanged)
    def _plot_options(self) -> None:
        self._save_state()
        self.refresh_all()

    @on(LaunchPanel.FormChanged)
    def _form(self, event: LaunchPanel.FormChanged) -> None:
        self._form_values = {k: v for k, v in event.values.items()}
        self._save_state()

    async def _show_tab(self, tab: str) -> None:
        """Mounts a tab's panel the first time the tab is shown (the first screen mounts
        only what it shows)."""
        make = LAZY_TABS.get(tab)
        pane = self.query_one(f"#{tab}", TabPane)
        if make is not None and not pane.children:
            panel = make()
            await pane.mount(panel)
            self._panels[type(panel)] = panel
            if isinstance(panel, ABPanel) and self.snapshot is not None:
                panel.show_studies(self.snapshot.studies, self.study_shown)

    def _plots(self) -> PlotsPanel:
        panel = self.panel(PlotsPanel)
        assert panel is not None
        return panel

    def _tabs(self) -> TabbedContent:
        tabs = self.panel(TabbedContent)
        assert tabs is not None
        return tabs

    def panel(self, cls: type[W]) -> W | None:
        """The panel of that class, or None while its tab has never been shown (kept, not
        queried: a query walks every widget of the screen, the form's included). A tab's
        panel not mounted yet is remembered as None until `_show_tab` mounts it."""
        if cls in self._panels:
            panel = self._panels[cls]
            if panel is None or panel.is_attached:
                return panel
        found = self.query(cls)
        panel = found.first() if found else None
        if panel is not None or cls in LAZY_PANELS:
            self._panels[cls] = panel
        return panel

    # --- the polling thread ----------------------------------------------------------------
    def _update_request(self) -> None:
        pair = self.current_pair()
        plotted = tuple(self.plotted())
        compared = tuple(self.compared())
        watched = set(plotted) | set(pair or ()) | set(compared)
        checks = tuple(sorted(set(pair or ()) | ({self._await_twin} if self._await_twin
                                                  else set())
                              | ({self.cursor_run} if self.cursor_run is not None else set())))
        self._req = Request(watched=tuple(sorted(watched)), plotted=plotted,
                            tab=self._tabs().active,
                            study=self.study_shown, checks_for=checks,
                            log_run=self.cursor_run,
                            options=self._plots().options)

    def _start_poller(self) -> None:
        self._update_request()
        self._poll_loop(self.session_dir)

    def refresh_all(self) -> None:
        """Asks for a tick now (the timer does it every POLL_S anyway)."""
        self._wake.set()

    async def poll_now(self, timeout: float = 30.0) -> None:
        """Waits until a tick that started after this call has been drawn (for tests and
        scripts driving the app)."""
        target = self._seq + 1
        self._wake.set()
        deadline = time.monotonic() + timeout
        while self._applied < target and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            if self._applied < target:
                self._wake.set()

    async def ready(self, machine: bool = False, timeout: float = 60.0) -> None:
        """Waits until the first screen is drawn and the form mounted (and, with machine,
        this machine's facts known): for tests and scripts driving the app."""
        launch = self.query_one(LaunchPanel)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not (
                self.snapshot is not None and launch.form.ready
                and (not machine or launch.form.machine is not None)):
            await asyncio.sleep(0.02)

    @work(thread=True, exclusive=True, group="poll")
    def _poll_loop(self, directory: Path) -> None:
        worker = get_current_worker()
        store = SessionStore(directory, create=False, readonly=True, verify=False)
        reader = SessionReader(store)
        tail = LogTail()
        plot_key: Any = None
        lines: dict | None = None
        try:
            first = True
            while not worker.is_cancelled:
                if not first:
                    woke = self._wake.wait(POLL_S)
                    self._wake.clear()
                    if worker.is_cancelled:
                        break
                    if not woke and not self.poll_enabled:
                        continue
                first = False
                # The session's read and the plot lines wait for a pause in the keys.
                self.wait_for_quiet(0.5)
                self._seq += 1
                seq = self._seq
                req = self._req
                if not self.writer.readonly:
                    # The explicit write that reading leaves out: runs whose process is
                    # gone are stored as crashed, with how their process ended.
                    self.writer(lambda s, sup: (sup.reap(), s.reconcile()))
                if self._invalidate:
                    self._invalidate = False
                    reader.invalidate()
                snap = reader.tick(req.watched, req.study, req.checks_for)
                if req.tab == "tab-plots":
                    groups = ab.sweep_groups(snap.studies)
                    key = (req.plotted, req.options, tuple(groups),
                           tuple(snap.series[r].version for r in req.plotted
                                 if r in snap.series))
                    if key != plot_key:
                        plot_key = key
                        configs = {r.id: r.config for r in snap.runs}
                        lines = plot_lines(snap.series, req.plotted, configs, req.options,
                                           groups)
                else:
                    plot_key = lines = None
                # Every snapshot carries the current lines (the same object while nothing
                # changed): a snapshot that replaces an unhandled one loses nothing.
                self.post_message(Polled(snap, lines, seq))
                if req.tab == "tab-log":
                    if self._log_again:     # the panel missed lines: read it all again
                        self._log_again = False
                        tail.path = None
                    reset, new = tail.read(store.log_path(req.log_run)
                                           if req.log_run is not None else None)
                    if reset or new:
                        self.post_message(LogLines(req.log_run, reset, new))
                else:
                    tail.path = None
        finally:
            store.close()

    def on_polled(self, message: Polled) -> None:
        table = self.panel(RunTable)
        if not self.screen_stack or table is None:
            return                      # the app is closing: nothing to draw on
        if self._restoring:
            return      # drawn once the saved state (cursor, marks) is applied: a tick then
        if self.snapshot is None:       # the first screen is drawn: then the form, and
            self.call_after_refresh(self._mount_form)
            self._probe_machine()       # what this machine can run (a child process)
            if self.warm is not None:
                self.warm.start()       # a Popen: the imports happen in that process
        snap = self.snapshot = message.snap
        self.runs = {r.id: r for r in snap.runs}
        self._announce(snap)
        if self._await_twin is not None:
            twins = [c["data"]["twin"] for c in snap.checks.get(self._await_twin, [])
                     if c["kind"] == "check_twin" and c["data"]]
            if twins:
                self.pair = [self._await_twin, twins[-1]]
                self.marked = [self._await_twin, twins[-1]]
                self._await_twin = None
        if self.cursor_run is not None and self.cursor_run not in self.runs:
            self.cursor_run = None
        starting = frozenset(r for r in self.runs
                             if self.writer.supervisor.starting_cached(r))
        table.show(snap.runs, self.marked, self.cursor_run, starting)
        if self.cursor_run is None and table.row_count:
            self.cursor_run = table.current()
        if (ab_panel := self.panel(ABPanel)) is not None:
            ab_panel.show_studies(snap.studies, self.study_shown)
        if self.study_shown is None and snap.studies:
            self.study_shown = snap.studies[-1]["id"]
        if message.lines is not None and message.lines is not self._lines:
            self._lines = message.lines
            names = ", ".join(label(r, self.runs) for r in self.plotted())
            self._plots().show(message.lines, shown(names, 80) or "no run selected")
        self._draw()
        self._applied = max(self._applied, message.seq)

    def on_log_lines(self, message: LogLines) -> None:
        log = self.panel(LogPanel)
        if message.run_id == self.cursor_run and log is not None:
            log.show(message.reset, message.lines)
        elif log is None:
            # The tab's panel is not mounted yet (it mounts when first shown): the tail has
            # moved past these lines, so the next tick reads the log from its start.
            self._log_again = True
            self._wake.set()

    def _draw(self) -> None:
        snap = self.snapshot
        if snap is None:
            return
        active = self._tabs().active
        if active == "tab-divergence":
            pair = self.current_pair()
            checks = [c for r in (pair or ()) for c in snap.checks.get(r, [])]
            shown_runs = set(pair or ()) | ({self.cursor_run} if self.cursor_run else set())
            drifts = {r: c for r in sorted(shown_runs) for c in snap.checks.get(r, [])
                      if c.get("kind") == "replicas_drift"}
            sweep = self.marked_sweep()
            if (div := self.panel(DivergencePanel)) is not None:
                if sweep is not None:
                    div.show_sweep(sweep[0], sweep[1], self.runs, snap.series)
                else:
                    div.show(pair, self.runs, snap.series, checks,
                             awaiting=self._await_twin is not None, drifts=drifts)
        elif active == "tab-compare":
            if (compare := self.panel(ComparePanel)) is not None:
                compare.show(self.compared(), self.runs, snap.series)
        elif active == "tab-ab":
            if (ab_panel := self.panel(ABPanel)) is not None:
                ab_panel.show(snap.study)

    def _announce(self, snap: Snapshot) -> None:
        """A notification when a run seen training ends: finished, stopped, crashed (with
        the reason) or diverged (with the step). A study's runs are announced once, by the
        study's end (a toast per run would cover the table that shows them), unless one
        crashes or diverges."""
        in_study = {v["run_id"] for st in snap.studies for v in st.get("variants", ())
                    if v.get("run_id") is not None}
        for st in snap.studies:
            key = -st["id"]             # studies share the dict, under negative keys
            before, now = self._statuses.get(key), st["status"]
            self._statuses[key] = now
            if before == "running" and now != "running":
                what = "seed sweep" if st["kind"] == "sweep" else "A/B study"
                self.notify(f"{what} {st['id']} ({st['name']}) {now}: its table is in the "
                            "A/B tab", severity="error" if now == "crashed" else
                            "information")
        for run in snap.runs:
            before, now = self._statuses.get(run.id), run.status
            self._statuses[run.id] = now
            if run.id in in_study and now in ("finished", "stopped"):
                continue
            if before in ("created", "running") and now in ENDED:
                self.notify(f"run {run.id} ({run.name}) {now} at step {run.step}"
                            + (f": {run.reason}" if run.reason else ""),
                            severity=SEVERITY[now],
                            timeout=12 if now in ("crashed", "diverged") else 5)

    # --- selection ---------------------------------------------------------------------------
    def current_pair(self) -> tuple[int, int] | None:
        if len(self.pair) == 2:
            return self.pair[0], self.pair[1]
        if len(self.marked) >= 2:
            return self.marked[-2], self.marked[-1]
        if self.cursor_run is not None and self.cursor_run in self.runs:
            run = self.runs[self.cursor_run]
            if run.twin_of:
                return run.twin_of, run.id
            twins = [r.id for r in self.runs.values() if r.twin_of == run.id]
            if twins:
                return run.id, twins[-1]
        return None

    def plotted(self) -> list[int]:
        if self.marked:
            return self.marked[:len(COLOURS)]
        return [self.cursor_run] if self.cursor_run is not None else []

    def marked_sweep(self) -> tuple[str, list[int]] | None:
        """The seed sweep whose runs are marked (at least two of them), if one is."""
        if self.snapshot is None or len(self.marked) < 2:
            return None
        for name, members in ab.sweep_groups(self.snapshot.studies):
            mine = [r for r in self.marked if r in members]
            if len(mine) >= 2:
                return name, mine
        return None

    def compared(self) -> list[int]:
        """The pair, or every marked run when more than two are marked."""
        if len(self.marked) > 2:
            return self.marked[:len(COLOURS)]
        return list(self.current_pair() or ())

    @on(RunTable.CursorMoved)
    def _cursor(self, event: RunTable.CursorMoved) -> None:
        if event.run_id != self.cursor_run:
            self.cursor_run = event.run_id
            # A tick now only where the cursor decides what is shown (the plots follow it
            # when no run is marked); otherwise the next tick reads it.
            if self.tab in ("tab-log", "tab-divergence", "tab-compare") or not self.marked:
                self.refresh_all()

    @on(RunTable.MarkToggled)
    def _mark(self, event: RunTable.MarkToggled) -> None:
        rid = event.run_id
        self.marked = [r for r in self.marked if r != rid] if rid in self.marked \
            else self.marked + [rid]
        if len(self.marked) >= 2:
            self.pair = self.marked[-2:]
        if self.snapshot is not None:
            self.query_one(RunTable).show(self.snapshot.runs, self.marked, self.cursor_run)
        self.refresh_all()

    # --- writing, in worker threads ------------------------------------------------------------
    def notify(self, message: str, *, title: str = "", severity: Any = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Every notification is plain text: messages carry names, paths and values from
        data. Control characters are shown escaped; newlines stay."""
        text = shown_lines(str(message)[:2000])
        super().notify(text, title=title, severity=severity, timeout=timeout, markup=False)

    def _writable(self, what: str) -> bool:
        if self.writer.readonly:
            self.notify(f"{what}: this session is read-only (view and export only)",
                        severity="warning")
            return False
        return True

    def _write(self, fn: Callable[[SessionStore, Supervisor], Any],
               then: Callable[[Any], None] | None = None, failed: str = "") -> None:
        """Runs `fn(store, supervisor)` in a worker thread; `then(result)` back on the UI
        thread. An expected failure becomes a notification."""
        writer = self.writer

        def job() -> None:
            try:
                result = writer(fn)
            except (SessionError, OSError, C.ConfigError) as e:
                if failed:
                    self.call_from_thread(self.notify, f"{failed}: {e}", severity="error",
                                          timeout=12)
                return
            if then is not None:
                self.call_from_thread(then, result)
            self._wake.set()

        self.run_worker(job, thread=True, group="write")

    def _selected(self) -> Any:
        if self.cursor_run is None or self.cursor_run not in self.runs:
            self.notify("no run selected", severity="warning")
            return None
        return self.runs[self.cursor_run]

    @on(Button.Pressed, "#save-preset")
    def _save_preset(self) -> None:
        cfg = self.query_one(LaunchPanel).config_or_none()
        if cfg is None:
            return

        def save(name: str | None) -> None:
            if not name:
                return
            problem = name_problem(name) or ("must be a name, not a path" if "/" in name
                                             else None)
            if problem:
                self.notify(f"preset not saved: its name {problem}", severity="error")
                return
            target = presets.save(name, cfg.to_toml())
            self.query_one(LaunchPanel).reload_presets()
            self.notify(f"preset saved: {target}")

        self.push_screen(NameScreen("Save the form's config as a preset named:"), save)

    @on(LaunchPanel.Notice)
    def _notice(self, event: LaunchPanel.Notice) -> None:
        self.notify(event.text, severity=event.severity)

    def action_start(self) -> None:
        if self._writable("not started"):
            self.query_one(LaunchPanel).ask_start()

    @on(LaunchPanel.StartAsked)
    def _start(self, event: LaunchPanel.StartAsked) -> None:
        if not self._writable("not started"):
            return

        def started(run_id: int) -> None:
            self.cursor_run = run_id
            self.notify(f"run {run_id} started")

        self._start_checked(event.config, event.name, started)

    @work(thread=True, group="write")
    def _start_checked(self, config: dict[str, Any], name: str | None,
                       started: Callable[[int], None]) -> None:
        """Start, once core.machine's rules say this machine can train the config (the
        machine is probed once, in a child process; the UI never imports torch)."""
        try:
            found = machine.problem(config, machine.facts())
        except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as e:
            found = None        # not known: the run's own check still refuses it
            self.call_from_thread(self.notify, f"the machine check failed ({e}); starting "
                                  "anyway", severity="warning")
        if found is not None:
            self.call_from_thread(self.notify, f"not started: {found}", severity="error",
                                  timeout=12)
            return
        self.call_from_thread(self._write, lambda _, sup: sup.start(config, name=name),
                              started, "not started")

    @work(thread=True, group="machine")
    def _probe_machine(self) -> None:
        try:
            m, error = machine.facts(), None
        except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as e:
            m, error = None, str(e)

        def show() -> None:
            for panel in self.query(LaunchPanel):
                panel.set_machine(m, error)

        self.call_from_thread(show)

    @on(Button.Pressed, "#stop")
    def action_stop(self) -> None:
        run = self._selected() if self._writable("not stopped") else None
        if run is None:
            return

        def done(ok: bool) -> None:
            self.notify(f"stopping run {run.id} after its current step" if ok else
                        f"run {run.id} is not training", severity="information" if ok
                        else "warning")

        self._write(lambda _, sup: sup.stop(run.id), done)

    @on(Button.Pressed, "#continue")
    def action_continue_run(self) -> None:
        run = self._selected() if self._writable("not continued") else None
        if run is None:
            return
        if self._training(run):
            self.notify(f"run {run.id} is still training", severity="warning")
            return

        def has_checkpoint(usable: bool) -> None:
            if not usable:
                def decided(yes: bool | None) -> None:
                    if yes:
                        self._continue(run.id, {}, restart=True)

                self.push_screen(ConfirmScreen(
                    f"Run {run.id} has no checkpoint to continue from. Train it again from "
                    f"step 0? Its {run.step} recorded steps are replaced as it goes.",
                    "Restart from step 0"), decided)
                return

            def how_far(answer: dict | None) -> None:
                if answer is None:
                    return
                changed = {k: v for k, v in answer.items() if run.config.get(k) != v}
                self._continue(run.id, changed)

            self.push_screen(ContinueScreen(run.id, run.step, run.config.get("epochs", 1),
                                            run.config.get("max_steps", 0) or 0), how_far)

        self._write(lambda s, _: bool(s.usable_checkpoints(run.id)), has_checkpoint)

    def _training(self, run: Any) -> bool:
        """Training now, or about to (a child this dashboard started for it)."""
        return run.status == "running" or (run.status == "created" and
                                           self.writer.supervisor.starting_cached(run.id))

    def _continue(self, run_id: int, overrides: dict[str, Any], restart: bool = False) -> None:
        extra = f" until {', '.join(f'{k}={v}' for k, v in overrides.items())}" \
            if overrides else ""
        self.notify(f"{'restarting' if restart else 'continuing'} run {run_id}{extra}"
                    + (" from step 0" if restart else ""))
        self._write(lambda _, sup: sup.resume(run_id, overrides, restart=restart),
                    failed=f"run {run_id} not continued")

    @on(Button.Pressed, "#repeat")
    def action_repeat(self) -> None:
        run = self._selected() if self._writable("not repeated") else None
        if run is None:
            return

        def started(twin: int) -> None:
            self.pair = [run.id, twin]
            self.marked = [run.id, twin]
            self.notify(f"run {twin} started as a twin of run {run.id}")

        self._write(lambda _, sup: sup.repeat(run.id), started, "not repeated")

    @on(Button.Pressed, "#compare")
    def action_compare(self) -> None:
        ids = self.compared()
        if len(ids) < 2:
            self.notify("mark two runs or more with space (or repeat one) to compare them",
                        severity="warning")
            return
        if len(ids) == 2:
            self.pair = list(ids)
        self._tabs().active = "tab-compare"

    def action_config_from_run(self) -> None:
        run = self._selected()
        if run is not None:
            self.query_one(LaunchPanel).set_config(run.config)
            self.notify(f"the form holds run {run.id}'s config: change what you like, F2")

    def action_show_tab(self, tab: str) -> None:
        self._tabs().active = tab

    def action_next_tab(self) -> None:
        tabs = [t for t, _ in TABS]
        self.action_show_tab(tabs[(tabs.index(self._tabs().active) + 1) % len(tabs)])

    def action_toggle_form(self) -> None:
        """The form beside the panels; on a small terminal a drawer over the whole width
        (F9 opens it with the focus in the knob search, F9 again closes it)."""
        if self.has_class("-small"):
            self.toggle_class("-form-open")
            if self.has_class("-form-open"):
                self.query_one("#knob-search").focus()
            else:
                self.query_one(RunTable).focus()
        else:
            self.toggle_class("-form-hidden")

    def _checkable(self) -> Any:
        """The run under the cursor, when it can be checked (it has trained and stopped)."""
        run = self._selected() if self._writable("not checked") else None
        if run is None:
            return None
        if run.live:
            self.notify(f"run {run.id} is {run.status}: check it once it has finished or "
                        "stopped", severity="warning")
            return None
        if run.step < 1:
            self.notify(f"run {run.id} has no steps to compare", severity="warning")
            return None
        return run

    def _start_check(self, run: Any, resume_at: int | None, what: str) -> None:
        self._await_twin = run.id
        self._write(lambda _, sup: sup.check(run.id, resume_at))
        self._tabs().active = "tab-divergence"
        self._save_state()
        self.notify(f"{what} of run {run.id}: training its twin; the verdict shows in the "
                    "Divergence tab")

    def action_verdict(self) -> None:
        run = self._checkable()
        if run is not None:
            self._start_check(run, None, "determinism verdict")

    def action_resume_check(self) -> None:
        run = self._checkable()
        if run is None:
            return
        if run.step < 2:
            self.notify(f"run {run.id} is too short to kill in the middle", severity="warning")
            return
        last = run.step - 1

        def chosen(text: str | None) -> None:
            if text is None:
                return
            try:
                step = int(text)
                if not 1 <= step <= last:
                    raise ValueError
            except ValueError:
                self.notify(f"resume check not started: step must be a whole number from 1 to "
                            f"{last}, got {text!r}", severity="error")
                return
            self._start_check(run, step, f"resume check at step {step}")

        self.push_screen(NameScreen(f"Resume check of run {run.id}: kill a twin at step "
                                    f"(1 to {last}), resume it from its checkpoint, compare:",
                                    str(max(1, run.step // 2))), chosen)

    # --- the run table's requests ---------------------------------------------------------------
    @on(RunTable.Asked)
    def _asked(self, event: RunTable.Asked) -> None:
        table = self.query_one(RunTable)
        if event.what == "filter":
            def filtered(text: str | None) -> None:
                if text is not None:
                    table.set_filter("" if text.strip() == "*" else text)
            self.push_screen(NameScreen("Show runs matching (words in names, tags, notes, "
                                        "status; key=value for config; * for all):",
                                        table.view.filter), filtered)
            return
        run = self.runs.get(event.run_id)
        if run is None or not self._writable(f"not changed ({event.what})"):
            return
        rid = run.id

        def then(_: Any = None) -> None:
            self._invalidate = True
            self.refresh_all()

        if event.what == "hide":
            self._write(lambda s, _: s.set_labels(rid, hidden=not run.hidden), then)
            self.notify(f"run {rid} {'shown again' if run.hidden else 'hidden'} (H shows "
                        "hidden runs)")
        elif event.what == "rename":
            def renamed(name: str | None) -> None:
                problem = name and name_problem(name)
                if problem:
                    self.notify(f"not renamed: the name {problem}", severity="error")
                elif name:
                    self._write(lambda s, _: s.rename_run(rid, name), then, "not renamed")
            self.push_screen(NameScreen(f"Rename run {rid} to:", run.name), renamed)
        elif event.what == "notes":
            def noted(text: str | None) -> None:
                problem = text and name_problem(text)
                if problem:
                    self.notify(f"notes not saved: they {problem}", severity="error")
                elif text is not None:
                    self._write(lambda s, _: s.set_labels(rid, notes=text), then)
            self.push_screen(NameScreen(f"Notes on run {rid}:", run.notes), noted)
        elif event.what == "tags":
            def tagged(text: str | None) -> None:
                if text is not None:
                    tags = [t for t in text.replace(",", " ").split() if not name_problem(t)]
                    self._write(lambda s, _: s.set_labels(rid, tags=tags), then)
            self.push_screen(NameScreen(f"Tags of run {rid} (words):", " ".join(run.tags)),
                             tagged)
        elif event.what == "delete":
            def deleted(yes: bool | None) -> None:
                if not yes:
                    return

                def gone(_: Any) -> None:
                    self.marked = [r for r in self.marked if r != rid]
                    self.pair = [r for r in self.pair if r != rid]
                    if self.cursor_run == rid:
                        self.cursor_run = None
                    self.notify(f"run {rid} deleted")
                    then()

                self._write(lambda s, _: s.delete_run(rid), gone, f"run {rid} not deleted")

            self.push_screen(ConfirmScreen(
                f"Delete run {rid} ({run.name})? Its rows, checkpoints and log are removed; "
                "this cannot be undone.", "Delete"), deleted)

    # --- A/B studies --------------------------------------------------------------------------
    @on(ABPanel.StudyChosen)
    def _study_chosen(self, event: ABPanel.StudyChosen) -> None:
        if event.study_id != self.study_shown:
            self.study_shown = event.study_id
            self.refresh_all()

    @on(ABPanel.FileChosen)
    def _study_file(self, event: ABPanel.FileChosen) -> None:
        try:
            values, spec = ab.read_study_file(event.path)
            cfg = C.from_dict(values)
        except C.ConfigError as e:
            self.notify(f"study not loaded: {e}", severity="error")
            return
        self.query_one(LaunchPanel).set_config(cfg.to_dict())
        self.query_one(ABPanel).set_spec(spec.get("vary", []), spec.get("steps"),
                                         spec.get("repeats"))
        self.notify(f"study {Path(event.path).stem} loaded: base config in the form, "
                    f"{spec.get('about', 'its variants in the vary field')}")

    @on(ABPanel.StartAsked)
    def _start_study(self, event: ABPanel.StartAsked) -> None:
        if not self._writable("study not started"):
            return
        try:
            base = self.query_one(LaunchPanel).form.config()
            vary = [] if event.sweep else ab.parse_vary(event.vary.split())
            for key, text in (("steps", event.steps), ("rounds", event.repeats)):
                if not text.isdigit() or int(text) < 1:
                    raise C.ConfigError(key, f"must be a whole number >= 1, got {text!r}")
            name = "sweep" if event.sweep else \
                Path(event.file).stem if event.file else "+".join(k for k, _ in vary)
            planned = ab.prepare(base, vary, int(event.steps), repeats=int(event.repeats),
                                 name=name, file=event.file)
        except C.ConfigError as e:
            self.notify(f"study not started: {e}", severity="error")
            return

        def create(store: SessionStore, sup: Supervisor) -> int:
            study_id = store.create_study(planned.kind, name, planned.spec, planned.runs)
            sup.study(study_id)
            return study_id

        def started(study_id: int) -> None:
            self.study_shown = study_id
            what = "seed sweep" if event.sweep else "A/B study"
            self.notify(f"{what} {study_id} started: {len(planned.runs)} runs of "
                        f"{event.steps} steps, one after the other"
                        + (f" ({'; '.join(planned.notes)})" if planned.notes else ""))

        self._write(create, started, "study not started")

    @on(ABPanel.StopAsked)
    def _stop_study(self) -> None:
        sid = self.study_shown
        if sid is None:
            self.notify("no study running", severity="warning")
            return
        self._write(lambda _, sup: sup.stop_study(sid), lambda ok: self.notify(
            f"stopping study {sid} (its current run writes a checkpoint)" if ok
            else "no study running", severity="information" if ok else "warning"))

    @on(ABPanel.ExportAsked)
    def _export_study(self) -> None:
        self.action_export()

    @on(ABPanel.SweepChosen)
    def _sweep_chosen(self, event: ABPanel.SweepChosen) -> None:
        runs = event.runs[:len(COLOURS)]
        self.marked, self.pair = list(runs), []
        self.cursor_run = runs[0]
        self.notify(f"{event.label}: {len(runs)} runs marked; Plots shows their mean and "
                    "min-max band, Divergence how the seed-to-seed spread grows")

    @on(ABPanel.Paired)
    def _paired(self, event: ABPanel.Paired) -> None:
        self.pair, self.marked = [event.base, event.run], [event.base, event.run]
        self.cursor_run = event.run
        self.notify(f"pair: base (run {event.base}) and {event.label} (run {event.run}); see "
                    "Divergence and Compare")

    # --- export, sessions, help, quit --------------------------------------------------------
    def action_export(self) -> None:
        active = self._tabs().active
        if active == "tab-ab":
            if self.study_shown is None:
                self.notify("no A/B study to export", severity="warning")
                return
            what, ids = "study", [self.study_shown]
        elif active in ("tab-divergence", "tab-compare") and self.compared():
            what, ids = "runs", self.compared()
        else:
            what, ids = "runs", self.plotted()
        if not ids:
            self.notify("nothing to export: select or mark runs", severity="warning")
            return
        self.notify(f"exporting {what} {', '.join(map(str, ids))} ...")
        self._export(what, ids)

    @work(thread=True, group="export")
    def _export(self, what: str, ids: list[int]) -> None:
        """In a worker thread, with its own read-only connection; matplotlib takes a second
        or two, the dashboard keeps polling meanwhile."""
        from ..core.export import export_runs, export_study
        try:
            with SessionStore(self.session_dir, create=False, readonly=True) as store:
                out = store.dir / "exports"
                files = export_study(store, ids[0], out) if what == "study" \
                    else export_runs(store, ids, out)
        except (SessionError, OSError) as e:
            self.call_from_thread(self.notify, f"export failed: {e}", severity="error")
            return
        names = ", ".join(f.name for f in files)
        self.call_from_thread(self.notify, f"exported {len(files)} files to {out}: {names}",
                              timeout=12)

    def action_help(self) -> None:
        self.push_screen("help")

    def switch_session(self, directory: Path) -> None:
        try:
            writer = Writer(directory, self.warm)
        except SessionError as e:       # a damaged session: say so, keep the one open
            self.notify(f"not opened: {e}", severity="error", timeout=15)
            return
        self.workers.cancel_group(self, "poll")
        self._wake.set()
        left = self._state_text if self._save_pending else None
        self._save_pending, self._state_text = False, None
        old, self.writer = self.writer, writer

        def close_old() -> None:        # the session left: its last screen state, then close
            if left is not None and not old.readonly:
                old(lambda s, _: s.set_meta("ui_state", left))
            old.close()

        self.run_worker(close_old, thread=True, group="write")
        self.session_dir = writer.store.dir
        self._set_title()
        self.snapshot, self.runs, self._statuses = None, {}, {}
        self._await_twin = None
        self._restoring = True
        self._saved_state = None
        self.query_one(RunTable).clear()
        self.query_one(RunTable)._shown_key = None
        self._start_poller()
        self._load_state()

    def action_save_as(self) -> None:
        def save(name: str | None) -> None:
            if not name:
                return
            problem = name_problem(name)
            if problem:
                self.notify(f"not saved: the session name {problem}", severity="error")
                return
            target = Path(name).expanduser() if "/" in name else sessions_dir() / name
            live = [r.id for r in self.runs.values() if r.live]
            # The screen as it is now goes into the copy: a state write still waiting for
            # its timer would otherwise miss it (the copy reopened on another tab).
            state = json.dumps(self._state())

            def copy(store: SessionStore, _: Supervisor) -> Path:
                if not self.writer.readonly:
                    store.set_meta("ui_state", state)
                return store.copy_to(target)

            def copied(new: Path) -> None:
                self.switch_session(new)
                note = (f"; {len(live)} run(s) still training go on in the original, "
                        "shown here as copied" if live else "")
                self.notify(f"session saved as {new}{note}")

            self._write(copy, copied, "not saved")

        self.push_screen(NameScreen("Save this session as (a name, or a path):",
                                    f"{self.session_dir.name}-copy"), save)

    def action_open_session(self) -> None:
        def opened(path: Path | None) -> None:
            if path is not None and path != self.session_dir:
                self.switch_session(path)
                self.notify(f"opened {path}")

        self.push_screen(OpenScreen(self.session_dir), opened)

    def _live(self) -> tuple[list[int], list[int]]:
        live = sorted({r.id for r in self.runs.values() if r.live} |
                      set(self.writer.supervisor.children()))
        studies = [s["id"] for s in (self.snapshot.studies if self.snapshot else ())
                   if s["status"] == "running"]
        return live, studies

    async def action_quit(self) -> None:
        live, studies = self._live()
        if not live and not studies:
            self.exit()
            return

        def decided(choice: str | None) -> None:
            if choice == "cancel" or choice is None:
                return
            if choice == "stop":
                def stop_all(_: SessionStore, sup: Supervisor) -> None:
                    for study_id in studies:   # first, so that no study starts its next run
                        sup.stop_study(study_id)
                    for run_id in live:
                        sup.stop(run_id)
                self._write(stop_all, lambda _: self.exit())
                return
            self.exit()

        self.push_screen(QuitScreen(live), decided)

    async def _mount_form(self) -> None:
        await self.query_one(LaunchPanel).mount_form()
        # The whole screen is built: from now on the cycle collector's full walks happen
        # here (ui/heap), every TIDY_EVERY_S once no key came for QUIET_S.
        self._heap_due = 0.0
        self.call_after_refresh(self._tidy_heap)
        self.set_interval(heap.QUIET_S, self._tidy_heap)

    def _tidy_heap(self) -> None:
        now = time.monotonic()
        overdue = now >= self._heap_due + heap.MAX_DELAY_S
        if now >= self._heap_due and (overdue or not self.input_quiet(heap.QUIET_S)):
            heap.tidy()
            self._heap_due = time.monotonic() + heap.TIDY_EVERY_S

    def on_unmount(self) -> None:
        heap.release()
        self.workers.cancel_group(self, "poll")
        self._wake.set()
        if self.warm is not None:       # runs it forked go on: they are sessions of their own
            self.warm.close()
        if self._save_pending:
            # The last screen state, written as the app closes (no screen is left to
            # block); every other write runs in a worker.
            self._flush_state(now=True)


def run_app(session_dir: Path | None) -> int:
    TrainerApp(session_dir).run()
    return 0
