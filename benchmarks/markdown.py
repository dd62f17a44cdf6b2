"""Render one or more result files as the README's markdown table.

``python -m benchmarks.markdown benchmarks/results/latest.json [more.json ...]`` prints a table
(one line per row, in file order) preceded by each file's machine line, ready to paste under
"Results" in ``benchmarks/README.md``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _figure(row: dict[str, Any]) -> str:
    if row["value"] is None:
        return "—"
    return f"{row['value']:.3g} {row['unit']}".strip()


def _verdict(row: dict[str, Any]) -> str:
    return {"ok": "met", "missed": "**missed**", "info": "info"}.get(row["status"], row["status"])


def render(paths: list[Path]) -> str:
    """The markdown table of every row of the given ``latest.json``-style files."""
    lines = []
    for path in paths:
        meta = json.loads(path.read_text())["meta"]
        lines.append(
            f"- `{path.name}`: {meta['machine']}, torch {meta['torch']}, "
            f"{meta['torch_threads']} torch thread(s), {meta['mode']}, commit "
            f"{meta.get('git_commit') or '?'}, {meta['date']}"
        )
    lines += ["", "| measurement | case | figure | target | verdict |", "|---|---|---|---|---|"]
    for path in paths:
        for row in json.loads(path.read_text())["rows"]:
            cells = (row["measurement"], row["case"], _figure(row), row["target"], _verdict(row))
            lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    files = [Path(p) for p in sys.argv[1:]] or [Path(__file__).parent / "results" / "latest.json"]
    print(render(files))
