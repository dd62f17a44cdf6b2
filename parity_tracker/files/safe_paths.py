"""Paths read from an index file must stay inside their folder (issue 20; see also issue 14)."""

from __future__ import annotations

import os
from pathlib import Path

from parity_tracker.errors import InputError


def resolve_inside(root: str | os.PathLike[str], name: str) -> Path:
    """``root / name`` resolved, refusing absolute names and names that leave ``root``.

    Raises:
        InputError: ``name`` is absolute or resolves outside ``root`` (``..``, a symlink).
    """
    base = Path(root).resolve()
    path = (base / name).resolve()
    if Path(name).is_absolute() or (path != base and base not in path.parents):
        raise InputError(f"path {name!r} leaves {base}; an index may name files inside it only")
    return path
