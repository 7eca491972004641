"""The dashboard: configure, launch, watch and compare runs over one session.

The app reads the session store (never torch): a timer polls at a fixed rate, reads only new
rows, and redraws only the panels that can be seen. Training happens in background processes
started through `core.supervisor`, so the dashboard stays responsive and runs outlive it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from rich.text import Text
from textual import on
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import (Button, DataTable, Footer, Header, Input, Log, Select,
                             Static, TabbedContent, TabPane)

from ..core import config as C
from ..core import study as ab
from ..core.figures import smooth
from ..core.divergence import config_diff, divergence, settings_diff
from ..core.repro import explain
from ..core.errors import ReadOnlySession
from ..core.paths import default_session_dir, sessions_dir, user_data_dir
from ..core.store import SessionError, SessionStore
from ..core.supervisor import Supervisor
from ..core.text import name_problem, shown, shown_line, shown_lines
from ..core.watch import Watcher
from .screens import ConfirmScreen, HelpScreen, NameScreen, OpenScreen, QuitScreen
from .widgets.config_form import ConfigForm
from .widgets.plots import COLOURS, MetricPlot, PlotGrid, Series

POLL_S = 0.5            # the store is read, and visible panels redrawn, twice a second
LOG_TAIL_BYTES = 64_000

RUN_COLUMNS = (("mark", " "), ("id", "id"), ("name", "name"), ("status", "status"),
               ("step", "step"), ("epoch", "epoch"), ("loss", "loss"), ("acc", "acc"),
               ("sps", "samples/s"), ("elapsed", "elapsed"))


def presets_dirs() -> list[Path]:
    """Where presets come from: the project's experiments/, then the user's own."""
    here = Path(__file__).resolve()
    candidates = [Path.cwd() / "experiments", here.parents[3] / "experiments",
                  user_data_dir() / "presets"]
    seen, out = set(), []
    for d in candidates:
        if d.is_dir() and d.resolve() not in seen:
            seen.add(d.resolve())
            out.append(d)
    return out


def study_files() -> list[Path]:
    """The ready A/B studies: experiments/ab/*.toml and the user's own presets/ab/*.toml."""
    return [f for d in presets_dirs() for f in sorted((d / "ab").glob("*.toml"))]


def _num(x: float | None, spec: str = ".4f") -> str:
    return "-" if x is None else format(x, spec)


def plain(text: object, limit: int | None = 60) -> Text:
    """Text from data as a plain-text cell or label: never markup, control characters
    shown escaped, cut to `limit`."""
    return Text(shown(text, limit), no_wrap=True, end="")


# Statuses that end a run, and how the dashboard announces them.
ENDED = {"finished": "information", "stopped": "information", "crashed": "error",
         "diverged": "warning"}


def _elapsed(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class TrainerApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "tui-trainer"

    BINDINGS = [
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
        Binding("f1", "help", "Help"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(self, session_dir: Path | None = None, poll: bool = True) -> None:
        super().__init__()
        self.session_dir = Path(session_dir or default_session_dir()).expanduser().resolve()
        self.poll_enabled = poll
        self.marked: list[int] = []
        self.pair: list[int] = []
        self.cursor_run: int | None = None
        self._log_run: int | None = None
        self._log_offset = 0
        self._drawn: dict[str, Any] = {}
        self.study_shown: int | None = None
        self._await_twin: tuple[int, int] | None = None   # (run, newest run id at the time)
        self._open(self.session_dir)

    # --- session ---------------------------------------------------------------------------
    def _open(self, directory: Path) -> None:
        store = None
        try:
            store = SessionStore(directory)
            store.touch()
        except ReadOnlySession:
            if store is not None:
                store.close()
            # Viewing needs no writes: a session on a read-only disk opens for looking.
            store = SessionStore(directory, create=False, readonly=True)
        self.store = store
        self.session_dir = self.store.dir
        self.supervisor = Supervisor(self.store)
        self.watcher = Watcher(self.store)
        self._statuses: dict[int, str] = {}
        self.sub_title = shown(self.session_dir, 120) + (" (read-only)" if store.readonly
                                                          else "")

    def notify(self, message: str, *, title: str = "", severity: Any = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Every notification is plain text: messages carry names, paths and values from
        data. Control characters are shown escaped; newlines stay."""
        text = shown_lines(str(message)[:2000])
        super().notify(text, title=title, severity=severity, timeout=timeout, markup=False)

    def _writable(self, what: str) -> bool:
        if self.store.readonly:
            self.notify(f"{what}: this session is read-only (view and export only)",
                        severity="warning")
            return False
        return True

    def _save_state(self) -> None:
        if self.store.readonly:
            return
        state = {"marked": self.marked, "pair": self.pair, "cursor": self.cursor_run,
                 "tab": self.query_one("#tabs", TabbedContent).active,
                 "study": self.study_shown}
        self.store.set_meta("ui_state", json.dumps(state))

    def _restore_state(self) -> None:
        raw = self.store.meta("ui_state")
        state = json.loads(raw) if raw else {}
        ids = {r["id"] for r in self.store.runs()}
        self.marked = [r for r in state.get("marked", []) if r in ids]
        self.pair = [r for r in state.get("pair", []) if r in ids]
        self.cursor_run = state.get("cursor") if state.get("cursor") in ids else None
        studies = {s["id"] for s in self.store.studies()}
        self.study_shown = state.get("study") if state.get("study") in studies else \
            (max(studies) if studies else None)
        self._sync_study_options()
        if state.get("tab"):
            self.query_one("#tabs", TabbedContent).active = state["tab"]

    def switch_session(self, directory: Path) -> None:
        old = self.store
        try:
            self._open(directory)
        except SessionError as e:       # a damaged session: say so, keep the one open
            self.store = old
            self.notify(f"not opened: {e}", severity="error", timeout=15)
            return
        old.close()
        self.query_one("#runs", DataTable).clear()
        self._drawn.clear()
        self._log_run = None
        self._await_twin = None
        self._restore_state()
        self.refresh_all()

    # --- layout ----------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="left"):
                with Horizontal(id="launch-bar"):
                    yield Select(self._preset_options(), prompt="preset", id="preset")
                    yield Input(placeholder="run name (optional)", id="run-name")
                with Horizontal(id="launch-buttons"):
                    yield Button("Start (F2)", id="start", variant="success")
                    yield Button("Save preset", id="save-preset")
                yield Static("", id="form-status")
                yield ConfigForm(id="form")
            with Vertical(id="right"):
                table = DataTable(id="runs", cursor_type="row", zebra_stripes=True)
                for key, label in RUN_COLUMNS:
                    table.add_column(label, key=key)
                yield table
                with Horizontal(id="run-actions"):
                    yield Button("Stop (F3)", id="stop", variant="warning")
                    yield Button("Continue (F4)", id="continue")
                    yield Button("Repeat (F5)", id="repeat")
                    yield Button("Compare (F6)", id="compare")
                with TabbedContent(id="tabs"):
                    with TabPane("Plots", id="tab-plots"):
                        yield PlotGrid(id="plots")
                    with TabPane("Divergence", id="tab-divergence"):
                        yield Static("Mark two runs (space) or repeat one (F5).",
                                     id="verdict")
                        with Horizontal(classes="plot-row"):
                            yield MetricPlot("|Δloss| per step", "|Δloss|", id="plot-dloss")
                            yield MetricPlot("parameter distance", "L2", id="plot-pdist")
                    with TabPane("Compare", id="tab-compare"):
                        yield Static("", id="compare-title")
                        with Horizontal(id="compare-tables"):
                            yield DataTable(id="compare-config", cursor_type="row")
                            yield DataTable(id="compare-summary", cursor_type="row")
                        yield MetricPlot("loss, A and B", "loss", id="plot-compare")
                    with TabPane("A/B", id="tab-ab"):
                        with Horizontal(classes="ab-bar"):
                            yield Select([(f.stem, str(f)) for f in study_files()],
                                         prompt="ready study", id="ab-file")
                            yield Input(placeholder="vary: KEY=V1,V2 KEY=V1 ...", id="ab-vary")
                            yield Input(str(ab.DEFAULT_STEPS), placeholder="steps",
                                        id="ab-steps", type="integer")
                            yield Button("Run study", id="ab-start", variant="success")
                        with Horizontal(classes="ab-bar"):
                            yield Select([], prompt="study", id="ab-study")
                            yield Button("Stop study", id="ab-stop", variant="warning")
                            yield Button("Export (ctrl+e)", id="ab-export")
                        yield Static("The base is the form's config; each variant changes one "
                                     "key. Runs train one after the other.", id="ab-title")
                        yield DataTable(id="ab-table", cursor_type="row", zebra_stripes=True)
                    with TabPane("Log", id="tab-log"):
                        yield Log(id="log", max_lines=5000)
        yield Footer()

    def on_mount(self) -> None:
        self._restore_state()
        self.refresh_all()
        if self.poll_enabled:
            self.set_interval(POLL_S, self.refresh_all)

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
                ("Export", "PNG figures and CSVs of the runs, the pair or the A/B study shown",
                 self.action_export),
                ("Save session as", "Copy this session under a new name", self.action_save_as),
                ("Open session", "Open another session", self.action_open_session),
                ("Help", "Keys and panels", self.action_help)):
            yield SystemCommand(title, help_text, action)

    # --- presets ---------------------------------------------------------------------------
    def _preset_options(self) -> list[tuple[str, str]]:
        opts: list[tuple[Any, str]] = [("defaults", "")]
        for d in presets_dirs():
            for f in sorted(d.glob("*.toml")):
                opts.append((plain(f.stem if d.name == "experiments" else f"{f.stem} (mine)"),
                             str(f)))
        return opts

    @on(Select.Changed, "#preset")
    def _preset_chosen(self, event: Select.Changed) -> None:
        if not isinstance(event.value, str):      # the blank prompt, e.g. after set_options
            return
        try:
            cfg = C.load(event.value) if event.value else C.DEFAULTS
        except C.ConfigError as e:
            self.notify(f"preset not loaded: {e}", severity="error")
            return
        self.query_one(ConfigForm).set_config(cfg.to_dict())
        self.notify(f"preset {Path(event.value).stem if event.value else 'defaults'} loaded")

    @on(Button.Pressed, "#save-preset")
    def _save_preset(self) -> None:
        form = self.query_one(ConfigForm)
        try:
            cfg = form.config()
        except C.ConfigError as e:
            self.notify(f"fix {e.key} first: {e.reason}", severity="error")
            return

        def save(name: str | None) -> None:
            if not name:
                return
            problem = name_problem(name) or ("must be a name, not a path" if "/" in name
                                             else None)
            if problem:
                self.notify(f"preset not saved: its name {problem}", severity="error")
                return
            target = user_data_dir() / "presets" / f"{Path(name).stem}.toml"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(cfg.to_toml())
            self.query_one("#preset", Select).set_options(self._preset_options())
            self.notify(f"preset saved: {target}")

        self.push_screen(NameScreen("Save the form's config as a preset named:"), save)

    @on(ConfigForm.Changed)
    def _form_changed(self, event: ConfigForm.Changed) -> None:
        bad = event.problems
        self.query_one("#start", Button).disabled = bool(bad)
        self.query_one("#form-status", Static).update(
            f"✗ {len(bad)} invalid: {', '.join(bad)}" if bad else "")

    # --- actions ---------------------------------------------------------------------------
    def _selected_run(self) -> dict[str, Any] | None:
        if self.cursor_run is None:
            self.notify("no run selected", severity="warning")
            return None
        return self.store.run(self.cursor_run)

    @on(Button.Pressed, "#start")
    def action_start(self) -> None:
        if not self._writable("not started"):
            return
        form = self.query_one(ConfigForm)
        problems = form.validate()
        if problems:
            key = next(iter(problems))
            self.notify(f"not started: {key}: {problems[key]}", severity="error")
            return
        name = self.query_one("#run-name", Input).value.strip() or None
        problem = name and name_problem(name)
        if problem:
            self.notify(f"not started: the run name {problem}", severity="error")
            return
        run_id = self.supervisor.start(form.config().to_dict(), name=name)
        self.cursor_run = run_id
        self.notify(f"run {run_id} started")
        self._save_state()
        self.refresh_all()

    @on(Button.Pressed, "#stop")
    def action_stop(self) -> None:
        if not self._writable("not stopped"):
            return
        run = self._selected_run()
        if run is None:
            return
        if self.supervisor.stop(run["id"]):
            self.notify(f"stopping run {run['id']} after its current step")
        else:
            self.notify(f"run {run['id']} is not training", severity="warning")

    @on(Button.Pressed, "#continue")
    def action_continue_run(self) -> None:
        if not self._writable("not continued"):
            return
        run = self._selected_run()
        if run is None:
            return
        if self.store.is_live(run) or self.supervisor.starting(run["id"]):
            self.notify(f"run {run['id']} is still training", severity="warning")
            return
        restart = not self.store.usable_checkpoints(run["id"])
        if restart:
            def decided(yes: bool | None) -> None:
                if yes:
                    self._continue(run, restart=True)

            self.push_screen(ConfirmScreen(
                f"Run {run['id']} has no checkpoint to continue from. Train it again from "
                f"step 0? Its {run['step']} recorded steps are replaced as it goes.",
                "Restart from step 0"), decided)
            return
        self._continue(run)

    def _continue(self, run: dict[str, Any], restart: bool = False) -> None:
        overrides = {}
        try:
            form_cfg = self.query_one(ConfigForm).config().to_dict()
            for key in C.TRAINING_LENGTH_KEYS:
                if form_cfg[key] != C.DEFAULTS.to_dict()[key] and \
                        form_cfg[key] != run["config"].get(key):
                    overrides[key] = form_cfg[key]
        except C.ConfigError:
            pass
        self.supervisor.resume(run["id"], overrides, restart=restart)
        extra = f" with {overrides}" if overrides else ""
        self.notify(f"{'restarting' if restart else 'continuing'} run {run['id']}{extra}"
                    + (" from step 0" if restart else ""))

    @on(Button.Pressed, "#repeat")
    def action_repeat(self) -> None:
        if not self._writable("not repeated"):
            return
        run = self._selected_run()
        if run is None:
            return
        twin = self.supervisor.repeat(run["id"])
        self.pair = [run["id"], twin]
        self.marked = [run["id"], twin]
        self.notify(f"run {twin} started as a twin of run {run['id']}")
        self._save_state()
        self.refresh_all()

    @on(Button.Pressed, "#compare")
    def action_compare(self) -> None:
        pair = self._current_pair()
        if pair is None:
            self.notify("mark two runs with space (or repeat one) to compare them",
                        severity="warning")
            return
        self.pair = list(pair)
        self.query_one("#tabs", TabbedContent).active = "tab-compare"
        self._save_state()
        self.refresh_all()

    def _checkable(self) -> dict[str, Any] | None:
        """The run under the cursor, when it can be checked (it has trained and stopped)."""
        if not self._writable("not checked"):
            return None
        run = self._selected_run()
        if run is None:
            return None
        if self.store.is_live(run) or run["status"] == "created":
            self.notify(f"run {run['id']} is {run['status']}: check it once it has finished "
                        "or stopped", severity="warning")
            return None
        if run["step"] < 1:
            self.notify(f"run {run['id']} has no steps to compare", severity="warning")
            return None
        return run

    def _start_check(self, run: dict[str, Any], args: list[str], what: str) -> None:
        newest = max(r["id"] for r in self.store.runs())
        self.supervisor.job(["repro", "--run", str(run["id"]), *args, "--json"],
                            f"repro-run-{run['id']}")
        self._await_twin = (run["id"], newest)
        self.query_one("#tabs", TabbedContent).active = "tab-divergence"
        self.notify(f"{what} of run {run['id']}: training its twin; the verdict shows in the "
                    "Divergence tab")

    def action_verdict(self) -> None:
        run = self._checkable()
        if run is not None:
            self._start_check(run, [], "determinism verdict")

    def action_resume_check(self) -> None:
        run = self._checkable()
        if run is None:
            return
        if run["step"] < 2:
            self.notify(f"run {run['id']} is too short to kill in the middle", severity="warning")
            return
        last = run["step"] - 1

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
            self._start_check(run, ["--resume-at", str(step)], f"resume check at step {step}")

        self.push_screen(NameScreen(f"Resume check of run {run['id']}: kill a twin at step "
                                    f"(1 to {last}), resume it from its checkpoint, compare:",
                                    str(max(1, run["step"] // 2))), chosen)

    def action_export(self) -> None:
        active = self.query_one("#tabs", TabbedContent).active
        pair = self._current_pair()
        if active == "tab-ab":
            if self.study_shown is None:
                self.notify("no A/B study to export", severity="warning")
                return
            what, ids = "study", [self.study_shown]
        elif active in ("tab-divergence", "tab-compare") and pair:
            what, ids = "runs", list(pair)
        else:
            what, ids = "runs", self._plotted()
        if not ids:
            self.notify("nothing to export: select or mark runs", severity="warning")
            return
        self.notify(f"exporting {what} {', '.join(map(str, ids))} ...")
        self.run_worker(lambda: self._export(what, ids), thread=True, group="export")

    def _export(self, what: str, ids: list[int]) -> None:
        """In a worker thread, with its own connection (SQLite connections stay in their
        thread); matplotlib takes a second or two, the dashboard keeps polling meanwhile."""
        from ..core.export import export_runs, export_study
        try:
            with SessionStore(self.session_dir, create=False) as store:
                out = store.dir / "exports"
                files = export_study(store, ids[0], out) if what == "study" \
                    else export_runs(store, ids, out)
        except (SessionError, OSError) as e:
            self.call_from_thread(self.notify, f"export failed: {e}", severity="error")
            return
        names = ", ".join(f.name for f in files)
        self.call_from_thread(self.notify, f"exported {len(files)} files to {out}: {names}",
                              timeout=12)

    # --- A/B studies -----------------------------------------------------------------------
    def _sync_study_options(self) -> None:
        studies = self.store.studies()
        options = [(plain(f"{s['id']} {shown(s['name'], 40)} ({s['status']})", None), s["id"])
                   for s in studies]
        select = self.query_one("#ab-study", Select)
        if options != getattr(self, "_study_options", None):
            self._study_options = options
            with self.prevent(Select.Changed):
                select.set_options(options)
                if self.study_shown is not None:
                    select.value = self.study_shown

    @on(Select.Changed, "#ab-study")
    def _study_chosen(self, event: Select.Changed) -> None:
        if isinstance(event.value, int) and event.value != self.study_shown:
            self.study_shown = event.value
            self._save_state()
            self.refresh_panels()

    @on(Select.Changed, "#ab-file")
    def _study_file_chosen(self, event: Select.Changed) -> None:
        if not isinstance(event.value, str):
            return
        try:
            values, spec = ab.read_study_file(event.value)
            cfg = C.from_dict(values)
        except C.ConfigError as e:
            self.notify(f"study not loaded: {e}", severity="error")
            return
        self.query_one(ConfigForm).set_config(cfg.to_dict())
        self.query_one("#ab-vary", Input).value = " ".join(spec.get("vary", []))
        if spec.get("steps"):
            self.query_one("#ab-steps", Input).value = str(spec["steps"])
        self.notify(f"study {Path(event.value).stem} loaded: base config in the form, "
                    f"{spec.get('about', 'its variants in the vary field')}")

    @on(Button.Pressed, "#ab-start")
    def action_start_study(self) -> None:
        if not self._writable("study not started"):
            return
        vary_text = self.query_one("#ab-vary", Input).value
        steps_text = self.query_one("#ab-steps", Input).value.strip()
        try:
            base = self.query_one(ConfigForm).config()
            vary = ab.parse_vary(vary_text.split())
            if not steps_text.isdigit() or int(steps_text) < 1:
                raise C.ConfigError("steps", f"must be a whole number >= 1, got {steps_text!r}")
            variants, notes = ab.plan(base, vary, int(steps_text))
        except C.ConfigError as e:
            self.notify(f"study not started: {e}", severity="error")
            return
        file_value = self.query_one("#ab-file", Select).value
        name = Path(file_value).stem if isinstance(file_value, str) else \
            "+".join(k for k, _ in vary)
        study_id = self.store.create_study(
            "ab", name, {"vary": [[k, v] for k, v in vary], "steps": int(steps_text),
                         "notes": notes}, variants)
        self.supervisor.job(["ab", "--study", str(study_id)], f"study-{study_id}")
        self.study_shown = study_id
        self._sync_study_options()
        self._save_state()
        self.notify(f"A/B study {study_id} started: {len(variants)} runs of {steps_text} steps, "
                    "one after the other" + (f" ({'; '.join(notes)})" if notes else ""))
        self.refresh_panels()

    @on(Button.Pressed, "#ab-stop")
    def _stop_study(self) -> None:
        if self.study_shown is not None and self.supervisor.stop_study(self.study_shown):
            self.notify(f"stopping study {self.study_shown} (its current run writes a "
                        "checkpoint)")
        else:
            self.notify("no study running", severity="warning")

    @on(Button.Pressed, "#ab-export")
    def _export_study(self) -> None:
        self.action_export()

    @on(DataTable.RowSelected, "#ab-table")
    def _study_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a variant pairs it with the base, for the Divergence and Compare tabs."""
        if self.study_shown is None or event.row_key.value is None:
            return
        study = self.store.study(self.study_shown)
        base = study["variants"][0]["run_id"]
        run = study["variants"][int(event.row_key.value)]["run_id"]
        if base is None or run is None or run == base:
            return
        self.pair, self.marked, self.cursor_run = [base, run], [base, run], run
        self._save_state()
        label = study["variants"][int(event.row_key.value)]["label"]
        self.notify(f"pair: base (run {base}) and {label} (run {run}); see Divergence and "
                    "Compare")

    def _draw_study(self) -> None:
        title = self.query_one("#ab-title", Static)
        self._sync_study_options()
        if self.study_shown is None:
            return
        study = self.store.study(self.study_shown)
        runs = tuple((v["run_id"], self._runs.get(v["run_id"], {}).get("step"),
                      self._runs.get(v["run_id"], {}).get("status"), v["note"])
                     for v in study["variants"])
        if not self._fresh("study", (self.study_shown, study["status"], runs)):
            return
        study, rows = ab.table(self.store, self.study_shown)
        done = sum(1 for r in rows if r.status in ("finished", "skipped"))
        notes = "".join(f"\n{r.label}: {r.note}" for r in rows if r.note)
        title.update(Text(
            f"Study {study['id']} ({shown(study['name'])}): {study['spec']['steps']} steps "
            f"each, {study['status']}, {done} of {len(rows)} done. Figures in brackets: "
            "ratio to the base. Enter on a row pairs it with the base."
            + (f" {shown(study['message'], 300)}" if study["message"] else "")
            + shown_lines(notes)))
        table = self.query_one("#ab-table", DataTable)
        table.clear(columns=True)
        # Bit-identity right after the variant's name: it must not scroll out of sight.
        order = [0, len(ab.HEADINGS) - 1, *range(2, len(ab.HEADINGS) - 1), 1]
        table.add_columns(*(ab.HEADINGS[i] for i in order))
        for r in rows:
            cells = ab.row_cells(r)
            if r.note:                       # the whole note is under the title
                cells[-1] = "not run (see above)" if r.status == "skipped" else \
                    f"{cells[-1][:24]}… (see above)"
            table.add_row(*(plain(cells[i], 40) for i in order), key=str(r.position))

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_save_as(self) -> None:
        def save(name: str | None) -> None:
            if not name:
                return
            problem = name_problem(name)
            if problem:
                self.notify(f"not saved: the session name {problem}", severity="error")
                return
            target = Path(name).expanduser() if "/" in name else sessions_dir() / name
            try:
                new = self.store.copy_to(target)
            except SessionError as e:
                self.notify(str(e), severity="error")
                return
            live = self.supervisor.live_runs()
            self.switch_session(new)
            note = (f"; {len(live)} run(s) still training write to the original"
                    if live else "")
            self.notify(f"session saved as {new}{note}")

        self.push_screen(NameScreen("Save this session as (a name, or a path):",
                                    f"{self.session_dir.name}-copy"), save)

    def action_open_session(self) -> None:
        def opened(path: Path | None) -> None:
            if path is not None and path != self.session_dir:
                self.switch_session(path)
                self.notify(f"opened {path}")

        self.push_screen(OpenScreen(self.session_dir), opened)

    async def action_quit(self) -> None:
        live = self.supervisor.live_runs()
        studies = [s["id"] for s in self.store.studies() if s["status"] == "running"]
        if not live and not studies:
            self._save_state()
            self.exit()
            return

        def decided(choice: str | None) -> None:
            if choice == "cancel" or choice is None:
                return
            if choice == "stop":
                for study_id in studies:       # first, so that no study starts its next run
                    self.supervisor.stop_study(study_id)
                for run_id in live:
                    self.supervisor.stop(run_id)
            self._save_state()
            self.exit()

        self.push_screen(QuitScreen(live), decided)

    # --- run table and selection -------------------------------------------------------------
    def on_key(self, event: Any) -> None:
        table = self.query_one("#runs", DataTable)
        if event.key == "space" and self.focused is table and self.cursor_run is not None:
            rid = self.cursor_run
            self.marked = [r for r in self.marked if r != rid] if rid in self.marked \
                else self.marked + [rid]
            if len(self.marked) >= 2:
                self.pair = self.marked[-2:]
            self._save_state()
            self.refresh_all()
            event.stop()

    @on(DataTable.RowHighlighted, "#runs")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key is not None and event.row_key.value is not None:
            new = int(event.row_key.value)
            if new != self.cursor_run:
                self.cursor_run = new
                self._save_state()
                # Redraw now only what follows the cursor; the rest waits for the timer, so
                # moving through the table never costs a redraw of every plot.
                active = self.query_one("#tabs", TabbedContent).active
                if active == "tab-log" or (active == "tab-plots" and not self.marked):
                    self.refresh_panels()

    @on(TabbedContent.TabActivated)
    def _tab(self, event: TabbedContent.TabActivated) -> None:
        self._save_state()
        self.refresh_panels()

    def _current_pair(self) -> tuple[int, int] | None:
        if len(self.pair) == 2:
            return self.pair[0], self.pair[1]
        if len(self.marked) >= 2:
            return self.marked[-2], self.marked[-1]
        if self.cursor_run is not None:
            run = self.store.run(self.cursor_run)
            if run["twin_of"]:
                return run["twin_of"], run["id"]
            twins = [r["id"] for r in self.store.runs() if r["twin_of"] == run["id"]]
            if twins:
                return run["id"], twins[-1]
        return None

    def _plotted(self) -> list[int]:
        if self.marked:
            return self.marked[:len(COLOURS)]
        return [self.cursor_run] if self.cursor_run is not None else []

    # --- polling and drawing ---------------------------------------------------------------
    def refresh_all(self) -> None:
        self.supervisor.reap()
        if not self.store.readonly:
            self.store.reconcile()           # the explicit write that reading leaves out
        self._runs = {r["id"]: r for r in self.store.runs()}
        self._announce()
        if self._await_twin is not None:
            original, newest = self._await_twin
            twins = [rid for rid, r in self._runs.items()
                     if r["twin_of"] == original and rid > newest]
            if twins:
                self.pair, self.marked = [original, twins[0]], [original, twins[0]]
                self._await_twin = None
                self._save_state()
        self._sync_table()
        self.refresh_panels()

    def _announce(self) -> None:
        """A notification when a run seen training ends: finished, stopped, crashed (with
        the reason) or diverged (with the step)."""
        for rid, run in self._runs.items():
            before, now = self._statuses.get(rid), run["status"]
            self._statuses[rid] = now
            if before in ("created", "running") and now in ENDED:
                why = (run["summary"] or {}).get("error") or \
                    (run["summary"] or {}).get("diverged") or ""
                self.notify(f"run {rid} ({run['name']}) {now} at step {run['step']}"
                            + (f": {why}" if why else ""), severity=ENDED[now],
                            timeout=12 if now in ("crashed", "diverged") else 5)

    def _sync_table(self) -> None:
        table = self.query_one("#runs", DataTable)
        for rid, run in self._runs.items():
            last = self.store.last_step(rid) or {}
            last_eval = self.store.last_eval(rid) or {}
            summary = run["summary"] or {}
            status = run["status"]
            if status == "created" and self.supervisor.starting(rid):
                status = "starting"
            elif status == "created" and summary.get("error"):
                status = "crashed"
            acc = last_eval.get("accuracy")
            sps = summary.get("samples_per_s") or last.get("samples_per_s")
            texts = {
                "mark": "●" if rid in self.marked else "",
                "id": str(rid), "name": run["name"], "status": status,
                "step": str(run["step"]), "epoch": f"{run['epoch']:.2f}",
                "loss": _num(last.get("loss")),
                "acc": "-" if acc is None else f"{acc:.2%}",
                "sps": "-" if sps is None else f"{sps:,.0f}",
                "elapsed": _elapsed(summary.get("elapsed_s", last.get("elapsed"))),
            }
            # Every cell as plain Text: a str cell would be parsed as markup.
            cells = {k: plain(v, 40) for k, v in texts.items()}
            if status in ("crashed", "diverged"):
                cells["status"].stylize("bold red" if status == "crashed" else "bold yellow")
            key = str(rid)
            if key not in table.rows:
                table.add_row(*(cells[k] for k, _ in RUN_COLUMNS), key=key)
            else:
                for col, value in cells.items():
                    if table.get_cell(key, col) != value:
                        table.update_cell(key, col, value)
        if self.cursor_run is not None and str(self.cursor_run) in table.rows:
            index = table.get_row_index(str(self.cursor_run))
            if table.cursor_row != index:
                table.move_cursor(row=index)
        elif self.cursor_run is None and table.row_count:
            self.cursor_run = int(table.coordinate_to_cell_key((0, 0)).row_key.value)

    def refresh_panels(self) -> None:
        active = self.query_one("#tabs", TabbedContent).active
        watched = set(self._plotted())
        pair = self._current_pair()
        if pair:
            watched |= set(pair)
        changed = self.watcher.poll(sorted(watched))
        if active == "tab-plots":
            self._draw_plots(changed)
        elif active == "tab-divergence":
            self._draw_divergence(pair)
        elif active == "tab-compare":
            self._draw_compare(pair)
        elif active == "tab-log":
            self._draw_log()
        elif active == "tab-ab":
            self._draw_study()

    def _fresh(self, panel: str, key: Any) -> bool:
        """True when `panel` must be redrawn because what it shows changed."""
        if self._drawn.get(panel) == key:
            return False
        self._drawn[panel] = key
        return True

    def _label(self, rid: int) -> str:
        """A run as `id name`, safe to show (the name from data is escaped and cut)."""
        run = self._runs.get(rid)
        return f"{rid} {shown(run['name'], 30)}" if run else str(rid)

    def _draw_plots(self, changed: set[int]) -> None:
        runs = self._plotted()
        key = tuple((r, self.watcher.get(r).version) for r in runs)
        if not self._fresh("plots", key):
            return
        loss, sps, mem, timing, acc, lr = [], [], [], [], [], []
        for i, rid in enumerate(runs):
            s, colour, label = self.watcher.get(rid), COLOURS[i % len(COLOURS)], str(rid)
            xs, ys = s.column("loss")
            loss.append(Series(f"{rid}", xs, ys, colour))
            good = [y for y in ys if y is not None]
            if good:
                loss.append(Series(f"{rid} smooth", [x for x, y in zip(xs, ys, strict=True)
                                                     if y is not None], smooth(good),
                                   "white" if len(runs) == 1 else COLOURS[(i + 4) % 8]))
            sps.append(Series(label, *s.column("samples_per_s"), colour))
            xs, rss = s.column("rss_bytes")
            mem.append(Series(f"{label} RSS", xs, [v / 2**20 if v else None for v in rss],
                              colour))
            xs, cuda = s.column("cuda_peak")
            if any(cuda):
                mem.append(Series(f"{label} GPU peak", xs,
                                  [v / 2**20 if v else None for v in cuda], colour))
            timing.append(Series(f"{label} data", *s.column("data_s"), colour))
            timing.append(Series(f"{label} compute", *s.column("compute_s"),
                                 COLOURS[(i + 4) % len(COLOURS)]))
            evals = s.rows("evals")
            acc.append(Series(label, [e["step"] for e in evals],
                              [100 * e["accuracy"] for e in evals], colour))
            lr.append(Series(label, *s.column("lr"), colour))
        note = shown(", ".join(self._label(r) for r in runs), 80) or "no run selected"
        for pid, series in (("plot-loss", loss), ("plot-throughput", sps),
                            ("plot-memory", mem), ("plot-timing", timing),
                            ("plot-accuracy", acc), ("plot-lr", lr)):
            self.query_one(f"#{pid}", MetricPlot).show(series, note)

    def _draw_divergence(self, pair: tuple[int, int] | None) -> None:
        verdict = self.query_one("#verdict", Static)
        if pair is None:
            verdict.update("Mark two runs (space in the run table) or repeat one (F5) to see "
                           "how they diverge.")
            return
        a, b = self.watcher.get(pair[0]), self.watcher.get(pair[1])
        checks = self.store.events(pair[1], "repro_verdict")
        if not self._fresh("divergence", (pair, a.version, b.version, len(checks))):
            return
        d = divergence(a.rows("steps"), b.rows("steps"), a.rows("fps"), b.rows("fps"))
        names = f"A = {self._label(pair[0])}, B = {self._label(pair[1])}"
        # Assembled from plain pieces (bold where it is a tuple): nothing here is markup,
        # so names, settings and values from the session are always shown as text.
        parts: list[Any] = [names, ": "]
        if d.identical is None:
            parts.append("no common fingerprint yet.")
        elif d.identical:
            parts += [(f"bit-identical at all {len(d.fp_steps)} common fingerprints", "bold"),
                      f" (up to step {d.fp_steps[-1]})."]
        elif d.first_difference == 0:
            parts += [("not identical:", "bold"), " the parameters differ already at step 0 "
                      "(different initialisation: another seed, model or no seed at all)."]
        else:
            before = max(s for s in d.fp_steps if s < d.first_difference) \
                if d.first_difference != d.fp_steps[0] else None
            where = (f"identical at step {before}, different at step {d.first_difference}"
                     if before is not None else
                     f"different at step {d.first_difference}, the first step compared")
            parts += [("not identical:", "bold"), f" parameter hashes {where} "
                      f"({len(d.fp_steps)} fingerprints compared; a smaller fingerprint_every "
                      "narrows it down)."]
        parts += self._verdict_details(pair, d, checks)
        verdict.update(Text.assemble(*((shown_lines(p[0]), p[1]) if isinstance(p, tuple)
                                       else shown_lines(p) for p in parts)))
        self.query_one("#plot-dloss", MetricPlot).show(
            [Series("|Δloss|", d.steps, d.loss_delta, COLOURS[0])], names)
        self.query_one("#plot-pdist", MetricPlot).show(
            [Series("distance", d.fp_steps, d.param_distance, COLOURS[1])], names)

    def _verdict_details(self, pair: tuple[int, int], d: Any,
                         checks: list[dict[str, Any]]) -> list[Any]:
        """What follows the headline, as pieces for Text.assemble: the recorded check, how
        it grows, what can explain it."""
        parts: list[Any] = []
        mine = [c for c in checks if c["data"] and c["data"].get("runs") == list(pair)]
        if mine:
            data = mine[-1]["data"]
            result = ("identical", "bold") if data.get("identical") is True else \
                ("NOT identical", "bold")
            if data.get("mode") == "resume":
                parts += [f"\nResume check: B was killed at step {data.get('resume_at')} and "
                          "resumed from its checkpoint; after the resume it is ", result,
                          f" to A ({data.get('fingerprints_compared')} fingerprints "
                          "compared)."]
            else:
                parts += ["\nDeterminism verdict: B is a twin of A, trained again: ", result,
                          "."]
        elif (self._await_twin or (None,))[0] == pair[0] or any(
                self._runs.get(r, {}).get("status") in ("created", "running") for r in pair):
            parts.append("\nTraining: the verdict covers the steps both runs have reached so "
                         "far.")
        if d.identical is False:
            deltas = [(v, s) for s, v in zip(d.steps, d.loss_delta, strict=True)
                      if v is not None]
            dists = [(s, v) for s, v in zip(d.fp_steps, d.param_distance, strict=True)
                     if v is not None]
            grow = []
            if deltas:
                v, s = max(deltas)
                grow.append(f"largest |Δloss| {v:.4g} at step {s}" if v > 0 else
                            "the logged losses are still equal")
            if dists:
                grow.append(f"parameter distance {dists[-1][1]:.4g} at step {dists[-1][0]}")
            if grow:
                parts.append("\nHow it grows: " + "; ".join(grow) + ".")
            reasons = explain([self._runs[r] for r in pair if r in self._runs])
            parts.append("\nSettings that can explain it: " + (
                " • ".join(reasons) if reasons else "none of the known causes applies (same "
                "seed, deterministic settings, same threads): look at the Compare tab"))
        return parts

    def _draw_compare(self, pair: tuple[int, int] | None) -> None:
        title = self.query_one("#compare-title", Static)
        if pair is None:
            title.update("Mark two runs (space in the run table) to compare them.")
            return
        ra, rb = self._runs.get(pair[0]), self._runs.get(pair[1])
        if ra is None or rb is None:
            return
        a, b = self.watcher.get(pair[0]), self.watcher.get(pair[1])
        if not self._fresh("compare", (pair, a.version, b.version, ra["status"],
                                       rb["status"])):
            return
        title.update(plain(f"A = {self._label(pair[0])} ({ra['status']})    "
                           f"B = {self._label(pair[1])} ({rb['status']})", None))
        cfg_table = self.query_one("#compare-config", DataTable)
        cfg_table.clear(columns=True)
        cfg_table.add_columns("setting", "A", "B")
        diffs = config_diff(ra["config"], rb["config"])
        for key, va, vb in diffs:
            cfg_table.add_row(plain(key), plain(va), plain(vb))
        for key, va, vb, relevant in settings_diff(ra["settings"], rb["settings"]):
            if key == "data":
                continue
            cfg_table.add_row(plain(("⚠ " if relevant else "") + f"{key} (effective)"),
                              plain(va), plain(vb))
        if not cfg_table.row_count:
            cfg_table.add_row(plain("(same config)"), "", "")
        summary = self.query_one("#compare-summary", DataTable)
        summary.clear(columns=True)
        summary.add_columns("", "A", "B", "B/A")
        for label, va, vb, spec in self._summary_rows(ra, rb, a, b):
            ratio = (vb / va) if (va and vb is not None) else None
            summary.add_row(*(plain(v) for v in (label, _num(va, spec), _num(vb, spec),
                                                  _num(ratio, ".2f"))))
        xs_a, ys_a = a.column("loss")
        xs_b, ys_b = b.column("loss")
        self.query_one("#plot-compare", MetricPlot).show(
            [Series(f"A {self._label(pair[0])}", xs_a, ys_a, COLOURS[0]),
             Series(f"B {self._label(pair[1])}", xs_b, ys_b, COLOURS[1])], "loss")

    @staticmethod
    def _summary_rows(ra: dict, rb: dict, a: Any, b: Any) -> list[tuple]:
        def figures(run: dict, s: Any) -> dict[str, float | None]:
            steps = s.rows("steps")
            evals = s.rows("evals")
            summary = run["summary"] or {}
            peaks = [r.get("cuda_peak") or r.get("rss_bytes") or 0 for r in steps]
            return {
                "final loss": steps[-1]["loss"] if steps else None,
                "accuracy %": 100 * evals[-1]["accuracy"] if evals else None,
                "samples/s": summary.get("samples_per_s") or
                (steps[-1]["samples_per_s"] if steps else None),
                "peak memory MiB": max(peaks) / 2**20 if peaks else None,
                "wall time s": summary.get("elapsed_s") or (steps[-1]["elapsed"]
                                                           if steps else None),
            }
        fa, fb = figures(ra, a), figures(rb, b)
        specs = {"final loss": ".4f", "accuracy %": ".2f", "samples/s": ",.0f",
                 "peak memory MiB": ",.0f", "wall time s": ".2f"}
        return [(k, fa[k], fb[k], specs[k]) for k in fa]

    def _draw_log(self) -> None:
        log = self.query_one("#log", Log)
        rid = self.cursor_run
        if rid is None:
            return
        path = self.store.log_path(rid)
        if rid != self._log_run:
            log.clear()
            self._log_run = rid
            size = path.stat().st_size if path.exists() else 0
            self._log_offset = max(0, size - LOG_TAIL_BYTES)
        if not path.exists():
            return
        with open(path, "rb") as f:
            f.seek(self._log_offset)
            data = f.read()
        if data:
            cut = data.rfind(b"\n") + 1          # only whole lines; the rest comes next time
            if cut:
                # tqdm's carriage returns would overwrite lines: keep each line's last state.
                # Any other control character is shown escaped, never sent to the terminal.
                text = data[:cut].decode("utf-8", "replace")
                lines = [shown_line(line.rsplit("\r", 1)[-1])
                         for line in text.split("\n")[:-1]]
                log.write_lines(lines)
                self._log_offset += cut


def run_app(session_dir: Path | None) -> int:
    TrainerApp(session_dir).run()
    return 0
