"""Read a TOML file, turning every failure into an ``InputError`` that names the file and line."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, TypeVar

from parity_tracker.errors import InputError

M = TypeVar("M")

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


def _loc(loc: tuple[Any, ...]) -> str:
    """``("matrix", 1, "ops")`` → ``matrix[2].ops`` (1-based entry numbers, as the files say)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part + 1}]"
        elif not str(part).startswith(("function-", "constrained-")):
            out += f".{part}" if out else str(part)
    return out


def validate_model(model: type[M], data: Any, where: str) -> M:
    """``data`` validated against the pydantic ``model``; every problem named in one InputError.

    Args:
        model: a pydantic ``BaseModel`` class (the file's declared schema).
        data: the parsed file (``load_toml``'s dict).
        where: the file, prefixed to the message.

    Raises:
        InputError: one line per wrong key: ``where: key = value: what is allowed``
            (https://docs.pydantic.dev/latest/errors/errors/ for the checks).
    """
    from pydantic import ValidationError

    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors(include_url=False):
            key = _loc(err["loc"]) or "(file)"
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key; " + _allowed(model, err["loc"])
            if err["type"] == "missing":
                need = f" (each entry needs {err['loc'][-1]})" if len(err["loc"]) > 1 else ""
                lines.append(f"{key}: missing key{need}")
                continue
            lines.append(f"{key} = {err.get('input')!r}: {msg}")
        raise InputError(f"{where}: " + "; ".join(dict.fromkeys(lines))) from None


def _allowed(model: Any, loc: tuple[Any, ...]) -> str:
    """``allowed keys: a, b`` of the model holding the key at ``loc``."""
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if hasattr(model, "model_fields") else None
        if field is None:
            break
        inner = getattr(field.annotation, "__args__", (field.annotation,))[0]
        model = inner if hasattr(inner, "model_fields") else model
    names = sorted(getattr(model, "model_fields", {}))
    return f"allowed keys: {', '.join(names)}" if names else "remove it"
