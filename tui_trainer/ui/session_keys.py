"""What the dashboard's session keys do: ctrl+e export (what the tab shown exports: the
runs, the pair or the study), ctrl+s save as, ctrl+o open another session, ctrl+q quit
(asking about live runs). The app binds them (`action_session`) and keeps the session
itself (open, switch, close, the writer); this class asks the questions (dialogs,
ui/screens.py) and hands each change to `app.write` (a worker thread).

What the keys do to runs is the panels': F2 the form's (panels/launch.py), F3-F8 the run
table's (panels/run_keys.py), a tab's own keys and the commands it starts (explain, the
memory breakdown, the profile, what the net sees) its panel's, with one job runner
(ui/jobs.py).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from ..core.errors import SessionError
from ..core.session.paths import sessions_dir
from ..core.session.store import SessionStore
from ..core.processes.supervisor import Supervisor
from ..core.text import name_problem
from .screens import NameScreen, OpenScreen, QuitScreen
from .writer import STATE_KEY


class SessionKeys:
    """ctrl+e export, ctrl+s save as, ctrl+o open, ctrl+q quit (asking about live runs)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def export(self) -> None:
        app = self.app
        kind = getattr(app._panel_of(), "EXPORTS", "plotted")    # its panel says what
        compared = app.selection.compared(app.runs)
        if kind == "study":
            if app.study_shown is None:
                app.notify("no A/B study to export", severity="warning")
                return
            what, ids = "study", [app.study_shown]
        elif kind == "compared" and compared:
            what, ids = "runs", compared
        else:
            what, ids = "runs", app.selection.plotted()
        if not ids:
            app.notify("nothing to export: select or mark runs", severity="warning")
            return
        app.notify(f"exporting {what} {', '.join(map(str, ids))} ...")
        app.run_worker(partial(self._export, what, ids), thread=True, group="export")

    def _export(self, what: str, ids: list[int]) -> None:
        """In a worker thread, with its own read-only connection; matplotlib takes a second
        or two, the dashboard keeps polling meanwhile."""
        from ..core.session.export import export_runs, export_study
        app = self.app
        try:
            with SessionStore(app.session_dir, create=False, readonly=True) as store:
                out = store.dir / "exports"
                files = export_study(store, ids[0], out) if what == "study" \
                    else export_runs(store, ids, out)
        except (SessionError, OSError) as e:
            app.call_from_thread(app.notify, f"export failed: {e}", severity="error")
            return
        names = ", ".join(f.name for f in files)
        app.call_from_thread(app.notify, f"exported {len(files)} files to {out}: {names}",
                             timeout=12)

    def save_as(self) -> None:
        app = self.app

        def save(name: str | None) -> None:
            if not name:
                return
            problem = name_problem(name)
            if problem:
                app.notify(f"not saved: the session name {problem}", severity="error")
                return
            target = Path(name).expanduser() if "/" in name else sessions_dir() / name
            live = [r.id for r in app.runs.values() if r.live]
            # The screen as it is now goes into the copy: a state write still waiting for
            # its timer would otherwise miss it (the copy reopened on another tab).
            state = app._state().to_json()
            writer = app.writer

            def copy(store: SessionStore, _: Supervisor) -> Path:
                if not writer.readonly:
                    store.set_meta(STATE_KEY, state)
                return store.copy_to(target)

            def copied(new: Path) -> None:
                note = (f"; {len(live)} run(s) still training go on in the original, "
                        "shown here as copied" if live else "")
                app.notify(f"session saved as {new}{note}")
                app.switch_session(new)

            app.write(copy, copied, "not saved")

        app.push_screen(NameScreen("Save this session as (a name, or a path):",
                                   f"{app.session_dir.name}-copy"), save)

    def open_session(self) -> None:
        app = self.app

        def opened(path: Path | None) -> None:
            if path is not None and path != app.session_dir:
                app.switch_session(path, f"opened {path}")

        app.push_screen(OpenScreen(app.session_dir), opened)

    def _live(self) -> tuple[list[int], list[int]]:
        app = self.app
        children = app.writer.supervisor.children() if app.writer else []
        live = sorted({r.id for r in app.runs.values() if r.live} | set(children))
        studies = [s["id"] for s in (app.snapshot.studies if app.snapshot else ())
                   if s["status"] == "running"]
        return live, studies

    def quit(self) -> None:
        app = self.app
        live, studies = self._live()
        if not live and not studies:
            app.exit()
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
                app.write(stop_all, lambda _: app.exit())
                return
            app.exit()

        app.push_screen(QuitScreen(live), decided)
