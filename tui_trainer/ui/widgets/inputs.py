"""The text box every form, dialog and tab of the dashboard uses: Textual's Input, whose own
editing keys (backspace, delete, ←, →, home, end, ctrl+k, ...) act in the order they were
typed with the characters around them.

Textual's Input inserts a typed character in its own key handler, but runs a bound key's
action only after the key has gone up to the app and come back (textual#6605, open): keys that
arrive together, as on a machine busy training or from a fast typist, were applied out of
order. In tmux at 80x24, end, backspace and 3 typed into F4's epochs field (its 2 selected)
left it empty: the 3 replaced the 2 first, then the backspace took the 3 out. Here the box runs its own binding for a
key at once, as the app would have (a priority binding of the app still comes first, and a
key the box does not bind goes up as before).
"""

from __future__ import annotations

from textual import events
from textual.widgets import Input as TextualInput


class Input(TextualInput):
    async def _on_key(self, event: events.Key) -> None:
        for binding in self._bindings.key_to_bindings.get(event.key, ()):
            if not binding.priority and await self.app.run_action(binding.action, self):
                event.stop()
                event.prevent_default()
                return
        await super()._on_key(event)
