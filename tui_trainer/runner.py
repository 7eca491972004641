"""Orchestration of several runs: determinism verdicts, resume checks and A/B studies.

Each run trains in a child process started by `core.processes.supervisor.launch` (the one launcher)
with arguments from its typed builders; this module decides which runs to create, trains
them one after the other and records what it found. The CLI (`repro`, `ab`) parses and
prints; the dashboard starts the same commands in the background.

Imports torch only inside `device_refusal` (for the facts core.settings.machine judges a config by),
`explain` (a replay, when the fingerprints alone cannot say where two runs part) and
`memory` (one step of a copy of a run).
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from .core.analysis import figures
from .core.settings import machine, recorded, user_data, user_models
from .core.settings.config import ConfigError, RunConfig, from_dict
from .core.analysis import explain as explained
from .core.errors import (EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_OK, EXIT_SESSION, EXIT_STOPPED,
                          BadInput, NotFound)
from .core.analysis.verdicts import verdict
from .core.processes import gpus
from .core.processes.liveness import is_live
from .core.session.store import SessionStore
from .core.processes.supervisor import (RENDEZVOUS_S, Supervisor, launch, owner_env,
                                        resume_args, stop_grace_s, torchrun_args, train_args)
from .launcher.client import UNKNOWN_EXIT, WarmChild, WarmLauncher

Say = Callable[[str], None]


def train_child(store: SessionStore, run_id: int, args: list[str], expect_kill: bool = False,
                children: Children | None = None, warm: WarmLauncher | None = None,
                env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """Trains run `run_id` with `tui-trainer ARGS --json` in a child process, its progress
    and errors going to the run's log (where the dashboard shows them), and waits. Returns
    the run's summary (also of a run that diverged or was stopped: that is a result), or
    None when the
    process was killed as asked."""
    log_path = store.log_path(run_id)
    config = store.run(run_id)["config"]
    # It ends with this process, even killed (core.processes.supervisor.watch_owner).
    proc = launch(store.dir, [*args, "--json"], log_path, detach=False, capture=True,
                  warm=warm, env={**(env or {}), **owner_env()},
                  spare=machine.cuda_device(config), cublas=machine.cublas_workspace(config),
                  config=config if isinstance(config, dict) else None)
    store.set_launcher(run_id, proc.pid)
    if children is not None:
        children.add(proc)
    try:
        out, _ = proc.communicate()
    finally:
        if children is not None:
            children.remove(proc)
    if expect_kill and proc.returncode < 0:
        return None
    if proc.returncode == UNKNOWN_EXIT and out and \
            store.run(run_id)["status"] in ("finished", "diverged", "stopped"):
        # The launcher that forked it went away first (its exit status is not known): the
        # run's outcome is what the run recorded, and its summary came on its stdout.
        try:
            return json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            pass
    if proc.returncode not in (EXIT_OK, EXIT_DIVERGED, EXIT_STOPPED):
        tail = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        message = tail[-1].removeprefix("tui-trainer: ") if tail else ""
        if proc.returncode == EXIT_BAD_INPUT:
            raise BadInput(message)
        raise RuntimeError(f"run {run_id} failed (exit {proc.returncode}): {message}; "
                           f"its log: {log_path}")
    return json.loads(out.strip().splitlines()[-1])


class Children:
    """The run processes a study trains now. A stop reaches each of them once, also one
    whose launch was under way while the stop was asked (it is signalled as it is added):
    no run of a stopped study trains on to its last step."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: list[subprocess.Popen | WarmChild] = []
        self.stopping = False

    def add(self, proc: subprocess.Popen | WarmChild) -> None:
        with self._lock:
            self._live.append(proc)
            late = self.stopping
        if late:
            proc.send_signal(signal.SIGTERM)

    def remove(self, proc: subprocess.Popen | WarmChild) -> None:
        with self._lock:
            self._live.remove(proc)

    def stop(self, signum: int) -> None:
        """From the signal handler, on the main thread (which never holds the lock: only the
        runs' threads add and remove)."""
        with self._lock:
            self.stopping = True
            live = list(self._live)
        for child in live:
            # Ctrl-C reaches a cold-started run from the terminal itself; a forked one is
            # in the warm launcher's process group.
            if signum == signal.SIGTERM or isinstance(child, WarmChild):
                child.send_signal(signal.SIGTERM)


@dataclass
class Check:
    """What `repro` is asked: a config (or a run of the session) trained `repeats` times,
    or, with `resume_at`, killed at that step and resumed."""
    config: RunConfig | None = None
    run: int | None = None
    repeats: int = 2
    resume_at: int | None = None


