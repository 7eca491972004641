"""The run table's own keys and the Open dialog, driven with Pilot over a real session file
(runs made in the store: nothing trains, so these are fast)."""

from __future__ import annotations

import csv
import json
import re

import pytest
from textual.widgets import DataTable, Input

from conftest import click, tt
from tui_trainer.core.settings import config
from tui_trainer.core.session.store import SessionStore
from tui_trainer.ui.app import TrainerApp

SIZE = (180, 50)


def _session(path, n: int = 3) -> None:
    s = SessionStore(path)
    for i in range(n):
        rid = s.create_run(config.DEFAULTS.replace(seed=i).to_dict(), name=f"run{i}")
        s.add_rows(steps=[{"step": k, "epoch": k / 10, "elapsed": k * 0.1, "loss": 1.0 / k,
                           "samples_per_s": 100.0 * k} for k in range(1, 11)], run_id=rid)
        s.set_progress(rid, 10, 1.0)
        s.end_run(rid, "finished", {"elapsed_s": 1.0})
    s.close()


def _ids(app) -> list[str]:
    return [str(k.value) for k in app.query_one("#runs", DataTable).rows]


async def _table(pilot) -> DataTable:
    """The run table once the app is up and has read the session."""
    await pilot.app.ready()
    await pilot.app.poll_now()
    await pilot.pause()
    return pilot.app.query_one("#runs", DataTable)


async def _answer(pilot, text: str) -> None:
    await pilot.pause()
    app = pilot.app
    app.screen.query_one("#name-input", Input).value = text
    await pilot.press("enter")
    for _ in range(20):
        await app.poll_now()
        await pilot.pause()


async def test_rename_tag_filter_hide_sort_and_delete_runs(tmp_path):
    _session(tmp_path)
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        table = await _table(pilot)
        table.focus()
        assert _ids(app) == ["1", "2", "3"]
        await pilot.press("r")
        await _answer(pilot, "renamed [b]x[/b]")
        assert str(table.get_cell("1", "name")) == "renamed [b]x[/b]"      # text, not markup
        # tags and the note take no room while no run has one
        assert not {"tags", "reason"} & {c.value for c in table.columns}
        await pilot.press("t")
        await _answer(pilot, "fast, amp")
        assert str(table.get_cell("1", "tags")) == "fast amp"
        assert SessionStore(tmp_path, readonly=True).labels()[1]["tags"] == ["fast", "amp"]
        await pilot.press("slash")
        await _answer(pilot, "seed=2")
        assert _ids(app) == ["3"]
        await pilot.press("slash")
        await _answer(pilot, "*")
        assert _ids(app) == ["1", "2", "3"]
        table.move_cursor(row=1)
        await pilot.press("h")
        for _ in range(5):
            await app.poll_now()
            await pilot.pause()
        assert _ids(app) == ["1", "3"]
        await pilot.press("H")
        await pilot.pause()
        assert _ids(app) == ["1", "2", "3"]
        await pilot.press(*["s"] * 7)                                # to samples/s
        assert table.view.sort == "sps"
        await pilot.press("S")                                       # reversed
        await pilot.pause()
        assert _ids(app) == ["1", "2", "3"]     # equal figures: the order stays stable
        table.move_cursor(row=2)
        await pilot.pause()
        await pilot.press("delete")
        await pilot.pause()
        await click(pilot, "#confirm-yes")
        for _ in range(10):
            await app.poll_now()
            await pilot.pause()
        assert "3" not in _ids(app)
    assert [r["id"] for r in SessionStore(tmp_path, readonly=True).runs()] == [1, 2]


