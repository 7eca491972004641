"""The words of an explanation (engine/probes/explain.py finds where two runs part and why; this
says it, the same way in the command's output, the Divergence tab and exports)."""

from __future__ import annotations

import time
from typing import Any

from ..settings import user_models
from ..text import shown
from . import prices
from ..errors import BadInput
from ..session.store import SessionStore

# Config keys that change which samples a step sees, or how they are augmented.
DATA_ORDER_KEYS = ("seed", "seed_workers", "num_workers", "persistent_workers", "augment",
                   "loader", "batch_size", "train_samples", "nproc", "nnodes")

# What decides how many batches an epoch has, so where a replay is going into a step.
EPOCH_KEYS = ("drop_last", "batch_size", "train_samples", "grad_accum_steps", "nproc",
              "nnodes", "dataset")

RNG_NAMES = {"torch": "torch's CPU generator", "cuda": "the CUDA generators",
             "numpy": "numpy's global generator", "python": "Python's random",
             "loader": "the DataLoader's shuffle generator"}


# Runs that differ in these are not two configurations of one training.
COMPARED_KEYS = ("model", "dataset", "train_samples", "eval_samples")

# The event an explanation is kept as, on run B: the dashboard's Divergence tab and the
# exports show the newest one of a pair (its data is the whole answer).
EVENT = "explanation"


def record(store: SessionStore, result: dict[str, Any]) -> None:
    """Keeps an answer (or a refusal) in the session, on run B."""
    a, b = result["runs"]
    store.add_event(b, EVENT, explanation_text(result), step=result.get("step"),
                    data=result)


def refused(a: int, b: int, reason: str) -> dict[str, Any]:
    """The answer when runs cannot be explained (not comparable, no checkpoint to replay
    from): the reason, kept like an answer so that the dashboard can say it."""
    return {"runs": [a, b], "verdict": "refused", "reason": reason}


def for_pair(events: list[dict[str, Any]], pair: tuple[int, int] | list[int],
             since: float | None = None) -> dict[str, Any] | None:
    """The newest explanation of this pair (either way round) among runs' events (kept at
    or after the time `since`, when given)."""
    def ours(e: dict[str, Any]) -> bool:
        data = e.get("data")
        return (e.get("kind") == EVENT and isinstance(data, dict)
                and isinstance(data.get("runs"), list) and len(data["runs"]) == 2
                and sorted(map(str, data["runs"])) == sorted(map(str, pair))
                and (since is None or (isinstance(e.get("t"), (int, float))
                                       and e["t"] >= since)))
    mine = [e for e in events if ours(e)]
    return mine[-1]["data"] if mine else None


# What a kept explanation that is not one of this tool's answers (a damaged or foreign
# session) raises when it is put in words: said as damaged instead.
UNREADABLE = (KeyError, TypeError, ValueError, AttributeError, IndexError)


def words(result: dict[str, Any]) -> str:
    """explanation_text, for an answer read back from a session (untrusted)."""
    try:
        return explanation_text(result)
    except UNREADABLE as e:
        return (f"the explanation kept for runs {result.get('runs')} cannot be read "
                f"(damaged: {type(e).__name__} {e}); x explains the pair again")


def evidence(result: dict[str, Any]) -> list[str]:
    """evidence_lines, for an answer read back from a session (untrusted)."""
    try:
        return evidence_lines(result)
    except UNREADABLE as e:
        return [f"the explanation kept cannot be read (damaged: {type(e).__name__} {e})"]