def repro(store: SessionStore, check: Check, say: Say,
          warm: WarmLauncher | None = None) -> dict[str, Any]:
    """Runs a check; returns the verdict (as recorded on the last run, event
    `repro_verdict`). Each twin it creates is recorded on the original as a `check_twin`
    event as soon as it exists, so a dashboard knows which run to pair with."""
    first: dict[str, Any] | None = None
    cfg = check.config
    if check.run is not None:
        first = store.run(check.run)
        if is_live(first) or first["status"] == "created":
            raise BadInput(f"run {check.run} is {first['status']}; check it once it has "
                           "finished or stopped")
        cfg = recorded.run_config(first)
        user_models.check_twin(first)       # its twins train its code, or none is created
        user_data.check_in(first["config"])     # and read a folder this user named
    assert cfg is not None
    if check.resume_at is not None and first is not None and check.resume_at >= first["step"]:
        raise ConfigError("--resume-at", f"must be below the run's {first['step']} steps")
    prefix = first["name"] if first is not None else "repro"
    mode = "repeat" if check.resume_at is None else "resume"

    def new_run(name: str, config: RunConfig, twin_of: int | None) -> int:
        run_id = store.create_run(config.to_dict(), name=name, twin_of=twin_of)
        if twin_of is not None:
            store.add_event(twin_of, "check_twin", f"run {run_id} is a {mode} check of it",
                            data={"twin": run_id, "mode": mode, "resume_at": check.resume_at})
        return run_id

    if check.resume_at is None:
        ids = [first["id"]] if first is not None else []
        for i in range(len(ids), check.repeats):
            run_id = new_run(f"{prefix}-{i + 1}" if first is None else f"{prefix}-twin",
                             cfg, ids[0] if ids else None)
            say(f"repro: run {i + 1} of {check.repeats} (run {run_id}) ...")
            train_child(store, run_id, train_args(run_id), warm=warm)
            ids.append(run_id)
        since = -1
    else:
        if first is None:
            straight = new_run(f"{prefix}-straight", cfg, None)
            say(f"repro: the config straight through (run {straight}) ...")
            summary = train_child(store, straight, train_args(straight), warm=warm)
            if check.resume_at >= summary["steps"]:
                raise ConfigError("--resume-at", f"must be below the run's "
                                  f"{summary['steps']} steps")
        else:
            straight = first["id"]
        every = cfg.checkpoint_every
        killed_cfg = cfg if every and check.resume_at % every == 0 else \
            cfg.replace(checkpoint_every=check.resume_at)
        killed = new_run(f"{prefix}-resumed-at-{check.resume_at}", killed_cfg, straight)
        say(f"repro: the same, killed at step {check.resume_at} (run {killed}) ...")
        train_child(store, killed, train_args(killed, kill_at_step=check.resume_at),
                    expect_kill=True, warm=warm)
        say(f"repro: resuming it from its checkpoint at step {check.resume_at} ...")
        train_child(store, killed, resume_args(killed), warm=warm)
        ids, since = [straight, killed], check.resume_at
    v = verdict(store, ids, since_step=since)
    store.add_event(ids[-1], "repro_verdict",
                    f"{'identical' if v.identical else 'not identical'} to run {ids[0]}"
                    + (f" after resuming at step {check.resume_at}" if since >= 0 else ""),
                    data={"mode": mode, "resume_at": check.resume_at, **v.to_dict()})
    out = {"mode": mode, "resume_at": check.resume_at, "config": cfg.to_dict(),
           **v.to_dict()}
    # identical or not, runs that do not learn are said beside the verdict
    stuck = {r: figures.run_figures(store, r)["not_learning_text"] for r in ids}
    out["not_learning"] = {str(r): t for r, t in stuck.items() if t}
    if not v.identical and v.first_difference is not None:
        # Where the first two part, and why (kept in the session: the Divergence tab, the
        # exports); a pair that cannot be explained says why instead.
        say(f"repro: explaining where runs {ids[0]} and {ids[1]} part ...")
        try:
            out["explanation"] = explain(store, ids[0], ids[1])
        except BadInput as e:
            out["explanation"] = explained.refused(ids[0], ids[1], str(e))
    return out


