"""A run's ``modules`` rows: kept by column, made into dicts only for the steps that read dicts.

The modules table of a run is the check's results (``CheckResult.to_columns``) with the run's
id, each dump path as its artifact path (``tensors/...``) and, after a forward that raised, the
unreached rows' messages naming the exception. A passing run builds its table straight from
those columns (issue 19: no dict per row); the steps that read rows as dicts (the worst
tensor's histogram, isolation, the reproducer, the op-level fallback root cause) ask
:meth:`ModuleRows.rows`, made once from the same columns, and a table asked for after that is
built from those rows, exactly as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from parity_tracker.files.tables import MODULES_SCHEMA, columns_to_table, rows_to_table


class ModuleRows:
    """The modules rows of one run's check, by column until someone asks for dicts.

    Args:
        check: the ``CheckResult``.
        run_id: the run's id (every row's ``run_id``).
        error: the run's error record (``type``, ``message``, ``side``) or None.
    """

    def __init__(self, check: Any, run_id: str, error: Mapping[str, Any] | None) -> None:
        cols = check.to_columns()
        self.num_rows = n = len(cols["tag"])  # the records are not made (LazyCheckResult)
        cols["run_id"] = [run_id] * n
        cols["dump_path"] = [artifact_path(p) if p else p for p in cols["dump_path"]]
        if error:
            absent, note = unreached_note(error)
            cols["message"] = [
                unreached_message(m, note) if s == absent else m
                for m, s in zip(cols["message"], cols["status"], strict=True)
            ]
        self._cols, self._rows = cols, None

    def rows(self) -> list[dict[str, Any]]:
        """The rows as dicts (``MODULES_SCHEMA``'s keys in order), made on the first call."""
        if self._rows is None:
            n, names = self.num_rows, list(self._cols)
            values = [[None] * n if v is None else v for v in self._cols.values()]
            rows = zip(*values, strict=True)  # one value per name in each (no strict zip per row)
            self._rows = [dict(zip(names, row)) for row in rows]  # noqa: B905
        return self._rows

    def replace_rows(self, rows: list[dict[str, Any]]) -> None:
        """Rows changed by a later step (isolation): the table is built from them."""
        self._rows = rows

    def table(self) -> Any:
        """The ``modules`` table: from the dict rows once they exist, else from the columns."""
        if self._rows is not None:
            return rows_to_table(self._rows, MODULES_SCHEMA)
        return columns_to_table(self._cols, self.num_rows, MODULES_SCHEMA)


def artifact_path(path: str | None) -> str | None:
    """``check-NNNN/file.npy`` (relative to dump_path) → ``tensors/file.npy``; empty kept."""
    return "tensors/" + path.split("/", 1)[-1] if path else path


def unreached_note(error: Mapping[str, Any]) -> tuple[str, str]:
    """The status of the rows a raising side never reached, and the note they get."""
    absent = "missing_candidate" if error["side"] == "candidate" else "missing_reference"
    note = f"the {error['side']}'s forward raised {error['type']}: {error['message']}"[:500]
    return absent, note


def unreached_message(message: str | None, note: str) -> str:
    """An unreached row's message: its own, then the note saying the exception stopped it."""
    return f"{message or ''} ({note} before reaching it)".strip()


def with_artifact_paths(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with each ``dump_path`` as its artifact path (:func:`artifact_path`)."""
    return [
        {**row, "dump_path": artifact_path(row["dump_path"])} if row.get("dump_path") else row
        for row in rows
    ]


def with_unreached_named(
    rows: list[dict[str, Any]], error: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """Rows where each one the failed side never reached says the exception stopped it."""
    if not error:
        return rows
    absent, note = unreached_note(error)
    return [
        {**row, "message": unreached_message(row.get("message"), note)}
        if row["status"] == absent
        else row
        for row in rows
    ]


def with_isolation(
    rows: list[dict[str, Any]], local: Mapping[tuple[str, int], Any]
) -> list[dict[str, Any]]:
    """Rows with ``local_status`` / ``local_max_abs_diff`` of module output rows filled.

    ``localize.isolate`` counts a module's calls over the whole run, the table per step: the
    n-th distinct (step, call_index) of a module, in that order, is its n-th call of the run.
    """
    calls: dict[str, list[tuple[int, int]]] = {}
    for row in rows:
        if row["kind"] == "output" and row["module"] is not None:
            key = (row["step"] or 0, row["call_index"] or 0)
            if key not in calls.setdefault(row["module"], []):
                calls[row["module"]].append(key)
    index = {
        (m, step, ci): n for m, keys in calls.items() for n, (step, ci) in enumerate(sorted(keys))
    }
    out = []
    for row in rows:
        if row["kind"] == "output" and row["module"] is not None:
            n = index[(row["module"], row["step"] or 0, row["call_index"] or 0)]
            if (row["module"], n) in local:
                status, diff = local[(row["module"], n)]
                row = {**row, "local_status": status, "local_max_abs_diff": diff}
        out.append(row)
    return out
