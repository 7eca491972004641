"""Does a run keep its speed beside another busy program? (issue 54)

One CPU hog (`while True: pass`, normal priority) runs throughout: with --hog own (the
default) in a process session of its own, as a program started from another terminal is
(Linux's autogroup gives each session a scheduling group); with --hog shell a background
job of the shell the foreground runs are typed into (this script's session). The same config (the default on
mnist-sample, --steps optimizer steps) is trained, interleaved, --repeats times each way:

    foreground      `tui-trainer run` typed into a shell (a child of this script, in its
                    session), torch's default threads
    foreground-1    the same with num_threads = 1
    dashboard       Start as the dashboard's F2 does it (core.processes.supervisor.Supervisor.start,
                    forked by its warm launcher at the dashboard's nice value), from a
                    process in a session of its own, as a dashboard in its own terminal
    cold            the same with no launcher (the fallback when none can start)

Each run's samples/s is the session's own figure (core.analysis.figures: the median over its logged
steps, start-up steps left out). Goal: dashboard and cold at least 90% of foreground's
median. With --keys, benchmarks/keys_tmux.py then measures the dashboard's keys with four
runs training beside the same hog (goals: F1 p95 <= 150 ms, typed echo p95 <= 50 ms).

    .venv/bin/python benchmarks/busy_machine.py [--steps 150] [--repeats 3] [--keys]
        [--hog own|shell|none] [--modes ...] [--study ROUNDS]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tui_trainer.core.settings import config
from tui_trainer.core.analysis import figures  # noqa: E402
from tui_trainer.core.session.store import SessionStore  # noqa: E402
from tui_trainer.core.processes.supervisor import Supervisor, dashboard_nice
from tui_trainer.launcher.client import WarmLauncher

GOAL = 0.9
MODES = ("foreground", "foreground-1", "dashboard", "cold")


def hog(where: str) -> subprocess.Popen:
    """`own`: a program of another terminal (a session, so a scheduling group, of its own);
    `shell`: a background job of the shell the foreground runs are typed into (its group)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"],
                            start_new_session=where == "own")


