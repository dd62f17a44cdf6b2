"""Error budgets: is the candidate's difference a bug, or rounding PyTorch itself would make?

Issue 15. A ``budget`` comparison has three sides of one tag:

- **golden**: the reference computed in float64 (:mod:`parity_tracker.capture.golden`);
- **twin**: the reference computed the way PyTorch computes it at the candidate's precision
  (:mod:`parity_tracker.capture.twin`; the reference itself when the candidate has its dtype);
- **candidate**.

The one formula (:func:`error_ratio`)::

    e_cand = max |candidate − golden|          (golden_max_abs_err)
    e_twin = max |twin − golden|               (twin_max_abs_err)
    floor  = eps(compared dtype) · max |golden|   (one ULP at the tag's largest magnitude)
    error_ratio = e_cand / max(e_twin, floor)

and the tag is within budget exactly when ``error_ratio ≤ k`` (:func:`budget_status`: the
verdict is derived from the ratio alone, plus bitwise equality with the reference for
``equal``, so the two can never disagree). ``k`` defaults to :data:`DEFAULT_K` = 2, the bound
of FlashAttention's tests: the output error of the kernel against a float32 reference is
asserted to be at most twice the error of PyTorch's own implementation at bf16/fp16 against
that reference (Dao-AILab/flash-attention, ``tests/test_flash_attn.py``:
``assert (out - out_ref).abs().max().item() <= 2 * (out_pt - out_ref).abs().max().item()``).

The compared dtype is the lower-precision one of the candidate and the twin (larger
``torch.finfo(dtype).eps``), as
:func:`parity_tracker.compare.tolerances.default_tolerances` lets the lower-precision side
win. Integer and bool sides have no eps: their floor is 0.

Non-finite values (never a NaN ratio):

- an element is exact (error 0) when it equals the golden element, NaN matching NaN and
  ±inf matching the same-signed inf; any other non-finite element (the side loses a value the
  golden has, or has a finite value where the golden has none) has error ``+inf``;
- the floor uses the largest FINITE ``|golden|`` (0 when none is finite);
- ``0 / anything = 0``; ``x / 0 = +inf`` for ``x > 0``; ``finite / inf = 0``; and when both
  ``e_cand`` and ``e_twin`` are ``+inf`` (both lose values, e.g. an fp16 overflow PyTorch
  makes too) the ratio is the number of elements the candidate loses over the number the
  twin loses (1.0: as many as PyTorch at that precision);
- amended 2026-12-01 (w9brk1): when the twin loses values at a tag and its elements are at
  hand (a tensor, not an :class:`ErrorScan`), the ratio is the larger of the rule above and
  the same ratio over the elements where the twin's error is finite (:func:`_kept_errors`):
  one fp16 overflow of PyTorch no longer excuses a candidate that is wrong everywhere else.

``error_ratio`` may therefore be ``+inf`` (a candidate that loses values PyTorch keeps, or any
error where the golden and the twin are exact and zero); writers of strict JSON must map it.

The twin need not be kept: :func:`side_error` reduces its value of a tag to an
:class:`ErrorScan` (a few numbers) as soon as it is captured, and :func:`budget_compare`
accepts that scan in place of the twin's tensor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from parity_tracker.compare.budget_k import DEFAULT_K as DEFAULT_K
from parity_tracker.compare.budget_scan import fast_scan
from parity_tracker.compare.budget_scan import loaded as scan_loaded
from parity_tracker.compare.convert import _plain, to_tensor
from parity_tracker.compare.core import Comparison, compare_tensors
from parity_tracker.compare.hashing import content_hash, dtype_name
from parity_tracker.compare.metrics import flat
from parity_tracker.compare.tolerances import first_match
from parity_tracker.errors import InputError

MODE = "budget"
CHUNK = 1 << 20
"""Elements per chunk of :func:`budget_floor` (8 MiB per float64 chunk)."""
SCAN_CHUNK = 1 << 18
"""Elements per chunk of the error pass (:func:`max_abs_err`): one 2 MiB float64 scratch
chunk, reused (measured fastest of 2^14..2^20 on a bf16 side, one thread)."""
SMALL = 1 << 16
"""Up to this many elements a real side is scanned in whole-tensor ops (:func:`_small_scan`;
its fresh float64 tensor is at most 512 KiB): the fixed cost per tag, not bandwidth, rules."""


def check_k(k: float, what: str = "k") -> float:
    """Validate a budget factor: a finite number ≥ 1.

    Below 1, a candidate bitwise identical to the twin (ratio 1) would be over budget.

    Raises:
        InputError: when ``k`` is not a finite number ≥ 1 (names ``what`` and the value).
    """
    try:
        value = float(k)
    except (TypeError, ValueError):
        raise InputError(f"{what} must be a number >= 1, got {k!r}") from None
    if not (math.isfinite(value) and value >= 1.0):
        raise InputError(
            f"{what} must be a finite number >= 1 (a candidate identical to PyTorch at its "
            f"precision has error_ratio 1), got {k!r}"
        )
    return value


class Budgets:
    """Resolves the budget factor ``k`` of one tag: explicit > first matching glob > default.

    Globs follow :func:`parity_tracker.compare.tolerances.first_match` (the package's one
    per-tag glob rule: ``fnmatch``, case-sensitive, first pattern in the given order wins).

    Args:
        overrides: mapping (or iterable of pairs) from glob pattern to ``k``.
        k: the factor of tags without an override (default :data:`DEFAULT_K`).

    Raises:
        InputError: when a ``k`` is not a finite number ≥ 1.
    """

    def __init__(
        self,
        overrides: Mapping[str, float] | Iterable[tuple[str, float]] | None = None,
        *,
        k: float = DEFAULT_K,
    ) -> None:
        items = overrides.items() if isinstance(overrides, Mapping) else (overrides or ())
        self.overrides = [(str(p), check_k(v, f"budget k for {p!r}")) for p, v in items]
        self.default = check_k(k)

    def resolve(self, tag: str | None, k: float | None = None) -> float:
        """The ``k`` of ``tag``: ``k`` when given, else the first matching override or default."""
        if k is not None:
            return check_k(k)
        found = first_match(self.overrides, tag)
        return self.default if found is None else found


@dataclass(frozen=True)
class ErrorScan:
    """One side's error against the golden: all a budget needs to keep of the twin.

    Attributes:
        max_abs_err: ``max |side − golden|`` in float64 (``+inf`` when the side loses a value;
            module docstring gives the non-finite rule); 0.0 for an empty tensor; ``None``
            when ``problem`` is set.
        lost: elements where the golden is finite and the side is not, or the other way round.
        dtype: the side's dtype as compared (its eps enters the floor); ``None`` with
            ``problem``.
        problem: why the error could not be computed (no data, shape differs), else ``""``.
        golden_max: the largest finite ``|golden|`` (0.0 when none is finite), read in the
            same pass when asked (``max_abs_err(..., golden_max=True)``), else ``None``; the
            floor is ``eps · golden_max`` (:func:`budget_floor` without a pass of its own).
        side_hash: the side's :func:`~parity_tracker.compare.hashing.content_hash` when asked
            (``side_error(..., digest=True)``), else ``None``: a candidate with the same
            content hash (``Comparison.cand_hash``) has this very error against the golden.
    """

    max_abs_err: float | None
    lost: int = 0
    dtype: torch.dtype | None = None
    problem: str = ""
    golden_max: float | None = None
    side_hash: str | None = None


def max_abs_err(side: torch.Tensor, golden: torch.Tensor, *, golden_max: bool = False) -> ErrorScan:
    """``max |side − golden|`` computed in float64 (complex128 for complex), chunk by chunk.

    A real side is widened into one reused float64 scratch chunk (``copy_``: the exact
    conversion ``.to(torch.float64)`` makes) and the golden subtracted in place: the same
    float64 differences as widening into fresh tensors, without allocating (and page-faulting)
    two chunk-sized temporaries per chunk (3-4× faster on a bf16 side). Complex sides take the
    plain path. A finite real side of at most :data:`SMALL` elements is scanned in
    whole-tensor ops instead (:func:`_small_scan`: the same differences and maxima; by the
    compiled loop once it is loaded, :func:`_small_fast`, when no maximum is zero); a larger
    finite float32 / float64 / bfloat16 side in one compiled loop when numba is installed
    (:func:`~parity_tracker.compare.budget_scan.fast_scan`: the same differences and maxima).

    Args:
        side: a dense CPU tensor of the golden's shape, any dtype.
        golden: the float64 golden, dense CPU tensor.
        golden_max: also read the largest finite ``|golden|`` in the same pass
            (:attr:`ErrorScan.golden_max`).

    Returns:
        An :class:`ErrorScan`; non-finite elements follow the module docstring's rule.
    """
    s, g = flat(side), flat(golden)
    wide = torch.complex128 if (s.is_complex() or g.is_complex()) else torch.float64
    real = wide == torch.float64
    if real and 0 < s.numel() <= SMALL and g.dtype == wide:
        found = _small_fast(s, g, golden_max, side.dtype) or _small_scan(
            s, g, golden_max, side.dtype
        )
        if found is not None:
            return found
    elif real and (fast := fast_scan(s, g)) is not None:  # one compiled loop (numba)
        return ErrorScan(
            max(0.0, fast[0]), 0, side.dtype, golden_max=fast[1] if golden_max else None
        )
    scratch = torch.empty(min(SCAN_CHUNK, s.numel()), dtype=wide) if real else None
    worst, lost, top_g = 0.0, 0, 0.0
    for lo in range(0, s.numel(), SCAN_CHUNK):
        a, b = s[lo : lo + SCAN_CHUNK], g[lo : lo + SCAN_CHUNK].to(wide)
        if real:
            top = _max_abs(scratch[: a.numel()].copy_(a).sub_(b))
        else:
            a = a.to(wide)
            top = _max_abs(a - b)
        if not math.isfinite(top):  # rare: a non-finite element on either side
            top, bad = _non_finite(a.to(wide), b)
            lost += bad
        worst = max(worst, top)
        if golden_max:
            top_g = max(top_g, _finite_abs_max(b))
    return ErrorScan(worst, lost, side.dtype, golden_max=top_g if golden_max else None)


def _small_fast(s: torch.Tensor, g: torch.Tensor, golden_max: bool, dtype) -> ErrorScan | None:
    """:func:`_small_scan`'s result from the compiled loop when it is loaded, else ``None``.

    The loop (:func:`~parity_tracker.compare.budget_scan.fast_scan`) reads the same float64
    differences and golden values and returns the exact maxima of their magnitudes, which are
    :func:`_small_scan`'s ``max(-min, max)`` whenever they are not zero. A zero maximum (every
    difference, or every golden value, ±0.0) returns ``None``: its sign is whatever zero
    ``torch.aminmax`` picks, so the whole-tensor path keeps deciding it. Used only once the
    scan is loaded (:func:`~parity_tracker.compare.budget_scan.loaded`): ≈ 6 against 11 µs for
    128 elements, 11 against 24 µs for 16 Ki (bf16 side, one thread).
    """
    if not scan_loaded():
        return None
    fast = fast_scan(s, g)
    if fast is None or not fast[0] > 0.0 or (golden_max and not fast[1] > 0.0):
        return None
    return ErrorScan(fast[0], 0, dtype, golden_max=fast[1] if golden_max else None)


def _small_scan(s: torch.Tensor, g: torch.Tensor, golden_max: bool, dtype) -> ErrorScan | None:
    """:func:`max_abs_err` of a small real pair in whole-tensor ops, ``None`` if not finite.

    The same float64 differences (``s.to(float64)``: the exact widening, then ``sub_``) and
    the same ``aminmax`` maxima as the chunked pass, with one read-back (``tolist``) instead of
    per-chunk slicing, scratch and four scalar reads: ≈ 21 against 32 µs for 16 Ki elements.
    A pair with a non-finite difference or golden element returns ``None`` (the chunked pass
    then applies the module's non-finite rule).
    """
    d = s.to(torch.float64, copy=True).sub_(g)  # copy: a float64 side is never written
    lo, hi = torch.aminmax(d)
    parts = (lo, hi, *torch.aminmax(g)) if golden_max else (lo, hi)
    values = torch.stack(parts).tolist()
    if not all(map(math.isfinite, values)):
        return None
    worst = max(-values[0], values[1]) + 0.0  # + 0.0: a max |Δ| is never -0.0 (lo = hi = 0)
    top_g = max(-values[2], values[3]) + 0.0 if golden_max else None
    return ErrorScan(worst, 0, dtype, golden_max=top_g)


def _finite_abs_max(g: torch.Tensor) -> float:
    """The largest finite ``|g|`` of a non-empty float64 chunk (0.0 when none is finite)."""
    if not g.is_complex():
        lo, hi = (float(x) for x in torch.aminmax(g))
        if math.isfinite(lo) and math.isfinite(hi):
            return max(-lo, hi)
    a = g.abs()
    m = float(a.max())
    if not math.isfinite(m):  # rare: keep the finite elements only
        a = a[torch.isfinite(a)]
        m = float(a.max()) if a.numel() else 0.0
    return m


def _max_abs(d: torch.Tensor) -> float:
    """``max |d|`` of a non-empty float64/complex128 tensor; NaN when ``d`` holds a NaN.

    Real: one ``aminmax`` pass (``max(-min, max)``) instead of ``abs`` then ``max``.
    """
    if d.is_complex():
        return float(d.abs().max())
    lo, hi = (float(x) for x in torch.aminmax(d))
    return math.nan if math.isnan(lo) or math.isnan(hi) else max(-lo, hi)


def _non_finite(a: torch.Tensor, b: torch.Tensor) -> tuple[float, int]:
    """``(max error, elements lost)`` of a chunk holding a non-finite element.

    Equal elements (NaN matching NaN, ±inf the same inf) have error 0; any other non-finite
    difference counts as lost, error ``+inf`` (module docstring).
    """
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    d = torch.where(same, 0.0, (a - b).abs().to(torch.float64))
    bad = ~torch.isfinite(d)
    lost = int(bad.sum())
    return (math.inf if lost else float(d.max())), lost


def _golden64(golden: Any) -> torch.Tensor | str:
    """The golden as a dense CPU float64 (complex128) tensor, or why it cannot be used."""
    if type(golden) is torch.Tensor and golden.dtype == torch.float64 and _plain(golden):
        return golden.detach() if golden.requires_grad else golden  # to_tensor's own answer
    g = to_tensor(golden, "golden")
    if g.status:
        return f"golden: {g.message or g.status}"
    return g.tensor.to(torch.complex128 if g.tensor.is_complex() else torch.float64)


def _side_error(
    golden64: torch.Tensor, side: Any, name: str, golden_max=False, digest=False
) -> ErrorScan:
    s = to_tensor(side, name)
    if s.status:
        return ErrorScan(None, problem=f"{name}: {s.message or s.status}")
    if s.tensor.shape != golden64.shape:
        return ErrorScan(
            None,
            problem=(
                f"golden shape {tuple(golden64.shape)} differs from the {name}'s "
                f"{tuple(s.tensor.shape)}; the budget needs one shape on all three sides"
            ),
        )
    scan = max_abs_err(s.tensor, golden64, golden_max=golden_max or digest)
    if not digest:
        return scan
    h = content_hash(s.tensor)  # the constructor, not dataclasses.replace (≈ 3 µs less)
    return ErrorScan(
        scan.max_abs_err, scan.lost, scan.dtype, golden_max=scan.golden_max, side_hash=h
    )


def side_error(golden: Any, side: Any, name: str = "twin", *, digest: bool = False) -> ErrorScan:
    """Reduce one side's value of a tag to its error against the golden.

    Call it for the twin as soon as the twin's value is captured, then keep only the
    :class:`ErrorScan` (a few numbers) and pass it to :func:`budget_compare` as ``twin``.

    Args:
        golden: the tag's golden value (any input :func:`parity_tracker.compare.convert.to_tensor`
            accepts; promoted to float64).
        side: the side's value, of the golden's shape.
        name: the side's name for messages.
        digest: also keep the side's content hash and the golden's largest finite magnitude
            (:attr:`ErrorScan.side_hash`, :attr:`ErrorScan.golden_max`): one more read of
            the side (xxh3, several GB/s), so that :func:`budget_compare` skips the
            candidate's own error pass when the candidate is bitwise this side.

    Returns:
        An :class:`ErrorScan`; ``problem`` says why it could not be computed (never raises).
    """
    golden64 = _golden64(golden)
    if isinstance(golden64, str):
        return ErrorScan(None, problem=golden64)
    return _side_error(golden64, side, name, digest=digest)


def compared_eps(*dtypes: torch.dtype) -> float:
    """``torch.finfo(dtype).eps`` of the lowest-precision floating dtype given.

    0.0 when none is floating or complex (integers and bools are exact).
    """
    eps = [float(torch.finfo(d).eps) for d in dtypes if d.is_floating_point or d.is_complex]
    return max(eps, default=0.0)


def budget_floor(golden: torch.Tensor, eps: float) -> float:
    """``eps · max |golden|`` over the golden's finite elements (0.0 when none is finite).

    Read chunk by chunk (:data:`CHUNK` elements), so the extra memory is one chunk.
    """
    g, top = flat(golden), 0.0
    for lo in range(0, g.numel(), CHUNK):
        a = g[lo : lo + CHUNK].abs()
        m = float(a.max()) if a.numel() else 0.0
        if not math.isfinite(m):  # rare: keep the finite elements only
            a = a[torch.isfinite(a)]
            m = float(a.max()) if a.numel() else 0.0
        top = max(top, m)
    return eps * top


def error_ratio(cand: ErrorScan, twin: ErrorScan, floor: float) -> float:
    """``e_cand / max(e_twin, floor)``, never NaN (module docstring gives the conventions).

    Args:
        cand: the candidate's error against the golden.
        twin: the twin's error against the golden.
        floor: ``eps(compared dtype) · max |golden|`` (:func:`budget_floor`).
    """
    e_cand, den = cand.max_abs_err, max(twin.max_abs_err, floor)
    if e_cand == 0.0:
        return 0.0
    if den == 0.0:
        return math.inf
    if math.isinf(e_cand) and math.isinf(den):
        return cand.lost / twin.lost
    return e_cand / den


def budget_status(ratio: float, k: float, bitwise_equal: bool) -> str:
    """The budget verdict, from the ratio alone (plus equality for ``equal``).

    ``mismatch`` when ``ratio > k``, else ``equal`` when the candidate equals the reference
    (``compare_tensors`` ``equal`` semantics), else ``close``.
    """
    if ratio > k:
        return "mismatch"
    return "equal" if bitwise_equal else "close"


@dataclass(frozen=True)
class BudgetComparison:
    """The budget verdict of one tag and its numbers.

    Attributes:
        status: ``equal``, ``close`` or ``mismatch`` (:func:`budget_status`), or the status of
            an unusable pair (``shape_mismatch``, ``skipped``, ``error``) with budget numbers
            ``None``.
        k: the budget factor used.
        golden_max_abs_err: ``e_cand = max |candidate − golden|``.
        twin_max_abs_err: ``e_twin = max |twin − golden|``.
        floor: ``eps(compared dtype) · max |golden|``.
        error_ratio: ``e_cand / max(e_twin, floor)``; may be ``+inf``, never NaN.
        compared_dtype: name of the dtype whose eps gives the floor (``None``: no float side).
        comparison: the usual candidate-vs-reference record (``max_abs_diff``, ...), with
            ``mode="budget"`` and this record's status and message.
        message: the verdict in words.
    """

    status: str
    k: float
    golden_max_abs_err: float | None
    twin_max_abs_err: float | None
    floor: float | None
    error_ratio: float | None
    compared_dtype: str | None
    comparison: Comparison
    message: str

    @property
    def passed(self) -> bool:
        """True when the status is ``equal`` or ``close``."""
        return self.comparison.passed

    def columns(self) -> dict[str, Any]:
        """The three budget columns of the ``modules``/``ops`` tables (issue 15)."""
        return {
            "golden_max_abs_err": self.golden_max_abs_err,
            "twin_max_abs_err": self.twin_max_abs_err,
            "error_ratio": self.error_ratio,
        }


def _g(x: float) -> str:
    return f"{x:.4g}"


def _verdict_message(status: str, e_c: float, e_t: float, floor: float, ratio: float, k, dtype):
    den = max(e_t, floor)
    if status == "equal":
        return f"bitwise equal to the reference (error_ratio {_g(ratio)} <= k={_g(k)})"
    where = "within" if status == "close" else "over"
    # the ratio names its denominator: PyTorch's own error, or the floor when that is larger
    base = (
        f"PyTorch's own error at {dtype}"
        if e_t >= floor
        else f"the floor eps·max|golden| (PyTorch's own error at {dtype} is below it)"
    )
    return (
        f"{where} budget: error vs the float64 golden {_g(e_c)} is {_g(ratio)}x {base} "
        f"(max(twin error {_g(e_t)}, floor {_g(floor)}) = {_g(den)}); allowed k={_g(k)}"
    )


def _far_note(status: str, diff: float | None, e_cand: float, floor: float, ratio: float, k):
    """The note for a candidate far from the reference yet within budget (issue 15 §2).

    Said when the candidate is more accurate than the twin (``ratio < 1``) and its difference
    from the reference exceeds ``k · max(e_cand, floor)``: the reference itself is then far
    from the golden, e.g. the candidate skips a rounding the model asks for.
    """
    if status != "close" or diff is None or ratio >= 1.0 or not diff > k * max(e_cand, floor):
        return ""
    return (
        f"max_abs_diff vs the reference {_g(diff)} is over k={_g(k)}x the candidate's own error "
        f"{_g(e_cand)}: the candidate is far more accurate than PyTorch at this precision "
        f"(e.g. it skips a rounding the model asks for)"
    )


def budget_compare(
    golden: Any,
    twin: Any,
    candidate: Any,
    *,
    reference: Any = None,
    k: float | None = None,
    tag: str | None = None,
    budgets: Budgets | None = None,
) -> BudgetComparison:
    """Compare a candidate with its reference by error budget (the formula of the module).

    Args:
        golden: the tag's value from the float64 golden run (promoted to float64 here).
        twin: the tag's value from the twin (PyTorch at the candidate's precision), or its
            :class:`ErrorScan` from :func:`side_error` (then ``reference`` is required).
        candidate: the candidate's value; the golden and the twin must have its shape.
        reference: the reference's value, for ``equal`` and the usual candidate-vs-reference
            columns; ``None`` means the twin is the reference (candidate of the reference's
            dtype).
        k: explicit budget factor; else ``budgets`` resolves it for ``tag``, else
            :data:`DEFAULT_K`.
        tag: the tag, for per-tag ``k`` overrides.
        budgets: per-tag ``k`` overrides (:class:`Budgets`).

    Returns:
        A frozen :class:`BudgetComparison`. A candidate-vs-reference pair that cannot be
        compared (shape mismatch, no data, unsupported type) keeps that status with budget
        numbers ``None``; a golden or twin that cannot be used gives ``error``.

    Raises:
        InputError: when ``k`` (explicit or resolved) is not a finite number ≥ 1, or the twin
            is an :class:`ErrorScan` and no ``reference`` is given.
    """
    k = check_k(k) if k is not None else (budgets or Budgets()).resolve(tag)  # resolve's rule
    if isinstance(twin, ErrorScan) and reference is None:
        raise InputError("budget_compare: pass reference= when the twin is given as an ErrorScan")
    base = compare_tensors(twin if reference is None else reference, candidate, mode="equal")
    if base.status not in ("equal", "mismatch"):
        return _unusable(base, k, base.status, base.message)
    golden64 = _golden64(golden)
    if isinstance(golden64, str):
        return _unusable(base, k, "error", f"budget not computed: {golden64}")
    cand_err = _same_as_twin(twin, base.cand_hash) or _side_error(
        golden64, candidate, "candidate", golden_max=True
    )
    twin_err = twin if isinstance(twin, ErrorScan) else _side_error(golden64, twin, "twin")
    problem = cand_err.problem or twin_err.problem
    if problem:
        return _unusable(base, k, "error", f"budget not computed: {problem}")
    kept = _kept_errors(golden64, twin, candidate) if twin_err.lost else None
    return _judged(base, k, golden64, cand_err, twin_err, kept)


def _kept_errors(golden64: torch.Tensor, twin: Any, candidate: Any) -> tuple | None:
    """``(e_cand, e_twin, kept, lost)`` over the elements where the twin's error is finite.

    ``e_cand`` is over those of them where the candidate's error is finite too: values the
    candidate loses stay judged by the module's count rule (``e_cand = e_twin = +inf``).

    A twin that loses values at a tag (e.g. an fp16 overflow: ``e_twin = +inf``) would excuse
    any finite candidate error there (``finite / inf = 0``), however wrong the candidate is on
    every element PyTorch kept (w9brk1: +1000 on 5 of 6 elements was ``close``). The ratio is
    therefore also taken over the kept elements (:func:`_judged`). Element errors follow the
    module's non-finite rule (equal, NaN-NaN and same-signed inf are exact; any other
    non-finite is ``+inf``), computed in float64 (complex128) on whole tensors: a rare path.
    ``None`` when the twin is only an :class:`ErrorScan` (no elements to mask: the rule of the
    module docstring alone) or keeps no element.
    """
    if isinstance(twin, ErrorScan):
        return None
    t, c = to_tensor(twin, "twin").tensor, to_tensor(candidate, "candidate").tensor
    if t is None or c is None:
        return None
    wide = torch.complex128 if golden64.is_complex() else torch.float64
    err_t, err_c = _element_errors(t.to(wide), golden64), _element_errors(c.to(wide), golden64)
    keep = torch.isfinite(err_t)
    n = int(keep.sum())
    if n == 0:
        return None
    kept_c = err_c[keep]
    kept_c = kept_c[torch.isfinite(kept_c)]  # values the candidate loses: the count rule's
    e_c = float(kept_c.max()) if kept_c.numel() else 0.0
    return e_c, float(err_t[keep].max()), n, keep.numel() - n


def _element_errors(side: torch.Tensor, golden: torch.Tensor) -> torch.Tensor:
    """``|side − golden|`` per element with the module's non-finite rule (float64)."""
    err = (side - golden).abs().to(torch.float64)
    exact = (side == golden) | (torch.isnan(side) & torch.isnan(golden))
    err[exact] = 0.0
    return err.nan_to_num_(nan=math.inf, posinf=math.inf)


