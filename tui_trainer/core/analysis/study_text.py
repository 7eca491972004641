"""How a study is written: its table's headings, cells and verdicts, the row under the
cursor, its title and method, phase ratios, crowded and loaded rounds, what was trained
again. The same words in the CLI, the dashboard's A/B tab and the exports; the study's
plan and its figures are core/analysis/study.py's.

Core layer: imports neither torch nor textual.
"""

from __future__ import annotations

from typing import Any

from ..columns import cut, fit
from ..text import shown
from . import figures, sequential, stats
from .study import DEFAULT_REPEATS, FIGURES, Row


def rerun_lines(study: dict[str, Any]) -> list[str]:
    """What was trained again and why, and what ended an --until-sure study."""
    spec = study["spec"]
    out = []
    for r in spec.get("reruns", []):
        if isinstance(r, dict) and isinstance(r.get("round"), int):
            runs = ", ".join(str(x) for x in r.get("replaced", []) if isinstance(x, int))
            out.append(f"round {r['round'] + 1} trained again: it "
                       f"{shown(str(r.get('why')), 200)}"
                       + (f" (runs {runs} kept in the session, out of the table)" if runs
                          else ""))
    if isinstance(spec.get("ended_by"), str):
        how = "--decide" if spec.get("decide") is not None else "--until-sure"
        out.append(f"{how} ended: {shown(spec['ended_by'], 400)}")
    return out


def crowded_text(r: Row) -> str:
    """`; its threads outnumbered the free cores in 3 of 6 rounds` (nothing when never)."""
    if not r.crowded_rounds:
        return ""
    of = f" in {len(r.crowded_rounds)} of {r.rounds} rounds" if r.rounds > 1 else ""
    return f"; its threads outnumbered the free cores{of}"


def phase_text(row: Row, base: Row, least_share: float = 0.03) -> str:
    """Where a variant's time went against the base's, phase by phase, each a ratio of
    times, said as such: "forward 0.71x the time [0.66-0.77] (faster), backward 0.80x the
    time [...]" (the word where the interval is all on one side of 1; phases under
    `least_share` of both steps left out)."""
    if not row.phase_ratios or not row.phase_ms or not base.phase_ms:
        return ""
    total_a, total_b = sum(base.phase_ms.values()), sum(row.phase_ms.values())
    parts = []
    for k in figures.PHASES:
        if base.phase_ms[k] < least_share * total_a and row.phase_ms[k] < least_share * total_b:
            continue
        r = row.phase_ratios.get(k)
        if isinstance(r, stats.Interval):
            word = r.verdict("slower", "faster", "") if r.low is not None else ""
            parts.append(f"{k} {r.ratio:.2f}x the time"
                         + (f" [{r.low:.2f}-{r.high:.2f}]" if r.low is not None else "")
                         + (f" ({word})" if word else ""))
        elif r is not None:
            parts.append(f"{k} {r:.2f}x the time")
    return ", ".join(parts)


def phase_lines(rows: list[Row]) -> list[str]:
    """Where the time went: the base's milliseconds per step by phase, then each variant's
    phases as ratios to the base's (none when the runs recorded no phases)."""
    base = rows[0] if rows else None
    if base is None or not base.phase_ms:
        return []
    out = ["Where the time went (ms per step; " + figures.WINDOW + "): base "
           + ", ".join(f"{k} {v:.2f}" for k, v in base.phase_ms.items()) + "."]
    for r in rows[1:]:
        text = phase_text(r, base)
        if text:
            out.append(f"{r.label}: {text}")
    return out


def headings(repeats: int = 1, sweep: bool = False) -> tuple[str, ...]:
    shown = tuple(h for _, h, _ in FIGURES)
    if sweep:
        return ("config", "seeds") + shown
    if repeats == 1:
        return ("variant", "run") + shown + ("bit-identical to base",)
    return ("variant", "runs") + shown + ("verdict", "bit-identical to base")


HEADINGS = headings(1)


def verdict_text(r: Row) -> str:
    """The verdicts of a variant in words: speed and accuracy always, the other figures
    where they are not within noise."""
    if not r.position:
        return "(base)"
    level = next((iv.level for iv in (r.intervals or {}).values() if iv is not None),
                 stats.DEFAULT_LEVEL)
    if not r.verdicts:
        return f"not yet: needs {stats.min_pairs(level)} finished rounds" \
            + load_text(r) + crowded_text(r) if r.rounds > 1 else ""
    few = [iv.n for iv in (r.intervals or {}).values() if iv is not None and iv.low is None]
    if few:
        return stats.no_interval(min(few), level) + " (per-round ratios shown)" + load_text(r) \
            + crowded_text(r)
    return ", ".join(_verdict_words(r)) + load_text(r) + crowded_text(r)


