"""The direction of imports: core imports neither torch nor textual, the engine never imports
textual, and the CLI's non-training commands start without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\n"
                          "print(' '.join(sorted(m.split('.')[0] for m in sys.modules)))"],
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


PACKAGE = Path(__file__).resolve().parents[1] / "tui_trainer"


def _every(layer: str) -> list[str]:
    """Every module of a layer, found on disk (a new module is checked without a test
    change)."""
    return sorted("tui_trainer." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)
                  for p in (PACKAGE / layer).rglob("*.py"))


def test_every_core_module_imports_neither_torch_nor_textual():
    modules = _every("core")
    assert len(modules) >= 15 and "tui_trainer.core.reader" in modules
    mods = _modules_after("\n".join(f"import {m}" for m in modules))
    assert "tui_trainer" in mods
    assert "torch" not in mods and "textual" not in mods


def test_the_runner_imports_no_torch_until_it_checks_a_device():
    mods = _modules_after("import tui_trainer.runner")
    assert "torch" not in mods and "textual" not in mods


def test_engine_never_imports_textual():
    mods = _modules_after("import tui_trainer.engine.train, tui_trainer.engine.data")
    assert "torch" in mods
    assert "textual" not in mods


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
