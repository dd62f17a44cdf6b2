"""Dashboards without a browser: content, numbers, size and build time of the pages.

Expected values are computed independently (numpy float64, hand-worked examples, the tables
themselves), never read back from the renderer's own helpers.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
from html import unescape
from html.parser import HTMLParser
from types import SimpleNamespace

import numpy as np
import pytest

from parity_tracker.dashboards.nightly import render_history, render_matrix
from parity_tracker.dashboards.report import diff_histogram, pick_worst, render_run_report
from parity_tracker.dashboards.samples import synthetic_nightly, synthetic_run
from parity_tracker.files.tables import MODULES_SCHEMA, OPS_SCHEMA, rows_to_table

MB = 1_000_000


class _Doc(HTMLParser):
    """Collects text per element id, table rows and figure JSON blocks of a page."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.text_by_id: dict[str, list[str]] = {}
        self._open: list[str] = []
        self.rows: dict[str, int] = {}
        self._table: list[str] = []
        self.figures: dict[str, dict] = {}
        self._figure: str | None = None
        self.links: list[str] = []
        self.html = html
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._table.append(a.get("id") or "")
        if tag == "tr" and self._table:
            self.rows[self._table[-1]] = self.rows.get(self._table[-1], 0) + 1
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if tag == "script" and "pt-figure" in (a.get("class") or ""):
            self._figure = a["data-target"]
        if "id" in a:
            self._open.append(a["id"])
            self.text_by_id.setdefault(a["id"], [])

    def handle_endtag(self, tag):
        if tag == "table" and self._table:
            self._table.pop()

    def handle_data(self, data):
        if self._figure:
            self.figures[self._figure] = json.loads(data)
            self._figure = None
        for i in self._open[-3:]:
            self.text_by_id[i].append(data)

    def text(self, element_id: str) -> str:
        """Text of the element with that id (header, div, section: closed explicitly)."""
        m = re.search(
            rf"<(\w+)[^>]*\bid=[\"']{re.escape(element_id)}[\"'][^>]*>(.*?)</\1>",
            self.html,
            re.S,
        )
        assert m, element_id
        return " ".join(unescape(re.sub(r"<[^>]+>", " ", m.group(2))).split())


def _run(rows, ops=(), **summary):
    return SimpleNamespace(
        modules=rows_to_table(rows, MODULES_SCHEMA),
        ops=rows_to_table(list(ops), OPS_SCHEMA),
        summary=summary,
        settings={"target": "tiny", "candidate": "tiny_scaled", "quantization": "none"},
    )


def _row(tag, order, status="equal", kind="output", step=0, diff=0.0, **kw):
    return {
        "tag": tag,
        "module": tag.removeprefix("checker_"),
        "kind": kind,
        "exec_order": order,
        "step": step,
        "status": status,
        "max_abs_diff": diff,
        "ref_shape": [2, 3],
        "cand_shape": [2, 3],
        "ref_dtype": "float32",
        "cand_dtype": "float32",
        **kw,
    }


# ---------------------------------------------------------------------------------------------
# diff_histogram / pick_worst


def test_diff_histogram_hand_example():
    ref = np.array([1.0, 2.0, 3.0, 4.0, 5.0, np.nan])
    cand = np.array([1.0, 2.001, 3.1, 4.0, 6.0, 1.0])  # |Δ| = 0, 1e-3, 1e-1, 0, 1, (nan)
    h = diff_histogram(ref, cand, tag="t", step=3, bins=3)
    assert h["numel"] == 6 and h["zero_count"] == 2 and h["nonfinite"] == 1
    assert h["tag"] == "t" and h["step"] == 3 and h["scale"] == "log"
    # log10 range [-3, 0] in 3 bins: [1e-3,1e-2) [1e-2,1e-1) [1e-1,1e0]
    np.testing.assert_allclose(h["edges"], [1e-3, 1e-2, 1e-1, 1.0], rtol=1e-9)
    assert h["counts"] == [1, 0, 2]