def short_verdict(r: Row) -> str:
    """The verdict cell of a table, a few words wide: the speed's ratio, interval and verdict
    ("1.75x [1.52-2.01] faster"), or "no verdict: 3 of 6 rounds" (finished rounds of those
    an interval needs), and "(+N below)" where verdict_text says N more things (the line
    under the table)."""
    if not r.position:
        return "(base)"
    level = next((iv.level for iv in (r.intervals or {}).values() if iv is not None),
                 stats.DEFAULT_LEVEL)
    speed = (r.intervals or {}).get("samples_per_s")
    if speed is None or speed.low is None or speed.high is None:
        text = f"no verdict: {speed.n if speed else r.compared_rounds} of " \
            f"{stats.min_pairs(level)} rounds"
        more = bool(load_text(r)) + bool(crowded_text(r))
    else:
        text = f"{speed.text()} {(r.verdicts or {}).get('samples_per_s', '')}".rstrip()
        more = len(_verdict_words(r)) - 1 + bool(load_text(r)) + bool(crowded_text(r))
    return text + (f" (+{more} below)" if more else "")


def _verdict_words(r: Row) -> list[str]:
    """The verdicts in words: speed and accuracy always, the others where not within
    noise."""
    words = []
    for key in ("samples_per_s", "accuracy"):
        if key in (r.verdicts or {}):
            v = r.verdicts[key]
            words.append(v if key == "samples_per_s" or not v.startswith("within")
                         else f"accuracy {v}")
    for key in ("data_wait_s", "peak_memory_mib", "train_loss", "eval_loss"):
        v = (r.verdicts or {}).get(key)
        if v and not v.startswith("within"):
            words.append(v)
    return words


def row_lines(r: Row, base: Row | None) -> list[str]:
    """What a table's short cells leave out of one arm, for the lines under the table: its
    whole verdict, its bit-identity, its note, where its time went against the base's, and
    whether its threads were crowded."""
    if not r.position:
        return [f"{r.label}: the config every variant is measured against"
                + (f" ({r.status})" if r.status != "finished" else "")
                + ("; its figures are the mean ±sd over its rounds" if r.rounds > 1 else "")]
    out = []
    if r.rounds > 1:
        out.append(f"{r.label}: {verdict_text(r)}")
    out.append(f"{r.label}, bit-identical to base: {identity_text(r)}")
    if r.note and r.status != "skipped":
        out.append(f"{r.label}: {shown(r.note)}")
    if base is not None:
        text = phase_text(r, base)
        if text:
            out.append(f"{r.label}, time per step against the base's: {text}")
    out += crowded_lines([r])
    return out


def load_text(r: Row) -> str:
    """`; measured under load: 3 of 6 rounds shared the CPU` (nothing when none did)."""
    if not r.loaded_rounds:
        return ""
    return (f"; measured under load: {len(r.loaded_rounds)} of {r.compared_rounds} rounds "
            "shared the CPU")


def figure_cell(r: Row, key: str) -> str:
    """A figure with its ratio to the base; in rounds also the ratio's interval (a
    variant) or the spread between rounds (the base: mean ± sd)."""
    value = getattr(r, key)
    cell = figures.fmt(value, key)
    if value is None:
        return cell
    if key == "peak_memory_mib" and r.workers_mib:      # its DataLoader workers' part
        cell += f" (workers {figures.fmt(r.workers_mib, key)})"
    if r.rounds > 1 and not r.position:
        sd = (r.spread or {}).get(key)
        return cell + (f" ±{figures.fmt(sd, key)}" if sd is not None else "")
    interval = (r.intervals or {}).get(key)
    if interval is not None:
        return f"{cell} ({interval.text()})"
    ratio = (r.ratios or {}).get(key)
    if ratio is not None and r.position:
        cell += f" ({ratio:.2f}x)"
    return cell


