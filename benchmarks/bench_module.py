"""Measurement 1: module-level parity run ÷ (plain reference forward + plain candidate forward).

No dumps, ``mode="equal"``, every module hooked (params, buffers, inputs, outputs), on the
8-layer transformer and on vae-tiny at 256×256. ``--quick`` runs a 2-layer, d_model 128
transformer only (vae-tiny's diffusers import alone would eat a third of CI's minute).
Targets (issue 19, item 3): ≤ 1.15 on the transformer, ≤ 1.25 on vae-tiny; at the quick size
≤ 2.0 (item 1).
"""

from __future__ import annotations

from dataclasses import replace

from benchmarks import cases
from benchmarks._common import Row, failed, find, missing
from benchmarks.overhead import ratio_row, session

NAME = "1 module-level ÷ plain"
TARGET = 1.25
#: the full-size target of each pair (issue 19, item 3)
FULL_TARGETS = {"transformer": 1.15, "vae-tiny": 1.25}
#: the quick size's own target (issue 19, item 1: the 2×128 transformer ≤ 2.0, goal 1.5)
QUICK_TARGET = 2.0


def pair_sessions(quick: bool) -> list[tuple[str, object]]:
    """The (case name, Session or Row) of each pair, shared with measurement 2.

    A pair that cannot be built gives a Row ("not available yet" or "error") in place.
    """
    out: list[tuple[str, object]] = []
    reps = cases.REPEATS[quick]
    try:
        pair = cases.transformer(quick)
        out.append(
            (
                "transformer",
                session(pair, peers=not quick, fast_path=True, repeats=reps, quick=quick),
            )
        )
    except Exception as exc:
        out.append(("transformer", failed(NAME, "transformer", exc)))
    if quick:  # CI proves the harness on the transformer; vae-tiny runs in --full
        return out
    build, why = find("parity_tracker.builtin_targets.vae_tiny:build")
    if build is None:
        out.append(("vae-tiny", missing(NAME, "vae-tiny", why, f"≤ {TARGET:g}")))
        return out
    try:
        pair = cases.vae_tiny(quick)
        out.append(
            ("vae-tiny", session(pair, peers=False, fast_path=False, repeats=reps, quick=quick))
        )
    except Exception as exc:
        out.append(("vae-tiny", failed(NAME, "vae-tiny", exc, f"≤ {TARGET:g}")))
    return out


def limit(quick: bool, full: float = TARGET, at_quick: float = QUICK_TARGET) -> float:
    """The target of a transformer row: the issue's full-size one, or its own quick one."""
    return at_quick if quick else full


def quick_judged(row: Row, quick: bool) -> Row:
    """``row`` marked as judged at the quick size (``__main__`` keeps its verdict)."""
    return replace(row, extra={**row.extra, "quick_target": True}) if quick else row


def run(quick: bool) -> list[Row]:
    """Rows of measurement 1 (plus the MHA fast path's effect on the plain forward, as info)."""
    rows: list[Row] = []
    for name, s in pair_sessions(quick):
        if isinstance(s, Row):
            rows.append(s)
            continue
        lim = limit(quick, FULL_TARGETS.get(name, TARGET))
        rows.append(quick_judged(ratio_row(s, NAME, "module", "plain", lim), quick))
        if name == "transformer" and "plain_fast_path" in s.times:
            rows.append(
                ratio_row(
                    s,
                    "1 info: fused fast path ÷ plain",
                    "plain_fast_path",
                    "plain",
                    None,
                    "plain forwards with the fused MHA/encoder fast path (which any hook "
                    "disables) ÷ without it",
                )
            )
    return rows
