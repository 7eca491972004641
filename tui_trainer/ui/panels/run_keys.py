"""What F3-F8 do to the run under the cursor: stop, continue, repeat, compare, the
determinism verdict and the resume check, and "new run from this run's config". The run
table's (a mixin of RunTable, panels/runs.py), bound by the app so that they work wherever
the focus is (its APP_KEYS); every write goes through `app.write` (a worker thread), every
question is a dialog (ui/screens.py).

It keeps what these keys leave under way: the runs continued (F4) that still read as before
(`continuing_now`, drawn as "continuing"), and the check (F7/F8) whose twin is awaited and
its process (`awaiting_twin`, `checking`), which the Divergence tab follows.
"""

from __future__ import annotations

import time
from typing import Any

from textual.binding import Binding

from ...core.errors import BadInput
from ...core.processes.supervisor import Supervisor
from ...core.session.reader import Snapshot
from ..screens import ConfirmScreen, ContinueScreen, NameScreen
from .compare import ComparePanel
from .divergence import DivergencePanel, twins_of
from .launch import LaunchPanel


class RunKeys:
    """F3 stop, F4 continue, F5 repeat, F6 compare, F7 verdict, F8 resume check, on the run
    under the cursor (the app's `selected()`)."""

    APP_KEYS = [Binding("f3", "stop", "Stop"),
                Binding("f4", "continue_run", "Continue"),
                Binding("f5", "repeat", "Repeat"),
                Binding("f6", "compare", "Compare"),
                Binding("f7", "verdict", "Verdict"),
                Binding("f8", "resume_check", "Resume check")]
    COMMANDS = [
        ("Stop run", "Stop the run under the cursor, with a checkpoint", "stop"),
        ("Continue run", "Continue the run under the cursor from its checkpoint",
         "continue_run"),
        ("Repeat run", "Start a twin of the run under the cursor", "repeat"),
        ("Compare pair", "Compare the marked runs side by side", "compare"),
        ("Determinism verdict", "Train a twin of the run under the cursor and say whether the "
         "two are bit-identical", "verdict"),
        ("Resume check", "Kill a twin of the run under the cursor at a step, resume it, and "
         "say whether it matches the run", "resume_check"),
        ("New run from this run's config", "Load the config of the run under the cursor into "
         "the form", "config_from_run"),
        ("Clear marks and pair", "Unmark every run and forget the pair (u in the run "
         "table): the tabs follow the run under the cursor", "clear_marks")]

    # A continued run reads "continuing" from F4 until its status or step moves (its process
    # marks it running as it starts), its process ends, or this long has passed.
    CONTINUING_S = 60.0

    app: Any

    def init_run_keys(self) -> None:
        # runs continued (F4) that still read as before: {run: (status, step, when asked)}
        self.continuing: dict[int, tuple[str, int, float]] = {}
        self.awaiting_twin: int | None = None       # a check (F7/F8) whose twin is awaited
        self.checking: tuple[int, Any] | None = None    # that check: run, its process

    def action_stop(self) -> None:
        app = self.app
        if not app.writable("not stopped"):
            return
        # A run this dashboard has just started is stopped before the table shows it (F2
        # then F3 stops it, whatever a loaded machine's snapshots lag).
        run_id = app.cursor_run if app.ours(app.cursor_run) else getattr(app.selected(), "id",
                                                                          None)
        if run_id is None:
            return

        def done(ok: bool) -> None:
            app.notify(f"stopping run {run_id} after its current step" if ok else
                       f"run {run_id} is not training", severity="information" if ok
                       else "warning")

        app.write(lambda _, sup: sup.stop(run_id), done)

    def action_continue_run(self) -> None:
        app = self.app
        run = app.selected() if app.writable("not continued") else None
        if run is None:
            return
        if app.training(run):
            app.notify(f"run {run.id} is still training", severity="warning")
            return

        def has_checkpoint(usable: bool) -> None:
            if not usable:
                def decided(yes: bool | None) -> None:
                    if yes:
                        self._continue(run.id, {}, restart=True)

                app.push_screen(ConfirmScreen(
                    f"Run {run.id} has no checkpoint to continue from. Train it again from "
                    f"step 0? Its {run.step} recorded steps are replaced as it goes.",
                    "Restart from step 0"), decided)
                return

            def how_far(answer: dict | None) -> None:
                if answer is None:
                    return
                changed = {k: v for k, v in answer.items() if run.config.get(k) != v}
                self._continue(run.id, changed)

            app.push_screen(ContinueScreen(run.id, run.step, run.config.get("epochs", 1),
                                           run.config.get("max_steps", 0) or 0), how_far)

        app.write(lambda s, _: bool(s.usable_checkpoints(run.id)), has_checkpoint)

    def _continue(self, run_id: int, overrides: dict[str, Any], restart: bool = False) -> None:
        app = self.app
        extra = f" until {', '.join(f'{k}={v}' for k, v in overrides.items())}" \
            if overrides else ""
        app.notify(f"{'restarting' if restart else 'continuing'} run {run_id}{extra}"
                   + (" from step 0" if restart else ""))
        run = app.runs.get(run_id)
        if run is not None:     # the table says "continuing" until the run moves on
            self.continuing[run_id] = (run.status, run.step, time.monotonic())

        def resume(_: Any, sup: Supervisor) -> None:
            try:
                sup.resume(run_id, overrides, restart=restart)
            except BaseException:
                # (a lambda: Textual's call_from_thread cannot read a builtin's
                # signature, and raised ValueError in place of the refusal)
                app.answer(lambda: self.continuing.pop(run_id, None))
                raise
        app.write(resume, failed=f"run {run_id} not continued")

    def continuing_now(self) -> frozenset[int]:
        app, now, out = self.app, time.monotonic(), set()
        for run_id, (status, step, asked) in list(self.continuing.items()):
            run = app.runs.get(run_id)
            alive = app.writer is not None and app.writer.supervisor.starting_cached(run_id)
            if run is None or (run.status, run.step) != (status, step) or \
                    now - asked > self.CONTINUING_S or (now - asked > 5 and not alive):
                del self.continuing[run_id]
            else:
                out.add(run_id)
        return frozenset(out)

    def action_repeat(self) -> None:
        app = self.app
        run = app.selected() if app.writable("not repeated") else None
        if run is None:
            return

        def started(twin: int) -> None:
            app.pair = app.marked = [run.id, twin]
            app.notify(f"run {twin} started as a twin of run {run.id}")

        app.write(lambda _, sup: sup.repeat(run.id), started, "not repeated")

    def action_clear_marks(self) -> None:
        """u: no mark, no pair (Selection.cleared); the tabs follow the cursor."""
        app = self.app
        app._select(app.selection.cleared())
        if app.snapshot is not None:
            self.draw(app._tick())
        app.notify("no run marked, no pair: the tabs show the run under the cursor")
        app.refresh_all()

    def action_compare(self) -> None:
        app = self.app
        if len(app.marked) == 1:
            app.notify(f"only run {app.marked[0]} is marked: mark a second one with space to "
                       "compare the two (u clears the marks and the pair)", severity="warning")
            return
        ids = app.selection.compared(app.runs)
        if len(ids) < 2:
            app.notify("mark two runs or more with space (or repeat one) to compare them",
                       severity="warning")
            return
        if len(ids) == 2:
            app.pair = list(ids)
        app.activate_tab(ComparePanel.TAB)

    def action_config_from_run(self) -> None:
        app = self.app
        run = app.selected()
        if run is not None:
            app.query_one(LaunchPanel).set_config(run.config)
            app.notify(f"the form holds run {run.id}'s config: change what you like, F2")

    def _checkable(self) -> Any:
        """The run under the cursor, when it can be checked (it has trained and stopped)."""
        app = self.app
        run = app.selected() if app.writable("not checked") else None
        if run is None:
            return None
        if run.live:
            app.notify(f"run {run.id} is {run.status}: check it once it has finished or "
                       "stopped", severity="warning")
            return None
        if run.step < 1:
            app.notify(f"run {run.id} has no steps to compare", severity="warning")
            return None
        return run

    def _start_check(self, run: Any, resume_at: int | None, what: str) -> None:
        app = self.app
        self.awaiting_twin = run.id

        def start(_: Any, sup: Supervisor) -> Any:
            try:
                return sup.check(run.id, resume_at)
            except BadInput as e:       # (a net of the user's file: changed, not trusted)
                return e

        def started(job: Any) -> None:
            if isinstance(job, BadInput):
                if self.awaiting_twin == run.id:
                    self.awaiting_twin = None
                app.notify(f"{what} of run {run.id} not started: {job}", severity="error",
                           timeout=12)
                app.state_changed()
                return
            self.checking = (run.id, job)

        app.write(start, started, f"{what} of run {run.id} not started")
        app.activate_tab(DivergencePanel.TAB)
        app.state_changed()
        app.notify(f"{what} of run {run.id}: training its twin; the verdict shows in the "
                   "Divergence tab")

    def settle(self, snap: Snapshot) -> None:
        """After each tick: a check's twin, once it has started, is paired with its run."""
        if self.awaiting_twin is not None:
            twins = twins_of(snap.checks.get(self.awaiting_twin, []))
            if twins:
                self.app.pair = self.app.marked = [self.awaiting_twin, twins[-1]]
                self.awaiting_twin = None

    def action_verdict(self) -> None:
        run = self._checkable()
        if run is not None:
            self._start_check(run, None, "determinism verdict")

    def action_resume_check(self) -> None:
        app = self.app
        run = self._checkable()
        if run is None:
            return
        if run.step < 2:
            app.notify(f"run {run.id} is too short to kill in the middle", severity="warning")
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
                app.notify(f"resume check not started: step must be a whole number from 1 to "
                           f"{last}, got {text!r}", severity="error")
                return
            self._start_check(run, step, f"resume check at step {step}")

        app.push_screen(NameScreen(f"Resume check of run {run.id}: kill a twin at step "
                                   f"(1 to {last}), resume it from its checkpoint, compare:",
                                   str(max(1, run.step // 2))), chosen)
