"""The dashboard, driven with Textual's Pilot over real sessions, starting real training
processes on the shipped sample."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input, Select, Checkbox

from conftest import QUICK, click, db_rows, sets, tt, tt_popen
from tui_trainer.core.settings import machine
from tui_trainer.core.session.store import SessionStore
from tui_trainer.launcher.client import WARM_LINE
from tui_trainer.ui.app import TrainerApp
from tui_trainer.ui.poller import Polled
from tui_trainer.ui.panels.launch import LaunchPanel
from tui_trainer.ui.panels.plots import PlotsPanel
from tui_trainer.ui.panels.profile import ProfilePanel
from tui_trainer.ui.screens import MemoryScreen
from tui_trainer.ui.widgets.config_form import ConfigForm
from tui_trainer.ui.widgets.plots import MetricPlot

SIZE = (180, 55)
QUICK_FORM = dict(item.split("=") for item in QUICK)


async def until(pilot, predicate, timeout: float = 300.0, seen=None) -> None:
    """Lets the app run until predicate() holds (a real process is training meanwhile);
    at the timeout, the failure shows `seen()`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        pilot.app.refresh_all()
        if predicate():
            return
        await pilot.pause(0.2)
    raise AssertionError(f"timed out{'' if seen is None else f': {seen()}'}")


async def fill(pilot, values: dict[str, str]) -> None:
    form = pilot.app.query_one(ConfigForm)
    for key, value in values.items():
        widget = await form.field(key)
        if isinstance(widget, Input):
            widget.value = value
        elif isinstance(widget, Checkbox):
            widget.value = value in ("true", "on")
        elif isinstance(widget, Select):
            widget.value = value
    await pilot.pause()


def notifications(app) -> list[str]:
    """Every notification the app gives from now on, as text (they also show as usual)."""
    said: list[str] = []
    notify = app.notify
    app.notify = lambda message, **kw: (said.append(str(message)),  # type: ignore
                                        notify(message, **kw))
    return said


def status(session: Path, run_id: int) -> str | None:
    rows = db_rows(session, "SELECT status FROM runs WHERE id = ?", (run_id,))
    return rows[0][0] if rows else None


def cell(app, run_id: int, column: str) -> str:
    table = app.query_one("#runs", DataTable)
    if str(run_id) not in table.rows:
        return ""                       # not drawn yet
    return str(table.get_cell(str(run_id), column))


async def test_form_marks_invalid_fields_and_refuses_to_start(tmp_path):
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.app.ready()
        await fill(pilot, {"batch_size": "0", "lr": "fast"})
        form = app.query_one(ConfigForm)
        assert set(form.problems) == {"batch_size", "lr"}
        assert form.query_one("#box-batch_size").has_class("-invalid")
        assert ">= 1" in str(form.query_one("#error-batch_size").render())
        assert app.query_one("#start").disabled
        await pilot.press("f2")
        await pilot.pause()
        assert SessionStore(tmp_path).runs() == []         # nothing started
        await fill(pilot, {"batch_size": "32", "lr": "0.05"})
        assert form.problems == {} and not app.query_one("#start").disabled
        assert not form.query_one("#box-batch_size").has_class("-invalid")
        # A rule across fields is marked too.
        await fill(pilot, {"loader": "resident", "num_workers": "2"})
        assert "num_workers" in form.problems
        await fill(pilot, {"num_workers": "0"})
        # What this machine cannot run is refused at its key, before a run exists.
        await until(pilot, lambda: "machine: " in str(app.query_one("#machine").render())
                    and "checking" not in str(app.query_one("#machine").render()))
        if not machine.facts().cuda:
            await fill(pilot, {"device": "cuda", "amp": "off"})
            assert "device" in form.problems
            assert "no usable CUDA" in str(form.query_one("#error-device").render())
            assert app.query_one("#start").disabled
            await fill(pilot, {"device": "cpu", "amp": "fp16"})
            assert set(form.problems) == {"amp"}
            app.query_one(LaunchPanel).action_start()
            await pilot.pause(0.5)
            assert SessionStore(tmp_path).runs() == []


