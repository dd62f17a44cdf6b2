"""The dashboards in a real browser: headless Chromium (Debian's package) driven by playwright.

Each page is opened from a file and from a real ``mlflow server``'s UI (the artifact viewer,
which shows HTML in an ``<iframe sandbox="allow-scripts">`` loaded from a ``blob:`` URL). The
tests assert that no console error occurs, that the charts and tables rendered, and save
screenshots under ``$PARITY_TEST_ARTIFACTS`` (default: ``parity-tests/`` in the system
temp folder). Playwright never downloads a browser here.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest
from helpers import screenshot_dir

from parity_tracker.dashboards.nightly import render_history, render_matrix
from parity_tracker.dashboards.report import render_run_report
from parity_tracker.dashboards.samples import synthetic_nightly, synthetic_run
from parity_tracker.statuses import FAILING

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict:
    """The three pages built from synthetic results, written to files."""
    out = tmp_path_factory.mktemp("dashboards")
    run = synthetic_run(rows=2000, steps=20)
    cells, runs, tag_status = synthetic_nightly()
    files = {
        "report.html": render_run_report(run),
        "matrix.html": render_matrix(cells),
        "history.html": render_history(runs, tag_status),
    }
    for name, html in files.items():
        (out / name).write_text(html, encoding="utf-8")
    return {"dir": out, "run": run, "cells": cells, "runs": runs, "tag_status": tag_status}


class Console:
    """Collects console errors and page errors (from every frame) of one page."""

    def __init__(self, page, only_url_prefix: str | None = None):
        self.errors: list[str] = []
        self.prefix = only_url_prefix

        def on_console(msg):
            url = (msg.location or {}).get("url", "")
            if msg.type == "error" and (self.prefix is None or url.startswith(self.prefix)):
                self.errors.append(f"{msg.text} @ {url}")

        page.on("console", on_console)
        if only_url_prefix is None:
            page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))


def _new_page(browser, **kw):
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, **kw)
    context.route("http://*/**", lambda route: route.abort())  # no network from a file page
    context.route("https://*/**", lambda route: route.abort())
    return context, context.new_page()


def _shot(target, name: str, **kw) -> Path:
    path = screenshot_dir() / name
    target.screenshot(path=str(path), **kw)
    assert path.stat().st_size > 3_000  # a real image, not an empty frame
    return path


def _wait_charts(frame) -> None:
    frame.wait_for_selector("body[data-charts='ready']", timeout=60_000)


def _failing_count(table) -> int:
    return int(
        pc.sum(
            pc.is_in(table["status"], value_set=__import__("pyarrow").array(sorted(FAILING)))
        ).as_py()
        or 0
    )


def test_report_from_file(browser, pages):
    run = pages["run"]
    context, page = _new_page(browser)
    console = Console(page)
    page.goto((pages["dir"] / "report.html").as_uri())
    _wait_charts(page)
    # Charts: the propagation chart (2 panels) and the histogram (absent here: not recorded).
    assert page.locator("#propagation-chart .main-svg").count() >= 2
    kinds = run.modules["kind"].to_pylist()
    n_points = sum(k in ("output", "manual") for k in kinds)
    top_panel = page.locator("#propagation-chart .subplot.xy .scatterlayer .trace .point")
    # each output once per panel (SQNR panel: only finite or ∞ SQNR), plus cache-hit and star
    assert top_panel.count() >= n_points
    assert page.locator("#histogram-unavailable").is_visible()
    # Table: one row per module row; "failing only" leaves exactly the failing rows.
    rows = page.locator("#modules-table tbody tr")
    assert rows.count() == run.modules.num_rows
    page.select_option(".controls select[name=status]", "failing")
    visible = page.locator("#modules-table tbody tr:not([hidden])")
    assert visible.count() == _failing_count(run.modules)
    assert page.locator(".controls .count").inner_text() == (
        f"{_failing_count(run.modules)} of {run.modules.num_rows} rows"
    )
    # Sort by max |Δ| descending: the first row holds the largest value of the table.
    header = page.locator("#modules-table th", has_text="max |Δ|")
    header.click()
    header.click()
    first_value = visible.first.locator("td").nth(6).inner_text()
    largest = pc.max(run.modules["max_abs_diff"]).as_py()
    assert float(first_value) == pytest.approx(largest, rel=1e-3)
    page.select_option(".controls select[name=status]", "")
    header.click()  # back to ascending
    assert console.errors == []
    page.evaluate("window.scrollTo(0,0)")
    _shot(page, "report_file_top.png")
    _shot(page.locator("#propagation-chart"), "report_file_chart.png")
    context.close()


def test_report_histogram_and_ops(browser, tmp_path):
    import numpy as np

    from parity_tracker.dashboards.report import diff_histogram

    run = synthetic_run(rows=600, steps=6, diverge_step=1)
    assert run.ops.num_rows == 5  # the first divergent module's ops, one root cause
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(64, 64))
    cand = ref + rng.normal(scale=1e-4, size=ref.shape) * (rng.random(ref.shape) < 0.3)
    run.summary["worst_tensor_histogram"] = diff_histogram(
        ref, cand, tag="checker_transformer_blocks.3.ff", step=2
    )
    path = tmp_path / "report.html"
    path.write_text(render_run_report(run), encoding="utf-8")
    context, page = _new_page(browser)
    console = Console(page)
    page.goto(path.as_uri())
    _wait_charts(page)
    assert page.locator("#histogram-chart .main-svg").count() >= 1
    assert page.locator("#histogram-chart .scatterlayer .trace").count() == 1
    ops = page.locator("#ops-table tbody tr")
    assert ops.count() == run.ops.num_rows
    assert page.locator("#ops-table tbody tr.root").count() == 1
    assert console.errors == []
    _shot(page.locator("#histogram-chart"), "report_file_histogram.png")
    _shot(page.locator("#ops-table"), "report_file_ops.png")
    context.close()


def test_report_readable_without_scripts(browser, pages):
    run = pages["run"]
    context, page = _new_page(browser, java_script_enabled=False)
    page.goto((pages["dir"] / "report.html").as_uri())
    verdict = page.locator("#verdict").inner_text()
    assert "PARITY FAILS" in verdict
    assert run.summary["first_divergence"]["tag"] in verdict
    assert run.summary["first_divergence"]["tag"] in page.locator(".box.bad").first.inner_text()
    assert page.locator("#modules-table tbody tr").count() == run.modules.num_rows
    assert page.locator("body[data-charts='pending']").count() == 1
    _shot(page, "report_noscript.png")
    context.close()


def test_matrix_from_file(browser, pages):
    cells = pages["cells"]
    context, page = _new_page(browser)
    console = Console(page)
    page.goto((pages["dir"] / "matrix.html").as_uri())
    assert page.locator("#matrix td.cell").count() == len(cells)
    for status in {c["status"] for c in cells}:
        n = sum(c["status"] == status for c in cells)
        assert page.locator(f"#matrix td.cell[data-status='{status}']").count() == n
    # the colour comes from the stylesheet: a regression cell is dark red
    reg = page.locator("#matrix td.cell[data-status='regression']").first
    assert reg.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(183, 28, 28)"
    assert console.errors == []
    _shot(page, "matrix_file.png", full_page=True)
    context.close()


def test_history_from_file(browser, pages):
    runs = pages["runs"]
    context, page = _new_page(browser)
    console = Console(page)
    page.goto((pages["dir"] / "history.html").as_uri())
    _wait_charts(page)
    fingerprints = {r["fingerprint"] for r in runs}
    # a chart for each configuration that is not bitwise equal at every commit
    inexact = {
        r["fingerprint"]
        for r in runs
        if r["regression"] or r["tensors_failing"] or r["output_max_abs_diff"]
    }
    charts = page.locator("[id^='history-chart-']")
    assert 0 < charts.count() == len(inexact) < len(fingerprints)
    assert page.locator("#overview tbody tr").count() == len(fingerprints)
    assert page.locator("[id^='history-chart-'] .main-svg").count() >= 2 * len(inexact)
    assert page.locator("#heatmap-0 .main-svg").count() >= 1
    assert page.locator("#heatmap-0 .heatmaplayer image, #heatmap-0 .hm").count() >= 1
    regressions = [r for r in runs if r["regression"]]
    assert page.locator("h2:has-text('Regressions') + .box li").count() == len(regressions)
    assert console.errors == []
    _shot(page, "history_file_top.png")
    _shot(page.locator("#heatmap-0"), "history_file_heatmap.png")
    context.close()


@pytest.mark.server
def test_pages_in_mlflow_ui(browser, pages, mlflow_server, request):
    """Log the pages as artifacts of a run on a real server and open them in the MLflow UI."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server)
    exp = client.create_experiment(f"dashboards-{request.node.name}")
    run_id = client.create_run(exp).info.run_id
    for name in ("report.html", "matrix.html", "history.html"):
        client.log_artifact(run_id, str(pages["dir"] / name))
    context = browser.new_context(viewport={"width": 1500, "height": 1300})
    context.route(
        lambda url: not url.startswith(mlflow_server) and not url.startswith(("blob:", "data:")),
        lambda route: route.abort(),
    )
    page = context.new_page()
    # The raw artifact URL serves the exact bytes (as an attachment, so the UI is the viewer).
    raw = page.request.get(f"{mlflow_server}/get-artifact?path=report.html&run_uuid={run_id}")
    assert raw.ok and raw.body() == (pages["dir"] / "report.html").read_bytes()
    page.close()
    checks = {
        "report.html": lambda f: f.locator("#propagation-chart .main-svg").count() >= 2,
        "matrix.html": lambda f: f.locator("#matrix td.cell").count() == len(pages["cells"]),
        "history.html": lambda f: f.locator("[id^='history-chart-'] .main-svg").count() >= 2,
    }
    errors = []
    for name, check in checks.items():
        page = context.new_page()  # a fresh page: the UI reuses its iframe between artifacts
        console = Console(page, only_url_prefix="blob:")  # our page runs in a blob: iframe
        page.goto(f"{mlflow_server}/#/experiments/{exp}/runs/{run_id}/artifacts/{name}")
        iframe = page.wait_for_selector("iframe.mlflow-html-iframe", timeout=60_000)
        assert "allow-scripts" in (iframe.get_attribute("sandbox") or "")
        frame = iframe.content_frame()
        frame.wait_for_selector("#verdict", timeout=60_000)
        if name != "matrix.html":
            _wait_charts(frame)
        assert check(frame), name
        _shot(page, f"mlflow_ui_{name.removesuffix('.html')}.png")
        errors += console.errors
        page.close()
    assert errors == []
    context.close()
