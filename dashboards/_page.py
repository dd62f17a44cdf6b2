"""What every dashboard page shares: the Jinja2 environment, number formats, plotly.js, colours.

Every page is one self-contained HTML file: no network, no external file. The markup lives in
``templates/*.html.j2`` (Jinja2, autoescape on: every value is HTML-escaped unless a helper
here returns it as :class:`markupsafe.Markup`); the stylesheet and the two scripts are the
static templates ``_page.css.j2``, ``_loader.js.j2`` and ``_tables.js.j2``.

Pages that chart carry plotly.js once, gzip-compressed and base64-encoded (4.8 MB of
plotly.min.js becomes 2.0 MB, which keeps a 2,000-row run report well under 5 MB); a small
loader inflates it with the browser's ``DecompressionStream`` (Chrome 80+, Firefox 113+, Safari
16.4+) and draws every figure stored as JSON in ``<script type="application/json"
class="pt-figure">`` blocks. Everything a reader needs first (verdict, first divergence, tables)
is plain HTML, so a page still reads when scripts are blocked; the MLflow UI shows HTML
artifacts in an ``<iframe sandbox="allow-scripts">`` loaded from a ``blob:`` URL (MLflow 3.x
``ShowArtifactHtmlView``), where scripts do run but the origin is opaque: the pages use no
storage, cookies, popups or top-level navigation.
"""

from __future__ import annotations

import base64
import functools
import gzip
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
from markupsafe import Markup

#: Colours per comparison status (design.md, "Statuses"): (foreground, background).
STATUS_COLORS: dict[str, tuple[str, str]] = {
    "equal": ("#1b5e20", "#e8f5e9"),
    "close": ("#00695c", "#e0f2f1"),
    "mismatch": ("#b71c1c", "#ffebee"),
    "shape_mismatch": ("#880e4f", "#fce4ec"),
    "missing_reference": ("#4a148c", "#f3e5f5"),
    "missing_candidate": ("#4a148c", "#f3e5f5"),
    "skipped": ("#616161", "#f5f5f5"),
    "error": ("#bf360c", "#fff3e0"),
}
#: Marker colours for charts, one per status.
STATUS_MARKERS: dict[str, str] = {
    "equal": "#43a047",
    "close": "#26a69a",
    "mismatch": "#e53935",
    "shape_mismatch": "#d81b60",
    "missing_reference": "#8e24aa",
    "missing_candidate": "#8e24aa",
    "skipped": "#9e9e9e",
    "error": "#fb8c00",
}
#: Where the page templates live (shipped as package data: ``templates/*.j2``).
TEMPLATES = Path(__file__).with_name("templates")


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The Jinja2 environment of the dashboards (autoescape on, built once per process).

    ``trim_blocks``/``lstrip_blocks`` keep tag-only template lines out of the output. Filters:
    ``num`` (:func:`fmt_num`), ``shape`` (:func:`fmt_shape`). Globals: ``figure_json``,
    ``plotly_payload``, ``status_colors``.
    """
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["num"] = fmt_num
    env.filters["shape"] = fmt_shape
    env.globals.update(
        figure_json=figure_json,
        plotly_payload=lambda: Markup(plotly_payload()),
        status_colors=STATUS_COLORS,
    )
    return env


def render(template: str, **context: Any) -> str:
    """Render ``templates/<template>`` with ``context`` (every value autoescaped)."""
    return environment().get_template(template).render(**context)


@functools.lru_cache(maxsize=1)
def plotly_payload() -> str:
    """plotly.min.js (the copy bundled with the ``plotly`` package), gzip'd and base64-encoded.

    Computed once per process (about 0.2 s); the result is about 2.0 MB of ASCII.
    """
    from plotly.offline import get_plotlyjs

    raw = get_plotlyjs().encode("utf-8")
    return base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode("ascii")


def fmt_num(value: Any, digits: int = 3) -> str:
    """A float in short scientific-or-fixed form (``1.23e-05``, ``0``, ``inf``); None → ``—``."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    v = float(value)
    if math.isnan(v):
        return "—"
    if math.isinf(v):
        return "∞" if v > 0 else "-∞"
    if v == 0:
        return "0"
    if 1e-2 <= abs(v) < 1e5:
        return f"{v:.{digits + 1}g}"
    return f"{v:.{digits - 1}e}"


def fmt_shape(shape: Any) -> str:
    """``[1, 3, 64]`` for a list of ints; ``—`` for None."""
    return "—" if shape is None else "[" + ", ".join(str(int(s)) for s in shape) + "]"


def finite(value: Any) -> float | None:
    """``float(value)`` when it is a finite number, else None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def href(base_url: str, path: str) -> str:
    """``base_url + path`` (path percent-quoted); absolute paths and URLs are used as they are."""
    return path if "://" in path or path.startswith("/") else base_url + quote(path, safe="/")


def figure_json(figure: Mapping[str, Any]) -> Markup:
    r"""A plotly figure dict as strict JSON, safe inside ``<script type="application/json">``.

    Non-finite floats (JSON has none, e.g. from an MLflow metric) become ``null`` (plotly draws
    a gap); ``</`` is written ``<\/`` so no value can close the script element. Text inside
    the figure is escaped for plotly by ``charts.txt``.
    """
    try:
        text = json.dumps(figure, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(_finite_only(figure), separators=(",", ":"), allow_nan=False)
    return Markup(text.replace("</", "<\\/"))


def _finite_only(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (plotly draws a gap)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite_only(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_only(v) for v in value]
    return value


def chip_items(
    counts: Mapping[str, int], order: tuple[str, ...]
) -> list[tuple[str, int, str, str]]:
    """``(status, count, fg, bg)`` for the status chips: ``order`` first, then any other status."""
    keys = [k for k in order if counts.get(k)] + sorted(k for k in counts if k not in order)
    return [(k, counts[k], *STATUS_COLORS.get(k, ("#212121", "#eeeeee"))) for k in keys]
