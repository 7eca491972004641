"""What this machine is, presets that fit it, and prices remembered per machine (issue 65):
machine facts from faked /proc/cpuinfo files of each CPU kind the project meets, the shipped
presets resolved on each, real runs and a real A/B study whose prices are kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import QUICK, sets, tt
from tui_trainer.core.analysis import prices
from tui_trainer.core.session.store import SessionStore
from tui_trainer.core.settings import config, fit, hardware, machine

PRESETS = Path(__file__).parent.parent / "experiments"


def cpuinfo(tmp_path: Path, model: str, flags: str, cores: int = 2, threads: int = 2) -> Path:
    """A /proc/cpuinfo of `threads` logical processors on `cores` cores."""
    blocks = [f"processor\t: {i}\nvendor_id\t: X\nmodel name\t: {model}\nphysical id\t: 0\n"
              f"core id\t\t: {i % cores}\nflags\t\t: {flags}\n" for i in range(threads)]
    p = tmp_path / f"cpuinfo-{abs(hash((model, flags, cores, threads)))}"
    p.write_text("\n".join(blocks))
    return p


BASE = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c"
AVX2 = f"{BASE} avx2 fma"
AVX512 = f"{AVX2} avx512f avx512dq avx512cd avx512bw avx512vl"
KINDS = {   # the CPUs this project has met (docs/benchmarks.md), as Linux lists their flags
    "epyc-avx2": ("AMD EPYC 7B12 64-Core Processor", AVX2),
    "epyc-bf16": ("AMD EPYC", f"{AVX512} avx512_bf16 avx512_vnni"),
    "xeon-amx": ("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
                 f"{AVX512} avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8"),
}


def kind(tmp_path: Path, name: str, **kw) -> hardware.Cpu:
    model, flags = KINDS[name]
    return hardware.cpu(cpuinfo(tmp_path, model, flags), env={}, **kw)


def test_a_cpu_is_read_from_cpuinfo_with_its_cores_instruction_set_and_formats(tmp_path):
    avx2, bf16, amx = (kind(tmp_path, k) for k in KINDS)
    assert (avx2.capability, avx2.bf16, avx2.fp16, avx2.amx) == ("AVX2", False, False, False)
    assert (bf16.capability, bf16.bf16, bf16.fp16, bf16.amx) == ("AVX512", True, False, False)
    assert (amx.capability, amx.bf16, amx.fp16, amx.amx) == ("AVX512", True, True, True)
    assert avx2.model == "AMD EPYC 7B12 64-Core Processor" and avx2.cores == "2 cores"
    assert "bf16 emulated (no bf16 hardware)" in avx2.describe()
    assert "bf16 in hardware (AVX512-BF16, AMX-BF16)" in amx.describe() and \
        "fp16 in hardware (AVX512-FP16)" in amx.describe()
    # each is another machine for a price, though two of them are both "AMD EPYC"s
    assert len({avx2.key, bf16.key, amx.key}) == 3
    smt = hardware.cpu(cpuinfo(tmp_path, "X", AVX2, cores=4, threads=8), env={})
    assert (smt.physical_cores, smt.logical_cores, smt.cores) == (4, 8, "4 cores, 8 threads")
    # ATen's switch lowers what torch dispatches to, and bf16 is then emulated however the
    # flags read; torch's own answer, where it is loaded, is taken as it is
    lowered = hardware.cpu(cpuinfo(tmp_path, *KINDS["epyc-bf16"]),
                           env={hardware.CAPABILITY_ENV: "avx2"})
    assert (lowered.capability, lowered.bf16) == ("AVX2", False)
    assert "no bf16 hardware under AVX2" in lowered.describe()
    assert kind(tmp_path, "xeon-amx", capability="AVX2").bf16 is False
    # a record read back is untrusted: what is not a processor is None, not a crash
    assert hardware.Cpu.from_dict(amx.to_dict()) == amx
    assert hardware.Cpu.from_dict({"model": 3}) is None and \
        hardware.Cpu.from_dict("x") is None
    assert hardware.cpu(tmp_path / "missing", env={}).logical_cores >= 1


def test_machine_names_this_cpu_in_text_and_json_as_torch_sees_it():
    r = tt("machine", "--json")
    assert r.rc == 0, r.err
    facts = json.loads(r.out)
    cpu = hardware.Cpu.from_dict(facts["cpu"])
    here = hardware.cpu(hardware.cpu_source())
    assert cpu.model == here.model and cpu.logical_cores == here.logical_cores == os.cpu_count()
    assert cpu.capability in ("AVX2", "AVX512", "DEFAULT", "SVE256") and "prices" in facts
    text = tt("machine").out
    assert here.model in text and cpu.capability in text and "bf16" in text


def resolve(name: str, m: machine.Machine, book: list[prices.Price] = (),
            sets: list[str] = ()) -> tuple[dict, dict[str, fit.Choice]]:
    values, keys = config.read_preset(PRESETS / f"{name}.toml")
    values.update(config.parse_overrides(list(sets)))
    keys = [k for k in keys if k not in dict(s.split("=") for s in sets)]
    out, chosen = fit.choose(values, keys, m, list(book))
    return out, {c.key: c for c in chosen}


def gpu(cc: str) -> machine.Machine:
    return machine.Machine(torch="2.x", cuda=True, cuda_devices=1, cuda_names=("GPU",),
                           cuda_capabilities=(cc,), cpu=hardware.Cpu(model="host"))


def test_the_shipped_presets_choose_per_machine_and_say_why(tmp_path):
    avx2, bf16, amx = (machine.Machine(cpu=kind(tmp_path, k)) for k in KINDS)
    values, chosen = resolve("fastest-cpu", avx2)
    assert values["amp"] == "off" and values["channels_last"] is True
    assert "no bf16 hardware" in chosen["amp"].line() and "emulated" in chosen["amp"].reason
    assert chosen["amp"].written == "bf16"
    for m in (bf16, amx):
        values, chosen = resolve("fastest-cpu", m)
        assert values["amp"] == "bf16" and "in hardware" in chosen["amp"].reason
    # the amp preset: on the CPU the same rule; on CUDA by what the device supports
    assert resolve("amp", avx2)[0]["amp"] == "off" and resolve("amp", amx)[0]["amp"] == "bf16"
    assert resolve("amp", gpu("9.0"))[0]["amp"] == "bf16"
    values, chosen = resolve("amp", gpu("7.5"))
    assert values["amp"] == "fp16" and "no bf16" in chosen["amp"].reason
    assert resolve("amp", gpu("6.1"))[0]["amp"] == "off"
    # fastest-gpu is fp32 on CUDA (measured faster at this size); on a CPU fallback
    # (device auto, no CUDA) it stays fp32 too, never an emulated bf16
    assert resolve("fastest-gpu", gpu("9.0"))[0]["amp"] == "off"
    assert resolve("fastest-gpu", avx2)[0]["amp"] == "off"
    # --set is the user's: not chosen, not said
    values, chosen = resolve("fastest-cpu", avx2, sets=["amp=bf16"])
    assert values["amp"] == "bf16" and "amp" not in chosen
    # no machine yet: the preset's values, and each choice says so
    values, chosen = resolve("fastest-cpu", None)
    assert values["amp"] == "bf16" and "not known yet" in chosen["amp"].reason


def price(m: machine.Machine, knob: str, value, base, ratio: float, low: float, high: float,
          verdict: str, loaded: bool = False) -> prices.Price:
    key, words = prices.machine_of(m, "cpu")
    return prices.Price(machine=key, words=words, knob=knob, value=value, base=base,
                        ratio=ratio, low=low, high=high, verdict=verdict, rounds=6,
                        date="2026-11-29", study="study 1 (t) in S", context="model fast",
                        loaded=loaded)


def test_a_price_measured_here_decides_over_the_hardware_and_others_never_do(tmp_path):
    avx2, bf16, amx = (machine.Machine(cpu=kind(tmp_path, k)) for k in KINDS)
    slower_here = price(bf16, "amp", "bf16", "off", 0.8, 0.7, 0.9, "slower")
    values, chosen = resolve("fastest-cpu", bf16, [slower_here])
    assert values["amp"] == "off" and "0.80x [0.70-0.90] slower" in chosen["amp"].reason
    # measured the other way round (off against bf16): turned over
    flipped = price(avx2, "amp", "off", "bf16", 2.0, 1.8, 2.2, "faster")
    assert resolve("fastest-cpu", avx2, [flipped])[0]["amp"] == "off"
    faster_here = price(avx2, "amp", "bf16", "off", 1.3, 1.1, 1.5, "faster")
    values, chosen = resolve("fastest-cpu", avx2, [faster_here])
    assert values["amp"] == "bf16" and "measured 1.30x" in chosen["amp"].reason
    # under load, on another machine, or without a verdict: not this machine's price
    for p in (price(avx2, "amp", "bf16", "off", 1.3, 1.1, 1.5, "faster", loaded=True),
              price(amx, "amp", "bf16", "off", 1.3, 1.1, 1.5, "faster"),
              price(avx2, "amp", "bf16", "off", 1.3, None, None, None)):
        assert resolve("fastest-cpu", avx2, [p])[0]["amp"] == "off"
    # channels_last: the preset's value unless a price here says otherwise
    cl = price(avx2, "channels_last", True, False, 0.7, 0.6, 0.8, "slower")
    assert resolve("fastest-cpu", avx2, [cl])[0]["channels_last"] is False
    assert resolve("fastest-cpu", avx2)[0]["channels_last"] is True


def test_the_form_marks_an_emulated_value_and_the_price_here_beside_its_knob(tmp_path):
    avx2, amx = (machine.Machine(cpu=kind(tmp_path, k)) for k in ("epyc-avx2", "xeon-amx"))
    said = fit.notes({"amp": "bf16", "device": "cpu"}, avx2, [])
    assert "no bf16 hardware" in said["amp"] and "emulated" in said["amp"]
    assert fit.notes({"amp": "bf16", "device": "cpu"}, amx, []) == {}
    book = [price(avx2, "amp", "bf16", "off", 0.5, 0.41, 0.57, "slower")]
    said = fit.notes({"amp": "bf16", "device": "cpu"}, avx2, book)
    assert "bf16: 0.50x [0.41-0.57] slower against off here, 2026-11-29" in said["amp"]
    assert f"({book[0].context})" in said["amp"]     # measured on what: a net, a batch
    # at amp = off the same price, turned over; on another machine none
    assert "off: 2.00x" in fit.notes({"amp": "off", "device": "cpu"}, avx2, book)["amp"]
    assert fit.notes({"amp": "bf16", "device": "cpu"}, amx, book) == {}
    assert "fp16 tensor cores" in fit.notes({"amp": "fp16", "device": "cuda"},
                                            gpu("6.1"), [])["amp"]


def test_prices_are_kept_and_read_back_as_untrusted(tmp_path):
    m = machine.Machine(cpu=kind(tmp_path, "epyc-avx2"))
    file = tmp_path / "prices.jsonl"
    p = price(m, "amp", "bf16", "off", 0.5, 0.41, 0.57, "slower")
    prices.add([p], file)
    with file.open("a") as f:
        f.write("not json\n" + json.dumps({"machine": 1}) + "\n" +
                json.dumps({**p.to_dict(), "ratio": -1}) + "\n")
    assert prices.read(file) == [p]
    key = prices.machine_of(m, "cpu")[0]
    assert prices.here(prices.read(file), key, "amp") == [p]
    assert prices.here(prices.read(file), key + "x", "amp") == []


def test_runs_of_two_machines_are_said_to_be_so(tmp_path):
    a, b = (machine.Machine(cpu=kind(tmp_path, k)) for k in ("epyc-avx2", "epyc-bf16"))
    on = lambda m: {"cpu": m.cpu.to_dict(), "device": "cpu"}       # noqa: E731
    assert prices.apart([on(a), on(a)]) is None
    said = prices.apart([on(a), on(b)])
    assert "different machines" in said and "AVX2" in said and "AVX512" in said
    assert prices.apart([on(a), {"device": "cpu"}]) is None     # an older run: not known
    from tui_trainer.core.analysis.explain import explanation_text
    text = explanation_text({"runs": [1, 2], "verdict": "identical", "compared": 3,
                             "up_to": 20, "machines": said})
    assert "different machines" in text


def env_of(cpu: Path, capability: str) -> dict[str, str]:
    return {**os.environ, hardware.CPUINFO_ENV: str(cpu),
            hardware.CAPABILITY_ENV: capability, "ONEDNN_MAX_CPU_ISA": capability.upper()}


def test_a_run_of_a_preset_on_a_cpu_without_bf16_trains_fp32_and_keeps_why(tmp_path):
    """A real run, in a process that sees an AVX2-only CPU (the flags faked, torch's
    dispatch lowered to AVX2 as ATen allows): amp chosen off, said on stderr, kept on the
    run as an event and in its log, and the run's settings name that CPU."""
    fake = cpuinfo(tmp_path, *KINDS["epyc-avx2"])
    p = subprocess.run([sys.executable, "-m", "tui_trainer", "run", "--config", "fastest-cpu",
                        "--session", str(tmp_path / "s"), "--json",
                        *sets(*QUICK, "max_steps=3", "epochs=1")],
                       capture_output=True, text=True, timeout=300,
                       env=env_of(fake, "avx2"), stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    assert "fit to this machine: amp = off: this CPU has no bf16 hardware" in p.stderr
    with SessionStore(tmp_path / "s", create=False, readonly=True) as store:
        run = store.run(1)
        events = store.events(1, fit.EVENT)
    assert run["config"]["amp"] == "off" and run["config"]["channels_last"] is True
    assert [e["data"]["key"] for e in events] == ["amp", "channels_last"]
    cpu = hardware.Cpu.from_dict(run["settings"]["cpu"])
    assert cpu.model == KINDS["epyc-avx2"][0] and cpu.capability == "AVX2" and not cpu.bf16
    assert run["settings"]["cpu_capability"] == "AVX2"
    log = (tmp_path / "s" / "logs" / "run-1.log").read_text()
    assert f"machine: {KINDS['epyc-avx2'][0]} (2 cores), AVX2" in log
    assert f"on cpu ({KINDS['epyc-avx2'][0]})" in log      # device_name: the same CPU
    assert "fit to this machine: amp = off" in log
    # a run of this machine beside it: the export names each one's machine, and Compare
    # says they are two machines (a price across them is not a price)
    r = tt("run", "--session", str(tmp_path / "s"), *sets(*QUICK, "max_steps=3", "epochs=1",
                                                         "device=cpu"))
    assert r.rc == 0, r.err
    out = tmp_path / "out"
    assert tt("export", "1", "2", "--session", str(tmp_path / "s"), "--out", str(out)).rc == 0
    import csv
    with next(out.glob("*summary.csv")).open() as f:
        named = [row["machine"] for row in csv.DictReader(f)]
    assert named[0].startswith(f"{KINDS['epyc-avx2'][0]} (2 cores), AVX2; bf16 emulated")
    assert named[1].startswith(hardware.this_cpu().model) and named[0] != named[1]
    from tui_trainer.core.session.reader import SessionReader
    from tui_trainer.ui.panels.compare import settings_rows, speed_caveats
    reader = SessionReader(SessionStore(tmp_path / "s", create=False, readonly=True))
    reader.tick()
    pair = [reader.rows[1], reader.rows[2]]
    said = speed_caveats(pair)
    assert said[0].startswith("⚠ the runs trained on different machines") and "AVX2" in said[0]
    assert "machine: " in speed_caveats([reader.rows[2], reader.rows[2]])[0]
    rows = {r[0]: r for r in settings_rows(pair)}
    if hardware.this_cpu().capability != "AVX2":      # (on an AVX2 CPU both read AVX2)
        assert rows["⚠ cpu_capability (effective)"][1:] == \
            ["AVX2", hardware.this_cpu().capability]


def test_an_ab_study_keeps_its_price_for_this_machine_and_config_and_machine_show_it(
        tmp_path):
    r = tt("ab", "--session", str(tmp_path), "--vary", "amp=bf16", "--steps", "12",
           "--repeats", "6", "--rerun-loaded", "0",
           *sets(*QUICK, "log_every=2", "device=cpu", "fingerprint_every=0"))
    assert r.rc == 0, r.err
    kept = prices.read()
    assert len(kept) == 1, r.err
    p = kept[0]
    # this machine as torch itself names it (the runs record torch's instruction set)
    here = prices.machine_of(machine.Machine.from_dict(json.loads(tt("machine", "--json").out)),
                             "cpu")
    assert (p.knob, p.value, p.base) == ("amp", "bf16", "off")
    assert p.machine == here[0] and p.low <= p.ratio <= p.high and p.rounds == 6
    assert p.verdict in ("faster", "slower", "within noise") and "study 1" in p.study
    assert "kept for this machine: amp = bf16" in r.err
    # the study shown again (`ab --study`, as the dashboard continues one) keeps nothing more
    assert tt("ab", "--session", str(tmp_path), "--study", "1").rc == 0
    assert prices.read() == kept
    # `config amp` and `machine` show it where it was measured quietly, and never as this
    # machine's where a round shared the CPU (the suite's other tests run beside it)
    shown_here = "amp = bf16: " + p.interval() in tt("config", "amp", "--set",
                                                     "device=cpu").out
    assert shown_here == (not p.loaded)
    assert (p.interval() in tt("machine").out) == (not p.loaded)


async def test_the_dashboard_chooses_a_presets_knobs_for_its_machine_and_marks_them(
        tmp_path):
    """The form on an AVX2-only CPU (its facts faked, as the probe would give them): the
    preset's amp chosen off and said, at its field too; bf16 typed back is the user's, and
    marked as emulated here with the price measured here; Start keeps the choice only while
    the value is still the one chosen."""
    from textual.widgets import Select
    from tui_trainer.ui.app import TrainerApp
    from tui_trainer.ui.panels.launch import LaunchPanel
    from tui_trainer.ui.widgets.config_form import ConfigForm
    avx2 = machine.Machine(torch="2.x", cpu=kind(tmp_path, "epyc-avx2"))
    app = TrainerApp(tmp_path / "s", poll=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        launch = app.query_one(LaunchPanel)
        form = app.query_one(ConfigForm)
        # the price measured here, as a study that ended keeps it: read by the form's own
        # check of the prices' file (assigned to the form, the next check, every 2 s,
        # read the file and took it away again: a race on a loaded machine)
        prices.add([price(avx2, "amp", "bf16", "off", 0.5, 0.41, 0.57, "slower")])
        launch.prices_changed()
        for _ in range(100):
            await pilot.pause(0.05)
            if form.prices:
                break
        assert len(form.prices) == 1
        launch.set_machine(avx2)
        assert "AMD EPYC 7B12" in str(app.query_one("#machine").render())
        preset = app.query_one("#preset", Select)
        preset.value = next(v for _, v in preset._options
                            if isinstance(v, str) and v.endswith("fastest-cpu.toml"))
        await pilot.pause()
        assert form.config().amp == "off" and form.config().channels_last is True
        said = [n.message for n in app._notifications if "preset fastest-cpu loaded" in
                n.message]
        # the price measured here decides (the flags would have said the same)
        assert said and "amp = off: amp = bf16 measured 0.50x [0.41-0.57] slower" in said[-1]
        note = str(app.query_one("#note-amp").render())
        assert "chosen for this machine" in note and "off: 2.00x" in note
        assert fit.still_chosen(launch._chosen, form.config().to_dict())[0].key == "amp"
        (await form.field("amp")).value = "bf16"
        await pilot.pause()
        note = str(app.query_one("#note-amp").render())
        assert "emulated" in note and "bf16: 0.50x [0.41-0.57] slower against off here" \
            in note and "chosen" not in note
        assert [c.key for c in fit.still_chosen(launch._chosen, form.config().to_dict())] \
            == ["channels_last"]
        (await form.field("amp")).value = "off"
        (await form.field("device")).value = "auto"   # (still the CPU here)
        await pilot.pause()
        assert "off: 2.00x" in str(app.query_one("#note-amp").render())
        # a study that ends while the dashboard is open: its price shows at the knob
        launch._prices_seen = 0
        prices.add([price(avx2, "amp", "bf16", "off", 0.25, 0.2, 0.3, "slower")])
        launch.prices_changed()
        for _ in range(100):
            await pilot.pause(0.05)
            if "off: 4.00x" in str(app.query_one("#note-amp").render()):
                break
        assert "off: 4.00x [3.33-5.00] faster against bf16 here" in \
            str(app.query_one("#note-amp").render())


def test_an_unknown_price_decides_nothing(tmp_path):
    avx2 = machine.Machine(cpu=kind(tmp_path, "epyc-avx2"))
    bf16 = machine.Machine(cpu=kind(tmp_path, "epyc-bf16"))
    unknown = price(bf16, "amp", "bf16", "off", 0.97, 0.9, 1.04, "unknown")
    values, chosen = resolve("fastest-cpu", bf16, [unknown])
    assert values["amp"] == "bf16" and "in hardware" in chosen["amp"].reason
    same = price(avx2, "amp", "bf16", "off", 1.01, 0.97, 1.04, "the same")
    values, chosen = resolve("amp", avx2, [same])
    assert values["amp"] == "off" and "the same" in chosen["amp"].reason


@pytest.mark.gpu
def test_machine_names_each_gpu_with_its_compute_capability():
    """On CUDA: each device's name and compute capability, as torch gives them, in
    `machine --json` and its text."""
    r = tt("machine", "--json")
    facts = json.loads(r.out)
    assert facts["cuda"] and len(facts["cuda_capabilities"]) == facts["cuda_devices"]
    assert all(c.count(".") == 1 and c.replace(".", "").isdigit()
               for c in facts["cuda_capabilities"])
    text = tt("machine").out
    assert f"{facts['cuda_names'][0]} ({facts['cuda_capabilities'][0]})" in text