def locate(store: SessionStore, a_id: int, b_id: int) -> dict[str, Any]:
    """What the recorded fingerprints say of runs A and B: identical, parted at step 0, or
    "replay" between the last agreeing and the first differing fingerprint (engine.probes.explain
    goes on from there). Refuses runs that are not comparable."""
    t0 = time.perf_counter()
    ra, rb = store.run(a_id), store.run(b_id)
    ca, cb = ra["config"] or {}, rb["config"] or {}
    apart = [k for k in COMPARED_KEYS if ca.get(k) != cb.get(k)]
    if apart:
        raise BadInput(f"runs {a_id} and {b_id} are not comparable: they differ in "
                       + ", ".join(f"{k} ({ca.get(k)} vs {cb.get(k)})" for k in apart))
    fa, fb = (dict((f["step"], f["sha256"]) for f in store.fingerprints(r))
              for r in (a_id, b_id))
    common = sorted(set(fa) & set(fb))
    if not common:
        raise BadInput(f"runs {a_id} and {b_id} have no fingerprint at a common step yet")
    out: dict[str, Any] = {"runs": [a_id, b_id], "compared": len(common),
                           "settings": settings_differ(ra, rb),
                           "machines": prices.apart([ra["settings"], rb["settings"]])}
    differ = [s for s in common if fa[s] != fb[s]]
    if not differ:
        out.update(verdict="identical", up_to=common[-1], cost_s=time.perf_counter() - t0)
        return out
    first = differ[0]
    code = user_models.code_differs([ra, rb], user_models.sources(store.events, [a_id, b_id]))
    if code is not None:
        # nets of the user's own file whose recorded code differs: that is the cause, and
        # no replay could build both (each is built only from the code it trained with)
        out.update(verdict="model_code", model_code=code, first_different=first,
                   cost_s=time.perf_counter() - t0)
        return out
    last = max((s for s in common if s < first), default=None)
    out.update(first_different=first, last_identical=last, verdict="replay",
               recorded=[fa[first], fb[first]])      # what each replay must reproduce
    if first == 0:
        out.update(verdict="initial", step=0,
                   unseeded=[x for x, c in zip("AB", (ca, cb)) if c.get("seed") is None])
    out["cost_s"] = time.perf_counter() - t0
    return out


def settings_differ(ra: dict[str, Any], rb: dict[str, Any]) -> list[dict[str, Any]]:
    """Every config key and effective setting in which the two runs differ."""
    out = []
    for source, key in (("config", "config"), ("effective", "settings")):
        x, y = ra[key] or {}, rb[key] or {}
        for k in sorted(set(x) | set(y)):
            if x.get(k) != y.get(k):
                out.append({"key": k, "a": x.get(k), "b": y.get(k), "of": source})
    return out


def _n(x: float) -> str:
    return f"{x:.3g}"


def _config_changes(result: dict[str, Any], keys: tuple[str, ...] | None = None) -> str:
    changes = [s for s in result.get("settings", ()) if s["of"] == "config"
               and (keys is None or s["key"] in keys)]
    return ", ".join(f"{s['key']} {s['a']} vs {s['b']}" for s in changes)


def _op_text(op: dict[str, Any]) -> str:
    where = op["module"].split(".", 1)[1] if "." in op["module"] else op["module"]
    place = f"in the {op['phase']} of `{where}`" if where else f"in the {op['phase']}"
    called = f", called from {op['source']}" if op.get("source") else ""
    if op.get("other"):
        other = op["other"]
        return (f"{place}: A runs {op['name']} ({', '.join(op['dtypes'])}) where B runs "
                f"{other['name']} ({', '.join(other['dtypes'])}){called}")
    d = op.get("difference") or {}
    outputs = len(op["outputs"])
    text = (f"{place} ({op['name']}"
            + (f", output {op['output'] + 1} of {outputs}" if outputs > 1 else "")
            + f", {', '.join(op['dtypes'])} on {op['device']}{called})")
    if "elements" in d:
        same = ("same inputs" if op.get("same_strides", True) else
                "same input values in another memory layout")
        text += (f": {same if op.get('inputs_agree') else 'different inputs'}, "
                 f"{d['elements']:,} of {d['of']:,} elements differ")
        if "max_abs" in d:
            text += f" (at most {_n(d['max_abs'])}" + (
                f", {d['max_ulps']:,} ULPs)" if "max_ulps" in d else ")")
    return text


