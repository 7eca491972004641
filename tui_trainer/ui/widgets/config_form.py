"""The run config as a form: one line per knob, grouped in collapsible sections; the focused
knob's explanation shows in the help line under the form; values that differ from the
default are marked with •; typing in the search box filters the knobs (it never takes the
focus or writes into a knob); Enter or Down there goes to the first match.

Built from the config's own field table (`core.settings.config`), so the form, `tui-trainer config`
and the validation rules never disagree. An invalid value is marked at its field with the
reason; the form reports whether it is valid so that Start can be refused. Once the machine
is known (core.settings.machine), a config it cannot run (cuda without CUDA, fp16 on the CPU, a
dataset not on disk) is marked the same way, at its key.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.suggester import SuggestFromList
from textual.widgets import Checkbox, Collapsible, Label, Select, Static

from ...core.analysis import prices
from ...core.settings import config, fit
from ...core.settings import machine
from ...core.text import shown
from .inputs import Input


def _text(value: Any) -> str:
    return "none" if value is None else str(value)


def _typed(key: str) -> bool:
    """Whether a knob's widget holds its value typed (a Checkbox, a Select), not as text."""
    kind = config.kind(key)
    return kind == "bool" or (kind == "choice" and key not in ("model", "dataset"))


def _shown(key: str, value: Any) -> Any:
    """A value as its knob's widget holds it: typed, or the text shown."""
    return value if _typed(key) else _text(value)


class _Group(Collapsible):
    """A group of knobs whose fields are built when it first opens (a closed group's 50
    fields were a third of the first screen's time); `build` is the form's."""

    def __init__(self, *, build: Callable[[], None], **kwargs: Any) -> None:
        self._build = build
        super().__init__(**kwargs)

    def _watch_collapsed(self, collapsed: bool) -> None:
        if not collapsed and self.is_mounted:
            self._build()               # before it is shown: never an empty group
        super()._watch_collapsed(collapsed)