def test_diff_histogram_matches_numpy_on_random_data():
    rng = np.random.default_rng(7)
    ref = rng.normal(size=10_000).astype(np.float32)
    cand = (ref + rng.normal(scale=1e-3, size=ref.shape) * (rng.random(ref.shape) < 0.5)).astype(
        np.float32
    )
    h = diff_histogram(ref, cand, bins=20)
    d = np.abs(cand.astype(np.float64) - ref.astype(np.float64))
    assert h["zero_count"] == int((d == 0).sum())
    assert sum(h["counts"]) + h["zero_count"] == d.size
    edges = np.asarray(h["edges"])
    expected, _ = np.histogram(d[d > 0], bins=edges)
    assert h["counts"] == expected.tolist()


def test_diff_histogram_accepts_torch_and_rejects_bad_input():
    torch = pytest.importorskip("torch")
    r = torch.zeros(4, dtype=torch.bfloat16)
    c = torch.tensor([0.0, 0.5, 0.0, 0.25], dtype=torch.bfloat16)
    h = diff_histogram(r, c, bins=2)
    assert h["zero_count"] == 2 and sum(h["counts"]) == 2
    with pytest.raises(ValueError, match="shape"):
        diff_histogram(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="bins"):
        diff_histogram(np.zeros(3), np.ones(3), bins=0)


def test_diff_histogram_all_equal_has_no_bins():
    h = diff_histogram(np.ones(5), np.ones(5))
    assert h["zero_count"] == 5 and h["counts"] == [] and h["edges"] == []


def test_pick_worst_lowest_sqnr_then_largest_diff():
    rows = [
        _row("checker_a", 0, "mismatch", diff=1.0, sqnr_db=40.0),
        _row("checker_b", 1, "mismatch", diff=1e-3, sqnr_db=10.0),
        _row("checker_c", 2, "mismatch", diff=5.0, sqnr_db=None),
        _row("checker_d", 3, "close", diff=9.0, sqnr_db=1.0),  # passing: never the worst
    ]
    assert pick_worst(rows_to_table(rows, MODULES_SCHEMA))["tag"] == "checker_b"
    assert pick_worst(rows[2:3])["tag"] == "checker_c"
    assert pick_worst([rows[3]]) is None


# ---------------------------------------------------------------------------------------------
# the run report


def test_report_plain_html_verdict_and_first_divergence():
    rows = [
        _row("checker_fc1", 1, sqnr_db=float("inf")),
        _row("checker_fc1.weight", 0, kind="param"),
        _row("checker_fc2", 3, "mismatch", diff=2e-3, sqnr_db=55.0, dump_path="tensors/f__ref.npy"),
        _row("checker_model", 4, "mismatch", diff=4e-3, sqnr_db=50.0),
        _row("checker_act", 2, "close", diff=1e-7, sqnr_db=130.0),
    ]
    html = render_run_report(
        _run(
            rows,
            first_divergence={"tag": "checker_fc2", "module": "fc2", "step": 0, "exec_order": 3},
            passed=False,
            mode="equal",
            mode_reason="no setting calls for allclose",
            output_max_abs_diff=4e-3,
        ),
        tensor_base_url="http://srv/get-artifact?run_uuid=R&path=",
    )
    doc = _Doc(html)
    verdict = doc.text("verdict")
    assert "PARITY FAILS" in verdict and "2 of 5 tensors failing" in verdict
    assert "checker_fc2" in verdict and "exec #3" in verdict and "max |Δ| 4.00e-03" in verdict
    assert "First divergence: checker_fc2 (step 0, exec #3) in module fc2 mismatch" in doc.text(
        "where"
    )
    assert doc.rows["modules-table"] == 1 + len(rows)  # header + rows
    # execution order, not insertion order: the param (exec 0) comes first
    body = html[html.index("id='modules-table'") :]
    order = [m for m in re.findall(r"<td>(checker_[\w.]+)", body)]
    assert order == [
        "checker_fc1.weight",
        "checker_fc1",
        "checker_act",
        "checker_fc2",
        "checker_model",
    ]
    assert "http://srv/get-artifact?run_uuid=R&path=tensors/f__ref.npy" in doc.links
    assert "http://srv/get-artifact?run_uuid=R&path=tensors/f__cand.npy" in doc.links
    assert "<code>equal</code> — no setting calls for allclose" in html
    assert "histogram-unavailable" in html