def _why_text(why: dict[str, Any] | None) -> str:
    if not why:
        return ""
    if why["kind"] == "nondeterministic":
        which = [x for x, ok in zip("AB", why["self_consistent"]) if not ok]
        return (f" Run twice on the same inputs, {' and '.join(which)}'s own results differ: "
                "the op is nondeterministic on this device.")
    if why["kind"] == "nondeterministic_between":
        return (" Both runs have the same settings and the op the same inputs, yet its "
                "results differ: nondeterministic on this machine (run again twice on those "
                "inputs, each agreed with itself: it shows only now and then).")
    if why["kind"] == "setting":
        follows = "; ".join(f"{f['key']} ({f['a']} vs {f['b']})" for f in why["follows"])
        return (" Each configuration is deterministic on its own; the difference follows "
                f"{follows}.")
    return (" Each configuration is deterministic on its own, and no single setting "
            "switched reproduces B's result.")


def _sums_text(sums: dict[str, Any] | None) -> str:
    """What splitting the step over the ranks does to the sums (engine.probes.explain.sums)."""
    if not sums:
        return ""
    n, world = sums["samples"], sums["world"]
    parts = "/".join(map(str, sorted(set(sums["per_rank"]))))
    head = (f" And on {sums['run']}'s own {n} samples and weights at that step (dropout off), "
            f"one backward over all {n} and the average of {world} backwards over {parts} "
            "each, as DDP's all-reduce makes it,")
    if not sums["elements"]:
        return head + " give the same gradients."
    d = sums.get("difference") or {}
    return (head + f" give other sums: {sums['elements']:,} of {sums['of']:,} gradient "
            f"elements differ, first in `{sums['first']}`"
            + (f" (at most {_n(d['max_abs'])}" + (f", {d['max_ulps']:,} ULPs)" if "max_ulps"
                                                  in d else ")") if "max_abs" in d else "")
            + ".")


def _input_text(step: int, item: dict[str, Any], result: dict[str, Any]) -> str:
    kind = item["item"]
    if kind == "batch":
        samples = item.get("samples", [])
        if item.get("same_samples_reordered"):
            how = "the same samples in another order"
        elif item.get("same_labels"):
            how = (f"{len(samples)} of {item.get('of', '?')} samples hold other pixels under the "
                   "same labels (other augmentation draws, or other images of the same digits)")
        else:
            def digits(labels: list[int]) -> str:
                return " ".join(map(str, labels)) + (" ..." if len(samples) > len(labels) else "")
            how = (f"{len(samples)} of {item.get('of', '?')} samples differ (digits "
                   f"{digits(item.get('labels_a', []))} in A, "
                   f"{digits(item.get('labels_b', []))} in B)")
        cause = _config_changes(result, DATA_ORDER_KEYS)
        worlds = result.get("worlds") or [1, 1]
        if worlds[0] != worlds[1]:
            how += "; " + " and ".join(
                f"{x}'s {w} processes each take a shard (DistributedSampler) of it"
                for x, w in zip("AB", worlds) if w > 1)
        return (f"the batch of step {step} differs: {how}"
                + (f" in micro-batch {item['micro_batch'] + 1}" if item.get("micro_batches", 1)
                   > 1 and "micro_batch" in item else "")
                + (f"; what the batch holds follows {cause}" if cause else "") + ".")
    if kind == "partition":
        def split(sizes: list[int]) -> str:
            return f"one batch of {sizes[0]}" if len(sizes) == 1 else \
                f"{len(sizes)} micro-batches of {'/'.join(map(str, sorted(set(sizes))))} " \
                "whose gradients are added (gradient accumulation)"
        cause = _config_changes(result, ("batch_size", "grad_accum_steps"))
        return (f"both steps consume the same {item['samples']} samples in the same order, "
                f"computed otherwise: A as {split(item['a'])}, B as {split(item['b'])}; the "
                "sums of the loss and the gradients are then taken in another grouping and "
                "order, which rounds otherwise in floating point"
                + (f" (this follows {cause})" if cause else "") + ".")
    if kind == "rng":
        source = item["name"].split(".")[0]
        return (f"the random state going into step {step} differs: "
                f"{RNG_NAMES.get(source, source)} ({item['name']}).")
    if kind == "position":
        a, b = item["a"], item["b"]
        cause = _config_changes(result, EPOCH_KEYS)
        return (f"the two replays are at different places going into step {step}: A at "
                f"epoch {a['epoch']} batch {a['batch_in_epoch']}, B at epoch {b['epoch']} "
                f"batch {b['batch_in_epoch']}"
                + (f"; an epoch's length follows {cause}" if cause else "") + ".")
    names = {"params": "the parameters", "buffers": "the buffers",
             "optimizer": "the optimizer state"}
    return f"{names.get(kind, kind)} going into step {step} differ (first: {item['name']})."


