"""Tables fit the width at hand: the column rule (core.columns) and the command line's
tables in an 80-column terminal."""

from __future__ import annotations

from conftest import tt
from tui_trainer.core.columns import cut, fit


def test_columns_are_taken_by_importance_and_shown_in_their_own_order():
    widths = [8, 20, 10, 10, 30]
    f = fit(widths, [0, 3, 1, 2, 4], 45)
    assert f.shown == [0, 1, 3] and f.left_out == [2, 4]          # 8+2+10+2+20 = 42
    assert fit(widths, [0, 1], None).shown == [0, 1, 2, 3, 4]     # no width: everything
    # A free-text column takes what is left, cut, rather than pushing everything out.
    f = fit(widths, [0, 4, 2], 40, stretch=4)
    assert f.shown == [0, 4] and f.stretch_width == 30
    f = fit(widths, [0, 4, 2], 30, stretch=4)
    assert f.shown == [0, 4] and f.stretch_width == 20
    assert fit(widths, [0, 4], 15, stretch=4).shown == [0]         # under 12 cells: left out
    assert cut("not identical, from step 50", 10) == "not ident…"
    assert cut("short", 10) == "short"


def in_terminal(columns: int, *args: str) -> str:
    """`tui-trainer ARGS` with its output on a real terminal (a pty) `columns` wide."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen([sys.executable, "-m", "tui_trainer", *args], stdout=slave,
                            stderr=subprocess.PIPE, env=env)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:                 # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(timeout=180) == 0, proc.stderr.read() if proc.stderr else ""
    return out.decode().replace("\r\n", "\n")


def test_cli_tables_fit_an_80_column_terminal_and_pipes_get_them_whole(tmp_path,
                                                                          monkeypatch):
    from test_snapshots import _fill
    _fill(tmp_path)
    out = in_terminal(80, "ab", "--study", "1", "--session", str(tmp_path))
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines), [len(x) for x in lines]
    head = lines[1]
    assert head.split()[:5] == ["variant", "samples/s", "bit-identical", "to", "base"] \
        and "accuracy %" in head
    assert "left out to fit 80 columns: train loss" in out
    assert "amp=fp16: not possible on this machine" in out          # the note, whole
    runs = in_terminal(80, "runs", "--session", str(tmp_path))
    assert all(len(line) <= 80 for line in runs.splitlines())
    runs = in_terminal(40, "runs", "--session", str(tmp_path))
    assert runs.splitlines()[0].split() == ["id", "name", "status", "step", "acc"]
    assert "left out to fit the terminal" in runs
    # A pipe gets the whole table, as `git` does (also with $COLUMNS set by someone).
    monkeypatch.setenv("COLUMNS", "80")
    whole = tt("ab", "--study", "1", "--session", str(tmp_path))
    assert whole.out.splitlines()[1].endswith("data wait s  run")
    assert "left out to fit" not in whole.out
