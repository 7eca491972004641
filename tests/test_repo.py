"""The README's set-up commands are the ones CI runs."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_ci_runs_the_readme_test_command():
    readme = ROOT.joinpath("README.md").read_text()
    ci = ROOT.joinpath(".ci", "run").read_text()
    command = [line for line in ci.splitlines()
               if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert len(command) == 1
    assert command[0].strip() in readme
    # And the README starts with the set-up, before anything else.
    assert readme.index(command[0].strip()) < readme.index("## ")


def test_the_top_level_is_the_one_the_design_names():
    for name in ("pyproject.toml", "README.md", "tui_trainer", "experiments", "tests", "assets"):
        assert ROOT.joinpath(name).exists(), name
    assert ROOT.joinpath("experiments").resolve() == ROOT.joinpath("tui_trainer", "presets")


def test_an_installed_copy_carries_its_presets_sample_data_and_stylesheet(tmp_path):
    """A non-editable install (what `pip install tui-trainer` gives) from this tree: the
    package's own lookups find the shipped presets, the MNIST sample and the stylesheet."""
    source = tmp_path / "source"      # built from a copy: the build writes beside its source
    shutil.copytree(ROOT / "tui_trainer", source / "tui_trainer",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--no-compile", "--target", str(target),
                    str(source)], check=True, cwd=tmp_path,
                   env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    probe = (
        "import tui_trainer, pathlib\n"
        "from tui_trainer.core.settings import presets\n"
        "from tui_trainer.core.settings import datafiles\n"
        "from tui_trainer.ui.app import TrainerApp\n"
        "print(tui_trainer.__file__)\n"
        "print(sorted(p.name for p in presets.SHIPPED.glob('*.toml')))\n"
        "print(sorted(p.name for p in (presets.SHIPPED / 'ab').glob('*.toml')))\n"
        "print(sorted(p.name for p in datafiles.sample_gz_dir().iterdir()))\n"
        "css = pathlib.Path(tui_trainer.ui.app.__file__).parent / TrainerApp.CSS_PATH\n"
        "print(css.is_file() and css.stat().st_size)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(target)},
                         check=True).stdout.splitlines()
    assert out[0].startswith(str(target))          # the installed copy, not this tree
    shipped = ROOT / "tui_trainer"
    assert eval(out[1]) == sorted(p.name for p in (shipped / "presets").glob("*.toml"))
    assert eval(out[2]) == sorted(p.name for p in (shipped / "presets" / "ab").glob("*.toml"))
    assert eval(out[3]) == sorted(p.name for p in (shipped / "assets" / "mnist-sample").iterdir())
    assert int(out[4]) == (shipped / "ui" / "app.tcss").stat().st_size


def test_no_two_modules_of_the_package_import_each_other():
    """The package's modules import in one direction: no circle, whether an import is at the
    top of a module or inside a function (train, distributed and memory once imported each
    other). Read with `ast`, nothing imported."""
    import ast
    root = Path(__file__).resolve().parent.parent / "tui_trainer"
    names = {p: ".".join(p.relative_to(root.parent).with_suffix("").parts)
             for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path, name in names.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        out = graph.setdefault(name.removesuffix(".__init__"), set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
                for alias in node.names:      # `from . import x` may name a module
                    full = f"{target}.{alias.name}"
                    out.add(full if full in names.values() else target)
    modules = set(graph)
    edges = {m: {t for t in ts if t in modules and t != m} for m, ts in graph.items()}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                return path[path.index(t):] + [t]
            if t not in state and (found := visit(t)):
                return found
        state[m] = 2
        path.pop()
        return None
    for m in sorted(modules):
        if m not in state:
            circle = visit(m)
            assert circle is None, " -> ".join(circle)


def test_each_command_is_a_module_of_its_own_holding_its_parser_and_its_run():
    """`tui-trainer --help` lists the commands; each one's parser and what it does live in
    tui_trainer/commands/<command>.py (`sweep` shares `ab`'s), and cli.py is the front door
    only: the top-level options, the dispatch, the exit status."""
    from tui_trainer import cli, commands
    listed = subprocess.run([sys.executable, "-m", "tui_trainer", "--help"], capture_output=True,
                            text=True, timeout=60).stdout
    names = [line.split()[0] for line in listed.split("COMMAND\n", 1)[1].split("\n\n")[0]
             .splitlines() if line.startswith("    ") and not line.startswith("     ")]
    assert "run" in names and "explain" in names and len(names) >= 13, names
    for name in [*names, "worker"]:
        module = commands.BY_NAME[name]
        assert Path(module.__file__).stem == ("ab" if name == "sweep" else name)
        assert callable(module.add) and callable(module.run)
    source = Path(cli.__file__).read_text()
    assert "def cmd_" not in source and "add_parser(" not in source
    assert source.count("\n") < 150


def test_no_room_of_the_package_holds_more_than_16_modules():
    """A folder is a room named for what it owns (docs/architecture.md): one that grows past
    16 modules is split by what its modules own (issue 57)."""
    rooms = {p.parent for p in (ROOT / "tui_trainer").rglob("*.py")
             if "__pycache__" not in p.parts}
    crowded = {str(r.relative_to(ROOT)): n for r in rooms
               if (n := len(list(r.glob("*.py")))) > 16}
    assert crowded == {}


def test_no_module_of_the_package_or_its_tests_is_longer_than_800_lines():
    """A module that grows past 800 lines is split by what it owns (issue 57: the store,
    train.py, warm.py, explain.py and the study were; then test_warm.py and test_ui.py)."""
    long = {str(p.relative_to(ROOT)): n for folder in ("tui_trainer", "tests")
            for p in (ROOT / folder).rglob("*.py")
            if "__pycache__" not in p.parts
            and (n := p.read_text().count("\n")) > 800}
    assert long == {}


def test_the_app_keeps_layout_routing_and_the_session_and_tabs_own_their_keys():
    """ui/app.py is the App alone (no mixins of ours) in under 700 lines; what a tab's keys
    do lives in its panel, so no tab's id is written outside ui/panels/ (issue 57: the App
    and its two mixins were 1,148 lines, and tab ids appeared 17 times outside panels/)."""
    from tui_trainer.ui.app import TrainerApp
    ours = [c for c in TrainerApp.__mro__[1:] if c.__module__.startswith("tui_trainer")]
    assert ours == []
    assert (ROOT / "tui_trainer" / "ui" / "app.py").read_text().count("\n") < 700
    outside = [str(p.relative_to(ROOT)) for p in (ROOT / "tui_trainer").rglob("*.py")
               if "panels" not in p.parts and '"tab-' in p.read_text()]
    assert outside == []


def test_the_dashboards_text_boxes_are_the_ones_that_edit_in_order():
    """Every text box of the dashboard is ui/widgets/inputs.Input, whose editing keys act in
    the order typed (Textual's own applies keys that arrive together out of order)."""
    import re
    direct = [str(p.relative_to(ROOT)) for p in (ROOT / "tui_trainer" / "ui").rglob("*.py")
              if p.name != "inputs.py" and re.search(
                  r"from textual\.widgets import[^\n]*\bInput\b|textual\.widgets\.Input\b",
                  p.read_text())]
    assert direct == []
