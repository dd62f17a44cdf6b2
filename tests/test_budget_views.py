"""What a user reading a run sees: a budget run's columns (CLI worst tensors, report module
table) and the report's title for a run whose target names no candidate.

Expected budget numbers are numpy float64, computed before the run from the models alone:
``e_cand = max|cand − golden|``, ``e_twin = max|twin − golden|`` (the twin: the reference cast
to fp16, run by PyTorch), ``ratio = e_cand / max(e_twin, eps_fp16 · max|golden|)`` (README,
"Error budgets").
"""

from __future__ import annotations

import copy
import re
from html import unescape
from html.parser import HTMLParser

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.cli import terminal as T
from parity_tracker.dashboards.report import render_run_report, run_sides
from parity_tracker.run import run_parity
from parity_tracker.run.mode import side_names
from parity_tracker.tensor_checker import DumpMode

ENV = {"commit": "test"}
#: the report's module-table headers of the budget columns
BUDGET_HEADERS = {
    "error_ratio": "error ratio",
    "golden_max_abs_err": "candidate err",
    "twin_max_abs_err": "PyTorch err",
}


class _Table(HTMLParser):
    """Header texts and rows (cell texts) of the table with id ``table_id``."""

    def __init__(self, page: str, table_id: str) -> None:
        super().__init__(convert_charrefs=True)
        self.table_id, self.inside, self.cell = table_id, False, None
        self.headers: list[str] = []
        self.rows: list[list[str]] = []
        self.feed(page)
        self.headers = [h.strip() for h in self.headers]

    def handle_starttag(self, tag, attrs):
        if tag == "table" and dict(attrs).get("id") == self.table_id:
            self.inside = True
        elif self.inside and tag == "tr":
            self.rows.append([])
        elif self.inside and tag in ("th", "td"):
            self.cell = tag
            (self.headers if tag == "th" else self.rows[-1]).append("")

    def handle_endtag(self, tag):
        if tag == "table":
            self.inside = False

    def handle_data(self, data):
        if self.inside and self.cell:
            target = self.headers if self.cell == "th" else self.rows[-1]
            target[-1] += data

    def row(self, tag: str) -> dict[str, str]:
        i = self.headers.index("tag")
        (row,) = [r for r in self.rows if len(r) > i and r[i] == tag]
        return dict(zip(self.headers, (c.strip() for c in row), strict=True))


def _number(text: str) -> float:
    return float(text.replace("∞", "inf"))


