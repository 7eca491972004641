"""Was the machine fit to measure? What else ran while a run was timed.

A run's samples/s is only its knob's price when nothing else took the CPU meanwhile. Around
its timed training the engine takes two snapshots of the machine (`snapshot`) and keeps what
happened between them (`between`) in the run's summary:

- others_cores: CPU time every other process took per second of wall time (the machine's
  busy time from /proc/stat minus the run's own, its loader workers included, and minus the
  study's or check's own processes that started it), in cores;
- steal_cores: CPU time the hypervisor gave to other machines (a shared VM's neighbours);
- own_cores: the run's own CPU time per second (how many cores it kept busy);
- study_cores: the CPU of the study (or check) that started the run, beside the run itself:
  its own process, its warm launcher, its other runs (`--jobs`); not counted as others;
- cores: the machine's CPUs;
- load1: the 1-minute load average at the start and the end (a lagging hint, not the test);
- mhz: the CPU frequency at both ends, where Linux shows it.

A run is *loaded* when others and steal together took more than LOADED_CORES cores on
average *and* the machine had no room for them beside the run: others, steal and the run's
own cores together above its cores less SPARE_CORES. On a 2-core machine a busy process
beside a run is loaded, the idle background (0.01 to 0.05 cores, docs/benchmarks.md) is not;
on a 16-core GPU machine a dashboard, the hypervisor's steal (0.05 to 0.25 cores seen on an
H100's VM) and a neighbour on spare cores take nothing the run wanted. A study marks every
round one of whose runs was loaded, and trains it again once the machine has more room than
when it was measured (`wait_room`).

A CPU run is *crowded* when its torch threads outnumber the cores the rest of the machine
leaves it (`crowded`): each step waits on a starved thread. Judged while it trains (its
heartbeat thread, over CROWDED_WINDOW_S) and over its whole run (its summary's record).

Linux only (/proc); elsewhere `snapshot` returns None and nothing is marked. Core layer:
standard library only.
"""

from __future__ import annotations

import math
import os
import re
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

LOADED_CORES = 0.2      # others + steal above this, on average over the run, ...
SPARE_CORES = 0.5       # ... with fewer than this many cores left idle: a loaded run
QUIET_CORES = 0.1       # the machine is quiet again when everything together takes less,
QUIET_WINDOW_S = 2.0    # over this long (or when the runs to come fit beside what runs)
MORE_ROOM = 0.5         # a loaded round is trained again beside at most this share of its load
CROWDED_SLACK = 0.5     # a CPU run's threads beyond the free cores by more than this: crowded
CROWDED_WINDOW_S = 6.0  # while a run trains, judged over about this long


@dataclass(frozen=True)
class Snapshot:
    wall: float             # time.monotonic()
    busy_s: float           # every CPU's busy time since boot (steal left out)
    steal_s: float
    own_s: float            # this process's CPU time, its reaped and live children included
    load1: float | None
    mhz: float | None
    owner_s: float | None = None   # the CPU time of the owner's process tree, this one's out


def _clock_tick() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError):
        return 100.0


def _machine() -> tuple[float, float] | None:
    """(busy seconds, steal seconds) of all CPUs since boot, from /proc/stat."""
    try:
        line = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, line[1:9])
    except (OSError, ValueError, IndexError):
        return None
    tick = _clock_tick()
    return (user + nice + system + irq + softirq) / tick, steal / tick


def _descendants(pid: int, skip: int | None = None) -> list[int]:
    """The live descendants of `pid` (those of `skip`, and `skip` itself, left out)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                kids = Path(f"/proc/{p}/task/{tid}/children").read_text().split()
            except OSError:
                continue
            for k in kids:
                if k.isdigit() and int(k) != skip:
                    out.append(int(k))
                    todo.append(int(k))
    return out


def _cpu_of(pid: int) -> float:
    """utime + stime of a live process (its reaped children included), in seconds."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        fields = text[text.rindex(")") + 2:].split()
        return sum(int(fields[i]) for i in (11, 12, 13, 14)) / _clock_tick()
    except (OSError, ValueError, IndexError):
        return 0.0


def tree_cpu_s(pid: int, skip: int | None = None) -> float:
    """CPU time of a live process and of its live descendants, each one's waited-for
    children included (a run that ended, reaped by the launcher, stays counted); `skip`
    and its own descendants left out (the run measuring, wherever it is in the tree)."""
    if pid == skip:
        return 0.0
    return _cpu_of(pid) + sum(_cpu_of(p) for p in _descendants(pid, skip))


