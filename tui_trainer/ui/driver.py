"""The terminal driver: Textual's own, with the Escape key decided within ESCDELAY.

A lone ESC byte is either the Escape key or the first byte of another key's sequence; the
parser waits ESCDELAY (25 ms here, see ui/__init__.py) for more bytes before it calls it
Escape. Textual's input thread, though, waits for input 0.1 s at a time and asks the parser
about its timeout only when that wait ends: every Escape (closing a dialog, leaving the knob
search) reached the app 100 to 110 ms after the key, whatever ESCDELAY said (measured in
tmux, issue 18). This input loop waits no longer than the parser's own deadline; otherwise
it is Textual's: the same parser, the same messages.
"""

from __future__ import annotations

import os
import selectors
from codecs import getincrementaldecoder

from textual._time import get_time
from textual._xterm_parser import XTermParser
from textual.drivers.linux_driver import LinuxDriver

IDLE_WAIT = 0.1      # s: how often the loop looks at exit_event while nothing is typed


def _wait(parser: XTermParser) -> float:
    """Seconds until the parser's pending sequence times out (it then decides what the bytes
    were), or IDLE_WAIT when nothing is pending."""
    deadline = getattr(parser, "_timeout_time", None)
    if deadline is None:
        return IDLE_WAIT
    return min(IDLE_WAIT, max(0.0, deadline - get_time()))


class Driver(LinuxDriver):
    def run_input_thread(self) -> None:
        parser = XTermParser(self._debug)
        decode = getincrementaldecoder("utf-8")().decode

        def handle(ready: list, final: bool = False) -> None:
            for _key, mask in ready:
                if mask & selectors.EVENT_READ:
                    data = decode(os.read(self.fileno, 4096), final=final)
                    for event in parser.feed(data) if data else ():
                        self.process_message(event)
            for event in parser.tick():
                self.process_message(event)

        with selectors.SelectSelector() as selector:
            selector.register(self.fileno, selectors.EVENT_READ)
            try:
                while not self.exit_event.is_set():
                    handle(selector.select(_wait(parser)))
                handle(selector.select(IDLE_WAIT), final=True)
            finally:
                try:
                    for _ in parser.feed(""):
                        pass
                except Exception:  # noqa: BLE001 - the end of input, as Textual's loop
                    pass


def driver_for(chosen: type) -> type:
    """Textual's driver for this terminal (`chosen`); on Linux and macOS, this module's, which
    decides a lone Escape within ESCDELAY."""
    return Driver if chosen is LinuxDriver else chosen
