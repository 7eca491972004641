"""One arm of a windowed price (tui_trainer/pricing.py): a process that builds a run's
training exactly as a run does (Trainer.setup) and then trains windows of steady-state
steps when told, timing each.

It talks over its stdout, which is one end of a socket pair (the parent's `pricing.Arm`):
one JSON line out when it is built (`ready`, with its set-up time; or `refused`, with why,
where this machine cannot train its config), then for each line in
(`{"steps": K}`) K more steps, their batches fetched as the loop fetches them, and one JSON
line out with the window's wall and CPU seconds, the samples it trained and its process's
page faults (memory the kernel had to map in again). An empty line,
or the socket closed, ends it. Nothing is recorded: no session, no checkpoint, no
evaluation (the arms' configs say eval_every = 0), and its parameters are never read.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import time
from typing import Any

import torch

from ...core.analysis import prices
from ...core.settings import machine
from ...core.settings.config import RunConfig
from ..knobs import machine_facts
from ..train import Trainer


def serve(cfg: RunConfig, fd: int = 1) -> int:
    t0 = time.perf_counter()
    sock = socket.socket(fileno=os.dup(fd))
    stream = sock.makefile("rw", encoding="utf-8", newline="\n")

    def say(message: dict[str, Any]) -> None:
        stream.write(json.dumps(message) + "\n")
        stream.flush()

    # what this machine cannot train (amp=fp16 without CUDA, a dataset not here): said as
    # such, by the rules every run is checked by, so that the price skips that variant
    found = machine.problem(cfg.to_dict(), machine_facts(cfg.device))
    if found is not None:
        say({"refused": str(found)[:500]})
        return 2
    try:
        trainer = Trainer(cfg)
        trainer.setup()
        trainer.attach(None, 0, None)
        trainer.model.train()
        batches = trainer.steps()
    except Exception as e:  # noqa: BLE001 - said to the parent, which says it in one line
        say({"error": f"{getattr(e, 'key', type(e).__name__)}: "
                      f"{getattr(e, 'reason', str(e))}"[:500]})
        return 2
    say({"ready": True, "setup_s": time.perf_counter() - t0, "pid": os.getpid(),
         "machine": prices.machine_key(trainer.settings)})   # what a price here holds for
    for line in stream:
        if not line.strip():
            break
        k = int(json.loads(line)["steps"])
        samples, steps = trainer.pos.samples, trainer.pos.step
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(k):
            batch = next(batches, None)
            if batch is None:               # (epochs run out: the parent asks far fewer)
                break
            trainer.step(batch)
        if trainer.cuda:
            torch.cuda.synchronize(trainer.device)
        say({"s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
             "steps": trainer.pos.step - steps, "samples": trainer.pos.samples - samples,
             "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults})
    return 0
