"""Compare one reference tensor with one candidate tensor (design.md, "Comparison semantics").

PROVISIONAL minimal implementation: the full comparison core (issue 2) replaces the body of
``compare_tensors`` but keeps ``Comparison``'s fields (new fields may be added at the end).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch

Status = Literal[
    "equal",
    "close",
    "mismatch",
    "shape_mismatch",
    "missing_reference",
    "missing_candidate",
    "skipped",
    "error",
]
PASSING = frozenset({"equal", "close"})
STATUSES = (
    "equal",
    "close",
    "mismatch",
    "shape_mismatch",
    "missing_reference",
    "missing_candidate",
    "skipped",
    "error",
)


@dataclass(frozen=True)
class Comparison:
    """The verdict and metrics for one reference/candidate pair.

    Field names are the comparison columns of the ``modules`` and ``ops`` tables.
    Metrics are ``None`` where they do not apply (never NaN as a stand-in).
    """

    status: str
    mode: str
    numel: int | None = None
    ref_shape: tuple[int, ...] | None = None
    cand_shape: tuple[int, ...] | None = None
    ref_dtype: str | None = None
    cand_dtype: str | None = None
    ref_device: str | None = None
    cand_device: str | None = None
    mismatch_count: int | None = None
    max_abs_diff: float | None = None
    max_abs_diff_index: tuple[int, ...] | None = None
    max_rel_diff: float | None = None
    max_rel_diff_index: tuple[int, ...] | None = None
    mean_abs_diff: float | None = None
    cosine: float | None = None
    sqnr_db: float | None = None
    max_ulp: float | None = None
    ref_nan: int | None = None
    cand_nan: int | None = None
    ref_inf: int | None = None
    cand_inf: int | None = None
    ref_hash: str | None = None
    cand_hash: str | None = None
    rtol: float | None = None
    atol: float | None = None
    message: str = ""

    @property
    def passed(self) -> bool:
        """True when the status is ``equal`` or ``close``."""
        return self.status in PASSING

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (tuples kept), ready for a table row."""
        return asdict(self)


def missing(side: str, mode: str, other: Any = None) -> Comparison:
    """A ``missing_reference`` / ``missing_candidate`` record; ``side`` names the absent side."""
    status = f"missing_{side}"
    return Comparison(status=status, mode=mode, message=f"no {side} tensor registered")


def compare_tensors(
    reference: Any,
    candidate: Any,
    *,
    mode: str = "equal",
    rtol: float | None = None,
    atol: float | None = None,
) -> Comparison:
    """PROVISIONAL: equal / allclose on plain CPU tensors; replaced by the comparison core."""
    r = torch.as_tensor(reference).detach().cpu()
    c = torch.as_tensor(candidate).detach().cpu()
    base = dict(
        mode=mode,
        numel=r.numel(),
        ref_shape=tuple(r.shape),
        cand_shape=tuple(c.shape),
        ref_dtype=str(r.dtype).removeprefix("torch."),
        cand_dtype=str(c.dtype).removeprefix("torch."),
    )
    if r.shape != c.shape:
        return Comparison(status="shape_mismatch", message="shapes differ", **base)
    if r.dtype == c.dtype and torch.equal(r, c):
        return Comparison(status="equal", mismatch_count=0, max_abs_diff=0.0, **base)
    d = (r.double() - c.double()).abs()
    mx = float(d.max()) if d.numel() else 0.0
    rtol = 1.3e-6 if rtol is None else rtol
    atol = 1e-5 if atol is None else atol
    bad = ~torch.isclose(c.double(), r.double(), rtol=rtol, atol=atol, equal_nan=True)
    status = "close" if mode == "allclose" and not bad.any() else "mismatch"
    return Comparison(
        status=status,
        mismatch_count=int(bad.sum()),
        max_abs_diff=0.0 if math.isnan(mx) else mx,
        rtol=rtol,
        atol=atol,
        **base,
    )
