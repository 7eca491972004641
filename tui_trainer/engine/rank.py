"""One rank of a data-parallel run (the `worker` command): started by torchrun inside the
run's own process, it joins its group (engine.distributed), rank 0 reads the run from the
session and hands it to every rank, and every rank trains (engine.host.run_training).
"""

from __future__ import annotations

import json
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.settings import config, user_models
from ..core.errors import EXIT_DIVERGED, EXIT_OK, EXPECTED, BadInput, CheckpointError, expected
from ..core.processes.proctitle import set_title, title
from ..core.session.store import SessionStore
from .distributed import (AGENT_ENV, PeerLost, die_with_parent, join_group, leave_at_once,
                          under_torchrun)
from .host import run_training


@dataclass(frozen=True)
class RankArgs:
    """What torchrun gives every rank on its command line
    (core.processes.supervisor.worker_args)."""
    session: Path | None            # only on node 0: the machine holding the session
    run_id: int | None
    sets: list[str]                 # the allowed overrides of a continued run
    checkpoint: str | None          # the checkpoint to continue from, chosen by the launcher
    events: str                     # JSON: events the launcher found, recorded by rank 0
    kill_at_step: int | None
    dist_timeout: float


def run_rank(args: RankArgs, say: Any = print) -> int:
    """One rank, started by torchrun. Rank 0 (on node 0, with the session) reads the run
    and its checkpoint and hands them to every rank; only it records anything. Prints
    nothing on stdout: the launcher prints the run's summary. A refusal (bad config for
    this machine, a checkpoint that does not fit) is said by rank 0 and recorded on the
    run; every rank exits with its status."""
    check_rank_of_a_group()
    die_with_parent()
    sys.stdout = sys.stderr
    group = join_group(args.dist_timeout)
    set_title(title(args.run_id or 0, session=args.session, rank=group.rank,
                    world=group.world))
    payload: dict[str, Any] | None = None
    if group.lead:
        try:
            payload = _lead_reads_the_run(args)
        except EXPECTED as e:
            payload = {"error": str(e), "code": expected(e)[0]}
    payload = group.broadcast(payload)
    if "error" in payload:
        if group.lead:
            say(payload["error"])
        group.close()
        return payload["code"]
    cfg = config.from_dict(payload["config"])
    if group.world != cfg.nproc * cfg.nnodes:
        raise BadInput(f"this rank's group has {group.world} processes but the run asks for "
                       f"nproc x nnodes = {cfg.nproc * cfg.nnodes}: give `join` the run's "
                       "nproc and nnodes")
    session = args.session if group.lead and args.session else Path(".")
    try:
        summary = run_training(cfg, session, run_id=args.run_id if group.lead else 0,
                               checkpoint=payload["checkpoint"],
                               events=[tuple(e) for e in payload["events"]],
                               kill_at_step=args.kill_at_step, group=group,
                               sampler_seed=payload["sampler_seed"],
                               recorded=payload.get("recorded"))
        group.settle()                  # the ranks tear the group down together
    except PeerLost as e:
        leave_at_once(e.code)           # the group is broken: not torn down (never returns)
    except (config.ConfigError, CheckpointError) as e:
        if group.lead and args.run_id is not None:
            with SessionStore(session, create=False) as store:
                store.refused_to_start(args.run_id, str(e))
        raise
    finally:
        group.close()
    # A stopped rank exits 0 (torchrun counts any other status as a failure); the launcher
    # says "stopped" with its own status.
    return EXIT_DIVERGED if summary.status == "diverged" else EXIT_OK


def check_rank_of_a_group() -> None:
    """`worker` is one rank of a data-parallel run: torchrun started it, inside the process
    that trains the run (`run`, `resume` or `join`, torchrun's agent). Run by hand it would
    train the run again from step 0, past every check of `resume`: refused. The agent is
    known by its pid (AGENT_ENV), not by its command line, which may be anything."""
    if not under_torchrun() or os.environ.get(AGENT_ENV) != str(os.getppid()):
        raise BadInput("`worker` is one process of a data-parallel run, started by torchrun "
                       "inside the run's own process; it is not run by hand (use `run`, "
                       "`resume` or `join`)")


def _lead_reads_the_run(args: RankArgs) -> dict[str, Any]:
    """Rank 0's reading of the run: its config (with the allowed overrides), the checkpoint
    to continue from (loaded and checked), the events the launcher found, the shuffle seed."""
    if not args.session or args.run_id is None:
        raise BadInput("rank 0 of the run is on a machine without the session: the machine "
                       "that started the run must be node 0 (`join` is for the others)")
    with SessionStore(args.session, create=False) as store:
        run = store.run(args.run_id)
        cfg = config.from_dict({**run["config"], **config.parse_overrides(args.sets)})
        state = None
        if args.checkpoint:
            from .checkpoint import load_named
            state = load_named(store, run, cfg, Path(args.checkpoint))
    # With seed = none the shuffle is still one permutation shared by every rank: drawn here.
    seed = cfg.seed if cfg.seed is not None else random.SystemRandom().randrange(2**31)
    # A run continued: a net of the user's own file is built, by every rank, from the file
    # and content the run recorded (engine/models.py), or refused naming both hashes.
    recorded = user_models.recorded(run) if state is not None else None
    return {"config": cfg.to_dict(), "checkpoint": state, "events": json.loads(args.events),
            "sampler_seed": seed, "recorded": recorded}