def own_cpu_s() -> float:
    """This process's CPU time: its threads, its children waited for, its live descendants."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), \
        resource.getrusage(resource.RUSAGE_CHILDREN)
    return (me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
            + sum(_cpu_of(p) for p in _descendants(os.getpid())))


def _load1() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _mhz() -> float | None:
    """The mean current frequency of the CPUs, where Linux shows it (cpufreq, else
    /proc/cpuinfo); None where it does not."""
    freqs = []
    for p in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_cur_freq"):
        try:
            freqs.append(int(p.read_text()) / 1000.0)
        except (OSError, ValueError):
            pass
    if not freqs:
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("cpu MHz"):
                    freqs.append(float(line.split(":", 1)[1]))
        except (OSError, ValueError, IndexError):
            pass
    return round(sum(freqs) / len(freqs), 1) if freqs else None


def snapshot(owner: int | None = None) -> Snapshot | None:
    """The machine and this process now (and the process tree of `owner`, the study or
    check that started this one); None where /proc cannot say."""
    machine = _machine()
    if machine is None:
        return None
    return Snapshot(time.monotonic(), machine[0], machine[1], own_cpu_s(), _load1(), _mhz(),
                    tree_cpu_s(owner, skip=os.getpid()) if owner is not None else None)


def between(a: Snapshot | None, b: Snapshot | None) -> dict[str, Any] | None:
    """What the machine did between two snapshots of this process (a run's summary keeps
    it); None when either is missing or no time passed."""
    if a is None or b is None or b.wall - a.wall <= 0:
        return None
    wall = b.wall - a.wall
    own = max(0.0, b.own_s - a.own_s)
    study = max(0.0, b.owner_s - a.owner_s) \
        if a.owner_s is not None and b.owner_s is not None else None
    others = max(0.0, (b.busy_s - a.busy_s) - own - (study or 0.0))
    out = {"wall_s": round(wall, 3), "own_cores": round(own / wall, 3),
           "others_cores": round(others / wall, 3),
           "steal_cores": round(max(0.0, b.steal_s - a.steal_s) / wall, 3),
           "load1": [a.load1, b.load1], "mhz": [a.mhz, b.mhz],
           "cores": os.cpu_count() or 1}
    if study is not None:
        out["study_cores"] = round(study / wall, 3)
    return out


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and value >= 0 else None


def read(data: Any) -> dict[str, Any] | None:
    """A recorded contention (a run's summary is untrusted: another tool or an old version
    may have written it): its numbers, or None when it is not one."""
    if not isinstance(data, dict):
        return None
    out = {k: _number(data.get(k)) for k in ("wall_s", "own_cores", "others_cores",
                                              "steal_cores", "study_cores")}
    if out["others_cores"] is None or out["wall_s"] is None:
        return None
    cores = data.get("cores")
    out["cores"] = cores if isinstance(cores, int) and not isinstance(cores, bool) \
        and 0 < cores <= 1 << 16 else None
    for k in ("load1", "mhz"):
        v = data.get(k)
        out[k] = [_number(x) for x in v[:2]] if isinstance(v, list) else [None, None]
    return out


def loaded(c: dict[str, Any] | None) -> bool:
    """Whether another process (or machine) took CPU the run could have used: more than
    LOADED_CORES, on a machine left with fewer than SPARE_CORES idle (a record without the
    machine's cores or the run's own: more than LOADED_CORES alone, as before)."""
    if c is None:
        return False
    others = c["others_cores"] + (c.get("steal_cores") or 0.0)
    if others <= LOADED_CORES:
        return False
    if c.get("cores") is None or c.get("own_cores") is None:
        return True
    return others + c["own_cores"] > c["cores"] - SPARE_CORES


def free_cores(c: dict[str, Any] | None) -> float | None:
    """The cores the rest of the machine left the run (its cores less what others, the
    hypervisor and the study that started it took), None where the record cannot say."""
    if c is None or c.get("cores") is None:
        return None
    taken = c["others_cores"] + (c.get("steal_cores") or 0.0) + (c.get("study_cores") or 0.0)
    return max(0.0, c["cores"] - taken)


def crowded(c: dict[str, Any] | None, threads: Any, device: Any = "cpu") -> str | None:
    """When a CPU run's torch threads outnumber the cores the rest of the machine left it
    (by more than CROWDED_SLACK): each parallel region waits for its slowest thread, and one
    that shares a core with another program gets a fraction of it, so the run trains
    several times slower than with fewer threads (docs/benchmarks.md, issue 54: 2 threads
    beside one busy program on 2 cores, 15x). The thread count is never changed for the
    user: on the CPU it can change the bits. None when the threads fit, or the record, the
    thread count or the device cannot say (a CUDA run's step does not wait on its CPU
    threads)."""
    free = free_cores(c)
    if free is None or device != "cpu" or not isinstance(threads, int) \
            or isinstance(threads, bool) or threads < 2 or threads <= free + CROWDED_SLACK:
        return None
    fit = max(1, min(threads - 1, int(free + 0.5)))
    return (f"{threads} threads, {free:.1f} of {c['cores']} cores free: each step waits on "
            f"a starved thread; num_threads = {fit} would not (and changes the bits on the "
            "CPU)")


def run_crowded(run: dict[str, Any]) -> str | None:
    """A stored run's crowded note: while it trains, what its process last judged (the
    runs.crowded column, over its last CROWDED_WINDOW_S); once it ended, the judgment over
    its whole timed training (its summary's contention, its settings' thread count and
    device). A run's record is untrusted: anything that is not one reads as None."""
    if run.get("status") in ("created", "running"):
        note = run.get("crowded")
        return note if isinstance(note, str) and note else None
    summary, settings = run.get("summary"), run.get("settings")
    if not isinstance(summary, dict) or not isinstance(settings, dict):
        return None
    device = settings.get("device")
    return crowded(read(summary.get("contention")), settings.get("num_threads"),
                   device.split(":")[0] if isinstance(device, str) else None)


