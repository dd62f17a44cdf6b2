"""Whether two runs being diffed share one configuration, and if not, what differs.

A diff of runs of different configurations (another target, setting, comparison mode or
tolerance) reports changes that come from the configuration, not from the code under test:
``diff`` warns with :func:`config_differences`. The settings compared are those of the config
fingerprint (``run.mode.NOT_FINGERPRINTED`` left out: environment, measured params), plus the
judged ``mode`` (``run.mode.baseline_params``: part of the baseline key), plus the tolerances
the two tables applied to the tags they share.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from parity_tracker.run.mode import NOT_FINGERPRINTED

#: How many tags a tolerance difference names (the count is always given in full).
_TOLERANCE_EXAMPLES = 3


def _text(value: Any) -> str:
    return "(absent)" if value is None else str(value)


def _tol(value: float | None) -> str:
    """A tolerance as text; ``none`` where none was applied (null: equal or budget rows)."""
    return "none" if value is None else f"{value:g}"


def setting_differences(base: Mapping[str, Any], head: Mapping[str, Any]) -> list[str]:
    """``"KEY: BASE -> HEAD"`` for the mode and every fingerprinted setting that differs.

    Values are compared as text (MLflow params are strings); a key on one side only shows
    ``(absent)`` on the other. The mode comes first, then the settings sorted by key.

    Args:
        base: the base run's settings (``track.RunInfo.settings``: params with ``mode``).
        head: the head run's settings.
    """
    out = []
    if _text(base.get("mode")) != _text(head.get("mode")):
        out.append(f"mode: {_text(base.get('mode'))} -> {_text(head.get('mode'))}")
    keys = sorted((set(base) | set(head)) - NOT_FINGERPRINTED)
    for key in keys:
        old, new = _text(base.get(key)), _text(head.get(key))
        if old != new:
            out.append(f"{key}: {old} -> {new}")
    return out


def _tolerances(table: pa.Table, prefix: str) -> pa.Table:
    """``tag``, ``step`` (nulls as 0) and the rtol/atol of one run, renamed with ``prefix``."""
    n = table.num_rows
    step = table.column("step") if "step" in table.column_names else pa.nulls(n, pa.int32())
    cols = {"tag": table.column("tag"), "step": pc.fill_null(step.cast(pa.int32()), 0)}
    for name in ("rtol", "atol"):
        has = name in table.column_names
        col = table.column(name).cast(pa.float64()) if has else pa.nulls(n, pa.float64())
        cols[prefix + name] = col
    return pa.table(cols)


def tolerance_differences(base: pa.Table, head: pa.Table) -> list[str]:
    """One line when the two ``modules`` tables applied other rtol/atol to shared tags.

    Rows are joined on (tag, step); a pair differs when rtol or atol differ, a null (no
    tolerance applied: equal mode) differing from any number.

    Returns:
        ``[]`` when every shared tag had the same tolerances, else one line such as
        ``"tolerances (rtol/atol): 3 of 10 shared tags, e.g. model.fc: 0.001/1e-05 ->
        0.01/1e-05"``.
    """
    if base.num_rows == 0 or head.num_rows == 0:
        return []
    joined = _tolerances(base, "b_").join(
        _tolerances(head, "h_"), keys=["tag", "step"], join_type="inner"
    )
    if joined.num_rows == 0:
        return []
    differs = None
    for name in ("rtol", "atol"):
        b, h = joined.column("b_" + name), joined.column("h_" + name)
        same = pc.or_kleene(
            pc.and_kleene(pc.is_null(b), pc.is_null(h)), pc.fill_null(pc.equal(b, h), False)
        )
        d = pc.invert(pc.fill_null(same, False))
        differs = d if differs is None else pc.or_(differs, d)
    rows = joined.filter(differs).sort_by([("tag", "ascending"), ("step", "ascending")])
    if rows.num_rows == 0:
        return []
    examples = ", ".join(
        f"{r['tag']}: {_tol(r['b_rtol'])}/{_tol(r['b_atol'])} -> "
        f"{_tol(r['h_rtol'])}/{_tol(r['h_atol'])}"
        for r in rows.slice(0, _TOLERANCE_EXAMPLES).to_pylist()
    )
    return [
        f"tolerances (rtol/atol): {rows.num_rows} of {joined.num_rows} shared tags, e.g. {examples}"
    ]


def config_differences(
    base_settings: Mapping[str, Any] | None,
    head_settings: Mapping[str, Any] | None,
    base_modules: pa.Table | None = None,
    head_modules: pa.Table | None = None,
) -> list[str]:
    """Everything that makes the two runs' configurations differ; ``[]`` when they share one.

    Args:
        base_settings: the base run's settings (None: unknown, e.g. a bare table; then no
            setting is compared).
        head_settings: the head run's settings (None: unknown).
        base_modules: the base run's ``modules`` table (for the tolerances), or None.
        head_modules: the head run's ``modules`` table, or None.

    Returns:
        One line per difference (:func:`setting_differences`, then
        :func:`tolerance_differences`).
    """
    out: list[str] = []
    if base_settings is not None and head_settings is not None:
        out += setting_differences(base_settings, head_settings)
    if base_modules is not None and head_modules is not None:
        out += tolerance_differences(base_modules, head_modules)
    return out
