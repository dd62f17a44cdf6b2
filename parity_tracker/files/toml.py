"""Read a TOML file, turning every failure into an ``InputError`` that names the file and line."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from parity_tracker.errors import InputError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def load_toml(path: str | Path) -> dict[str, Any]:
    """Parse ``path`` as TOML.

    Raises:
        InputError: the file is missing or unreadable, or malformed; the message names the
            file and, for a syntax error, ``line N`` (from tomllib's "at line N, column M").
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read the file ({exc.strerror or exc})") from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = re.search(r"line (\d+)", str(exc))
        line = found.group(1) if found else None
        if line is None and "end of document" in str(exc):
            line = str(max(1, len(text.splitlines())))
        where = f"{path}:{line}" if line else str(path)
        raise InputError(f"{where}: malformed TOML: {exc}") from exc