async def test_open_any_folder_by_its_path(tmp_path, isolated_home):
    first, other = tmp_path / "first", tmp_path / "elsewhere" / "s2"
    _session(first, 1)
    _session(other, 2)
    app = TrainerApp(first, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.app.ready()
        await pilot.press("ctrl+o")
        await pilot.pause()
        path = app.screen.query_one("#open-path", Input)
        path.value = str(other)
        path.focus()
        await pilot.pause()
        await pilot.press("enter")
        for _ in range(10):
            await app.poll_now()
            await pilot.pause()
        assert app.session_dir == other.resolve() and str(other) in app.sub_title
        assert _ids(app) == ["1", "2"]


async def test_charts_are_built_only_while_in_view(tmp_path):
    """A chart scrolled out of the plot grid is not built (refreshing it costs a layout of the
    whole screen); scrolled into view, it is built with the data it was given meanwhile."""
    from tui_trainer.ui.widgets.plots import MetricPlot
    _session(tmp_path)
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.app.ready()
        await app.poll_now()
        plots = {p.id: p for p in app.query(MetricPlot)}

        async def settle():
            for _ in range(40):
                await pilot.pause(0.1)
                if all(p.drawn for p in plots.values()):
                    return
        await settle()
        seen = {pid for pid, p in plots.items() if p.in_view}
        assert "plot-loss" in seen and "plot-grad" not in seen
        assert all(plots[pid]._canvas is not None for pid in seen)
        assert plots["plot-grad"]._canvas is None
        app.query_one("#plot-scroll").scroll_end(animate=False)
        await pilot.pause()
        await settle()
        assert plots["plot-grad"].in_view
        assert plots["plot-grad"]._canvas is not None


async def test_an_empty_sessions_charts_say_how_to_start_a_run(tmp_path):
    """A session with no runs: the charts say how to start one at 80x24, not "no data yet";
    once a run is there and none is under the cursor, they say so; with runs, their names."""
    from tui_trainer.ui.panels.plots import EMPTY_SESSION
    from tui_trainer.ui.widgets.plots import MetricPlot
    SessionStore(tmp_path).close()
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.app.ready()
        await app.poll_now()
        chart = app.query_one("#plot-loss", MetricPlot)
        for _ in range(60):
            await pilot.pause(0.1)
            if chart.drawn and chart._canvas is not None:
                break
        assert EMPTY_SESSION in chart._canvas.plain
        _session(tmp_path, 1)
        await app.poll_now()
        for _ in range(60):
            await pilot.pause(0.1)
            if chart.drawn and EMPTY_SESSION not in chart._canvas.plain:
                break
        assert EMPTY_SESSION not in chart._canvas.plain and "run0" in chart._canvas.plain


@pytest.mark.parametrize("height", [8, 9, 10, 11, 12, 16, 24])
@pytest.mark.parametrize("lo,hi", [(0.3, 2.32), (5012.0, 6187.0), (-0.7, 0.9),
                                   (1.2e-7, 3.3e-7), (0.5, 0.5004)])
def test_a_charts_axes_step_evenly_and_its_labels_sit_on_their_rows(height, lo, hi):
    """A chart's axes read in even, round steps (1, 2 or 5 times a power of ten), each y
    label on the row its value is drawn on, no two alike, at least two (the axis's ends
    where no two round values fit a row apart): plotext put seven ticks of odd values on
    any height and, where two fell on one row, showed one, so at 80x24 a loss axis read
    2.32 1.99 1.66 0.99 0.66 0.32 (steps of 0.33 and 0.67 a row), and a step axis 62.5."""
    from tui_trainer.core.analysis.plotdata import Line
    from tui_trainer.ui.widgets.plots import chart
    xs = list(range(100))
    ys = [lo + (hi - lo) * x / 99 for x in xs]
    text = re.sub(r"\x1b\[[0-9;]*m", "", chart([Line("1", xs, ys, 0)], "t", "step", "loss",
                                                70, height, "dark"))
    rows = [line for line in text.splitlines() if re.match(r"^[ 0-9.e+-]*[┤│]", line)]
    labels = [(i, line.split("┤")[0].strip()) for i, line in enumerate(rows) if "┤" in line]
    assert len(rows) == height - 5
    assert len(labels) >= 2 and len({v for _, v in labels}) == len(labels)
    for row, label in labels:
        drawn_at = (hi - float(label)) / (hi - lo) * (len(rows) - 1)
        assert abs(row - drawn_at) <= 0.5 + 1e-6, (label, row, drawn_at, labels)
    lines = text.splitlines()
    along_x = lines[next(i for i, line in enumerate(lines) if "└" in line) + 1].split()
    assert _round_steps([float(v) for v in along_x]) and along_x[0] == "0", along_x
    values = [float(v) for _, v in labels]
    if len(values) == 2 and values == pytest.approx([hi, lo], rel=1e-3):
        return          # no two round values a row apart: the axis's ends
    assert _round_steps(values[::-1]), labels


@pytest.mark.parametrize("height, runs, below", [(11, 2, True), (11, 1, False),
                                                  (20, 2, False)])
def test_a_legend_that_would_cover_the_curves_is_one_row_under_the_chart(height, runs, below):
    """plotext draws its legend inside the chart, a row a line, over the curves' start: at
    80x24 two runs' raw and smoothed lines took 4 of the 6 rows (issue 68). Where it would
    take more than a third of the rows it is one row under the chart, each label in its
    line's colour, cut with "+N" to the width; elsewhere it stays inside."""
    from tui_trainer.core.analysis.plotdata import Line
    from tui_trainer.ui.widgets.plots import chart
    xs = list(range(100))
    lines = [Line(f"{r} {what}", xs, [(r + 1) / (x + 1) for x in xs], r, what == "raw")
             for r in range(1, runs + 1) for what in ("raw", "smoothed")]
    text = chart(lines, "t", "step", "loss", 70, height, "dark")
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines()
    assert len(plain) == height
    inside = [row for row in plain if "┤" in row or "│" in row]
    labels = [line.label for line in lines]
    assert any(label in row for row in inside for label in labels) is not below
    if below:
        assert plain[-1].split("  ") == [f"{'·' if ln.faint else '━'} {ln.label}" for ln in lines]
        assert "\x1b[38;5;" in text.splitlines()[-1]       # in the lines' colours
        narrow = re.sub(r"\x1b\[[0-9;]*m", "", chart(lines, "t", "step", "loss", 30, height,
                                                      "dark")).splitlines()[-1]
        assert len(narrow) <= 30 and narrow.endswith(f"+{len(lines) - narrow.count('  ')}")
        # a label from data (a sweep's name) is text there: its escapes shown, never sent
        hostile = [Line("\x1b[2Jx", xs, [1.0] * 100, 0)] + lines
        row = chart(hostile, "t", "step", "loss", 70, height, "dark").splitlines()[-1]
        assert "\x1b[2J" not in row and "\\x1b[2Jx" in re.sub(r"\x1b\[[0-9;]*m", "", row)


def _round_steps(values: list[float]) -> bool:
    """Two values or more, rising in one step of 1, 2 or 5 times a power of ten."""
    step = values[1] - values[0] if len(values) > 1 else 0
    even = all(abs(b - a - step) <= step * 1e-6 for a, b in zip(values, values[1:]))
    return step > 0 and even and float(f"{step:.6e}".split("e")[0]) in (1.0, 2.0, 5.0)


async def test_a_table_keeps_only_the_cells_it_draws_now():
    """panels/common.Table: DataTable keyed what it drew by an update count and kept up to
    10,000 cells of older counts that are never drawn again; with four runs training the run
    table's dead cells made Python's full collections take 100-270 ms (issue 18)."""
    from textual.app import App

    from tui_trainer.ui.panels.common import Table

    class One(App):
        def compose(self):
            yield Table(id="t")

    app = One()
    async with app.run_test(size=(100, 30)) as pilot:
        table = app.query_one(Table)
        table.add_columns("a", "b", "c")
        rows = [table.add_row(i, i, i) for i in range(10)]
        await pilot.pause()
        for step in range(60):              # a cell of every row changes, twice a second
            for r in rows:
                table.update_cell(r, table.ordered_columns[1].key, step % 10)
            await pilot.pause()
        assert "3  9  3" in "".join(s.text for s in table.render_line(4))     # row 3
        assert 0 < len(table._cell_render_cache) <= 4 * 10 * 3     # this draw's cells
        assert len(table._line_cache) <= 2 * 30


async def test_a_run_that_beats_but_does_not_move_reads_stalled_in_the_table(tmp_path):
    """A live run (claimed by this process, beating) whose step has not moved for STALL_S:
    the table's status says stalled, the why column for how long and what ends it; the
    filter finds it by that word. Once a beat sees its step move, it reads running."""
    import time

    from tui_trainer.core.processes.liveness import STALL_S
    _session(tmp_path, n=1)
    store = SessionStore(tmp_path)
    rid = store.create_run(config.DEFAULTS.replace(nproc=2, batch_size=64).to_dict(), name="g")
    store.claim(rid)
    store.set_progress(rid, 412, 1.5)
    store.heartbeat(rid, progressed=time.time() - STALL_S - 5)
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        table = await _table(pilot)
        assert str(table.get_cell(str(rid), "status")) == "stalled"
        why = str(table.get_cell(str(rid), "reason"))
        assert re.match(r"no step for 1:\d\d \(at step 412\)", why), why
        assert str(table.get_cell("1", "status")) == "finished"
        table.focus()
        await pilot.press("slash")
        await _answer(pilot, "stalled")
        assert _ids(app) == [str(rid)]
        store.heartbeat(rid, progressed=time.time())
        await pilot.press("slash")
        await _answer(pilot, "*")
        for _ in range(5):
            await app.poll_now()
            await pilot.pause()
        assert str(table.get_cell(str(rid), "status")) == "running"
    store.end_run(rid, "stopped", {})
    store.close()


async def test_at_80x24_the_first_keys_go_to_the_run_table_not_the_hidden_form(tmp_path):
    """Where the form is a closed drawer, the focus is in the run table: at 80x24 it started
    in the hidden form's preset list (space opened it unseen), and came back there after a
    dialog; F9 opens the drawer with the focus in the knob search, F9 again closes it. One
    resize from 200x50 to 80x24 gives the drawer layout (it was judged by the size before
    the resize, so the form stayed beside the panels until the next one)."""
    _session(tmp_path)
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=(80, 24)) as pilot:
        table = await _table(pilot)
        await pilot.pause()
        assert app.focused is table
        await pilot.press("space", "down", "space")
        assert app.marked == [1, 2]
        await pilot.press("f9")
        assert app.focused is app.query_one("#knob-search")
        await pilot.press("f9")
        assert app.focused is table
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=(200, 50)) as pilot:
        table = await _table(pilot)
        assert app.query_one("#left").display and app.focused is not table
        await pilot.press("f1")
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.2)
        assert app.has_class("-small")
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert app.focused is table and not app.query_one("#left").display
        await pilot.resize_terminal(200, 50)
        await pilot.pause(0.2)
        assert not app.has_class("-small") and app.query_one("#left").display