class ConfigForm(VerticalScroll):
    """Emits `ConfigForm.Changed` whenever a value changes, with the current problems."""

    class Changed(Message):
        def __init__(self, problems: dict[str, str]) -> None:
            self.problems = problems
            super().__init__()

    class Focused(Message):
        """A knob got the focus: its explanation can be shown."""
        def __init__(self, key: str) -> None:
            self.key = key
            super().__init__()

    def __init__(self, initial: config.RunConfig | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._initial = (initial or config.DEFAULTS).to_dict()
        self.problems: dict[str, str] = {}
        # {key: (value, why)}: refused by a run's own process (`refuse`), while it holds
        self.refused: dict[str, tuple[Any, str]] = {}
        self.machine: machine.Machine | None = None     # known once probed: its rules apply too
        # What the last preset chose for this machine (core.settings.fit), and the prices
        # measured here (core.analysis.prices, read in a worker): said under their knobs.
        self.chosen: dict[str, fit.Choice] = {}
        self.prices: list[prices.Price] = []
        self._notes: dict[str, Static] = {}
        # The widgets of each knob, kept here: no query walks the form per knob per change.
        self._widgets: dict[str, Any] = {}
        # The values of knobs without a mounted widget (their group never opened, or its
        # fields being mounted: a Select reads blank until then), as the widget holds them.
        self._held: dict[str, Any] = {}
        self._built: dict[str, asyncio.Event] = {}     # a group's fields are mounted
        self._boxes: dict[str, Horizontal] = {}
        self._names: dict[str, Label] = {}
        self._errors: dict[str, Static] = {}
        self._check_pending = False
        self.matches: list[str] = list(config.FIELDS)   # the knobs the search shows
        self.ready = False      # its fields are mounted (it may be mounted after first paint)

    def compose(self) -> ComposeResult:
        # Reproducibility open, and each group holding a value off its default; the others
        # closed until asked for (a search, a knob's focus, a value set there, a click): the
        # form's height, and so what a screen of it shows, does not change with the knobs of
        # groups out of sight.
        # A closed group's fields are built when it first opens (_build).
        first = next(iter(config.GROUPS))
        for group, title in config.GROUPS.items():
            keys = self._keys(group)
            shut = group != first and all(self._initial[k] == config.DEFAULTS.to_dict()[k]
                                          for k in keys)
            # (born with its class: Collapsible adds it on mount otherwise, restyling each
            # closed group's fields, 0.22 s of the form's 0.62 s mount, profiled)
            with _Group(title=title, collapsed=shut, id=f"group-{group}",
                        classes="-collapsed" if shut else None,
                        build=lambda group=group: self._build(group)):
                for key in keys:
                    if shut:
                        self._held[key] = _shown(key, self._initial[key])
                    else:
                        yield self._field(key, self._initial[key])

    @staticmethod
    def _keys(group: str) -> list[str]:
        return [k for k in config.FIELDS if config.group(k) == group]

    def _build(self, group: str) -> None:
        """A group's fields, from the values its knobs hold, the first time it opens (the
        search's filter applied to them); its notes and errors follow (recheck)."""
        unbuilt = [k for k in self._keys(group) if k not in self._widgets]
        if not unbuilt:
            return
        built = self._built[group] = asyncio.Event()
        born = {key: self._held[key] for key in unbuilt}
        boxes = [self._field(key, born[key]) for key in unbuilt]
        shown = set(self.matches)
        for key, box in zip(unbuilt, boxes):
            box.display = key in shown
        mounting = self.query_one(f"#group-{group}", Collapsible).query_one(
            Collapsible.Contents).mount_all(boxes)

        async def mounted() -> None:
            await mounting
            if not all(self._widgets[key].is_mounted for key in unbuilt):
                return          # the app closed meanwhile: its values stay held
            with self.prevent(Input.Changed, Checkbox.Changed, Select.Changed):
                for key in unbuilt:     # a value set meanwhile (keys typed there are kept)
                    if (value := self._held.pop(key)) != born[key]:
                        self._widgets[key].value = value
            built.set()
            self.recheck()
        self.call_later(mounted)

    async def field(self, key: str) -> Any:
        """A knob's widget, its group opened (and its fields mounted) first: as a user
        gets to it."""
        self._open(key)
        if (built := self._built.get(config.group(key))) is not None:
            await built.wait()
        return self._widgets[key]

    def _get(self, key: str) -> Any:
        return self._held[key] if key in self._held else self._widgets[key].value

    def _put(self, key: str, value: Any) -> None:
        if key in self._held:
            self._held[key] = _shown(key, value)
        else:
            self._widgets[key].value = _shown(key, value)

    def _field(self, key: str, value: Any) -> Horizontal:
        """One line: the name and the value's widget. The line under it with the reason a
        value is refused is mounted only when there is one (a form of 38 knobs mounts
        quickly)."""
        kind = config.kind(key)
        if kind == "bool":
            widget: Any = Checkbox("on" if value else "off", value=bool(value),
                                   id=f"field-{key}")
        elif kind == "choice" and key not in ("model", "dataset"):
            options = [(c, c) for c in config.choices(key) or ()]
            widget = Select(options, value=value, allow_blank=False, id=f"field-{key}")
        elif key in ("model", "dataset"):
            # a built-in net or dataset (suggested as it is typed), or your own file
            widget = Input(value=_text(value), id=f"field-{key}",
                           suggester=SuggestFromList(config.choices(key) or (),
                                                     case_sensitive=True),
                           placeholder=", ".join(config.choices(key) or ()) + (
                               ", or FILE.py:Name" if key == "model" else
                               ", or folder:PATH"))
        else:
            widget = Input(value=_text(value), id=f"field-{key}",
                           placeholder="empty: the default (see below)" if kind == "text"
                           else config.allowed(key))
        widget.tooltip = config.allowed(key)
        name = Label(key, classes="field-name", id=f"name-{key}")
        box = Horizontal(name, widget, classes="field field-row", id=f"box-{key}")
        self._widgets[key], self._names[key], self._boxes[key] = widget, name, box
        return box

    def on_mount(self) -> None:
        self.ready = True           # the fields were composed from self._initial
        self.recheck()

    def on_resize(self) -> None:
        self.recheck()              # (a path that fits its field now, or no longer does)

    def on_collapsible_expanded(self) -> None:
        self.call_after_refresh(self.recheck)   # its fields laid out: a long path said whole

    def on_descendant_focus(self, event: Any) -> None:
        wid = getattr(event.widget, "id", "") or ""
        if wid.startswith("field-"):
            self.post_message(self.Focused(wid.removeprefix("field-")))

    @staticmethod
    def matching(text: str) -> list[str]:
        """The knobs a search matches: those whose name contains `text`, or else those whose
        explanation does; the likeliest first (the name itself, then names that start with
        it, then a word of the name that does: "amp" finds amp before train_samples), else
        in the form's order."""
        text = text.strip().lower()
        if not text:
            return list(config.FIELDS)
        named = [k for k in config.FIELDS if text in k.lower()]
        if not named:
            return [k for k in config.FIELDS if text in config.doc(k).lower()]

        def rank(key: str) -> int:
            key = key.lower()
            return 0 if key == text else 1 if key.startswith(text) else \
                2 if any(word.startswith(text) for word in key.split("_")) else 3
        return sorted(named, key=rank)      # (stable: the form's order within a rank)

    def filter(self, text: str) -> list[str]:
        """Shows only the knobs that match `text` (all of them for an empty one), the first
        match highlighted, and returns the matches. It never moves the focus and never
        changes a value: the search box keeps every key typed into it."""
        if not self.ready:
            return []
        keys = self.matching(text)
        found = set(keys)
        self.matches = keys
        if text.strip():            # the groups it finds are opened: their fields built
            for group in {config.group(k) for k in found}:
                self._build(group)
        for key in config.FIELDS:
            box = self._boxes.get(key)
            if box is None:
                continue
            box.display = key in found
            box.set_class(bool(text.strip()) and bool(keys) and key == keys[0], "-match")
            if key in self._errors:
                self._errors[key].display = key in found
            if key in self._notes:
                self._notes[key].display = key in found
        for group in config.GROUPS:
            section = self.query_one(f"#group-{group}", Collapsible)
            section.display = any(config.group(k) == group for k in found)
            if text.strip() and section.display:
                section.collapsed = False
        if keys and text.strip():
            self.scroll_to_widget(self._boxes[keys[0]], animate=False)
        return keys

    def _open(self, key: str) -> bool:
        """Opens the knob's group; whether it was closed."""
        section = self.query_one(f"#group-{config.group(key)}", Collapsible)
        was = section.collapsed
        section.collapsed = False
        return was

    def focus_knob(self, key: str) -> None:
        """Moves the focus to a knob's value (its group opened): the user asked for it."""
        if self._open(key):
            # its field is shown once the group is laid out again: focused then
            self.call_after_refresh(self.screen.set_focus, self._widgets[key])
        else:
            # now, not after the keys already queued (Widget.focus defers it): those typed
            # next reach this knob (KnobSearch)
            self.screen.set_focus(self._widgets[key])
        self.call_after_refresh(self.scroll_to_widget, self._boxes[key], animate=False)

    # --- values ----------------------------------------------------------------------------
    def raw_values(self) -> tuple[dict[str, Any], dict[str, str]]:
        """Typed values of every field, and the fields whose text does not parse."""
        values: dict[str, Any] = {}
        problems: dict[str, str] = {}
        if not self.ready:
            return dict(self._initial), problems
        for key in config.FIELDS:
            if _typed(key):
                values[key] = self._get(key)
            else:
                try:
                    values[key] = config.parse_value(key, self._get(key))
                except config.ConfigError as e:
                    problems[key] = e.reason
        return values, problems

    def texts(self) -> dict[str, str]:
        """What each field shows, as text (an edit that does not parse included)."""
        if not self.ready:
            return {k: str(v) for k, v in self._initial.items()}
        return {key: str(self._get(key)) for key in config.FIELDS}

    def validate(self) -> dict[str, str]:
        values, problems = self.raw_values()
        good = {k: v for k, v in values.items() if k not in problems}
        for key, reason in config.validate_all(good).items():
            problems.setdefault(key, reason)
        if not problems and self.machine is not None:
            found = machine.problem(good, self.machine)
            if found is not None:
                problems[found.key.split(" ")[0]] = f"this machine: {found.reason}"
        for key, (value, why) in list(self.refused.items()):
            if values.get(key) == value:
                problems.setdefault(key, why)
            else:
                del self.refused[key]       # changed since: checked again by the next Start
        if self.ready:
            self._mark(problems)
        self.problems = problems
        return problems

    def refuse(self, key: str, value: Any, why: str) -> None:
        """A value of this field that a run's process refused (what only building the
        model and the data can tell): said under it while the field holds that value."""
        self.refused[key] = (value, why)
        self.recheck()

    def recheck(self) -> None:
        self.post_message(self.Changed(self.validate()))

    def config(self) -> config.RunConfig:
        """The form's config; raises ConfigError when a field is invalid."""
        values, problems = self.raw_values()
        if problems:
            key = next(iter(problems))
            raise config.ConfigError(key, problems[key])
        return config.from_dict(values)

    def set_config(self, values: dict[str, Any]) -> None:
        if not self.ready:          # shown when the fields are mounted
            self._initial = {**config.DEFAULTS.to_dict(),
                             **{k: v for k, v in values.items() if k in config.FIELDS}}
            return
        with self.prevent(Input.Changed, Checkbox.Changed, Select.Changed):
            for key, value in {**config.DEFAULTS.to_dict(), **values}.items():
                if key not in config.FIELDS:
                    continue
                self._put(key, value)
        self.post_message(self.Changed(self.validate()))

    def set_value(self, key: str, value: Any) -> None:
        """One field to `value`, the others as they are (typed text that does not parse
        stays, marked)."""
        if not self.ready:
            self._initial = {**self._initial, key: value}
            return
        with self.prevent(Input.Changed, Checkbox.Changed, Select.Changed):
            self._put(key, value)
        self.post_message(self.Changed(self.validate()))

    def _mark(self, problems: dict[str, str]) -> None:
        values, _ = self.raw_values()
        defaults = config.DEFAULTS.to_dict()
        for key in config.FIELDS:
            changed = key in values and values[key] != defaults[key]
            box = self._boxes.get(key)
            if (changed and (box is None or not box.has_class("-changed"))) or \
                    (key in problems and key not in self._errors):
                self._open(key)            # a value set there (a preset's), or refused: shown
                box = self._boxes.get(key)
            if box is None:
                continue        # in a group never opened, at its default and valid
            widget = self._widgets[key]
            if key not in self._held and isinstance(widget, Checkbox) and \
                    str(widget.label) != (label := "on" if widget.value else "off"):
                widget.label = label
            box.set_class(key in problems, "-invalid")
            if box.has_class("-changed") != changed:
                box.set_class(changed, "-changed")
                self._names[key].update(("• " if changed else "") + key)
            error = self._errors.get(key)
            if key in problems:
                # The reason quotes what was typed: plain text, never markup.
                text = Text(f"✗ {shown(problems[key], 400)}")   # (a run's refusal: ~250)
                if error is not None:
                    error.update(text)
                else:
                    error = self._errors[key] = Static(text, classes="field-error",
                                                       id=f"error-{key}")
                    error.display = box.display        # hidden with its knob by a search
                    if box.parent is not None:          # (not while the app closes)
                        box.parent.mount(error, after=box)
            elif error is not None:
                del self._errors[key]
                error.remove()
        self._mark_notes(values)

    def _mark_notes(self, values: dict[str, Any]) -> None:
        """Under a knob: what the preset chose for this machine while its value holds, a
        value this machine emulates or lacks, and its price measured here; and a path
        (model's file, dataset's folder) too long for its field, whole."""
        said = fit.notes(values, self.machine, self.prices)
        for key, choice in self.chosen.items():
            if values.get(key) == choice.value:
                said[key] = f"chosen for this machine: {choice.reason}" + (
                    f"; {said[key]}" if key in said else "")
        whole = {}
        for key in ("model", "dataset"):
            text = str(self._get(key))
            if key in self._boxes and 0 < self._widgets[key].content_region.width < len(text):
                whole[key] = f"⤷{shown(text, 1000)}"     # (no space: a path folds whole)
        for key in config.FIELDS:
            note = self._notes.get(key)
            if key not in self._boxes:
                continue        # said once its group is built
            if key in said or key in whole:
                text = Text("\n".join(filter(None, (
                    whole.get(key), key in said and f"⚠ {shown(said[key], 300)}"))))
                if note is not None:
                    note.update(text)
                    note.set_class(key not in said, "-whole")
                    continue
                note = self._notes[key] = Static(text, classes="field-note",
                                                 id=f"note-{key}")
                note.set_class(key not in said, "-whole")
                note.display = self._boxes[key].display
                anchor = self._errors.get(key) or self._boxes[key]
                if anchor.parent is not None:           # (not while the app closes)
                    anchor.parent.mount(note, after=anchor)
            elif note is not None:
                del self._notes[key]
                note.remove()

    @on(Input.Changed)
    @on(Checkbox.Changed)
    @on(Select.Changed)
    def _changed(self, event: Message) -> None:
        """A burst of changes (a preset sets 38 widgets; Selects report at mount) is
        checked once, after it."""
        event.stop()
        if not self._check_pending:
            self._check_pending = True
            self.call_later(self._check)

    def _check(self) -> None:
        self._check_pending = False
        self.post_message(self.Changed(self.validate()))
