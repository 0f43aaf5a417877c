"""The README documents every setting and names the two fresh-machine commands that exist."""

from __future__ import annotations

import os
from pathlib import Path

from tunebox.settings import Settings

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def test_every_setting_is_in_the_readme_table() -> None:
    missing = [f"TUNEBOX_{name.upper()}" for name in Settings.model_fields
               if f"`TUNEBOX_{name.upper()}`" not in README]
    assert not missing, f"add to README (tunebox settings --markdown): {missing}"


def test_the_readme_commands_exist_and_are_executable() -> None:
    assert "./scripts/setup && .venv/bin/tunebox serve" in README
    assert "./scripts/test" in README
    for script in ("scripts/setup", "scripts/test", ".ci/run"):
        assert os.access(REPO / script, os.X_OK), script
    assert "./scripts/test" in (REPO / ".ci/run").read_text()
