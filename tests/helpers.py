"""Helpers shared by the test files (import as ``from helpers import ...``; pytest puts
``tests/`` on ``sys.path`` because the folder has no ``__init__.py``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import torch

from parity_tracker.pipeline.targets import resolve_target


def run_quiet(case: Any, **kwargs: Any) -> Any:
    """``run.run_case`` without dumps (nothing written to disk): the targets' test runner."""
    from parity_tracker.run import run_case
    from parity_tracker.tensor_checker import DumpMode

    return run_case(case, dump_mode=DumpMode.NOT, **kwargs)


def build_target(name: str, settings: dict[str, str] | None = None) -> Any:
    """The ``ParityCase`` of registered target ``name``, through the registry (as the CLI does)."""
    target = resolve_target(name)
    return target.build_case(target.validate(settings or {}))


def rows_by(result: Any, *keys: str) -> dict[Any, dict[str, Any]]:
    """The modules table's rows keyed by ``keys`` (one key: the value; more: a tuple)."""
    out = {}
    for r in result.modules.to_pylist():
        out[r[keys[0]] if len(keys) == 1 else tuple(r[k] for k in keys)] = r
    return out


def nudge_all_one_ulp(tensor: torch.Tensor) -> None:
    """Every element of ``tensor`` up by one ULP (``torch.nextafter`` towards +inf), in place."""
    with torch.no_grad():
        tensor.copy_(torch.nextafter(tensor, torch.full_like(tensor, float("inf"))))


# --------------------------------------------------------------------------- repository hygiene


def screenshot_dir() -> Path:
    """Where browser tests keep their screenshots: ``$PARITY_TEST_ARTIFACTS``, else a folder in
    the system temporary directory (never the checkout: tests write only outside it).
    """
    import tempfile

    root = os.environ.get("PARITY_TEST_ARTIFACTS") or Path(tempfile.gettempdir()) / "parity-tests"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


#: Paths a test run may create in the checkout: interpreter and tool caches, never results.
TOOL_CACHES = ("__pycache__/", ".pytest_cache/", ".hypothesis/", ".ruff_cache/", ".egg-info/")
#: Every changed, untracked and ignored file, file by file, outside the virtual environment.
GIT_STATUS = (
    *("git", "status", "--porcelain", "--ignored", "--untracked-files=all"),
    *("--", ".", ":(exclude).venv"),
)


def git_status(repo: Path) -> set[str] | None:
    """``git status --porcelain --ignored`` lines of ``repo`` (None when it is no git checkout).

    Ignored files are listed too: ``./.parity`` is in ``.gitignore``, so a test writing its
    store or dumps there would not show in a plain ``git status``. The virtual environment
    (``.venv``, tens of thousands of files) is not walked.
    """
    try:
        out = subprocess.run(
            GIT_STATUS,
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return set(out.stdout.splitlines()) if out.returncode == 0 else None


def new_changes(before: set[str], after: set[str]) -> list[str]:
    """Status lines present after a run and not before it, tool caches left out."""
    return sorted(line for line in after - before if not any(c in line for c in TOOL_CACHES))
