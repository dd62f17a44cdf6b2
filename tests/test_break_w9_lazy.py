"""Adversarial cases for a check's results kept by column (w9brk2, wave 9; w9rows's change).

``compare.assemble.check_result`` returns a ``compare.results.LazyCheckResult``: the results
are kept by column and ``TagResult`` records are made only for failing rows, or for all when
``results``/``weights`` is first read. Here: the seed facade's return value and printout (the
seed's format, /work/shared/spec/seed-in-english.md), reads in every order, mutation of the
returned list, ``dataclasses.replace``, pickle/deepcopy, equality with a plain ``CheckResult``
of the same records, repeated calls (``@1`` tags), multi-step runs, one-sided and never-called
modules, dumps, budget columns, op-level runs, and ``run_parity``'s ``modules`` table against
one built independently from the check's records (``TagResult.to_row``).

Expected tags, statuses and printout lines are written out by hand for a two-Linear model whose
candidate's ``b.bias`` is shifted by 1 (so ``b``, ``b.bias`` and the root differ; nothing else).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import itertools
import math
import pickle
import tempfile

import pytest
import torch
from torch import nn

from parity_tracker.compare.results import CheckResult, LazyCheckResult, TagResult
from parity_tracker.files.tables import MODULES_SCHEMA, rows_to_table
from parity_tracker.run.run import run_parity
from parity_tracker.tensor_checker import DumpMode, TensorChecker, module_register_tensor_checker

ENV = {"git_commit": "w9brk2", "git_branch": "w9brk2", "git_dirty": False}


class _Net(nn.Module):
    def __init__(self, unused: bool = False) -> None:
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = nn.Linear(2, 2)
        if unused:
            self.unused = nn.Linear(2, 2)

    def forward(self, x):
        return self.b(self.a(x))


def _pair(unused: bool = False):
    torch.manual_seed(0)
    ref, cand = _Net(unused), _Net(unused)
    cand.load_state_dict(ref.state_dict())
    with torch.no_grad():
        cand.b.bias += 1.0
    return ref, cand


def _check(calls: int = 1, unused: bool = False, verbose: bool = False, **kw):
    ref, cand = _pair(unused)
    checker = TensorChecker(verbose=verbose)
    module_register_tensor_checker(ref, checker)
    module_register_tensor_checker(cand, checker)
    x = torch.ones(1, 2)
    with torch.no_grad():
        for _ in range(calls):
            ref(x)
            cand(x)
    if unused:  # one-sided manual tags
        checker.register_tensor("ref_only", torch.zeros(2), side=0)
        checker.register_tensor("cand_only", torch.zeros(2), side=1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = checker.check_equal(**kw)
    return result, out.getvalue().splitlines()


# hand-written: first call's tags in registration order, then the @1 call's module tags
_CALL0 = [
    ("checker_a", "equal"),
    ("checker_a_input_0", "equal"),
    ("checker_a.weight", "equal"),
    ("checker_a.bias", "equal"),
    ("checker_b", "not equal"),
    ("checker_b_input_0", "equal"),
    ("checker_b.weight", "equal"),
    ("checker_b.bias", "not equal"),
    ("checker_model", "not equal"),
    ("checker_model_input_0", "equal"),
]
_CALL1 = [
    ("checker_a@1", "equal"),
    ("checker_a@1_input_0", "equal"),
    ("checker_b@1", "not equal"),
    ("checker_b@1_input_0", "equal"),
    ("checker_model@1", "not equal"),
    ("checker_model@1_input_0", "equal"),
]
_WEIGHTS = ["checker_a.weight", "checker_a.bias", "checker_b.weight", "checker_b.bias"]


def _status(word: str) -> str:
    return "equal" if word == "equal" else "mismatch"


@pytest.mark.parametrize("calls", [1, 2])
def test_facade_printout_is_the_seeds(calls):
    result, lines = _check(calls=calls, verbose=True)
    tags = _CALL0 + (_CALL1 if calls == 2 else [])
    want = [f"TensorChecker: 2 tensors {word} in {tag}" for tag, word in tags]
    want += [
        "TensorChecker: weights differ: checker_b.bias (not equal)",
        "TensorChecker: first divergence: checker_b (not equal)",
    ]
    assert lines == want
    assert isinstance(result, CheckResult) and result.passed is False


_READS = ["first_divergence", "structure_differences", "weights", "results", "to_columns"]
_ORDERS = [p for i, p in enumerate(itertools.permutations(_READS)) if i % 13 == 0]


def _read(result, name):
    return result.to_columns() if name == "to_columns" else getattr(result, name)


@pytest.mark.parametrize("order", _ORDERS, ids=["-".join(o) for o in _ORDERS])
@pytest.mark.parametrize("calls", [1, 2])
def test_reads_in_any_order_give_the_same_records(order, calls):
    result, _ = _check(calls=calls, unused=True)
    seen = {name: _read(result, name) for name in order}
    unused = [("checker_unused.weight", "equal"), ("checker_unused.bias", "equal")]
    tags = _CALL0 + unused + (_CALL1 if calls == 2 else [])  # weights at their first call
    want_tags = [t for t, _ in tags] + ["ref_only", "cand_only", "checker_unused"]
    want_status = [_status(w) for _, w in tags]
    want_status += ["missing_candidate", "missing_reference", "skipped"]
    res = seen["results"]
    assert [r.tag for r in res] == want_tags
    assert [r.status for r in res] == want_status
    assert seen["to_columns"]["tag"] == tuple(want_tags) or list(seen["to_columns"]["tag"]) == (
        want_tags
    )
    assert list(seen["to_columns"]["status"]) == want_status
    assert [w.tag for w in seen["weights"]] == [*_WEIGHTS, "checker_unused.weight",
                                                 "checker_unused.bias"]  # fmt: skip
    assert all(any(w is r for r in res) for w in seen["weights"])  # the same objects
    fd = seen["first_divergence"]
    assert fd.tag == "checker_b" and any(fd is r for r in res)
    sd = seen["structure_differences"]
    assert [r.tag for r in sd] == ["ref_only", "cand_only"]
    assert all(any(s is r for r in res) for s in sd)
    assert result.results is res  # made once


def _same_rows(a: list[dict], b: list[dict]) -> bool:
    """Row lists equal value for value, NaN equal to NaN."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x.keys() != y.keys():
            return False
        for k in x:
            u, v = x[k], y[k]
            if isinstance(u, float) and isinstance(v, float) and math.isnan(u) and math.isnan(v):
                continue
            if u != v:
                return False
    return True


