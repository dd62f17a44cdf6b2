"""Strict JSON for every writer (issue 13, item 3): RFC 8259 has no NaN and no Infinity.

The one rule, used by every ``--json`` output, ``summary.json``, ``index.json``, ``run.json``
and JSON artifact: a non-finite float (Python or numpy) is written as the JSON string
``"inf"``, ``"-inf"`` or ``"nan"``. Nothing is dropped and every strict parser reads the
document (``json.loads(text, parse_constant=...)`` raising on ``NaN``/``Infinity`` included);
``float(value)`` turns the string back into the number. Finite values are written as they are.
(Charts embedded in HTML pages are not data documents: plotly draws ``null`` as a gap.)
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

#: The strings a non-finite float is written as.
NONFINITE_STRINGS: frozenset[str] = frozenset({"inf", "-inf", "nan"})


def nonfinite_string(x: float) -> str:
    """``"inf"``, ``"-inf"`` or ``"nan"`` for a non-finite float."""
    if math.isnan(x):
        return "nan"
    return "inf" if x > 0 else "-inf"


def strict(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by its string, recursively.

    Mappings become dicts, tuples and lists become lists, numpy scalars become Python
    numbers; anything else is returned as it is (``json.dumps``' ``default`` handles it).
    """
    if isinstance(obj, float | np.floating):
        x = float(obj)
        return x if math.isfinite(x) else nonfinite_string(x)
    if isinstance(obj, bool | np.bool_):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, Mapping):
        return {k: strict(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [strict(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`strict` ``(obj)`` with ``allow_nan=False`` (never non-strict).

    Args:
        obj: the document.
        **kwargs: passed to ``json.dumps`` (``indent``, ``sort_keys``, ``default``, ...).

    Raises:
        TypeError: ``obj`` holds a value JSON cannot encode and no ``default`` was given.
    """
    return json.dumps(strict(obj), allow_nan=False, **kwargs)


def _reject(constant: str) -> Any:
    raise ValueError(f"non-strict JSON: {constant} is not RFC 8259 JSON")


def loads(text: str | bytes) -> Any:
    """``json.loads`` that rejects ``NaN``, ``Infinity`` and ``-Infinity`` (a strict reader).

    Raises:
        ValueError: the text is not strict JSON.
    """
    return json.loads(text, parse_constant=_reject)
