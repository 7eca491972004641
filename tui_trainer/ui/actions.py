"""What the dashboard's keys do to runs and sessions: the F2-F8 run actions (start, stop,
continue, repeat, compare, verdict, resume check) and export, save as, open and quit.

Mixins of TrainerApp (ui/app.py), which binds the keys and holds the state they read (the
runs of the last tick, the selection, the writer). Every write goes through `self.write`
(a worker thread); every question is a dialog (ui/screens.py).
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from textual import work

from ..core.settings import machine
from ..core.errors import SessionError
from ..core.analysis import activations, memory, profiling
from ..core.analysis.explain import for_pair
from ..core.session.paths import sessions_dir
from ..core.session.store import SessionStore
from ..core.processes.supervisor import Supervisor
from ..core.text import name_problem, shown
from .panels.launch import LaunchPanel
from .panels.model import ModelPanel
from .screens import (ConfirmScreen, ContinueScreen, MemoryScreen, NameScreen, OpenScreen,
                      QuitScreen)
from .writer import STATE_KEY


# How long after its process ended a background command's answer is waited for in the
# session (the tick read before the process wrote it does not hold it yet).
JOB_SETTLE_S = 3.0


def job_said(log: Path) -> str:
    """The last line a background command wrote (its refusal, when it refused), shown as
    text."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            tail = f.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return "its output cannot be read"
    return shown(tail[-1], 300) if tail else "it wrote nothing"


def twins_of(events: list[dict[str, Any]]) -> list[int]:
    """The twins a run's checks trained (its `check_twin` events, read as untrusted)."""
    return [c["data"]["twin"] for c in events if c.get("kind") == "check_twin"
            and isinstance(c.get("data"), dict) and isinstance(c["data"].get("twin"), int)]


@dataclass
class Job:
    """A background command this dashboard started for runs (x: explain a pair, b: measure a
    run's memory): its runs and process (None while it starts)."""
    runs: tuple[int, ...]
    job: Any
    started: float                  # monotonic
    wall: float                     # time.time() then: the session's events are after it
    ended: float | None = None

    def gave_up(self) -> bool:
        """Its process ended more than JOB_SETTLE_S ago (its answer, had it written one,
        would be in the tick by now)."""
        if self.job is None:
            return False            # still starting
        if self.ended is None and self.job.poll() is not None:
            self.ended = time.monotonic()
        return self.ended is not None and time.monotonic() - self.ended > JOB_SETTLE_S