@pytest.fixture(scope="module")
def budget_run():
    """An fp16 engine whose last Linear's bias is off by 3e-3 (about 3 fp16 ULPs at |y| ~ 1),
    run with ``mode="budget"``; and the expected numbers of that Linear's output."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).eval()
    cand = copy.deepcopy(model).half()
    with torch.no_grad():
        cand[2].bias += 3e-3
    x = torch.randn(16, 8)
    with torch.no_grad():
        w1, b1, w2, b2 = (p.double().numpy() for p in model.parameters())
        golden = np.tanh(x.double().numpy() @ w1.T + b1) @ w2.T + b2
        twin = copy.deepcopy(model).half()(x.half()).double().numpy()
        engine = cand(x.half()).double().numpy()
    e_cand, e_twin = np.abs(engine - golden).max(), np.abs(twin - golden).max()
    floor = np.finfo(np.float16).eps * np.abs(golden).max()
    want = {
        "golden_max_abs_err": e_cand,
        "twin_max_abs_err": e_twin,
        "error_ratio": e_cand / max(e_twin, floor),
    }
    cand.register_forward_pre_hook(lambda _m, args: tuple(a.half() for a in args))
    result = run_parity(model, cand, (x,), mode="budget", environment=ENV, dump_mode=DumpMode.NOT)
    assert result.summary["mode"] == "budget" and not result.passed
    assert want["error_ratio"] > 2  # over the default budget: a failing, listed row
    return result, want


def _rich_rows(text: str) -> list[dict[str, str]]:
    """The rows of the first rich table in ``text`` (heavy header ┃, light body │ borders)."""
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("┃"))
    names = [c.strip() for c in header.strip("┃").split("┃")]
    body = [line for line in lines if line.startswith("│")]
    return [dict(zip(names, (c.strip() for c in line.strip("│").split("│")), strict=True))
            for line in body]  # fmt: skip


def test_cli_worst_table_shows_the_budget_columns(budget_run, capsys, monkeypatch):
    result, want = budget_run
    monkeypatch.setenv("COLUMNS", "250")
    T.print_run(result, None, "sqlite:///unused.db", "exp")
    rows = {r["tag"]: r for r in _rich_rows(capsys.readouterr().out)}
    row = rows["checker_2"]
    assert row["status"] == "mismatch"
    for column, value in want.items():  # printed with 3 significant digits (fmt_n)
        assert _number(row[column]) == pytest.approx(value, rel=5e-3), column


def test_cli_worst_table_of_another_mode_has_no_budget_columns(capsys, monkeypatch):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    cand = copy.deepcopy(ref)
    with torch.no_grad():
        cand[0].bias += 0.5
    result = run_parity(ref, cand, (torch.randn(2, 4),), mode="allclose", environment=ENV,
                        dump_mode=DumpMode.NOT)  # fmt: skip
    monkeypatch.setenv("COLUMNS", "250")
    T.print_run(result, None, "sqlite:///unused.db", "exp")
    (first, *_) = _rich_rows(capsys.readouterr().out)
    assert list(first) == ["tag", "step", "status", "max_abs_diff", "sqnr_db"]


def test_report_module_table_and_first_divergence_show_the_budget(budget_run):
    result, want = budget_run
    page = render_run_report(result)
    table = _Table(page, "modules-table")
    row = table.row("checker_2")
    for column, value in want.items():  # fmt_num: 4 significant digits, or 3 in e-notation
        assert _number(row[BUDGET_HEADERS[column]]) == pytest.approx(value, rel=5e-3), column
    first = re.search(r"<span id='first-budget'>(.*?)</span>", page, re.S)
    assert first, "the first divergence names its budget"
    text = " ".join(unescape(first.group(1)).split())
    ratio = float(re.search(r"error ratio ([0-9.e+-]+)", text).group(1))
    assert ratio == pytest.approx(want["error_ratio"], rel=5e-3)


def test_report_of_another_mode_keeps_its_columns():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    result = run_parity(ref, copy.deepcopy(ref), (torch.randn(2, 4),), environment=ENV,
                        dump_mode=DumpMode.NOT)  # fmt: skip
    page = render_run_report(result)
    headers = _Table(page, "modules-table").headers
    assert not set(BUDGET_HEADERS.values()) & set(headers) and "first-budget" not in page
    assert headers[:7] == ["#", "step", "exec", "tag", "kind", "status", "max |Δ|"]


# --------------------------------------------------------------------------- the title


class RefNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x)


class EngineNet(RefNet):
    pass


def _title(page: str) -> str:
    return unescape(re.search(r"<title>(.*?)</title>", page).group(1))


def test_report_title_names_the_callers_own_models():
    torch.manual_seed(0)
    ref = RefNet()
    cand = EngineNet()
    cand.load_state_dict(ref.state_dict())
    x = (torch.randn(2, 4),)
    result = run_parity(ref, cand, x, environment=ENV, dump_mode=DumpMode.NOT)
    assert _title(render_run_report(result)) == "parity: RefNet vs EngineNet"
    assert result.settings["reference_model"] == "RefNet"
    named = run_parity(ref, cand, x, settings={"target": "my-net"}, environment=ENV,
                       dump_mode=DumpMode.NOT)  # fmt: skip
    assert _title(render_run_report(named)) == "parity: my-net vs EngineNet"
    page = render_run_report(named)
    assert re.search(r"<h1>my-net <span class='note'>vs</span> EngineNet</h1>", page)


def test_the_class_names_leave_the_fingerprint_alone():
    from parity_tracker.run.mode import config_fingerprint

    torch.manual_seed(0)
    ref = RefNet()
    result = run_parity(ref, copy.deepcopy(ref), (torch.randn(2, 4),), settings={"q": "none"},
                        environment=ENV, dump_mode=DumpMode.NOT)  # fmt: skip
    assert result.settings["candidate_model"] == "RefNet"
    assert config_fingerprint(result.settings) == config_fingerprint({"q": "none"})


def test_run_sides_prefers_the_settings_then_the_classes():
    assert run_sides({"target": "vae-tiny", "candidate": "onnxruntime",
                      "reference_model": "A", "candidate_model": "B"}) == (
        "vae-tiny", "onnxruntime")  # fmt: skip
    assert run_sides({"reference_model": "A", "candidate_model": "B"}) == ("A", "B")
    assert run_sides({"target": "t", "candidate": ""}) == ("t", "?")  # an old record
    compiled = torch.compile(RefNet())  # named by what it compiles; nothing is compiled here
    assert side_names(RefNet(), compiled) == {
        "reference_model": "RefNet", "candidate_model": "RefNet (torch.compile)"}  # fmt: skip


# --------------------------------------------------------------------------- the seed facade


def _facade(twin_as_reference: bool):
    """The README's facade budget check of a plain bf16 cast (the engine is the twin's copy).

    ``twin_as_reference``: the twin is hooked on the main checker in the reference's place
    and ``check_budget(golden_tc)`` gets no twin checker (``run_parity``'s sides); else the
    README's four checkers-worth of sides (reference, candidate, golden, twin)."""
    from parity_tracker.capture.golden import golden_copy, golden_mode
    from parity_tracker.capture.twin import make_twin
    from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker

    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).eval()
    x = torch.randn(4, 16)
    golden, twin = golden_copy(model), make_twin(model, torch.bfloat16)
    eng = copy.deepcopy(twin)
    with torch.no_grad():  # expected, before any hook: the output against the fp32 reference
        fp32_gap = (eng(x.bfloat16()).double() - model(x).double()).abs().max().item()
    tc, golden_tc, twin_tc = (TensorChecker(verbose=False) for _ in range(3))
    module_register_tensor_checker(twin if twin_as_reference else model, tc)
    module_register_tensor_checker(eng, tc)
    module_register_tensor_checker(golden, golden_tc)
    if not twin_as_reference:
        module_register_tensor_checker(twin, twin_tc)
    with torch.no_grad():
        (twin(x.bfloat16()) if twin_as_reference else model(x)), eng(x.bfloat16())
        if not twin_as_reference:
            twin(x.bfloat16())
        with golden_mode():
            golden(x.double())
    result = tc.check_budget(golden_tc, None if twin_as_reference else twin_tc)
    return result, fp32_gap


def test_facade_budget_compares_with_the_reference_the_caller_hooked():
    """design.md (budget mode, facade): the verdict columns are the same either way; the
    reference-vs-candidate columns are against whatever the caller hooked as the reference."""
    as_readme, fp32_gap = _facade(twin_as_reference=False)
    as_run, _ = _facade(twin_as_reference=True)
    readme_rows = {r["tag"]: r for r in as_readme.to_rows()}
    run_rows = {r["tag"]: r for r in as_run.to_rows()}
    assert set(readme_rows) == set(run_rows) and as_readme.passed and as_run.passed
    for tag, row in run_rows.items():
        for col in ("golden_max_abs_err", "twin_max_abs_err", "error_ratio"):
            assert readme_rows[tag][col] == row[col], (tag, col)
        # the engine IS the twin, bit for bit: run_parity's reading
        assert row["status"] == "equal" and row["max_abs_diff"] == 0, tag
    out = readme_rows["checker_model"]  # against the fp32 reference: a cast is only close
    assert out["status"] == "close"
    assert out["max_abs_diff"] == pytest.approx(fp32_gap, rel=1e-9) and fp32_gap > 0