async def test_compare_says_whose_speed_is_the_machines_load(tmp_path):
    """Compare's ratios of samples/s and ms/step are the knobs' only where the runs had the
    machine: a run recorded as trained beside busy processes (or crowded) is named under
    the table with what took the cores, and in the run table, `runs` and the exported
    summary; a quiet run is not."""
    _session(tmp_path, 2)
    with SessionStore(tmp_path) as s:
        s.end_run(1, "finished", {"elapsed_s": 1.0, "contention": {
            "wall_s": 1.0, "others_cores": 1.3, "own_cores": 0.9, "cores": 2}})
        s.end_run(2, "finished", {"elapsed_s": 1.0, "contention": {
            "wall_s": 1.0, "others_cores": 0.02, "own_cores": 1.9, "cores": 2}})
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=(80, 24)) as pilot:
        table = await _table(pilot)
        table.focus()
        await pilot.press("space", "down", "space", "f6")
        await app.poll_now()
        await pilot.pause()
        words = str(app.query_one("#compare-window").render())
        assert "⚠ A = run 1's speed is not its knobs' alone: the machine was busy while it " \
            "trained (others 1.30 cores, own 0.90, of 2)" in words.replace("\n", " ")
        assert "run 2" not in words and "samples/s and ms/step: the median" in words
        # the run table's note says it too (at 80 columns samples/s keeps its place and the
        # note takes what is left: `a` shows every column; its filter finds it as "busy"),
        # and so does `runs`
        from tui_trainer.ui.panels.runs import matches
        table = app.query_one("#runs", DataTable)
        keys = [c.key.value for c in table.columns.values()]
        assert "sps" in keys                                  # samples/s not pushed out
        table.focus()
        await pilot.press("a")
        await pilot.pause()
        assert str(table.get_cell("1", "reason")).startswith("the machine was busy")
        assert str(table.get_cell("2", "reason")) == ""
        assert matches(app.runs[1], "busy") and not matches(app.runs[2], "busy")
    r = tt("runs", "--session", str(tmp_path), "--json")
    assert [x["busy_machine"] is not None for x in json.loads(r.out)] == [True, False]
    assert "run 1 finished: the machine was busy while it trained (others 1.30 cores" in \
        tt("runs", "--session", str(tmp_path)).out
    assert tt("export", "1", "2", "--session", str(tmp_path)).rc == 0       # (the CSV too)
    with open(tmp_path / "exports" / "runs-1-2-summary.csv", newline="") as f:
        busy = [row["busy_machine"] for row in csv.DictReader(f)]
    assert busy[0].startswith("the machine was busy while it trained") and busy[1] == ""