def test_report_derives_first_divergence_and_chart_marks():
    rows = [
        _row("checker_a", 0),
        _row("checker_b", 1, "mismatch", diff=1e-3, sqnr_db=40.0),
        # a cache hit is never the first divergence (compare.verdict): its error is the cache's
        _row("checker_c", 2, "shape_mismatch", diff=None, cache_hit=True),
    ]
    ops = [
        {
            "tag": "b.op0",
            "module": "b",
            "op": "aten::mul",
            "op_index": 0,
            "status": "mismatch",
            "root_cause": True,
            "cause": "A",
            "step": 0,
            "inputs_status": "passing",
        },
    ]
    doc = _Doc(render_run_report(_run(rows, ops)))
    assert "checker_b" in doc.text("verdict")  # derived: first failing row in exec order
    fig = doc.figures["propagation-chart"]
    traces = {t.get("name"): t for t in fig["data"] if t.get("name")}
    # zero diff drawn at the floor (a decade under the smallest positive diff), no-metric at top
    eq = next(t for t in fig["data"] if t.get("name") == "equal" and t["yaxis"] == "y")
    assert eq["y"] == [1e-4] and eq["marker"]["symbol"] == ["circle-open"]
    sm = next(t for t in fig["data"] if t.get("name") == "shape_mismatch" and t["yaxis"] == "y")
    assert sm["y"] == [1e-2] and sm["marker"]["symbol"] == ["x"]
    assert traces["root-cause op"]["x"] == [1]
    assert traces["cache hit"]["x"] == [2]
    first_line = [s for s in fig["layout"]["shapes"] if s["line"]["color"] == "#c62828"]
    assert [s["x0"] for s in first_line] == [1]
    assert doc.rows["ops-table"] == 2


def test_report_figures_are_valid_plotly():
    import plotly.graph_objects as go

    run = synthetic_run(rows=300, steps=3, diverge_step=0)
    run.summary["worst_tensor_histogram"] = diff_histogram(np.zeros(10), np.arange(10) * 1e-3)
    doc = _Doc(render_run_report(run))
    assert set(doc.figures) == {"propagation-chart", "histogram-chart"}
    for fig in doc.figures.values():
        go.Figure(fig)  # raises ValueError on any property plotly.js does not know


def test_report_error_run():
    rows = [_row("checker_a", 0), _row("checker_b", 1, "missing_candidate", diff=None)]
    err = {"type": "RuntimeError", "message": "boom", "side": "candidate", "traceback": "..."}
    doc = _Doc(render_run_report(_run(rows, error=err, passed=False)))
    assert "RUN ERROR" in doc.text("verdict")
    assert "RuntimeError: boom (on the candidate side)" in doc.text("verdict")


def test_report_passing_and_empty_runs():
    ok = _Doc(render_run_report(_run([_row("checker_a", 0)], passed=True)))
    assert "PARITY HOLDS" in ok.text("verdict") and "1 of 1 tensors pass" in ok.text("verdict")
    empty = SimpleNamespace(modules=None, ops=None, summary={}, settings={})
    assert "NOTHING COMPARED" in _Doc(render_run_report(empty)).text("verdict")


