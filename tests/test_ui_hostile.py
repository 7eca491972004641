"""The dashboard over a hostile session: run, study and preset names made of Textual markup
and terminal escape sequences, a 100,000-character name, hostile log lines; clicks on every
name cell. Text from data must show as text: nothing is run, written or linked, no
escape sequence reaches the terminal, and a damaged session is refused with a message."""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import struct
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from textual.widgets import DataTable, Log, Static

from conftest import damage_table, in_private_mount
from tui_trainer.core.settings.config import DEFAULTS
from tui_trainer.core.session.store import SessionStore
from tui_trainer.core.text import shown
from tui_trainer.ui.app import TrainerApp

SIZE = (180, 55)


def hostile_names(shots) -> list[str]:
    return [
        "[@click=app.quit]quit[/]",
        f"[@click=app.screenshot('f.svg','{shots}')]shot[/]",
        "[link=file:///etc/passwd]a link[/link]",
        "x[/]",
        "\x1b]0;PWNED-TITLE\x07title",
        "\x1b]52;c;ZXZpbA==\x07clip",
        "\x1b[2Jclear\x1b[31mred",
        "A" * 100_000,
    ]


def _fill(session, names: list[str]) -> None:
    s = SessionStore(session)
    cfg = {**DEFAULTS.to_dict(), "data_dir": "[b]bold[/b] \\x1b"}
    for rid, name in enumerate(names, 1):
        s.create_run({**cfg, "seed": rid}, name=name)
        s.add_rows(steps=[{"step": k, "epoch": k / 10, "elapsed": k * 0.1, "loss": 2.0 / k,
                           "samples_per_s": 1000.0, "rss_bytes": 2.0**29}
                          for k in range(1, 11)],
                   evals=[{"step": 10, "epoch": 1.0, "loss": 0.5, "accuracy": 0.8}],
                   fingerprints=[{"step": k, "sha256": hashlib.sha256(
                       f"{k}-{rid}".encode()).hexdigest(), "l2": 9.0,
                       "sketch": struct.pack("2d", rid, 0.0)} for k in (0, 5, 10)],
                   run_id=rid)
        s.set_progress(rid, 10, 1.0)
        s.end_run(rid, "finished", {"samples_per_s": 1000.0, "elapsed_s": 1.0})
        s.log_path(rid).parent.mkdir(parents=True, exist_ok=True)
        s.log_path(rid).write_text(f"hello {name[:80]}\n"
                                   "\x1b]0;LOG-TITLE\x07 [@click=app.quit]q[/]\n")
    study = s.create_study("ab", names[0] + names[4], {"vary": [["seed", [2]]], "steps": 10},
                           [{"label": names[3], "config": cfg},
                            {"label": names[0], "key": "seed", "value": 2, "config": cfg}])
    s.set_study_run(study, 0, 1)
    s.set_study_run(study, 1, 2, names[2])
    s.set_study_status(study, "finished", names[1])
    # a price study whose kept prices are not a mapping, running (its variant "now")
    price = s.create_study("price", names[6], {"prices": [names[0]], "cap": names[1]},
                           [{"label": names[3], "config": cfg},
                            {"label": names[5], "key": "seed", "value": 2, "config": cfg}])
    s.set_study_status(price, "running")
    # a study whose spec is not what a study keeps (its jobs a word): shown as damaged
    damaged = s.create_study("ab", names[2], {"vary": [["seed", [2]]], "steps": 10,
                                              "jobs": names[0]},
                             [{"label": names[3], "config": cfg},
                              {"label": names[0], "key": "seed", "value": 2, "config": cfg}])
    s.set_study_status(damaged, "finished")
    s.add_event(2, "repro_verdict", names[0], data={"runs": [1, 2], "mode": "resume",
                                                     "resume_at": names[0], "identical": False,
                                                     "fingerprints_compared": names[3]})
    # a kept explanation that is not one of the tool's answers: hostile words, keys missing
    s.add_event(2, "explanation", names[5], data={"runs": [1, 2], "verdict": "op",
                                                  "step": names[0], "op": {"name": names[4]}})
    s.add_event(1, "explanation", names[0], data=[names[6]])
    s.set_meta("ui_state", json.dumps({"marked": [1, 2], "pair": [1, 2], "cursor": 1,
                                       "tab": "tab-plots", "study": study}))
    s.close()


def _all_text(app) -> str:
    """What the whole screen shows, as the SVG a screenshot would save."""
    return app.export_screenshot()


@pytest.fixture
def hostile(tmp_path, isolated_home):
    shots = tmp_path / "shots"
    names = hostile_names(shots)
    session = tmp_path / "session"
    _fill(session, names)
    presets = isolated_home / "presets"
    presets.mkdir(parents=True)
    (presets / "[@click=app.quit]preset.toml").write_text("seed = 3\n")   # no '/' in a file name
    (presets / "\x1b]0;PRESET\x07.toml").write_text("seed = 4\n")
    return session, names, shots


