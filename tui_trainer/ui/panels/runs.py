"""The run table: every run of the session, its status, progress and figures.

Keys (while the table has focus): space marks a run (marked runs are plotted together and
the last two form the pair), / filters, s sorts by the next column (S reverses), c shows the
config columns, a shows every column (a narrow table keeps the most important ones), h
hides the run (H shows hidden runs), r renames, n edits notes, t tags, delete deletes (asks
first), T puts the thread count a crowded run's note suggests into the form. The table asks
its own questions (dialogs) and hands the change to `app.write`, which runs it in a worker
thread; what the app must know (the cursor, a mark, a deleted run) it is told with messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable

from ...core.processes import contention
from ...core.analysis import figures
from ...core.columns import cut, fit
from ...core.session.reader import RunRow, shown_status
from ...core.text import name_problem
from ..screens import ConfirmScreen, NameScreen
from .common import Table, Tick, active_scroller, plain
from .launch import LaunchPanel
from .run_keys import RunKeys

BASE_COLUMNS = (("mark", " "), ("id", "id"), ("name", "name"), ("status", "status"),
                ("progress", "progress"), ("step", "step"), ("epoch", "epoch"),
                ("loss", "train loss"), ("eval", "eval loss"), ("acc", "acc"),
                ("sps", "samples/s"), ("mem", "peak MiB"), ("elapsed", "elapsed"),
                ("split", "step time (last log)"), ("tags", "tags"), ("reason", "note"))
# Config keys shown as columns with `c` (the knobs people compare most).
CONFIG_COLUMNS = ("seed", "batch_size", "lr", "loader", "deterministic", "amp", "num_threads",
                  "device")
SORTABLE = ("id", "name", "status", "step", "loss", "eval", "acc", "sps", "mem", "elapsed")
# What a narrow table keeps, most important first (core.columns.fit); "note" (why it ended,
# else not learning, else crowded, else busy machine) takes what is left, cut; `a` shows
# every column (←/→ scroll).
# (samples/s before the note: at 80 columns the note pushed it out, issue 68; the note's
# whole text is in the Log)
PRIORITY = ("mark", "id", "name", "status", "step", "loss", "acc", "sps", "reason", "tags",
            "eval", "elapsed", "mem", "progress", "split", "epoch")
BAR = 8


def progress_text(row: RunRow) -> str:
    if row.progress is None:
        return "-"
    filled = int(round(row.progress * BAR))
    bar = "█" * filled + "░" * (BAR - filled)
    eta = f" {figures.duration(row.eta_s)} left" if row.eta_s is not None and row.status == \
        "running" else ""
    return f"{bar} {row.progress:4.0%}{eta}"


def cells(row: RunRow, marked: bool, status: str) -> dict[str, Text]:
    """A run's cells, every one plain Text (a str cell would be parsed as markup)."""
    texts = {
        "mark": "●" if marked else "", "id": str(row.id), "name": row.name,
        "status": status, "progress": progress_text(row), "step": str(row.step),
        "epoch": f"{row.epoch:.2f}", "loss": figures.fmt(row.train_loss, "train_loss"),
        "eval": figures.fmt(row.eval_loss, "eval_loss"),
        "acc": figures.accuracy_text(row.accuracy),
        "sps": figures.fmt(row.samples_per_s, "samples_per_s"),
        "mem": figures.fmt(row.peak_memory_mib, "peak_memory_mib")
        + ("" if row.memory_kind in (None, "RSS") else f" {row.memory_kind}")
        + (f" ({figures.fmt(row.workers_mib, 'peak_memory_mib')} workers)"
           if row.workers_mib else ""),
        "elapsed": figures.duration(row.elapsed), "tags": " ".join(row.tags),
        "split": figures.split_text(dict(row.last_phase_ms or ())),
        "reason": row.reason or row.not_learning or row.crowded or row.loaded or "",
    }
    if row.not_learning and status in ("running", "finished", "stopped"):
        texts["status"] = f"{status}, not learning"
    out = {k: plain(v, 80 if k == "reason" else 40) for k, v in texts.items()}
    if status in ("crashed", "diverged", "stalled"):
        out["status"].stylize("bold red" if status == "crashed" else "bold yellow")
    elif row.not_learning:
        out["status"].stylize("bold yellow")
    return out


def sort_key(row: RunRow, column: str) -> Any:
    value = {"id": row.id, "name": row.name.lower(), "status": row.status, "step": row.step,
             "loss": row.train_loss, "eval": row.eval_loss, "acc": row.accuracy,
             "sps": row.samples_per_s, "mem": row.peak_memory_mib,
             "elapsed": row.elapsed}[column]
    if isinstance(value, float) and value != value:     # NaN sorts last, like none
        value = None
    return (value is None, value if value is not None else 0)


