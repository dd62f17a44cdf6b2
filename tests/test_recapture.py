"""Issue 19, measurement 10: a re-captured tensor's pair held as an alias of the earlier pair.

A module's output is the next module's input, a parent's input is its first child's input, a
last child's output is the parent's output: the same tensor is captured again under another tag.
In a bulk-compared eager run (small pairs held as bytes, ``compare.batch``) the reference side
already shares one snapshot (``Snapshotter.take``: the same bytes); a candidate pair whose
reference is that snapshot and whose candidate bytes equal, byte for byte, those of the last
pair held with it is held as an alias of that pair (``HeldPairs.dedupe``) and gets its record
without being compared again. Every row stays, with its own tag.

What makes a reused verdict wrong, and is tested here: the candidate written between the two
captures (in place: a version bump; through a numpy view or a raw pointer: none), the same
object turned into another view (``t_``: same bytes, other values), a negative bit set in place
(same bytes, other values), inference tensors (no version counter), a per-tag tolerance that
differs between the two tags, spilled reference snapshots, an error record. Expected values
come from numpy on the inputs, or from the same run with ``HeldPairs.dedupe = False`` (every
pair compared on its own, as before).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.capture.tags import input_tag, module_tag
from parity_tracker.compare.batch import HeldPairs
from parity_tracker.compare.pairing import PairComparer
from parity_tracker.files.dump import load_dump
from parity_tracker.tensor_checker import DumpMode, TensorChecker, module_register_tensor_checker

F32 = np.float32


class _Scale(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * self.scale


class _Chain(nn.Module):
    """``b(a(x))``; ``write(y)`` runs on ``a``'s output between its capture and ``b``'s input's.

    Captures per side, in order: ``checker_model_input_0`` = ``checker_a_input_0`` = x,
    ``checker_a`` = ``checker_b_input_0`` = y (unless written), ``checker_b`` =
    ``checker_model`` = z.
    """

    def __init__(self, sa: float, sb: float, write=None) -> None:
        super().__init__()
        self.a, self.b, self.write = _Scale(sa), _Scale(sb), write

    def forward(self, x):
        y = self.a(x)
        if self.write is not None:
            self.write(y)
        return self.b(y)


def _run(ref, cand, x, mode="equal", dedupe=True, grad_mode=torch.no_grad, **kw):
    """(rows by tag, pairs held as aliases, checker) of an eager run of ``ref``, ``cand`` on x."""
    aliases = []
    real = HeldPairs.alias

    def alias(self, key, tag, i):
        aliases.append(tag)
        return real(self, key, tag, i)

    HeldPairs.dedupe, HeldPairs.alias = dedupe, alias
    try:
        checker = TensorChecker(verbose=False, eager_mode=mode, **kw)
        with (
            module_register_tensor_checker(ref, checker),
            module_register_tensor_checker(cand, checker),
            grad_mode(),
        ):
            ref(x)
            cand(x)
        result = checker.check(mode)
    finally:
        HeldPairs.dedupe, HeldPairs.alias = True, real
    return {r["tag"]: r for r in result.to_rows()}, len(aliases), checker


def _same_rows(a: dict, b: dict) -> None:
    """Every row present in both, field for field (NaN-free floats compared exactly)."""
    assert a.keys() == b.keys()
    for tag in a:
        assert a[tag] == b[tag], tag


def _x(n: int = 4, m: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, m, generator=torch.Generator().manual_seed(seed))


def test_unchanged_recaptures_are_aliases_with_their_own_rows():
    x = _x()
    rows, aliases, _ = _run(_Chain(2.0, 3.0), _Chain(2.0, 3.0), x)
    off, none, _ = _run(_Chain(2.0, 3.0), _Chain(2.0, 3.0), x, dedupe=False)
    assert (aliases, none) == (3, 0)  # a_input_0, b_input_0, model: held as aliases
    _same_rows(rows, off)
    tags = {"checker_model_input_0", "checker_a_input_0", "checker_a", "checker_b_input_0"}
    assert tags | {"checker_b", "checker_model"} == rows.keys()
    assert {r["status"] for r in rows.values()} == {"equal"}
    # every row its own: its own tag, the content hash of its own values (one per tensor)
    assert rows["checker_a"]["ref_hash"] == rows["checker_b_input_0"]["ref_hash"]
    assert rows["checker_a"]["ref_hash"] != rows["checker_a_input_0"]["ref_hash"]


def _ctypes_write(t: torch.Tensor) -> None:
    """``t[0, 0] = 5`` through a raw pointer: no version bump, no torch call."""
    five = (ctypes.c_float * 1)(5.0)
    ctypes.memmove(t.data_ptr(), five, 4)


_WRITES = {
    "in place (version bump)": lambda y: y[0, 0].fill_(5.0),
    "numpy view (no bump)": lambda y: y.numpy().__setitem__((0, 0), 5.0),
    "dlpack view (no bump)": lambda y: np.from_dlpack(y).__setitem__((0, 0), 5.0),
    "raw pointer (no bump)": _ctypes_write,
    ".data (no bump)": lambda y: y.data.__setitem__((0, 0), 5.0),
}


@pytest.mark.parametrize("write", list(_WRITES.values()), ids=list(_WRITES))
def test_candidate_written_between_captures_is_compared_again(write):
    """The candidate's y[0, 0] = 5 after its capture as ``checker_a``: b's input differs."""
    x = _x()
    rows, _, _ = _run(_Chain(2.0, 3.0), _Chain(2.0, 3.0, write), x)
    y = x.numpy() * F32(2.0)
    assert rows["checker_a"]["status"] == "equal"  # captured before the write
    b_in = rows["checker_b_input_0"]
    assert b_in["status"] == "mismatch"
    assert b_in["mismatch_count"] == 1
    assert b_in["max_abs_diff"] == abs(5.0 - float(y[0, 0]))
    z_diff = abs(float(F32(5.0) * F32(3.0)) - float(y[0, 0] * F32(3.0)))
    assert rows["checker_model"]["max_abs_diff"] == z_diff
    off, _, _ = _run(_Chain(2.0, 3.0), _Chain(2.0, 3.0, write), x, dedupe=False)
    _same_rows(rows, off)


def test_written_and_restored_between_captures_is_equal():
    """Values at each capture are what counts: changed then restored is the same values."""
    x = _x()

    def write(y):
        old = float(y[0, 0])
        y.numpy()[0, 0] = 5.0
        y.numpy()[0, 0] = old

    rows, aliases, _ = _run(_Chain(2.0, 3.0), _Chain(2.0, 3.0, write), x)
    assert aliases == 3
    assert {r["status"] for r in rows.values()} == {"equal"}


def test_same_object_turned_into_another_view_is_compared_again():
    """``y.t_()``: the same object and bytes, other values in C order (y.T)."""
    x = _x(4, 4)
    rows, _, _ = _run(_Chain(2.0, 3.0), _Chain(2.0, 3.0, lambda y: y.t_()), x)
    y = x.numpy() * F32(2.0)
    b_in = rows["checker_b_input_0"]
    assert b_in["status"] == "mismatch"
    assert b_in["max_abs_diff"] == float(np.abs(y.T.astype(np.float64) - y).max())
    assert b_in["mismatch_count"] == int((y != y.T).sum())  # 12: the off-diagonal values


def test_negative_bit_set_in_place_is_compared_again():
    """``torch._C._set_neg``: the same object and bytes, every value negated."""
    set_neg = getattr(torch._C, "_set_neg", None)
    if set_neg is None:
        pytest.skip("this torch has no _set_neg")
    x = _x()
    rows, _, _ = _run(_Chain(2.0, 3.0), _Chain(2.0, 3.0, lambda y: set_neg(y, True)), x)
    y = (x.numpy() * F32(2.0)).astype(np.float64)
    b_in = rows["checker_b_input_0"]
    assert b_in["status"] == "mismatch"
    assert b_in["max_abs_diff"] == float(np.abs(2 * y).max())


@pytest.mark.parametrize("write", [None, lambda y: y.add_(1.0)], ids=["unchanged", "add_"])
def test_inference_tensors_without_version_counter(write):
    """Inference tensors have no version counter: only their bytes tell (a write: compared)."""
    x = _x()
    rows, aliases, _ = _run(
        _Chain(2.0, 3.0), _Chain(2.0, 3.0, write), x, grad_mode=torch.inference_mode
    )
    y = x.numpy() * F32(2.0)
    b_in = rows["checker_b_input_0"]
    if write is None:
        assert aliases == 3
        assert {r["status"] for r in rows.values()} == {"equal"}
    else:
        assert b_in["status"] == "mismatch"
        assert b_in["mismatch_count"] == 64
        assert b_in["max_abs_diff"] == float(np.abs((y + F32(1.0)).astype(np.float64) - y).max())


def test_alias_of_identical_pair_has_its_own_tags_tolerances():
    """allclose: the alias's record carries the tolerances its own tag resolves."""
    x = _x()
    tol = {"checker_a_input_0": (1e-3, 2e-3)}
    rows, aliases, _ = _run(_Chain(2.0, 3.0), _Chain(2.0, 3.0), x, "allclose", tolerances=tol)
    assert aliases == 3
    model_in, a_in = rows["checker_model_input_0"], rows["checker_a_input_0"]
    assert model_in["status"] == a_in["status"] == "equal"
    # float32 defaults of torch.testing.assert_close (rtol 1.3e-6, atol 1e-5); the override
    assert (model_in["rtol"], model_in["atol"]) == (1.3e-6, 1e-5)
    assert (a_in["rtol"], a_in["atol"]) == (1e-3, 2e-3)
    off, _, _ = _run(_Chain(2.0, 3.0), _Chain(2.0, 3.0), x, "allclose", False, tolerances=tol)
    _same_rows(rows, off)