async def test_hostile_names_show_as_text_on_every_tab_and_clicks_do_nothing(hostile):
    session, names, shots = hostile
    app = TrainerApp(session, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.app.ready()
        await app.poll_now()
        await pilot.pause()
        table = app.query_one("#runs", DataTable)
        for rid, name in enumerate(names, 1):
            cell = table.get_cell(str(rid), "name")
            assert str(cell) == shown(name, 40)                  # shown, escaped, capped
            assert not cell.spans and "\x1b" not in str(cell)
        # Clicks on every name cell, at its start, middle and end.
        widths = [c.get_render_width(table) for c in table.columns.values()]
        start = sum(widths[:2])
        for row in range(min(len(names), table.size.height - 1)):
            for x in (start + 1, start + widths[2] // 2, start + widths[2] - 2):
                await pilot.click("#runs", offset=(x, row + 1))
                assert app.screen is app.screen_stack[0]        # no dialog, no quit
        await pilot.pause()
        assert app.is_running and app.return_code is None        # not quit
        assert not shots.exists()                                # no screenshot written
        for tab in ("tab-plots", "tab-divergence", "tab-compare", "tab-ab", "tab-log"):
            app.query_one("#tabs").active = tab
            await pilot.pause()
            await app.poll_now()
            await pilot.pause()
            screen = _all_text(app)
            assert "\x1b" not in screen and "\x07" not in screen, tab
            assert app.is_running, tab
        # a price study with hostile prices: shown, its names as text, nothing raises
        from tui_trainer.ui.panels.ab import ABPanel
        app.query_one("#tabs").active = "tab-ab"
        app.query_one(ABPanel).post_message(ABPanel.StudyChosen(2))
        await pilot.pause()
        await app.poll_now()
        await pilot.pause()
        title = str(app.query_one("#ab-title", Static).render())
        assert title.startswith("Price 2 \\x1b[2Jclear") and app.is_running, title
        lines = str(app.query_one("#ab-row", Static).render())
        assert lines.startswith("\\x1b]52;c;ZXZpbA==\\x07clip: its first pairs are being "
                                "measured"), lines
        # a study whose spec cannot be read: said, as text, its table empty
        app.query_one(ABPanel).post_message(ABPanel.StudyChosen(3))
        await pilot.pause()
        await app.poll_now()
        await pilot.pause()
        title = str(app.query_one("#ab-title", Static).render())
        assert title.startswith("Study 3 [link=file:///etc/passwd]a link[/link] (finished) "
                                "cannot be read (damaged: study 3: its jobs is "
                                "'[@click=app.quit]quit[/]'; a study's jobs is 1 to "), title
        assert app.query_one("#ab-table", DataTable).row_count == 0 and app.is_running
        # The verdict and the A/B title hold the names, literally.
        app.query_one("#tabs").active = "tab-divergence"
        await pilot.pause()
        await app.poll_now()
        verdict = app.query_one("#verdict", Static).render()
        assert "[@click=app.quit]quit[/]" in str(verdict)
        assert not any("@click" in str(span.style) or "link" in str(span.style)
                       for span in getattr(verdict, "spans", []))
        explained = str(app.query_one("#explanation", Static).render())
        assert "cannot be read (damaged: " in explained and "\x1b" not in explained
        await pilot.press("e")                  # its evidence: said as damaged, as text
        await pilot.pause()
        assert "cannot be read" in str(app.screen.query_one("#evidence-text Static").render())
        await pilot.press("escape")
        log = app.query_one("#log", Log)
        assert not any("\x1b" in line for line in log.lines)
        # Hostile preset names in the preset list, and a notification carrying markup.
        app.notify("x[/] [@click=app.quit]y[/] \x1b]0;N\x07")
        await pilot.pause()
        assert app.is_running
        preset_prompts = [str(p) for p, _ in app.query_one("#preset")._options]
        assert "[@click=app.quit]preset (mine)" in preset_prompts
        assert "\\x1b]0;PRESET\\x07 (mine)" in preset_prompts


async def test_the_log_tab_shows_escape_sequences_escaped(hostile):
    session, names, _ = hostile
    app = TrainerApp(session, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.app.ready()
        app.query_one("#tabs").active = "tab-log"
        await pilot.pause()
        for _ in range(3):
            await app.poll_now()
            await pilot.pause()
        lines = app.query_one("#log", Log).lines
        assert "\\x1b]0;LOG-TITLE\\x07 [@click=app.quit]q[/]" in lines


async def test_a_damaged_session_is_refused_with_a_message_and_the_open_one_stays(
        tmp_path, isolated_home):
    good = tmp_path / "good"
    SessionStore(good).close()
    broken = isolated_home / "sessions" / "broken"
    broken.mkdir(parents=True)
    (broken / "session.sqlite").write_bytes(b"")
    app = TrainerApp(good, poll=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.app.ready()
        app.action_session("open_session")
        await pilot.pause()
        option_list = app.screen.query_one("#open-list")
        for _ in range(100):                    # the sessions are listed by a worker
            if option_list.option_count:
                break
            await pilot.pause(0.05)
        broken_option = next(o for o in option_list.options if o.id == str(broken))
        assert broken_option.disabled and "damaged" in str(broken_option.prompt)
        await pilot.press("escape")
        app.switch_session(broken)
        for _ in range(200):                    # opened in a worker, off the UI thread
            if app._notifications:
                break
            await pilot.pause(0.05)
        assert app.session_dir == good.resolve() and app.is_running
        assert any("is empty (0 bytes)" in str(n.message) for n in app._notifications)
    assert (broken / "session.sqlite").stat().st_size == 0       # nothing written
    # Started on it, the dashboard ends at once and says why (the command prints it).
    refused = TrainerApp(broken)
    async with refused.run_test(size=SIZE) as pilot:
        for _ in range(200):
            if refused.refused is not None:
                break
            await pilot.pause(0.05)
    with pytest.raises(Exception, match="0 bytes"):
        raise refused.refused
    assert refused.return_code == 1 and refused.writer is None


def test_a_read_only_session_opens_for_viewing_and_refuses_to_train(hostile, tmp_path):
    session, names, _ = hostile
    probe = tmp_path / "probe.py"
    probe.write_text(textwrap.dedent("""
        import asyncio, sys
        from tui_trainer.ui.app import TrainerApp

        async def main():
            app = TrainerApp(sys.argv[1], poll=False)
            async with app.run_test(size=(180, 55)) as pilot:
                await pilot.app.ready()
                await pilot.press("f2")
                await pilot.pause()
                await app.poll_now()
                await pilot.pause()
                print("readonly", app.store.readonly, "(read-only)" in app.sub_title)
                print("rows", app.query_one("#runs").row_count)
                print("notes", [str(n.message) for n in app._notifications])
        asyncio.run(main())
    """))
    ro = tmp_path / "ro"
    p = in_private_mount(f"""
        mkdir -p {ro} && mount -t tmpfs tmpfs {ro} && cp -a {session}/. {ro}/
        rm -f {ro}/session.sqlite-wal {ro}/session.sqlite-shm
        mount -o remount,ro {ro}
        python {probe} {ro}
    """)
    assert p.returncode == 0, p.stderr
    assert "readonly True True" in p.stdout
    assert f"rows {len(names)}" in p.stdout
    assert "not started: this session is read-only" in p.stdout


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_escape_sequences_in_names_never_reach_a_real_terminal(hostile, isolated_home):
    """Under tmux, OSC 0 in a name would set the pane's title; the dashboard and `runs`
    must leave it alone."""
    session, names, _ = hostile
    socks = [f"tt-{uuid.uuid4().hex[:8]}", f"tt-{uuid.uuid4().hex[:8]}"]
    sock = socks[0]

    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True,
                              check=True).stdout

    env = f"env -u COLUMNS -u LINES TUI_TRAINER_HOME={shlex.quote(str(isolated_home))} "
    py = shlex.quote(sys.executable)
    try:
        tmux("new-session", "-d", "-x", "200", "-y", "50",
             f"{env}{py} -m tui_trainer --session {shlex.quote(str(session))}")
        tmux("set-option", "-g", "allow-rename", "on")
        deadline = time.time() + 60
        # The run table comes with the first screen, the form (Start) just after it.
        while not all(w in tmux("capture-pane", "-p")
                      for w in ("[@click=app.quit]quit[/]", "Start (F2)")) \
                and time.time() < deadline:
            time.sleep(0.3)
        screen = tmux("capture-pane", "-p")
        assert "Start (F2)" in screen
        assert "[@click=app.quit]quit[/]" in screen, screen         # shown as text
        time.sleep(1.0)
        assert "PWNED" not in tmux("display-message", "-p", "#{pane_title}")
        tmux("kill-server")
        sock = socks[1]                 # a server of its own: no race with the one ending
        tmux("new-session", "-d", "-x", "200", "-y", "50",
             f"{env}{py} -m tui_trainer runs --session {shlex.quote(str(session))}; sleep 30")
        deadline = time.time() + 60
        while "finished" not in tmux("capture-pane", "-p") and time.time() < deadline:
            time.sleep(0.3)
        assert "\\x1b]0;PWNED-TITLE\\x07title" in tmux("capture-pane", "-p")
        assert "PWNED" not in tmux("display-message", "-p", "#{pane_title}")
    finally:
        for name in socks:
            subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True)


async def test_a_damaged_page_of_old_rows_is_said_and_the_dashboard_stays(tmp_path):
    """Opening checks the tables that grow with the runs, not every row (issue 56): a
    session whose step rows are damaged opens, and the polling thread says the damage in
    one notification (once, not every tick) instead of ending the app."""
    with SessionStore(tmp_path) as w:
        for i in range(2):
            rid = w.create_run(DEFAULTS.to_dict(), name=f"r{i}")
            w.add_rows(steps=[{"step": s, "epoch": s / 100, "loss": 1.0 / s}
                              for s in range(1, 3001)], run_id=rid)
            w.end_run(rid, "finished", {})
    damage_table(tmp_path, "steps")
    app = TrainerApp(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(200):
            if app._notifications:
                break
            await pilot.pause(0.05)
        await pilot.pause(2.0)                  # more ticks (twice a second): said once
        said = [str(n.message) for n in app._notifications]
        assert len([m for m in said if "session.sqlite is damaged" in m]) == 1, said
        assert app.is_running
