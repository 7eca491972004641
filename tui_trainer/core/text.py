"""Text that comes from data (run, study and preset names, config strings, log lines) made
safe to show: control characters are shown escaped, never sent to a terminal, and long text
is cut. The UI wraps the result in plain-text objects (never markup); the CLI prints it.

Core layer: imports neither torch nor textual.
"""

from __future__ import annotations

import unicodedata

# What a name may be when it is created (older sessions may hold anything: it is still
# shown safely).
NAME_MAX = 200
# How much of one value a table cell or a title shows.
SHOW_MAX = 60


def _escaped(ch: str) -> str:
    code = ord(ch)
    if ch == "\t":
        return "\\t"
    if ch == "\n":
        return "\\n"
    if ch == "\r":
        return "\\r"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def is_unsafe(ch: str) -> bool:
    """Control characters (C0, DEL, C1) and the invisible format characters that can
    reorder or hide text (bidi overrides, zero-width marks)."""
    return unicodedata.category(ch) in ("Cc", "Cf")


def shown(text: object, limit: int | None = SHOW_MAX) -> str:
    """`text` with every control character written out as an escape (ESC as \\x1b, so an
    OSC or CSI sequence is visible and inert) and cut to `limit` characters with '…'."""
    s = str(text)
    out = "".join(_escaped(ch) if is_unsafe(ch) else ch for ch in s)
    if limit is not None and len(out) > limit:
        out = out[:max(1, limit - 1)] + "…"
    return out


def shown_line(text: str) -> str:
    """One log line: tabs kept as spaces, other control characters escaped, no cut."""
    return shown(text.expandtabs(4), limit=None)


def name_problem(name: str) -> str | None:
    """Why `name` cannot be a run, study or preset name, or None when it can."""
    if not name.strip():
        return "must not be empty"
    if len(name) > NAME_MAX:
        return f"must be at most {NAME_MAX} characters, got {len(name)}"
    # Bytes that are not UTF-8 reach Python's argv as lone surrogates: no text can hold them.
    odd = next((ch for ch in name if 0xD800 <= ord(ch) <= 0xDFFF), None)
    if odd is not None:
        byte = f"0x{ord(odd) - 0xDC00:02x}" if ord(odd) >= 0xDC80 else f"U+{ord(odd):04X}"
        return f"must be UTF-8 text (found the byte {byte}, which is not)"
    bad = next((ch for ch in name if is_unsafe(ch)), None)
    if bad is not None:
        return (f"must not contain control characters (found {_escaped(bad)}); "
                "letters, digits, spaces and punctuation are fine")
    return None


def shown_lines(text: str) -> str:
    """Like shown_line, for text of several lines: the newlines stay."""
    return "\n".join(shown_line(line) for line in str(text).split("\n"))