async def test_every_knob_is_in_the_form_with_its_explanation(tmp_path):
    from tui_trainer.core.settings import config
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.app.ready()
        form = app.query_one(ConfigForm)
        shown = lambda: str(app.query_one("#knob-help").render())  # noqa: E731
        for key in config.FIELDS:        # the focused knob is explained under the form
            (await form.field(key)).focus()
            await pilot.pause()
            # (bounded: on a loaded machine the focus event can land a pause later)
            await until(pilot, lambda: config.doc(key) in shown(), timeout=30,
                        seen=lambda: (key, shown()))
        assert isinstance(form.query_one("#field-pin_memory"), Checkbox)
        assert isinstance(form.query_one("#field-amp"), Select)
        assert isinstance(form.query_one("#field-batch_size"), Input)
        assert form.config() == config.DEFAULTS
        # One line per knob; values off their default are marked.
        assert form.query_one("#box-seed").size.height == 1
        form.query_one("#field-seed", Input).value = "7"
        await pilot.pause()
        assert form.query_one("#box-seed").has_class("-changed")
        assert not form.query_one("#box-lr").has_class("-changed")


async def test_a_closed_group_builds_its_fields_when_first_opened(tmp_path):
    """The first screen mounts the open group's fields only (a closed group's were a third
    of its time): a closed group's knobs keep their values (read, set, checked) until it
    opens, by a click, a search, a value set there or a refusal; its fields then show them."""
    from tui_trainer.core.settings import config
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await app.ready()
        form = app.query_one(ConfigForm)
        rows = lambda: {b.id.removeprefix("box-") for b in form.query(".field-row")}  # noqa
        of = lambda group: {k for k in config.FIELDS if config.group(k) == group}  # noqa
        assert rows() == of("reproducibility")
        assert form.config() == config.DEFAULTS and form.problems == {}
        # set while closed: its group opens, built from the value, marked as changed
        form.set_value("amp", "bf16")
        assert form.config().amp == "bf16"
        await pilot.pause(0.2)
        assert of("speed") <= rows() and form.query_one("#field-amp", Select).value == "bf16"
        assert form.query_one("#box-amp").has_class("-changed")
        assert not form.query_one("#group-speed").collapsed
        # opened by a click: its Selects read their values while they mount (not blank)
        await click(pilot, "#group-parallel CollapsibleTitle")
        assert form.validate() == {}, form.problems
        await pilot.pause(0.2)
        assert of("parallel") <= rows() and form.problems == {}
        assert form.config() == config.from_dict({**config.DEFAULTS.to_dict(), "amp": "bf16"})
        # a bad value refused in a closed group: opened, the field marked with the reason
        form.set_value("log_every", 0)
        await pilot.pause(0.2)
        assert "log_every" in form.problems and of("bookkeeping") <= rows()
        assert form.query_one("#box-log_every").has_class("-invalid")


async def test_a_group_being_built_as_the_app_closes_ends_quietly(tmp_path):
    """A group whose fields are removed before their mount is awaited (the dashboard quit
    as a search opened it): its knobs keep their held values and nothing
    raises (a Select never mounted read blank, its error had no parent to mount in: 5
    tests failed so in a clean-clone run, each as its app closed, while groups were still
    built in the background then)."""
    from tui_trainer.core.settings import config
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await app.ready()
        form = app.query_one(ConfigForm)
        for group in ("parallel", "speed", "bookkeeping"):
            form._build(group)
        # as the app closing does: the fields removed before their mount is awaited
        await form.query_one("#group-parallel").remove()
        await pilot.pause(0.2)
        assert form.config() == config.DEFAULTS and form.problems == {}


async def test_the_cycle_collector_walks_the_heap_only_between_keys(tmp_path):
    """ui/heap: Python's full collections walked the whole widget tree (55-270 ms while runs
    trained, a key waited for them). Once the form is up the heap is frozen and Python's own
    full collections are put off; the app tidies between keys (or when long overdue), and
    gives the collector back as it was when it ends (tests run many apps in one process)."""
    import gc

    from tui_trainer.ui import heap
    before = gc.get_threshold()
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.app.ready()
        await until(pilot, lambda: gc.get_freeze_count() > 10_000, timeout=120)
        assert gc.get_threshold()[2] == heap.FULL_RARELY
        # (No await in between: the app's own timer would tidy meanwhile.)
        due = app._tidy_heap.due = time.monotonic() - 0.1   # due, but a key just came: waits
        app.last_input = time.monotonic()
        app._tidy_heap()
        assert app._tidy_heap.due == due
        app.last_input = 0.0                # quiet: it runs, and the next is TIDY_EVERY_S on
        app._tidy_heap()
        assert app._tidy_heap.due > time.monotonic() + heap.TIDY_EVERY_S / 2
        due = app._tidy_heap.due = time.monotonic() - heap.MAX_DELAY_S - 1
        app.last_input = time.monotonic()   # keys keep coming, but it is long overdue
        app._tidy_heap()
        assert app._tidy_heap.due > due + heap.MAX_DELAY_S
        await pilot.press("f1")             # and keys still work
        await until(pilot, lambda: len(app.screen_stack) == 2, timeout=60)
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before