def _close_scale() -> float:
    return 2.0 * (1.0 + 2**-22)  # y differs from 2x by a few ULP: close, not equal


def test_alias_of_differing_pair_is_judged_with_its_own_tags_tolerance():
    """y close under the float32 defaults; ``checker_b_input_0`` (the same y) with (0, 0)."""
    x = _x()
    tol = {"checker_b_input_0": (0.0, 0.0)}
    ref, cand = _Chain(2.0, 3.0), _Chain(_close_scale(), 3.0)
    rows, aliases, _ = _run(ref, cand, x, "allclose", tolerances=tol)
    assert aliases >= 1
    r = (x.numpy() * F32(2.0)).astype(np.float64)
    c = (x.numpy() * F32(_close_scale())).astype(np.float64)
    d = np.abs(c - r)
    assert d.max() > 0 and (d <= 1e-5 + 1.3e-6 * np.abs(r)).all()  # the truth of both rows
    assert rows["checker_a"]["status"] == "close"
    b_in = rows["checker_b_input_0"]
    assert (b_in["status"], b_in["mismatch_count"]) == ("mismatch", int((d > 0).sum()))
    off, _, _ = _run(ref, cand, x, "allclose", False, tolerances=tol)
    _same_rows(rows, off)


def test_differing_pair_compared_once_for_its_aliases(monkeypatch):
    """A differing pair re-captured: compared alone once, its record given to the alias."""
    calls = []
    real = PairComparer.compare_alone

    def counting(self, tag, *a, **k):
        calls.append(tag)
        return real(self, tag, *a, **k)

    monkeypatch.setattr(PairComparer, "compare_alone", counting)
    told = []
    x = _x()

    def run(dedupe):
        calls.clear()
        told.clear()
        rows, _, _ = _run(
            _Chain(2.0, 3.0),
            _Chain(2.5, 3.0),
            x,
            dedupe=dedupe,
            on_compared=lambda tag, step, r, c, comp: told.append((tag, comp.status)),
        )
        return rows, sorted(calls), sorted(told)

    rows, calls_on, told_on = run(True)
    off, calls_off, told_off = run(False)
    _same_rows(rows, off)
    y_r, y_c = x.numpy() * F32(2.0), x.numpy() * F32(2.5)
    a = rows["checker_a"]
    assert rows["checker_b_input_0"]["status"] == a["status"] == "mismatch"
    assert a["max_abs_diff"] == float(np.abs(y_c.astype(np.float64) - y_r).max())
    both = ["checker_a", "checker_b", "checker_b_input_0", "checker_model"]
    assert calls_off == both
    assert calls_on == ["checker_a", "checker_b"]  # b_input_0 and model: their pairs' records
    assert told_on == told_off  # on_compared told of every pair, as without aliases
    assert [t for t, _ in told_on] == sorted(["checker_a_input_0", "checker_model_input_0", *both])