def row_cells(r: Row, sweep: bool = False, note_at: str | None = None) -> list[str]:
    """A row as text cells under headings(rounds, sweep). With `note_at` ("above", "below")
    a variant's note is shown there, whole, and its cell points to it."""
    if r.rounds == 1:
        run = "-" if r.run_id is None else str(r.run_id)
    else:
        run = f"{r.done}/{r.rounds}"
    cells = [r.label, run] + [figure_cell(r, key) for key, _, _ in FIGURES]
    if sweep:
        return cells
    if r.rounds > 1:
        cells.append(short_verdict(r))
    identity = identity_text(r)
    if r.note and note_at:
        identity = f"not run (see {note_at})" if r.status == "skipped" else \
            f"{identity[:24]}… (see {note_at})"
    cells.append(identity)
    return cells


# The figures from the most to the least asked for: what a narrow table keeps.
FIGURE_PRIORITY = ("samples_per_s", "accuracy", "eval_loss", "train_loss", "peak_memory_mib",
                   "data_wait_s")


def display_order(n: int, rounds: int, sweep: bool = False) -> list[int]:
    """Indices into headings(rounds, sweep) in the order a table shows them, which is also
    the order of importance: the name, the verdict and bit-identity (never scrolled out of
    sight), the figures (speed and accuracy first), the runs column last."""
    keys = [k for k, _, _ in FIGURES]
    shown = [2 + keys.index(k) for k in FIGURE_PRIORITY]
    if sweep:                   # the seeds column is short: it stays beside the config
        return [0, 1, *shown]
    # the study's own figure (samples/s, FIGURE_PRIORITY's first) right after the verdict:
    # bit-identity, free text cut to what is left, comes after it (issue 68: at 80 columns
    # the CLI kept "runs 3/3" and dropped samples/s)
    if rounds == 1:
        return [0, shown[0], n - 1, *shown[1:], 1]
    return [0, n - 2, shown[0], n - 1, *shown[1:], 1]


def format_table(rows: list[Row], sweep: bool = False, width: int | None = None) -> list[str]:
    """The table as aligned text lines, its columns in display order. With `width`, only
    the columns that fit it, by importance, and a last line naming those left out."""
    rounds = rows[0].rounds if rows else 1
    heads = headings(rounds, sweep)
    order = display_order(len(heads), rounds, sweep)
    cells = [row_cells(r, sweep, note_at="below") for r in rows]   # notes under the table
    lines = [[heads[i] for i in order]] + [[c[i] for i in order] for c in cells]
    widths = [max(len(line[i]) for line in lines) for i in range(len(order))]
    identity = None if sweep else order.index(len(heads) - 1)   # free text: cut to fit
    fitted = fit(widths, range(len(order)), width, stretch=identity)
    if fitted.stretch_width is not None:
        widths[identity] = fitted.stretch_width
        for line in lines:
            line[identity] = cut(line[identity], fitted.stretch_width)
    figures = {j for j, i in enumerate(order) if 2 <= i < 2 + len(FIGURES)}
    out = ["  ".join(line[j].rjust(widths[j]) if j in figures else line[j].ljust(widths[j])
                     for j in fitted.shown).rstrip()
           for line in lines]
    out += [f"{r.label}: {verdict_text(r)}" for r in rows       # the short cells' reasons
            if r.position and r.rounds > 1 and not sweep]
    out += [f"{r.label}: {shown(r.note)}" for r in rows if r.note and not sweep]
    out += crowded_lines(rows)
    if fitted.left_out:
        out.append(f"({len(fitted.left_out)} column(s) left out to fit {width} columns: "
                   f"{', '.join(lines[0][j] for j in fitted.left_out)}; --json or "
                   "`export --study` has them all)")
    return out


def crowded_lines(rows: list[Row]) -> list[str]:
    """Under a table: each arm whose runs' threads outnumbered the free cores, what its
    first such run said (the same note as the run table's)."""
    return [f"{r.label}: {crowded_text(r)[2:]}: {shown(r.crowded, 300)}" for r in rows
            if r.crowded]


def identity_text(r: Row) -> str:
    if r.status == "skipped":
        return f"not run: {r.note}"
    if r.run_id is None:
        return r.status
    if r.status not in ("finished",):
        prefix = f"{r.status}, "
    else:
        prefix = ""
    if r.position == 0:
        return prefix + "(base)"
    if prefix and r.bit_identical is None:
        return prefix + "not known (it did not finish)"
    what = figures.Identity(r.bit_identical, [], r.first_difference, None).text()
    return prefix + (what if r.rounds == 1 else f"{what} (in every round)"
                     if r.bit_identical else what)


