"""Browsing parity in the MLflow UI, in a real browser (headless Chromium, Debian's package).

A small nightly (``tests/cli_targets.py``: one bitwise-equal cell, one with layer 2 moved) is
logged to a real ``mlflow server``; the URL ``parity-tracker ui`` prints must show the runs
table with the parity columns, a cell's run page its description with the verdict, and
``tables/failing.csv`` must render as a table in the artifact viewer. Screenshots go to
``$PARITY_TEST_ARTIFACTS`` (default: ``parity-tests/`` in the system temp folder).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import screenshot_dir

pytestmark = [pytest.mark.browser, pytest.mark.server, pytest.mark.slow]

#: Column headers of the parity view (written out: the settings of cli_targets.tiny).
COLUMNS = [
    "Source", "Version", "target", "perturb", "quantization", "verdict", "tensors_failing",
    "output_max_abs_diff", "output_sqnr_db", "first_divergence",
]  # fmt: skip


@pytest.fixture(scope="module")
def nightly(mlflow_server, tmp_path_factory):
    """A two-cell nightly on the server; yields ``(experiment name, NightlyResult)``."""
    from parity_tracker.cli import report_files
    from parity_tracker.dashboards.digest import nightly_artifacts
    from parity_tracker.pipeline.nightly import run_nightly

    tmp = tmp_path_factory.mktemp("ui-nightly")
    config = tmp / "nightly.toml"
    config.write_text('[[matrix]]\ntarget = "cli_targets:tiny"\nperturb = ["none", "fc2"]\n')
    old = Path.cwd()
    os.chdir(tmp)  # the run cache (./.parity) lands in tmp
    try:
        result = run_nightly(config, tracking_uri=mlflow_server, experiment="ui-browser",
                             commit="abc1230000", branch="main", render=nightly_artifacts,
                             render_run=report_files)  # fmt: skip
    finally:
        os.chdir(old)
    return "ui-browser", result


def _printed_url(server: str, experiment: str) -> dict:
    from click.testing import CliRunner

    from parity_tracker.cli import cli

    res = CliRunner().invoke(cli, ["ui", "--tracking-uri", server, "--experiment", experiment,
                                   "--json"], catch_exceptions=False)  # fmt: skip
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _page(browser, server: str):
    context = browser.new_context(viewport={"width": 2800, "height": 1100})
    context.route(lambda url: not url.startswith((server, "blob:", "data:")),
                  lambda route: route.abort())  # fmt: skip
    return context, context.new_page()


def _shot(page, name: str) -> None:
    path = screenshot_dir() / name
    page.screenshot(path=str(path))
    assert path.stat().st_size > 3_000


def test_printed_url_shows_the_parity_runs_table(browser, mlflow_server, nightly):
    experiment, result = nightly
    urls = _printed_url(mlflow_server, experiment)
    assert urls["open"] == urls["runs_url"] and "viewStateShareKey=parity" in urls["open"]
    context, page = _page(browser, mlflow_server)
    page.goto(urls["open"])
    for cell in result.cells:  # every cell listed flat, not folded under the parent
        page.get_by_text(cell.cell.name, exact=True).first.wait_for(timeout=90_000)
    page.get_by_text("first_divergence", exact=True).first.wait_for(timeout=30_000)
    shown = {line.strip() for line in page.inner_text("body").splitlines()}
    _shot(page, "mlflow_ui_runs_view.png")
    missing = [c for c in COLUMNS if c not in shown]
    assert missing == [], f"columns not shown: {missing}"
    assert {"fail", "pass", "checker_2"} <= shown  # verdicts and the first divergence
    assert page.get_by_text("Model training").count() >= 1
    context.close()


def test_cell_run_page_shows_its_description(browser, mlflow_server, nightly):
    from parity_tracker.track.query import RunStore

    experiment, result = nightly
    failing = result.cells[1]
    url = RunStore(mlflow_server, experiment).run_url(failing.run_id)
    context, page = _page(browser, mlflow_server)
    page.goto(url)
    page.get_by_text("PARITY FAILS").first.wait_for(timeout=90_000)
    body = page.inner_text("body")
    assert "(verdict fail)" in body
    assert "first divergence: checker_2" in body
    assert "parity-tracker nightly" in body  # the Source of the run
    _shot(page, "mlflow_ui_run_page.png")
    context.close()


def test_failing_csv_renders_as_a_table(browser, mlflow_server, nightly):
    from parity_tracker.track import browse
    from parity_tracker.track.query import RunStore

    experiment, result = nightly
    failing = result.cells[1]
    exp_id = RunStore(mlflow_server, experiment).experiment_id()
    url = browse.artifact_url(mlflow_server, exp_id, failing.run_id, browse.FAILING_CSV)
    context, page = _page(browser, mlflow_server)
    page.goto(url)
    cell = page.locator("td", has_text="checker_2").first
    cell.wait_for(timeout=90_000)
    headers = page.locator("th").all_inner_texts()
    assert {"tag", "status", "max_abs_diff", "sqnr_db"} <= {h.strip() for h in headers}
    assert page.locator("td", has_text="mismatch").count() >= 1
    _shot(page, "mlflow_ui_failing_csv.png")
    context.close()
