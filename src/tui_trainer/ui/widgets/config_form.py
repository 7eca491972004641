"""The run config as a form: every knob, grouped, with its explanation under it.

Built from the config's own field table (`core.config`), so the form, `tui-trainer config`
and the validation rules never disagree. An invalid value is marked at its field with the
reason; the form reports whether it is valid so that Start can be refused.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Collapsible, Input, Label, Select, Static, Switch

from ...core import config as C
from ...core.text import shown


def _text(value: Any) -> str:
    return "none" if value is None else str(value)


class ConfigForm(VerticalScroll):
    """Emits `ConfigForm.Changed` whenever a value changes, with the current problems."""

    class Changed(Message):
        def __init__(self, problems: dict[str, str]) -> None:
            self.problems = problems
            super().__init__()

    def __init__(self, config: C.RunConfig | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._initial = (config or C.DEFAULTS).to_dict()
        self.problems: dict[str, str] = {}

    def compose(self) -> ComposeResult:
        for group, title in C.GROUPS.items():
            with Collapsible(title=title, collapsed=False, id=f"group-{group}"):
                for key in C.FIELDS:
                    if C.group(key) == group:
                        yield self._field(key, self._initial[key])

    def _field(self, key: str, value: Any) -> Vertical:
        kind = C.kind(key)
        if kind == "bool":
            widget: Any = Switch(value=bool(value), id=f"field-{key}")
        elif kind == "choice":
            options = [(c, c) for c in C.choices(key) or ()]
            widget = Select(options, value=value, allow_blank=False, id=f"field-{key}")
        else:
            widget = Input(value=_text(value), id=f"field-{key}",
                           placeholder=C.allowed(key))
        widget.tooltip = C.allowed(key)
        return Vertical(
            Horizontal(Label(key, classes="field-name"), widget, classes="field-row"),
            Static(C.doc(key), classes="field-doc"),
            Static("", classes="field-error", id=f"error-{key}"),
            classes="field", id=f"box-{key}")

    # --- values ----------------------------------------------------------------------------
    def raw_values(self) -> tuple[dict[str, Any], dict[str, str]]:
        """Typed values of every field, and the fields whose text does not parse."""
        values: dict[str, Any] = {}
        problems: dict[str, str] = {}
        for key in C.FIELDS:
            widget = self.query_one(f"#field-{key}")
            if isinstance(widget, Switch):
                values[key] = widget.value
            elif isinstance(widget, Select):
                values[key] = widget.value
            else:
                try:
                    values[key] = C.parse_value(key, widget.value)
                except C.ConfigError as e:
                    problems[key] = e.reason
        return values, problems

    def validate(self) -> dict[str, str]:
        values, problems = self.raw_values()
        good = {k: v for k, v in values.items() if k not in problems}
        for key, reason in C.validate_all(good).items():
            problems.setdefault(key, reason)
        self._mark(problems)
        self.problems = problems
        return problems

    def config(self) -> C.RunConfig:
        """The form's config; raises ConfigError when a field is invalid."""
        values, problems = self.raw_values()
        if problems:
            key = next(iter(problems))
            raise C.ConfigError(key, problems[key])
        return C.from_dict(values)

    def set_config(self, config: dict[str, Any]) -> None:
        with self.prevent(Input.Changed, Switch.Changed, Select.Changed):
            for key, value in {**C.DEFAULTS.to_dict(), **config}.items():
                if key not in C.FIELDS:
                    continue
                widget = self.query_one(f"#field-{key}")
                if isinstance(widget, (Switch, Select)):
                    widget.value = value
                else:
                    widget.value = _text(value)
        self.post_message(self.Changed(self.validate()))

    def _mark(self, problems: dict[str, str]) -> None:
        for key in C.FIELDS:
            box = self.query_one(f"#box-{key}")
            box.set_class(key in problems, "-invalid")
            # The reason quotes what was typed: plain text, never markup.
            self.query_one(f"#error-{key}", Static).update(
                Text(f"✗ {shown(problems[key], 200)}") if key in problems else "")

    @on(Input.Changed)
    @on(Switch.Changed)
    @on(Select.Changed)
    def _changed(self, event: Message) -> None:
        event.stop()
        self.post_message(self.Changed(self.validate()))
