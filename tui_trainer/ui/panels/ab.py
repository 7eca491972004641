"""The A/B tab: plan a study (the form's config as the base, one variant per value of each
varied knob), watch its table fill, pair a variant with the base (Enter).

The panel plans and starts a study itself (core.analysis.study; the write through `app.write`) and
tells the app which study to show (`StudyChosen`) and which runs to select (`SweepChosen`,
`Paired`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Button, DataTable, Label, Select, Static

from ...core.settings import config
from ...core.settings import machine as machines, presets, user_data
from ...core.analysis import sequential, study as studies
from ...core.analysis import study_text
from ...core.text import shown, shown_lines
from ..widgets.inputs import Input
from .common import Table, Tick, plain
from .launch import LaunchPanel



class ABPanel(Vertical):
    TAB, TITLE, PANEL_ID = "tab-ab", "A/B", "ab-panel"
    EXPORTS = "study"           # ctrl+e here: the study shown
    COMMANDS = [("Decide a price", "The vary field's knobs priced until each is faster, "
                 "slower or the same within ±5% (in windows where each is paid in every "
                 "step: seconds; else whole runs, ab --decide --whole-runs)", "decide"),
                ("Run study", "A/B study of the vary field against the form's config, its "
                 "steps and rounds as in the A/B tab", "run_study"),
                ("Seed sweep", "The form's config once per seed (as many as the A/B tab's "
                 "rounds)", "seed_sweep"),
                ("Decide seed noise", "The form's config seed after seed until the sd of "
                 "their accuracy is under or over 0.5 points (sweep --decide)",
                 "decide_seed_noise"),
                ("Stop study", "Stop the study shown in the A/B tab", "stop_study")]

    class StudyChosen(Message):
        """Show this study (chosen in the list, or just started)."""
        def __init__(self, study_id: int) -> None:
            self.study_id = study_id
            super().__init__()

    class SweepChosen(Message):
        def __init__(self, label: str, runs: list[int]) -> None:
            self.label, self.runs = label, runs
            super().__init__()

    class Paired(Message):
        def __init__(self, base: int, run: int, label: str) -> None:
            self.base, self.run, self.label = base, run, label
            super().__init__()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._options: Any = None
        self._key: Any = None
        self._study: dict[str, Any] | None = None
        self._shown_id: int | None = None
        # (a price, the study started after it in its job): that one shown once it trains
        self._then: tuple[int, int] | None = None

    def compose(self) -> ComposeResult:
        # One line per bar (compact widgets): at 80x24 the table keeps most of the tab.
        with Horizontal(classes="ab-bar"):
            yield Select([(p.label, str(p.path)) for p in presets.studies()],
                         prompt="ready study", id="ab-file", compact=True)
            yield Input(placeholder="vary: KEY=V1,V2 KEY=V1 ...", id="ab-vary", compact=True)
            yield Button("Decide a price", id="ab-price", variant="primary", compact=True,
                         tooltip="the vary field's knobs priced in seconds, each until it is "
                         "faster, slower or the same within ±5% (ab --decide; the palette's "
                         "Decide a price)")
        with Horizontal(classes="ab-bar"):
            yield Label("steps", classes="ab-label")
            yield Input(str(studies.DEFAULT_STEPS), id="ab-steps", type="integer", compact=True,
                        tooltip="optimizer steps of every run")
            yield Label("rounds", classes="ab-label")
            yield Input(str(studies.DEFAULT_REPEATS), id="ab-repeats", type="integer",
                        compact=True, tooltip="rounds (A/B) or seeds (sweep): each arm "
                        "trains this many times, interleaved, round r with seed + r; an "
                        "interval and a verdict need 6 or more (at 95%)")
            yield Label("sure %", classes="ab-label")
            yield Input(placeholder="off", id="ab-sure", compact=True, restrict=r"[0-9.]*",
                        tooltip="until sure: after the rounds, keep adding rounds "
                        "(interleaved) until every variant's samples/s interval is at most "
                        "this many percent wide (high / low - 1), at most "
                        f"{studies.DEFAULT_MAX_ROUNDS} rounds (the CLI's --until-sure); empty: "
                        "the rounds only")
            yield Button("Run study", id="ab-start", variant="success", compact=True)
            yield Button("Seed sweep", id="ab-sweep", compact=True,
                         tooltip="the form's config once per seed (as many as rounds)")
        with Horizontal(classes="ab-bar"):
            yield Select([], prompt="study", id="ab-study", compact=True)
            yield Button("Stop study", id="ab-stop", variant="warning", compact=True)
            yield Button("Export (ctrl+e)", id="ab-export", compact=True)
        with VerticalScroll(id="ab-body"):
            yield Static("The base is the form's config; each variant changes one key. "
                         "Decide a price: each variant's speed in seconds, until it is "
                         "decided. Run study: every arm trains once per round, the rounds "
                         "interleaved; each ratio gets a confidence interval and a verdict. "
                         "Seed sweep: the form's config once per seed.", id="ab-title")
            # The variant's column stays while Right and Left move the others one at a time.
            yield Table(id="ab-table", cursor_type="row", zebra_stripes=True, fixed_columns=1)
            yield Static("", id="ab-row")         # the row under the cursor, whole
            yield Static("", id="ab-method")      # how to read the table; where time went

    def set_spec(self, vary: list[str], steps: int | None, repeats: int | None = None) -> None:
        self.query_one("#ab-vary", Input).value = " ".join(vary)
        if steps:
            self.query_one("#ab-steps", Input).value = str(steps)
        if repeats:
            self.query_one("#ab-repeats", Input).value = str(repeats)

    # --- drawing ---------------------------------------------------------------------------
    def draw(self, tick: Tick) -> None:
        if tick.study is not None:      # a tick drawn before a just-started study is chosen
            self._shown_id = tick.study  # leaves Stop aimed at that study
        self.show_studies(tick.snap.studies, tick.study)
        self.show(tick.snap.study)
        self._follow(tick.snap.studies)

    def _follow(self, studies_now: tuple[dict[str, Any], ...]) -> None:
        """The whole runs started after a price (`begin_price`'s then) are shown once they
        train, while the price is still the one shown; said in a notice."""
        if self._then is None:
            return
        price, later = self._then
        status = {s["id"]: s["status"] for s in studies_now}
        if status.get(later, "created") == "created":
            return
        self._then = None
        if status[later] == "running" and self._shown_id == price:
            self._shown_id = later
            self.post_message(self.StudyChosen(later))
            self.notify(f"study {later} started: the whole runs after price {price}")

    def show_studies(self, studies: tuple[dict[str, Any], ...], shown_id: int | None) -> None:
        options = [(plain(f"{s['id']} {shown(s['name'], 40)} ({s['status']})", None), s["id"])
                   for s in studies]
        select = self.query_one("#ab-study", Select)
        if options != self._options:
            self._options = options
            with self.prevent(Select.Changed):
                select.set_options(options)
        if shown_id is not None and select.value != shown_id and \
                any(v == shown_id for _, v in options):
            with self.prevent(Select.Changed):     # (the study shown, whoever chose it)
                select.value = shown_id

    def show(self, study: dict[str, Any] | None) -> None:
        if study is None or study is self._study:
            return
        self._study = study
        if study.get("damaged"):
            self._show_damaged(study)
            return
        if study["kind"] == "price":
            self._show_price(study)
            return
        rows = study["rows"]
        # Above the table its title alone; under it the row under the cursor (_row_lines),
        # then how to read the table: at 80x24 the table is in view as the tab opens.
        self.query_one("#ab-title", Static).update(Text(
            study_text.title_text(study, rows)
            + (f". {shown(study['message'], 300)}" if study["message"] else "")))
        skipped = "".join(f"\n{r.label}: {r.note}" for r in rows
                          if r.note and r.status == "skipped")
        more = "".join(f"\n{line}" for line in study_text.phase_lines(rows)[:1]
                       + study_text.rerun_lines(study))
        self.query_one("#ab-method", Static).update(Text(
            study_text.method_text(study, rows)
            + (" Enter on a row pairs it with the base; Right and Left move one column."
               if len(rows) > 1 else "") + shown_lines(skipped) + shown_lines(more)))
        table = self.query_one("#ab-table", DataTable)
        cursor = table.cursor_row
        table.clear(columns=True)
        sweep = study["kind"] == "sweep"
        heads = study_text.headings(rows[0].rounds if rows else 1, sweep)
        cols = study_text.display_order(len(heads), rows[0].rounds if rows else 1, sweep)
        table.add_columns(*(heads[i] for i in cols))
        for r in rows:
            cells = study_text.row_cells(r, sweep, note_at="below")   # the notes under it
            table.add_row(*(plain(cells[i], 60) for i in cols), key=str(r.position))
        if cursor < table.row_count:
            table.move_cursor(row=cursor)
        self._row_lines(table.cursor_row)

    def _show_damaged(self, study: dict[str, Any]) -> None:
        """A study whose spec cannot be read (session data: edited, another tool's): said,
        with nothing else of it shown or trained."""
        self.query_one("#ab-title", Static).update(Text(
            f"Study {study['id']} {shown(study['name'], 40)} ({shown(study['status'], 20)}) "
            "cannot be "
            f"read (damaged: {shown(study['damaged'], 300)}); nothing of it is shown or "
            "trained"))
        self.query_one("#ab-table", DataTable).clear(columns=True)
        for part in ("#ab-row", "#ab-method"):
            self.query_one(part, Static).update("")

    def _show_price(self, study: dict[str, Any]) -> None:
        """A price in windows (tui_trainer/pricing.py): each variant's interval as it
        narrows look by look, and when it will stop."""
        from ... import pricing
        done = study["spec"].get("prices")
        done = done if isinstance(done, dict) else {}   # (session data: read, not trusted)
        looks = pricing.looks_kept(done, study["spec"].get("cap"))
        at = (f" ({', '.join(map(str, looks))} window pairs, the last its cap)"
              if looks else "")      # (an earlier version's price: its looks not kept)
        self.query_one("#ab-title", Static).update(Text(
            f"Price {study['id']} {shown(study['name'], 40)} ({study['status']}): each "
            "variant against the base, taking turns in short slices (two new processes a "
            "pair), "
            f"samples/s of the variant over the base; it stops at the first look that "
            f"decides{at}"
            + (f". {shown(study['message'], 300)}" if study["message"] else "")))
        table = self.query_one("#ab-table", DataTable)
        table.clear(columns=True)
        table.add_columns("variant", "pairs", "samples/s", "so far", "start-up")
        now = pricing.pricing_now(study["variants"], done, study["status"])
        for v in study["variants"][1:]:
            d = done.get(v["label"])
            d = d if isinstance(d, dict) else {}
            nxt = pricing.figure(d, "next_look")
            state = d.get("verdict") or (f"next look at {nxt:.0f}" if nxt else
                                         "not possible here" if d.get("skipped") else
                                         "" if d else
                                         f"first look at {looks[0]}" if v["label"] == now
                                         and looks else
                                         "measuring" if v["label"] == now else "waiting")
            startup = str(d.get("startup_text", "")).split(":", 1)[-1].split("(")[0]
            table.add_row(plain(v["label"], 40), plain(d.get("pairs", "-"), 6),
                          pricing.interval_text(d), plain(state, 40),
                          plain(startup.strip(), 40))
        self.query_one("#ab-row", Static).update(Text(shown_lines("\n".join(
            line for v in study["variants"][1:]
            for line in pricing.stored_lines(
                v["label"], done.get(v["label"]), str(study["status"]), v["label"] == now,
                looks[0] if looks else None)))))
        self.query_one("#ab-method", Static).update(Text(
            f"A pair: about {pricing.WINDOW_S} s of each arm in short slices taken in "
            "turns (ABBA ABBA ...: the machine's drift falls on both), each pair in two new "
            "processes. "
            "Faster or slower: the interval clear of 1 ± 3% at the look's level (calibrated "
            "to the looks: each wrong verdict at most 5% of the time over all of them); the "
            "same: within the margin. The price is the "
            "steady state; each arm's start-up is measured and shown beside it."))

    @on(DataTable.RowHighlighted, "#ab-table")
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self._row_lines(event.cursor_row)

    def _row_lines(self, index: int) -> None:
        """Under the table, what its short cells leave out of the row under the cursor: its
        whole verdict, bit-identity, note, phases against the base's."""
        if self._study and self._study["kind"] == "price":
            return                      # (its lines are all under its table)
        rows = self._study["rows"] if self._study else []
        text = ""
        if 0 <= index < len(rows) and self._study["kind"] != "sweep":
            text = "\n".join(study_text.row_lines(rows[index], rows[0]))
        elif rows and rows[0].decision is not None:        # a sweep that decides
            d = rows[0].decision
            text = d.words if d.decided else f"deciding: {d.words}"
        self.query_one("#ab-row", Static).update(Text(shown_lines(text)))

    # --- what the user asks ------------------------------------------------------------------
    @on(Select.Changed, "#ab-study")
    def _study_chosen(self, event: Select.Changed) -> None:
        event.stop()
        if isinstance(event.value, int):
            self._shown_id = event.value
            self.post_message(self.StudyChosen(event.value))

    @on(Select.Changed, "#ab-file")
    def _file_chosen(self, event: Select.Changed) -> None:
        """A ready study: its base config into the form, its variants into the fields."""
        event.stop()
        if not isinstance(event.value, str):
            return
        try:
            values, spec = studies.read_study_file(event.value)
            cfg = config.from_dict(values)
        except config.ConfigError as e:
            self.notify(f"study not loaded: {e}", severity="error")
            return
        self.app.query_one(LaunchPanel).set_config(cfg.to_dict())
        self.set_spec(spec.get("vary", []), spec.get("steps"), spec.get("repeats"))
        self.notify(f"study {Path(event.value).stem} loaded: base config in the form, "
                    f"{spec.get('about', 'its variants in the vary field')}")

    @on(Button.Pressed, "#ab-start, #ab-sweep")
    def _start(self, event: Button.Pressed) -> None:
        event.stop()
        self.begin(sweep=event.button.id == "ab-sweep")

    @on(Button.Pressed, "#ab-price")
    def _price(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_decide()

    def action_decide(self) -> None:
        """The palette's "Decide a price": the vary field's knobs priced in windows where
        each is paid in every step (tui_trainer/pricing.py: seconds), else a study of
        whole runs deciding when to stop (core.analysis.sequential); rounds left aside."""
        from ... import pricing
        try:
            vary = studies.parse_vary(self.query_one("#ab-vary", Input).value.split())
            form = self.app.query_one(LaunchPanel).form.config()
        except config.ConfigError as e:
            self.notify(f"price not started: {e}", severity="error")
            return
        # (where the form's machine check has not answered yet, cuDNN's benchmark is taken
        # as CUDA's start-up: whole runs)
        device = pricing.trains_on(form, vary, machines.known)
        windowed, whole, why = pricing.sort_out(form, vary, device)
        if vary and not why:
            self.begin_price(form, vary, device)
        elif windowed:      # those in windows first, then the others' whole runs (as `ab`)
            self.begin_price(form, windowed, device, then=(whole, why))
        else:
            self.begin(sweep=False, decide=sequential.DEFAULT_MARGIN, why=why)

    def begin_price(self, base: config.RunConfig, vary: list[tuple[str, list[Any]]],
                    device: str | None,
                    then: tuple[list[tuple[str, list[Any]]], list[str]] | None = None) -> None:
        """A price study of the form's config `base` (windows, the arms on a device of type
        `device`), started in the supervisor; `then`: knobs (and why) priced after it, in the
        same job, as a study of whole runs deciding when to stop."""
        from ... import pricing
        if not self.app.writable("price not started"):
            return
        try:
            arms = pricing.plan(base, vary, device)
            after = None if then is None else \
                self._plan(False, sequential.DEFAULT_MARGIN, then[0])
        except config.ConfigError as e:
            self.notify(f"price not started: {e}", severity="error")
            return
        name = "+".join(k for k, _ in vary)

        def create(store: Any, sup: Any) -> tuple[int, int | None]:
            user_data.name_in(*(a["config"] for a in arms))
            study_id = store.create_study("price", name, {
                "windows": True, "decide": sequential.DEFAULT_MARGIN, "cap": None,
                "vary": [[k, v] for k, v in vary], "steps": 0}, arms)
            later = None
            if after is not None:
                user_data.name_in(*(r["config"] for r in after[0].runs))
                later = store.create_study(after[0].kind, after[1], after[0].spec,
                                           after[0].runs)
            sup.study(study_id, then=() if later is None else (later,))
            return study_id, later

        def started(ids: tuple[int, int | None]) -> None:
            study_id, later = ids
            self._shown_id = study_id
            self._then = None if later is None else (study_id, later)
            self.post_message(self.StudyChosen(study_id))
            self.notify(f"price {study_id} started: {len(arms) - 1} variant(s) against the "
                        "base, two processes taking turns in short slices, until each "
                        "decides" + ("" if later is None else
                                     f"; then study {later}: "
                                     f"{', '.join(k for k, _ in then[0])} as whole runs "
                                     f"({'; '.join(then[1])})"))

        self.app.write(create, started, "price not started")

    def _plan(self, sweep: bool, decide: float | None,
              vary: list[tuple[str, list[Any]]] | None = None) -> tuple[Any, str, str, Any]:
        """A study of the form's config and these fields (their vary, or `vary`): (its
        plan, name, steps, the "sure" fraction). Raises ConfigError, naming the field."""
        chosen = self.query_one("#ab-file", Select).value
        file = chosen if isinstance(chosen, str) and not sweep else None
        steps = self.query_one("#ab-steps", Input).value.strip()
        repeats = self.query_one("#ab-repeats", Input).value.strip()
        base = self.app.query_one(LaunchPanel).form.config()
        if vary is None:
            vary = [] if sweep else studies.parse_vary(self.query_one("#ab-vary", Input).value
                                                       .split())
        for key, text in (("steps", steps), ("rounds", repeats)):
            if not text.isdigit() or int(text) < 1:
                raise config.ConfigError(key, f"must be a whole number >= 1, got {text!r}")
        sure = self._until_sure(sweep)
        name = "sweep" if sweep else \
            Path(file).stem if file else "+".join(k for k, _ in vary)
        planned = studies.prepare(base, vary, int(steps), repeats=int(repeats), name=name,
                                  file=file, until_sure=None if decide else sure,
                                  decide=None if sweep else decide,
                                  spread=decide if sweep else None)
        return planned, name, steps, sure

    def begin(self, sweep: bool, decide: float | None = None,
              why: list[str] | None = None) -> None:
        """Plans the study from the form's config and these fields, then starts it (the
        study's runs train one after the other, in the supervisor). `why`: why a price is
        decided over whole runs, not windows (said when it starts)."""
        if not self.app.writable("study not started"):
            return
        try:
            planned, name, steps, sure = self._plan(sweep, decide)
        except config.ConfigError as e:
            self.notify(f"study not started: {e}", severity="error")
            return

        def create(store: Any, sup: Any) -> int:
            # a folder of images in the form is named by this user (core/settings/user_data)
            user_data.name_in(*(r["config"] for r in planned.runs))
            study_id = store.create_study(planned.kind, name, planned.spec, planned.runs)
            sup.study(study_id)
            return study_id

        def started(study_id: int) -> None:
            self._shown_id = study_id        # Stop reaches it before the next tick draws it
            self.post_message(self.StudyChosen(study_id))
            what = "seed sweep" if sweep else "A/B study"
            self.notify(f"{what} {study_id} started: {len(planned.runs)} runs of {steps} "
                        "steps, one after the other"
                        + (f", then more rounds until every interval is at most {sure:.1%} "
                           f"wide (at most {planned.spec['max_rounds']} rounds)"
                           if sure and not decide else "")
                        + (", then more until each variant is faster, slower or the same "
                           f"within ±{decide:.0%} (looks at "
                           f"{', '.join(map(str, sequential.looks()))} rounds)"
                           if decide and not sweep else "")
                        + (", then more until the sd of their accuracy is under or over "
                           f"{decide * 100:.2f} points (looks at "
                           f"{', '.join(map(str, sequential.SEED_LOOKS))} seeds)"
                           if decide and sweep else "")
                        + (f" ({'; '.join(planned.notes)})" if planned.notes else "")
                        + (f"; whole runs: {'; '.join(why)}" if why else ""))

        self.app.write(create, started, "study not started")

    def _until_sure(self, sweep: bool) -> float | None:
        """The "sure %" field as prepare's fraction (5 -> 0.05); None when empty or for a
        seed sweep (nothing to be sure of)."""
        text = self.query_one("#ab-sure", Input).value.strip().rstrip("%")
        if not text or sweep:
            return None
        try:
            percent = float(text)
        except ValueError:
            percent = float("nan")
        if not 0.1 <= percent <= 1000:
            raise config.ConfigError("sure %", "must be the interval's width to reach in "
                                     f"percent, 0.1 to 1000 (e.g. 5), or empty, got {text!r}")
        return percent / 100

    @on(Button.Pressed, "#ab-stop")
    def _stop(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_stop_study()

    def action_run_study(self) -> None:
        self.begin(sweep=False)

    def action_seed_sweep(self) -> None:
        self.begin(sweep=True)

    def action_decide_seed_noise(self) -> None:
        self.begin(sweep=True, decide=sequential.DEFAULT_SPREAD)

    def action_stop_study(self) -> None:
        sid = self._shown_id
        if sid is None:
            self.notify("no study running", severity="warning")
            return
        self.app.write(lambda _, sup: sup.stop_study(sid), lambda ok: self.notify(
            f"stopping study {sid} (its current run writes a checkpoint)" if ok
            else "no study running", severity="information" if ok else "warning"))

    @on(events.DescendantFocus)
    def _results_focused(self, event: events.DescendantFocus) -> None:
        """Tab reaching the results' scroll area brings the table's header into view: on a
        small terminal a long title (its notes, the method) fills the area above it. The
        title stays a key away (up, page up), the table one Tab further."""
        if event.widget.id == "ab-body":
            self.query_one("#ab-body", VerticalScroll).scroll_to_widget(
                self.query_one("#ab-table"), animate=False, top=True)

    @on(Button.Pressed, "#ab-export")
    def _export(self, event: Button.Pressed) -> None:
        event.stop()
        self.app.action_session("export")

    @on(DataTable.RowSelected, "#ab-table")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a variant pairs it with the base, for the Divergence and Compare tabs."""
        event.stop()
        if self._study is None or event.row_key.value is None:
            return
        rows = self._study["rows"]
        row = rows[int(event.row_key.value)]
        if self._study["kind"] == "sweep":
            runs = [r for r in row.runs if r is not None]
            if len(runs) >= 2:
                self.post_message(self.SweepChosen(f"sweep {self._study['id']}", runs))
            return
        base = rows[0].run_id
        if base is None or row.run_id is None or row.run_id == base:
            return
        self.post_message(self.Paired(base, row.run_id, row.label))