def test_report_histogram_from_dump(tmp_path):
    rng = np.random.default_rng(3)
    ref = rng.normal(size=(8, 8)).astype(np.float32)
    cand = ref + np.float32(1e-3) * (rng.random(ref.shape) < 0.25)
    np.save(tmp_path / "checker_b__step2__ref.npy", ref)
    np.save(tmp_path / "checker_b__step2__cand.npy", cand)
    index = {
        "format": "parity_tracker.dump",
        "version": 1,
        "files": [
            {
                "tag": "checker_b",
                "step": 2,
                "side": 0,
                "role": "reference",
                "file": "checker_b__step2__ref.npy",
            },
            {
                "tag": "checker_b",
                "step": 2,
                "side": 1,
                "role": "candidate",
                "file": "checker_b__step2__cand.npy",
            },
        ],
    }
    (tmp_path / "index.json").write_text(json.dumps(index))
    run = _run([_row("checker_b", 0, "mismatch", step=2, diff=1e-3, sqnr_db=30.0)])
    run.dump_dir = tmp_path
    html = render_run_report(run)
    d = np.abs(cand.astype(np.float64) - ref)
    assert f"{d.size} elements, {int((d == 0).sum())} exactly equal" in html
    hist = _Doc(html).figures["histogram-chart"]["data"][0]
    assert sum(hist["y"][:-1]) == int((d > 0).sum())
    run.dump_dir = tmp_path / "missing"
    assert "histogram-unavailable" in render_run_report(run)


def test_plotly_inlined_once_and_exact():
    from plotly.offline import get_plotlyjs

    html = render_run_report(synthetic_run(rows=200, steps=2))
    assert html.count('id="pt-plotly-gz"') == 1
    assert "cdn.plot.ly" not in html and "<script src" not in html
    payload = re.search(r'id="pt-plotly-gz">([^<]+)</script>', html).group(1)
    assert gzip.decompress(base64.b64decode(payload)).decode() == get_plotlyjs()


def test_report_size_2000_rows():
    # Build time is a benchmark figure (benchmarks/), not a timed test: only the size is asserted.
    run = synthetic_run(rows=2000, steps=20)
    html = render_run_report(run)
    size = len(html.encode("utf-8"))
    print(f"report 2000 rows: {size / MB:.2f} MB")
    assert size <= 5 * MB


def test_escaping_of_hostile_tags():
    tag = "checker_</script><img src=x onerror=alert(1)>"
    html = render_run_report(_run([_row(tag, 0, "mismatch", diff=1.0, sqnr_db=1.0)]))
    assert "<img" not in html  # escaped in HTML and in the charts' hover text
    assert "</script><img" not in html
    _Doc(html)  # parses, figure JSON included


# ---------------------------------------------------------------------------------------------
# nightly pages


def test_nightly_pages_escape_hostile_names():
    bad = "</script><img src=x onerror=alert(1)>"
    cells = [
        {
            "target": bad,
            "settings": {"quantization": bad},
            "run_id": bad,
            "status": "fail",
            "tensors_failing": 1,
            "output_max_abs_diff": 1.0,
            "url": f"u'{bad}",
            "first_divergence": bad,
            "message": bad,
        }
    ]
    runs = [
        {
            "fingerprint": bad,
            "target": bad,
            "settings": {"x": bad},
            "commit": bad,
            "run_id": bad,
            "start_time": 1,
            "tensors_failing": 1,
            "output_max_abs_diff": 1.0,
            "regression": True,
            "first_divergence": bad,
        }
    ]
    tags = [{"tag": bad, "commit": bad, "status": "mismatch"}]
    for html in (render_matrix(cells, title=bad), render_history(runs, tags, title=bad)):
        assert "<img" not in html and "</script><img" not in html
        assert "&lt;img src=x onerror=alert(1)&gt;" in html  # shown, escaped, not dropped
        _Doc(html)  # parses, figure JSON included


