"""The tree passes ``make lint``'s two ruff commands, so ``make test`` (CI) catches what only
``make lint`` did: ``ruff check`` and ``ruff format --check`` over the whole tree, Markdown
code blocks included (ruff 0.17 formats them; pyproject pins that minor release).

Ruff runs with ``--no-cache`` (no ``.ruff_cache`` written into the checkout).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> str:
    """The ruff beside the running interpreter (the venv's), else one on PATH; else skip."""
    beside = Path(sys.executable).parent / "ruff"
    found = str(beside) if beside.exists() else shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    return found


@pytest.mark.parametrize("args", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_ruff_passes_on_the_whole_tree(args):
    done = subprocess.run(
        [_ruff(), *args, "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
