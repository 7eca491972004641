"""Starting, stopping and continuing runs as background processes.

Each run trains in its own process (`tui-trainer run --run-id N` or `tui-trainer resume N`),
in a process session of its own, with stdout and stderr going to the run's log file: the
dashboard never shares a GIL with training, a crash in training cannot take it down, and
runs keep training after the dashboard quits (it reattaches through the session store).

Core layer: imports neither torch nor textual.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from .store import SessionStore

NICENESS = 10


def _terminate(pid: int | None) -> bool:
    """SIGTERM: the process finishes its step, writes a checkpoint and exits."""
    if not pid:
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    return True


def exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"its process was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"its process was killed by signal {-code}"
    return f"its process exited with status {code}"


class Supervisor:
    def __init__(self, store: SessionStore):
        self.store = store
        self._children: dict[int, subprocess.Popen] = {}
        self._jobs: list[subprocess.Popen] = []

    def _spawn(self, args: list[str], log_path: Path) -> subprocess.Popen:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # Training runs at a lower CPU priority than the dashboard: with several runs on few
        # cores the dashboard would otherwise wait its turn behind every training thread.
        nice = [shutil.which("nice") or "", "-n", str(NICENESS)] if shutil.which("nice") else []
        with open(log_path, "ab") as log:
            return subprocess.Popen(
                [*nice, sys.executable, "-m", "tui_trainer", *args,
                 "--session", str(self.store.dir)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def _spawn_run(self, run_id: int, args: list[str]) -> None:
        proc = self._spawn(args, self.store.log_path(run_id))
        self._children[run_id] = proc
        # From now on a run whose process dies before it starts training reads as crashed.
        self.store.set_launcher(run_id, proc.pid)

    def job(self, args: list[str], name: str) -> subprocess.Popen:
        """A background command that trains runs of its own (a repro check, an A/B study),
        its output in logs/<name>.log."""
        proc = self._spawn(args, self.store.logs_dir / f"{name}.log")
        self._jobs.append(proc)
        return proc

    def jobs_running(self) -> int:
        return sum(1 for p in self._jobs if p.poll() is None)

    def stop_study(self, study_id: int) -> bool:
        """Asks a running study to stop: its current run stops with a checkpoint."""
        study = self.store.study(study_id)
        return study["status"] == "running" and _terminate(study["pid"])

    def start(self, config: dict[str, Any], name: str | None = None,
              twin_of: int | None = None) -> int:
        """Creates the run in the session and starts training it in the background."""
        run_id = self.store.create_run(config, name=name, twin_of=twin_of)
        self._spawn_run(run_id, ["run", "--run-id", str(run_id)])
        return run_id

    def repeat(self, run_id: int) -> int:
        """A twin: the same config, paired with the original for divergence."""
        run = self.store.run(run_id)
        return self.start(run["config"], name=f"{run['name']}-twin", twin_of=run_id)

    def resume(self, run_id: int, overrides: dict[str, Any] | None = None,
               restart: bool = False) -> None:
        # A run that just stopped may still be closing its process; let it finish first.
        previous = self._children.get(run_id)
        if previous is not None:
            try:
                previous.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        args = ["resume", str(run_id)] + (["--restart"] if restart else [])
        for key, value in (overrides or {}).items():
            args += ["--set", f"{key}={value}"]
        self._spawn_run(run_id, args)

    def stop(self, run_id: int) -> bool:
        """Asks a live run to stop: it finishes its step and writes a checkpoint."""
        run = self.store.run(run_id)
        return self.store.is_live(run) and _terminate(run["pid"])

    def live_runs(self) -> list[int]:
        """Runs training now, including ones this dashboard launched that are still starting."""
        live = {r["id"] for r in self.store.runs() if self.store.is_live(r)}
        live |= {run_id for run_id in self._children if self.starting(run_id)}
        return sorted(live)

    def reap(self) -> dict[int, int]:
        """Collects exit statuses of children that ended (no zombies); {run_id: status}. A
        run left 'created' or 'running' by its ended child is stored as crashed, with how
        the process ended."""
        ended = {}
        for run_id, proc in list(self._children.items()):
            code = proc.poll()
            if code is not None:
                ended[run_id] = code
                del self._children[run_id]
                if not self.store.readonly:
                    self.store.reconcile(run_id, reason=exit_text(code))
        self._jobs = [p for p in self._jobs if p.poll() is None]
        return ended

    def starting(self, run_id: int) -> bool:
        """True while a child launched by us has not yet marked its run running."""
        proc = self._children.get(run_id)
        return proc is not None and proc.poll() is None \
            and self.store.run(run_id)["stored_status"] == "created"
