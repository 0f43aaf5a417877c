"""The packages' boundaries: the web app never imports the GPU worker; what both need (the box's
inventory and probes, the broker, the settings) lives in ``tunebox``, the store and the planner. The
command line and ``tunebox serve`` put the web app and a worker together, so ``tunebox`` may import
both."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imports(package: str) -> dict[str, set[str]]:
    """Top-level package of every module each file of ``package`` imports, inside functions too."""
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        out[str(path.relative_to(ROOT))] = names
    return out


@pytest.mark.parametrize(("package", "forbidden"), [
    ("api", {"worker"}),  # the web app hands jobs over through tunebox.broker, never by the worker's code
    ("store", {"api", "worker", "tunebox"}),
    ("planner", {"api", "worker", "store", "tunebox", "torch", "deepspeed", "transformers"}),
])
def test_a_package_does_not_import_what_it_must_not(package: str, forbidden: set[str]) -> None:
    crossing = {path: sorted(names & forbidden) for path, names in _imports(package).items()
                if names & forbidden}
    assert not crossing, crossing


def test_the_web_app_loads_without_the_worker() -> None:
    code = ("import sys, api.app; api.app.create_app; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'worker'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