def test_mutating_the_results_list_shows_in_the_table():
    result, _ = _check(calls=2, unused=True)
    res = result.results
    res.pop(0)
    res[0] = dataclasses.replace(res[0], tag="renamed")
    cols = result.to_columns()
    assert list(cols["tag"])[:2] == ["renamed", "checker_a.weight"]
    assert len(cols["tag"]) == len(res)
    table_rows = [
        {c: None if v is None else v[i] for c, v in cols.items()} for i in range(len(res))
    ]
    assert _same_rows(table_rows, [r.to_row() for r in res])
    assert [r.tag for r in result.failing] == [
        "checker_b", "checker_b.bias", "checker_model", "checker_b@1", "checker_model@1",
        "ref_only", "cand_only",
    ]  # fmt: skip


def test_one_sided_and_never_called_printout_and_lookups():
    _, lines = _check(unused=True, verbose=True)
    assert lines[-7:] == [
        "TensorChecker: 2 tensors equal in checker_unused.bias",
        "TensorChecker: 1 tensor missing_candidate in ref_only: no candidate tensor registered "
        "for ref_only",
        "TensorChecker: 1 tensor missing_reference in cand_only: no reference tensor registered "
        "for cand_only",
        "TensorChecker: 0 tensors skipped in checker_unused: module 'unused' was never called in "
        "the forward: nothing captured, not compared",
        "TensorChecker: weights differ: checker_b.bias (not equal)",
        "TensorChecker: structure differences (2 tags on one side only, not numeric "
        "divergences): ref_only (reference only), cand_only (candidate only)",
        "TensorChecker: first divergence: checker_b (not equal)",
    ]
    fresh, _ = _check(unused=True)
    assert "results" not in vars(fresh)
    assert fresh["checker_b"].status == "mismatch" and fresh.get("checker_b", 1) is None
    assert fresh.get("checker_unused").status == "skipped"
    with pytest.raises(KeyError):
        fresh["nope"]


def test_weights_do_not_follow_an_edit_of_results():
    result, _ = _check()
    result.results.clear()
    assert [w.tag for w in result.weights] == _WEIGHTS


