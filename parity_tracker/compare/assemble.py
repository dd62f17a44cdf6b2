"""A check's :class:`~parity_tracker.compare.results.CheckResult` from its resolved groups.

The results are kept by column (:func:`parity_tracker.compare.pairing.tag_columns`), the
``modules`` table is built from those columns, and a ``TagResult`` record is made only for
the failing results (where the first divergence and the structure differences are chosen, by
:mod:`parity_tracker.compare.verdict`'s rules) and, for the rest, when someone reads
``results`` (issue 19: a passing run of 1,591 rows made 1,591 records only to transpose them
back into columns).
"""

from __future__ import annotations

from typing import Any

from parity_tracker.compare.core import Comparison
from parity_tracker.compare.pairing import (
    first_divergence,
    never_called,
    structure_differences,
    tag_columns,
    verdict_rows,
)
from parity_tracker.compare.results import (
    CheckResult,
    LazyCheckResult,
    result_at,
    result_columns,
)
from parity_tracker.statuses import is_failing


def check_result(
    log: Any,
    mode: str,
    ordered: list[tuple[Any, Comparison, int]],
    paths: dict[int, tuple[str, ...]],
    dump_dir: str | None,
) -> CheckResult:
    """The check's result: ordered groups first, then the never-called modules.

    Args:
        log: the checker's ``CaptureLog`` (duck-typed, see :mod:`compare.pairing`).
        mode: the check's mode.
        ordered: ``(group, comparison, n_tensors)`` in results order (``pairing.order_key``).
        paths: ``{id(group): dump paths}`` of the dumped groups.
        dump_dir: the check's dump folder, relative to ``dump_path`` (``None``: no dump).

    Returns:
        A :class:`LazyCheckResult` (records made on first read of ``results``/``weights``).
    """
    columns = tag_columns(log, ordered, paths)
    extra = never_called(log, mode)
    if extra:
        for name, values in result_columns(extra).items():
            columns[name].extend(values)
    failing = [i for i, c in enumerate(columns["comparison"]) if is_failing(c.status)]
    made = {i: result_at(columns, i) for i in failing}
    rows = verdict_rows(made, failing)  # both rules read failing rows only; built once
    return LazyCheckResult(
        first_divergence=first_divergence(made, rows),
        structure_differences=structure_differences(made, rows),
        passed=not failing,
        mode=mode,
        dump_dir=dump_dir,
        columns=columns,
        made=made,
    )
