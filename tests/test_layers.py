"""The import DAG, enforced: import-linter's contracts of pyproject.toml on the installed layout.

The contracts (``[tool.importlinter]``): layers ``cli > dashboards > pipeline > analysis > track >
distributed > files/run > adapters > localize > capture > compare > statuses/errors``, and "only
parity_tracker.track imports mlflow". grimp walks the ``parity_tracker/`` folder, but
``parity_tracker.dashboards`` and ``parity_tracker.builtin_targets`` come from other folders
(``[tool.setuptools.package-dir]``), so each test stages the wheel's layout in ``tmp_path``
first and runs ``lint-imports`` there (imports inside functions count: grimp reads every import
statement).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
#: Folder in the repository → place in the installed package (pyproject's package-dir).
MAPPED = {"dashboards": "dashboards", "pipelines/targets": "builtin_targets"}
LINT = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def stage(tmp_path: Path) -> Path:
    """Copy the sources into ``tmp_path/src`` as the wheel lays them out; returns the package."""
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    package = src / "parity_tracker"
    shutil.copytree(REPO / "parity_tracker", package, ignore=ignore)
    for folder, name in MAPPED.items():
        shutil.copytree(REPO / folder, package / name, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return package


def lint(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the staged tree (``tmp_path/src`` first on ``sys.path``, no cache)."""
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src"), "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-c", LINT, "pyproject.toml", "--no-cache"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_layer_contracts_hold(tmp_path):
    stage(tmp_path)
    out = lint(tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Contracts: 2 kept, 0 broken." in out.stdout


def _optional_layers(pyproject: Path) -> None:
    """Mark every layer optional (``(name)``), so a layer not yet created is no error."""
    text = pyproject.read_text(encoding="utf-8")
    contracts = tomllib.loads(text)["tool"]["importlinter"]["contracts"]
    for layer in next(c for c in contracts if c["type"] == "layers")["layers"]:
        parts = re.split(r"( [:|] )", layer)
        new = "".join(p if p.strip() in (":", "|") else f"({p})" for p in parts)
        text = text.replace(f'"{layer}"', f'"{new}"', 1)
    pyproject.write_text(text, encoding="utf-8")


def _add_line(module: Path, line: str) -> None:
    module.write_text(module.read_text(encoding="utf-8") + f"\n{line}\n", encoding="utf-8")


@pytest.mark.parametrize(
    ("line", "reported"),
    [
        ("import parity_tracker.cli  # back-import", "parity_tracker.errors -> parity_tracker.cli"),
        ("import mlflow  # outside track", "parity_tracker.errors -> mlflow"),
    ],
)
def test_a_back_import_added_by_hand_breaks_a_contract(tmp_path, line, reported):
    package = stage(tmp_path)
    _optional_layers(tmp_path / "pyproject.toml")
    clean = lint(tmp_path)
    assert reported not in clean.stdout  # not already there
    _add_line(package / "errors.py", line)
    broken = lint(tmp_path)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert reported in broken.stdout, broken.stdout
    assert "BROKEN" in broken.stdout
