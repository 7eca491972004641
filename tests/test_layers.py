"""The direction of imports: core imports neither torch nor textual, the engine never imports
textual, and the CLI's non-training commands start without torch."""

from __future__ import annotations

import subprocess
import sys


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\n"
                          "print(' '.join(sorted(m.split('.')[0] for m in sys.modules)))"],
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_core_imports_neither_torch_nor_textual():
    mods = _modules_after("import tui_trainer.core.config, tui_trainer.core.store, "
                          "tui_trainer.core.paths, tui_trainer.core.errors")
    assert "tui_trainer" in mods
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
    mods = _modules_after("import tui_trainer.ui.app, tui_trainer.cli\n"
                          "from tui_trainer.ui.app import TrainerApp")
    assert "textual" in mods
    assert "torch" not in mods and "torchvision" not in mods