def test_matrix_cells_placed_coloured_and_linked():
    cells = [
        {
            "target": "a",
            "settings": {"quantization": "none", "cache": "off"},
            "run_id": "r1",
            "status": "pass",
            "tensors_failing": 0,
            "output_max_abs_diff": 0.0,
            "url": "u1",
        },
        {
            "target": "a",
            "settings": {"quantization": "int8", "cache": "off"},
            "run_id": "r2",
            "status": "expected",
            "tensors_failing": 4,
            "output_max_abs_diff": 1e-2,
            "url": "u2",
        },
        {
            "target": "b",
            "settings": {"quantization": "none", "cache": "kv"},
            "run_id": "r3",
            "status": "regression",
            "tensors_failing": 2,
            "output_max_abs_diff": 3e-3,
            "url": "u3",
            "first_divergence": "checker_layers.1",
        },
    ]
    html = render_matrix(cells)
    # columns: quantization none, int8 × cache off, kv → none/off none/kv int8/off int8/kv
    body = html[html.index("<tbody>") : html.index("</tbody>")]
    row_a, row_b = body.split("</tr>")[:2]
    tds_a = re.findall(r"<td class='([^']+)'", row_a)
    tds_b = re.findall(r"<td class='([^']+)'", row_b)
    assert tds_a == ["cell c-pass", "empty", "cell c-expected", "empty"]
    assert tds_b == ["empty", "cell c-regression", "empty", "empty"]
    assert "href='u3'" in row_b and "checker_layers.1" in row_b
    doc = _Doc(html)
    assert "REGRESSION" in doc.text("verdict") and "3 runs" in doc.text("verdict")
    assert "<script" not in html  # plain HTML page


def test_matrix_rejects_unknown_status():
    with pytest.raises(ValueError, match="status 'green'"):
        render_matrix([{"target": "a", "settings": {}, "run_id": "r", "status": "green"}])


def test_matrix_row_label_includes_varying_settings():
    cells = [
        {"target": "a", "settings": {"device": d}, "run_id": d, "status": "pass"}
        for d in ("cpu", "cuda")
    ]
    html = render_matrix(cells)
    assert "<th>a device=cpu</th>" in html and "<th>a device=cuda</th>" in html


def test_history_orders_commits_and_marks_regressions():
    runs = [
        {
            "fingerprint": "fp1",
            "target": "a",
            "settings": {"cache": "off"},
            "commit": c,
            "run_id": f"r{i}",
            "start_time": t,
            "tensors_failing": f,
            "output_max_abs_diff": d,
            "regression": reg,
        }
        for i, (c, t, f, d, reg) in enumerate(
            [
                ("ccc", 3_000_000_000_000, 3, 1e-2, True),
                ("aaa", 1_000_000_000_000, 0, 0.0, False),
                ("bbb", 2_000_000_000_000, 0, 0.0, False),
            ]
        )
    ]
    tag_status = [
        {"tag": "t1", "commit": "aaa", "status": "equal"},
        {"tag": "t1", "commit": "ccc", "status": "mismatch"},
        {"tag": "t2", "commit": "ccc", "status": "equal"},  # never fails: not drawn
    ]
    doc = _Doc(render_history(runs, tag_status))
    fig = doc.figures["history-chart-0"]
    line = fig["data"][0]
    assert line["x"] == ["aaa", "bbb", "ccc"]  # oldest → newest by start_time
    assert line["y"] == [1e-3, 1e-3, 1e-2]  # zeros at a decade under the smallest positive
    assert fig["data"][1]["y"] == [0, 0, 3]
    assert [t["name"] for t in fig["data"]][-1] == "regression"
    heat = doc.figures["heatmap-0"]["data"][0]
    assert heat["y"] == ["t1"] and heat["x"] == ["aaa", "ccc"]
    assert heat["text"] == [["equal", "mismatch"]]
    assert "REGRESSION" in doc.text("verdict")