def wait_done(session: Path, run_id: int, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    with sqlite3.connect(session / "session.sqlite") as db:
        while time.monotonic() < deadline:
            row = db.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row and row[0] not in ("created", "running"):
                return
            time.sleep(0.2)
    raise TimeoutError(f"run {run_id} still training after {timeout:.0f} s")


def dashboard_side(session: Path) -> None:
    """`--as-dashboard`: what the dashboard does, in a process session of its own as a
    dashboard in its own terminal is: its launcher (at the dashboard's nice value, in its
    session), and for each line `warm` or `cold` on stdin a run started (Supervisor.start,
    with that launcher or none) and waited for; its id on stdout."""
    cfg = json.loads(sys.stdin.readline())
    warm = WarmLauncher(nice=dashboard_nice())
    warm.start()
    warm.wait_ready(60)
    try:
        with SessionStore(session) as store:
            sups = {"warm": Supervisor(store, warm), "cold": Supervisor(store)}
            for line in sys.stdin:
                run_id = sups[line.strip()].start(cfg, name=line.strip())
                wait_done(session, run_id)
                print(run_id, flush=True)
    finally:
        warm.close()


def one(mode: str, session: Path, cfg: dict, side: subprocess.Popen) -> float | None:
    if mode.startswith("foreground"):
        sets = [f"{k}={v}" for k, v in cfg.items()
                if k in ("dataset", "max_steps", "eval_samples", "eval_every")]
        if mode == "foreground-1":
            sets.append("num_threads=1")
        argv = [sys.executable, "-m", "tui_trainer", "run", "--session", str(session)]
        for s in sets:
            argv += ["--set", s]
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        with SessionStore(session, create=False, readonly=True) as store:
            run_id = max(r["id"] for r in store.runs())
    else:
        side.stdin.write("warm\n" if mode == "dashboard" else "cold\n")
        side.stdin.flush()
        run_id = int(side.stdout.readline())
    with SessionStore(session, create=False, readonly=True) as store:
        return figures.run_figures(store, run_id)["samples_per_s"]


def study(session: Path, steps: int, repeats: int) -> tuple[float, dict]:
    """The issue's A/B study (`ab --vary cudnn_benchmark=on`, the sample, --steps, --study
    rounds), timed from the command to its end: (seconds, its --json)."""
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "tui_trainer", "ab", "--session", str(session), "--json",
         "--set", "dataset=mnist-sample", "--vary", "cudnn_benchmark=on", "--steps",
         str(steps), "--repeats", str(repeats)], capture_output=True, text=True, check=True)
    return time.monotonic() - t0, json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--keys", action="store_true",
                    help="then time the dashboard's keys with four runs beside the hog")
    ap.add_argument("--key-repeats", type=int, default=30)
    ap.add_argument("--study", type=int, metavar="ROUNDS", default=0,
                    help="first time the A/B study of issue 54 with this many rounds on the "
                         "quiet machine, then beside the hog (goal: at most about 2x)")
    ap.add_argument("--hog", choices=("own", "shell", "none"), default="own",
                    help="where the CPU hog runs (none: a quiet machine)")
    ap.add_argument("--as-dashboard", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.as_dashboard:
        dashboard_side(args.as_dashboard)
        return 0
    home = Path(tempfile.mkdtemp(prefix="tui-trainer-busy-"))
    os.environ["TMUX_TMPDIR"] = str(home)    # its tmux socket, removed with it
    os.environ["TUI_TRAINER_HOME"] = str(home)
    session = home / "session"
    cfg = {**config.DEFAULTS.to_dict(), "dataset": "mnist-sample", "max_steps": args.steps,
           "eval_samples": 1000, "eval_every": 0}
    h = None
    speeds: dict[str, list[float]] = {m: [] for m in args.modes}
    ok = True
    studies: dict[str, tuple[float, dict]] = {}
    side = None
    try:
        if args.study:
            studies["quiet"] = study(home / "study-quiet", args.steps, args.study)
        SessionStore(session).close()
        side = subprocess.Popen([sys.executable, __file__, "--as-dashboard", str(session)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
        side.stdin.write(json.dumps(cfg) + "\n")
        side.stdin.flush()
        h = None if args.hog == "none" else hog(args.hog)
        time.sleep(1)
        if args.study:
            studies["beside the hog"] = study(home / "study-hog", args.steps, args.study)
        for r in range(args.repeats):
            for mode in args.modes:
                s = one(mode, session, cfg, side)
                speeds[mode].append(s or 0.0)
                print(f"round {r + 1} {mode:13} {s or 0:8.0f} samples/s", flush=True)
        where = f"beside one CPU hog ({args.hog} session)" if h is not None else \
            "on a quiet machine"
        print(f"\n{args.steps} steps of the default config on mnist-sample, {where}, "
              f"{os.cpu_count()} cores; samples/s (median of {args.repeats}, min-max)")
        base = statistics.median(speeds["foreground"]) if "foreground" in speeds else None
        for mode, got in speeds.items():
            med = statistics.median(got)
            line = f"{mode:13} {med:8.0f}  ({min(got):.0f}-{max(got):.0f})"
            if base and mode != "foreground":
                line += f"  {med / base:.2f}x foreground"
                if mode in ("dashboard", "cold"):
                    met = med >= GOAL * base
                    ok &= met
                    line += f"  goal >= {GOAL:.0%}: {'MET' if met else 'NOT MET'}"
            print(line)
        for where, (took, got) in studies.items():
            variant = got["rows"][1]
            print(f"A/B study ({args.study} rounds, {args.steps} steps) {where}: {took:.0f} s, "
                  f"loaded rounds {[r + 1 for r in variant['loaded_rounds']]}, re-runs "
                  f"{len(got['reruns'])}, verdict: {variant.get('verdict')}; notes: "
                  f"{got['notes']}")
        if len(studies) == 2:
            ratio = studies["beside the hog"][0] / studies["quiet"][0]
            print(f"the study beside the hog took {ratio:.2f}x its quiet time (goal: about "
                  f"2x at most): {'MET' if ratio <= 2.2 else 'NOT MET'}")
            ok &= ratio <= 2.2
    finally:
        if side is not None:
            side.stdin.close()
            side.wait(120)
    try:
        if args.keys:
            code = subprocess.run([sys.executable, str(Path(__file__).parent / "keys_tmux.py"),
                                   "--repeats", str(args.key_repeats)]).returncode
            ok &= code == 0
    finally:
        if h is not None:
            h.kill()
            h.wait()
        import shutil
        shutil.rmtree(home, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
