"""The one rule for paths read from files that someone else could have written (issues 14, 20).

An index (``index.json`` of a dump, ``run.json`` of a spool entry, a downloaded artifact
folder, a reproducer folder) names files relative to its folder. :func:`resolve_inside` is the
only way this package turns such a name into a path: the result must lie inside the folder
after every symlink is resolved, or the name is refused with ``InputError``. Absolute names,
``..`` escapes, NUL bytes and symlinks that point out of the folder are all refused.
"""

from __future__ import annotations

import os
from pathlib import Path

from parity_tracker.errors import InputError


def resolve_inside(
    root: str | os.PathLike[str], name: object, *, what: str = "path", root_name: str = "folder"
) -> Path:
    """``root / name`` resolved (symlinks followed), refused when it leaves ``root``.

    Args:
        root: the folder the name is relative to.
        name: the name read from an index (anything: a non-string is refused).
        what: what the name is, for the message (``"file of tag checker_fc1"``).
        root_name: what the folder is, for the message (``"dump folder"``).

    Returns:
        The resolved absolute path, inside ``root.resolve()`` (it need not exist).

    Raises:
        InputError: ``name`` is not a non-empty string, holds a NUL byte, is absolute, or
            resolves outside ``root`` (through ``..`` or a symlink); the message names the
            folder, the name and the rule.
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        raise InputError(f"{root}: {what} {name!r} is not a relative file name")
    if os.path.isabs(name) or Path(name).is_absolute():
        raise InputError(
            f"{root}: {what} {name!r} is absolute, so it leaves the {root_name}; "
            "use a name relative to the folder"
        )
    base = Path(root).resolve()
    path = (base / name).resolve()
    if not path.is_relative_to(base):
        raise InputError(
            f"{root}: {what} {name!r} leaves the {root_name} (it resolves to {path}); "
            "only names inside the folder (no '..', no symlink leaving it) are read"
        )
    return path


def check_tree_inside(root: str | os.PathLike[str]) -> None:
    """Refuse a folder holding a symlink that points outside it (before uploading or reading it).

    Raises:
        InputError: a symlink under ``root`` resolves outside ``root`` (names it).
    """
    base = Path(root)
    for dirpath, dirnames, filenames in os.walk(base):
        for name in (*dirnames, *filenames):
            path = Path(dirpath) / name
            if path.is_symlink():
                resolve_inside(base, str(path.relative_to(base)), what="symlink")
