"""The README's set-up commands are the ones CI runs."""

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
