"""Data-parallel runs on a busy machine, beside other groups (issue 19, point 10): does
anything running beside a group make one of its ranks fail?

Each round starts K `nproc = 2` runs at once (60 steps each, the shipped sample), with two
busy-looping processes beside them, and kills one of the K outright (SIGKILL of its
launcher) a few seconds in, as other tests and users do to their own runs. Optionally
(--hammer) a prober connects to every port the surviving groups listen on (torchrun's two
stores, each rank's gloo port) every 50 ms through the whole run and sends it garbage: a
foreign connection to a group's rendezvous port. Every run that was not killed must
finish; the exit status is 1 if one did not, with its last lines.

    python benchmarks/groups_beside_groups.py [--rounds 12] [--groups 3] [--hammer]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

RUN = ["dataset=mnist-sample", "train_samples=650", "eval_samples=200", "batch_size=64",
       "nproc=2", "max_steps=60", "epochs=100", "log_every=1", "num_threads=1",
       "checkpoint_every=5"]


def start(session: Path) -> subprocess.Popen:
    sets = [a for kv in RUN for a in ("--set", kv)]
    return subprocess.Popen([sys.executable, "-m", "tui_trainer", "run", "--session",
                             str(session), "--json", *sets], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def hammer(procs: list[subprocess.Popen], done: threading.Event, hits: list[int]) -> None:
    """Connects to every port the groups listen on, sending garbage, until `done`."""
    while not done.is_set():
        ports = set()
        for p in procs:
            try:
                tree = [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
                ports |= {c.laddr.port for q in tree for c in q.net_connections()
                          if c.status == psutil.CONN_LISTEN}
            except psutil.Error:
                continue
        for port in ports:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                    s.sendall(os.urandom(256) if hits[0] % 2 else b"\0" * 32)
                hits[0] += 1
            except OSError:
                pass
        time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--groups", type=int, default=3)
    ap.add_argument("--hammer", action="store_true")
    args = ap.parse_args()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    finished = failed = 0
    hits = [0]
    try:
        with tempfile.TemporaryDirectory(prefix="tt-groups-") as tmp:
            for r in range(args.rounds):
                procs = []
                for i in range(args.groups):
                    procs.append(start(Path(tmp) / f"{r}-{i}"))
                    time.sleep(random.uniform(0, 2))
                done = threading.Event()
                prober = threading.Thread(target=hammer, args=(procs, done, hits), daemon=True)
                if args.hammer:
                    prober.start()
                victim = random.randrange(args.groups)
                time.sleep(random.uniform(3, 12))
                procs[victim].send_signal(signal.SIGKILL)
                for i, p in enumerate(procs):
                    _, err = p.communicate(timeout=600)
                    if i == victim:
                        continue
                    if p.returncode == 0:
                        finished += 1
                    else:
                        failed += 1
                        print(f"round {r} run {i}: exit {p.returncode}:",
                              *err.strip().splitlines()[-3:], sep="\n  ")
                done.set()
                print(f"round {r}: {finished} finished, {failed} failed so far"
                      + (f", {hits[0]} foreign connections" if args.hammer else ""),
                      flush=True)
    finally:
        for h in hogs:
            h.kill()
    print(f"{finished} of {finished + failed} runs beside killed groups and busy loops "
          "finished")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