@pytest.mark.slow
async def test_the_knob_search_typed_at_human_speed_never_moves_the_focus_or_a_value(tmp_path):
    """Typed one key at a time with a person's pauses, the search filters the form and the
    focus stays in the box: no letter lands in a knob, Enter toggles nothing. Enter or Down
    goes to the first match, and only then do keys reach that knob."""
    from tui_trainer.core.settings import config
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.app.ready()
        form = app.query_one(ConfigForm)
        search = app.query_one("#knob-search", Input)
        help_line = app.query_one("#knob-help")

        async def type_slowly(text: str) -> None:
            for key in text:
                await pilot.press(key)
                await pilot.pause(0.15)        # about a person's pace between keys

        async def clear() -> None:
            search.focus()
            await pilot.press("escape")
            await pilot.pause(0.1)

        def shown_knobs() -> list[str]:
            return [k for k in config.FIELDS      # (a group never opened has no boxes yet)
                    if (box := form.query(f"#box-{k}")) and box.first().display]

        async def search_for(text: str, first: str) -> None:
            await clear()
            await type_slowly(text)
            assert app.focused is search and search.value == text, (text, app.focused)
            assert form.config() == config.DEFAULTS and form.problems == {}, text
            # every match shown, in the form's order; the likeliest first in the matches
            assert shown_knobs() == [k for k in config.FIELDS if k in form.matching(text)]
            assert form.matching(text)[0] == first
            assert form.query_one(f"#box-{first}").has_class("-match")
            assert config.doc(first) in str(help_line.render()), text

        for text, first in (("epo", "epochs"), ("lr", "lr"), ("cudnn_bench", "cudnn_benchmark"),
                            ("amp", "amp"), ("determ", "deterministic"),
                            ("pin_memory", "pin_memory")):
            await search_for(text, first)
        # Enter goes to the first match and toggles nothing; only then does a key reach it.
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert app.focused is form.query_one("#field-pin_memory")
        assert form.config() == config.DEFAULTS
        assert config.doc("pin_memory") in str(help_line.render())
        await search_for("num_w", "num_workers")
        await pilot.press("down")
        await pilot.pause(0.2)
        assert app.focused is form.query_one("#field-num_workers")
        assert "num_workers" in str(help_line.render()).split("\n")[0]
        await pilot.press("end", "backspace", "2")
        await pilot.pause(0.2)
        assert form.config().num_workers == 2 and form.config().num_threads == \
            config.DEFAULTS.num_threads
        # A search that matches nothing says so; clearing it shows every knob again.
        await clear()
        await type_slowly("zzz")
        assert shown_knobs() == [] and "no knob matches" in str(help_line.render())
        await clear()
        assert shown_knobs() == list(config.FIELDS) and search.value == ""


async def test_presets_load_into_the_form_and_the_form_saves_as_one(tmp_path, isolated_home):
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.app.ready()
        preset = app.query_one("#preset", Select)
        fastest = next(v for _, v in preset._options
                       if isinstance(v, str) and v.endswith("fastest-cpu.toml"))
        preset.value = fastest
        await pilot.pause()
        form = app.query_one(ConfigForm)
        from tui_trainer.core.settings.config import load
        from tui_trainer.core.settings.fit import load_fitted
        from tui_trainer.core.settings.hardware import this_cpu
        # its knobs chosen for this CPU (amp: bf16 where it has bf16 hardware, else off)
        shipped = load_fitted(fastest, machine=machine.Machine(cpu=this_cpu()))[0]
        assert form.config() == shipped and shipped.loader == "resident"
        await fill(pilot, {"batch_size": "200"})
        await click(pilot, "#save-preset")
        await pilot.pause()
        app.screen.query_one("#name-input", Input).value = "mine"
        await pilot.press("enter")
        await pilot.pause()
        saved = isolated_home / "presets" / "mine.toml"
        assert "batch_size = 200" in saved.read_text()
        assert any(v == str(saved) for _, v in preset._options)
        chosen = preset.value               # the list read again (every 2 s where the
        app.query_one(LaunchPanel).reload_presets()    # presets change): the choice stays
        assert preset.value == chosen and isinstance(chosen, str)
        # Loading a preset over edits names what it replaced (issue 55: they went silently).
        await fill(pilot, {"lr": "0.07"})
        preset.value = next(v for _, v in preset._options
                            if isinstance(v, str) and v.endswith("baseline.toml"))
        await pilot.pause()
        said = [n.message for n in app._notifications if "preset baseline loaded" in n.message]
        assert said and "it replaced your edit(s): batch_size 200 → 64, lr 0.07 → 0.03; " \
            in said[-1] and "other value(s) changed" in said[-1], said
        assert form.config() == load(preset.value)


