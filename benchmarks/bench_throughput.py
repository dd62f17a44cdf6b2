"""Measurement 4: compare throughput ÷ ``numpy.copyto`` bandwidth on 2^26-element float32 pairs.

The comparison-core engineer owns the measurement (``benchmarks/bench_compare.py``, targets:
equal path ≥ 0.5, full metrics ≥ 0.25); this module only calls its ``run(quick)`` and turns
what it returns into table rows.
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


#: (key in bench_compare's result, row label, target): the issue's two goals.
RATIOS = (
    ("equal_over_copyto", "equal path", 0.5),
    ("full_over_copyto", "full metrics", 0.25),
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
        rows.append(
            judged(
                f"{NAME}: {label}",
                size,
                value,
                "×",
                limit,
                at_least=True,
                detail="; ".join(parts),
                extra=out,
            )
        )
    return rows


def run(quick: bool) -> list[Row]:
    """Rows from ``benchmarks.bench_compare.run(quick)``, or a "not available yet" row."""
    bench, why = find("benchmarks.bench_compare:run")
    if bench is None:
        return [missing(NAME, "2^26 float32 pairs", why, "equal ≥ 0.5, full ≥ 0.25")]
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
