"""Packaging: ONE top-level import name, every package in the wheel, built-ins as entry points.

The fast tests read pyproject.toml and the folders (no build); the slow one builds the wheel
from a copy of the sources in tmp_path and reads its ``top_level.txt`` and
``entry_points.txt``.
"""

from __future__ import annotations

import ast
import configparser
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
GROUP = "parity_tracker.targets"


def _folder(package: str) -> Path:
    """The folder setuptools takes ``package`` from (longest package-dir prefix wins)."""
    mapping = SETUPTOOLS.get("package-dir", {})
    parts = package.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in mapping:
            return REPO / mapping[prefix] / Path(*parts[i:])
    return REPO / Path(*parts)


def _packages_on_disk(package: str) -> set[str]:
    """``package`` and every subpackage under its folder (folders with ``__init__.py``)."""
    root = _folder(package)
    found = {package}
    for init in root.rglob("__init__.py"):
        rel = init.parent.relative_to(root)
        if rel.parts and "__pycache__" not in rel.parts:
            found.add(".".join((package, *rel.parts)))
    return found


def test_one_top_level_import_name():
    assert {p.split(".")[0] for p in SETUPTOOLS["packages"]} == {"parity_tracker"}
    assert not (REPO / "pipelines" / "__init__.py").exists()  # configuration, not a package


def test_package_list_matches_the_folders():
    listed = set(SETUPTOOLS["packages"])
    roots = [p for p in listed if p == "parity_tracker" or p in SETUPTOOLS["package-dir"]]
    on_disk = set().union(*(_packages_on_disk(p) for p in roots))
    # a mapped folder is not also a subpackage of parity_tracker/ (it would be shadowed)
    assert not any((REPO / "parity_tracker" / p.split(".", 1)[1]).exists()
                   for p in SETUPTOOLS["package-dir"])  # fmt: skip
    missing, extra = sorted(on_disk - listed), sorted(listed - on_disk)
    assert missing == [], f"add these to [tool.setuptools] packages: {missing}"
    assert extra == [], f"these listed packages have no folder: {extra}"


def test_mapped_folders_are_the_design_cards_top_level_folders():
    assert SETUPTOOLS["package-dir"] == {
        "parity_tracker.dashboards": "dashboards",
        "parity_tracker.builtin_targets": "pipelines/targets",
    }


def _module_constant(path: Path, name: str) -> object:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    return None


def test_every_builtin_target_module_is_an_entry_point():
    declared = PYPROJECT["project"]["entry-points"][GROUP]
    modules = sorted(
        p for p in (REPO / "pipelines" / "targets").glob("*.py") if not p.stem.startswith("_")
    )
    expected = {
        _module_constant(p, "NAME"): f"parity_tracker.builtin_targets.{p.stem}" for p in modules
    }
    assert declared == expected
    assert len(expected) == 5


def test_installed_entry_points_match_pyproject():
    """The environment's metadata is current (else: ``pip install -e .`` again)."""
    from importlib.metadata import entry_points

    installed = {ep.name: ep.value for ep in entry_points(group=GROUP)}
    for name, value in PYPROJECT["project"]["entry-points"][GROUP].items():
        assert installed.get(name) == value, f"stale install: {name}; run pip install -e ."


@pytest.mark.slow
def test_built_wheel_has_only_parity_tracker(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("parity_tracker", "dashboards", "pipelines"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    out = tmp_path / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("parity_tracker-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
        top = z.read(info).decode().split()
        eps = configparser.ConfigParser()
        eps.read_string(z.read(info.replace("top_level.txt", "entry_points.txt")).decode())
    assert top == ["parity_tracker"]
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {
        "parity_tracker"
    }
    assert "parity_tracker/dashboards/report.py" in names
    assert "parity_tracker/builtin_targets/llama_tiny.py" in names
    assert dict(eps[GROUP]) == PYPROJECT["project"]["entry-points"][GROUP]