async def test_the_log_wraps_a_long_line_at_the_tabs_width_and_again_when_it_changes(
        tmp_path, monkeypatch):
    """A line wider than the Log tab is wrapped at its width (its continuation indented), so
    at 80x24 it is read without scrolling sideways (a run's last line was 264 columns:
    186 presses of →); a wider terminal wraps it again, at the new width. A blank line
    stays (Textual's Log dropped it). No line is ever written wider than the tab: the
    tab's first lines came before it was laid out, shown cut for a moment (issue 68)."""
    from textual.widgets import Log
    from tui_trainer.ui.panels.log import LogPanel
    written: list[tuple[int, int]] = []         # (widest line written, the tab's width)
    write_lines = LogPanel.write_lines

    def recorded(self, lines, *a, **kw):
        lines = list(lines)
        written.append((max(map(len, lines), default=0), self.scrollable_content_region.width))
        return write_lines(self, lines, *a, **kw)
    monkeypatch.setattr(LogPanel, "write_lines", recorded)
    _session(tmp_path, 1)
    words = " ".join(f"word{i}" for i in range(60))               # about 400 columns
    with SessionStore(tmp_path) as store:
        path = store.log_path(1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"short line\n    {words}\n\nlast\n")
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await _table(pilot)
        app.action_show_tab("tab-log")
        await pilot.pause(0.2)
        log = app.query_one("#log", Log)

        async def lines() -> list[str]:
            for _ in range(40):
                await app.poll_now()
                await pilot.pause(0.05)
                if log.lines and log.lines[-1] == "last":
                    break
            return list(log.lines)
        narrow = await lines()
        width = log.scrollable_content_region.width
        assert narrow[0] == "short line" and narrow[-2:] == [" ", "last"]   # (blank kept)
        wrapped = narrow[1:-2]
        assert len(wrapped) > 4 and all(len(x) < width for x in wrapped)
        assert wrapped[0].startswith("    word0") and all(x.startswith("      word")
                                                         for x in wrapped[1:])
        assert " ".join(x.strip() for x in wrapped) == words and log.max_scroll_x == 0
        assert written and all(0 < widest < width for widest, width in written), written
        await pilot.resize_terminal(160, 40)
        await pilot.pause(0.3)
        wide = list(log.lines)
        assert wide[0] == "short line" and len(wide) < len(narrow)
        assert " ".join(x.strip() for x in wide[1:-2]) == words and log.max_scroll_x == 0


