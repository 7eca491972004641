"""The Divergence tab: are the pair's runs bit-identical, and if not, from which step and why;
for a seed sweep's marked runs, how far the seeds spread step by step. Below the plots, where
the pair parts and why (`explain`: x starts it in the background, e shows what the answer
rests on); this panel owns both keys and the command."""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Static

from ...core.analysis.divergence import divergence, seed_spread, spread_text
from ...core.analysis.explain import evidence, for_pair, words
from ...core.analysis.plotdata import Line
from ...core.session.reader import RunRow
from ...core.analysis.verdicts import divergence_text, replica_text
from ...core.session.reader import Snapshot
from ...core.text import shown, shown_lines
from ..jobs import Job, TabJob
from ..screens import EvidenceScreen
from ..widgets.plots import MetricPlot
from .common import Tick, label, show_tab

HINT = ("Mark two runs (space in the run table) or repeat one (F5) to see how they diverge; "
        "F7 trains a twin and gives a determinism verdict, F8 a resume check.")


EXPLAIN_HINT = "x: explain where and why they part (replays both runs from their checkpoints)"


def twins_of(events: list[dict[str, Any]]) -> list[int]:
    """The twins a run's checks trained (its `check_twin` events, read as untrusted)."""
    return [c["data"]["twin"] for c in events if c.get("kind") == "check_twin"
            and isinstance(c.get("data"), dict) and isinstance(c["data"].get("twin"), int)]


