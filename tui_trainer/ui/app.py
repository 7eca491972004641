"""The dashboard: the layout, the keys, and the routing between panels, poller and writer.

- The session is opened in a worker (`_open`: the Writer, ui/writer.py); from then on one
  polling thread (ui/poller.py) reads it and posts a `Polled` tick, which the app hands to
  the run table and the visible tab as one `Tick` (panels/common.py): `panel.draw(tick)`.
- Everything that writes runs in worker threads through the Writer (`write`), one at a time.
  The UI thread never runs SQLite, not even to open, switch or close a session.
- The panels (ui/panels/, one registry: `TAB_PANELS`) own their keys, dialogs and background
  commands (ui/jobs.py), and post typed messages for what changes the app's state. A tab's
  keys that work wherever the focus is while it shows (its `TAB_KEYS`) and its palette
  entries (`COMMANDS`) are bound here by the tab's id and handed to its panel (`action_panel`).

The app's state (marked runs, the pair, the run under the cursor, the study and tab shown,
the form) is reactive; what follows from it is ui/selection.py's (plain objects), and it is
saved into the session whenever it changes (a `ScreenState`).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from dataclasses import replace
from functools import partial
from typing import Any, Callable, Iterable, TypeVar

from textual import events, on, work
from textual.actions import parse
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import var
from textual.screen import Screen
from textual.widgets import Button, DataTable, Header, TabbedContent, TabPane
from textual.widgets._tabbed_content import ContentTabs

from ..core.settings.config import ConfigError
from ..core.errors import BadInput, SessionError
from ..core.session.paths import default_session_dir
from ..core.session.reader import Snapshot
from ..core.session.store import SessionStore
from ..core.processes.supervisor import Supervisor, dashboard_nice
from ..launcher.client import WarmLauncher
from ..core.text import shown, shown_lines
from . import heap
from .driver import driver_for
from .announce import Announcer
from .panels import TAB_PANELS
from .panels.ab import ABPanel
from .panels.common import PANE_KEYS, Tick, active_scroller
from .panels.launch import LaunchPanel
from .panels.log import LogPanel
from .panels.plots import PlotsPanel
from .panels.runs import RunTable
from .poller import LogLines, Polled, Poller, Request
from .screens import HelpScreen
from .selection import MAX_SHOWN, ScreenState, Selection
from .session_keys import SessionKeys
from .widgets.footer import StableFooter
from .writer import STATE_KEY, Writer

W = TypeVar("W")
TAB_IDS = tuple(p.TAB for p in TAB_PANELS)


# The panels whose keys the app binds (`panel_keys`), by class name: the form's Start and the
# run table's F3-F8 (their APP_KEYS, wherever the focus is), and each tab's own (TAB_KEYS,
# while that tab shows).
KEYED = {cls.__name__: cls for cls in (LaunchPanel, RunTable, *TAB_PANELS)}


def panel_keys() -> list[Binding]:
    """The panels' keys, bound by the app so that they work wherever the focus is (but in a
    text field), a tab's only while that tab shows (check_action): each the panel's own
    action, asked for by the panel's class name (`action_panel`)."""
    out = []
    for name, cls in KEYED.items():
        for key in (*getattr(cls, "APP_KEYS", ()), *getattr(cls, "TAB_KEYS", ())):
            _, action, args = parse(key.action)
            routed = ", ".join(map(repr, (name, action, *args)))
            out.append(replace(key, action=f"panel({routed})"))
    return out


STATE_SAVE_S = 0.5      # the screen state is written at most twice a second
INPUT_QUIET_S = 0.4     # charts are built this long after the last key, not while keys come


class TrainerApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "tui-trainer"
    SCREENS = {"help": HelpScreen}      # made once, shown again on every F1

    # The footer shows these in this order and cuts what does not fit: the way to the rest
    # (F1 help, F9 the form, and the palette on the right) comes first.
    BINDINGS = [
        Binding("f1", "help", "Help"),
        Binding("f9", "toggle_form", "Form"),
        *panel_keys(),  # F2, F3-F8 (the run table's), the tabs' own keys while each shows
        Binding("ctrl+e", "session('export')", "Export"),       # the session's keys
        Binding("ctrl+s", "session('save_as')", "Save as"),     # (ui/session_keys.py)
        Binding("ctrl+o", "session('open_session')", "Open"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
        # The next tab from anywhere (no text box uses ctrl+t; alt+digits do not arrive
        # from every terminal); the tab's pane scrolls where the focus does not (PANE_KEYS)
        Binding("ctrl+t", "next_tab", "Next tab", show=False), *PANE_KEYS]

    marked: var[list[int]] = var(list)
    pair: var[list[int]] = var(list)
    cursor_run: var[int | None] = var(None)
    study_shown: var[int | None] = var(None)
    tab: var[str] = var(TAB_IDS[0])

    def get_driver_class(self) -> type:
        return driver_for(super().get_driver_class())      # (ui/driver.py)

    def __init__(self, session_dir: Path | None = None, poll: bool = True) -> None:
        super().__init__()
        self.session_dir = Path(session_dir or default_session_dir()).expanduser().resolve()
        # Runs forked from a process that imported torch (started after the first screen),
        # in the dashboard's scheduling group, below it (supervisor.py says why).
        self.warm = WarmLauncher.from_env(nice=dashboard_nice())
        self.writer: Writer | None = None       # opened in a worker (_open)
        self.refused: SessionError | None = None  # why the session given could not open
        self.poller = Poller(self, poll, self.wait_for_quiet)
        self.announcer = Announcer()
        self.session_keys = SessionKeys(self)   # ctrl+e, ctrl+s, ctrl+o, ctrl+q
        self.runs: dict[int, Any] = {}
        self.snapshot: Snapshot | None = None
        self._restoring = True
        self._saved_state: str | None = None
        self._state_text: str | None = None
        self._panels: dict[type, Any] = {}
        self._focus_tab: str | None = None      # the tab whose panel takes the focus
        self._save_pending = False
        self._form_values: dict[str, Any] | None = None
        self.last_input = 0.0           # monotonic time of the last key or mouse press
        self._tidy_heap = heap.Tidier(self.input_quiet)
        self._titled: tuple[Path, bool] | None = None
        self._set_title(False)

    def _set_title(self, readonly: bool) -> None:
        """The session's path (and whether it is read-only), set when either changes."""
        if self._titled != (self.session_dir, readonly):
            self._titled = (self.session_dir, readonly)
            self.sub_title = shown(self.session_dir, 120) + " (read-only)" * readonly

    @property
    def store(self) -> SessionStore:
        assert self.writer is not None, "the session is not open yet"
        return self.writer.store

    @property
    def selection(self) -> Selection:
        return Selection(tuple(self.marked), tuple(self.pair), self.cursor_run)

    def _select(self, sel: Selection) -> None:
        self.marked, self.pair, self.cursor_run = list(sel.marked), list(sel.pair), sel.cursor

    # --- layout ----------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            yield LaunchPanel(id="left")
            with Vertical(id="right"):
                yield RunTable(id="runs")
                with Horizontal(id="run-actions"):      # the run table's keys (run_keys.py)
                    for key, title, action, variant in (
                            ("F3", "Stop", "stop", "warning"),
                            ("F4", "Continue", "continue_run", "default"),
                            ("F5", "Repeat", "repeat", "default"),
                            ("F6", "Compare", "compare", "default")):
                        yield Button(f"{title} ({key})", id=title.lower(), compact=True,
                                     variant=variant,
                                     action=f"app.panel('RunTable', '{action}')")
                with TabbedContent(id="tabs"):
                    # The first tab's panel is mounted with the screen, the others when
                    # first shown (_show_tab).
                    for i, cls in enumerate(TAB_PANELS):
                        with TabPane(cls.TITLE, id=cls.TAB):
                            if i == 0:
                                yield cls(id=cls.PANEL_ID)
        yield StableFooter(compact=True)

    def on_mount(self) -> None:
        self._open(self.session_dir)
        self.watch(self.screen, "focused", lambda _: self._focus_out_of_the_form())

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

    def on_resize(self, event: events.Resize) -> None:
        # A small terminal gets the form as a drawer (F9) and the plots one at a time: judged
        # by the event's size (the app's is the last one here), restyling a dialog's screens.
        size = event.size
        self.set_class(size.width < 120 or size.height < 30, "-small")
        self.set_class(size.width >= 240 and size.height >= 60, "-wide")
        for screen in self.screen_stack[:-1]:       # (Textual restyles only the top one)
            screen.update_node_styles(animate=False)
        self._focus_out_of_the_form()

    def _focus_out_of_the_form(self) -> None:
        """A closed drawer gives the focus to the run table (at 80x24 it was in the hidden
        form, from the start or after a dialog: space opened its preset list unseen)."""
        main = self.screen_stack[0] if self.screen_stack else None
        if main is not None and self.has_class("-small") and not self.has_class("-form-open") \
                and any(w.id == "left" for w in getattr(main.focused, "ancestors", ())):
            self.call_after_refresh(main.set_focus, main.query_one(RunTable))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for title, help_text, action in (
                *((title, help_text, partial(self._panel_command, cls, action))
                  for cls in KEYED.values() for title, help_text, action
                  in getattr(cls, "COMMANDS", ())),
                ("Export", "PNG figures and CSVs of the runs, the pair or the A/B study shown",
                 self.session_keys.export),
                ("Save session as", "Copy this session under a new name",
                 self.session_keys.save_as),
                ("Open session", "Open another session (any folder)",
                 self.session_keys.open_session),
                ("Show or hide the form", "The form as a drawer (F9)",
                 self.action_toggle_form),
                *((f"{cls.TITLE} tab", f"Show the {cls.TITLE} tab (ctrl+t: the next tab)",
                   lambda tab=cls.TAB: self.action_show_tab(tab)) for cls in TAB_PANELS),
                ("Help", "Keys and panels", self.action_help)):
            yield SystemCommand(title, help_text, action)

    # --- the session: opened, switched and closed in workers ---------------------------------
    @work(thread=True, group="open")
    def _open(self, directory: Path, opened_note: str = "") -> None:
        """Opens a session (a connect, a schema check, a write) and reads its saved screen
        state, off the UI thread. A damaged session: the first one ends the app (the command
        says why); one opened later is refused with a notification, the open one stays."""
        try:
            writer = Writer(directory, self.warm)
            opened = writer.opened()
        except SessionError as e:
            if self.writer is None:
                self.refused = e
                self.call_from_thread(self.exit, return_code=1)
            else:
                self.call_from_thread(self.notify, f"not opened: {e}", severity="error",
                                      timeout=15)
            return
        self.call_from_thread(self._opened, writer, *opened)
        for note in filter(None, (opened_note, writer.store.upgrade_note)):  # (upgrade.py)
            self.call_from_thread(self.notify, note, timeout=15)

    def _opened(self, writer: Writer, raw: str | None, ids: set[int],
                studies: list[int]) -> None:
        old, self.writer = self.writer, writer
        if old is not None:            # the session left: its last screen state, then close
            self.poller.stop()
            left = self._state_text if self._save_pending else None
            self.run_worker(lambda: old.close(left), thread=True, group="close")
            self.snapshot, self.runs, self.announcer = None, {}, Announcer()
            self.query_one(RunTable).awaiting_twin = None
            self._restoring = True
            table = self.query_one(RunTable)
            table.clear()
            table._shown_key = None
        self._save_pending, self._state_text, self._saved_state = False, None, raw
        self.session_dir = writer.store.dir
        self._set_title(writer.readonly)
        self._apply_state(ScreenState.restored(raw, ids, studies, TAB_IDS))
        self.poller.start(self.session_dir, None if writer.readonly else writer)

    def switch_session(self, directory: Path, opened_note: str = "") -> None:
        """Opens another session (in a worker); `opened_note` is said once it is open."""
        self._open(Path(directory), opened_note)

    def _apply_state(self, state: ScreenState) -> None:
        self._select(state.selection)
        self.study_shown = state.study
        if state.plots is not None:
            self._plots().set_options(state.plots)
        if state.form is not None:
            self.query_one(LaunchPanel).set_config(state.form)
        if state.tab is not None:
            self._tabs().active = state.tab
        self._restoring = False
        self.state_changed()
        self.refresh_all()

    def _state(self) -> ScreenState:
        return ScreenState(self.selection, self._tabs().active, self.study_shown,
                           self._form_values, self._plots().options)

    def state_changed(self) -> None:
        """Called by every watcher of the state: the state goes into the session (in a
        worker), and the polling thread is told what to read."""
        if self._restoring or not self.is_mounted or self.panel(TabbedContent) is None:
            return                      # restoring, or the app is closing
        self._update_request()
        self._state_text = self._state().to_json()
        if not self._save_pending and not self.writer.readonly:
            # A burst of changes (a key held down in the run table) is written once.
            self._save_pending = True
            self.set_timer(STATE_SAVE_S, self._flush_state)

    def _flush_state(self) -> None:
        self._save_pending = False
        text = self._state_text
        if text is None or text == self._saved_state or self.writer.readonly:
            return
        self._saved_state = text
        self.write(lambda s, _: s.set_meta(STATE_KEY, text))

    def watch_marked(self) -> None:
        self.state_changed()

    def watch_pair(self) -> None:
        self.state_changed()

    def watch_cursor_run(self) -> None:
        self.state_changed()

    def watch_study_shown(self) -> None:
        self.state_changed()

    @on(TabbedContent.TabActivated)
    async def _tab(self, event: TabbedContent.TabActivated) -> None:
        self.tab = self._tabs().active
        await self._show_tab(self.tab)
        if self._focus_tab == self.tab:
            self._focus_tab = None
            self.call_after_refresh(self._focus_into, self.tab)
        self.state_changed()
        self.draw_tab()
        self.refresh_all()

    @on(PlotsPanel.OptionsChanged)
    def _plot_options(self) -> None:
        self.state_changed()
        self.refresh_all()

    @on(LaunchPanel.FormChanged)
    def _form(self, event: LaunchPanel.FormChanged) -> None:
        self._form_values = dict(event.values)
        self.state_changed()

    async def _show_tab(self, tab: str) -> None:
        """Mounts a tab's panel the first time the tab is shown (the first screen mounts
        only what it shows)."""
        cls = next(c for c in TAB_PANELS if c.TAB == tab)
        pane = self.query_one(f"#{tab}", TabPane)
        if not pane.children:
            panel = cls(id=cls.PANEL_ID)
            await pane.mount(panel)
            self._panels[cls] = panel

    def _panel_of(self, tab: str | None = None) -> type:
        """The class of a tab's panel (the tab shown's)."""
        tab = tab or self._tabs().active
        return next(c for c in TAB_PANELS if c.TAB == tab)

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
        if panel is not None or cls in TAB_PANELS:
            self._panels[cls] = panel
        return panel

    # --- the polling thread's ticks, drawn -------------------------------------------------
    def _update_request(self) -> None:
        sel = self.selection
        pair = sel.current_pair(self.runs)
        plotted = tuple(sel.plotted())
        watched = set(plotted) | set(pair or ()) | set(sel.compared(self.runs))
        twin = self.query_one(RunTable).awaiting_twin
        checks = set(pair or ()) | {r for r in (twin, sel.cursor) if r is not None}
        self.poller.request = Request(
            watched=tuple(sorted(watched)), plotted=plotted, tab=self._tabs().active,
            study=self.study_shown, checks_for=tuple(sorted(checks)), log_run=sel.cursor,
            options=self._plots().options)

    def refresh_all(self) -> None:
        """Asks for a tick now (the poller reads every POLL_S anyway)."""
        self.poller.wake()

    async def poll_now(self, timeout: float = 30.0) -> None:
        """Waits until a tick that started after this call has been drawn (for tests and
        scripts driving the app)."""
        await self.poller.tick_drawn(timeout)

    async def ready(self, machine: bool = False, timeout: float = 60.0) -> None:
        """Waits until the first screen is drawn and the form mounted (and, with machine,
        this machine's facts known): for tests and scripts driving the app."""
        launch = self.query_one(LaunchPanel)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not (
                self.snapshot is not None and launch.form.ready
                and (not machine or launch.form.machine is not None)):
            await asyncio.sleep(0.02)

    def on_polled(self, message: Polled) -> None:
        table = self.panel(RunTable)
        if not self.screen_stack or table is None:
            return                      # the app is closing: nothing to draw on
        if self._restoring:
            return      # drawn once the saved state (cursor, marks) is applied: a tick then
        if self.snapshot is None:       # the first screen is drawn: then the form
            self.call_after_refresh(self._mount_form)
        snap = self.snapshot = message.snap
        self.runs = {r.id: r for r in snap.runs}
        for said in self.announcer.news(snap):
            self.notify(said.text, severity=said.severity, timeout=said.timeout)
        table.settle(snap)          # a check's twin, once started, paired with its run
        for cls in (LaunchPanel, *TAB_PANELS):     # background work: answered, or failed
            if (panel := self.panel(cls)) is not None and hasattr(panel, "settle"):
                panel.settle(snap)
        if self.cursor_run not in self.runs and not self.ours(self.cursor_run):
            self.cursor_run = None      # (a run just started stays: a snapshot lags it)
        table.draw(self._tick())
        if self.cursor_run is None and table.row_count:
            self.cursor_run = table.current()
        if self.study_shown is None and snap.studies:
            self.study_shown = snap.studies[-1]["id"]
        self.draw_tab(message.lines)
        self.poller.drawn(message.seq)

    def _tick(self, lines: dict | None = None) -> Tick:
        assert self.snapshot is not None
        starting = frozenset(r for r in self.runs if self.writer.supervisor.starting_cached(r))
        table = self.query_one(RunTable)
        return Tick(self.snapshot, self.runs, self.selection, self.study_shown,
                    table.awaiting_twin, lines, starting, table.checking)

    def draw_tab(self, lines: dict | None = None) -> None:
        """The visible tab's panel draws the tick (a panel skips what did not change)."""
        if self.snapshot is not None and (panel := self.panel(self._panel_of())) is not None:
            panel.draw(self._tick(lines))

    def on_log_lines(self, message: LogLines) -> None:
        log = self.panel(LogPanel)
        if message.run_id == self.cursor_run and log is not None:
            log.show(message.reset, message.lines)
        elif log is None:
            # The tab's panel is not mounted yet (it mounts when first shown): the tail has
            # moved past these lines, so the next tick reads the log from its start.
            self.poller.log_missed()

    # --- what the panels tell the app
    # ----------------------------------------------------------
    @on(RunTable.CursorMoved)
    def _cursor(self, event: RunTable.CursorMoved) -> None:
        if event.run_id != self.cursor_run:
            self.cursor_run = event.run_id
            # A tick now only where the cursor decides what is shown (the plots follow it
            # when no run is marked); otherwise the next tick reads it.
            if getattr(self._panel_of(self.tab), "FOLLOWS_CURSOR", False) or not self.marked:
                self.refresh_all()

    @on(RunTable.MarkToggled)
    def _mark(self, event: RunTable.MarkToggled) -> None:
        self._select(self.selection.toggled(event.run_id))
        if self.snapshot is not None:
            self.query_one(RunTable).draw(self._tick())
        self.refresh_all()

    @on(RunTable.Deleted)
    def _deleted(self, event: RunTable.Deleted) -> None:
        self._select(self.selection.without(event.run_id))

    @on(ABPanel.StudyChosen)
    def _study_chosen(self, event: ABPanel.StudyChosen) -> None:
        if event.study_id != self.study_shown:
            self.study_shown = event.study_id
            self.refresh_all()

    @on(ABPanel.SweepChosen)
    def _sweep_chosen(self, event: ABPanel.SweepChosen) -> None:
        runs = event.runs[:MAX_SHOWN]
        self._select(Selection(tuple(runs), (), runs[0]))
        self.notify(f"{event.label}: {len(runs)} runs marked; Plots shows their mean and "
                    "min-max band, Divergence how the seed-to-seed spread grows")

    @on(ABPanel.Paired)
    def _paired(self, event: ABPanel.Paired) -> None:
        self._select(Selection((event.base, event.run), (event.base, event.run), event.run))
        self.notify(f"pair: base (run {event.base}) and {event.label} (run {event.run}); see "
                    "Divergence and Compare")

    @on(LaunchPanel.Notice)
    def _notice(self, event: LaunchPanel.Notice) -> None:
        self.notify(event.text, severity=event.severity)

    # --- writing, in worker threads
    # ------------------------------------------------------------
    def notify(self, message: str, *, title: str = "", severity: Any = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Every notification is plain text: messages carry names, paths and values from
        data. Control characters are shown escaped; newlines stay."""
        text = shown_lines(str(message)[:2000])
        super().notify(text, title=title, severity=severity, timeout=timeout, markup=False)

    def writable(self, what: str) -> bool:
        """Whether this session takes writes; if not, the user is told `what` did not
        happen and why."""
        if self.writer is None:
            self.notify(f"{what}: the session is still opening", severity="warning")
            return False
        if self.writer.readonly:
            self.notify(f"{what}: this session is read-only (view and export only)",
                        severity="warning")
            return False
        return True

    def write(self, fn: Callable[[SessionStore, Supervisor], Any],
              then: Callable[[Any], None] | None = None, failed: str = "",
              reread: bool = False) -> None:
        """Runs `fn(store, supervisor)` in the writer's thread, after the writes asked before
        (also those asked just before the app quits: closing waits for them); `then(result)`
        back on the UI thread. A failure becomes a notification (an unexpected one with its
        type, even where no `failed` words were given). `reread`: the change is one the
        poller's incremental read does not see (a rename, a delete)."""
        poller = self.poller
        assert self.writer is not None, "write before the session is open"

        def job(store: SessionStore, sup: Supervisor) -> None:
            try:
                result = fn(store, sup)
            except (SessionError, OSError, ConfigError, BadInput) as e:
                if failed:
                    self.answer(self.notify, f"{failed}: {e}", severity="error", timeout=12)
                return
            except Exception as e:  # noqa: BLE001 - a fault of ours: said, never silent
                self.answer(self.notify, f"{failed or 'a change to the session failed'}: "
                            f"{type(e).__name__}: {shown(e, 200)}", severity="error",
                            timeout=12)
                return
            if then is not None:
                self.answer(then, result)
            poller.reread() if reread else poller.wake()

        self.writer.submit(job)

    def answer(self, callback: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """From the writer's thread: `callback` on the UI thread, unless the app has gone
        (a write that finished as the app closed)."""
        if not self.is_running:
            return
        try:
            self.call_from_thread(callback, *args, **kwargs)
        except RuntimeError:        # it stopped in between: no app to answer to any more
            pass

    # --- keys: the panels', the session's, the tabs', the form's, help ---------------------
    def selected(self) -> Any:
        """The run under the cursor (said when there is none)."""
        if self.cursor_run in self.runs:
            return self.runs[self.cursor_run]
        self.notify("no run selected", severity="warning")

    def ours(self, run_id: int | None) -> bool:     # its child, started here, is alive
        return run_id is not None and self.writer.supervisor.starting_cached(run_id)

    def training(self, run: Any) -> bool:   # training now, or about to (ours, still created)
        return run.status == "running" or (run.status == "created" and self.ours(run.id))

    def activate_tab(self, tab: str) -> None:
        self._tabs().active = tab

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """A tab's keys only where that tab is shown (elsewhere the keys are free)."""
        if action == "panel" and self.panel(TabbedContent) is not None and \
                KEYED[str(parameters[0])] in TAB_PANELS:
            return self._tabs().active == KEYED[str(parameters[0])].TAB
        return True

    async def action_panel(self, name: str, action: str, *args: Any) -> None:
        """A panel's key (panel_keys): the panel's action."""
        panel = self.panel(KEYED[name])
        if panel is not None:
            await panel.run_action(f"{action}({', '.join(map(repr, args))})")

    def action_scroll_pane(self, how: str) -> None:
        """PANE_KEYS: the tab's pane scrolls where the focus takes no such key."""
        if (pane := active_scroller(self)) is not None:
            getattr(pane, f"scroll_{how}")(animate=False)

    def action_session(self, what: str) -> None:
        """ctrl+e, ctrl+s, ctrl+o (ui/session_keys.py)."""
        getattr(self.session_keys, what)()

    async def action_quit(self) -> None:
        """ctrl+q: quits, asking first what becomes of live runs (ui/session_keys.py)."""
        self.session_keys.quit()

    async def _panel_command(self, cls: type, action: str) -> None:
        """A panel's palette entry (its COMMANDS): the panel mounted first where its tab was
        never shown."""
        if self.panel(cls) is None and cls in TAB_PANELS:
            await self._show_tab(cls.TAB)
        if (panel := self.panel(cls)) is not None:
            await panel.run_action(action)

    def action_show_tab(self, tab: str) -> None:
        """Shows the tab; where the focus was inside the tab left, it goes into the tab shown
        (to its first widget that takes keys, else the tab strip). Left in a hidden pane,
        the focus moved to that pane's next widget and TabbedContent showed its pane again:
        ctrl+t did nothing from Compare's tables (issue 55)."""
        tabs = self._tabs()
        focused = self.focused
        inside = focused is not None and any(isinstance(a, TabPane) for a in focused.ancestors)
        if inside:
            tabs.query_one(ContentTabs).focus()
            self._focus_tab = tab           # (once its panel is mounted: _tab)
        tabs.active = tab

    def _focus_into(self, tab: str) -> None:
        takes_keys = [w for w in self._tabs().get_pane(tab).query("*")
                      if w.can_focus and not w.disabled and w.styles.display != "none"]
        first = next((w for w in takes_keys if isinstance(w, DataTable)),
                     takes_keys[0] if takes_keys else None)
        if first is not None:
            first.focus()

    def action_next_tab(self) -> None:
        self.action_show_tab(TAB_IDS[(TAB_IDS.index(self._tabs().active) + 1)
                                     % len(TAB_IDS)])

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

    def action_help(self) -> None:
        self.push_screen("help")

    async def _mount_form(self) -> None:
        await self.query_one(LaunchPanel).mount_form()
        # The whole screen is built: the cycle collector's full walks happen here from now
        # on (ui/heap), between keys; once it is painted, the form's background work starts.
        self.call_after_refresh(self._tidy_heap)
        self.call_after_refresh(self.query_one(LaunchPanel).start_background)
        self.set_interval(heap.QUIET_S, self._tidy_heap)

    async def on_unmount(self) -> None:
        heap.release()
        self.poller.stop()
        if self.warm is not None:       # runs it forked go on: process groups of their own
            self.warm.close()
        if self.writer is not None:
            # The writes asked before (a Stop from the quit dialog), the last screen state,
            # and the close, in a thread the closing app waits for.
            await asyncio.to_thread(self.writer.close,
                                    self._state_text if self._save_pending else None)


def run_app(session_dir: Path | None) -> int:
    """The dashboard, until it quits. SessionError when the session given cannot open."""
    app = TrainerApp(session_dir)
    app.run()
    if app.refused is not None:
        raise app.refused
    return app.return_code or 0