def title_text(study: dict[str, Any], rows: list[Row], status: str | None = None) -> str:
    """`A/B study 3 (name): 200 steps each, 5 rounds, finished, 8 of 10 runs done`."""
    spec = study["spec"]
    what = "Seed sweep" if study["kind"] == "sweep" else "A/B study"
    rounds = spec.get("repeats", 1)
    done = sum(r.done if r.status != "skipped" else r.rounds for r in rows)
    text = (f"{what} {study['id']} ({shown(study['name'])}): {spec['steps']} steps each, "
            + (f"{rounds} {'seeds' if study['kind'] == 'sweep' else 'rounds'}, "
               if rounds > 1 else "")
            + f"{status or study['status']}, {done} of {rounds * len(rows)} runs done")
    jobs = spec.get("jobs", 1)
    if jobs > 1:
        text += (f"; trained {jobs} at a time, each run with a share of the cores (num_threads "
                 "= 0 becomes cores / jobs, recorded in its settings): samples/s are shares "
                 "of the machine and the bits differ from a run trained alone; compare "
                 "within this study")
    gpus = spec.get("gpus")
    if isinstance(gpus, int) and gpus > 1:
        text += (f"; its runs on CUDA trained side by side, one per GPU ({gpus} GPUs), "
                 "never two on one")
    elif gpus == 1:
        text += "; its runs on CUDA trained one at a time (one GPU: never two on it)"
    return text


def method_text(study: dict[str, Any], rows: list[Row]) -> str:
    """How to read a table of rounds, in one paragraph."""
    level = study["spec"].get("level", stats.DEFAULT_LEVEL)
    if study["kind"] == "sweep" and rows:
        text = (f"{rows[0].rounds} seeds (seed, seed+1, ...): each figure is the mean ±sd "
                "over the seeds.")
        margin = study["spec"].get("decide")
        if margin is None:
            return text
        seen = sequential.looks(study["spec"].get("max_rounds"), sequential.SEED_LOOKS)
        return text + (
            f" It decides: at {', '.join(map(str, seen))} seeds it looks at the sd of the "
            f"seeds' accuracy with its chi-square interval at "
            f"{sequential.spread_level(seen):.1%} "
            f"(corrected for the {len(seen)} looks): under {margin * 100:.2f} points when "
            f"the interval lies at or below that, over when it lies above, unknown when "
            f"neither holds at {seen[-1]} seeds; each wrong answer at most 5% of the time "
            "over all its looks where the seeds' accuracies are normal (docs/benchmarks.md).")
    if not rows or rows[0].rounds == 1:
        return "(N.NNx) = ratio to the base, from one run each: within noise of each other " \
            "unless far from 1 (use --repeats for an interval)."
    rounds = rows[0].rounds
    common = f"{rounds} rounds, the arms interleaved; round r trains seed + r in every arm. "
    margin = study["spec"].get("decide")
    if margin is not None:
        cap = study["spec"].get("max_rounds") or sequential.LOOKS[-1]
        seen = sequential.looks(cap)
        differ, alike = sequential.levels(seen)
        return common + (
            f"It decides: at {', '.join(map(str, seen))} rounds it looks at each variant's "
            "samples/s ratio (Hodges-Lehmann, signed-rank interval) at a level corrected for "
            f"the {len(seen)} looks: faster or slower when the {differ:.1%} "
            f"interval is clear of 1, the same when the {alike:.1%} interval "
            f"lies within ±{margin:.0%}, unknown when neither holds at {cap} rounds; each "
            "kind of wrong verdict at most 5% of the time over all its looks "
            "(docs/benchmarks.md). The other figures' intervals are at 95%, uncorrected. "
            "The base shows mean ±sd over its rounds.")
    if rounds < stats.min_pairs(level):
        return common + (f"A variant's (N.NNx; rounds a b ...) is the median ratio of its "
                         f"rounds to the base's (Hodges-Lehmann), then each round's ratio: a "
                         f"{level:.0%} interval, and so a verdict, needs "
                         f"{stats.min_pairs(level)} rounds or more without assuming normal "
                         f"noise ({DEFAULT_REPEATS}, the default, find a 15% difference on "
                         "this kind of machine). The base shows mean ±sd over its rounds.")
    return common + (f"A variant's (N.NNx [lo-hi]) is the median ratio of its rounds to the "
                     f"base's (Hodges-Lehmann) with a {level:.0%} signed-rank interval, which "
                     "holds on heavy-tailed noise (a round slowed by another process); a "
                     "verdict needs the whole interval above or below 1. The base shows mean "
                     "±sd over its rounds (seed noise for accuracy and loss).")