def run_loaded(run: dict[str, Any]) -> str | None:
    """An ended run's note when the machine was busy while it trained (loaded), with what
    took the cores, else None; a live run, or a record that is not one, reads as None."""
    summary = run.get("summary")
    if run.get("status") in ("created", "running") or not isinstance(summary, dict):
        return None
    c = read(summary.get("contention"))
    return f"the machine was busy while it trained ({text(c)})" if loaded(c) else None


def suggested_threads(note: str | None) -> int | None:
    """The thread count a crowded note suggests (the number it says, one definition)."""
    found = re.search(r"num_threads = (\d+) would not", note or "")
    return int(found.group(1)) if found else None


def text(c: dict[str, Any] | None) -> str:
    """`others 1.02 cores, own 1.95, load 3.1, 2596 MHz` (what a round's mark rests on)."""
    if c is None:
        return "not recorded"
    parts = [f"others {c['others_cores']:.2f} cores"]
    if (c.get("steal_cores") or 0.0) >= 0.005:
        parts.append(f"stolen {c['steal_cores']:.2f}")
    if c.get("own_cores") is not None:
        parts.append(f"own {c['own_cores']:.2f}")
    if (c.get("study_cores") or 0.0) >= 0.005:
        parts.append(f"study {c['study_cores']:.2f}")
    if c.get("cores") is not None:
        parts.append(f"of {c['cores']}")
    load = [x for x in c.get("load1") or [] if x is not None]
    if load:
        parts.append(f"load {max(load):.1f}")
    mhz = [x for x in c.get("mhz") or [] if x is not None]
    if mhz:
        parts.append(f"{min(mhz):.0f} MHz")
    return ", ".join(parts)


def busy_now(window_s: float = QUIET_WINDOW_S) -> float | None:
    """Cores busy (steal included) over the next `window_s` seconds, everything counted."""
    a = _machine()
    time.sleep(window_s)
    b = _machine()
    if a is None or b is None:
        return None
    return ((b[0] - a[0]) + (b[1] - a[1])) / window_s


def room_for(need_cores: float | None, cores: int | None = None) -> float:
    """How busy the machine may be (in cores) for runs that take `need_cores` to be timed
    unloaded beside it: what leaves them SPARE_CORES idle, and never less than QUIET_CORES
    (None: QUIET_CORES, quiet as it can be)."""
    if need_cores is None:
        return QUIET_CORES
    cores = cores or os.cpu_count() or 1
    return max(QUIET_CORES, cores - SPARE_CORES - need_cores)


def more_room(busy: float, busy_then: float | None, need_cores: float | None,
              cores: int | None = None) -> bool:
    """Whether a machine now `busy` (cores, everything counted) has more room for a round
    measured beside `busy_then` cores of other work (its runs' others and steal): room
    for its runs unloaded (room_for), or at most MORE_ROOM of the load it was measured
    under. Training it again beside the same load would measure the same load again."""
    if busy < room_for(need_cores, cores):
        return True
    return busy_then is not None and busy <= busy_then * MORE_ROOM


def wait_room(max_s: float, busy_then: float | None, need_cores: float | None,
              window_s: float = QUIET_WINDOW_S, give_up: Callable[[], bool] = lambda: False
              ) -> tuple[bool, float, float | None]:
    """Waits, at most `max_s` seconds, until the machine has more room than a round had
    when it was measured (more_room), or `give_up` says so. (room?, seconds waited, the
    cores last seen busy)."""
    start, busy = time.monotonic(), None
    while not give_up():
        busy = busy_now(window_s)
        waited = time.monotonic() - start
        if busy is None or more_room(busy, busy_then, need_cores):
            return True, waited, busy
        if waited + window_s > max_s:
            return False, waited, busy
    return False, time.monotonic() - start, busy