def _starts(replay: dict[str, Any]) -> str:
    """Where the two replays started: checkpoints, or a run's seeded config."""
    steps = replay["from_checkpoints"]
    fresh = replay.get("from_config") or [False, False]
    if not any(fresh):
        return (f"their checkpoints at step {steps[0]}" if steps[0] == steps[1] else
                f"the checkpoints at steps {steps[0]} (A) and {steps[1]} (B)")
    if all(fresh):
        return "their seeded configs (no checkpoint kept that early)"
    return " and ".join(f"{x}'s seeded config (no checkpoint kept that early)" if f else
                        f"{x}'s checkpoint at step {n}" for x, n, f in zip("AB", steps, fresh))


def _value(v: Any) -> str:
    return ("on" if v else "off") if isinstance(v, bool) else str(v)


def _price_text(p: dict[str, Any]) -> str:
    """`; study 3 measured it at 0.88x the samples/s (0.85-0.91, slower)`."""
    span = (f" ({p['low']:.2f}-{p['high']:.2f}" + (f", {p['verdict']})" if p.get("verdict")
                                                    else ")")
            if p.get("low") is not None and p.get("high") is not None else "")
    return (f"; study {p['study']} measured it at {p['ratio']:.2f}x the samples/s{span} over "
            f"{p['rounds']} round{'s' if p['rounds'] != 1 else ''}")


def _fix_text(hunt: dict[str, Any]) -> str:
    """What each setting that can make an op deterministic did to it, run again alone."""
    f = hunt.get("fixes") or {}
    tries = f.get("tries", 0)
    prices = {(p["key"], p["value"]): p for p in hunt.get("price") or []}
    said = []
    for t in f.get("tried", []):
        setting = f"{t['key']}={_value(t['value'])}"
        if t["result"] == "raises":
            said.append(f"{setting} refuses it ({t['error']})")
        elif t["result"] == "agrees":
            p = prices.get((t["key"], t["value"]))
            said.append(f"{setting} makes it agree ({tries} runs on its recorded inputs gave "
                        "one result" + (_price_text(p) if p else "; no A/B study of this "
                                        "config has priced it yet") + ")")
        elif t["result"] == "differs":
            said.append(f"{setting} leaves it differing")
        else:
            said.append(f"{setting} cannot be told alone")
    alone = (f" Run alone on its recorded inputs it differs too ({tries} runs)."
             if f.get("alone_differs") else
             f" Run alone on its recorded inputs it gave one result in {tries} runs: it "
             "differs only inside the step (its timing, or what ran beside it).")
    if said:
        return alone + " " + "; ".join(said)[:1].upper() + "; ".join(said)[1:] + "."
    fixed = {"deterministic": "deterministic=on", "cudnn_benchmark": "cudnn_benchmark=off",
             "cudnn_deterministic": "cudnn_deterministic=on"}
    already = " and ".join(fixed.get(k, k) for k in f.get("already") or [])
    return alone + (f" This run has {already} already, and no setting of this tool reaches "
                    "it: the op itself is nondeterministic (its own code, or a kernel those "
                    "settings do not cover)." if already else "")


def _elsewhere_text(hunt: dict[str, Any]) -> str:
    """Where a run's bits came from when this machine replays it deterministically."""
    diff = hunt.get("elsewhere") or []
    if diff:
        return ("the difference came from elsewhere: the run was recorded with "
                + ", ".join(f"{d['key']} {d['recorded']}" for d in diff) + " (here: "
                + ", ".join(f"{d['key']} {d['here']}" for d in diff) + ").")
    return ("the difference came from elsewhere: its recorded settings show this machine "
            "and these libraries (device, versions, threads), so it lies in something neither "
            "its checkpoint nor its settings hold.")


