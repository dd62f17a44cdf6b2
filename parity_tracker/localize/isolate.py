"""Isolate modules: each candidate module's own (local) error (Numeric Suite's "shadow").

Re-run each candidate module on the reference's captured inputs and compare with the reference
module's output, so each module shows its own error apart from what it inherited. Modules are
named as the capture names them (:mod:`parity_tracker.capture.tags`).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from parity_tracker.capture.tags import call_base, named_modules, root_name
from parity_tracker.compare import Comparison, compare_tensors
from parity_tracker.compare.tolerances import Tolerances
from parity_tracker.errors import InputError


def compare_structured(
    reference: Any,
    candidate: Any,
    *,
    mode: str,
    rtol: float | None = None,
    atol: float | None = None,
    tag: str | None = None,
    tolerances: Tolerances | None = None,
) -> tuple[str, float | None]:
    """Compare two (possibly nested) outputs leaf by leaf with ``compare_tensors``.

    ``rtol``/``atol``/``tag``/``tolerances`` are passed on to ``compare_tensors``.

    Returns:
        ``(status, max_abs_diff)``: the first non-passing leaf status in flattening order
        (``"close"`` if any leaf is close and none fails, else ``"equal"``) and the largest
        ``max_abs_diff`` over the leaves (``None`` when no leaf has one). A different number of
        tensor leaves gives ``"shape_mismatch"``.
    """
    ref_leaves = [t for t in tree_flatten(reference)[0] if isinstance(t, torch.Tensor)]
    cand_leaves = [t for t in tree_flatten(candidate)[0] if isinstance(t, torch.Tensor)]
    if len(ref_leaves) != len(cand_leaves):
        return "shape_mismatch", None
    results: list[Comparison] = [
        compare_tensors(r, c, mode=mode, rtol=rtol, atol=atol, tag=tag, tolerances=tolerances)
        for r, c in zip(ref_leaves, cand_leaves, strict=True)
    ]
    diffs = [c.max_abs_diff for c in results if c.max_abs_diff is not None]
    worst = max(diffs) if diffs else None
    failing = [c.status for c in results if not c.passed]
    if failing:
        return failing[0], worst
    return ("close" if any(c.status == "close" for c in results) else "equal"), worst


def _clone_tree(value: Any) -> Any:
    """Deep-copy every tensor leaf (detached), keeping the structure."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, value)


def isolate(
    reference_model: torch.nn.Module,
    candidate_model: torch.nn.Module,
    run_reference: Callable[[], Any],
    module_names: Iterable[str],
    *,
    mode: str,
    rtol: float | None = None,
    atol: float | None = None,
    tolerances: Mapping[str, tuple[float, float]] | Tolerances | None = None,
) -> dict[tuple[str, int], tuple[str, float | None]]:
    """Re-run candidate modules on the reference's inputs: each module's own (local) error.

    ``run_reference()`` runs one reference forward (or drive). Forward pre-hooks on each named
    reference module copy the call's ``(args, kwargs)``; the forward hook then calls the
    candidate's same-named module on that copy (under ``torch.no_grad``) and compares its output
    with the reference module's output, in lockstep, so nothing is kept between calls (peak extra
    memory: one module call's inputs and the two outputs). This is the "shadow" idea of PyTorch's
    Numeric Suite (``torch.ao.ns``), applied to any engine whose modules are callable.

    Args:
        reference_model: the reference ``nn.Module``.
        candidate_model: the candidate ``nn.Module`` with the same submodule names.
        run_reference: runs one reference forward; called exactly once.
        module_names: display names from ``named_modules()`` to isolate, the root as
            :func:`parity_tracker.capture.tags.root_name` names it (``"model"``, or ``"root"``
            when a child is named ``model``).
        mode: ``"equal"`` or ``"allclose"`` (as in ``compare_tensors``).
        rtol: session relative tolerance (``None`` = per-dtype default of the comparison core).
        atol: session absolute tolerance (``None`` = per-dtype default).
        tolerances: per-tag overrides ``{glob: (rtol, atol)}`` matched against the module tag
            ``{module}`` / ``{module}@{k}``.

    Returns:
        ``{(module, call_index): (local_status, local_max_abs_diff)}``; ``call_index`` counts
        the module's calls within this run from 0. A candidate module that raises gets
        ``("error", None)``.

    Raises:
        InputError: a name is not a submodule of one of the two models (the message lists
            the close matches).

    Note:
        Stateful candidate modules (a KV cache) see one extra call per reference call.
    """
    ref_named, cand_named = named_modules(reference_model), named_modules(candidate_model)
    names = list(dict.fromkeys(module_names))
    for name in names:
        for side, named in (("reference", ref_named), ("candidate", cand_named)):
            if name not in named:
                close = difflib.get_close_matches(name, list(named), n=3)
                root = root_name(reference_model if side == "reference" else candidate_model)
                raise InputError(
                    f"isolate: module {name!r} is not in the {side} model's named_modules() "
                    f"(the root is {root!r}); close matches: {close}"
                )
    tol = tolerances if isinstance(tolerances, Tolerances) else Tolerances(tolerances)
    results: dict[tuple[str, int], tuple[str, float | None]] = {}
    calls: dict[str, int] = {}
    pending: dict[str, list[tuple[tuple, dict]]] = {n: [] for n in names}
    handles = []

    def make_hooks(name: str):
        def pre(_mod, args, kwargs):
            pending[name].append((_clone_tree(args), _clone_tree(kwargs)))

        def post(_mod, _args, _kwargs, output):
            args, kwargs = pending[name].pop()
            k = calls.get(name, 0)
            calls[name] = k + 1
            tag = call_base(name, k)
            try:
                with torch.no_grad():
                    cand_out = cand_named[name](*args, **kwargs)
            except Exception:  # the candidate failing is a finding, not a crash
                results[(name, k)] = ("error", None)
                return
            results[(name, k)] = compare_structured(
                output, cand_out, mode=mode, rtol=rtol, atol=atol, tag=tag, tolerances=tol
            )

        return pre, post

    try:
        for name in names:
            pre, post = make_hooks(name)
            mod = ref_named[name]
            handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
            handles.append(mod.register_forward_hook(post, with_kwargs=True))
        run_reference()
    finally:
        for h in handles:
            h.remove()
    return results
