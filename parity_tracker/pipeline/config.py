"""The matrix file (``pipelines/nightly.toml``): its schema, read into cells.

Format (also documented at the top of ``pipelines/nightly.toml``)::

    [[matrix]]
    target = "digits-cnn"                       # a target name or module:function spec
    quantization = ["none", "fp16", "bf16"]     # each list is one axis; a scalar is one value
    # optional per-entry options: mode = "auto" | "equal" | "allclose" | "budget", ops = true,
    # rtol = 1e-3, atol = 1e-5 (both or neither), dump_mode = "NOT_EQUAL"

Each ``[[matrix]]`` entry expands to the cartesian product of its axes (``pipeline.matrix``);
settings it does not name take the target's default. Duplicate cells are run once; two cells
with one identity (target and settings, ``Cell.identity``) but other options (``mode``,
``rtol``, ...) or another settings order are refused: a merge could not tell their runs apart.

The file is validated against a declared pydantic schema (:class:`MatrixFile`,
https://docs.pydantic.dev): every wrong type or unknown top-level key is refused with the key,
the value and what is allowed (``ops = "false"`` is not a boolean, ``rtol = true`` is not a
number). The number of cells is computed from the axes before anything is expanded and refused
above ``max_cells`` (default :data:`MAX_CELLS`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    model_validator,
)

from parity_tracker.errors import InputError
from parity_tracker.files.toml import load_toml, validate_model
from parity_tracker.pipeline.matrix import DEFAULT_DUMP_MODE, Cell, expand
from parity_tracker.pipeline.targets import check_spec
from parity_tracker.statuses import BUDGET, RUN_MODES

#: Keys of a ``[[matrix]]`` entry that are options, not setting axes.
OPTION_KEYS = ("target", "mode", "ops", "rtol", "atol", "dump_mode")
#: The ``DumpMode`` names a cell may ask for.
DUMP_MODES = ("NOT", "ALL", "NOT_EQUAL", "FIRST_NOT_EQUAL")
#: The comparison modes of a cell.
CELL_MODES = ("auto", *RUN_MODES)
#: Most cells a matrix may expand to unless ``--max-cells`` raises it (a 1,000 x 1,000 matrix
#: was accepted and ran 886 cells, 1.7 GB, in 90 s before this limit; issue 14).
MAX_CELLS = 1000


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("rtol and atol must be numbers such as 1e-3 (not strings, not true/false)")
    return float(value)


def _target(value: str) -> str:
    return value if ":" not in value else check_spec(value)


def _dump_mode(value: str) -> str:
    if value.upper() not in DUMP_MODES:
        raise ValueError(f"allowed: {', '.join(DUMP_MODES)} (any case)")
    return value.upper()


def _mode(value: str) -> str:
    if value not in CELL_MODES:
        raise ValueError(f"allowed: {', '.join(CELL_MODES)}")
    return value


def _axis(value: Any) -> Any:
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, (str, int, float)) for v in values):
        raise ValueError(
            "a setting must be a value or a non-empty list of values (str, number, bool)"
        )
    return value


Number = Annotated[float, BeforeValidator(_number)]
Axis = Annotated[Any, AfterValidator(_axis)]


class MatrixEntry(BaseModel):
    """One ``[[matrix]]`` entry: the options below, every other key a setting axis."""

    model_config = ConfigDict(extra="allow", frozen=True)
    __pydantic_extra__: dict[str, Axis]  # the setting axes: a value or a non-empty list

    target: Annotated[StrictStr, AfterValidator(_target)]
    mode: Annotated[StrictStr, AfterValidator(_mode)] = "auto"
    ops: StrictBool = False
    rtol: Number | None = None
    atol: Number | None = None
    dump_mode: Annotated[StrictStr, AfterValidator(_dump_mode)] = DEFAULT_DUMP_MODE

    @model_validator(mode="after")
    def _both_or_neither(self) -> MatrixEntry:
        from parity_tracker.compare.tolerances import check_pair

        pair = check_pair(self.rtol, self.atol)  # ValueError: one without the other, negative
        if self.mode == BUDGET and pair is not None:
            raise ValueError(
                "mode = 'budget' takes no rtol/atol (the budget is PyTorch's own error at the "
                "candidate's precision); remove them"
            )
        return self

    def axes(self) -> dict[str, list[str]]:
        """``{setting: [values as strings]}`` (TOML ``true`` becomes ``"True"``, as before)."""
        extra = self.model_extra or {}
        return {
            k: [str(v) for v in (vs if isinstance(vs, list) else [vs])] for k, vs in extra.items()
        }

    def cell_count(self) -> int:
        """The number of cells this entry expands to (product of the axis lengths)."""
        return math.prod(len(v) for v in self.axes().values())


class MatrixFile(BaseModel):
    """The matrix file: a non-empty list of ``[[matrix]]`` entries, nothing else."""

    model_config = ConfigDict(extra="forbid")

    matrix: Annotated[list[MatrixEntry], Field(min_length=1)]


def read_matrix_file(path: str | Path) -> MatrixFile:
    """The validated matrix file (nothing imported, nothing expanded).

    Raises:
        InputError: missing or malformed TOML, a wrong type, an unknown top-level key, a
            malformed target spec, or no ``[[matrix]]`` entry (names key, value, allowed).
    """
    data = load_toml(path)
    unknown = set(data) - {"matrix"}
    if unknown:
        raise InputError(f"{path}: unknown top-level keys {sorted(unknown)}; use [[matrix]]")
    if data.get("matrix", []) == []:
        raise InputError(f"{path}: no [[matrix]] entries; see the format at the top of the file")
    return validate_model(MatrixFile, data, str(path))


def load_matrix(path: str | Path, *, max_cells: int = MAX_CELLS) -> list[Cell]:
    """Every cell of the matrix file at ``path``, in file order, duplicates dropped.

    Args:
        path: the matrix TOML.
        max_cells: refuse a matrix of more cells than this (counted before expansion).

    Raises:
        InputError: the file is invalid (``read_matrix_file``), expands to more than
            ``max_cells`` cells, or an entry names an unknown target or a setting value the
            target does not allow (names the file, the entry's 1-based index, and the allowed
            values); two different cells share one identity (names both).
    """
    data = read_matrix_file(path)
    counts = [entry.cell_count() for entry in data.matrix]
    if sum(counts) > max_cells:
        raise InputError(
            f"{path}: the matrix expands to {sum(counts):,} cells (per entry: {counts[:10]}), "
            f"more than the limit of {max_cells:,}; split it, or raise the limit with "
            "--max-cells"
        )
    cells: dict[Cell, None] = {}
    seen: dict[str, tuple[Cell, str]] = {}
    for i, entry in enumerate(data.matrix, start=1):
        where = f"{path} [[matrix]] #{i}"
        options = entry.model_dump(include=set(OPTION_KEYS) - {"target"})
        for cell in expand(entry.target, entry.axes(), where=where, **options):
            first, at = seen.setdefault(cell.identity, (cell, where))
            if first != cell:
                raise InputError(
                    f"{where}: cell {cell.name} is the same target and settings as cell "
                    f"{first.name} of {at} (other options or settings order); a merge cannot "
                    "tell their runs apart: keep one of them"
                )
            cells.setdefault(cell, None)
    return list(cells)