def _hunt_start(hunt: dict[str, Any]) -> str:
    return (f"{hunt['side']}'s seeded config" if hunt.get("from_config") else
            f"{hunt['side']}'s checkpoint at step {hunt['from_checkpoint']}")


def explanation_text(result: dict[str, Any]) -> str:
    """One paragraph: where the runs part and why, then the evidence and its cost."""
    a, b = result["runs"]
    apart = result.get("machines")
    head = f"Runs {a} (A) and {b} (B)" + (
        f" ({shown(apart, 300)}; a replay here reproduces this machine's run only)"
        if isinstance(apart, str) else "")
    cost = f" Cost: {result['cost_s']:.1f} s." if "cost_s" in result else ""
    verdict = result["verdict"]
    if verdict == "refused":
        return f"{head}: not explained: {result['reason']}"
    if verdict == "identical":
        return (f"{head}: no divergence: bit-identical at all {result['compared']} common "
                f"fingerprints (up to step {result['up_to']}); nothing replayed.")
    if verdict == "model_code":
        return (f"{head} part by step {result['first_different']}: "
                f"{result['model_code']}; not replayed (each run is built only from the "
                "code it trained with)." + cost)
    if verdict == "initial":
        changes = _config_changes(result, ("seed", "model", "init")) or _config_changes(result)
        unseeded = result.get("unseeded") or []
        if unseeded and not changes:
            changes = (f"seed none: {' and '.join(unseeded)} drew "
                       f"{'their' if len(unseeded) > 1 else 'its'} own")
        return (f"{head} part at step 0: their initial parameters differ"
                + (f" ({changes})" if changes else "") + "; no replay needed." + cost)
    last, first = result.get("last_identical"), result.get("first_different")
    between = (f"identical at step {last}, different at step {first}" if last is not None
               else f"different at step {first}")
    replay = result.get("replay") or {}
    evidence = (f" Replayed from {_starts(replay)}, which reproduced the recorded hashes at "
                f"step {first}." if replay.get("from_checkpoints") else "")
    hunt = result.get("hunt") or {}
    if verdict == "nondeterministic":
        n = hunt["replays"]
        asked = (f"{head}: parameter hashes {between}. Replaying {hunt['side']} did not "
                 f"reproduce its own recorded hash, so this machine was asked: {n} replays "
                 f"from {_hunt_start(hunt)} part at step {hunt['step']}")
        if hunt.get("op") and not hunt["op"].get("inputs_agree", True):
            # what differs comes into the step from outside the traced ops
            return (asked + f", {_op_text(hunt['op'])}: its inputs already differ from one "
                    "replay of the same state to the next, so what differs comes from outside "
                    "the step's ops (the data loading, or a draw from a generator the "
                    "checkpoint does not hold) on this machine." + cost)
        if hunt.get("op"):
            op = hunt["op"]
            return (asked + f", {_op_text(op)}: nondeterministic on this machine "
                    f"({op['differing_replays']} of the other {n - 1} replays differ from "
                    "the first)." + _fix_text(hunt) + cost)
        paths = hunt.get("paths") or {}
        ops = [p["name"] if p else "nothing more" for p in (paths.get("first"),
                                                             paths.get("other"))]
        return (asked + f": from one state, one replay runs {ops[0]} where another runs "
                f"{ops[1]}: the step takes another path from one run to the next on this "
                "machine." + cost)
    if verdict == "not_reproduced":
        who = " and ".join(x for x, ok in zip("AB", replay.get("reproduced", ())) if not ok)
        if hunt.get("agree"):
            steps, short = hunt.get("steps", 0), hunt.get("short_of", 0)
            told = (f"{hunt['replays']} replays from {_hunt_start(hunt)} agree with each "
                    f"other at every op of {'the first ' if short else ''}{steps} "
                    f"step{'s' if steps != 1 else ''}" + (
                        f" (the search stops there, {short} steps short of the differing "
                        "fingerprint; a smaller fingerprint_every narrows it): so far this "
                        "machine computes them deterministically; if the rest agrees too, "
                        if short else
                        ": this machine computes them deterministically, so ")
                    + _elsewhere_text(hunt))
            missing = (" (" + "; ".join(result["missing"]) + ")") if result.get("missing") \
                else ""
            return (f"{head}: parameter hashes {between}, but replaying {who} did not "
                    f"reproduce its recorded hash at step {first}{missing}. {told}" + cost)
        if result.get("missing"):
            return (f"{head}: parameter hashes {between}, and the step cannot be pinned down: "
                    + "; ".join(result["missing"]) + f"; replayed from its config instead, "
                    f"{who} did not reproduce its recorded hash at step {first}." + cost)
        return (f"{head}: parameter hashes {between}, but replaying {who} from its checkpoint "
                f"did not reproduce its recorded hash at step {first}: its bits depend on "
                "something its checkpoint does not hold (another machine, thread count or "
                "library), so the step cannot be pinned down here." + cost)
    step = result["step"]
    gap = (first - last) if last is not None else first
    hint = (f" The fingerprints were {gap} steps apart; a smaller fingerprint_every shortens "
            "the replay." if gap > 100 else "")
    sums = _sums_text(result.get("sums"))
    if verdict == "input":
        return f"{head} part at step {step}: " + _input_text(step, result["input"], result) \
            + sums + evidence + hint + cost
    if verdict == "op":
        op = result["op"]
        # other ops on the same inputs: the code path differs, and what the configs differ in
        # chose it (amp, optimizer_impl, ...)
        paths = _config_changes(result) if op.get("other") and not op.get("why") else ""
        path = f" The two configs differ in {paths}." if paths else ""
        return (f"{head} part at step {step}, {_op_text(op)}." + _why_text(op.get("why"))
                + path + sums + evidence + hint + cost)
    if verdict == "untraced":
        return (f"{head} part at step {step}; everything going into it agrees, and the ops of "
                "a data-parallel step are not traced one by one." + sums + evidence + cost)
    return (f"{head} part at step {step}, yet everything going into it and every op of it "
            "agree: the difference comes from outside the traced step." + evidence + cost)


