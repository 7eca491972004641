"""The footer: Textual's, composed again only when the keys it shows change."""

from __future__ import annotations

from textual.screen import Screen
from textual.widgets import Footer


class StableFooter(Footer):
    """Textual's footer rebuilds its keys whenever a screen's bindings are announced, also
    when a dialog closes and the dashboard's keys are the same as before: a dozen widgets
    mounted and styled on every escape (tens of milliseconds, more while runs train). This
    one does it only when the keys shown change."""

    _shown: tuple = ()

    def bindings_changed(self, screen: Screen) -> None:
        if screen is self.screen and self._bindings_ready:
            shown = tuple((b.key, b.description, enabled)
                          for _, b, enabled, _ in screen.active_bindings.values() if b.show)
            if shown == self._shown:
                return
            self._shown = shown
        super().bindings_changed(screen)