def memory(store: SessionStore, run: dict[str, Any], keep: bool = True) -> dict[str, Any]:
    """One step of a copy of `run` measured by category and module, with its timeline
    (engine.probes.memory, which imports torch), from its newest usable checkpoint; on CUDA, with
    `keep`, the allocator's snapshot of the step is written beside the run's log and named
    in the result by its path inside the session."""
    from .engine.checkpoint import load_checkpoint
    from .engine.probes.memory import breakdown
    cfg = recorded.run_config(run)
    kept = store.usable_checkpoints(run["id"])
    snapshot = store.log_path(run["id"]).with_name(
        f"run-{run['id']}-memory-{time.strftime('%Y%m%d-%H%M%S')}.pickle") if keep else None
    result = breakdown(cfg, load_checkpoint(kept[0]["path"]) if kept else None, snapshot,
                       user_models.recorded(run))
    if result.get("snapshot"):
        result["snapshot"] = str(Path(result["snapshot"]).relative_to(store.dir))
    return result


def profile(store: SessionStore, run: dict[str, Any], steps: int, warmup: int,
            keep: bool = True) -> dict[str, Any]:
    """`steps` steps of a copy of `run` under torch.profiler (engine.probes.profile, which imports
    torch), from its newest usable checkpoint; with `keep`, the trace is written beside the
    run's log and named in the result by its path inside the session."""
    from .engine.checkpoint import load_checkpoint
    from .engine.probes.profile import profile as measure
    cfg = recorded.run_config(run)
    kept = store.usable_checkpoints(run["id"])
    trace = store.log_path(run["id"]).with_name(
        f"run-{run['id']}-profile-{time.strftime('%Y%m%d-%H%M%S')}.json") if keep else None
    result = measure(cfg, load_checkpoint(kept[0]["path"]) if kept else None, steps, warmup,
                     trace, user_models.recorded(run))
    if trace is not None:
        result["trace"] = str(trace.relative_to(store.dir))
    return result


def checkpoint_at(store: SessionStore, run: dict[str, Any], step: int | None
                  ) -> dict[str, Any]:
    """A run's kept checkpoint at `step` (None: its newest), or why there is none."""
    kept = store.usable_checkpoints(run["id"])
    if not kept:
        raise BadInput(f"run {run['id']} has no checkpoint in the session, so there are no "
                       "weights to show (a run keeps one at step 0 and every checkpoint_every "
                       "steps; one started before that was kept has none)")
    if step is None:
        return kept[0]
    found = next((c for c in kept if c["step"] == step), None)
    if found is None:
        steps = ", ".join(str(c["step"]) for c in reversed(kept[:12]))
        raise BadInput(f"--step {step}: run {run['id']} keeps no checkpoint at that step; it "
                       f"keeps step(s) {steps}")
    return found


def activations(store: SessionStore, runs: list[dict[str, Any]], how: str,
                index: int | None, step: int | None) -> tuple[dict[str, Any], Any]:
    """One digit of the evaluation set through each run's model at a kept checkpoint (at
    `step`, or its newest): engine.probes.activations, which imports torch. The digit is picked
    once (by index, at random, or the one the first run gets most confidently wrong) and
    shown to every run. (metadata, arrays): core.analysis.activations keeps and draws them."""
    from .core.analysis import activations as drawn
    from .engine.probes import activations as seen
    from .engine.checkpoint import load_checkpoint
    cfgs = [recorded.run_config(r) for r in runs]
    points = [checkpoint_at(store, r, step) for r in runs]
    data = seen.EvalSet(cfgs[0])
    if len(runs) == 2:
        other = seen.EvalSet(cfgs[1]) if cfgs[1].dataset != cfgs[0].dataset or \
            cfgs[1].eval_samples != cfgs[0].eval_samples else data
        if other.info.name != data.info.name or len(other) != len(data):
            raise BadInput(f"runs {runs[0]['id']} and {runs[1]['id']} evaluate on different "
                           f"digits ({data.info.name}, {len(data):,} against "
                           f"{other.info.name}, {len(other):,}): compare runs of one "
                           "evaluation set")
    if how == "index":
        data.check(int(index or 0))
    models = [seen.restore(c, load_checkpoint(p["path"]), user_models.recorded(r), data.info)
              for c, p, r in zip(cfgs, points, runs)]
    digit = seen.pick(how, index, models[0], data)
    found = [seen.seen(m, data, digit) for m in models]
    starts = [store.fingerprint_at(r["id"], 0) for r in runs]
    same_start = None if len(runs) != 2 or None in starts else starts[0] == starts[1]
    return drawn.combine([r["id"] for r in runs], [p["step"] for p in points],
                         [c.model for c in cfgs], found,
                         {"dataset": data.info.name, "digit": digit, "how": how,
                          "label": int(data.y[digit]), "image": data.image(digit),
                          **({"classes": data.classes} if data.classes else {})}, same_start)


