"""The dashboard's A/B tab, driven with Pilot over real training processes: a study and
a seed sweep from the form, their tables, bands and exports, and the table at 80x24."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable, Input

from conftest import QUICK, click, db_rows, sets, tt
from test_ui import QUICK_FORM, SIZE, fill, notifications, until
from tui_trainer.ui.app import TrainerApp
from tui_trainer.ui.panels.divergence import DivergencePanel
from tui_trainer.ui.widgets.plots import MetricPlot


async def ab_tab_with_a_quick_form(pilot) -> None:
    await pilot.app.ready()
    await fill(pilot, QUICK_FORM)
    pilot.app.query_one("#tabs").active = "tab-ab"
    await pilot.pause()


@pytest.mark.slow
async def test_ab_study_from_the_dashboard_fills_its_table_and_exports(tmp_path):
    app = TrainerApp(tmp_path, poll=False)
    said = notifications(app)
    async with app.run_test(size=SIZE) as pilot:
        await ab_tab_with_a_quick_form(pilot)
        app.query_one("#ab-vary", Input).value = "batch_size=oops"
        await click(pilot, "#ab-start")
        await pilot.pause()
        assert db_rows(tmp_path, "SELECT 1 FROM studies") == []      # refused, nothing run
        app.query_one("#ab-vary", Input).value = "seed=2 deterministic=off"
        app.query_one("#ab-steps", Input).value = "4"
        app.query_one("#ab-repeats", Input).value = "1"      # one run each: no intervals
        await click(pilot, "#ab-start")
        try:
            await until(pilot, lambda: db_rows(tmp_path, "SELECT status FROM studies") ==
                        [("finished",)], timeout=600)
        except AssertionError:
            raise AssertionError(f"studies {db_rows(tmp_path, 'SELECT * FROM studies')}, runs "
                                 f"{db_rows(tmp_path, 'SELECT id, status FROM runs')}, said "
                                 f"{said}") from None
        await until(pilot, lambda: "finished, 3 of 3 runs done" in
                    str(app.query_one("#ab-title").render()))
        table = app.query_one("#ab-table", DataTable)
        rows = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
        assert [r[0] for r in rows] == ["base", "seed=2", "deterministic=off"]
        headings = [str(c.label) for c in table.columns.values()]
        assert headings[:3] == ["variant", "samples/s", "bit-identical to base"]
        memory = headings.index("peak mem MiB")
        assert all(r[1] != "-" and r[memory] != "-" for r in rows)  # samples/s, peak memory
        assert rows[1][2] == "no, from step 0"
        assert "x)" in rows[2][1]
        assert "finished, 3 of 3 runs done" in str(app.query_one("#ab-title").render())
        await pilot.press("ctrl+e")
        await until(pilot, lambda: any("exported" in str(n.message)
                                       for n in app._notifications))
        assert (tmp_path / "exports" / "study-1-ratios.png").exists()
        assert (tmp_path / "exports" / "study-1-table.csv").read_text().count("\n") == 4
        # Enter on a variant pairs it with the base.
        table.focus()
        table.move_cursor(row=1)
        await pilot.press("enter")
        await pilot.pause()
        assert app.pair == [1, 2]


async def test_the_ab_form_plans_an_until_sure_study_and_refuses_a_width_naming_it(tmp_path):
    app = TrainerApp(tmp_path, poll=False)
    said = notifications(app)
    async with app.run_test(size=SIZE) as pilot:
        await ab_tab_with_a_quick_form(pilot)
        app.query_one("#ab-vary", Input).value = "batch_size=32"
        app.query_one("#ab-steps", Input).value = "5000"
        app.query_one("#ab-sure", Input).value = "0.01"
        await click(pilot, "#ab-start")
        await until(pilot, lambda: any("sure %" in m for m in said))
        assert db_rows(tmp_path, "SELECT 1 FROM studies") == []      # refused, nothing run
        app.query_one("#ab-sure", Input).value = "5"
        await click(pilot, "#ab-start")
        await until(pilot, lambda: db_rows(tmp_path, "SELECT 1 FROM studies") == [(1,)])
        spec = db_rows(tmp_path, "SELECT json_extract(spec, '$.until_sure'), "
                       "json_extract(spec, '$.max_rounds') FROM studies")
        assert spec == [(0.05, 30)]
        await until(pilot, lambda: any("at most 5.0% wide (at most 30 rounds)" in m
                                       for m in said))
        # Stop at once: before a tick has drawn the study, maybe before its process has
        # marked it running (or has its signal handler). It ends stopped, and says so.
        await click(pilot, "#ab-stop")
        await until(pilot, lambda: any("stopping study 1" in m for m in said), timeout=30,
                    seen=lambda: said)
        await until(pilot, lambda: db_rows(tmp_path, "SELECT status FROM studies") ==
                    [("stopped",)], timeout=120, seen=lambda: (said, db_rows(
                        tmp_path, "SELECT status, message FROM studies")))
        await until(pilot, lambda: all(status != "running" for status, in
                                       db_rows(tmp_path, "SELECT status FROM runs")),
                    timeout=60)
        assert all(step < 5000 for step, in db_rows(tmp_path, "SELECT step FROM runs"))


async def test_a_seed_sweep_from_the_dashboard_plots_a_band_and_its_spread(tmp_path):
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await ab_tab_with_a_quick_form(pilot)
        app.query_one("#ab-steps", Input).value = "6"
        app.query_one("#ab-repeats", Input).value = "2"
        await click(pilot, "#ab-sweep")
        await until(pilot, lambda: db_rows(tmp_path, "SELECT kind, status FROM studies") ==
                    [("sweep", "finished")], timeout=600)
        await until(pilot, lambda: "Seed sweep 1" in str(app.query_one("#ab-title").render())
                    and "2 of 2 runs done" in str(app.query_one("#ab-title").render()))
        assert db_rows(tmp_path, "SELECT json_extract(config, '$.seed') FROM runs") == \
            [(1,), (2,)]
        table = app.query_one("#ab-table", DataTable)
        assert [str(c.label) for c in table.columns.values()][:2] == ["config", "seeds"]
        table.focus()
        table.move_cursor(row=0)
        await pilot.press("enter")                  # marks the sweep's runs
        await until(pilot, lambda: app.marked == [1, 2])
        app.query_one("#tabs").active = "tab-plots"
        await until(pilot, lambda: [ln.label for ln in app.query_one(
            "#plot-loss", MetricPlot)._pending] == ["sweep 1 min", "sweep 1 max",
                                                    "sweep 1 mean"])
        app.query_one("#tabs").active = "tab-divergence"
        await until(pilot, lambda: app.panel(DivergencePanel) is not None and "Seed sweep, 2 "
                    "seeds" in str(app.query_one("#verdict").render()))


async def test_at_80x24_the_ab_results_are_reached_by_tab_and_by_wheel_to_the_last_column(
        tmp_path):
    """A finished study whose title is long (the notes of arms this machine cannot run, on
    the CPU; the method), at 80x24: Tab reaching the results brings the table's header into
    view, the wheel reaches what is under it and back, and the table scrolls sideways a column a
    right-arrow press, to its last one within 8 presses."""
    from textual import events
    r = tt("ab", "--session", str(tmp_path), *sets(*QUICK), "--vary", "amp=fp16",
           "--vary", "device=cuda", "--vary", "batch_size=32", "--steps", "2",
           "--repeats", "2", "--rerun-loaded", "0")
    assert r.rc == 0, r.err
    app = TrainerApp(tmp_path, poll=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await app.ready()
        app.query_one("#tabs").active = "tab-ab"
        await pilot.pause()
        await until(pilot, lambda: app.query_one("#ab-table", DataTable).row_count == 4)
        body, table = app.query_one("#ab-body"), app.query_one("#ab-table", DataTable)

        def header_shown() -> bool:
            return body.region.contains(table.region.x, table.region.y)
        for _ in range(20):
            await pilot.press("tab")
            await pilot.pause()
            if app.focused is body:
                break
        assert app.focused is body and header_shown(), (body.region, table.region)
        body.scroll_home(animate=False)
        await pilot.pause()
        assert header_shown()        # the title is one line: the table shows as the tab opens
        for _ in range(10):         # the wheel reaches what is under the table (the method)
            await pilot._post_mouse_events([events.MouseScrollDown], widget="#ab-body",
                                           offset=(10, 0))
        await pilot.pause()
        assert body.scroll_y == body.max_scroll_y > 0
        assert "Enter on a row pairs it with the base" in str(
            app.query_one("#ab-method").render())
        for _ in range(10):
            await pilot._post_mouse_events([events.MouseScrollUp], widget="#ab-body",
                                           offset=(10, 0))
        await pilot.pause()
        assert header_shown(), (body.region, table.region)
        await pilot.press("tab")
        assert app.focused is table
        # Right shows the next column at the left edge, beside the variant's (fixed), to
        # the last one within 8 presses (issue 55); Left walks back the same way.
        starts, x = [], 0
        for column in table.ordered_columns[table.fixed_columns:]:
            starts.append(x)
            x += column.get_render_width(table)
        assert table.fixed_columns == 1 and table.max_scroll_x > 0
        seen = [table.scroll_x]
        for _ in range(8):
            await pilot.press("right")
            await pilot.pause()
            if table.scroll_x == seen[-1]:
                break
            seen.append(table.scroll_x)
        assert seen[-1] == table.max_scroll_x, seen
        assert all(x in starts for x in seen[:-1]) and seen == sorted(set(seen)), seen
        await pilot.press("left")
        await pilot.pause()
        assert table.scroll_x == max(x for x in starts if x < table.max_scroll_x)


async def test_a_price_decided_from_the_ab_tab_shows_its_looks_and_when_it_stops(tmp_path,
                                                                                 isolated_home):
    """device=cpu. The tab's Decide a price (a button and a palette entry) with knobs paid
    in every step: a price in windows (tui_trainer/pricing.py) started in the supervisor,
    the tab showing the looks it will stop at and, as it is decided, the interval, the
    pairs and the verdict, with each arm's start-up beside it; a variant this machine
    cannot train is skipped and said. A knob that changes how many cores a run keeps busy
    (num_threads) is priced after the windows, in the same job, as a study of whole runs
    (said when it starts, and shown once it trains; stopped at once here, its runs are not
    this test's claim)."""
    from tui_trainer.ui.panels.ab import ABPanel
    app = TrainerApp(tmp_path, poll=False)
    said = notifications(app)
    async with app.run_test(size=SIZE) as pilot:
        await ab_tab_with_a_quick_form(pilot)
        await fill(pilot, {"device": "cpu"})
        app.query_one("#tabs").active = "tab-ab"
        app.query_one("#ab-vary", Input).value = "batch_size=8 amp=fp16 num_threads=1"
        await pilot.click("#ab-price")
        await until(pilot, lambda: any(
            "then study 2: num_threads as whole runs (num_threads changes how many cores" in m
            for m in said), seen=lambda: said)
        assert db_rows(tmp_path, "SELECT id, kind, status FROM studies WHERE id = 2") == \
            [(2, "ab", "created")]          # (waiting for the price before it, in its job)

        def states() -> list[str]:
            t = app.query_one("#ab-table", DataTable)
            return [str(t.get_row_at(i)[3]) for i in range(t.row_count)]
        # before its first look: the variant priced now says when it looks, the next one
        # waits its turn (before, both read "waiting", and under the table "not priced")
        await until(pilot, lambda: states() == ["first look at 8", "waiting"], timeout=120,
                    seen=states)
        lines = str(app.query_one("#ab-row").render())
        assert "batch_size=8: its first pairs are being measured (the first look at 8 pairs)" \
            in lines and "amp=fp16: waiting its turn" in lines, lines
        await until(pilot, lambda: any("study 2 started: the whole runs after price 1" in m
                                       for m in said), timeout=300, seen=lambda: said)
        assert db_rows(tmp_path, "SELECT status FROM studies WHERE id = 1") == [("finished",)]
        await click(pilot, "#ab-stop")       # the tab shows study 2: Stop is aimed at it
        await until(pilot, lambda: db_rows(tmp_path, "SELECT status FROM studies WHERE id = 2")
                    == [("stopped",)], timeout=120)
        app.query_one(ABPanel).post_message(ABPanel.StudyChosen(1))     # the price again
        await until(pilot, lambda: "(finished)" in str(app.query_one("#ab-title").render()))
        title = str(app.query_one("#ab-title").render())
        from tui_trainer import pricing
        assert (f"stops at the first look that decides ({', '.join(map(str, pricing.LOOKS))} "
                "window pairs, the last its cap)") in title
        table = app.query_one("#ab-table", DataTable)
        assert table.row_count == 2        # num_threads is not a row of the price
        row = [str(c) for c in table.get_row_at(0)]
        assert row[0] == "batch_size=8" and row[1] in ("8", "12", "16"), row
        assert row[2].endswith("]") and row[3] == "slower", row
        assert "variant" in row[4] and "base" in row[4], row        # start-up beside it
        await pilot.pause()
        assert "start-up, not in the price" in str(app.query_one("#ab-row").render())
        # a variant this machine cannot train (fp16 on the CPU): skipped, and said so
        fp16 = [str(c) for c in table.get_row_at(1)]
        assert fp16[0] == "amp=fp16" and fp16[3] == "not possible here", fp16
        assert "amp=fp16: not possible on this machine (amp: fp16 needs" in \
            str(app.query_one("#ab-row").render())


async def test_seed_noise_decided_from_the_ab_tab_says_its_looks_and_its_answer(tmp_path):
    """The palette's "Decide seed noise": a seed sweep of the form's config that adds seeds
    until the sd of their accuracy is decided (`sweep --decide`), started in the
    supervisor; the tab says the looks it stops at and, under its table, the answer as the
    stored accuracies give it."""
    import json
    from tui_trainer.core.analysis import sequential
    from tui_trainer.ui.panels.ab import ABPanel
    app = TrainerApp(tmp_path, poll=False)
    said = notifications(app)
    async with app.run_test(size=SIZE) as pilot:
        await ab_tab_with_a_quick_form(pilot)
        app.query_one("#ab-steps", Input).value = "6"
        app.query_one(ABPanel).action_decide_seed_noise()
        await until(pilot, lambda: db_rows(tmp_path, "SELECT kind, status FROM studies") ==
                    [("sweep", "finished")], timeout=600)
        assert any("until the sd of their accuracy is under or over 0.50 points" in s
                   for s in said), said
        spec = json.loads(db_rows(tmp_path, "SELECT spec FROM studies")[0][0])
        assert spec["decide"] == sequential.DEFAULT_SPREAD and spec["max_rounds"] == 20
        accs = [a for (a,) in db_rows(tmp_path, "SELECT accuracy FROM evals e WHERE step = "
                                      "(SELECT MAX(step) FROM evals WHERE run_id = e.run_id) "
                                      "ORDER BY run_id")]
        d = sequential.decide_spread(accs, spec["decide"])
        assert d.decided and spec["repeats"] == d.rounds == len(accs)
        await until(pilot, lambda: str(app.query_one("#ab-row").render()) == d.words)
        assert "It decides: at 5, 8, 12, 16, 20 seeds" in \
            str(app.query_one("#ab-method").render())
