"""Python's cycle collector, kept away from the keys.

The dashboard holds about 200,000 Python objects (widgets, styles, cached lines of text). A
full collection of the cycle collector walks all of them with the UI thread stopped: 55 to
77 ms, every few seconds while the screen changes (measured in tmux, issue 18), and a key
pressed then waited for it on top of its own work. Once the first screen and the form are
up, `tidy` collects and freezes the heap (`gc.freeze`: the collector leaves those objects
alone), so the collections Python starts by itself walk only what came since. Frozen
objects that die later are still freed by their reference counts; a cycle among them waits
for the next tidy, which runs every TIDY_EVERY_S when no key came for QUIET_S, and unfreezes,
collects and freezes again (once a minute or two, while the user is not typing).
"""

from __future__ import annotations

import gc

TIDY_EVERY_S = 90.0
QUIET_S = 2.0


def tidy() -> None:
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def release() -> None:
    """The app is gone: its objects are the collector's again (tests run many apps in one
    process)."""
    gc.unfreeze()
