"""The dashboard's plain objects, without a screen: the selection, the saved screen state,
the announcements. (The app keeps them in reactives; tests/test_ui.py drives them through
keys.)"""

import json
from dataclasses import MISSING, fields, replace

from tui_trainer.core.settings.config import DEFAULTS
from tui_trainer.core.analysis.plotdata import PlotOptions
from tui_trainer.core.session.reader import RunRow, Snapshot
from tui_trainer.ui.announce import Announcer
from tui_trainer.ui.selection import MAX_SHOWN, ScreenState, Selection


def row(rid: int, status: str = "finished", twin_of: int | None = None, **kw) -> RunRow:
    base = dict(id=rid, name=f"run-{rid}", status=status, step=10, twin_of=twin_of,
                reason=None)
    required = [f.name for f in fields(RunRow) if f.default is MISSING]
    return RunRow(**{**dict.fromkeys(required), "config": {}, **base, **kw})


def runs(*rows: RunRow) -> dict[int, RunRow]:
    return {r.id: r for r in rows}


def test_the_pair_is_the_set_pair_then_the_last_two_marked_then_the_cursor_and_its_twin():
    rs = runs(row(1), row(2, twin_of=1), row(3), row(4))
    assert Selection(marked=(1, 3, 4), pair=(3, 1)).current_pair(rs) == (3, 1)
    assert Selection(marked=(1, 3, 4)).current_pair(rs) == (3, 4)
    assert Selection(cursor=2).current_pair(rs) == (1, 2)       # a twin: with its original
    assert Selection(cursor=1).current_pair(rs) == (1, 2)       # an original: with its twin
    assert Selection(cursor=3).current_pair(rs) is None
    assert Selection(cursor=9).current_pair(rs) is None         # a run the session lost


def test_plotted_and_compared_runs_follow_the_marks_then_the_cursor():
    rs = runs(*(row(i) for i in range(1, 12)))
    assert Selection(cursor=5).plotted() == [5]
    assert Selection().plotted() == []
    many = Selection(marked=tuple(range(1, 12)), cursor=5)
    assert many.plotted() == list(range(1, MAX_SHOWN + 1))     # one colour each
    assert many.compared(rs) == list(range(1, MAX_SHOWN + 1))
    assert Selection(marked=(2, 7)).compared(rs) == [2, 7]
    assert Selection(cursor=3).compared(rs) == []


def test_marking_toggles_and_the_last_two_marked_become_the_pair():
    s = Selection(cursor=1)
    s = s.toggled(1)
    assert s.marked == (1,) and s.pair == ()
    s = s.toggled(3)
    assert s.marked == (1, 3) and s.pair == (1, 3)
    s = s.toggled(1)
    assert s.marked == (3,) and s.pair == (3,)       # an unmarked run leaves the pair
    assert s.current_pair(runs(row(1), row(3))) is None and s.cursor == 1
    s = Selection(marked=(1, 2), pair=(1, 2), cursor=28).toggled(1).toggled(2)
    assert s.marked == () and s.pair == ()           # F6's pair gone with its marks:
    assert s.compared(runs(row(1), row(2), row(28))) == []    # the cursor's run, no twin
    assert Selection(marked=(5,), pair=(1, 2), cursor=5).cleared() == Selection(cursor=5)


def test_a_deleted_run_leaves_every_part_of_the_selection():
    s = Selection(marked=(1, 2, 3), pair=(2, 3), cursor=2).without(2)
    assert s == Selection(marked=(1, 3), pair=(3,), cursor=None)
    assert Selection(cursor=4).without(2).cursor == 4


def test_the_marked_sweep_needs_two_of_its_runs_marked():
    studies = ({"id": 7, "kind": "sweep", "variants": [{"run_id": 4}, {"run_id": 5},
                                                       {"run_id": None}]},
               {"id": 8, "kind": "ab", "variants": [{"run_id": 1}, {"run_id": 2}]})
    assert Selection(marked=(1, 4, 5)).marked_sweep(studies) == ("sweep 7", [4, 5])
    assert Selection(marked=(1, 4)).marked_sweep(studies) is None
    assert Selection(marked=(1, 2)).marked_sweep(studies) is None      # an A/B, not a sweep


def test_a_saved_state_comes_back_the_same():
    form = replace(DEFAULTS, lr=0.05, seed=3).to_dict()
    state = ScreenState(Selection((1, 2), (1, 2), 2), "tab-compare", 5, form,
                        PlotOptions(x="time", smoothing=0.6, last=100, log_y=True, width=91))
    back = ScreenState.restored(state.to_json(), {1, 2, 3}, [4, 5], ["tab-plots",
                                                                     "tab-compare"])
    assert back.selection == state.selection and back.tab == "tab-compare"
    assert back.study == 5 and back.form == form
    # The plot options the user chose come back; the width is the terminal's, not saved.
    assert back.plots == PlotOptions(x="time", smoothing=0.6, last=100, log_y=True)


