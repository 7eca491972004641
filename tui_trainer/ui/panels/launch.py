"""The launch panel: a preset, a name, the form, Start.

It owns the form and the presets (loading one, saving the form as one: files, through
core.settings.presets), what this machine can run (probed once, in a child process), and
Start (F2, bound by the app wherever the focus is: its APP_KEYS): a valid config, checked
against this machine, is started by the supervisor through `app.write`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Callable

from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Button, Select, Static

from ...core.settings.config import (DEFAULTS, ConfigError, RunConfig, allowed, doc,
                                     read_toml)
from ...core.errors import BadInput
from ...core.analysis import prices
from ...core.settings import fit
from ...core.settings import machine as machines
from ...core.settings.hardware import this_cpu
from ...core.settings import user_data, user_models
from ...core.settings.config import absolute_paths, is_file_model
from ...core.settings.machine import Machine
from ...core.settings import presets
from ...core.settings.toml_text import to_toml
from ...core.text import name_problem, shown
from ..screens import ConfirmScreen, NameScreen
from ..widgets.config_form import ConfigForm
from ..widgets.inputs import Input
from .common import plain


# How often the form looks whether a study kept new prices (a stat of their file)
PRICES_EVERY_S = 2.0
# How long a Start waits for the launcher still importing torch (then it starts cold)
LAUNCHER_WAIT_S = 60.0


def preset_options() -> list[tuple[Any, str]]:
    return [("defaults", "")] + [(plain(p.label), str(p.path)) for p in presets.presets()]


class KnobSearch(Input):
    """The knob search box: typing filters the form (LaunchPanel._search); enter or down go
    to the first match; escape clears the search. Only those keys move the focus, and the
    keys typed after them reach the knob gone to (`_on_key`)."""

    BINDINGS = [Binding("down", "go", "First match", show=False),
                Binding("escape", "clear", "Clear search", show=False)]

    def action_go(self) -> None:
        self.query_ancestor(LaunchPanel).go_to_match()

    async def action_submit(self) -> None:
        self.action_go()

    async def _on_key(self, event: events.Key) -> None:
        """Keys typed in a burst after enter were already on their way here when the focus
        moved to the knob (the App hands each key to the widget focused when it reads it):
        they go on to the knob, in order (issue 55: "300" typed fast under load after
        enter landed in this box, and the knob kept its old value)."""
        focused = self.app.focused      # (has_focus follows only once the blur arrives)
        if focused is not None and focused is not self:
            event.stop()
            event.prevent_default()
            focused.post_message(events.Key(event.key, event.character))
            return
        if event.key in ("enter", "down"):
            # here, in the keys' order: as a binding it ran after the keys behind it
            event.stop()
            event.prevent_default()
            self.action_go()
            return
        await super()._on_key(event)

    def action_clear(self) -> None:
        self.value = ""


class LaunchPanel(Vertical):
    APP_KEYS = [Binding("f2", "start", "Start")]
    COMMANDS = [("Start run", "Start a run with the form's config", "start"),
                ("Fit to this machine", "tui-trainer fit from the form's config: each speed "
                 "knob priced here, the result proved and saved as the preset fastest-here",
                 "fit"),
                ("Save preset", "Save the form's config as a preset of your own", "save")]

    class Notice(Message):
        """Something to tell the user (a preset loaded, a refusal)."""
        def __init__(self, text: str, severity: str = "information") -> None:
            self.text, self.severity = text, severity
            super().__init__()

    class FormChanged(Message):
        def __init__(self, values: dict[str, Any]) -> None:
            self.values = values
            super().__init__()

    def compose(self) -> ComposeResult:
        # Compact widgets, one line each: the form keeps the height (a drawer at 80x24).
        with Horizontal(id="launch-bar"):
            yield Select(preset_options(), prompt="preset", id="preset", compact=True)
            yield Input(placeholder="run name (optional)", id="run-name", compact=True)
        with Horizontal(id="launch-buttons"):
            yield Button("Start (F2)", id="start", variant="success", compact=True)
            yield Button("Save preset", id="save-preset", compact=True)
            yield KnobSearch(placeholder="find a knob… (enter: go to it)", id="knob-search",
                             compact=True)
        yield Static("machine: checking…", id="machine")
        yield Static("", id="form-status")
        # The form's 38 knobs are mounted once the first screen is drawn (`mount_form`): the
        # screen shows at once; until then the form works on the values it was given.
        yield Static("loading the form…", id="form-loading")
        yield Static("", id="knob-help")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._form = ConfigForm(id="form")
        self._form_asked = False
        self._loaded: dict[str, str] | None = None   # the fields as last loaded, not typed
        self._chosen: list[fit.Choice] = []   # what the last preset chose for this machine
        self._prices_seen: int | None = None  # the prices' file as last read (its mtime)
        self._presets_seen: int | None = -1    # the user's presets folder (its mtime; -1:
        #                                         not looked at yet)

    async def mount_form(self) -> None:
        if not self._form_asked:
            self._form_asked = True
            await self.query_one("#form-loading").remove()
            await self.mount(self._form, before=self.query_one("#knob-help"))
            search = self.query_one("#knob-search", Input).value
            if search.strip():          # typed before the form was there
                self._show_matches(search)

    @property
    def form(self) -> ConfigForm:
        return self._form

    def set_machine(self, machine: Machine | None, error: str | None = None) -> None:
        """What this machine can run, once probed; the form is checked against it. (The
        probe's answer may come while the app closes, its widgets already removed: then
        there is nothing to show it on.)"""
        self.form.machine = machine
        for label in self.query("#machine").results(Static):
            label.update(Text(f"machine: {shown(machine.line(), 300)}" if machine else
                              f"machine: not known ({shown(error or '?', 120)})"))
        self.form.recheck()

    def _machine_for(self, preset: str) -> Machine | None:
        """The machine a preset's knobs are chosen for: the probed one, or, before the probe
        answers, this processor alone for a preset of the CPU (read at once, no torch)."""
        if self.form.machine is not None:
            return self.form.machine
        try:
            device = str(read_toml(preset).get("device", DEFAULTS.device))
        except ConfigError:
            return None
        return machines.Machine(cpu=this_cpu()) if device == "cpu" else None

    def reload_presets(self) -> None:
        """The preset list read again, the one chosen still chosen (without loading it again:
        a list re-read after a save showed no preset, and a test's choice was lost)."""
        select = self.query_one("#preset", Select)
        chosen, options = select.value, preset_options()
        with self.prevent(Select.Changed):
            select.set_options(options)
            if any(v == chosen for _, v in options):
                select.value = chosen

    def set_config(self, config: dict[str, Any]) -> None:
        self.form.set_config(config)
        self._loaded = self.form.texts()

    @on(Select.Changed, "#preset")
    def _preset_chosen(self, event: Select.Changed) -> None:
        event.stop()
        if not isinstance(event.value, str):      # the blank prompt, e.g. after set_options
            return
        try:
            cfg, chosen = fit.load_fitted(event.value, machine=self._machine_for(event.value),
                                          probe=False, measured=self.form.prices) \
                if event.value else (DEFAULTS, [])
        except ConfigError as e:
            self.post_message(self.Notice(f"preset not loaded: {e}", "error"))
            return
        before, loaded = self.form.texts(), self._loaded
        self._chosen = chosen
        self.form.chosen = {c.key: c for c in chosen}        # (said at their fields)
        self.set_config(cfg.to_dict())
        after = self.form.texts()
        name = next((p.label for p in presets.presets() if str(p.path) == event.value),
                    "defaults")
        # Never silently: the user's edits it replaced (values typed since the form was
        # last loaded) by name, first; then how many other values it changed.
        changed = [k for k in after if before.get(k) != after[k]]
        edits = [k for k in changed if loaded is None or before.get(k) != loaded.get(k)]
        others = len(changed) - len(edits)
        self.post_message(self.Notice(
            f"preset {shown(name, 60)} loaded"
            + ("; it replaced your edit(s): " + ", ".join(
                f"{k} {shown(before[k], 30)} → {shown(after[k], 30)}" for k in edits)
               if edits else "")
            + (f"; {others} other value(s) changed" if others else "")
            + ("; the form already held its values" if not changed else "")
            + "".join(f"; {c.line()}" for c in chosen)))

    @on(Input.Changed, "#knob-search")
    def _search(self, event: Input.Changed) -> None:
        """Filters the form as the user types; the focus stays in the search box."""
        event.stop()
        self._show_matches(event.value)

    def _show_matches(self, text: str) -> None:
        keys = self.form.filter(text)
        help_line = self.query_one("#knob-help", Static)
        if not text.strip() or not self.form.ready:
            help_line.update("")
        elif not keys:
            help_line.update(Text(f"no knob matches {shown(text, 40)!r}"))
        else:
            more = f"{len(keys)} knobs match; " if len(keys) > 1 else ""
            help_line.update(Text.assemble(
                (f"{more}enter or ↓: go to {keys[0]}", "italic"), "\n",
                self._explanation(keys[0])))

    def go_to_match(self) -> None:
        """Enter or down in the search: the focus to the first matching knob, now."""
        text = self.query_one("#knob-search", Input).value
        # filtered here, not only as typed: in a burst, enter comes before the box's change
        # messages have filtered the form
        keys = self.form.filter(text) if text.strip() else []
        if keys:
            self.form.focus_knob(keys[0])

    @staticmethod
    def _explanation(key: str) -> Text:
        default = DEFAULTS.to_dict()[key]
        return Text.assemble((key, "bold"), f"  ({allowed(key)}; default {default})\n",
                             doc(key))

    @on(ConfigForm.Focused)
    def _explain(self, event: ConfigForm.Focused) -> None:
        self.query_one("#knob-help", Static).update(self._explanation(event.key))

    @on(ConfigForm.Changed)
    def _form_changed(self, event: ConfigForm.Changed) -> None:
        bad = event.problems
        self.query_one("#start", Button).disabled = bool(bad)
        self.query_one("#form-status", Static).update(
            Text(f"✗ {len(bad)} invalid: {', '.join(bad)}") if bad else "")
        values, _ = self.form.raw_values()
        self.post_message(self.FormChanged(values))

    def settle(self, snap: Any) -> None:
        """A run Start made that its process refused before its first step (the model
        cannot take the data's images, say): removed by it, as `run` stores nothing, and
        said here at the field it names, in the line `run` says (the field stays marked
        until its value changes)."""
        sup = self.app.writer.supervisor if self.app.writer is not None else None
        while sup is not None and sup.refused:
            run_id, line, config = sup.refused.pop(0)
            key, _, why = line.removeprefix("bad config: ").partition(": ")
            if isinstance(config, dict) and key in config and why:
                self.form.refuse(key, config[key], why)
            self.app.notify(f"not started (run {run_id} removed, nothing stored): {line}",
                            severity="error", timeout=15)
            self.app.poller.reread()        # its row is gone: the table reads it whole

    @on(Button.Pressed, "#start")
    def ask_start(self) -> None:
        problems = self.form.validate()
        if problems:
            key = next(iter(problems))
            self.post_message(self.Notice(f"not started: {key}: {problems[key]}", "error"))
            return
        name = self.query_one("#run-name", Input).value.strip() or None
        problem = name and name_problem(name)
        if problem:
            self.post_message(self.Notice(f"not started: the run name {problem}", "error"))
            return
        self.start_run(self.form.config().to_dict(), name)

    def action_start(self) -> None:
        if self.app.writable("not started"):
            self.ask_start()

    def start_run(self, config: dict[str, Any], name: str | None) -> None:
        """The form's valid config: checked against this machine, then started by the
        supervisor; the cursor goes to the new run."""
        app = self.app
        if not app.writable("not started"):
            return

        def started(run_id: int) -> None:
            app.cursor_run = run_id
            app.notify(f"run {run_id} started")

        self._start_checked(config, name, started)

    @work(thread=True, group="write")
    def _start_checked(self, config: dict[str, Any], name: str | None,
                       started: Callable[[int], None]) -> None:
        """Start, once core.settings.machine's rules say this machine can train the config
        (the machine is probed once, in a child process; the UI never imports torch), and,
        for a net of the user's own file, once this user trusts its content (asked the
        first time, naming the file and its hash: `_ask_trust`; the file is read and hashed
        here, never imported: only the run's process runs it)."""
        app = self.app
        user_data.name_in(config)   # a folder of images in the form: named by this user
        if is_file_model(config.get("model")):
            try:
                path = user_models.resolve(user_models.parse(config["model"])[0])
                _, sha = user_models.read(path)
            except BadInput as e:
                app.call_from_thread(app.notify, f"not started: {e}", severity="error",
                                     timeout=12)
                return
            if not user_models.is_trusted(sha):
                app.call_from_thread(self._ask_trust, path, sha, config, name, started)
                return
        try:
            found = machines.problem(config, machines.facts())
        except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as e:
            found = None        # not known: the run's own check still refuses it
            app.call_from_thread(app.notify, f"the machine check failed ({e}); starting "
                                 "anyway", severity="warning")
        if found is not None:
            app.call_from_thread(app.notify, f"not started: {found}", severity="error",
                                 timeout=12)
            return
        warm = app.warm
        if warm is not None and warm.starting():
            # A run started cold now imports torch beside the launcher's own imports, both
            # slower for it (13 s to the first point on a 2-core AVX2 EPYC, against about
            # 1 s once it is ready): it is created and forked the moment the launcher is.
            app.call_from_thread(app.notify, "starting as soon as the launcher has imported "
                                 "torch (it forks a run in a fraction of a second)",
                                 timeout=8)
            warm.wait_ready(LAUNCHER_WAIT_S)
        chosen = fit.still_chosen(self._chosen, config)     # a value changed since: theirs
        app.call_from_thread(app.write, lambda _, sup: sup.start(config, name=name,
                                                                 chosen=chosen),
                             started, "not started")

    def _ask_trust(self, path: Path, sha: str, config: dict[str, Any], name: str | None,
                   started: Callable[[int], None]) -> None:
        """The first Start of a net of the user's own file: may its code run here?"""
        def decided(yes: bool | None) -> None:
            if not yes:
                self.app.notify(f"not started: {shown(path, 200)} is not trusted",
                                severity="warning")
                return
            try:
                now = user_models.trust(path)
            except BadInput as e:
                self.app.notify(f"not started: {e}", severity="error", timeout=12)
                return
            if now != sha:          # changed while the question was up: ask again
                self._ask_trust(path, now, config, name, started)
                return
            self._start_checked(config, name, started)

        self.app.push_screen(ConfirmScreen(
            f"Run the code of {shown(path, 200)}? (sha256 {sha[:16]}...) It runs in the "
            "run's training process, never in the dashboard, and is trusted on this machine "
            "as it is now: a changed file is asked about again.", "Trust and start"),
            decided)

    def start_background(self) -> None:
        """Once the first screen (the form included) is painted: what this machine can run,
        probed, and the warm launcher's imports, each in a process of its own (started
        with the form's mount, on 2 cores they slowed the first screen by 0.12 s)."""
        self.probe_machine()
        if self.app.warm is not None:
            self.app.warm.start()       # a Popen: the imports happen in that process

    @work(thread=True, group="machine")
    def probe_machine(self) -> None:
        """What this machine can run, asked once of a child process; the form is checked
        against it (set_machine)."""
        try:
            m, error = machines.facts(), None
        except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as e:
            m, error = None, str(e)
        try:
            self._prices_seen = prices.path().stat().st_mtime_ns
        except OSError:
            self._prices_seen = 0
        measured = prices.read()        # the knobs' prices measured here (a file)

        def show() -> None:     # (none to show it on once the app closes)
            if self.is_attached:
                self.form.prices = measured
                self.set_machine(m, error)

        self.app.call_from_thread(show)

    def action_fit(self) -> None:
        """The machine fit of the form's config, in the background (its studies show in the
        A/B tab as they train; the preset appears in the list once it is written)."""
        cfg = self.config_or_none()
        if cfg is None or not self.app.writable("fit not started"):
            return
        sets = [f"{k}={'none' if v is None else v}" for k, v in cfg.to_dict().items()
                if v != getattr(DEFAULTS, k)]

        def started(proc: Any) -> None:
            self.app.notify(f"fit started from the form's config (pid {proc.pid}): each speed "
                            "knob priced by a study in the A/B tab, then the result proved; "
                            "the preset fastest-here appears in the presets when it is "
                            "written (its log: logs/fit.log)", timeout=12)

        def fit_it(_: Any, sup: Any) -> Any:
            # A net of a file runs only once this user trusts it (Start asks; the fit's
            # command would take the file as named by its user): asked there first
            if is_file_model(cfg.model):
                path = user_models.resolve(user_models.parse(cfg.model)[0])
                if not user_models.is_trusted(user_models.read(path)[1]):
                    raise BadInput(f"{shown(path, 200)} is not trusted yet: Start it once "
                                   "(F2 asks), or `tui-trainer trust FILE`")
            return sup.fit(sets)

        self.app.write(fit_it, started, "fit not started")

    def on_mount(self) -> None:
        self.set_interval(PRICES_EVERY_S, self.prices_changed)

    def prices_changed(self) -> None:
        """Every PRICES_EVERY_S: where the prices' file changed (a study of this dashboard or of
        another shell ended), read it again in a worker and show its prices at the knobs.
        (A stat here, on the UI thread; the file is read in the worker.)"""
        try:
            mine = presets.user_dir().stat().st_mtime_ns
        except OSError:
            mine = None
        if mine != self._presets_seen:
            if self._presets_seen != -1:
                self.reload_presets()      # (a fit's preset, or one saved elsewhere)
            self._presets_seen = mine
        try:
            stamp = prices.path().stat().st_mtime_ns
        except OSError:
            return
        if self._prices_seen is not None and stamp != self._prices_seen:
            self._reread_prices()
        self._prices_seen = stamp

    @work(thread=True, group="prices", exclusive=True)
    def _reread_prices(self) -> None:
        measured = prices.read()

        def show() -> None:
            if self.is_attached:
                self.form.prices = measured
                self.form.recheck()

        self.app.call_from_thread(show)

    def action_save(self) -> None:
        self.save_preset()

    @on(Button.Pressed, "#save-preset")
    def save_preset(self) -> None:
        cfg = self.config_or_none()
        if cfg is None:
            return

        def save(name: str | None) -> None:
            if not name:
                return
            problem = name_problem(name) or ("must be a name, not a path" if "/" in name
                                             else None)
            if problem:
                self.post_message(self.Notice(f"preset not saved: its name {problem}",
                                              "error"))
                return
            # (its relative paths made absolute: a preset's are relative to its folder)
            target = presets.save(name, to_toml(absolute_paths(cfg)))
            self.reload_presets()
            self.post_message(self.Notice(f"preset saved: {target}"))

        self.app.push_screen(NameScreen("Save the form's config as a preset named:"), save)

    def config_or_none(self) -> RunConfig | None:
        try:
            return self.form.config()
        except ConfigError as e:
            self.post_message(self.Notice(f"fix {e.key} first: {e.reason}", "error"))
            return None
