"""Align two op sequences of one module call (issue 5 §2).

:func:`align_ops` is a longest-common-subsequence alignment, so one extra or missing op yields
one ``missing_*`` row and everything after it is still matched; :func:`layout_differences`
names the dtype/stride/contiguity differences of two ops' inputs (seed case B evidence).
"""

from __future__ import annotations

import difflib
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

#: Above this many DP cells (after trimming the common prefix and suffix) ``align_ops`` falls
#: back to ``difflib.SequenceMatcher`` (not guaranteed minimal, but linear-ish in practice).
MAX_DP_CELLS = 4_000_000


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