def test_nightly_figures_are_valid_plotly():
    import plotly.graph_objects as go

    cells, runs, tag_status = synthetic_nightly()
    # expected figures, from the data: one history chart per configuration that is not exact
    # (some run regressed, failed a tensor or had a non-zero output error), one heatmap per
    # fingerprint group of tag_status with a failing tag (ids count every group)
    fingerprints: dict[str, bool] = {}
    for r in runs:
        inexact = bool(r["regression"] or r["tensors_failing"] or r["output_max_abs_diff"])
        fingerprints[r["fingerprint"]] = fingerprints.get(r["fingerprint"], False) or inexact
    n_charts = sum(fingerprints.values())
    groups: dict[str, bool] = {}
    for t in tag_status:
        key = t.get("fingerprint") or ""
        groups[key] = groups.get(key, False) or t["status"] not in ("equal", "close", "skipped")
    heatmaps = {f"heatmap-{i}" for i, failing in enumerate(groups.values()) if failing}
    assert n_charts >= 2 and heatmaps  # the sample exercises both kinds

    figures = _Doc(render_history(runs, tag_status)).figures
    assert set(figures) == {f"history-chart-{i}" for i in range(n_charts)} | heatmaps
    for fig in figures.values():
        assert fig["data"], "a figure without a trace"
        go.Figure(fig)  # raises ValueError on any property plotly.js does not know
    matrix = render_matrix(cells)
    assert "pt-figure" not in matrix and "<script" not in matrix  # the matrix has no figure


def test_history_collapses_exact_configurations_into_the_overview():
    runs = [
        {
            "fingerprint": fp,
            "target": t,
            "settings": {},
            "commit": c,
            "run_id": f"{fp}{c}",
            "start_time": i,
            "tensors_failing": 0,
            "output_max_abs_diff": d,
            "regression": False,
        }
        for fp, t, d in (("fpx", "exact", 0.0), ("fpy", "noisy", 1e-5))
        for i, c in enumerate(("c1", "c2"))
    ]
    doc = _Doc(render_history(runs))
    assert set(doc.figures) == {"history-chart-0"}  # only the inexact configuration is charted
    assert "noisy" in doc.text("fp-0")
    overview = doc.text("overview")
    assert "noisy 2 c2 0 1.00e-05 → 1.00e-05" in overview
    assert "exact 2 c2 0 bitwise equal at every commit" in overview
    assert "NO REGRESSION" in doc.text("verdict")


def test_history_survives_nan_metrics():
    nan = float("nan")
    runs = [
        {
            "fingerprint": "fp",
            "target": "a",
            "settings": {},
            "commit": c,
            "run_id": c,
            "start_time": i,
            "tensors_failing": f,
            "output_max_abs_diff": d,
            "regression": False,
        }
        for i, (c, f, d) in enumerate((("c1", nan, nan), ("c2", 2, 1e-3)))
    ]
    fig = _Doc(render_history(runs)).figures["history-chart-0"]  # strict JSON: parses
    assert fig["data"][0]["y"] == [None, 1e-3]
    assert fig["data"][1]["y"] == [None, 2.0]


# ---------------------------------------------------------------------------------------------
# the worst tensor and its histogram (issue 12)


def _bf16_run(tmp_path, dump_mode="not_equal"):
    """A real failing allclose run: a small MLP against its bf16 cast, tight tolerances."""
    import copy

    import torch
    from torch import nn

    from parity_tracker.run import run_parity

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x.to(self.fc1.weight.dtype))))

    torch.manual_seed(0)
    ref = Net()
    cand = copy.deepcopy(ref).to(torch.bfloat16)
    return run_parity(
        ref,
        cand,
        (torch.randn(4, 16),),
        mode="allclose",
        tolerances={"*": (1e-6, 1e-6)},
        dump_mode=dump_mode,
        dump_path=tmp_path / "dumps",
        environment={},
    )