def explain(store: SessionStore, a: int, b: int, record: bool = True) -> dict[str, Any]:
    """Where runs A and B part, and why: what the fingerprints say (core.analysis.explain.locate),
    then, where that is not the answer, the replay (engine.probes.explain, which imports torch).
    The answer, or the reason it cannot be given (BadInput, raised again), is kept in the
    session on run B (`record`)."""
    try:
        result = explained.locate(store, a, b)
        if result["verdict"] == "replay":
            from .engine.probes.explain import replay
            result = replay(store, result)
    except NotFound:
        raise                   # a wrong id: nothing to keep it on
    except BadInput as e:
        if record:
            explained.record(store, explained.refused(a, b, str(e)))
        raise
    if record:
        explained.record(store, result)
    return result


def device_refusal(config: dict[str, Any]) -> str | None:
    """Why this machine cannot train a config (e.g. amp=fp16 without CUDA, a dataset that is
    not there), or None: core.settings.machine's rules on the facts torch gives."""
    from .engine.knobs import machine_facts
    try:
        cfg = from_dict(config)
    except ConfigError as e:
        return f"{e.key}: {e.reason}"
    found = machine.problem(cfg.to_dict(), machine_facts(cfg.device))
    return None if found is None else str(found)


ORPHAN_WAIT_S = 60.0


def _stop_orphans(store: SessionStore, study: dict[str, Any], say: Say) -> None:
    """A study continued after its process died (SIGKILL) may find one of its runs still
    training (it stops itself once it sees its owner gone, core.processes.supervisor.watch_owner):
    it is stopped, and waited for, before anything is timed beside it."""
    live = [r for r in (store.run(v["run_id"]) for v in study["variants"]
                        if v["run_id"] is not None) if is_live(r)]
    for run in live:
        say(f"ab: run {run['id']} of this study still trains (its study process died); "
            "stopping it first")
        Supervisor(store).stop(run["id"])
    deadline = time.monotonic() + ORPHAN_WAIT_S
    while live and time.monotonic() < deadline:
        time.sleep(0.2)
        live = [r for r in live if is_live(store.run(r["id"]))]
    if live:
        raise BadInput(f"run {live[0]['id']} of this study (pid {live[0]['pid']}) still "
                       f"trains after {ORPHAN_WAIT_S:.0f} s; stop it, then continue the study")


