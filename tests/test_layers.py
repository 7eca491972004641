"""The direction of imports: core imports neither torch nor textual, the engine never imports
textual, and the CLI's non-training commands start without torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _modules_after(code: str, env: dict[str, str] | None = None) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\n"
                          "print(' '.join(sorted(m.split('.')[0] for m in sys.modules)))"],
                         capture_output=True, text=True, check=True, env=env).stdout
    return set(out.split())


PACKAGE = Path(__file__).resolve().parents[1] / "tui_trainer"


def _every(layer: str) -> list[str]:
    """Every module of a layer, found on disk (a new module is checked without a test
    change)."""
    return sorted("tui_trainer." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)
                  for p in (PACKAGE / layer).rglob("*.py"))


def test_every_core_module_imports_neither_torch_nor_textual():
    modules = _every("core")
    assert len(modules) >= 15 and "tui_trainer.core.session.reader" in modules
    mods = _modules_after("\n".join(f"import {m}" for m in modules))
    assert "tui_trainer" in mods
    assert "torch" not in mods and "textual" not in mods


def test_the_runner_imports_no_torch_until_it_checks_a_device():
    mods = _modules_after("import tui_trainer.runner")
    assert "torch" not in mods and "textual" not in mods


def test_engine_never_imports_textual_nor_leaves_torchs_cache_folder_in_tmp(tmp_path):
    """Importing torchvision makes torch create /tmp/torchinductor_<user>; the engine points
    it into tui-trainer's cache first."""
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    (tmp_path / "tmp").mkdir()
    env.update(TMPDIR=str(tmp_path / "tmp"), TUI_TRAINER_HOME=str(tmp_path / "home"))
    mods = _modules_after("import tui_trainer.engine.train, tui_trainer.engine.data", env)
    assert "torch" in mods and "torchvision" in mods
    assert "textual" not in mods
    assert list((tmp_path / "tmp").iterdir()) == []
    assert (tmp_path / "home" / "cache" / "torchinductor").is_dir()


def test_cli_commands_that_do_not_train_leave_torch_unloaded():
    mods = _modules_after("from tui_trainer import cli\n"
                          "import contextlib, io\n"
                          "with contextlib.redirect_stdout(io.StringIO()): cli.main(['config'])")
    assert "torch" not in mods


def test_the_dashboard_never_imports_torch():
    modules = _every("ui")
    assert "tui_trainer.ui.panels.runs" in modules
    mods = _modules_after("\n".join(f"import {m}" for m in modules) +
                          "\nimport tui_trainer.cli")
    assert "textual" in mods
    assert "torch" not in mods and "torchvision" not in mods


def test_a_data_parallel_runs_own_process_checks_its_config_without_torchvision(tmp_path):
    """lifecycle.preflight, in the process that starts the ranks: the knobs and the device
    checked and the data made ready (the shipped sample unpacked for the ranks) before any
    rank starts, without importing torchvision (2 s there, once per Start)."""
    env = {**os.environ, "TUI_TRAINER_OFFLINE": "1"}
    cfg = {"dataset": "mnist-sample", "nproc": 2, "device": "cpu", "data_dir": str(tmp_path)}
    mods = _modules_after("from tui_trainer.core.settings import config\n"
                          "from tui_trainer import lifecycle\n"
                          f"lifecycle.preflight(config.from_dict({cfg!r}))", env)
    assert "torch" in mods and "torchvision" not in mods
    assert (tmp_path / "mnist-sample" / "MNIST" / "raw" / "train-images-idx3-ubyte").is_file()


def test_core_imports_nothing_above_it():
    """core is the floor: no module of it imports the engine, the launcher's wing, the
    dashboard or the commands, even inside a function (read with `ast`). The launcher's
    client reaches core's supervisor through its Forker protocol, never the other way."""
    import ast
    above = ("engine", "launcher", "ui", "commands", "runner", "cli", "lifecycle")
    found = []
    for path in (PACKAGE / "core").rglob("*.py"):
        depth = len(path.relative_to(PACKAGE).parts) - 1       # folders below the package
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level > depth:
                top = (node.module or "").split(".")[0]
                if top in above or (node.module is None and
                                    any(a.name in above for a in node.names)):
                    found.append(f"{path.relative_to(PACKAGE)}: {node.module}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)) and \
                    not getattr(node, "level", 0):
                names = [node.module] if isinstance(node, ast.ImportFrom) else \
                    [a.name for a in node.names]
                found += [f"{path.relative_to(PACKAGE)}: {n}" for n in names if n and
                          n.split(".")[:2] in (["tui_trainer", a] for a in above)]
    assert found == []


def test_the_launchers_client_starts_without_torch():
    mods = _modules_after("import tui_trainer.launcher.client")
    assert "torch" not in mods and "textual" not in mods
