"""Measurement 4: compare throughput ÷ ``numpy.copyto`` bandwidth on 2^26-element float32 pairs.

The comparison-core engineer owns the measurement (``benchmarks/bench_compare.py``, targets:
equal path ≥ 0.5, full metrics ≥ 0.25, at 2^26 and at the quick 2^22; a 64-element differing
pair ≤ 60 µs in both modes); this module only calls its ``run(quick)`` and turns what it
returns into table rows, each with its own quick-size target (``extra["quick_target"]``).
"""

from __future__ import annotations

from typing import Any

from benchmarks._common import CLOCK, Row, find, judged, missing

NAME = "4 compare ÷ copyto"


def _as_row(item: Any) -> Row:
    if isinstance(item, Row):
        return item
    if hasattr(item, "to_dict"):
        item = item.to_dict()
    fields = set(Row.__dataclass_fields__)
    data = {k: v for k, v in dict(item).items() if k in fields}
    data.setdefault("measurement", NAME)
    data.setdefault("case", "")
    data.setdefault("value", None)
    data.setdefault("unit", "×")
    return Row(**data)


#: (key in bench_compare's result, row label, target): the issue's goals, the same at the
#: quick size (2^22 elements) and the full one (2^26); issue 19 item 4.
RATIOS = (
    ("equal_over_copyto", "equal path", 0.5),
    ("full_over_copyto", "full metrics", 0.25),
)
#: µs of one full comparison of a small differing pair, quick and full (issue 19 item 4).
SMALL_LIMIT_US = 60.0


def _small_row(out: dict[str, Any]) -> Row | None:
    if "small_mismatch_us" not in out:
        return None
    use_cpu = CLOCK["name"] == "cpu"
    value = float(out["small_mismatch_us_cpu" if use_cpu else "small_mismatch_us"])
    other = out["small_mismatch_us" if use_cpu else "small_mismatch_us_cpu"]
    detail = (
        f"{'cpu' if use_cpu else 'wall'} clock (other clock {other:.1f} µs); "
        "compare_tensors(a, a + 1e-3, mode='allclose'), every element differs, every metric; "
        "best of 5 means of 2,000 calls (bench_compare.small_mismatch)"
    )
    return judged(
        f"{NAME}: small differing pair",
        f"{out.get('small_numel', 64)} float32 elements",
        value,
        "µs",
        SMALL_LIMIT_US,
        detail=detail,
        extra={"quick_target": True, **out},
    )


def _rows_from_dict(out: dict[str, Any]) -> list[Row]:
    """One judged row per ratio; the ``*_cpu`` variant is the figure on the CPU clock."""
    n = out.get("numel")
    size = f"2^{int(n).bit_length() - 1} float32 pair" if n else "float32 pair"
    rows = []
    for key, label, limit in RATIOS:
        if key not in out:
            continue
        use_cpu = CLOCK["name"] == "cpu" and f"{key}_cpu" in out
        value = float(out[f"{key}_cpu"] if use_cpu else out[key])
        clock = "cpu" if use_cpu else "wall"
        parts = [f"{clock} clock"]
        if use_cpu:
            parts.append(f"wall-clock ratio {out[key]:.3g}")
        gbps = out.get(key.replace("_over_copyto", "_gbps"))
        if gbps is not None:
            parts.append(f"wall {gbps:.2f} GB/s vs copyto {out.get('copyto_gbps', 0.0):.2f} GB/s")
        parts.append(f"median of {out.get('repeats')} alternating repeats (bench_compare.run)")
        if "compiled_loop" in out:
            loop = "numba loop" if out["compiled_loop"] else "numpy fold (numba not installed)"
            parts.append(f"full metrics through the {loop}")
        rows.append(
            judged(
                f"{NAME}: {label}",
                size,
                value,
                "×",
                limit,
                at_least=True,
                detail="; ".join(parts),
                extra={"quick_target": True, **out},  # the same target at the quick size
            )
        )
    small = _small_row(out)
    return rows if small is None else [*rows, small]


def run(quick: bool) -> list[Row]:
    """Rows from ``benchmarks.bench_compare.run(quick)``, or a "not available yet" row."""
    bench, why = find("benchmarks.bench_compare:run")
    if bench is None:
        return [missing(NAME, "2^26 float32 pairs", why, "equal ≥ 0.5, full ≥ 0.25, small ≤ 60 µs")]
    out = bench(quick)
    if isinstance(out, dict) and any(key in out for key, _, _ in RATIOS):
        return _rows_from_dict(out)
    if isinstance(out, dict) and not {"measurement", "value"} <= set(out):
        return [
            Row(NAME, str(k), float(v), "×", "", None, "info")
            for k, v in out.items()
            if isinstance(v, int | float)
        ]
    items = out if isinstance(out, list | tuple) else [out]
    return [_as_row(x) for x in items]
