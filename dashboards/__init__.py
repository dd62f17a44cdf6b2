"""HTML dashboards for parity runs: the run report and the nightly matrix and history pages.

Every page is one self-contained HTML file (plotly.js inlined once, compressed; no network),
readable inside the MLflow UI's artifact viewer.
"""

from parity_tracker.dashboards.nightly import render_history, render_matrix
from parity_tracker.dashboards.report import diff_histogram, pick_worst, render_run_report

__all__ = ["diff_histogram", "pick_worst", "render_history", "render_matrix", "render_run_report"]
