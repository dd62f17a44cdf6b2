"""The matrix file (``pipelines/nightly.toml``): its schema, read into cells.

Format (also documented at the top of ``pipelines/nightly.toml``)::

    [[matrix]]
    target = "digits-cnn"                       # a target name or module:function spec
    quantization = ["none", "fp16", "bf16"]     # each list is one axis; a scalar is one value
    # optional per-entry options: mode = "auto" | "equal" | "allclose" | "budget", ops = true,
    # rtol = 1e-3, atol = 1e-5 (both or neither), dump_mode = "NOT_EQUAL"

Each ``[[matrix]]`` entry expands to the cartesian product of its axes (``pipeline.matrix``);
settings it does not name take the target's default. Duplicate cells are run once.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from parity_tracker.errors import InputError
from parity_tracker.files.toml import load_toml
from parity_tracker.pipeline.matrix import DEFAULT_DUMP_MODE, Cell, expand
from parity_tracker.statuses import BUDGET, RUN_MODES

#: Keys of a ``[[matrix]]`` entry that are options, not setting axes.
OPTION_KEYS = ("target", "mode", "ops", "rtol", "atol", "dump_mode")
#: The ``DumpMode`` names a cell may ask for.
DUMP_MODES = ("NOT", "ALL", "NOT_EQUAL", "FIRST_NOT_EQUAL")
#: The comparison modes of a cell.
CELL_MODES = ("auto", *RUN_MODES)


def _axes(entry: Mapping[str, Any], where: str) -> dict[str, list[str]]:
    axes = {}
    for key, value in entry.items():
        if key in OPTION_KEYS:
            continue
        values = value if isinstance(value, list) else [value]
        if not values or any(isinstance(v, (dict, list)) for v in values):
            raise InputError(f"{where}: {key} must be a value or a non-empty list of values")
        axes[key] = [str(v) for v in values]
    return axes


def _options(entry: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The :class:`Cell` options of a ``[[matrix]]`` entry, validated."""
    from parity_tracker.tolerances import check_pair

    mode = str(entry.get("mode", "auto"))
    if mode not in CELL_MODES:
        raise InputError(f"{where}: mode = {mode!r}; allowed: {', '.join(CELL_MODES)}")
    tol = (entry.get("rtol"), entry.get("atol"))
    if any(v is not None and not isinstance(v, (int, float)) for v in tol):
        raise InputError(f"{where}: rtol and atol must be numbers, got {tol}")
    try:
        pair = check_pair(*tol)
    except ValueError as exc:
        raise InputError(f"{where}: {exc}") from exc
    dump_mode = str(entry.get("dump_mode", DEFAULT_DUMP_MODE)).upper()
    if dump_mode not in DUMP_MODES:
        raise InputError(f"{where}: dump_mode = {dump_mode!r}; allowed: {', '.join(DUMP_MODES)}")
    if mode == BUDGET and pair is not None:
        raise InputError(
            f"{where}: mode = 'budget' takes no rtol/atol (the budget is PyTorch's own error at "
            "the candidate's precision); remove them"
        )
    rtol, atol = pair if pair is not None else (None, None)
    ops = bool(entry.get("ops", False))
    return {"mode": mode, "ops": ops, "rtol": rtol, "atol": atol, "dump_mode": dump_mode}


def _entry_cells(entry: Any, where: str) -> list[Cell]:
    if not isinstance(entry, dict) or "target" not in entry:
        raise InputError(f'{where}: each [[matrix]] entry needs target = "name"')
    options = _options(entry, where)
    return expand(str(entry["target"]), _axes(entry, where), where=where, **options)


def load_matrix(path: str | Path) -> list[Cell]:
    """Every cell of the matrix file at ``path``, in file order, duplicates dropped.

    Raises:
        InputError: the file is missing or malformed TOML (names the file and line), an entry
            names an unknown target or a setting value the target does not allow (names the
            file, the entry's 1-based index, and the allowed values), or the matrix is empty.
    """
    data = load_toml(path)
    unknown = set(data) - {"matrix"}
    if unknown:
        raise InputError(f"{path}: unknown top-level keys {sorted(unknown)}; use [[matrix]]")
    cells: dict[Cell, None] = {}
    for i, entry in enumerate(data.get("matrix", []), start=1):
        for cell in _entry_cells(entry, f"{path} [[matrix]] #{i}"):
            cells.setdefault(cell, None)
    if not cells:
        raise InputError(f"{path}: no [[matrix]] entries; see the format at the top of the file")
    return list(cells)