def _dumped_pair(dump_dir, tag, step):
    index = json.loads((dump_dir / "index.json").read_text())["files"]
    side = {e["side"]: e["file"] for e in index if e["tag"] == tag and e["step"] == step}
    return np.load(dump_dir / side[0]), np.load(dump_dir / side[1])


def test_failing_allclose_run_report_has_the_worst_tensor_histogram(tmp_path):
    from parity_tracker.compare.verdict import worst_tensor

    result = _bf16_run(tmp_path)
    rows = result.modules.to_pylist()
    failing = [r for r in rows if r["status"] == "mismatch"]
    assert len(failing) >= 5 and result.summary["passed"] is False
    worst = worst_tensor(rows)
    html = render_run_report(result)
    doc = _Doc(html)
    assert "histogram-unavailable" not in html
    assert "histogram-chart" in doc.figures
    # the tensor named is the library's worst tensor, with the numbers of its dumped pair
    ref, cand = _dumped_pair(result.dump_dir, worst["tag"], worst["step"])
    d = np.abs(cand.astype(np.float64) - ref.astype(np.float64))
    assert f"Tensor {worst['tag']} (step {worst['step']}): {d.size} elements, " in doc.text(
        "histogram-text"
    )
    assert f"{int((d == 0).sum())} exactly equal" in html
    bars = doc.figures["histogram-chart"]["data"][0]["y"][:-1]  # step line repeats the last
    assert sum(bars) == int((d > 0).sum())


def test_nightly_dump_mode_report_has_the_worst_tensor_histogram(tmp_path):
    # the nightly's default dump mode keeps only the first divergence, so the report cannot
    # read the worst tensor back from the dump: the run stage must record its histogram
    from parity_tracker.compare.verdict import worst_tensor

    result = _bf16_run(tmp_path, dump_mode="first_not_equal")
    worst = worst_tensor(result.modules)
    assert worst["status"] == "mismatch" and worst["dump_path"] is None  # the case
    if not result.summary.get("worst_tensor_histogram"):
        pytest.xfail("run_parity does not record summary.worst_tensor_histogram yet (issue 12)")
    html = render_run_report(result)
    assert "histogram-unavailable" not in html
    assert "histogram-chart" in _Doc(html).figures
    assert f"Tensor {worst['tag']} " in _Doc(html).text("histogram-text")


def test_report_names_the_same_worst_tensor_as_the_library():
    from parity_tracker.compare.verdict import worst_tensor

    # lowest SQNR and largest max |Δ| disagree here: the report follows the one owner
    rows = [
        _row("checker_a", 0, "mismatch", diff=5.0, sqnr_db=30.0, numel=6, mismatch_count=6),
        _row("checker_b", 1, "mismatch", diff=1e-3, sqnr_db=3.0, numel=6, mismatch_count=1),
        _row("checker_c", 2, "shape_mismatch", diff=None),
    ]
    owner = worst_tensor(rows)["tag"]
    assert owner != max(rows[:2], key=lambda r: r["max_abs_diff"])["tag"]  # a real choice
    assert pick_worst(rows)["tag"] == owner
    text = _Doc(render_run_report(_run(rows, passed=False))).text("histogram-unavailable")
    assert f"the worst is {owner} (step 0)" in text


