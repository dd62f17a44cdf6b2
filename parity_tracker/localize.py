"""Localize a divergence: align op sequences, classify root causes, isolate modules.

Three small pieces used by :mod:`parity_tracker.ops` and :mod:`parity_tracker.run`:

* :func:`align_ops` — a longest-common-subsequence alignment of two op sequences (within one
  module call), so one extra or missing op yields one ``missing_*`` row and everything after it
  is still matched (issue 5 §2).
* :func:`classify` — the seed's root-cause cases from evidence (seed §4 step 3):
  A = same inputs, same layout, different result; B = inputs equal in value but different in
  dtype, stride or contiguity (plumbing); C = op present on one side only.
* :func:`isolate` — Numeric Suite's "shadow" idea for any engine: re-run each candidate module
  on the reference's captured inputs and compare with the reference module's output, so each
  module shows its own (local) error apart from what it inherited.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from parity_tracker.capture.tags import call_base, named_modules, root_name
from parity_tracker.compare import Comparison, compare_tensors
from parity_tracker.errors import InputError
from parity_tracker.tolerances import Tolerances

#: Above this many DP cells (after trimming the common prefix and suffix) ``align_ops`` falls
#: back to ``difflib.SequenceMatcher`` (not guaranteed minimal, but linear-ish in practice).
MAX_DP_CELLS = 4_000_000

CASE_A, CASE_B, CASE_C = "A", "B", "C"


def align_ops(
    reference_ops: Sequence[Hashable], candidate_ops: Sequence[Hashable]
) -> list[tuple[int | None, int | None]]:
    """Align two op sequences by a longest common subsequence.

    Each element is a hashable key; :mod:`parity_tracker.ops` uses ``(op name, output shapes)``.
    Elements compare equal only when their keys are equal, so a substituted op (another name)
    is reported on both sides as unmatched.

    Args:
        reference_ops: keys of the reference's ops, in execution order.
        candidate_ops: keys of the candidate's ops, in execution order.

    Returns:
        Pairs ``(i, j)`` in execution order: ``(i, j)`` matched, ``(i, None)`` reference only
        (``missing_candidate``), ``(None, j)`` candidate only (``missing_reference``). Every index
        of both inputs appears exactly once.

    The common prefix and suffix are matched directly (O(n)); the middle is aligned by the
    classic O(n·m) dynamic programme (Cormen et al., "Introduction to Algorithms", §15.4),
    or by ``difflib.SequenceMatcher(autojunk=False)`` when it exceeds ``MAX_DP_CELLS`` cells.
    Ties prefer reporting the reference-only op first.
    """
    ref, cand = list(reference_ops), list(candidate_ops)
    n, m = len(ref), len(cand)
    lo = 0
    while lo < n and lo < m and ref[lo] == cand[lo]:
        lo += 1
    hi = 0
    while hi < n - lo and hi < m - lo and ref[n - 1 - hi] == cand[m - 1 - hi]:
        hi += 1
    pairs: list[tuple[int | None, int | None]] = [(i, i) for i in range(lo)]
    mid_r, mid_c = ref[lo : n - hi], cand[lo : m - hi]
    if len(mid_r) * len(mid_c) <= MAX_DP_CELLS:
        middle = _lcs_pairs(mid_r, mid_c)
    else:
        middle = _difflib_pairs(mid_r, mid_c)
    for i, j in middle:
        pairs.append((None if i is None else i + lo, None if j is None else j + lo))
    pairs.extend((n - hi + t, m - hi + t) for t in range(hi))
    return pairs


def _lcs_pairs(ref: list[Hashable], cand: list[Hashable]) -> list[tuple[int | None, int | None]]:
    """LCS by dynamic programming over suffixes, then a forward walk emitting the alignment."""
    n, m = len(ref), len(cand)
    # table[i][j] = LCS length of ref[i:] and cand[j:]
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        row, below = table[i], table[i + 1]
        ri = ref[i]
        for j in range(m - 1, -1, -1):
            if ri == cand[j]:
                row[j] = below[j + 1] + 1
            else:
                row[j] = below[j] if below[j] >= row[j + 1] else row[j + 1]
    pairs: list[tuple[int | None, int | None]] = []
    i = j = 0
    while i < n and j < m:
        if ref[i] == cand[j] and table[i][j] == table[i + 1][j + 1] + 1:
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif table[i + 1][j] >= table[i][j + 1]:
            pairs.append((i, None))
            i += 1
        else:
            pairs.append((None, j))
            j += 1
    pairs.extend((t, None) for t in range(i, n))
    pairs.extend((None, t) for t in range(j, m))
    return pairs


def _difflib_pairs(
    ref: list[Hashable], cand: list[Hashable]
) -> list[tuple[int | None, int | None]]:
    """Approximate alignment for very long sequences (matching blocks of difflib)."""
    pairs: list[tuple[int | None, int | None]] = []
    i = j = 0
    matcher = difflib.SequenceMatcher(a=ref, b=cand, autojunk=False)
    for a, b, size in matcher.get_matching_blocks():
        pairs.extend((t, None) for t in range(i, a))
        pairs.extend((None, t) for t in range(j, b))
        pairs.extend((a + t, b + t) for t in range(size))
        i, j = a + size, b + size
    return pairs


def layout_differences(
    reference_inputs: Sequence[Mapping[str, Any]], candidate_inputs: Sequence[Mapping[str, Any]]
) -> list[str]:
    """Describe dtype / stride / contiguity differences between an op's two input lists.

    Args:
        reference_inputs: one mapping per tensor input with keys ``dtype`` (str), ``stride``
            (tuple of int, elements), ``contiguous`` (bool) — as recorded by ``OpSession``.
        candidate_inputs: the same for the candidate, position by position.

    Returns:
        One phrase per difference, e.g. ``"input 1 stride (1000, 1) vs (1, 1000)"``
        (reference first); empty when the layouts agree. Positions present on one side only
        are named too.
    """
    diffs: list[str] = []
    for p in range(max(len(reference_inputs), len(candidate_inputs))):
        if p >= len(reference_inputs) or p >= len(candidate_inputs):
            side = "candidate" if p >= len(reference_inputs) else "reference"
            diffs.append(f"input {p} only on the {side} side")
            continue
        r, c = reference_inputs[p], candidate_inputs[p]
        if r["dtype"] != c["dtype"]:
            diffs.append(f"input {p} dtype {r['dtype']} vs {c['dtype']}")
        if tuple(r["stride"]) != tuple(c["stride"]):
            diffs.append(f"input {p} stride {tuple(r['stride'])} vs {tuple(c['stride'])}")
        if r["contiguous"] != c["contiguous"]:
            names = {True: "contiguous", False: "non-contiguous"}
            diffs.append(f"input {p} {names[r['contiguous']]} vs {names[c['contiguous']]}")
    return diffs


def classify(
    *,
    present: str,
    inputs_status: str,
    layout_diffs: Sequence[str] = (),
    output_diffs: Sequence[str] = (),
) -> str | None:
    """The seed's root-cause case of one failing op, from evidence (seed §4 step 3).

    Args:
        present: ``"both"``, ``"reference"`` or ``"candidate"`` — where the op ran.
        inputs_status: ``"passing"``, ``"failing"`` or ``"unknown"`` (all tensor inputs).
        layout_diffs: dtype / stride / contiguity differences of the inputs
            (see :func:`layout_differences`).
        output_diffs: dtype or shape differences of the outputs (shape inference is plumbing).

    Returns:
        ``"C"`` for an op present on one side only (not implemented or substituted);
        ``"B"`` for passing inputs that differ in layout or a differing output dtype/shape
        (plumbing: shape inference, type conversion, memory layout);
        ``"A"`` for passing inputs with identical layout and a different result (the op
        computes something else); ``None`` when the inputs are not all passing (the op is not a
        root cause, or the evidence is insufficient).

    Raises:
        InputError: ``present`` or ``inputs_status`` is not one of the allowed values.
    """
    if present not in ("both", "reference", "candidate"):
        raise InputError(f"present={present!r}: use 'both', 'reference' or 'candidate'")
    if inputs_status not in ("passing", "failing", "unknown"):
        raise InputError(f"inputs_status={inputs_status!r}: use 'passing', 'failing', 'unknown'")
    if present != "both":
        return CASE_C
    if inputs_status != "passing":
        return None
    if layout_diffs or output_diffs:
        return CASE_B
    return CASE_A


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