class DivergencePanel(VerticalScroll):
    TAB, TITLE, PANEL_ID = "tab-divergence", "Divergence", "divergence-panel"
    EXPORTS = "compared"        # ctrl+e here: the runs compared
    FOLLOWS_CURSOR = True       # a tick at once when the cursor moves
    # The app's keys while this tab shows, from the run table too (ui/app.py binds them):
    # the pair explained, and what the explanation rests on; and the palette's entry.
    TAB_KEYS = [Binding("x", "explain", "Explain"),
                Binding("e", "evidence", "Evidence", show=False)]
    COMMANDS = [("Explain the pair", "Where the pair's runs part and why: the step, the input "
                 "or op, the setting (replays them)", "explain"),
                ("Explain's evidence", "What the explanation shown rests on, one fact a line",
                 "evidence")]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.explaining = TabJob(self)      # an explain this dashboard started (x)
        self._key: Any = None
        self._identical: bool | None = None
        self._explained_key: Any = None
        self.explained: dict[str, Any] | None = None     # the pair's explanation shown

    def compose(self) -> ComposeResult:
        yield Static(HINT, id="verdict")
        with Horizontal(classes="plot-row"):
            yield MetricPlot("|Δloss| per step", "|Δloss|", id="plot-dloss")
            yield MetricPlot("parameter distance", "L2", id="plot-pdist")
        yield Static("", id="explanation")

    def action_explain(self) -> None:
        """x: where the pair's runs part and why, by `tui-trainer explain` in the background
        (it replays them); the answer lands in the session and this tab shows it."""
        app = self.app
        if not app.writable("not explained"):
            return
        pair = app.selection.current_pair(app.runs)
        if pair is None:
            app.notify("mark two runs (space in the run table) to explain where they part",
                       severity="warning")
            return
        live = [r for r in pair if r in app.runs and app.training(app.runs[r])]
        if live:
            app.notify(f"run {live[0]} is training: explain the pair once it has stopped",
                       severity="warning")
            return
        job = self.explaining.job
        if job is not None and job.ended is None:
            app.notify(f"already explaining runs {job.runs[0]} and {job.runs[1]}",
                       severity="warning")
            return
        a, b = pair
        show_tab(self)
        self.explaining.start((a, b), lambda sup: sup.explain(a, b), "not explained")
        app.draw_tab()

    def settle(self, snap: Snapshot) -> None:
        """After each tick: an explain that ended is let go once its answer is in the
        session, or said to have failed (its log names why) when none came."""
        def failed(job: Job) -> None:
            a, b = job.runs
            self.app.notify(f"explaining runs {a} and {b} failed (exit status "
                            f"{job.job.poll()}); its output is in logs/explain-{a}-{b}.log",
                            severity="error", timeout=12)

        self.explaining.settle(
            lambda job: for_pair(snap.checks.get(job.runs[1], []), job.runs, since=job.wall),
            None, failed)

    def _explaining_now(self, tick: Tick) -> tuple[int, int, float] | None:
        """The pair being explained and for how long: one this panel started, or the F7/F8
        check whose verdict said NOT identical and which explains it now."""
        if (now := self.explaining.now()) is not None:
            (a, b), seconds = now
            return (a, b, seconds)
        if tick.checking is None:
            return None
        run_id, job = tick.checking
        if job.poll() is not None:
            return None
        checks = tick.snap.checks
        twins = twins_of(checks.get(run_id, []))
        if not twins:
            return None
        verdicts = [c for c in checks.get(twins[-1], [])
                    if c["kind"] == "repro_verdict" and isinstance(c.get("data"), dict)
                    and not c["data"].get("identical")
                    and isinstance(c.get("t"), (int, float))]
        if verdicts and for_pair(checks.get(twins[-1], []), (run_id, twins[-1])) is None:
            return (run_id, twins[-1], time.time() - verdicts[-1]["t"])
        return None

    def action_evidence(self) -> None:
        """e: what the explanation shown rests on."""
        if self.explained is None:
            self.notify("no explanation of this pair yet: x explains it", severity="warning")
            return
        a, b = self.explained["runs"]
        self.app.push_screen(EvidenceScreen(f"What the explanation of runs {shown(a, 12)} and "
                                            f"{shown(b, 12)} rests on",
                                            evidence(self.explained)))

    def show_explanation(self, pair: tuple[int, int] | None, checks: list[dict[str, Any]],
                         identical: bool | None, live: bool,
                         explaining: tuple[int, int, float] | None) -> None:
        """The section below the plots: the pair's newest explanation, the one under way, or
        how to ask for one (once the pair has parted and stopped training)."""
        result = for_pair(checks, pair) if pair else None
        busy = explaining is not None and pair is not None \
            and sorted(explaining[:2]) == sorted(pair)
        key = (pair, None if result is None else repr(result)[:2000],
               int(explaining[2]) if busy and explaining else None, identical, live)
        if key == self._explained_key:
            return
        self._explained_key = key
        self.explained = result
        section = self.query_one("#explanation", Static)
        if busy and explaining:
            text = Text.assemble(("Explaining: ", "bold"), (
                f"replaying runs {explaining[0]} and {explaining[1]} from their checkpoints "
                f"to the step, input and op where they part ({int(explaining[2])} s so far).",
                ""))
        elif result is not None:
            verdict = result.get("verdict")
            label = "Explained: " if verdict == "identical" else "Where they part: " \
                if verdict in ("initial", "input", "op", "untraced", "not_reproduced",
                               "model_code") else ""
            text = Text.assemble((label, "bold"), (shown_lines(words(result)), ""),
                                 ("  e: the evidence · x: explain again"
                                  if verdict != "refused" else "  x: try again",
                                  "dim"))
        elif identical is False and not live:
            text = Text(EXPLAIN_HINT)
        else:
            text = Text("")
        section.update(text)

    def draw(self, tick: Tick) -> None:
        """The marked seed sweep's spread, else the pair's verdict (with the replicas'
        drift of the pair and the run under the cursor, for data-parallel runs)."""
        sel, checks = tick.selection, tick.snap.checks
        sweep = sel.marked_sweep(tick.snap.studies)
        if sweep is not None:
            self.show_sweep(sweep[0], sweep[1], tick.runs, tick.snap.series)
            self.show_explanation(None, [], None, False, None)
            return
        pair = sel.current_pair(tick.runs)
        shown_runs = set(pair or ()) | ({sel.cursor} if sel.cursor else set())
        drifts = {r: c for r in sorted(shown_runs) for c in checks.get(r, [])
                  if c.get("kind") == "replicas_drift"}
        self.show(pair, tick.runs, tick.snap.series,
                  [c for r in (pair or ()) for c in checks.get(r, [])],
                  awaiting=tick.awaiting_twin is not None, drifts=drifts,
                  explaining=self._explaining_now(tick))

    def show_sweep(self, name: str, members: list[int], runs: dict[int, RunRow],
                   series: dict) -> None:
        """Seed noise instead of a pair: how far the sweep's runs spread, step by step."""
        got = [series[r] for r in members if r in series]
        key = ("sweep", name, tuple(members), tuple(s.version for s in got))
        if key == self._key:
            return
        self._key = key
        sp = seed_spread(got)
        names = ", ".join(label(r, runs) for r in members)
        self.query_one("#verdict", Static).update(Text(shown_lines(spread_text(sp, names))))
        self.query_one("#plot-dloss", MetricPlot).show(
            [Line("loss sd over seeds", sp.steps, sp.loss_sd, 0)], f"{name}: seed spread")
        self.query_one("#plot-pdist", MetricPlot).show(
            [Line("distance from centroid", sp.fp_steps, sp.param_spread, 1)],
            f"{name}: parameter spread")

    def show(self, pair: tuple[int, int] | None, runs: dict[int, RunRow], series: dict,
             checks: list[dict[str, Any]], awaiting: bool,
             drifts: dict[int, dict[str, Any]] | None = None,
             explaining: tuple[int, int, float] | None = None) -> None:
        verdict = self.query_one("#verdict", Static)
        drift = replica_text(drifts or {}, runs)
        if pair is None or pair[0] not in series or pair[1] not in series:
            self.show_explanation(None, [], None, False, None)
            key = ("hint", tuple(drift))
            if self._key != key:
                self._key = key
                verdict.update(Text.assemble(*((shown_lines(t), "bold" if bold else "")
                                               for t, bold in [*drift, (HINT, False)])))
            return
        a, b = series[pair[0]], series[pair[1]]
        training = awaiting or any(runs[r].live for r in pair if r in runs)
        key = (pair, a.version, b.version, len(checks), awaiting, tuple(drift),
               tuple(runs[r].status for r in pair if r in runs))
        if key != self._key:
            self._key = key
            self._show_pair(pair, runs, a, b, checks, training, drift)
        self.show_explanation(pair, checks, self._identical, training, explaining)

    def _show_pair(self, pair: tuple[int, int], runs: dict[int, RunRow], a: Any, b: Any,
                   checks: list[dict[str, Any]], training: bool,
                   drift: list[tuple[str, bool]]) -> None:
        """The pair's verdict in words and its two plots (only when something they show
        changed)."""
        verdict = self.query_one("#verdict", Static)
        d = divergence(a.steps, b.steps, a.fingerprints, b.fingerprints)
        self._identical = d.identical
        names = f"A = {label(pair[0], runs)}, B = {label(pair[1], runs)}"
        pieces = divergence_text(
            names, d, checks, pair, training,
            [{"config": runs[r].config, "settings": runs[r].settings} for r in pair
             if r in runs])
        # Assembled from plain pieces: nothing here is markup, so names, settings and
        # values from the session are always shown as text.
        if drift:
            pieces = [*pieces, ("\n", False), *drift]
        verdict.update(Text.assemble(*((shown_lines(t), "bold" if bold else "")
                                       for t, bold in pieces)))
        self.query_one("#plot-dloss", MetricPlot).show(
            [Line("|Δloss|", d.steps, d.loss_delta, 0)], names)
        self.query_one("#plot-pdist", MetricPlot).show(
            [Line("distance", d.fp_steps, [v for v in d.param_distance], 1)], names)