@pytest.mark.warm
async def test_start_a_run_and_watch_its_row_and_plots_fill(tmp_path):
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.app.ready()
        await fill(pilot, {**QUICK_FORM, "epochs": "2"})
        app.query_one("#run-name", Input).value = "first"
        # the dashboard's warm launcher (started after the first screen) forks the run
        await until(pilot, lambda: app.warm is not None and app.warm.ready())
        await pilot.press("f2")
        await until(pilot, lambda: status(tmp_path, 1) == "finished")
        await until(pilot, lambda: cell(app, 1, "status") == "finished")
        assert cell(app, 1, "name") == "first" and cell(app, 1, "step") == "20"
        assert cell(app, 1, "acc").endswith("%") and cell(app, 1, "loss") != "-"
        plot = app.query_one("#plot-loss", MetricPlot)
        labels = [s.label for s in plot._pending]
        assert labels == ["1 raw", "1 smoothed"]
        assert len(plot._pending[0].xs) == 10              # every logged step
        assert app.query_one("#plot-accuracy", MetricPlot)._pending[0].ys[-1] > 10
        # The log tab shows what the process printed.
        app.query_one("#tabs").active = "tab-log"
        await pilot.pause()
        await until(pilot, lambda: any("finished" in line
                                       for line in app.query_one("#log").lines))
        assert WARM_LINE in (tmp_path / "logs" / "run-1.log").read_text()


async def test_stop_then_continue(tmp_path):
    app = TrainerApp(tmp_path, poll=False)
    said = notifications(app)       # every one, kept (the app's own list drops old ones)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.app.ready()
        await fill(pilot, {**QUICK_FORM, "epochs": "200"})
        before = app.snapshot               # the session before the run: no runs
        await pilot.press("f2")
        await until(pilot, lambda: db_rows(tmp_path, "SELECT 1 FROM runs WHERE step >= 12"))
        # On a loaded machine a snapshot read before the run was stored can arrive after it
        # started (CI saw F3 answer "no run selected" so): F3 still stops the run F2 started.
        app.on_polled(Polled(before, None, app.poller.seq))
        assert 1 not in app.runs and app.cursor_run == 1
        await pilot.press("f3")
        await until(pilot, lambda: status(tmp_path, 1) == "stopped", seen=lambda: (
            status(tmp_path, 1), db_rows(tmp_path, "SELECT step FROM runs"),
            app.cursor_run, said[-3:]))
        stopped_at = db_rows(tmp_path, "SELECT step FROM runs")[0][0]
        assert db_rows(tmp_path, "SELECT max(step) FROM checkpoints")[0][0] == stopped_at
        await until(pilot, lambda: cell(app, 1, "status") == "stopped")
        # Continue asks how far, starting from the run's own length; a shorter total here
        # keeps the test short. The form is not used (it may hold anything).
        await pilot.press("f4")
        await until(pilot, lambda: app.screen.__class__.__name__ == "ContinueScreen")
        assert app.screen.query_one("#continue-epochs", Input).value == "200"
        app.screen.query_one("#continue-max-steps", Input).value = str(stopped_at + 6)
        await click(pilot, "#continue-ok")
        # while its process starts the run reads "continuing", not "stopped" (issue 55)
        await until(pilot, lambda: cell(app, 1, "status") == "continuing", 5)
        await until(pilot, lambda: status(tmp_path, 1) == "finished")
        assert db_rows(tmp_path, "SELECT step FROM runs")[0][0] == stopped_at + 6
        await until(pilot, lambda: cell(app, 1, "status") == "finished", 30)
        kinds = [k for (k,) in db_rows(tmp_path, "SELECT kind FROM events ORDER BY id")]
        assert "resumed" in kinds