def _short(h: Any) -> str:
    return str(h)[:12] if h else "-"


def _cut(value: Any, most: int = 16) -> str:
    """A list shown with its first `most` items."""
    if isinstance(value, list) and len(value) > most:
        return "[" + ", ".join(map(str, value[:most])) + f", ... {len(value)} in all]"
    return str(value)


def evidence_lines(result: dict[str, Any]) -> list[str]:
    """What the answer rests on, one fact a line: the fingerprints, the replay, what went
    into the step, the op and each test of why, the settings in which the runs differ."""
    out: list[str] = []
    v = result["verdict"]
    if "compared" in result:
        out.append(f"fingerprints compared: {result['compared']}")
    if result.get("first_different") is not None:
        last = result.get("last_identical")
        rec = result.get("recorded") or ["", ""]
        out.append(f"parameter hashes: identical at step {last}, different at step "
                   f"{result['first_different']} (A {_short(rec[0])}, B {_short(rec[1])})"
                   if last is not None else
                   f"parameter hashes different at step {result['first_different']} "
                   f"(A {_short(rec[0])}, B {_short(rec[1])})")
    replay = result.get("replay")
    if replay:
        for x, start, fresh, steps, ok in zip(
                "AB", replay["from_checkpoints"], replay.get("from_config", [False] * 2),
                replay["steps"], replay["reproduced"]):
            out.append(f"replay {x}: from "
                       + ("its seeded config (no checkpoint kept that early)" if fresh else
                          f"its checkpoint at step {start}") + f", {steps} steps, "
                       + ("reproduced its recorded hash" if ok else
                          "did NOT reproduce its recorded hash"))
    hunt = result.get("hunt")
    if hunt and hunt.get("traced", True):
        out.append(f"replays of {hunt['side']} from one state on this machine: "
                   f"{hunt['replays']}, from " + ("its seeded config" if hunt.get("from_config")
                                                  else f"its checkpoint at step "
                                                  f"{hunt['from_checkpoint']}")
                   + f", {hunt.get('steps', 0)} step{'' if hunt.get('steps') == 1 else 's'}"
                   " traced, "
                   + ("every op the same in all" if hunt.get("agree") else
                      f"parting at step {hunt.get('step')}")
                   + f" ({hunt.get('seconds', 0):.1f} s)")
        hop = hunt.get("op")
        if hop:
            out.append(f"nondeterministic op #{hop['index']} of the step: {hop['name']}, "
                       f"{hop['phase']}, module {hop['module'] or '-'}, parameters "
                       f"{', '.join(hop['params']) or '-'}")
            if hop.get("source"):
                out.append(f"called from: {hop['source']}")
            out.append(f"inputs: {'identical' if hop.get('inputs_agree') else 'different'} "
                       f"across the replays; outputs {', '.join(map(_short, hop['outputs']))} "
                       f"vs {', '.join(map(_short, hop.get('other_outputs', [])))}")
            out.append("difference: " + ", ".join(f"{k} {val}" for k, val in
                                                   (hop.get("difference") or {}).items()))
            fx = hunt.get("fixes") or {}
            out.append(f"run alone {fx.get('tries', 0)} times on its recorded inputs: "
                       + ("DIFFERENT results" if fx.get("alone_differs") else "one result"))
            if fx.get("already"):
                out.append("set for determinism already: " + ", ".join(fx["already"]))
            for t in fx.get("tried", []):
                out.append(f"with {t['key']}={_value(t['value'])}: {t['result']}"
                           + (f" ({t['error']})" if t.get("error") else ""))
            for p in hunt.get("price") or []:
                out.append(f"price of {p['key']}={_value(p['value'])}" + _price_text(p)
                           .replace("; study", ": study", 1))
        for d in hunt.get("elsewhere") or []:
            out.append(f"recorded {d['key']}: {d['recorded']}; here: {d['here']}")
    if result.get("step") is not None and v not in ("initial", "refused"):
        out.append(f"first step whose result differs: {result['step']}")
    item = result.get("input")
    if item:
        facts = ", ".join(f"{k} {_cut(item[k])}" for k in item if k != "item")
        out.append(f"first differing input: {item['item']}" + (f" ({facts})" if facts else ""))
    op = result.get("op")
    if op:
        out.append(f"op #{op['index']} of the step: {op['name']}, {op['phase']}, module "
                   f"{op['module'] or '-'}, parameters {', '.join(op['params']) or '-'}")
        if op.get("source"):
            out.append(f"called from: {op['source']}")
        out.append(f"inputs: {'identical' if op.get('inputs_agree') else 'different'}"
                   + ("" if op.get("same_strides", True) else " in value, strides differ")
                   + f"; outputs A {', '.join(map(_short, op['outputs']))}, B "
                   + ", ".join(map(_short, op.get("b_outputs", []))))
        other = op.get("other")
        if other:
            out.append(f"B's op there: {other['name']} ({', '.join(other['dtypes'])}), "
                       f"module {other['module'] or '-'}")
        if op.get("difference"):
            out.append("difference: " + ", ".join(f"{k} {val}" for k, val in
                                                   op["difference"].items()))
        why = op.get("why")
        if why:
            out.append("run again twice on the recorded inputs: " + ", ".join(
                f"{x} {'the same both times' if ok else 'DIFFERENT'}"
                for x, ok in zip("AB", why["self_consistent"])))
            for f in why.get("follows", []):
                out.append(f"switched {f['key']} {f['a']} -> {f['b']} alone: A's op gives B's "
                           "result")
    sums = result.get("sums")
    if sums:
        out.append(f"sums on {sums['run']}'s samples, dropout off: one backward over "
                   f"{sums['samples']} vs {sums['world']} over {_cut(sums['per_rank'])} "
                   f"averaged: {sums['elements']:,} of {sums['of']:,} gradient elements "
                   f"differ, in {_cut(sums['params']) if sums['params'] else 'none'}")
    if result.get("gradients_differ"):
        out.append("gradients that differ after the step: "
                   + ", ".join(result["gradients_differ"]))
    for s in result.get("settings", []):
        out.append(f"{'config' if s['of'] == 'config' else 'effective setting'} {s['key']}: "
                   f"A {s['a']}, B {s['b']}")
    if "cost_s" in result:
        out.append(f"cost: {result['cost_s']:.2f} s")
    return out