def test_spilled_reference_snapshots_still_give_every_row():
    """A bound that spills part of the reference: rows as without aliases, and as numpy says."""
    n, width = 200, 256  # 1 KiB activations: 201 distinct tensors a side, most captured twice
    scales = [1.0 + 0.5 * (i % 3) for i in range(n)]
    ref = nn.Sequential(*[_Scale(s) for s in scales])
    cand_scales = list(scales)
    cand_scales[150] = 7.0  # diverges at module 150
    cand = nn.Sequential(*[_Scale(s) for s in cand_scales])
    x = torch.randn(1, width, generator=torch.Generator().manual_seed(3))
    kw = {"max_resident_bytes": 160 << 10}  # bulk on (>= 128 KiB); 4 pairs held at a time
    rows, aliases, checker = _run(ref, cand, x, **kw)
    assert checker._store.spilled_count > 0 and aliases > 0
    off, _, _ = _run(ref, cand, x, dedupe=False, **kw)
    _same_rows(rows, off)
    v_r = v_c = x.numpy()
    expected = {}
    for i in range(n):
        expected[input_tag(str(i), "0")] = np.array_equal(v_r, v_c)
        v_r, v_c = v_r * F32(scales[i]), v_c * F32(cand_scales[i])
        expected[module_tag(str(i))] = np.array_equal(v_r, v_c)
    for tag, same in expected.items():
        assert rows[tag]["status"] == ("equal" if same else "mismatch"), tag
    assert sum(not s for s in expected.values()) == 2 * (n - 150) - 1