async def test_save_as_and_reopen_restore_runs_and_screen_state(tmp_path, isolated_home):
    session = isolated_home / "sessions" / "orig"
    base = sets(*QUICK) + ["--set", "max_steps=4"]
    assert tt("run", "--session", str(session), *base).rc == 0
    assert tt("run", "--session", str(session), *base).rc == 0
    app = TrainerApp(session, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.app.ready()
        await app.poll_now()
        await pilot.pause()
        app.query_one("#runs", DataTable).focus()
        await pilot.press("space", "down", "space")
        app.query_one("#tabs").active = "tab-compare"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await pilot.pause()
        app.screen.query_one("#name-input", Input).value = "copy"
        await pilot.press("enter")
        await pilot.pause()
        assert app.session_dir == isolated_home / "sessions" / "copy"
    copy = isolated_home / "sessions" / "copy"
    assert len(SessionStore(copy).runs()) == 2
    # The copy's checkpoints are its own files.
    assert all(c["path"].startswith(str(copy)) for c in SessionStore(copy).checkpoints(1))
    reopened = TrainerApp(copy, poll=False)
    async with reopened.run_test(size=SIZE) as pilot:
        await pilot.app.ready()
        await pilot.pause()
        assert reopened.marked == [1, 2]
        assert reopened.query_one("#tabs").active == "tab-compare"
        assert reopened.query_one("#runs", DataTable).row_count == 2
        # Open lists both sessions with their run counts, and switches.
        await pilot.press("ctrl+o")
        await pilot.pause()
        options = reopened.screen.query_one("#open-list")
        for _ in range(100):                    # the sessions are listed by a worker
            if options.option_count:
                break
            await pilot.pause(0.05)
        texts = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
        assert any(t.startswith("orig") and "2 runs" in t for t in texts)
        index = next(i for i, t in enumerate(texts) if t.startswith("orig"))
        options.highlighted = index
        await pilot.press("enter")
        await pilot.pause()
        assert reopened.session_dir == session


async def test_a_copy_saved_while_a_run_trains_says_what_it_was_and_never_crashed(
        tmp_path, isolated_home):
    """Save as while a run trains: the copy shows the run as it was when copied ("copied",
    running in the original at step N), never "crashed", also once the original process
    has ended; the original stays the one place the run is written."""
    session = isolated_home / "sessions" / "orig"
    base = sets(*QUICK)
    live = tt_popen("run", "--session", str(session), *base, "--set", "epochs=200", quiet=True)
    copy = isolated_home / "sessions" / "copy"
    said: list[str] = []
    try:
        app = TrainerApp(session, poll=False)
        said = notifications(app)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.app.ready()
            await until(pilot, lambda: cell(app, 1, "status") == "running")
            await pilot.press("ctrl+s")
            await until(pilot, lambda: bool(app.screen.query("#name-input")))
            app.screen.query_one("#name-input", Input).value = "copy"
            await pilot.press("enter")
            await until(pilot, lambda: app.session_dir == copy
                        and cell(app, 1, "status") == "copied")
            assert "running in" in cell(app, 1, "reason")
            live.terminate()                # the original run stops, in the original
            assert live.wait(timeout=180) == 130
            for _ in range(4):
                await app.poll_now()
                await pilot.pause(0.1)
            assert cell(app, 1, "status") == "copied"
    finally:
        if live.poll() is None:
            live.kill()
            live.wait()
    assert not [m for m in said if "crashed" in m], said
    run = SessionStore(copy).run(1)
    assert run["status"] == "copied" and run["pid"] is None
    assert f"running in {session} when copied, at step {run['step']}" in \
        run["summary"]["copied"]
    assert status(session, 1) == "stopped"
    assert db_rows(copy, "SELECT kind FROM events WHERE kind = 'copied'") == [("copied",)]


async def test_reopening_marks_dead_runs_crashed_and_reattaches_to_live_ones(tmp_path):
    base = sets(*QUICK)
    killed = tt("run", "--session", str(tmp_path), *base, "--set", "checkpoint_every=3",
                "--kill-at-step", "7")
    assert killed.rc != 0
    live = tt_popen("run", "--session", str(tmp_path), *base, "--set", "epochs=200", quiet=True)
    try:
        app = TrainerApp(tmp_path, poll=False)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.app.ready()
            await until(pilot, lambda: status(tmp_path, 2) == "running"
                        and cell(app, 2, "status") == "running")
            assert cell(app, 1, "status") == "crashed"
            first = int(cell(app, 2, "step"))
            await until(pilot, lambda: int(cell(app, 2, "step")) > first)   # streaming
            # Quitting while it trains asks; "leave training" leaves it running.
            await pilot.press("ctrl+q")
            await pilot.pause()
            assert app.screen.query_one("#quit-leave")
            await click(pilot, "#quit-leave")
            await pilot.pause()
        assert live.poll() is None and status(tmp_path, 2) == "running"
    finally:
        live.terminate()
        live.wait(timeout=180)
    assert status(tmp_path, 2) == "stopped"


async def test_quit_with_runs_training_can_stop_them(tmp_path):
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.app.ready()
        await fill(pilot, {**QUICK_FORM, "epochs": "200"})
        await pilot.press("f2")
        await until(pilot, lambda: status(tmp_path, 1) == "running")
        await pilot.press("ctrl+q")
        await pilot.pause()
        await click(pilot, "#quit-stop")
        await pilot.pause()
    # The run finishes its step and writes its checkpoint: on a loaded machine (the other
    # test workers) that is slow, not wrong.
    deadline = time.time() + 180
    while status(tmp_path, 1) == "running" and time.time() < deadline:
        await asyncio.sleep(0.2)
    assert status(tmp_path, 1) == "stopped"
    assert db_rows(tmp_path, "SELECT count(*) FROM checkpoints")[0][0] >= 1


async def test_help_screen_and_command_palette_list_the_actions(tmp_path):
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.app.ready()
        await pilot.press("f1")
        await pilot.pause()
        assert app.screen.__class__.__name__ == "HelpScreen"
        await pilot.press("escape")
        await pilot.pause()
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for title in ("Start run", "Stop run", "Continue run", "Repeat run", "Compare pair",
                      "Save session as", "Open session"):
            assert title in titles


def test_ui_state_is_saved_in_the_session(tmp_path):
    async def go():
        app = TrainerApp(tmp_path, poll=False)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.app.ready()
            app.query_one("#tabs").active = "tab-log"
            await pilot.pause()
    asyncio.run(go())
    state = json.loads(SessionStore(tmp_path).meta("ui_state"))
    assert state["tab"] == "tab-log"


async def test_a_diverging_run_is_announced_and_shown_diverged(tmp_path):
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.app.ready()
        await fill(pilot, {**QUICK_FORM, "lr": "100", "momentum": "0.99",
                           "weight_decay": "1", "log_every": "1"})
        await pilot.press("f2")
        await until(pilot, lambda: cell(app, 1, "status") == "diverged")
        assert cell(app, 1, "loss") == "nan"                      # the NaN row, shown as such

        def notes() -> list[str]:
            return [str(n.message) for n in app._notifications]
        # the toast is posted once the poll that saw the status has read the run's events
        await until(pilot, lambda: any("run 1 (run-1) diverged at step" in n
                                       and "NaN/inf" in n for n in notes()), 60, notes)
        plot = app.query_one("#plot-loss", MetricPlot)
        assert plot._pending and any(y != y for y in plot._pending[0].ys)   # NaN plotted


async def test_continue_without_a_checkpoint_offers_a_restart_from_step_0(tmp_path):
    from tui_trainer.core.settings import config
    store = SessionStore(tmp_path)
    rid = store.create_run(config.load(overrides=QUICK + ["max_steps=4"]).to_dict(), name="nock")
    store.close()
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.app.ready()
        await app.poll_now()
        app.cursor_run = rid
        await pilot.press("f4")
        await until(pilot, lambda: app.screen.__class__.__name__ == "ConfirmScreen")
        assert "no checkpoint to continue from" in str(app.screen.query_one("Label").render())
        await click(pilot, "#confirm-yes")
        await until(pilot, lambda: status(tmp_path, rid) == "finished")
        assert db_rows(tmp_path, "SELECT step FROM runs") == [(4,)]
        kinds = [k for (k,) in db_rows(tmp_path, "SELECT kind FROM events ORDER BY id")]
        assert "restarted" in kinds


async def test_b_measures_a_runs_memory_and_p_profiles_it(tmp_path):
    r = tt("run", "--session", str(tmp_path), "--set", "max_steps=4",
           *sets(*QUICK))
    assert r.rc == 0, r.err
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.app.ready()
        await app.poll_now()
        app.query_one("#runs", DataTable).focus()
        assert app.query_one("#tabs").active == "tab-plots" and app.cursor_run == 1
        await pilot.press("b")          # none yet: measured on a copy, then shown
        await until(pilot, lambda: isinstance(app.screen, MemoryScreen))

        def words() -> str:     # once the pushed screen has composed its children
            return "\n".join(str(s.render()) for s in app.screen.query("#memory-text Static"))
        await until(pilot, lambda: "Tensors at the step's peak:" in words(), 10, words)
        text = words()
        # both memories named: the tensors' peak, and the process's that the table shows
        resident = f"{app.runs[1].peak_memory_mib:,.0f} MiB, is its process's resident memory"
        assert app.runs[1].memory_kind == "RSS" and resident in text, text
        assert "GrokkingNet.conv1" in text
        assert "activations (kept for backward)" in text
        # the step's timeline, drawn above the words: the peak, the phases, the legend
        await until(pilot, lambda: app.screen.query("#memory-timeline"), 10)
        chart = str(app.screen.query_one("#memory-timeline").render())
        assert " MiB" in chart and "▄" in chart and "━ backward" in chart
        assert "█ activations (kept for backward)" in chart
        await pilot.press("m")          # measured again, shown again
        await until(pilot, lambda: len(db_rows(tmp_path, "SELECT 1 FROM events WHERE kind = "
                                                         "'memory_breakdown'")) == 2)
        await until(pilot, lambda: isinstance(app.screen, MemoryScreen))
        await pilot.press("escape")
        await pilot.pause()
        app.query_one("#tabs").active = "tab-divergence"       # b is the Plots tab's
        await pilot.press("b")
        await pilot.pause()
        assert not isinstance(app.screen, MemoryScreen)
        assert not app.query_one(PlotsPanel).measuring.busy
        # p in the Profile tab: the run under the cursor profiled on a copy, then shown
        app.query_one("#tabs").active = "tab-profile"

        def profile_text() -> str:
            panel = app.panel(ProfilePanel)
            return "" if panel is None else str(panel.query_one("#profile-text").render())
        await until(pilot, lambda: "p: profile the run under the cursor" in profile_text())
        app.query_one("#runs", DataTable).focus()
        await pilot.press("p")
        await until(pilot, lambda: "Profiling run 1:" in profile_text())
        await until(pilot, lambda: "Operators by self time" in profile_text(), timeout=120)
        text = profile_text()
        assert "Profiling run 1" not in text and "conv1" in text and "Trace (Chrome" in text
        assert not app.query_one(ProfilePanel).profiling.busy


async def test_keys_typed_in_a_burst_while_runs_train_all_reach_the_knob(tmp_path):
    """Two runs train; keys come as a terminal delivers a fast typist's burst (all read
    before the first is handled): the knob search, enter, a value. Every key lands where
    it was typed for: the search keeps its text and the knob gets the whole value (issue
    55: "300" typed fast under load after enter landed in the search box; the keys after
    enter went there, as a binding ran after them)."""
    from textual import events
    base = sets(*QUICK)
    live = [tt_popen("run", "--session", str(tmp_path), *base, "--set", "epochs=200",
                     quiet=True) for _ in range(2)]
    try:
        app = TrainerApp(tmp_path, poll=False)
        async with app.run_test(size=SIZE) as pilot:
            await app.ready()
            await until(pilot, lambda: cell(app, 1, "status") == cell(app, 2, "status")
                        == "running")
            search = app.query_one("#knob-search", Input)
            for value in ("300", "1205", "47"):
                search.value = ""
                search.focus()
                await pilot.pause(0.2)
                for key in [*"max_steps", "enter", *value]:
                    app.post_message(events.Key(key, "\r" if key == "enter" else key))
                await until(pilot, lambda: search.value == "max_steps"
                            and app.query_one(ConfigForm).texts()["max_steps"] == value, 10,
                            lambda: (search.value, app.query_one(ConfigForm).texts()["max_steps"]))
                assert app.query_one(ConfigForm).config().max_steps == int(value)
    finally:
        for p in live:
            p.kill()
            p.wait()


async def test_at_80x24_compare_scrolls_by_keys_ctrl_t_leaves_it_and_plots_keep_their_height(
        tmp_path):
    """Issue 55 at 80x24 (two finished runs marked): in Compare, PageDown on a table scrolls
    the tab to its chart, and ctrl+t from there shows the next tab with the focus in it
    (it did nothing); in Plots, 1-8 work with the focus in the run table, and 3 then 3
    again, across a resize, leave every chart its height (they were squeezed to a row)."""
    from test_snapshots import _fill
    _fill(tmp_path, tab="tab-compare")
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await app.ready()
        await app.poll_now()
        await pilot.pause(0.3)
        panel = app.query_one("#compare-panel")
        chart = app.query_one("#plot-compare", MetricPlot)
        assert panel.max_scroll_y > 0 and not panel.region.contains(
            chart.region.x, chart.region.y + 2)               # below the first screen
        app.query_one("#compare-summary", DataTable).focus()
        await pilot.pause(0.2)
        for _ in range(3):
            await pilot.press("pagedown")
        await pilot.pause(0.3)
        assert panel.region.contains(chart.region.x, chart.region.y + 2), panel.scroll_y
        await until(pilot, lambda: chart.drawn and chart._canvas is not None, 30)
        await pilot.press("ctrl+t")
        await until(pilot, lambda: app.query_one("#tabs").active == "tab-ab", 10)
        await until(pilot, lambda: app.focused is app.query_one("#ab-table"), 10)
        # Plots: the keys from the run table, and back to all eight after a resize
        app.query_one("#tabs").active = "tab-plots"
        app.query_one("#runs", DataTable).focus()
        await pilot.pause(0.3)
        await pilot.press("3")
        await pilot.pause(0.3)
        alone = app.query_one("#plot-accuracy", MetricPlot)
        assert [p.id for p in app.query(MetricPlot) if p.display and p.parent.id == "plots"] \
            == ["plot-accuracy"] and alone.outer_size.height >= 10
        await pilot.resize_terminal(130, 42)
        await pilot.pause(0.3)
        await pilot.press("3")
        await pilot.pause(0.3)
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.3)
        grid = [p for p in app.query(MetricPlot) if p.parent.id == "plots"]
        assert len(grid) == 8 and all(p.display and p.outer_size.height >= 12 for p in grid), \
            [(p.id, p.outer_size.height) for p in grid]
        assert app.query_one("#plot-scroll").max_scroll_y > 0      # the tab scrolls
        search = app.query_one("#knob-search", Input)       # a digit typed into a text
        await pilot.press("f9")                             # field is the field's
        await pilot.pause(0.3)
        search.focus()
        await pilot.press("5")
        await pilot.pause(0.2)
        assert search.value == "5" and app.query_one(PlotsPanel).solo is None