async def test_keys_that_arrive_together_edit_a_text_box_in_the_order_typed(tmp_path):
    """A backspace, ← or end that arrives with typed characters acts in its place among
    them: Textual ran a text box's own bound keys only after they went up to the app and
    back (textual#6605), so in tmux end, backspace and 3 typed into F4's epochs field (its 2
    selected) left it empty. Keys posted together, none waited for."""
    from textual import events
    from textual.widgets import Input
    _session(tmp_path, 1)
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await _table(pilot)
        box = app.query_one("#run-name", Input)
        box.focus()
        await pilot.pause()

        async def burst(*keys: str) -> str:
            for key in keys:
                char = key if len(key) == 1 else ("\x7f" if key == "backspace" else None)
                app.post_message(events.Key(key, char))     # as the terminal driver does
            await pilot.pause(0.2)
            return box.value
        assert await burst("b", "a", "backspace", "c") == "bc"
        assert await burst("left", "x", "end", "y") == "bxcy"
        assert await burst("home", "backspace", "delete", "z") == "zxcy"


async def test_the_run_buttons_do_what_their_keys_do(tmp_path):
    """Stop, Continue, Repeat and Compare under the table run the app's actions (F3-F6)."""
    _session(tmp_path)
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        table = await _table(pilot)
        table.focus()
        await click(pilot, "#compare")                       # one run: nothing to compare
        assert app.query_one("#tabs").active == "tab-plots"
        assert any("mark two runs" in str(n.message) for n in app._notifications)
        table.focus()                                        # the click focused the button
        await pilot.press("space", "down", "space")
        assert app.marked == [1, 2]
        await click(pilot, "#compare")
        assert app.query_one("#tabs").active == "tab-compare" and app.pair == [1, 2]
        await click(pilot, "#stop")                          # a finished run is not training
        for _ in range(100):
            if any("is not training" in str(n.message) for n in app._notifications):
                break
            await pilot.pause(0.05)
        assert any("run 2 is not training" in str(n.message) for n in app._notifications)