def _same_as_twin(twin: Any, cand_hash: str | None) -> ErrorScan | None:
    """The twin's own scan when the candidate is bitwise the twin, else ``None``.

    Bitwise: the candidate's content hash (``compare_tensors``' ``cand_hash``: dtype, shape and
    bytes through xxh3-64, the project's rule for identical contents) equals the twin's
    (:func:`side_error` with ``digest=True``). Both were measured against the same golden
    value of the tag, so the candidate's error, lost count and ``max |golden|`` are the twin's:
    the candidate's error pass is skipped (e.g. every weight of a model cast to bf16, and every
    tag of a cast candidate computing as PyTorch does).
    """
    if not isinstance(twin, ErrorScan) or twin.side_hash is None or twin.golden_max is None:
        return None
    if twin.problem or cand_hash != twin.side_hash:
        return None
    return ErrorScan(twin.max_abs_err, twin.lost, twin.dtype, golden_max=twin.golden_max)


def _judged(
    base: Comparison, k: float, golden64, cand: ErrorScan, twin: ErrorScan, kept: Any = None
):
    """The budget record of a pair whose three sides were all usable.

    ``kept``: :func:`_kept_errors` when the twin loses values here; the ratio is then the
    larger of the whole-tag ratio and the ratio over the elements the twin keeps, so that one
    lost value never excuses the rest (one ratio, one verdict).
    """
    eps = compared_eps(cand.dtype, twin.dtype)
    floor = budget_floor(golden64, eps) if cand.golden_max is None else eps * cand.golden_max
    ratio = error_ratio(cand, twin, floor)
    e_c, e_t = cand.max_abs_err, twin.max_abs_err
    shown, kept_note = (e_c, e_t), ""  # the errors the verdict's ratio is made of
    if kept is not None:
        e_ck, e_tk, n_kept, n_lost = kept
        kept_ratio = error_ratio(ErrorScan(e_ck, 0), ErrorScan(e_tk, 0), floor)
        if kept_ratio >= ratio:
            ratio, shown = kept_ratio, (e_ck, e_tk)
        kept_note = (
            f"the twin loses {n_lost} value(s) here: the ratio is the larger of the whole tag's "
            f"and that over the {n_kept} element(s) it keeps ({_g(kept_ratio)}; errors "
            f"{_g(e_ck)} and {_g(e_tk)} there)"
        )
    status = budget_status(ratio, k, base.status == "equal")
    dtype = _low_dtype(cand.dtype, twin.dtype)
    parts = (
        _verdict_message(status, *shown, floor, ratio, k, dtype),
        _far_note(status, base.max_abs_diff, e_c, floor, ratio, k),
        _lost_note(cand, twin),
        kept_note,
        base.message if status == "mismatch" else "",
    )
    message = "; ".join(p for p in parts if p)
    columns = dict(golden_max_abs_err=e_c, twin_max_abs_err=e_t, error_ratio=ratio)
    return BudgetComparison(
        status=status,
        k=k,
        golden_max_abs_err=e_c,
        twin_max_abs_err=e_t,
        floor=floor,
        error_ratio=ratio,
        compared_dtype=dtype,
        # dataclasses.replace without the frozen __init__ (27 object.__setattr__): same record
        comparison=type(base)._fast(
            {**base.to_dict(), "status": status, "mode": MODE, "message": message, **columns}
        ),
        message=message,
    )


def _low_dtype(*dtypes: torch.dtype) -> str | None:
    """Name of the dtype whose eps is the floor's (the lower precision; ``None``: no float)."""
    floats = [d for d in dtypes if d.is_floating_point or d.is_complex]
    if not floats:
        return None
    return dtype_name(max(floats, key=lambda d: float(torch.finfo(d).eps)))


def _lost_note(cand: ErrorScan, twin: ErrorScan) -> str:
    if not (cand.lost or twin.lost):
        return ""
    return (
        f"non-finite where the golden is finite (or the reverse): candidate {cand.lost}, "
        f"twin {twin.lost} elements"
    )


def _unusable(base: Comparison, k: float, status: str, message: str) -> BudgetComparison:
    comparison = replace(base, status=status, mode=MODE, message=message)
    return BudgetComparison(status, k, None, None, None, None, None, comparison, message)