def test_equals_a_plain_check_result_of_the_same_records():
    result, _ = _check(unused=True)
    plain = CheckResult(**{f.name: getattr(result, f.name) for f in dataclasses.fields(result)})
    assert result == plain


def test_equals_another_lazy_of_the_same_records():
    result, _ = _check(unused=True)
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    assert result == LazyCheckResult(**fields)
    plain = CheckResult(**fields)
    assert plain == CheckResult(**fields)  # the plain record's own equality holds


@pytest.mark.parametrize("read_first", [False, True])
@pytest.mark.parametrize("how", ["pickle", "deepcopy", "copy", "replace", "asdict"])
def test_round_trips_keep_every_record(how, read_first):
    result, _ = _check(calls=2, unused=True)
    if read_first:
        assert result.results and "results" in vars(result)  # records made before the copy
    twin = _check(calls=2, unused=True)[0]  # an untouched equal check: the expected rows
    want = [r.to_row() for r in twin.results]
    for row in want:  # each check writes nothing else that differs
        row.pop("dump_path")
    if how == "pickle":
        got = pickle.loads(pickle.dumps(result))
    elif how == "deepcopy":
        got = copy.deepcopy(result)
    elif how == "copy":
        got = copy.copy(result)
    elif how == "replace":
        got = dataclasses.replace(result, mode="equal")
    else:
        d = dataclasses.asdict(result)
        assert [r["tag"] for r in d["results"]] == [r["tag"] for r in want]
        assert d["first_divergence"]["tag"] == "checker_b"
        return
    rows = [r.to_row() for r in got.results]
    for row in rows:
        row.pop("dump_path")
    assert _same_rows(rows, want)
    assert got.first_divergence.tag == "checker_b"
    assert any(got.first_divergence is r for r in got.results)
    assert [w.tag for w in got.weights] == [*_WEIGHTS, "checker_unused.weight",
                                            "checker_unused.bias"]  # fmt: skip
    cols = got.to_columns()
    assert list(cols["tag"]) == [r["tag"] for r in want]


@pytest.mark.parametrize("dump_mode", [DumpMode.ALL, DumpMode.NOT_EQUAL, DumpMode.FIRST_NOT_EQUAL])
def test_dump_paths_in_the_table_are_the_records(tmp_path, dump_mode):
    result, _ = _check(calls=2, dump_mode=dump_mode, dump_path=tmp_path)
    cols = result.to_columns()  # before the records exist
    res = result.results
    assert list(cols["dump_path"]) == [r.dump_paths[0] if r.dump_paths else None for r in res]
    dumped = {r.tag for r in res if r.dump_paths}
    failing = {t for t, w in _CALL0 + _CALL1 if w != "equal"}
    if dump_mode == DumpMode.ALL:
        assert dumped == {t for t, _ in _CALL0 + _CALL1}
    elif dump_mode == DumpMode.NOT_EQUAL:
        assert dumped == failing
    else:
        assert dumped == {"checker_b"}  # the first failing tag in execution order
    for r in res:
        for p in r.dump_paths:
            assert (tmp_path / p).is_file(), p


# ----- run_parity: the modules table against the records -------------------------------------


def _capture_checks(monkeypatch) -> list:
    seen = []
    original = TensorChecker.check

    def spy(self, *a, **k):
        out = original(self, *a, **k)
        seen.append(out)
        return out

    monkeypatch.setattr(TensorChecker, "check", spy)
    return seen


class _Stepper(nn.Module):
    def __init__(self, bug_step: int | None = None) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.never = nn.Linear(3, 3)  # never called
        self.bug_step, self.step = bug_step, 0

    def forward(self, x):
        y = self.lin(x)
        return y + 1 if self.step == self.bug_step else y


def _drive(model, rec):
    x = torch.ones(1, 3)
    for k in range(3):
        with rec(k):
            model.step = k
            x = model(x)
            rec.register("latent", x)


def _artifact(p):
    return "tensors/" + p.split("/", 1)[-1] if p else p  # check-NNNN/x.npy -> tensors/x.npy