async def test_writes_asked_as_the_app_quits_are_done_before_it_ends(tmp_path):
    """The quit dialog's Stop, a rename just before ctrl+q: the app's end waits for the
    writes asked before it (one at a time, in the writer's thread), then closes."""
    import time
    _session(tmp_path)
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await _table(pilot)
        def busy(*_):           # the writer is busy until the app has begun to close
            deadline = time.monotonic() + 30
            while app.is_running and time.monotonic() < deadline:
                time.sleep(0.01)

        app.write(busy)
        for i in range(1, 9):                           # in the order asked
            app.write(lambda s, _, i=i: s.set_labels(
                1, notes=f"{s.labels().get(1, {}).get('notes', '')} {i}"))
    with SessionStore(tmp_path, create=False, readonly=True) as s:
        assert s.labels()[1]["notes"] == " 1 2 3 4 5 6 7 8"


async def test_a_crowded_runs_note_shows_and_T_puts_the_count_that_fits_in_the_form(tmp_path):
    """A live run whose process said its threads outnumber the free cores (the heartbeat's
    note) and a finished one whose whole-run record says so: the table's why column shows
    each note, the filter finds them by "crowded", and T on such a run puts the count the
    note suggests into the form (nothing else changes, nothing starts); once the live run
    says its threads fit again, its note goes and T changes nothing."""
    import time

    from tui_trainer.core.processes import contention
    from tui_trainer.ui.panels.launch import LaunchPanel
    _session(tmp_path, n=1)
    store = SessionStore(tmp_path)
    done = store.create_run(config.DEFAULTS.to_dict(), name="done")
    store.set_settings(done, {"num_threads": 4, "device": "cpu"}, "mnist-sample")
    store.end_run(done, "finished", {"elapsed_s": 9.0, "contention": {
        "wall_s": 9.0, "others_cores": 1.4, "own_cores": 2.0, "cores": 4}})
    live = store.create_run(config.DEFAULTS.to_dict(), name="live")
    store.claim(live)
    note = contention.crowded(contention.read({"wall_s": 6.0, "others_cores": 1.0,
                                               "own_cores": 1.1, "cores": 2}), 2, "cpu")
    store.heartbeat(live, progressed=time.time(), crowded=note)
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        table = await _table(pilot)
        # (the why column cuts a long note to its width: the whole is in the Log)
        shown = str(table.get_cell(str(live), "reason"))
        assert shown.startswith("2 threads, 1.0 of 2 cores free") and \
            note.startswith(shown.rstrip("…")), shown
        assert str(table.get_cell(str(done), "reason")).startswith(
            "4 threads, 2.6 of 4 cores free")
        assert str(table.get_cell("1", "reason")) == ""
        form = app.query_one(LaunchPanel).form

        def threads() -> int:
            return form.raw_values()[0]["num_threads"]
        assert threads() == 0
        table.focus()
        table.move_cursor(row=_ids(app).index(str(live)))
        await pilot.press("T")
        await pilot.pause()
        assert threads() == 1
        table.move_cursor(row=_ids(app).index(str(done)))
        for _ in range(100):            # (the highlight reaches the app as a message)
            if app.cursor_run == done:
                break
            await pilot.pause(0.05)
        await pilot.press("T")
        await pilot.pause()
        assert threads() == 3
        await pilot.press("slash")
        await _answer(pilot, "crowded")
        assert sorted(_ids(app)) == sorted([str(done), str(live)])
        await pilot.press("slash")
        await _answer(pilot, "*")
        store.heartbeat(live, progressed=time.time(), crowded=None)
        for _ in range(5):
            await app.poll_now()
            await pilot.pause()
        assert str(table.get_cell(str(live), "reason")) == ""
        table.move_cursor(row=_ids(app).index(str(live)))
        await pilot.press("T")
        await pilot.pause()
        assert threads() == 3
        assert len(store.runs()) == 3                       # nothing started
    store.end_run(live, "stopped", {})
    store.close()


