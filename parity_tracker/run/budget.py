"""The golden pass of a ``mode="budget"`` run, and the twin that becomes its reference side.

A budget run has three sides (issue 15): golden, twin, candidate. Before the reference side
and the candidate run (``run_parity``), :func:`prepare`:

1. runs the **golden**: :func:`~parity_tracker.capture.golden.golden_copy` of the reference,
   under :func:`~parity_tracker.capture.golden.golden_mode` on the inputs promoted to float64;
   its captures are held in the bounded spilling snapshot store (``max_resident_bytes``).
2. picks the **twin**: the caller's twin, or :func:`~parity_tracker.capture.twin.make_twin`
   of the reference at the candidate's compute dtype. Amended 2026-12-01 (issue 19,
   measurement 7): whenever a twin model runs, it IS the run's reference side (hooked as
   side 0, on the run's inputs cast with :func:`~parity_tracker.capture.twin.cast_floating`),
   so a budget run makes three forwards, not four: the reference-vs-candidate columns compare
   the candidate with PyTorch at the candidate's own precision (``equal`` when bitwise the
   twin), and the twin's error against the golden is read from the reference side's captures
   (``BudgetSides(golden_log, None)``), as when the twin is the reference itself. The user's
   reference model only builds the golden and the twin: its own forward never runs. When the
   candidate computes in the reference's dtype, the twin is the reference itself.

:func:`prepare` returns the :class:`~parity_tracker.capture.sides.BudgetSides` the eager
checker judges each pair with and the reference side's model and inputs, or the reason
``mode="auto"`` falls back to ``allclose``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from parity_tracker.errors import InputError

#: Resident budget of the golden's snapshots (bytes): the eager checker's default, 256 MiB.
GOLDEN_RESIDENT_BYTES = 256 << 20


@dataclass
class Passes:
    """What the golden and twin passes produced.

    Attributes:
        sides: the budget sides for the eager checker (``None`` when falling back).
        reason: why ``auto`` falls back to ``allclose`` (``""`` when the budget runs).
        durations_s: seconds of the golden pass.
        twin: the twin model that is the run's reference side, or ``None`` when the twin is
            the reference itself (or when falling back).
        twin_inputs: the run's inputs cast to the twin's dtype (``None`` with a drive).
        twin_dtype: the dtype the twin was cast to (``None``: the caller's own twin).
    """

    sides: Any
    reason: str = ""
    durations_s: dict[str, float] | None = None
    twin: Any = None
    twin_inputs: Any = None
    twin_dtype: Any = None


def _refuse_or_fall_back(explicit: bool, reason: str) -> Passes:
    if explicit:
        raise InputError(f"mode='budget' cannot run: {reason}")
    return Passes(None, _fallback_reason(reason))


def _fallback_reason(reason: str) -> str:
    """The ``mode_reason`` part of an ``auto`` run that fell back to allclose."""
    return f"budget not used: {reason}; compared by allclose instead"


def twin_fallback(error: Mapping[str, Any] | None, *, explicit: bool) -> str | None:
    """Why an ``auto`` budget run falls back to allclose after its reference side failed.

    The twin (the run's reference side) is the first forward of a budget run; a model it
    cannot run at the candidate's dtype (a hard-coded ``.float()`` before a Linear) raises
    there. Issue 15: ``auto`` then compares by allclose against the user's reference;
    an explicit ``mode="budget"`` keeps the failure (``None`` returned).

    Args:
        error: the run's error record (``run.run._error_record``: type, message, side) or
            ``None``.
        explicit: the caller asked for ``mode="budget"``.

    Returns:
        The reason to append to ``mode_reason``, or ``None``: no fallback.
    """
    if explicit or error is None or error.get("side") != "reference":
        return None
    if error.get("type") == "KeyboardInterrupt":
        return None
    message = (str(error.get("message") or "").splitlines() or [""])[0][:200]
    return _fallback_reason(f"the twin could not run ({error.get('type')}: {message})")


def _golden_pass(run: Any, reference: Any, drive: Any, inputs: Any, seed: int, spill: str):
    """Run the golden; returns ``(checker, random_ops)``."""
    import torch

    from parity_tracker.capture.golden import golden_copy, golden_mode, promote
    from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker

    checker = TensorChecker(
        verbose=False, max_resident_bytes=GOLDEN_RESIDENT_BYTES, spill_dir=spill
    )
    model = golden_copy(reference)
    plan = run._Plan(0, model, drive, None if inputs is None else promote(inputs))
    hooks = module_register_tensor_checker(model, checker, side=0)
    with run._eval_mode(model), hooks, golden_mode() as mode, torch.no_grad():
        run._run_side(plan, checker, None, seed)
    return checker, list(mode.random_ops)


def _twin_inputs(inputs: Any, cast: Any) -> Any:
    """The run's inputs for the twin: floating tensors cast to ``cast`` (kept without one)."""
    from parity_tracker.capture.twin import cast_floating

    return inputs if inputs is None or cast is None else cast_floating(inputs, cast)


def _twin_model(reference: Any, candidate: Any, twin: Any, settings: Mapping[str, Any]):
    """``(twin model or None for the reference itself, dtype to cast inputs to or None)``."""
    from parity_tracker.capture.twin import compute_dtype, make_twin

    if twin is not None:  # the caller's twin; the reference itself runs as the reference side
        return (None, None) if twin is reference else (twin, None)
    override = settings.get("compute_dtype")
    cand_dtype = (
        compute_dtype(candidate, override) if hasattr(candidate, "parameters") or override else None
    )
    model = make_twin(reference, cand_dtype)
    return (None, None) if model is reference else (model, cand_dtype)


def prepare(
    run: Any,
    reference: Any,
    candidate: Any,
    inputs: Any,
    *,
    drive: Callable[..., Any] | None,
    explicit: bool,
    twin: Any,
    budgets: Mapping[str, float] | None,
    k: float | None,
    align: Any,
    settings: Mapping[str, Any],
    seed: int,
    spill: str,
    capture_ops: bool,
    isolate: bool,
) -> Passes:
    """Run the golden pass and pick the run's reference side, or say why the budget cannot run.

    No forward of ``reference`` itself runs here; when a twin model is made (or given), the
    returned :class:`Passes` carries it as the run's reference side (``twin``, ``twin_inputs``).

    Args:
        run: the ``parity_tracker.run.run`` module (its side runner, shared, not copied).
        reference: the reference model.
        candidate: the candidate (its compute dtype gives the twin's).
        inputs: the run's inputs, or ``None`` with ``drive`` (the reference's driver).
        drive: the reference's ``drive(model, rec)``.
        explicit: ``mode="budget"`` was requested (refuse) rather than chosen by ``auto``
            (fall back to allclose with the reason).
        twin: the caller's twin model (``ParityCase.twin``), or ``None`` to make one.
        budgets: per-tag ``{glob: k}``.
        k: the default factor (``None``: 2, ``compare.budget.DEFAULT_K``).
        align: the run's ``align`` (applied to the golden as to the reference side).
        settings: the run's settings (``compute_dtype`` overrides the candidate's dtype).
        seed: the run's seed (the golden pass is seeded like the sides).
        spill: the run's spill folder.
        capture_ops: op capture requested (refused: not supported with a budget yet).
        isolate: isolation requested (refused likewise).

    Raises:
        InputError: (exit 2) with ``explicit``: op capture or isolation asked for (not
            supported in budget mode yet), an infeasible golden (``budget_infeasible``), a
            golden forward that raises, or random ops in the golden run (named).
    """
    import time

    from parity_tracker.capture.golden import require_deterministic
    from parity_tracker.capture.sides import BudgetSides
    from parity_tracker.capture.twin import budget_infeasible
    from parity_tracker.compare.budget import DEFAULT_K, Budgets

    table = Budgets(budgets, k=DEFAULT_K if k is None else k)  # validate before running
    if capture_ops or isolate:
        what = "capture_ops (--ops)" if capture_ops else "isolate (--isolate)"
        return _refuse_or_fall_back(
            explicit, f"{what} is not supported in budget mode yet; use mode='allclose'"
        )
    reason = budget_infeasible(reference, candidate, twin=twin)
    if reason:
        return _refuse_or_fall_back(explicit, reason)
    t0 = time.perf_counter()
    try:
        golden, random_ops = _golden_pass(run, reference, drive, inputs, seed, spill)
    except InputError:
        raise
    except Exception as exc:
        why = f"the float64 golden forward raised {type(exc).__name__}: {exc}"[:500]
        return _refuse_or_fall_back(explicit, why)
    if random_ops:
        if explicit:
            require_deterministic(random_ops)
        return Passes(None, f"budget not used: the float64 golden run calls the random op "
                      f"{random_ops[0].op}; compared by allclose instead")  # fmt: skip
    durations = {"golden": time.perf_counter() - t0}
    model, cast = _twin_model(reference, candidate, twin, settings)
    # the twin, when one runs, is the reference side: its error vs the golden is read from the
    # reference side's captures (``_SELF``), as when the twin is the reference itself
    sides = BudgetSides(golden._log, None, table, align, release=True)
    sides.owner = golden  # the golden checker owns its snapshots' spill folder: keep it alive
    return Passes(sides, "", durations, model, _twin_inputs(inputs, cast), cast)
