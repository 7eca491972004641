"""A run config written as TOML: the file `config` prints and a preset is saved as, each
knob under its group with its doc and what it allows. Core layer."""

from __future__ import annotations

import textwrap
from typing import Any

from . import config


def toml_value(value: Any) -> str:
    if value is None:
        return '"none"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def to_toml(cfg: config.RunConfig, comments: bool = True) -> str:
    lines: list[str] = []
    if comments:
        lines += ["# tui-trainer run config. Every key is optional; missing keys take the "
                  "defaults shown here.", "# Set any key on the command line with "
                  "--set KEY=VALUE.", ""]
    values = cfg.to_dict()
    for g, title in config.GROUPS.items():
        keys = [k for k in config.FIELDS if config.group(k) == g]
        if comments:
            lines += [f"# === {title} " + "=" * max(3, 80 - len(title)), ""]
        for key in keys:
            if comments:
                lines += textwrap.wrap(config.doc(key), 94, initial_indent="# ",
                                       subsequent_indent="# ")
                lines.append(f"# allowed: {config.allowed(key)}")
            lines.append(f"{key} = {toml_value(values[key])}")
            if comments:
                lines.append("")
    return "\n".join(lines).rstrip() + "\n"
