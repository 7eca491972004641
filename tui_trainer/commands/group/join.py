"""`tui-trainer join`: this machine's processes of a run that spans several machines."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ... import lifecycle
from ...core.settings import config
from ...core.processes import supervisor
from ...core.errors import EXIT_FAILED, EXIT_OK
from ..common import say


def add(sub: Any) -> None:
    sp = sub.add_parser("join", help="join a run that spans several machines (nnodes > 1)",
                        description="Start this machine's processes of a data-parallel run "
                                    "that spans several machines: the run is started on node "
                                    "0 (the machine holding the session) with nnodes and "
                                    "rdzv_endpoint set, and every other machine runs `join` "
                                    "with the same endpoint, nnodes and nproc and its own "
                                    "node rank (under Slurm, $SLURM_NODEID). Rank 0 hands "
                                    "this machine's processes the config and checkpoint; "
                                    "only node 0 needs the session.")
    sp.add_argument("endpoint", metavar="HOST:PORT", help="the run's rdzv_endpoint (on node 0)")
    sp.add_argument("--nnodes", type=int, required=True, help="machines in all")
    sp.add_argument("--nproc", type=int, required=True, help="processes on this machine "
                    "(the run's nproc)")
    sp.add_argument("--node-rank", type=int, required=True, metavar="R",
                    help="this machine's number, 1 to nnodes - 1")
    sp.add_argument("--timeout", type=int, default=supervisor.RENDEZVOUS_S, metavar="S",
                    help="how long to wait for node 0 and the other nodes (default "
                         f"{supervisor.RENDEZVOUS_S} s)")
    sp.add_argument("--dist-timeout", type=int, default=config.RunConfig().dist_timeout,
                    metavar="S", help="the run's dist_timeout: how long this machine's "
                    "processes wait for the others in one collective (default "
                    f"{config.RunConfig().dist_timeout} s)")


def run(args: argparse.Namespace) -> int:
    def waiting() -> None:
        print(f"node {args.node_rank}: waiting for node 0 at {args.endpoint} and the other "
              f"nodes (at most {args.timeout} s) ...", file=sys.stderr, flush=True)

    failure = lifecycle.join(args.endpoint, args.nnodes, args.node_rank, args.nproc,
                             args.timeout, args.dist_timeout, waiting)
    if failure is not None:
        say(failure)
        return EXIT_FAILED
    print(f"node {args.node_rank}: its {args.nproc} process(es) ended cleanly")
    return EXIT_OK