def test_a_saved_state_is_checked_against_the_session_it_is_restored_into():
    assert ScreenState.restored('{"cursor": true}', {1}, [], []).selection.cursor is None
    saved = json.dumps({"marked": [1, 9, "x", True], "pair": [9, 1], "cursor": 9,
                        "tab": "tab-gone", "study": 3, "form": {"lr": "fast"},
                        "plots": {"x": "step", "colour": "red"}})
    back = ScreenState.restored(saved, {1, 2}, [4, 6], ["tab-plots"])
    assert back.selection == Selection((1,), (1,), None)   # runs deleted since are dropped
    assert back.tab is None and back.form is None and back.plots is None
    assert back.study == 6                                 # the newest, when it is gone
    for raw in (None, "", "{", "[1, 2]", "null", '"text"'):
        assert ScreenState.restored(raw, {1}, [], ["tab-plots"]) == ScreenState()


def test_announcements_name_runs_that_ended_once_and_studies_instead_of_their_runs():
    said = Announcer()

    def snap(*rows: RunRow, studies=()) -> Snapshot:
        return Snapshot(runs=rows, runs_version=0, series={}, studies=tuple(studies),
                        study=None, checks={}, read_ms=0.0)

    assert said.news(snap(row(1, "running"), row(2, "finished"))) == []   # seen ended
    news = said.news(snap(row(1, "crashed", reason="out of memory"), row(2, "finished")))
    assert [(n.text, n.severity) for n in news] == [
        ("run 1 (run-1) crashed at step 10: out of memory", "error")]
    assert said.news(snap(row(1, "crashed"), row(2, "finished"))) == []   # once
    study = {"id": 3, "kind": "sweep", "name": "seeds", "status": "running",
             "variants": [{"run_id": 4}]}
    said.news(snap(row(4, "running"), studies=[study]))
    news = said.news(snap(row(4, "finished"), studies=[{**study, "status": "finished"}]))
    assert [n.text for n in news] == [
        "seed sweep 3 (seeds) finished: its table is in the A/B tab"]
    # Made after the first look and ended before the next (a run that diverged at once, a
    # tiny study): announced, as runs seen training are; the first look announces nothing.
    news = said.news(snap(row(5, "diverged", reason="NaN/inf loss"),
                          studies=[{**study, "id": 6, "status": "finished", "variants": []}]))
    assert [n.text for n in news] == [
        "seed sweep 6 (seeds) finished: its table is in the A/B tab",
        "run 5 (run-5) diverged at step 10: NaN/inf loss"]
    assert Announcer().news(snap(row(5, "diverged"), studies=[study])) == []



async def test_the_pair_follows_the_marks_and_u_clears_it(tmp_path):
    """F6 on runs 1 and 2, both unmarked: Compare no longer shows them; F6 with one run
    marked says what it needs; u (and its palette entry) clears the marks and the pair."""
    from test_snapshots import _fill
    from tui_trainer.ui.app import TrainerApp
    from tui_trainer.ui.panels.runs import RunTable
    _fill(tmp_path, marked=())
    app = TrainerApp(tmp_path, poll=False)
    said: list[str] = []
    notify = app.notify
    app.notify = lambda m, **kw: (said.append(str(m)), notify(m, **kw))[1]
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        await app.poll_now()
        table = app.query_one(RunTable)
        table.focus()
        for rid in (1, 2):
            table.post_message(RunTable.MarkToggled(rid))
        await pilot.pause(0.3)
        await pilot.press("f6")
        await pilot.pause(0.3)
        assert app.pair == [1, 2] and app.selection.compared(app.runs) == [1, 2]
        for rid in (1, 2):
            table.post_message(RunTable.MarkToggled(rid))
        await pilot.pause(0.3)
        assert app.marked == [] and app.pair == []
        assert app.selection.compared(app.runs) != [1, 2]
        table.post_message(RunTable.MarkToggled(2))
        await pilot.pause(0.3)
        table.focus()
        await pilot.press("f6")
        await pilot.pause(0.3)
        assert any("only run 2 is marked" in m for m in said), said
        await pilot.press("u")
        await pilot.pause(0.3)
        assert app.marked == [] and app.pair == []
        assert any("no run marked, no pair" in m for m in said), said
        assert "Clear marks and pair" in [c.title for c in
                                          app.get_system_commands(app.screen)]