@pytest.mark.parametrize("case", ["one_forward", "multi_step", "ops", "dumps", "budget"])
def test_run_modules_table_is_the_records_table(case, monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen = _capture_checks(monkeypatch)
    kw: dict = {"environment": ENV, "settings": {}}
    if case in ("one_forward", "ops", "dumps", "budget"):
        ref, cand = _pair(unused=True)
        kw["inputs"] = (torch.ones(1, 2),)
    else:
        torch.manual_seed(0)
        ref, cand = _Stepper(), _Stepper(bug_step=1)
        cand.load_state_dict(ref.state_dict())
        kw["drive"] = _drive
    if case == "ops":
        kw["capture_ops"] = True
    if case == "dumps":
        kw.update(dump_mode=DumpMode.ALL, dump_path=tmp_path / "d")
    if case == "budget":
        kw["mode"] = "budget"
        cand = cand.half()
        cand.register_forward_pre_hook(lambda _m, args: tuple(a.half() for a in args))
    result = run_parity(ref, cand, **kw)
    check = seen[-1]
    rows = []
    for r in check.results:
        row = r.to_row()
        row["run_id"] = result.run_id
        row["dump_path"] = _artifact(row["dump_path"])
        rows.append(row)
    want = rows_to_table(rows, MODULES_SCHEMA)
    assert result.modules.schema.equals(want.schema)
    got_rows, want_rows = result.modules.to_pylist(), want.to_pylist()
    diff = [
        (g["tag"], k, g[k], w[k])
        for g, w in zip(got_rows, want_rows, strict=True)
        for k in g
        if not _same_rows([{k: g[k]}], [{k: w[k]}])
    ]
    assert diff == []
    tags = [r["tag"] for r in result.modules.to_pylist()]
    if case == "multi_step":
        steps = {(r["tag"], r["step"]): r["status"] for r in result.modules.to_pylist()}
        assert steps[("latent", 0)] == "equal" and steps[("latent", 1)] != "equal"
        assert ("checker_never", 0) in steps and steps[("checker_never", 0)] == "skipped"
    if case == "ops":
        assert result.ops.num_rows > 0
        assert set(result.ops.column("run_id").to_pylist()) == {result.run_id}
    if case == "dumps":
        paths = [r["dump_path"] for r in result.modules.to_pylist() if r["dump_path"]]
        assert paths and all(p.startswith("tensors/") for p in paths)
    if case == "budget":
        col = result.modules.column("error_ratio").to_pylist()
        assert any(v is not None for v in col)
    assert "checker_unused" in tags or case == "multi_step"
    assert isinstance(check.results[0], TagResult)


def test_a_result_read_after_clear_and_a_new_check_is_unchanged():
    """The columns must not alias the checker's log: ``clear()`` and new captures after."""
    ref, cand = _pair(unused=True)
    checker = TensorChecker(verbose=False)
    module_register_tensor_checker(ref, checker)
    module_register_tensor_checker(cand, checker)
    x = torch.ones(1, 2)
    with torch.no_grad():
        ref(x)
        cand(x)
    first = checker.check_equal()
    checker.clear()
    with torch.no_grad():
        for k in (2.0, 1.0):
            ref(x * k)
            cand(x * k)
    second = checker.check_allclose()
    want = [t for t, _ in _CALL0] + ["checker_unused.weight", "checker_unused.bias"]
    want.append("checker_unused")
    assert [r.tag for r in first.results] == want
    assert list(first.to_columns()["tag"]) == want
    assert {r.comparison.mode for r in first.results} == {"equal"}
    assert first.first_divergence.tag == "checker_b"
    assert len(second.results) > len(want)


def test_isolated_run_keeps_the_records_columns(monkeypatch, tmp_path):
    """``isolate=True`` rewrites the rows (local_* columns); every other column stays."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen = _capture_checks(monkeypatch)
    ref, cand = _pair(unused=True)
    result = run_parity(ref, cand, (torch.ones(1, 2),), settings={}, environment=ENV,
                        isolate=True)  # fmt: skip
    check = seen[-1]
    got = result.modules.to_pylist()
    assert [g["tag"] for g in got] == [r.tag for r in check.results]
    records = rows_to_table([r.to_row() for r in check.results], MODULES_SCHEMA).to_pylist()
    for g, want in zip(got, records, strict=True):
        keep = [k for k in want if not k.startswith("local_") and k not in ("run_id", "dump_path")]
        bad = [(k, g[k], want[k]) for k in keep if not _same_rows([{k: g[k]}], [{k: want[k]}])]
        assert bad == [], want["tag"]
    assert any(g["local_status"] is not None for g in got)