def test_every_mismatching_recaptured_row_gets_its_dump(tmp_path):
    """With dumps planned, each mismatching row has its own files, of its capture-time values."""
    x = _x()
    write = _WRITES["numpy view (no bump)"]
    checker = TensorChecker(verbose=False, eager_mode="equal", dump_mode=DumpMode.NOT_EQUAL)
    ref, cand = _Chain(2.0, 3.0), _Chain(2.0, 3.0, write)
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        ref(x)
        cand(x)
    result = checker.check("equal", dump_mode=DumpMode.NOT_EQUAL, dump_path=tmp_path)
    rows = {r.tag: r for r in result.results}
    failing = {t for t, r in rows.items() if r.comparison.status == "mismatch"}
    assert failing == {"checker_b_input_0", "checker_b", "checker_model"}
    assert all(rows[t].dump_paths for t in failing)
    (folder,) = tmp_path.iterdir()
    dumped = {}
    for entry, t in load_dump(folder):
        dumped.setdefault(entry["tag"], []).append(t.numpy())
    y = x.numpy() * F32(2.0)
    y_c = y.copy()
    y_c[0, 0] = 5.0
    ref_b_in, cand_b_in = dumped["checker_b_input_0"]
    assert np.array_equal(ref_b_in, y) and np.array_equal(cand_b_in, y_c)
    ref_z, cand_z = dumped["checker_model"]
    assert np.array_equal(ref_z, y * F32(3.0)) and np.array_equal(cand_z, y_c * F32(3.0))


@pytest.mark.slow
def test_llama_tiny_decode_rows_identical_with_and_without_aliases():
    """The decode loop of measurement 10 (3 steps): every row, field for field."""
    from parity_tracker.builtin_targets import _common, llama_tiny
    from parity_tracker.run.run import run_parity

    steps = 3
    ids = llama_tiny.token_ids(length=llama_tiny.PROMPT_LEN + steps - 1)
    reference = llama_tiny.make_model()
    candidate = _common.frozen_copy(reference)
    drive = llama_tiny.kv_drive(ids, llama_tiny.PROMPT_LEN, steps)

    aliases = []
    real = HeldPairs.alias

    def alias(self, key, tag, i):
        aliases.append(tag)
        return real(self, key, tag, i)

    def run(dedupe):
        HeldPairs.dedupe, HeldPairs.alias = dedupe, alias
        try:
            return run_parity(reference, candidate, drive=drive, mode="equal", dump_mode="not")
        finally:
            HeldPairs.dedupe, HeldPairs.alias = True, real

    on = run(True)
    assert len(aliases) > 100  # 50 re-captures a side and step (w7dec): most held as aliases
    off = run(False)
    a, b = on.modules.to_pylist(), off.modules.to_pylist()
    assert len(a) == len(b) == on.modules.num_rows > 0
    drop = {"run_id"}  # each run its own id
    for ra, rb in zip(a, b, strict=True):
        assert {k: v for k, v in ra.items() if k not in drop} == {
            k: v for k, v in rb.items() if k not in drop
        }
    assert {r["status"] for r in a} <= {"equal", "skipped"}