def matches(row: RunRow, text: str) -> bool:
    """The filter: every word must appear in the name, status, tags, notes or a config
    value (`key=value` words match that config key)."""
    hay = " ".join([row.name, row.status, shown_status(row.status, row.stalled_s),
                    "not learning" if row.not_learning else "",
                    "crowded" if row.crowded else "", "busy" if row.loaded else "",
                    " ".join(row.tags), row.notes, str(row.id)]).lower()
    for word in text.lower().split():
        if "=" in word:
            key, _, want = word.partition("=")
            if str(row.config.get(key, "")).lower() != want:
                return False
        elif word not in hay:
            return False
    return True


@dataclass
class View:
    filter: str = ""
    sort: str = "id"
    reverse: bool = False
    show_hidden: bool = False
    config_columns: bool = False
    all_columns: bool = False       # every column, scrolled sideways, instead of what fits


class RunTable(RunKeys, Table):
    """The runs of the session, one row each; its own keys (mark, filter, sort, columns,
    hide, rename, notes, tags, delete, fit threads) and F3-F8 on the run under the cursor
    (run_keys.py)."""

    BINDINGS = [
        Binding("space", "mark", "Mark", show=False),
        Binding("u", "clear_marks", "Clear marks and pair", show=False),
        Binding("slash", "filter", "Filter", show=False),
        Binding("s", "sort", "Sort", show=False),
        Binding("S", "sort_reverse", "Sort reversed", show=False),
        Binding("c", "config_columns", "Config columns", show=False),
        Binding("a", "all_columns", "All columns", show=False),
        Binding("h", "hide", "Hide", show=False),
        Binding("H", "show_hidden", "Show hidden", show=False),
        Binding("r", "ask('rename')", "Rename", show=False),
        Binding("n", "ask('notes')", "Notes", show=False),
        Binding("t", "ask('tags')", "Tags", show=False),
        Binding("delete", "ask('delete')", "Delete", show=False),
        Binding("T", "fit_threads", "Fit threads", show=False),
    ]

    class CursorMoved(Message):
        def __init__(self, run_id: int) -> None:
            self.run_id = run_id
            super().__init__()

    class MarkToggled(Message):
        def __init__(self, run_id: int) -> None:
            self.run_id = run_id
            super().__init__()

    class Deleted(Message):
        """A run is gone from the session: it leaves the selection."""
        def __init__(self, run_id: int) -> None:
            self.run_id = run_id
            super().__init__()

    class ViewChanged(Message):
        def __init__(self, view: View) -> None:
            self.view = view
            super().__init__()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.view = View()
        self._rows: tuple[RunRow, ...] = ()
        self._marked: tuple[int, ...] = ()
        self._starting: frozenset[int] = frozenset()
        self._continuing: frozenset[int] = frozenset()
        self._shown_key: Any = None
        self._columns_key: Any = None
        self._reason_width: int | None = None
        self.init_run_keys()

    # --- drawing ---------------------------------------------------------------------------
    def draw(self, tick: Tick) -> None:
        self.show(tick.snap.runs, list(tick.selection.marked), tick.selection.cursor,
                  tick.starting, self.continuing_now())

    def show(self, rows: tuple[RunRow, ...], marked: list[int], cursor: int | None,
             starting: frozenset[int] = frozenset(),
             continuing: frozenset[int] = frozenset()) -> None:
        """Draws the rows (only the cells that changed)."""
        key = (rows, tuple(marked), starting, continuing, self.view.filter, self.view.sort,
               self.view.reverse, self.view.show_hidden, self.view.config_columns,
               self.view.all_columns, self.size.width)
        if key == self._shown_key:
            self._follow(cursor)
            return
        self._shown_key = key
        self._rows, self._marked, self._starting = rows, tuple(marked), starting
        self._continuing = continuing
        visible = [r for r in rows if (self.view.show_hidden or not r.hidden or r.id in marked)
                   and matches(r, self.view.filter)]
        visible.sort(key=lambda r: sort_key(r, self.view.sort), reverse=self.view.reverse)
        every = {r.id: self._all_cells(r) for r in visible}
        self._ensure_columns(self._fit(every))
        order = [str(r.id) for r in visible]
        current = [str(k.value) for k in self.rows]
        columns = [str(c.value) for c in self.columns]
        if order != current:
            # Rows appear, go or move: rebuild (keeps the cursor on its run).
            self.clear()
            for r in visible:
                self.add_row(*self._pick(every[r.id], columns), key=str(r.id))
        else:
            for r in visible:
                new = self._pick(every[r.id], columns)
                for col, value in zip(columns, new, strict=True):
                    if self.get_cell(str(r.id), col) != value:
                        # Widths are measured again only when a value outgrows its column
                        # (a width pass costs a layout of the whole screen).
                        wider = value.cell_len > self.columns[col].content_width
                        self.update_cell(str(r.id), col, value, update_width=wider)
        self._follow(cursor)

    def _all_cells(self, r: RunRow) -> dict[str, Text]:
        status = "starting" if r.status == "created" and r.id in self._starting else \
            "continuing" if r.id in self._continuing else shown_status(r.status, r.stalled_s)
        if r.hidden:
            status += " (hidden)"
        c = cells(r, r.id in self._marked, status)
        for key in CONFIG_COLUMNS:
            c[f"cfg:{key}"] = plain(r.config.get(key, "-"), 20)
        return c

    def _pick(self, c: dict[str, Text], columns: list[str]) -> list[Text]:
        out = [c[k] for k in columns]
        if "reason" in columns and self._reason_width is not None:
            i = columns.index("reason")
            if out[i].cell_len > self._reason_width:
                out[i] = plain(cut(out[i].plain, self._reason_width), None)
        return out

    def _fit(self, every: dict[int, dict[str, Text]]) -> list[tuple[str, str]]:
        """The columns that fit the table's width, by importance (the config columns, when
        asked for with `c`, right after the status); all of them with `a`."""
        want = list(BASE_COLUMNS) + ([(f"cfg:{k}", k) for k in CONFIG_COLUMNS]
                                     if self.view.config_columns else [])
        self._reason_width = None
        width = self.size.width - 1         # the vertical scrollbar's cell
        if self.view.all_columns or width <= 1:
            return want
        # tags and the note take no room while no run has one
        want = [(k, h) for k, h in want if k not in ("tags", "reason") or not every
                or any(c[k].plain for c in every.values())]
        keys = [k for k, _ in want]
        priority = list(PRIORITY)
        if self.view.config_columns:
            at = priority.index("status") + 1
            priority[at:at] = [f"cfg:{k}" for k in CONFIG_COLUMNS]
        widths = [max([len(heading) + 2] + [c[k].cell_len for c in every.values()])
                  for k, heading in want]
        fitted = fit(widths, [keys.index(k) for k in priority if k in keys], width, gap=2,
                     stretch=keys.index("reason") if "reason" in keys else None,
                     min_stretch=16)
        if fitted.stretch_width is not None:
            self._reason_width = fitted.stretch_width
        return [want[i] for i in fitted.shown]

    def on_resize(self) -> None:
        if self._rows:      # columns chosen again for the new width
            self.show(self._rows, list(self._marked), self.current(), self._starting,
                  self._continuing)

    def _ensure_columns(self, want: list[tuple[str, str]]) -> None:
        key = tuple(k for k, _ in want)
        if key == self._columns_key:
            return
        self._columns_key = key
        self.clear(columns=True)
        for k, heading in want:
            arrow = (" ▼" if self.view.reverse else " ▲") if k == self.view.sort else ""
            self.add_column(heading + arrow, key=k)

    def _follow(self, cursor: int | None) -> None:
        if cursor is not None and str(cursor) in self.rows:
            index = self.get_row_index(str(cursor))
            if self.cursor_row != index:
                self.move_cursor(row=index)

    def current(self) -> int | None:
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key((self.cursor_row, 0)).row_key.value
        return int(key) if key is not None else None

    # --- keys --------------------------------------------------------------------------------
    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key is not None and event.row_key.value is not None:
            self.post_message(self.CursorMoved(int(event.row_key.value)))

    # Where the table cannot use a key (all its runs in view; Down on the last one), the
    # tab shown scrolls (issue 68: at 80x24 the Plots tab did not, from where the focus
    # starts). Up, Down, PageUp and PageDown: Table's rule, with this pane.
    def _pane(self) -> Any:
        return None if self.max_scroll_y > 0 else active_scroller(self.app)

    def action_scroll_end(self) -> None:
        pane = self._pane()
        pane.scroll_end(animate=False) if pane else super().action_scroll_end()

    def action_scroll_home(self) -> None:
        pane = self._pane()
        pane.scroll_home(animate=False) if pane else super().action_scroll_home()

    def action_mark(self) -> None:
        rid = self.current()
        if rid is not None:
            self.post_message(self.MarkToggled(rid))

    def action_filter(self) -> None:
        def filtered(text: str | None) -> None:
            if text is not None:
                self.set_filter("" if text.strip() == "*" else text)

        self.app.push_screen(NameScreen("Show runs matching (words in names, tags, notes, "
                                        "status; key=value for config; * for all):",
                                        self.view.filter), filtered)

    def action_fit_threads(self) -> None:
        """T: on a run whose threads outnumbered the free cores, the thread count its note
        suggests goes into the form (for speed over bits: another thread count can change
        the bits on the CPU); nothing else changes, and nothing starts."""
        rid = self.current()
        run = next((r for r in self._rows if r.id == rid), None)
        if run is None:
            return
        threads = contention.suggested_threads(run.crowded)
        if threads is None:
            self.notify(f"run {run.id}: its threads did not outnumber the free cores "
                        "(nothing to fit)")
            return
        self.app.query_one(LaunchPanel).form.set_value("num_threads", threads)
        self.app.notify(f"num_threads = {threads} in the form, as run {run.id}'s note "
                        "suggests: F2 starts a run with it. Faster beside what else runs, but "
                        "another thread count can change the bits on the CPU: compare it with "
                        "runs of the same count")

    # --- changes to a run: a dialog, then the write in a worker (app.write) ------------------
    def _run(self, what: str) -> RunRow | None:
        rid = self.current()
        run = next((r for r in self._rows if r.id == rid), None)
        if run is None or not self.app.writable(f"not changed ({what})"):
            return None
        return run

    def _write(self, fn: Any, then: Any = None, failed: str = "") -> None:
        self.app.write(fn, then, failed, reread=True)

    def action_hide(self) -> None:
        if (run := self._run("hide")) is not None:
            self._write(lambda s, _: s.set_labels(run.id, hidden=not run.hidden))
            self.notify(f"run {run.id} {'shown again' if run.hidden else 'hidden'} (H shows "
                        "hidden runs)")

    def action_ask(self, what: str) -> None:
        run = self._run(what)
        if run is None:
            return
        rid = run.id
        if what == "rename":
            def renamed(name: str | None) -> None:
                problem = name and name_problem(name)
                if problem:
                    self.notify(f"not renamed: the name {problem}", severity="error")
                elif name:
                    self._write(lambda s, _: s.rename_run(rid, name), failed="not renamed")
            self.app.push_screen(NameScreen(f"Rename run {rid} to:", run.name), renamed)
        elif what == "notes":
            def noted(text: str | None) -> None:
                problem = text and name_problem(text)
                if problem:
                    self.notify(f"notes not saved: they {problem}", severity="error")
                elif text is not None:
                    self._write(lambda s, _: s.set_labels(rid, notes=text))
            self.app.push_screen(NameScreen(f"Notes on run {rid}:", run.notes), noted)
        elif what == "tags":
            def tagged(text: str | None) -> None:
                if text is not None:
                    tags = [t for t in text.replace(",", " ").split() if not name_problem(t)]
                    self._write(lambda s, _: s.set_labels(rid, tags=tags))
            self.app.push_screen(NameScreen(f"Tags of run {rid} (words):",
                                            " ".join(run.tags)), tagged)
        elif what == "delete":
            def gone(_: Any) -> None:
                self.post_message(self.Deleted(rid))
                self.notify(f"run {rid} deleted")

            def deleted(yes: bool | None) -> None:
                if yes:
                    self._write(lambda s, _: s.delete_run(rid), gone, f"run {rid} not deleted")

            self.app.push_screen(ConfirmScreen(
                f"Delete run {rid} ({run.name})? Its rows, checkpoints and log are removed; "
                "this cannot be undone.", "Delete"), deleted)

    def set_filter(self, text: str) -> None:
        self.view.filter = text
        self._changed()

    def action_sort(self) -> None:
        i = SORTABLE.index(self.view.sort) if self.view.sort in SORTABLE else -1
        self.view.sort, self.view.reverse = SORTABLE[(i + 1) % len(SORTABLE)], False
        self._changed()

    def action_sort_reverse(self) -> None:
        self.view.reverse = not self.view.reverse
        self._changed()

    def action_config_columns(self) -> None:
        self.view.config_columns = not self.view.config_columns
        self._changed()

    def action_all_columns(self) -> None:
        self.view.all_columns = not self.view.all_columns
        self._changed()

    def action_show_hidden(self) -> None:
        self.view.show_hidden = not self.view.show_hidden
        self._changed()

    def _changed(self) -> None:
        self._columns_key = None          # headings carry the sort arrow
        self.post_message(self.ViewChanged(self.view))
        self._shown_key = None
        self.show(self._rows, list(self._marked), self.current(), self._starting,
                  self._continuing)
