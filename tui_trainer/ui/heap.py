"""Python's cycle collector, kept away from the keys.

The dashboard holds about 200,000 Python objects (widgets, styles, cached lines of text),
and with runs training it makes and drops thousands more a second as it draws and reads the
session. Python's full collections walk all of them with the UI thread stopped: 55 to
270 ms every 2 to 3 s while four runs trained, and a key pressed then waited for it on top
of its own work (measured in tmux with gc.callbacks, issue 18). So, once the first screen
and the form are up, the app calls `tidy` every TIDY_EVERY_S once no key came for QUIET_S
(and after MAX_DELAY_S whatever the keys do):
- it collects what came since the last tidy and freezes what is left (`gc.freeze`: later
  collections leave those objects alone), so each walk is a few seconds' worth of objects;
- every UNFREEZE_EVERY_S it first unfreezes everything, so that cycles which died after
  they were frozen are freed too;
- Python's own full collections are put off (the third threshold raised); the young
  generations are still collected as usual, in a few ms, and most objects die by their
  reference counts anyway.
"""

from __future__ import annotations

import gc
import time
from typing import Callable

TIDY_EVERY_S = 5.0
QUIET_S = 1.0
MAX_DELAY_S = 60.0          # a tidy waits at most this long for a pause in the keys
UNFREEZE_EVERY_S = 60.0
FULL_RARELY = 1_000_000     # gen1 collections before Python would start a full one itself

_default: tuple[int, ...] | None = None
_unfrozen_at = 0.0


def tidy() -> None:
    global _default, _unfrozen_at
    if _default is None:
        _default = gc.get_threshold()
        gc.set_threshold(_default[0], _default[1], FULL_RARELY)
    if time.monotonic() >= _unfrozen_at + UNFREEZE_EVERY_S:
        gc.unfreeze()
        _unfrozen_at = time.monotonic()
    gc.collect()
    gc.freeze()


def release() -> None:
    """The app is gone: its objects are the collector's again, on Python's own schedule
    (tests run many apps in one process)."""
    global _default, _unfrozen_at
    gc.unfreeze()
    _unfrozen_at = 0.0
    if _default is not None:
        gc.set_threshold(*_default)
        _default = None


class Tidier:
    """The app's tidies (called every QUIET_S once the form is up): each TIDY_EVERY_S after
    the last, when no key came for QUIET_S (`quiet`: how much longer to wait for the user),
    or MAX_DELAY_S late whatever the keys do."""

    def __init__(self, quiet: Callable[[float], float]) -> None:
        self.quiet = quiet
        self.due = 0.0

    def __call__(self) -> None:
        now = time.monotonic()
        overdue = now >= self.due + MAX_DELAY_S
        if now >= self.due and (overdue or not self.quiet(QUIET_S)):
            tidy()
            self.due = time.monotonic() + TIDY_EVERY_S
