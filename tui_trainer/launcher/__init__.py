"""The warm launcher: one process that has imported torch, torchvision and the engine once,
and forks a ready process for each run, so a run's first step comes within a second of
Start instead of after five seconds of imports.

`python -m tui_trainer.launcher SOCKET` (started by launcher.client.WarmLauncher, never by
hand; not a command of the CLI, which this wing uses and which does not import it) imports
what training needs, without running any torch op (no thread pool, no CUDA: a fork after
either is unsafe), then listens on a Unix socket. A request carries a command line, its
environment and working directory, and the file descriptors for its stdout and stderr and
the read end of a go-ahead pipe (passed over the socket, SCM_RIGHTS); the launcher forks,
answers the child's pid, and when the child ends, its exit status (as Popen gives it:
negative for a signal). The child runs its command only once the client, having believed
the answer, says go; without it (the client gave up and starts the run cold) it ends
without a word. The child is what a cold
`python -m tui_trainer ARGS` would be: its own process session (it outlives the dashboard),
stdin from /dev/null, output unbuffered, numpy's and torch's global RNGs seeded from the OS
as at interpreter start (Python's hash seed alone is the launcher's, shared by its forks);
tests/test_warm.py checks that a forked run is bit-identical to a cold-started one.

Single-threaded by design (a select loop and SIGCHLD through a wake-up pipe): forking a
process with threads could copy a held lock. It refuses to serve when importing left a
thread running, and the caller then starts runs cold. What the imports made is put out of
the garbage collector's reach before the first fork (`settle`).

The wing, by what each module owns:

    client.py   the protocol's client side (WarmLauncher, WarmChild): torch-free, used by the
                dashboard, studies and twins through core.processes.supervisor.launch()
    server.py   the fork server: imports once, the select loop, requests checked and forked
    spare.py    the spare's policy: which spare, which run it may take, when the next is made
    child.py    what a forked process (or a spare given a run) does with its request

The torch and driver work a spare does before Start is the engine's (engine/cuda_start.py).
Nothing here is imported by core; this package's __init__ imports nothing, so importing the
client never imports the server's torch.
"""