def run_study(session: Path, study_id: int, say: Say, jobs: int | None = None) -> str:
    """Trains a study's runs in their planned order (rounds interleaved), `jobs` at a time
    (default: as planned, else one); a run already finished is kept (so a stopped or crashed
    study continues where it was). SIGTERM or Ctrl-C stops the runs in progress (with their
    checkpoints) and the study. Returns the study's end status.

    A variant is not a twin of the base (it has another config): the relation lives in the
    study's own rows (position 0 is the base), never in runs.twin_of."""
    from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
    children = Children()
    stop = {"asked": False}

    def on_signal(signum: int, frame: Any) -> None:
        stop["asked"] = True
        children.stop(signum)

    def train(v: dict[str, Any], run_id: int) -> None:
        # A thread of its own: its own connection (SQLite connections stay in their thread).
        # A run on CUDA first takes its GPUs (one run per GPU: core.processes.gpus), a run
        # on the CPU one of the study's `jobs` places.
        cpu = gpus.wanted(v["config"])[0] == 0
        if cpu:
            places.acquire()
        held = [] if cpu else pool.take(v["config"], stop=lambda: stop["asked"])
        try:
            with SessionStore(session, create=False) as own:
                if held is None:
                    if not stop["asked"]:
                        own.set_study_run(study_id, v["position"], run_id,
                                          f"not possible: it needs GPUs this study has not "
                                          f"(GPUs: {pool.gpus})")
                    return
                own.set_gpus(run_id, held)
                try:
                    train_child(own, run_id, train_args(run_id), children=children,
                                warm=warm, env={**threads,
                                                **gpus.visible_env(held, v["config"])})
                except (BadInput, RuntimeError) as e:
                    if stop["asked"]:
                        return
                    own.set_study_run(study_id, v["position"], run_id, f"failed: {e}")
                    say(f"ab: {v['label']} failed: {e}")
        finally:
            if cpu:
                places.release()
            elif held:
                pool.give(held)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    warm = WarmLauncher.shared()
    try:
        with SessionStore(session, create=False) as store:
            study = store.study(study_id)
            if study["status"] == "running":
                raise BadInput(f"study {study_id} is running already (pid {study['pid']})")
            from .core.analysis.study import check_stored
            check_stored(study)                # every field it reads, refused before it starts
            if study["kind"] == "price":       # its margin and cap, the same
                from .pricing import spec_figures
                spec_figures(study_id, study["spec"])
            ended_before = study["status"] == "finished"     # its prices kept then
            jobs = jobs or study["spec"].get("jobs", 1)
            # One run per GPU: the study's runs on CUDA train side by side, each on GPUs
            # of its own, as many at a time as there are GPUs (one GPU: one at a time);
            # its runs on the CPU `jobs` at a time.
            wants_gpus = any(gpus.wanted(v["config"])[0] for v in study["variants"])
            if wants_gpus:
                from .engine.knobs import machine_facts    # (torch; CUDA's driver asked)
            pool = gpus.Pool(gpus.gpu_list(machine_facts().cuda_devices) if wants_gpus
                             else [])
            # Its first run waits for the launcher (about one cold start), so no run's
            # timing shares the machine with the launcher's imports; this process's own
            # import of torch (the GPUs' count, above) was made meanwhile, on the other core
            # (one after the other, they took 2.7 s and 1.1 s here)
            warm.wait_ready(timeout=120)
            on_gpus = bool(pool.gpus)
            places = threading.Semaphore(jobs)
            workers = jobs + (len(pool.gpus) if on_gpus else 0)
            if on_gpus:
                _gpu_note(store, study_id, len(pool.gpus), say)
            # Runs side by side share the cores out, as torchrun's ranks do: a run with
            # num_threads = 0 (PyTorch's default: every core) gets cores // side threads.
            side = jobs if not on_gpus else max(jobs, len(pool.gpus))
            threads = {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // side))} \
                if side > 1 and "OMP_NUM_THREADS" not in os.environ else {}
            _stop_orphans(store, study, say)
            store.set_study_status(study_id, "running")
            status, message = "finished", None
            started = time.monotonic()

            def train_positions(positions: list[int]) -> None:
                study = store.study(study_id)
                variants = study["variants"]
                places = study["spec"].get("layout") or [[i, 0] for i in range(len(variants))]
                rounds = study["spec"].get("repeats", 1)
                pending: set[Future] = set()
                with ThreadPoolExecutor(max_workers=workers) as threads_pool:
                    for i in positions:
                        v = variants[i]
                        while len(pending) >= workers and not stop["asked"]:
                            done, pending = wait(pending, timeout=0.5,
                                                 return_when=FIRST_COMPLETED)
                            for f in done:
                                f.result()      # a run's thread that failed fails the study
                        if stop["asked"]:
                            break
                        if v["run_id"] is not None and \
                                store.run(v["run_id"])["status"] == "finished":
                            continue
                        if v["run_id"] is None and v["note"]:
                            continue
                        refusal = device_refusal(v["config"])
                        if refusal:
                            store.set_study_run(study_id, v["position"], None,
                                                f"not possible on this machine ({refusal})")
                            say(f"ab: {v['label']}: skipped, {refusal}")
                            continue
                        arm, rnd = places[i]
                        if study["kind"] == "sweep":
                            name = f"sweep{study_id}-seed{v['config']['seed']}"
                        else:
                            again = sum(1 for p in places[:i] if p == [arm, rnd])
                            name = f"ab{study_id}-{v['label']}" + \
                                (f"-r{rnd + 1}" if rounds > 1 else "") + \
                                (f"-again{again}" if again else "")
                        run_id = store.create_run(v["config"], name=name)
                        store.set_study_run(study_id, v["position"], run_id)
                        say(f"{study['kind']}: {v['label']}"
                            + (f", round {rnd + 1} of {rounds}" if rounds > 1 else "")
                            + f" ({i + 1} of {len(variants)}, run {run_id}) ...")
                        pending.add(threads_pool.submit(train, v, run_id))
                    while pending:
                        done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                        for f in done:
                            f.result()

            priced = study["kind"] == "price"     # in windows of two processes (pricing.py)
            try:
                if priced:
                    from .pricing import price_study
                    price_study(store, study_id, say, lambda: stop["asked"], warm)
                else:
                    train_positions(list(range(len(study["variants"]))))
                    if not stop["asked"]:
                        _after_plan(store, study_id, train_positions, stop, say, started)
                if stop["asked"]:
                    status, message = "stopped", "stopped on request; run it again to continue"
            except BaseException as e:
                status, message = "crashed", str(e)
                raise
            finally:
                store.set_study_status(study_id, status, message)
            if status == "finished" and not ended_before and not priced:
                _remember_prices(store, study_id, session, say)      # (a price study: its own)
    finally:
        warm.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return status


def _remember_prices(store: SessionStore, study_id: int, session: Path, say: Say) -> None:
    """An ended A/B study's prices, kept for this user per machine (core.analysis.prices):
    the form, `config KEY`, `machine` and the presets' choices read them. A file that
    cannot be written is said, never the study's failure."""
    from .core.analysis import prices
    study = store.study(study_id)
    apart = prices.apart([store.run(v["run_id"])["settings"] for v in study["variants"]
                          if v["run_id"] is not None])
    if apart and apart not in study["spec"].get("notes", []):
        _note(store, study_id, apart)       # (a study continued on another machine)
        say(f"ab: {apart}")
    try:
        found = prices.of_study(store, study_id, str(session))
        prices.add(found)
    except OSError as e:
        say(f"ab: the prices were not kept ({e})")
        return
    for p in found:
        say(f"ab: kept for this machine: {p.line()}")


def _after_plan(store: SessionStore, study_id: int, train_positions: Callable[[list[int]], None],
                stop: dict[str, bool], say: Say, started: float) -> None:
    """What a study does once its planned rounds are trained: trains again the rounds that
    shared the CPU with another process, each once the machine has more room than when it
    was measured (core.processes.contention.more_room; at most `rerun_loaded` times in all); then,
    with `until_sure`, adds rounds until every variant's samples/s interval is narrower
    than asked, or a bound is reached. What ended it is kept in the spec (`ended_by`) and
    said. A wait lasts at most `quiet_wait_s` and at most one round's time so far; once one
    finds the machine no freer, the study waits no more (a machine under permanent load:
    its rounds stay as measured, marked), so it ends about when its rounds are trained."""
    from .core.processes import contention
    from .core.analysis.study import QUIET_WAIT_S, add_round, rerun_round, round_load, table
    study = store.study(study_id)
    spec = study["spec"]
    if study["kind"] == "sweep" and spec.get("decide") is not None:
        _decide(store, study_id, train_positions, lambda: None, stop, say, started)
        return
    if study["kind"] != "ab" or (spec.get("repeats", 1) < 2 and spec.get("until_sure") is None):
        return

    def budget() -> int:        # re-runs left (a continued study counts those it made)
        spec = store.study(study_id)["spec"]
        if spec.get("jobs", 1) != 1 or spec.get("gpus", 1) > 1:
            return 0
        return spec.get("rerun_loaded", 0) - len(spec.get("reruns", []))

    busy_still: list[bool] = []          # a wait found no more room: wait no more

    def rerun_loaded() -> None:
        while budget() > 0 and not stop["asked"] and not busy_still:
            _, rows = table(store, study_id)
            marked = sorted({r for row in rows[1:] for r in row.loaded_rounds})
            if not marked:
                return
            rnd = marked[0]
            spec = store.study(study_id)["spec"]
            per_round = (time.monotonic() - started) / max(1, spec.get("repeats", 1))
            limit = min(spec.get("quiet_wait_s", QUIET_WAIT_S), per_round)
            need, then = round_load(store, study_id, rnd)
            beside = f"{then:.1f} cores of other work" if then is not None else "other work"
            say(f"ab: round {rnd + 1} was measured beside {beside}; waiting at most "
                f"{limit:.0f} s (a round's time) for more room to train it again")
            room, waited, busy = contention.wait_room(limit, then, need,
                                                      give_up=lambda: stop["asked"])
            spec = store.study(study_id)["spec"]
            store.set_study_spec(study_id, {**spec, "waits": [*spec.get("waits", []), {
                "round": rnd, "limit_s": round(limit, 1), "waited_s": round(waited, 1),
                "busy_then": then, "busy_now": busy, "room": room}]})
            if stop["asked"]:
                return
            if not room:
                now = f" ({busy:.1f} cores of other work)" if busy is not None else ""
                note = (f"round {rnd + 1}: the machine was still busy{now} after "
                        f"{waited:.0f} s; it and every round measured under load are kept "
                        f"as measured, marked (`ab --study {study_id}` again trains them "
                        "once there is room)")
                say(f"ab: {note}")
                _note(store, study_id, note)
                busy_still.append(True)
                return
            positions = rerun_round(store, study_id, rnd, f"shared the CPU (waited "
                                    f"{waited:.0f} s for more room)")
            train_positions(positions)

    rerun_loaded()
    if spec.get("decide") is not None:
        _decide(store, study_id, train_positions, rerun_loaded, stop, say, started)
        return
    target = spec.get("until_sure")
    if target is None:
        return
    max_rounds, max_s = spec.get("max_rounds"), spec.get("max_time_s")
    while not stop["asked"]:
        _, rows = table(store, study_id)
        widths = [(r.intervals or {}).get("samples_per_s") for r in rows[1:]
                  if r.status != "skipped"]
        widest = max((iv.width if iv is not None and iv.width is not None else math.inf)
                     for iv in widths) if widths else math.inf
        rounds = store.study(study_id)["spec"]["repeats"]
        elapsed = time.monotonic() - started
        wide = f"{widest:.1%} wide" if math.isfinite(widest) else "without an interval yet"
        if widest <= target:
            ended = (f"sure: every samples/s interval is {widest:.1%} wide or less (asked: "
                     f"{target:.1%}) after {rounds} rounds")
        elif max_rounds is not None and rounds >= max_rounds:
            ended = (f"bound: {rounds} rounds (--max-rounds) with the widest samples/s "
                     f"interval {wide} (asked: {target:.1%})")
        elif max_s is not None and elapsed >= max_s:
            ended = (f"bound: {elapsed:.0f} s (--max-time {max_s:.0f} s) after {rounds} rounds "
                     f"with the widest samples/s interval {wide} (asked: {target:.1%})")
        else:
            say(f"ab: the widest samples/s interval is {wide}, asked {target:.1%}: "
                f"round {rounds + 1}")
            train_positions(add_round(store, study_id))
            rerun_loaded()
            continue
        say(f"ab: {ended}")
        spec = store.study(study_id)["spec"]
        store.set_study_spec(study_id, {**spec, "ended_by": ended})
        return


def _decide(store: SessionStore, study_id: int, train_positions: Callable[[list[int]], None],
            rerun_loaded: Callable[[], None], stop: dict[str, bool], say: Say,
            started: float) -> None:
    """A deciding study (core.analysis.sequential): after each look, the rounds to its next
    look where a variant is undecided, until every variant is faster, slower, the same or
    unknown at the cap (or --max-time); a deciding seed sweep, the seeds to its next look
    until its seed noise is under or over its margin, or unknown at the cap. What ended it
    is kept and said."""
    from .core.analysis import sequential
    from .core.analysis.study import add_round, table
    while not stop["asked"]:
        study, rows = table(store, study_id)
        spec = study["spec"]
        what, unit = ("sweep", "seed") if study["kind"] == "sweep" else ("ab", "round")
        decided = [r for r in rows if r.status != "skipped" and r.decision]
        left = sequential.rounds_left(r.decision for r in decided)
        elapsed = time.monotonic() - started
        said = "; ".join(f"{r.label}: {r.decision.words}" for r in decided)
        if left is None:
            how = "ended" if any(r.decision.verdict == "unknown" for r in decided) \
                else "decided"
            ended = f"{how} after {spec['repeats']} {unit}s in {elapsed:.0f} s: {said}"
        elif spec.get("max_time_s") is not None and elapsed >= spec["max_time_s"]:
            ended = (f"bound: {elapsed:.0f} s (--max-time) after {spec['repeats']} {unit}s, "
                     f"undecided: {said}")
        else:
            say(f"{what}: {said}; {left} more {unit}{'s' if left > 1 else ''}")
            for _ in range(left):
                if stop["asked"]:
                    return
                train_positions(add_round(store, study_id))
            rerun_loaded()
            continue
        say(f"{what}: {ended}")
        store.set_study_spec(study_id, {**store.study(study_id)["spec"], "ended_by": ended})
        return


def _gpu_note(store: SessionStore, study_id: int, count: int, say: Say) -> None:
    """Says once in the study's notes how its CUDA runs share the GPUs, and keeps how many
    it has (`gpus`: runs side by side share the CPU by design, so no round is re-trained
    for the load its siblings made)."""
    note = (f"{count} GPUs: the runs on CUDA train side by side, one run per GPU (never two "
            "on one: sharing a GPU would falsify the price)" if count > 1 else
            "1 GPU: the runs on CUDA train one at a time (two on one GPU would share it and "
            "falsify the price)")
    spec = store.study(study_id)["spec"]
    if note not in spec.get("notes", []) or spec.get("gpus") != count:
        store.set_study_spec(study_id, {**spec, "gpus": count, "notes": [
            *(n for n in spec.get("notes", []) if ": the runs on CUDA train" not in n),
            note]})
    say(f"ab: {note}")


def _note(store: SessionStore, study_id: int, note: str) -> None:
    spec = store.study(study_id)["spec"]
    store.set_study_spec(study_id, {**spec, "notes": [*spec.get("notes", []), note]})


def _same_file(stream: Any, path: Path) -> bool:
    try:
        a, b = os.fstat(stream.fileno()), os.stat(path)
    except (OSError, ValueError, AttributeError):
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


@dataclass
class GroupResult:
    run: dict[str, Any] | None        # the run as stored after every rank ended
    failures: list[Any]               # engine.distributed.RankFailure of each failed rank
    reason: str | None                # the rank that took the group down, in words
    refused: bool                     # every failed rank refused to start (bad input)
    signal: str | None                # the signal that stopped the launcher, if one did


class RendezvousFailed(Exception):
    """The nodes of a run did not all meet (node 0 not there, unreachable, too slow)."""


def train_group(session: Path | None, run_id: int | None, cfg: RunConfig,
                worker: list[str], node_rank: int = 0,
                rendezvous_s: int = RENDEZVOUS_S) -> GroupResult:
    """Trains a data-parallel run: this process becomes torchrun's agent for this machine's
    nproc ranks, waits for them, and (on node 0, with the session) stores the run crashed
    naming the rank that failed, if one did. Imports torch (torchrun is PyTorch's)."""
    from .engine.distributed import failure_reason, launch_group
    if session is not None and run_id is not None:
        with SessionStore(session, create=False) as store:
            log_path, log_dir = store.log_path(run_id), store.logs_dir / f"run-{run_id}-ranks"
    else:
        import tempfile
        log_path, log_dir = None, Path(tempfile.mkdtemp(prefix="tui-trainer-join-"))
    # torchrun would give every rank one thread; num_threads = 0 means one per core, so
    # this machine's cores are shared out instead (the rank's num_threads is recorded).
    if cfg.num_threads == 0 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // cfg.nproc))
    worker = [*worker, "--dist-timeout", str(cfg.dist_timeout)]
    argv = torchrun_args(cfg.nproc, cfg.nnodes, cfg.rdzv_endpoint, worker, log_dir, node_rank,
                         rendezvous_s)
    log_file = None
    if log_path is not None and not _same_file(sys.stderr, log_path):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(log_path, "a", encoding="utf-8", buffering=1)
    line = (f"{time.strftime('%H:%M:%S')} launching {cfg.nproc} process(es) on this machine "
            f"(node {node_rank} of {cfg.nnodes}): torchrun {shlex.join(argv)}")
    print(line, file=sys.stderr, flush=True)
    if log_file is not None:
        print(line, file=log_file)
    try:
        try:
            failures, stopped_by = launch_group(argv, log_file)
        except (RuntimeError, TimeoutError, OSError) as e:
            if cfg.nnodes < 2:
                raise
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise RendezvousFailed(
                f"the {cfg.nnodes} nodes did not meet at {cfg.rdzv_endpoint} within "
                f"{rendezvous_s} s (is the run started on node 0, with this endpoint, and "
                f"can this machine reach it?): {first}") from None
        # In the failed rank's own words, before its logs may go.
        reason = failure_reason(failures, log_dir, cfg.nproc, cfg.dist_timeout)
    finally:
        if log_file is not None:
            log_file.close()
        if session is None:                  # `join`: the ranks' streams were shown already
            import shutil
            shutil.rmtree(log_dir, ignore_errors=True)
    # Every rank refused (bad input), or was stopped by torchrun (SIGTERM) as another did:
    # the first to refuse ends the group, and the one about to refuse too may be killed.
    codes = [f.exitcode for f in failures]
    refused = any(c in (EXIT_BAD_INPUT, EXIT_SESSION) for c in codes) and all(
        c in (EXIT_BAD_INPUT, EXIT_SESSION, -signal.SIGTERM) for c in codes)
    run = None
    if session is not None and run_id is not None:
        with SessionStore(session, create=False) as store:
            if reason is not None and not refused:
                store.group_failed(run_id, reason,
                                   {"failures": [asdict(f) for f in failures]})
            run = store.run(run_id)
            if reason is None and stopped_by is not None and \
                    run["stored_status"] in ("created", "running"):
                # Asked to stop, the ranks were still there stop_grace_s() later (stuck in a
                # collective, or slower than that): torchrun killed them.
                reason = (f"stopped by force at step {run['step']}: its processes had not "
                          f"stopped {stop_grace_s()} s after being asked to ({stopped_by}; a "
                          "process waiting in a collective for a hung one never sees the "
                          "signal) and were killed; continue it from its newest checkpoint")
                store.group_failed(run_id, reason, {"signal": stopped_by},
                                   kind="stop_forced")
            run = store.run(run_id)
    return GroupResult(run=run, failures=failures, reason=reason, refused=refused,
                       signal=stopped_by)
