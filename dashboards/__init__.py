"""HTML dashboards for parity runs: the run report and the nightly matrix and history pages.

Every page is one self-contained HTML file (plotly.js inlined once, compressed; no network),
readable inside the MLflow UI's artifact viewer. The markup is Jinja2 templates with autoescape
(``templates/*.html.j2``); the modules prepare the data. Imports are relative so the package
works under both names it has during the reorganisation (``dashboards`` and
``parity_tracker.dashboards``).
"""

from .histogram import diff_histogram, pick_worst, worst_tensor_histogram
from .nightly import render_history, render_matrix
from .report import render_run_report

__all__ = [
    "diff_histogram",
    "pick_worst",
    "render_history",
    "render_matrix",
    "render_run_report",
    "worst_tensor_histogram",
]
