"""Issue 13, items 10-12: what a new user reads after a nightly.

10 each per-cell progress line shows the cell's final verdict; 11 the headline counts failing
cells that are not expected, baseline or not; 12 the browse hint works as pasted and names the
nightly's pages on disk.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from parity_tracker.cli import terminal as T
from parity_tracker.dashboards.digest import render_digest
from parity_tracker.pipeline.matrix import Cell
from parity_tracker.pipeline.results import CellResult, NightlyResult

VAE_BF16 = Cell("vae-tiny", (("quantization", "bf16"),))


def _nightly(cells, fail_on="regression"):
    return NightlyResult("p1", "abc", (1, 1), cells, [], fail_on)


def _expected_cell():
    return CellResult(Cell("digits-cnn", (("quantization", "int8"),)), run_id="r1",
                      passed=False, tensors_failing=6, changes={"expected": 6})  # fmt: skip


def _failing_without_baseline():
    # no baseline: no regression row, 4 failing tensors no expected entry covers
    return CellResult(VAE_BF16, run_id="r2", passed=False, tensors_failing=4,
                      unexpected_failing=4, changes={"new": 10})  # fmt: skip


def test_progress_line_shows_the_final_verdict_not_the_raw_pass_fail(capsys):
    reporter = T.RichReporter()
    reporter.start(2)
    reporter.cell_done(_expected_cell())
    reporter.cell_done(_failing_without_baseline())
    reporter.stop()
    err = capsys.readouterr().err
    assert "digits-cnn[quantization=int8]: expected" in err
    assert "vae-tiny[quantization=bf16]: fail" in err


def test_headline_counts_unexpected_failing_cells_even_without_a_baseline():
    res = _nightly([_expected_cell(), _failing_without_baseline()])
    assert res.exit_code == 0  # --fail-on regression: no regression without a baseline
    assert [c.cell.name for c in res.unexpected_cells] == ["vae-tiny[quantization=bf16]"]
    assert res.headline == (
        "FAIL (1 cell failing, not expected; exit 0 under --fail-on regression)"
    )
    digest = render_digest(res)
    assert digest.splitlines()[0] == f"# Parity nightly — {res.headline}"
    assert "PASS" not in digest
    assert res.to_dict()["unexpected_cells"] == ["vae-tiny[quantization=bf16]"]
    mismatch = _nightly([_expected_cell(), _failing_without_baseline()], "mismatch")
    assert mismatch.headline == "FAIL (1 cell failing, not expected; exit 1)"


def test_headline_passes_when_only_expected_cells_fail():
    res = _nightly([_expected_cell()])
    assert (res.exit_code, res.headline) == (0, "PASS")
    assert render_digest(res).startswith("# Parity nightly — PASS\n")


def test_browse_hint_works_as_pasted_and_names_the_pages_on_disk(tmp_path):
    from parity_tracker.track.parents import log_artifact_files, start_parent_run

    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    run_id = start_parent_run(tracking_uri=uri, commit="abc", branch="main")
    pages = {}
    for name in ("matrix.html", "history.html", "digest.md"):
        pages[name] = tmp_path / name
        pages[name].write_text(name, encoding="utf-8")
    log_artifact_files(run_id, pages, tracking_uri=uri)
    hint = T.browse_hint(uri, run_id)
    lines = hint.splitlines()
    command = shlex.split(lines[1])
    # an absolute executable beside this interpreter, not a bare `parity-tracker`
    assert Path(command[0]).is_absolute() and Path(command[0]).parent == Path(sys.executable).parent
    assert command[1:] == ["ui", "--tracking-uri", uri]
    on_disk = [Path(x.strip()) for x in lines[3:]]
    assert [p.name for p in on_disk] == ["matrix.html", "history.html", "digest.md"]
    assert all(p.is_file() and p.read_text() == p.name for p in on_disk)
    assert "make ui" not in hint  # not the default store: `make ui` would open another one


def test_browse_hint_offers_make_ui_only_where_it_works(tmp_path, monkeypatch):
    from parity_tracker.track.store import default_tracking_uri

    monkeypatch.chdir(tmp_path)  # the default store here, but no Makefile: no `make ui`
    assert "make ui" not in T.browse_hint(default_tracking_uri(), None)
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)  # the checkout: its Makefile has the target (nothing is written)
    assert "  make ui" in T.browse_hint(default_tracking_uri(), None).splitlines()
    makefile = (repo / "Makefile").read_text()
    assert "\nui: install\n\t$(VENV)/bin/parity-tracker ui\n" in makefile