class RunActions:
    """F2 start, F3 stop, F4 continue, F5 repeat, F6 compare, F7 verdict, F8 resume check,
    and "new run from this run's config": on the run under the cursor."""

    def _selected(self) -> Any:
        if self.cursor_run is None or self.cursor_run not in self.runs:
            self.notify("no run selected", severity="warning")
            return None
        return self.runs[self.cursor_run]

    def action_start(self) -> None:
        if self.writable("not started"):
            self.query_one(LaunchPanel).ask_start()

    def start_run(self, config: dict[str, Any], name: str | None) -> None:
        """The form's valid config (LaunchPanel.StartAsked): checked against this machine,
        then started by the supervisor; the cursor goes to the new run."""
        if not self.writable("not started"):
            return

        def started(run_id: int) -> None:
            self.cursor_run = run_id
            self.notify(f"run {run_id} started")

        self._start_checked(config, name, started)

    @work(thread=True, group="write")
    def _start_checked(self, config: dict[str, Any], name: str | None,
                       started: Callable[[int], None]) -> None:
        """Start, once core.settings.machine's rules say this machine can train the config (the
        machine is probed once, in a child process; the UI never imports torch)."""
        try:
            found = machine.problem(config, machine.facts())
        except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as e:
            found = None        # not known: the run's own check still refuses it
            self.call_from_thread(self.notify, f"the machine check failed ({e}); starting "
                                  "anyway", severity="warning")
        if found is not None:
            self.call_from_thread(self.notify, f"not started: {found}", severity="error",
                                  timeout=12)
            return
        self.call_from_thread(self.write, lambda _, sup: sup.start(config, name=name),
                              started, "not started")

    @work(thread=True, group="machine")
    def _probe_machine(self) -> None:
        try:
            m, error = machine.facts(), None
        except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as e:
            m, error = None, str(e)

        def show() -> None:
            for panel in self.query(LaunchPanel):
                panel.set_machine(m, error)

        self.call_from_thread(show)

    def action_stop(self) -> None:
        run = self._selected() if self.writable("not stopped") else None
        if run is None:
            return

        def done(ok: bool) -> None:
            self.notify(f"stopping run {run.id} after its current step" if ok else
                        f"run {run.id} is not training", severity="information" if ok
                        else "warning")

        self.write(lambda _, sup: sup.stop(run.id), done)

    def action_continue_run(self) -> None:
        run = self._selected() if self.writable("not continued") else None
        if run is None:
            return
        if self._training(run):
            self.notify(f"run {run.id} is still training", severity="warning")
            return

        def has_checkpoint(usable: bool) -> None:
            if not usable:
                def decided(yes: bool | None) -> None:
                    if yes:
                        self._continue(run.id, {}, restart=True)

                self.push_screen(ConfirmScreen(
                    f"Run {run.id} has no checkpoint to continue from. Train it again from "
                    f"step 0? Its {run.step} recorded steps are replaced as it goes.",
                    "Restart from step 0"), decided)
                return

            def how_far(answer: dict | None) -> None:
                if answer is None:
                    return
                changed = {k: v for k, v in answer.items() if run.config.get(k) != v}
                self._continue(run.id, changed)

            self.push_screen(ContinueScreen(run.id, run.step, run.config.get("epochs", 1),
                                            run.config.get("max_steps", 0) or 0), how_far)

        self.write(lambda s, _: bool(s.usable_checkpoints(run.id)), has_checkpoint)

    def _training(self, run: Any) -> bool:
        """Training now, or about to (a child this dashboard started for it)."""
        return run.status == "running" or (run.status == "created" and
                                           self.writer.supervisor.starting_cached(run.id))

    def _continue(self, run_id: int, overrides: dict[str, Any], restart: bool = False) -> None:
        extra = f" until {', '.join(f'{k}={v}' for k, v in overrides.items())}" \
            if overrides else ""
        self.notify(f"{'restarting' if restart else 'continuing'} run {run_id}{extra}"
                    + (" from step 0" if restart else ""))
        run = self.runs.get(run_id)
        if run is not None:     # the table says "continuing" until the run moves on
            self._continuing[run_id] = (run.status, run.step, time.monotonic())

        def resume(_: Any, sup: Supervisor) -> None:
            try:
                sup.resume(run_id, overrides, restart=restart)
            except BaseException:
                self._answer(self._continuing.pop, run_id, None)
                raise
        self.write(resume, failed=f"run {run_id} not continued")

    # A continued run reads "continuing" from F4 until its status or step moves (its process
    # marks it running as it starts), its process ends, or this long has passed.
    CONTINUING_S = 60.0

    def _continuing_now(self) -> frozenset[int]:
        now, out = time.monotonic(), set()
        for run_id, (status, step, asked) in list(self._continuing.items()):
            run = self.runs.get(run_id)
            alive = self.writer is not None and self.writer.supervisor.starting_cached(run_id)
            if run is None or (run.status, run.step) != (status, step) or \
                    now - asked > self.CONTINUING_S or (now - asked > 5 and not alive):
                del self._continuing[run_id]
            else:
                out.add(run_id)
        return frozenset(out)

    def action_repeat(self) -> None:
        run = self._selected() if self.writable("not repeated") else None
        if run is None:
            return

        def started(twin: int) -> None:
            self.pair = self.marked = [run.id, twin]
            self.notify(f"run {twin} started as a twin of run {run.id}")

        self.write(lambda _, sup: sup.repeat(run.id), started, "not repeated")

    def action_compare(self) -> None:
        ids = self.selection.compared(self.runs)
        if len(ids) < 2:
            self.notify("mark two runs or more with space (or repeat one) to compare them",
                        severity="warning")
            return
        if len(ids) == 2:
            self.pair = list(ids)
        self._tabs().active = "tab-compare"

    def action_config_from_run(self) -> None:
        run = self._selected()
        if run is not None:
            self.query_one(LaunchPanel).set_config(run.config)
            self.notify(f"the form holds run {run.id}'s config: change what you like, F2")

    def _checkable(self) -> Any:
        """The run under the cursor, when it can be checked (it has trained and stopped)."""
        run = self._selected() if self.writable("not checked") else None
        if run is None:
            return None
        if run.live:
            self.notify(f"run {run.id} is {run.status}: check it once it has finished or "
                        "stopped", severity="warning")
            return None
        if run.step < 1:
            self.notify(f"run {run.id} has no steps to compare", severity="warning")
            return None
        return run

    def _start_check(self, run: Any, resume_at: int | None, what: str) -> None:
        self._await_twin = run.id

        def started(job: Any) -> None:
            self._check_job = (run.id, job)

        self.write(lambda _, sup: sup.check(run.id, resume_at), started)
        self._tabs().active = "tab-divergence"
        self._save_state()
        self.notify(f"{what} of run {run.id}: training its twin; the verdict shows in the "
                    "Divergence tab")

    def action_explain(self) -> None:
        """x in the Divergence tab: where the pair's runs part and why, by `tui-trainer
        explain` in the background (it replays them); the answer lands in the session and
        the tab shows it."""
        if not self.writable("not explained"):
            return
        pair = self.selection.current_pair(self.runs)
        if pair is None:
            self.notify("mark two runs (space in the run table) to explain where they part",
                        severity="warning")
            return
        live = [r for r in pair if r in self.runs and self._training(self.runs[r])]
        if live:
            self.notify(f"run {live[0]} is training: explain the pair once it has stopped",
                        severity="warning")
            return
        if self._explaining is not None and self._explaining.ended is None:
            a, b = self._explaining.runs
            self.notify(f"already explaining runs {a} and {b}", severity="warning")
            return
        a, b = pair
        # said at once; its answer is kept after `wall` (before the process starts)
        self._explaining = Job((a, b), None, time.monotonic(), time.time())

        def failed() -> None:
            self._explaining = None

        self._tabs().active = "tab-divergence"
        self._draw()
        self._start_job(self._explaining, lambda sup: sup.explain(a, b), "not explained",
                        failed)

    def _start_job(self, job: Job, launch: Callable[[Any], Any], refused: str,
                   failed: Callable[[], None]) -> None:
        """Starts a background command through the supervisor (in the writer's thread);
        `job` gets its process, or `failed` is called and the user told `refused` and why."""
        def start(_: Any, sup: Any) -> Any:
            try:
                return launch(sup)
            except (SessionError, OSError) as e:
                return e

        def started(proc: Any) -> None:
            if isinstance(proc, Exception):
                failed()
                self.notify(f"{refused}: {proc}", severity="error", timeout=12)
            else:
                job.job = proc
            self._draw()

        self.write(start, started)

    def _explaining_now(self) -> tuple[int, int, float] | None:
        """The pair being explained and for how long: one this dashboard started, or the
        F7/F8 check whose verdict said NOT identical and which explains it now."""
        now = time.monotonic()
        e = self._explaining
        if e is not None:
            return (e.runs[0], e.runs[1], now - e.started)
        if self._check_job is not None and self.snapshot is not None:
            run_id, job = self._check_job
            if job.poll() is not None:
                return None
            twins = twins_of(self.snapshot.checks.get(run_id, []))
            if not twins:
                return None
            verdicts = [c for c in self.snapshot.checks.get(twins[-1], [])
                        if c["kind"] == "repro_verdict" and isinstance(c.get("data"), dict)
                        and not c["data"].get("identical")
                        and isinstance(c.get("t"), (int, float))]
            if verdicts and for_pair(self.snapshot.checks.get(twins[-1], []),
                                     (run_id, twins[-1])) is None:
                return (run_id, twins[-1], time.time() - verdicts[-1]["t"])
        return None

    def _explain_ended(self, snap: Any) -> None:
        """After each tick: an explain that ended is let go once its answer is in the
        session, or said to have failed (its log names why) when none came."""
        e = self._explaining
        if e is None:
            return
        a, b = e.runs
        if for_pair(snap.checks.get(b, []), e.runs, since=e.wall) is not None:
            self._explaining = None
        elif e.gave_up():
            self._explaining = None
            code = e.job.poll()
            self.notify(f"explaining runs {a} and {b} failed (exit status {code}); its output "
                        f"is in logs/explain-{a}-{b}.log", severity="error", timeout=12)

    def action_memory(self) -> None:
        """b in the Plots tab: the run under the cursor's newest memory breakdown, or (none
        yet, or asked again from its screen) one measured now on a copy of the run."""
        run = self._selected()
        if run is None:
            return
        found = memory.newest(self.snapshot.checks.get(run.id, [])) if self.snapshot else None
        if found is not None:
            self._show_memory(run.id, found)
        else:
            self.measure_memory(run.id)

    def measure_memory(self, run_id: int) -> None:
        if not self.writable("not measured"):
            return
        if self._measuring is not None:
            self.notify(f"already measuring run {self._measuring.runs[0]}", severity="warning")
            return
        self._measuring = Job((run_id,), None, time.monotonic(), time.time())
        self.notify(f"measuring one step of a copy of run {run_id} (a few seconds) ...")

        def failed() -> None:
            self._measuring = None

        self._start_job(self._measuring, lambda sup: sup.memory(run_id), "not measured",
                        failed)

    def _measured(self, snap: Any) -> None:
        """After each tick: a breakdown that landed is shown (or said, when another screen
        is up); a measurement that ended without one is said to have failed."""
        m = self._measuring
        if m is None:
            return
        run_id = m.runs[0]
        found = memory.newest(snap.checks.get(run_id, []), since=m.wall)
        if found is not None:
            self._measuring = None
            if len(self.screen_stack) == 1:
                self._show_memory(run_id, found)
            else:
                self.notify(f"run {run_id}'s memory breakdown is ready: b in the Plots tab")
            return
        if m.gave_up():
            self._measuring = None
            self.notify(f"measuring run {run_id}'s memory failed (exit status "
                        f"{m.job.poll()}); its output is in logs/memory-run-{run_id}.log",
                        severity="error", timeout=12)

    def action_profile(self) -> None:
        """p in the Profile tab: K steps of a copy of the run under the cursor under
        torch.profiler, or of both runs of the pair (then the tab diffs them)."""
        if not self.writable("not profiled"):
            return
        if self._profiling is not None:
            self.notify(f"already profiling run(s) {', '.join(map(str, self._profiling.runs))}",
                        severity="warning")
            return
        pair = self.selection.current_pair(self.runs)
        if pair:
            runs: tuple[int, ...] = tuple(pair)
        else:
            run = self._selected()
            if run is None:
                return
            runs = (run.id,)
        self._profiling = Job(runs, None, time.monotonic(), time.time())

        def failed() -> None:
            self._profiling = None

        self._draw()
        self._start_job(self._profiling, lambda sup: sup.profile(runs), "not profiled", failed)

    def _profiling_now(self) -> tuple[tuple[int, ...], float] | None:
        p = self._profiling
        return None if p is None else (p.runs, time.monotonic() - p.started)

    def _profiled(self, snap: Any) -> None:
        """After each tick: a profile that landed (on the last of its runs) lets the job go;
        one that ended without it is said to have failed."""
        p = self._profiling
        if p is None:
            return
        if profiling.newest(snap.checks.get(p.runs[-1], []), since=p.wall) is not None:
            self._profiling = None
            if self._tabs().active != "tab-profile":
                self.notify(f"the profile of run(s) {', '.join(map(str, p.runs))} is ready: "
                            "the Profile tab")
        elif p.gave_up():
            self._profiling = None
            self.notify(f"profiling run(s) {', '.join(map(str, p.runs))} failed (exit status "
                        f"{p.job.poll()}); its output is in logs/profile-"
                        f"{'-'.join(map(str, p.runs))}.log", severity="error", timeout=12)

    # --- the Model tab: what runs see in a digit ----------------------------------------
    def action_model(self, what: str) -> None:
        """The Model tab's keys (panels/model.py): show, a digit (by index, at random, the
        worst), the checkpoint before or after, the maps' size, one layer or all."""
        panel = self.panel(ModelPanel)
        if panel is None:
            return
        if what == "show":
            panel.ask()
        elif what == "digit":
            panel.ask_digit()
        elif what in ("random", "worst"):
            panel.ask_how(what)
        elif what in ("earlier", "later"):
            runs = panel.target
            if not runs or not self.writable("no other checkpoint shown"):
                return

            def kept(store: Any, _: Any) -> list[int]:
                steps = [{c["step"] for c in store.usable_checkpoints(r)} for r in runs]
                return sorted(set.intersection(*steps))

            self.write(kept, lambda steps: panel.ask_step(steps, what == "later"),
                       failed="the kept checkpoints could not be read")
        elif what in ("bigger", "smaller"):
            panel.resize_maps(what == "bigger")
        elif what == "layer":
            panel.next_layer()

    def on_model_panel_asked(self, event: ModelPanel.Asked) -> None:
        if not self.writable("not shown"):
            return
        if self._activating is not None:
            self.notify("already computing what run(s) "
                        f"{', '.join(map(str, self._activating.runs))} see", severity="warning")
            return
        runs, args = event.runs, event.choice.args()
        self._activating = Job(runs, None, time.monotonic(), time.time())

        def failed() -> None:
            self._activating = None

        self._draw()
        self._start_job(self._activating, lambda sup: sup.activations(runs, args), "not shown",
                        failed)

    def _activating_now(self) -> tuple[tuple[int, ...], float] | None:
        a = self._activating
        return None if a is None else (a.runs, time.monotonic() - a.started)

    def _activated(self, snap: Any) -> None:
        """After each tick: an answer that landed lets the job go; a command that ended
        without one is said to have failed, with its first refusal line (a digit out of
        range, a run with no checkpoint) from its log."""
        a = self._activating
        if a is None:
            return
        if activations.newest(snap.checks.get(a.runs[0], []), a.runs, since=a.wall) is not None:
            self._activating = None
            return
        if a.gave_up():
            self._activating = None
            name = f"logs/activations-{'-'.join(map(str, a.runs))}.log"
            self.notify(f"what run(s) {', '.join(map(str, a.runs))} see was not computed: "
                        f"{job_said(self.session_dir / name)} (its output: {name})",
                        severity="error", timeout=12)

    def _show_memory(self, run_id: int, result: dict[str, Any]) -> None:
        def closed(again: Any) -> None:
            if again:
                self.measure_memory(run_id)
        row = self.runs.get(run_id)
        resident = row.peak_memory_mib if row is not None and row.memory_kind == "RSS" \
            else None
        self.push_screen(MemoryScreen(f"Where run {run_id}'s memory goes", result, resident),
                         closed)

    def action_verdict(self) -> None:
        run = self._checkable()
        if run is not None:
            self._start_check(run, None, "determinism verdict")

    def action_resume_check(self) -> None:
        run = self._checkable()
        if run is None:
            return
        if run.step < 2:
            self.notify(f"run {run.id} is too short to kill in the middle", severity="warning")
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
                self.notify(f"resume check not started: step must be a whole number from 1 to "
                            f"{last}, got {text!r}", severity="error")
                return
            self._start_check(run, step, f"resume check at step {step}")

        self.push_screen(NameScreen(f"Resume check of run {run.id}: kill a twin at step "
                                    f"(1 to {last}), resume it from its checkpoint, compare:",
                                    str(max(1, run.step // 2))), chosen)


class SessionActions:
    """ctrl+e export, ctrl+s save as, ctrl+o open, ctrl+q quit (asking about live runs)."""

    def action_export(self) -> None:
        active = self._tabs().active
        compared = self.selection.compared(self.runs)
        if active == "tab-ab":
            if self.study_shown is None:
                self.notify("no A/B study to export", severity="warning")
                return
            what, ids = "study", [self.study_shown]
        elif active in ("tab-divergence", "tab-compare") and compared:
            what, ids = "runs", compared
        else:
            what, ids = "runs", self.selection.plotted()
        if not ids:
            self.notify("nothing to export: select or mark runs", severity="warning")
            return
        self.notify(f"exporting {what} {', '.join(map(str, ids))} ...")
        self._export(what, ids)

    @work(thread=True, group="export")
    def _export(self, what: str, ids: list[int]) -> None:
        """In a worker thread, with its own read-only connection; matplotlib takes a second
        or two, the dashboard keeps polling meanwhile."""
        from ..core.session.export import export_runs, export_study
        try:
            with SessionStore(self.session_dir, create=False, readonly=True) as store:
                out = store.dir / "exports"
                files = export_study(store, ids[0], out) if what == "study" \
                    else export_runs(store, ids, out)
        except (SessionError, OSError) as e:
            self.call_from_thread(self.notify, f"export failed: {e}", severity="error")
            return
        names = ", ".join(f.name for f in files)
        self.call_from_thread(self.notify, f"exported {len(files)} files to {out}: {names}",
                              timeout=12)

    def action_save_as(self) -> None:
        def save(name: str | None) -> None:
            if not name:
                return
            problem = name_problem(name)
            if problem:
                self.notify(f"not saved: the session name {problem}", severity="error")
                return
            target = Path(name).expanduser() if "/" in name else sessions_dir() / name
            live = [r.id for r in self.runs.values() if r.live]
            # The screen as it is now goes into the copy: a state write still waiting for
            # its timer would otherwise miss it (the copy reopened on another tab).
            state = self._state().to_json()
            writer = self.writer

            def copy(store: SessionStore, _: Supervisor) -> Path:
                if not writer.readonly:
                    store.set_meta(STATE_KEY, state)
                return store.copy_to(target)

            def copied(new: Path) -> None:
                note = (f"; {len(live)} run(s) still training go on in the original, "
                        "shown here as copied" if live else "")
                self.notify(f"session saved as {new}{note}")
                self.switch_session(new)

            self.write(copy, copied, "not saved")

        self.push_screen(NameScreen("Save this session as (a name, or a path):",
                                    f"{self.session_dir.name}-copy"), save)

    def action_open_session(self) -> None:
        def opened(path: Path | None) -> None:
            if path is not None and path != self.session_dir:
                self.switch_session(path, f"opened {path}")

        self.push_screen(OpenScreen(self.session_dir), opened)

    def _live(self) -> tuple[list[int], list[int]]:
        children = self.writer.supervisor.children() if self.writer else []
        live = sorted({r.id for r in self.runs.values() if r.live} | set(children))
        studies = [s["id"] for s in (self.snapshot.studies if self.snapshot else ())
                   if s["status"] == "running"]
        return live, studies

    async def action_quit(self) -> None:
        live, studies = self._live()
        if not live and not studies:
            self.exit()
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
                self.write(stop_all, lambda _: self.exit())
                return
            self.exit()

        self.push_screen(QuitScreen(live), decided)
