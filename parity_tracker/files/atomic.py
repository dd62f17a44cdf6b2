"""One atomic-write helper: write to a temporary file beside the target, then rename.

``os.replace`` is atomic on POSIX and Windows when source and target are on one file system,
which a sibling temporary file guarantees; so a reader sees the old file or the new one, never
a half-written one, and a crash mid-write leaves only a ``.NAME.*.tmp`` file behind (removed
when the write raised).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from parity_tracker.files import jsonio


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], Any]) -> Path:
    """Call ``write(tmp)`` on a temporary path beside ``path``, then rename it to ``path``.

    Args:
        path: the final file; its folder is created when missing.
        write: writes the whole content to the path it is given (e.g.
            ``lambda p: pq.write_table(table, p)``).

    Returns:
        ``path`` as a ``Path``.

    Raises:
        Exception: whatever ``write`` raises; the temporary file is removed first.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """``atomic_write`` of a UTF-8 text."""
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, indent: int = 2) -> Path:
    """``atomic_write`` of strict JSON (sorted keys; non-finite floats as ``files.jsonio``).

    Raises:
        TypeError: ``obj`` holds a value JSON cannot encode, before any file is touched.
    """
    text = jsonio.dumps(obj, indent=indent, sort_keys=True)
    return atomic_write_text(path, text)