def test_report_says_why_the_histogram_is_missing_when_tensors_failed(tmp_path):
    # first_not_equal dumped only the first divergence; the worst tensor is another one
    rows = [
        _row("checker_a", 0, "mismatch", diff=1e-3, sqnr_db=60.0, dump_path="tensors/a__ref.npy"),
        _row("checker_b", 1, "mismatch", diff=1e-2, sqnr_db=20.0),
    ]
    run = _run(rows, passed=False, dump_mode="first_not_equal")
    run.dump_dir = tmp_path  # a local dump without the worst tensor
    text = _Doc(render_run_report(run)).text("histogram-unavailable")
    assert "no tensor failed" not in text
    assert "2 tensor(s) failed; the worst is checker_b (step 0), but it was not dumped" in text
    assert "dump mode first_not_equal kept only 1 other tensor(s) (e.g. checker_a)" in text
    assert "--dump-mode not_equal" in text
    # no dump at all
    bare = _run([dict(r, dump_path=None) for r in rows], passed=False)
    text = _Doc(render_run_report(bare)).text("histogram-unavailable")
    assert "this run dumped no tensor" in text and "--dump-mode not_equal" in text
    # dumped, but the report is rebuilt from the stored tables (no local folder)
    stored = _run([rows[0], dict(rows[1], dump_path="tensors/b__ref.npy")], passed=False)
    text = _Doc(render_run_report(stored)).text("histogram-unavailable")
    assert "its dump (tensors/b__ref.npy) is not on this machine" in text
    # failing without any value mismatch, and nothing failing at all
    shape = _run([_row("checker_a", 0, "shape_mismatch", diff=None)], passed=False)
    text = _Doc(render_run_report(shape)).text("histogram-unavailable")
    assert "1 tensor(s) failed, none with a value mismatch (shape_mismatch)" in text
    ok = _run([_row("checker_a", 0)], passed=True)
    assert "no tensor failed" in _Doc(render_run_report(ok)).text("histogram-unavailable")


# ---------------------------------------------------------------------------------------------
# layering


def test_dashboards_import_only_the_library_records():
    """Presentation reads records: never mlflow, the CLI, tracking or the pipeline."""
    import ast
    from pathlib import Path

    import parity_tracker.dashboards as dashboards

    forbidden = ("mlflow", "parity_tracker.cli", "parity_tracker.track")
    seen = set()
    for path in Path(dashboards.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                bad = [f for f in forbidden if name == f or name.startswith(f + ".")]
                assert not bad, f"{path.name} imports {name}"
                seen.add(name)
    assert "parity_tracker.compare.verdict" in seen  # the scan does see imports


def test_history_ranks_a_failing_verdict_with_no_failing_tensor_as_failing():
    # "zzz" fails by its stored verdict (an output-only rule) with 0 tensors failing and 0
    # output error; "aaa" passes with a small output error. By the verdict zzz ranks first
    # and is not "bitwise equal"; by names alone (both 0 failing) aaa would come first.
    runs = [
        {"fingerprint": fp, "target": name, "settings": {}, "commit": c, "run_id": f"{fp}{c}",
         "start_time": i, "tensors_failing": 0, "output_max_abs_diff": d, "regression": False,
         "passed": passed}
        for fp, name, d, passed in (("fpa", "aaa", 1e-5, True), ("fpz", "zzz", 0.0, False))
        for i, c in enumerate(("c1", "c2"))
    ]  # fmt: skip
    overview = _Doc(render_history(runs)).text("overview")
    assert overview.index("zzz") < overview.index("aaa")
    assert "zzz 2 c2 0 (verdict fail)" in overview
    assert "bitwise equal" not in overview  # neither configuration is exact


def test_history_chart_keeps_the_given_commit_order_of_a_re_run_old_commit():
    # c1 was tested first and re-run last (its newest run, shown, started at 4): positions
    # (analysis.history.latest_per_commit) keep it first; start times alone would put it last
    runs = [
        {"fingerprint": "fp", "target": "a", "settings": {}, "commit": c, "run_id": f"r{c}",
         "start_time": t, "position": p, "tensors_failing": f, "output_max_abs_diff": d,
         "regression": False}
        for c, t, p, f, d in (("c2", 2, 1, 1, 0.5), ("c1", 4, 0, 0, 0.0), ("c3", 3, 2, 1, 0.5))
    ]  # fmt: skip
    fig = _Doc(render_history(runs)).figures["history-chart-0"]
    assert fig["data"][0]["x"] == ["c1", "c2", "c3"]
    assert fig["data"][1]["y"] == [0, 1, 1]
