"""The records of a nightly: one :class:`CellResult` per cell, the :class:`NightlyResult`.

Also the cell verdict (:func:`cell_status`, the matrix colour) and the table of changed rows
(:func:`regressions_table`) logged as ``regressions.parquet``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from parity_tracker.analysis.diff import interesting
from parity_tracker.analysis.expected import ExpectedEntry
from parity_tracker.errors import EXIT_INFRA
from parity_tracker.files import jsonio
from parity_tracker.pipeline.matrix import Cell

#: The parent run's one-row-per-cell table (CSV, for MLflow's artifact viewer).
CELLS_CSV = "cells.csv"
#: What makes the nightly's exit code 1 (see ``NightlyResult.exit_code``).
FAIL_ON = ("regression", "mismatch", "never")


@dataclass
class CellResult:
    """The outcome of one cell."""

    cell: Cell
    run_id: str | None = None
    passed: bool = False
    mode: str | None = None
    tensors_failing: int = 0
    unexpected_failing: int = 0
    output_max_abs_diff: float | None = None
    first_divergence: str | None = None
    baseline_run_id: str | None = None
    changes: dict[str, int] = field(default_factory=dict)
    expected_used: list[str] = field(default_factory=list)
    error: str | None = None
    spool_path: str | None = None
    fingerprint: str | None = None
    diff: pa.Table | None = None
    #: the settings the run recorded (the case's own win: a builder may set
    #: ``quantization=bf16`` for a cell whose matrix entry only says ``candidate=bf16``)
    recorded: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the diff table and the recorded settings left out)."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("diff", "cell", "recorded")}
        return {
            "cell": self.cell.name,
            "target": self.cell.target,
            "settings": dict(self.cell.settings),
            **out,
        }


@dataclass
class NightlyResult:
    """The whole nightly: every cell, the digest, and the verdict.

    ``shard`` is ``(I, N)`` for one shard, ``(0, N)`` for a night merged from N shards
    (``pipeline.night.merge_night``); ``night`` is the night id. ``missing_shards`` (``"I/N"``)
    are shards of a merged night that never reported: their cells are unknown, so the night is
    incomplete and fails; ``shard_problems`` (``pipeline.night.pick_shards``: shards disagreeing
    on ``N`` or the matrix, a shard parent not FINISHED) likewise; ``shard_notes`` say which run
    of a shard reported twice was used.
    """

    parent_run_id: str | None
    commit: str | None
    shard: tuple[int, int]
    cells: list[CellResult]
    expired: list[ExpectedEntry]
    fail_on: str
    digest: str = ""
    night: str | None = None
    missing_shards: list[str] = field(default_factory=list)
    shard_notes: list[str] = field(default_factory=list)
    shard_problems: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """False when a shard of a merged night never reported or its shards have problems."""
        return not self.missing_shards and not self.shard_problems

    @property
    def regressions(self) -> int:
        """Regression rows over all cells (``expected`` ones excluded)."""
        return sum(c.changes.get("regression", 0) for c in self.cells)

    @property
    def failed_cells(self) -> list[CellResult]:
        """Cells that could not be built, run or logged."""
        return [c for c in self.cells if c.error]

    @property
    def unexpected_cells(self) -> list[CellResult]:
        """Cells whose verdict (:func:`cell_status`) is fail, regression or error.

        Counted whether or not a baseline exists (a cell with no baseline has no regression,
        yet it fails) and whatever ``fail_on`` says; ``expected`` cells are not counted.
        """
        return [c for c in self.cells if cell_status(c) in UNEXPECTED_CELL_STATUSES]

    @property
    def headline(self) -> str:
        """``PASS``, or ``FAIL`` with the count of cells failing unexpectedly.

        ``PASS`` only when the exit code is 0 and no cell fails unexpectedly; when the exit
        code is 0 (``fail_on`` not met) but cells fail, the headline still says FAIL and why
        the exit code is 0.
        """
        n = len(self.unexpected_cells)
        if not n and not self.exit_code and self.complete:
            return "PASS"
        counted = f"{n} cell{'s' if n != 1 else ''} failing, not expected"
        if self.shard_problems:
            k = len(self.shard_problems)
            counted = f"{k} shard problem{'s' if k != 1 else ''}; {counted}"
        if self.missing_shards:
            counted = f"shard {', '.join(self.missing_shards)} never reported; {counted}"
        if not self.complete:
            counted = f"incomplete: {counted}"
        if self.exit_code:
            return f"FAIL ({counted}; exit {self.exit_code})"
        return f"FAIL ({counted}; exit 0 under --fail-on {self.fail_on})"

    @property
    def spooled(self) -> list[str]:
        """Spool paths of cells the store did not take (upload with ``parity-tracker sync``)."""
        return [c.spool_path for c in self.cells if c.spool_path]

    @property
    def exit_code(self) -> int:
        """The exit code: 0 or 1 by ``fail_on``; 3 when cells were spooled.

        ``regression``: 1 on a regression row, a cell that did not complete, a shard that never
        reported (``missing_shards``), a shard problem (``shard_problems``), or an expired
        expected entry; ``mismatch``: also on any
        failing tensor not marked expected; ``never``: 0 (the headline still says FAIL).
        Whatever ``fail_on`` says, 3 (infrastructure) when cells were spooled.
        """
        if self.spooled:
            return EXIT_INFRA
        if self.fail_on == "never":
            return 0
        bad = self.regressions > 0 or bool(self.failed_cells) or bool(self.expired)
        bad = bad or not self.complete
        if self.fail_on == "mismatch":
            bad = bad or any(c.unexpected_failing for c in self.cells)
        return 1 if bad else 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary."""
        return {
            "parent_run_id": self.parent_run_id,
            "commit": self.commit,
            "shard": f"{self.shard[0]}/{self.shard[1]}",
            "night": self.night,
            "fail_on": self.fail_on,
            "exit_code": self.exit_code,
            "headline": self.headline,
            "complete": self.complete,
            "missing_shards": list(self.missing_shards),
            "shard_notes": list(self.shard_notes),
            "shard_problems": list(self.shard_problems),
            "unexpected_cells": [c.cell.name for c in self.unexpected_cells],
            "regressions": self.regressions,
            "spooled": self.spooled,
            "expired": [e.describe() for e in self.expired],
            "cells": [c.to_dict() for c in self.cells],
        }


