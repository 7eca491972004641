"""What a command's end costs once it has imported torch: the interpreter's own clean-up
(issue 67: part of every price's wall time).

    python benchmarks/exit_cost.py [--repeats 7]

Each command is timed from its start to its exit, interleaved, in the same run:
- `tui-trainer machine` as it ships (cli.main puts what is alive out of the garbage
  collector's reach as its last exit function, cli._quick_end: gc.freeze where triton is
  not loaded, whose nanobind bindings would report what is alive as leaks);
- the same command with that exit function taken back (the peer: a plain interpreter end);
- `python -c "import torch"` and the same with `gc.freeze()` last, the bare cost.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from tui_trainer.core.settings import hardware

MACHINE = ("import sys, atexit, gc\nfrom tui_trainer import cli\n"
           "code = cli.main(['machine'])\n{undo}sys.exit(code)")
CASES = {
    "tui-trainer machine (as shipped)": MACHINE.format(undo=""),
    "tui-trainer machine, plain end": MACHINE.format(undo="atexit.unregister(cli._quick_end)\n"),
    "import torch, plain end": "import torch",
    "import torch, gc.freeze() last": "import atexit, gc, torch\natexit.register(gc.freeze)",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    print(f"machine: {hardware.this_cpu().describe()}; {args.repeats} runs each, interleaved")
    walls: dict[str, list[float]] = {k: [] for k in CASES}
    for _ in range(args.repeats):
        for name, code in CASES.items():
            t = time.monotonic()
            subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL,
                           stdin=subprocess.DEVNULL, timeout=120)
            walls[name].append(time.monotonic() - t)
    print("| command | median wall | min | max |")
    print("| --- | ---: | ---: | ---: |")
    for name, w in walls.items():
        print(f"| {name} | {statistics.median(w):.2f} s | {min(w):.2f} s | {max(w):.2f} s |")


if __name__ == "__main__":
    main()
