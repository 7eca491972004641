"""Presets (ready run configs) and ready A/B studies: those shipped inside the package, and
the user's own under TUI_TRAINER_HOME (or the platform's data folder).

    tui_trainer/presets/*.toml         shipped run configs (baseline, fastest-cpu, ...)
    tui_trainer/presets/ab/*.toml      shipped A/B studies
    USER_DATA/presets/*.toml           the user's own ("Save preset" in the dashboard)
    USER_DATA/presets/ab/*.toml        the user's own studies

A `--config NAME` that is not a file is looked up here by name, so an installed package
(no source checkout) runs `tui-trainer run --config fastest-cpu` as it is.

Core layer: imports neither torch nor textual.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..session.paths import user_data_dir

SHIPPED = Path(__file__).resolve().parents[2] / "presets"


@dataclass(frozen=True)
class Preset:
    name: str
    path: Path
    mine: bool            # the user's own (saved from the dashboard), not shipped

    @property
    def label(self) -> str:
        return f"{self.name} (mine)" if self.mine else self.name


def user_dir() -> Path:
    return user_data_dir() / "presets"


def _listed(sub: str = "") -> list[Preset]:
    out = []
    for folder, mine in ((SHIPPED, False), (user_dir(), True)):
        d = folder / sub if sub else folder
        if d.is_dir():
            out += [Preset(f.stem, f, mine) for f in sorted(d.glob("*.toml"))]
    return out


def presets() -> list[Preset]:
    """Every run preset, shipped first, then the user's."""
    return _listed()


def studies() -> list[Preset]:
    """Every ready A/B study, shipped first, then the user's."""
    return _listed("ab")


def resolve(name_or_path: str | Path, study: bool = False) -> Path:
    """A config file: the path itself when it exists, else a preset (or, for `study`, a ready
    study) of that name, the user's own before the shipped one. Unchanged when none."""
    p = Path(name_or_path)
    if p.exists() or p.suffix or "/" in str(name_or_path):
        return p
    found = [x for x in (studies() if study else presets()) if x.name == str(name_or_path)]
    mine = [x for x in found if x.mine]
    return (mine or found or [Preset("", p, False)])[0].path


def save(name: str, toml_text: str) -> Path:
    """Writes the user's preset `name` (a plain name, not a path)."""
    target = user_dir() / f"{Path(name).name}.toml"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(toml_text, encoding="utf-8")
    return target
