"""The ui layer: the Textual dashboard. Imports core, never torch."""

import os

# A lone ESC byte is the Escape key or the start of a key's escape sequence; a terminal
# parser waits to see which. Textual waits 100 ms (its ESCDELAY), so every Escape (closing a
# dialog, leaving the search) lagged that long before anything happened. The bytes of one
# key's sequence arrive in one write, locally and over ssh alike: 25 ms tells them apart, as
# tmux (escape-time 10 ms since 3.5) and neovim (ttimeoutlen 50 ms) do. A user's own
# ESCDELAY (milliseconds) wins. Set here, before textual.constants reads it at import.
os.environ.setdefault("ESCDELAY", "25")