async def test_at_80x24_the_help_reaches_its_end_and_its_close_button_shows(tmp_path):
    """F1 at 80x24: the help's text scrolls to its last line and the Close button lies
    inside the dialog (issue 55: the text ran below the screen; then the button was left
    no row)."""
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await app.ready()
        await pilot.press("f1")
        await until(pilot, lambda: bool(app.screen.query("#help-text")), 10)
        box, text = app.screen.query_one("#help-box"), app.screen.query_one("#help-text")
        close = app.screen.query_one("#help-close")
        await pilot.press("end")
        await pilot.pause(0.3)
        assert box.content_region.contains_region(text.region)
        assert box.content_region.contains_region(close.region)
        assert box.region.bottom <= 24 and text.scroll_y == text.max_scroll_y > 0


async def test_a_start_before_the_launcher_is_ready_waits_for_it_and_says_so(
        tmp_path, monkeypatch):
    """device=cpu. The dashboard's own launcher still importing torch: F2 says what it
    waits for, and the run is forked by that launcher once it is ready (its log says so),
    not started cold beside its imports."""
    from tui_trainer.launcher.client import WARM_LINE, WarmLauncher
    from tui_trainer.ui.panels import launch
    monkeypatch.delenv(WarmLauncher.ENV, raising=False)     # not the suite's shared one
    # (the wait's bound, 60 s, is not this claim: beside a busy loop and the suite's other
    # processes the launcher's imports took longer, and the run started cold, as it should)
    monkeypatch.setattr(launch, "LAUNCHER_WAIT_S", 600.0)
    app = TrainerApp(tmp_path, poll=False)
    said = notifications(app)
    async with app.run_test(size=SIZE) as pilot:
        await app.ready()
        await fill(pilot, {**QUICK_FORM, "device": "cpu", "max_steps": "4"})
        await until(pilot, lambda: app.warm is not None and app.warm.starting(), 30)
        await pilot.press("f2")
        await until(pilot, lambda: any("as soon as the launcher" in m for m in said), 30)
        await until(pilot, lambda: status(tmp_path, 1) == "finished", 300)
        assert app.warm.ready()
    log = (tmp_path / "logs" / "run-1.log").read_text()
    assert WARM_LINE in log, log[:2000]
