"""The golden and twin sides of an error-budget check, looked up by tag and step (issue 15).

A budget comparison (:mod:`parity_tracker.compare.budget`) needs, besides the reference and the
candidate a :class:`~parity_tracker.tensor_checker.TensorChecker` pairs, two more values of the
same tag: the float64 **golden** and the **twin** (PyTorch at the candidate's precision). Each
is captured by its own checker, hooked on its own model (a :func:`capture.golden.golden_copy`
of the reference run under :func:`capture.golden.golden_mode`; the twin of
:func:`capture.twin.make_twin`). :class:`BudgetSides` reads their captures by ``(tag, step)``
and turns a reference/candidate pair into the budget verdict.

Memory: the golden checker holds its captures in the bounded spilling snapshot store (give it
``max_resident_bytes``); with ``release`` a golden capture is let go once its tag is judged.
A separate twin checker
built with :func:`twin_reducer` reduces each twin value to its
:class:`~parity_tracker.compare.budget.ErrorScan` against the golden as soon as it is captured
(the twin's tensors are never held). ``run_parity`` runs no separate twin pass (2026-12-01,
``run.budget``): its twin is the run's reference side, read with ``twin_log=None``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from parity_tracker.compare.budget import Budgets, ErrorScan, budget_compare, side_error
from parity_tracker.compare.convert import tensor_version
from parity_tracker.compare.core import Comparison
from parity_tracker.compare.pairing import RELEASED, PairComparer, load

MODE = "budget"


def _captured(log: Any, tag: str, step: int) -> Any:
    """The first tensor-side value a checker's log holds for ``(tag, step)``, else ``None``."""
    g = log.groups.get((tag, step))
    if g is None:
        return None
    cap = next((c for c in g.captures if c.is_tensor), None)
    return None if cap is None or cap.value is RELEASED else cap


def twin_reducer(golden_log: Any) -> Callable[[str, int, torch.Tensor], Any]:
    """``reduce(tag, step, value)`` for a twin checker: the value's ErrorScan vs the golden.

    Pass it as ``TensorChecker(reduce_to=...)`` of the twin's checker: each twin tensor is then
    kept only as an :class:`ErrorScan` (a few numbers). A tag the golden lacks keeps no value
    (its budget becomes ``error`` with the golden named).
    """
    seen: dict[tuple, tuple] = {}  # a module's input is the previous module's output

    def reduce(tag: str, step: int, value: torch.Tensor) -> Any:
        cap = _captured(golden_log, tag, step)
        if cap is None:
            return ErrorScan(None, problem=f"golden: no value captured for {tag} at step {step}")
        golden = load(cap.value)
        key = _key(golden, None, value, value, 0.0)
        hit = seen.get(key) if key is not None else None
        if hit is not None and hit[0]() is golden and hit[1]() is value:
            return hit[2]
        scan = side_error(golden, value, "twin", digest=True)
        if key is not None:
            seen[key] = (weakref.ref(golden), weakref.ref(value), scan)
        return scan

    return reduce


