"""One run per GPU: which GPUs a run takes, and which the runs of a session hold.

Two runs timed on one GPU share it, and each one's samples/s is then its share: a study's
price would be false, and so would the throughput of a run started beside another. So a
run that starts CUDA (core.settings.machine.cuda_device; a data-parallel group's ranks as
well) holds GPUs while it trains: one, or one per rank on this machine (nproc). A run on
the first device ("auto", "cuda", "cuda:0") is put on GPUs no other run holds: its process
sees only those (CUDA_VISIBLE_DEVICES, `visible_env`), so its "cuda:0" (a rank's
"cuda:LOCAL_RANK") is the GPU it was given. A run that names another device ("cuda:2")
holds that one and sees every GPU, as asked. The dashboard records what each run holds
(runs.gpus) and `tui-trainer machine` lists it; a study takes and gives back GPUs from a
`Pool` as its runs start and end, never two runs on one GPU at once.

The GPUs are those torch numbers in this process (after its own CUDA_VISIBLE_DEVICES), or
the list TUI_TRAINER_GPUS gives ("0,1": which of those runs may be put on; tests give a
study its devices that way on a machine without one).

Core layer: imports neither torch nor textual.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Iterable, Mapping

from ..settings.config import world_size
from ..settings.machine import FIRST_DEVICES, cuda_device

GPUS_ENV = "TUI_TRAINER_GPUS"


def gpu_list(count: int, environ: Mapping[str, str] | None = None) -> list[int]:
    """The GPUs runs may be put on: TUI_TRAINER_GPUS's list where it is set (numbers, in
    torch's numbering; a wrong one is left out), else each of the `count` torch sees."""
    environ = os.environ if environ is None else environ
    given = environ.get(GPUS_ENV)
    if given is None:
        return list(range(max(0, count)))
    out: list[int] = []
    for part in given.split(","):
        part = part.strip()
        if part.isdigit() and int(part) not in out:
            out.append(int(part))
    return out


def wanted(config: Any) -> tuple[int, int | None]:
    """How many GPUs a run of this config holds on this machine (0: it does not start
    CUDA) and the one it names, where it names one other than the first ("cuda:2")."""
    if not isinstance(config, dict):
        return 0, None
    spec = str(config.get("device", "auto"))
    if world_size(config) > 1:
        if spec != "auto" and not spec.startswith("cuda"):
            return 0, None
        try:
            return max(1, int(config.get("nproc", 1))), None     # this machine's ranks
        except (TypeError, ValueError):
            return 1, None
    device = cuda_device(config)
    if device is None:
        return 0, None
    if device in FIRST_DEVICES:
        return 1, None
    index = device.removeprefix("cuda:")
    return 1, int(index) if index.isdigit() else None


def choose(config: Any, gpus: list[int], held: Mapping[int, list[int]]) -> list[int]:
    """The GPUs a run of `config` takes among `gpus`, given what other runs hold (`held`:
    {gpu: runs}): [] for a run that holds none (a CPU run, or no GPU here); the one it
    names; else the free ones, in order, and where too few are free the least held (a run
    started beside others still trains: it shares, and `machine` says so)."""
    n, named = wanted(config)
    if n == 0 or not gpus:
        return []
    if named is not None:
        return [named]
    ranked = sorted(gpus, key=lambda g: (len(held.get(g, ())), gpus.index(g)))
    return ranked[:n]


def visible_env(gpus: list[int], config: Any,
                environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment that shows a run only the GPUs it was given (CUDA_VISIBLE_DEVICES,
    in the numbering of this process's own, where it has one): nothing for a run that
    holds none, names its device, or was given the first GPUs, which its "cuda:0" (its
    ranks' "cuda:LOCAL_RANK") are anyway; so such a run's environment is the launcher's,
    and the launcher's spare may take it (launcher/spare.py)."""
    if not gpus or wanted(config)[1] is not None or gpus == list(range(len(gpus))):
        return {}       # (the first GPUs: what the run's own numbering picks anyway)
    environ = os.environ if environ is None else environ
    parent = [d.strip() for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
              if d.strip()]
    if parent:
        shown = [parent[g] for g in gpus if g < len(parent)]
    else:
        shown = [str(g) for g in gpus]
    return {"CUDA_VISIBLE_DEVICES": ",".join(shown)}


def held_by(runs: Iterable[dict[str, Any]], live: Callable[[dict[str, Any]], bool]
            ) -> dict[int, list[int]]:
    """{gpu: the runs that hold it} of the runs given whose process is alive (`live`), as
    their records say (runs.gpus, read as untrusted: only whole numbers count)."""
    out: dict[int, list[int]] = {}
    for run in runs:
        gpus = run.get("gpus")
        if not isinstance(gpus, list) or not live(run):
            continue
        for g in gpus:
            if isinstance(g, int) and not isinstance(g, bool) and g >= 0:
                out.setdefault(g, []).append(run["id"])
    return out


class Pool:
    """A study's GPUs, taken by its runs as they start and given back as they end: a run
    waits until the GPUs it needs are free, so no two runs of the study share one."""

    def __init__(self, gpus: list[int]) -> None:
        self.gpus = list(gpus)
        self._free = list(gpus)
        self._cond = threading.Condition()

    def take(self, config: Any, stop: Callable[[], bool] = lambda: False,
             poll_s: float = 0.5) -> list[int] | None:
        """The GPUs a run of `config` holds, once free ([] for a run that needs none); None
        when `stop` says so first, or when it can never have them (it names a GPU the
        study does not have, or needs more than there are)."""
        n, named = wanted(config)
        if n == 0 or not self.gpus:
            return []
        if (named is not None and named not in self.gpus) or n > len(self.gpus):
            return None
        with self._cond:
            while True:
                if named is not None and named in self._free:
                    got = [named]
                elif named is None and len(self._free) >= n:
                    got = self._free[:n]
                else:
                    got = None
                if got is not None:
                    for g in got:
                        self._free.remove(g)
                    return got
                if stop():
                    return None
                self._cond.wait(poll_s)

    def give(self, gpus: list[int]) -> None:
        with self._cond:
            self._free.extend(g for g in gpus if g not in self._free)
            self._cond.notify_all()
