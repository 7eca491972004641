"""How long until the dashboard's first screen is up, from a cold `python` process.

Runs `tui-trainer --session DIR` in a real terminal (tmux, 180x50), and times from launching
the process to the moment capture-pane first shows the form and the run table. Compared in
the same run against a bare `python -c pass` launched the same way (the floor: interpreter
start-up plus tmux), and against `python -c "import torch"`, which the dashboard must never
pay. Goal: first screen under 1 second.

    python benchmarks/startup.py [--repeats 5] [--runs 0] [--peer DIR]

--peer DIR: also the first screen of another checkout of tui-trainer (`git worktree add DIR
REV`), launched the same way, in turns with this tree's: the same machine in the same run,
so a figure measured on another CPU for REV scales to this tree there.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path


def time_until(command: str, ready, timeout: float = 30.0) -> float:
    sock = f"bench-{uuid.uuid4().hex[:8]}"
    tmux = ["tmux", "-L", sock]
    t0 = time.perf_counter()
    subprocess.run(tmux + ["new-session", "-d", "-x", "180", "-y", "50",
                           f"env -u COLUMNS -u LINES {command}; sleep 30"], check=True)
    try:
        while time.perf_counter() - t0 < timeout:
            screen = subprocess.run(tmux + ["capture-pane", "-p"], capture_output=True,
                                    text=True).stdout
            if ready(screen):
                return time.perf_counter() - t0
            time.sleep(0.01)
        raise TimeoutError(command)
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--runs", type=int, default=0,
                    help="fill the session with this many finished runs first")
    ap.add_argument("--peer", type=Path, default=None,
                    help="another checkout whose first screen is timed in the same run")
    args = ap.parse_args()
    py = shlex.quote(sys.executable)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TMUX_TMPDIR"] = tmp     # its tmux servers' sockets, removed with it
        session = Path(tmp) / "session"
        for _ in range(args.runs):
            subprocess.run([sys.executable, "-m", "tui_trainer", "run", "--session",
                            str(session), "--set", "dataset=mnist-sample", "--set",
                            "max_steps=20"], check=True, capture_output=True)
        app = f"{py} -m tui_trainer --session {shlex.quote(str(session))}"
        cases = {
            "python -c pass (floor)": (f"{py} -c 'print(\"READY\")'", lambda s: "READY" in s),
            "import torch (never paid by the UI)":
                (f"{py} -c 'import torch; print(\"READY\")'", lambda s: "READY" in s),
            "tui-trainer first screen":
                (app, lambda s: "Start (F2)" in s and "samples/s" in s
                 and "Reproducibility" in s),
        }
        if args.peer is not None:
            peer = shlex.quote(str(args.peer.resolve()))
            other = shlex.quote(str(Path(tmp) / "peer-session"))   # (its own schema)
            cases["peer first screen"] = (
                f"env -C {peer} PYTHONPATH={peer} {py} -m tui_trainer --session {other}",
                cases["tui-trainer first screen"][1])
        results = {name: [] for name in cases}
        for _ in range(args.repeats):
            for name, (cmd, ready) in cases.items():
                results[name].append(time_until(cmd, ready))
    print(f"{args.repeats} repeats, session with {args.runs} runs; seconds from launch "
          "to screen (median, min, max):")
    for name, xs in results.items():
        print(f"  {name:<38} {statistics.median(xs):6.3f}  {min(xs):6.3f}  {max(xs):6.3f}")
    first = statistics.median(results["tui-trainer first screen"])
    if args.peer is not None:
        peer = statistics.median(results["peer first screen"])
        print(f"this tree / the peer ({args.peer}): {first / peer:.3f}")
    print(f"first screen: {first:.3f} s (goal < 1 s) -> {'MET' if first < 1 else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