class BudgetSides:
    """Judges reference/candidate pairs by error budget, with golden and twin from their logs.

    Args:
        golden_log: the capture log of the golden's checker (``checker._log``).
        twin_log: the twin's capture log, or ``None`` when the twin is the reference side
            (the reference itself for a candidate of the reference's dtype, else the twin
            model ``run_parity`` runs as its reference side: ``run.budget``).
        budgets: per-tag ``k`` (:class:`~parity_tracker.compare.budget.Budgets`; default k=2).
        align: the run's ``align(tag, reference, candidate)``; applied to the golden and to a
            twin tensor as to the reference (their shapes are the reference's).
        release: release each golden capture once its tag is judged (the one-pass eager path
            of ``run_parity``); ``False`` keeps them, so the check can be repeated.
    """

    def __init__(
        self,
        golden_log: Any,
        twin_log: Any = None,
        budgets: Budgets | None = None,
        align: Callable[[str, Any, Any], Any] | None = None,
        *,
        release: bool = False,
    ) -> None:
        self.golden_log, self.twin_log, self.release = golden_log, twin_log, release
        #: whatever must outlive the check with the logs (the golden checker and its store)
        self.owner: Any = None
        self._cache: dict[tuple, tuple] = {}
        #: ``on_compared(tag, step, reference, candidate, comparison)`` after each judged pair
        #: (the checker's callback: the run's worst-pair histogram), or None
        self.on_compared: Callable[..., None] | None = None
        self.budgets = budgets or Budgets()
        self.align = align

    def for_step(self, step: int) -> _StepComparer:
        """A comparer with ``PairComparer.compare``'s signature for the tags of ``step``."""
        return _StepComparer(self, step)

    def _aligned(self, tag: str, value: Any, cand: Any) -> Any:
        if self.align is None or not isinstance(value, torch.Tensor):
            return value
        pair = self.align(tag, value, cand)
        return value if pair is None else pair[0]

    def judge(self, tag: str, step: int, ref: Any, cand: Any) -> Comparison:
        """The budget :class:`Comparison` of one pair (never raises: failures are ``error``).

        With ``release``, the golden capture of the tag is released afterwards.
        """
        if not isinstance(ref, torch.Tensor) or not isinstance(cand, torch.Tensor):
            # the pairing's one rule for leaves that are not two tensors (skipped/structure)
            return PairComparer().compare(tag, ref, cand, MODE, None, step)
        gcap = _captured(self.golden_log, tag, step)
        if gcap is None:
            return _no_side(tag, step, "golden", ref, cand)
        try:
            if self.align is not None:
                pair = self.align(tag, ref, cand)
                if pair is not None:
                    ref, cand = pair
            golden = self._aligned(tag, load(gcap.value), cand)
            twin = self._twin(tag, step, cand)
            if twin is None:
                return _no_side(tag, step, "twin", ref, cand)
            out = self._judged(tag, golden, twin, ref, cand)
            if self.on_compared is not None:
                self.on_compared(tag, step, ref, cand, out)
        except Exception as exc:  # a pair that cannot be judged never aborts the check
            return Comparison(
                status="error", mode=MODE, message=f"{tag}: {type(exc).__name__}: {exc}"
            )
        if self.release:
            gcap.value = RELEASED
        return out

    def _judged(self, tag: str, golden: Any, twin: Any, ref: Any, cand: Any) -> Comparison:
        """``budget_compare`` of one pair, reusing the verdict of the same objects judged already.

        A module's input is the previous module's output: the same reference, candidate and
        golden tensors (and the same twin error), judged again under another tag. Reused only
        for the very same objects, unchanged since (version counters), the same twin error and
        the same ``k``, and never with ``align``.
        """
        k = self.budgets.resolve(tag)
        key = _key(golden, twin, ref, cand, k) if self.align is None else None
        held = (golden, ref, cand, *([twin] if isinstance(twin, torch.Tensor) else []))
        hit = self._cache.get(key) if key is not None else None
        if hit is not None and all(w() is t for w, t in zip(hit[0], held, strict=True)):
            return hit[1]
        out = budget_compare(
            golden, ref if twin is _SELF else twin, cand,
            reference=None if twin is _SELF else ref, k=k,
        ).comparison  # fmt: skip
        if key is not None:
            self._cache[key] = (tuple(weakref.ref(t) for t in held), out)
        return out

    def _twin(self, tag: str, step: int, cand: Any) -> Any:
        """The twin's value (tensor or ErrorScan), ``_SELF`` for the reference, or None."""
        if self.twin_log is None:
            return _SELF
        cap = _captured(self.twin_log, tag, step)
        if cap is None:
            return None
        value = cap.value if isinstance(cap.value, ErrorScan) else load(cap.value)
        return self._aligned(tag, value, cand)


_SELF = object()


def _key(golden: Any, twin: Any, ref: Any, cand: Any, k: float) -> tuple | None:
    """Cache key of a judged pair, or None when a tensor has no version counter."""
    tensors = (golden, ref, cand)
    versions = tuple(tensor_version(t) for t in tensors)
    if None in versions:
        return None
    twin_key = twin if isinstance(twin, ErrorScan) else id(twin)
    return (*(id(t) for t in tensors), versions, twin_key, k)


def _no_side(tag: str, step: int, side: str, ref: Any, cand: Any) -> Comparison:
    """``error``: the budget of a compared pair cannot be computed without this side."""
    from parity_tracker.compare.core import compare_tensors

    base = compare_tensors(ref, cand, mode="equal")
    return Comparison(
        **{
            **base.to_dict(),
            "status": "error",
            "mode": MODE,
            "message": (
                f"budget not computed for {tag} at step {step}: the {side} run captured no "
                f"tensor there (its module was not called, or returned another structure)"
            ),
        }
    )


class _StepComparer:
    """``compare(tag, ref, cand, mode, tol)`` of one step (the checker's pair interface)."""

    def __init__(self, sides: BudgetSides, step: int) -> None:
        self.sides, self.step = sides, step

    def compare(
        self, tag: str, ref: Any, cand: Any, mode: str, tol: Any, step: int | None = None
    ) -> Comparison:
        """Judge one pair by budget; ``mode`` and ``tol`` are ignored (budget has no rtol)."""
        del mode, tol, step  # the step is this comparer's own
        return self.sides.judge(tag, self.step, ref, cand)