def regressions_table(cells: Sequence[CellResult]) -> pa.Table:
    """Every changed or expected row of every cell, with the cell's target, settings and runs."""
    parts = []
    for c in cells:
        if c.diff is None or c.diff.num_rows == 0:
            continue
        rows = interesting(c.diff)
        n = rows.num_rows
        meta = {
            "cell": [c.cell.name] * n,
            "target": [c.cell.target] * n,
            "settings": [jsonio.dumps(dict(c.cell.settings))] * n,
            "run_id": [c.run_id] * n,
            "baseline_run_id": [c.baseline_run_id] * n,
        }
        parts.append(
            pa.table(
                {
                    **{k: pa.array(v, pa.string()) for k, v in meta.items()},
                    **{n_: rows.column(n_) for n_ in rows.column_names},
                }
            )
        )
    if not parts:
        return pa.table(
            {
                k: pa.array([], pa.string())
                for k in (
                    "cell",
                    "target",
                    "settings",
                    "run_id",
                    "baseline_run_id",
                    "tag",
                    "change",
                )
            }
        )
    return pa.concat_tables(parts, promote_options="default")


#: Cell verdicts (:func:`cell_status`) that count as failing unexpectedly in the headline.
UNEXPECTED_CELL_STATUSES = frozenset({"fail", "regression", "error"})


def cell_status(c: CellResult) -> str:
    """The matrix colour of a cell: error, regression, expected, fail or pass."""
    if c.error:
        return "error"
    if c.changes.get("regression"):
        return "regression"
    if c.passed:
        return "pass"
    return "expected" if c.changes.get("expected") and not c.unexpected_failing else "fail"


def read_cells_csv(path: str | Path) -> dict[str, dict[str, str | None]]:
    """A ``cells.csv`` (:func:`cells_table`) read back: ``{cell name: {column: text}}``.

    Every column is read as text (None where empty), cells holding newlines included
    (RFC 4180 quoting, as ``files.csvfiles.write_csv`` writes them).
    """
    import pyarrow.csv as pacsv

    names = ("cell", "status", "run_id", "message")
    table = pacsv.read_csv(
        path,
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(
            column_types=dict.fromkeys(names, pa.string()), include_columns=list(names),
            strings_can_be_null=True,
        ),
    )  # fmt: skip
    return {row["cell"]: row for row in table.to_pylist()}


def cells_table(cells: Sequence[CellResult]) -> pa.Table:
    """One row per cell (``cells.csv`` of the parent run), in the matrix's order.

    Columns: ``cell``, ``target``, ``settings`` (JSON), ``status`` (``cell_status``),
    ``run_id``, ``tensors_failing``, ``output_max_abs_diff``, ``first_divergence``,
    ``regressions``, ``baseline_run_id``, ``message`` (the error, else the expected entries
    applied).
    """
    rows = [
        {"cell": c.cell.name, "target": c.cell.target,
         "settings": jsonio.dumps(dict(c.cell.settings), sort_keys=True), "status": cell_status(c),
         "run_id": c.run_id, "tensors_failing": c.tensors_failing,
         "output_max_abs_diff": c.output_max_abs_diff, "first_divergence": c.first_divergence,
         "regressions": c.changes.get("regression", 0), "baseline_run_id": c.baseline_run_id,
         "message": c.error or "; ".join(c.expected_used) or None}
        for c in cells
    ]  # fmt: skip
    schema = pa.schema(
        [("cell", pa.string()), ("target", pa.string()), ("settings", pa.string()),
         ("status", pa.string()), ("run_id", pa.string()), ("tensors_failing", pa.int64()),
         ("output_max_abs_diff", pa.float64()), ("first_divergence", pa.string()),
         ("regressions", pa.int64()), ("baseline_run_id", pa.string()), ("message", pa.string())]
    )  # fmt: skip
    return pa.Table.from_pylist(rows, schema=schema)