async def test_a_write_that_fails_unexpectedly_is_said_with_its_type(tmp_path):
    """A change to the session that raises what no one expected (a fault of ours) is told
    on the screen, its type and words, with or without the caller's words; an expected
    refusal keeps its one line. (F4's refusals were once lost this way: a ValueError in
    the writer's thread went nowhere.)"""
    _session(tmp_path, 1)
    app = TrainerApp(tmp_path, poll=False)
    said: list[str] = []
    notify = app.notify
    app.notify = lambda message, **kw: (said.append(str(message)), notify(message, **kw))
    async with app.run_test(size=SIZE) as pilot:
        await _table(pilot)

        def broken(store, _sup):
            return {}["no such key"]

        app.write(broken, failed="run 1 not renamed")
        app.write(lambda s, _: s.run(1)["config"]["seed"] / 0)
        app.write(lambda s, _: s.run(99), failed="run 99 not shown")
        # a tab's job whose start fails so is let go (the tab is not left busy)
        from tui_trainer.ui.panels.plots import PlotsPanel
        measuring = app.query_one(PlotsPanel).measuring
        measuring.start((1,), lambda sup: [][1], "memory breakdown not started")
        assert measuring.busy
        for _ in range(50):
            if len(said) >= 4:
                break
            await pilot.pause(0.05)
        assert not measuring.busy
    assert said[3] == ("memory breakdown not started: IndexError: list index out of "
                       "range")
    assert said[0] == "run 1 not renamed: KeyError: 'no such key'"
    assert said[1] == "a change to the session failed: ZeroDivisionError: division by zero"
    assert said[2].startswith("run 99 not shown: ") and "99" in said[2][18:]    # as it is
    assert "NotFound" not in said[2]


async def test_a_path_longer_than_its_field_is_shown_whole_under_it(tmp_path):
    """At 130x42 a folder dataset's path was cut after its first directories, whole nowhere
    in the form (issue 68, point 8): a model's file or a dataset's folder longer than its
    field is shown whole under it, folded at the form's width, in the muted colour of a
    value (not a warning's); one that fits has no such line."""
    from textual.widgets import Static
    from tui_trainer.ui.panels.launch import LaunchPanel
    _session(tmp_path, 1)
    folder = "folder:" + "/".join(["a-rather-long-folder-name"] * 6)
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=(130, 42)) as pilot:
        await _table(pilot)
        form = app.query_one(LaunchPanel).form
        if not app.query_one("#left").display:
            await pilot.press("f9")
        form.set_config({**config.DEFAULTS.to_dict(), "dataset": folder})
        form.recheck()
        await pilot.pause(0.3)
        field = app.query_one("#field-dataset")
        assert 0 < field.content_region.width < len(folder)
        note = app.query_one("#note-dataset", Static)
        width = note.content_region.width
        assert str(note.render()) == "⤷" + folder and note.has_class("-whole")
        assert note.size.height == -(-len("⤷" + folder) // width)      # folded, all of it
        assert not app.query("#note-model")               # "examples" fits its field
        fits = "folder:" + "/".join(["d"] * ((field.content_region.width - 7) // 2))
        form.set_config({**config.DEFAULTS.to_dict(), "dataset": fits})
        form.recheck()
        await pilot.pause(0.3)
        assert len(fits) <= field.content_region.width and not app.query("#note-dataset")
