"""Where a run's dumped tensors live, and when the folder ``run_parity`` chose is removed.

``run_parity`` dumps (mismatched tensors, reproducer material) under ``dump_path``; without one
it chooses ``run.run.default_dump_root() / <parity run id>`` in the system temporary folder.
That folder is the run's own scratch copy: once the tensors are stored durably — uploaded as
the MLflow run's ``tensors/`` artifacts, or copied into the spool with the run
(``track.log``) — :func:`discard_default_dump` removes it, so runs leave no orphaned temporary
data. A folder the caller passed as ``dump_path`` is never removed, and nothing is removed
before the tensors are stored: a crash or a failed upload leaves the dump on disk.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any


def default_dump_folder(result: Any) -> Path | None:
    """The folder ``run_parity`` chose for ``result``'s dump, or None when the caller chose it.

    Args:
        result: a ``RunResult`` (``run_id``, ``dump_dir``).

    Returns:
        ``default_dump_root() / result.run_id`` when ``result.dump_dir`` lies inside it, else
        None (nothing dumped, or dumped under a ``dump_path`` the caller gave).
    """
    from parity_tracker.run.run import default_dump_root

    dump = getattr(result, "dump_dir", None)
    if dump is None or not getattr(result, "run_id", None):
        return None
    own = (default_dump_root() / str(result.run_id)).resolve()
    path = Path(dump).resolve()
    return own if path == own or own in path.parents else None


def discard_default_dump(result: Any) -> Path | None:
    """Remove the dump folder ``run_parity`` chose for ``result`` (call once it is stored).

    Sets ``result.dump_dir`` to None (the tensors are in the store under ``tensors/``, as for a
    run loaded from the store), and removes ``default_dump_root()`` too once it is empty.
    Removes nothing when the caller chose the folder.

    Args:
        result: a ``RunResult`` whose tensors were uploaded or spooled.

    Returns:
        The removed folder, or None when nothing was removed.
    """
    own = default_dump_folder(result)
    if own is None:
        return None
    shutil.rmtree(own, ignore_errors=True)
    result.dump_dir = None
    with contextlib.suppress(OSError):  # only when empty: another run's dump keeps it
        own.parent.rmdir()
    return own
