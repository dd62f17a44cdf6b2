"""Issue 19: an aligned op pair whose reference was spilled is settled from the digests taken
when the ops ran (``capture.op_store._seal``, ``localize.op_compare._settled``), never at the
price of a verdict: the record is the comparison core's own, and a held output written behind
dispatch's back (through numpy) is still an ``error``, never ``equal``.

Expected values are computed with numpy (float64) and xxhash directly; the comparison core
(``compare_tensors`` on the tensors themselves) is the oracle for the whole record.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import xxhash
from torch import nn

import parity_tracker.localize.op_compare as op_compare
from parity_tracker.compare import compare_tensors
from parity_tracker.ops import OpSession

N = 4096  # float32 elements per op output (16 KiB)


def _record(ref: nn.Module, cand: nn.Module, x: torch.Tensor, mode: str, budget: int, tmp_path):
    s = OpSession(mode=mode, max_resident_bytes=budget, spill_dir=tmp_path)
    x_ref, x_cand = x.clone(), x.clone()  # each side its own input, as run_parity does
    with torch.no_grad():
        with s.recording(0, model=ref):
            ref(x_ref)
        with s.recording(1, model=cand):
            cand(x_cand)
    return s


class _Double(nn.Module):
    """``mul`` by 2; ``transposed``: of the input seen as (rows, n // rows) transposed, so the
    output is dense but not contiguous (mul keeps its input's strides)."""

    def __init__(self, rows: int | None = None) -> None:
        super().__init__()
        self.rows = rows

    def forward(self, x):
        if self.rows is not None:
            x = x.view(self.rows, -1).t()
        return torch.mul(x, 2.0)


def _with_nonfinite(n: int) -> torch.Tensor:
    x = torch.randn(n, generator=torch.Generator().manual_seed(3))
    x[1], x[7], x[n - 1] = math.nan, math.inf, -math.inf
    return x


@pytest.fixture
def settled(monkeypatch):
    """How many pairs ``_settled`` answered (the read-back skipped)."""
    calls = []
    real = op_compare._settled

    def counting(*args):
        out = real(*args)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(op_compare, "_settled", counting)
    return calls


@pytest.mark.parametrize("mode", ["equal", "allclose"])
@pytest.mark.parametrize("budget", [0, 1 << 30])  # everything spilled (sealed) / resident
@pytest.mark.parametrize(
    ("n", "rows"),
    [(64, None), ((1 << 20) + 5, None), (64, 8), (1 << 20, 512)],
    ids=["small", "chunked", "small-transposed", "transposed"],
)
def test_identical_pair_gets_the_comparison_cores_record(tmp_path, settled, mode, budget, n, rows):
    """The record settled from the digests is ``compare_tensors``' own, field by field; the
    hash is xxh3-64 of the C-order bytes (numpy), NaN/inf counted with numpy."""
    x = _with_nonfinite(n)
    s = _record(_Double(rows), _Double(rows), x, mode, budget, tmp_path)
    assert (s.spilled_bytes > 0) == (budget == 0)
    (row,) = s.rows()
    # settled: a spilled reference (not read back) or a transposed pair (one copy, not two);
    # a resident contiguous pair goes through compare_tensors, as cheap
    assert settled == [budget == 0 or rows is not None]
    y = x.numpy().astype(np.float64) * 2.0
    assert row["status"] == "equal"
    assert row["ref_nan"] == row["cand_nan"] == int(np.isnan(y).sum()) == 1
    assert row["ref_inf"] == row["cand_inf"] == int(np.isinf(y).sum()) == 2
    assert row["mismatch_count"] == 0 and row["max_abs_diff"] == 0.0
    expected = x * 2.0 if rows is None else (x * 2.0).view(rows, -1).t()
    shape = tuple(expected.shape)
    header = f"float32|{shape}|".encode()
    c_order = np.ascontiguousarray(expected.numpy()).tobytes()
    assert row["ref_hash"] == row["cand_hash"] == xxhash.xxh3_64(header + c_order).hexdigest()
    core = compare_tensors(expected, expected.clone(), mode=mode, tag=row["tag"]).to_dict()
    assert {k: row[k] for k in core} == core
    s.close()


class _Layout(nn.Module):
    """``mul`` by 2 of the input, or of a column-major copy of it: the same values."""

    def __init__(self, column_major: bool) -> None:
        super().__init__()
        self.column_major = column_major

    def forward(self, x):
        if self.column_major:  # (8, 16) with strides (1, 8); mul keeps them
            x = x.t().contiguous().t()
        return torch.mul(x, 2.0)


def test_pair_of_different_layouts_is_compared_not_settled(tmp_path, settled):
    """A contiguous reference output and a transposed candidate one with the same values: the
    digests are of two kinds (content hash / storage digest), so the pair is compared: equal."""
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(2))
    s = _record(_Layout(False), _Layout(True), x, "equal", 1 << 30, tmp_path)
    mul = next(r for r in s.rows() if r["op"] == "mul")
    assert settled == [False]  # mul, the one aligned pair
    assert mul["status"] == "equal" and mul["max_abs_diff"] == 0.0
    s.close()


class _SubWrite(nn.Module):
    """``sub`` (the same values on both sides), its output written through numpy after the op
    (or not), then ``mul``. The written side's sub output is resident when written and spilled
    by the captures after it (budget: one output)."""

    def __init__(self, write: bool, transposed: bool) -> None:
        super().__init__()
        self.register_buffer("offset", torch.full((N,), 0.5))
        self.write, self.transposed = write, transposed

    def forward(self, x):
        if self.transposed:  # a dense, non-contiguous output (held with a storage digest)
            y = torch.sub(x.view(64, -1).t(), self.offset.view(64, -1).t())
        else:
            y = torch.sub(x, self.offset)
        if self.write:  # bypasses dispatch: no version bump, no copy-on-write
            y.numpy()[(0,) * y.dim()] += 1.0
        z = torch.mul(y, 2.0)
        return torch.add(z, 1.0)


@pytest.mark.parametrize("budget", [N * 4, 1 << 30])  # spilled after the write / resident
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("side", ["reference", "candidate"])
def test_op_output_written_behind_dispatch_is_an_error(tmp_path, side, transposed, budget):
    """Both subs produced x − 0.5, so their digests taken when the ops ran agree; then one side's
    output is written through numpy. Equal digests must not settle the pair: the reference's
    bytes no longer hash as its op's output when spilled (not sealed), the candidate's no longer
    when compared, so the row is the ``error`` naming that side (main's rule), never ``equal``."""
    x = torch.randn(N, generator=torch.Generator().manual_seed(5))
    written, plain = _SubWrite(True, transposed), _SubWrite(False, transposed)
    ref, cand = (written, plain) if side == "reference" else (plain, written)
    s = _record(ref, cand, x, "equal", budget, tmp_path)
    assert (s.spilled_bytes > 0) == (budget == N * 4)
    rows = {r["tag"]: r for r in s.rows()}
    sub = rows["model@0::sub#0"]
    assert sub["status"] == "error", sub
    assert f"the {side}'s op output changed after the op ran" in sub["message"]
    # mul read the written y on one side only: (x[0] − 0.5 + 1)·2 vs (x[0] − 0.5)·2
    mul = rows["model@0::mul#0"]
    assert mul["status"] == "mismatch" and mul["mismatch_count"] == 1
    assert mul["max_abs_diff"] == pytest.approx(2.0, abs=1e-5)
    s.close()


class _Permuted(nn.Module):
    """``mul`` by 2 of the input seen as (2, 2, 2) through a permutation (dense, not
    contiguous): two permutations give outputs with the same bytes in storage order."""

    def __init__(self, dims: tuple[int, int, int]) -> None:
        super().__init__()
        self.dims = dims

    def forward(self, x):
        return torch.mul(x.view(2, 2, 2).permute(*self.dims), 2.0)


@pytest.mark.parametrize("budget", [0, 1 << 30])
def test_same_bytes_under_other_strides_is_a_mismatch(tmp_path, budget):
    """Strides (1, 2, 4) vs (2, 1, 4): equal storage digests, other values at the same index."""
    x = torch.arange(8.0)
    s = _record(_Permuted((2, 1, 0)), _Permuted((1, 2, 0)), x, "equal", budget, tmp_path)
    (row,) = s.rows()
    grid = x.numpy().reshape(2, 2, 2) * 2.0
    ref, cand = grid.transpose(2, 1, 0), grid.transpose(1, 2, 0)
    assert row["status"] == "mismatch"
    assert row["mismatch_count"] == int((ref != cand).sum()) == 4
    assert row["max_abs_diff"] == float(np.abs(ref - cand).max()) == 2.0
    s.close()


class _Scale(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return torch.mul(x, self.factor)


def test_spilled_reference_of_a_differing_pair_is_compared(tmp_path, settled):
    """Digests that differ are never settled: the metrics are those of the values (numpy)."""
    x = torch.randn(N, generator=torch.Generator().manual_seed(9))
    s = _record(_Scale(2.0), _Scale(3.0), x, "allclose", 0, tmp_path)
    (row,) = s.rows()
    assert settled == [False]
    ref = x.numpy().astype(np.float64) * 2.0
    cand = (x * 3.0).numpy().astype(np.float64)
    assert row["status"] == "mismatch"
    assert row["max_abs_diff"] == pytest.approx(float(np.abs(cand - ref).max()), rel=1e-6)
    s.close()


class _Twice(nn.Module):
    def forward(self, x):
        return torch.mul(x, 2.0)


class _Moved(nn.Module):
    """A module output of 128 KiB (the reference's module snapshot shares its buffer,
    copy-on-write), a child fed its transposed view (the child's input snapshot digests that
    view), then an in-place write into the output: the recorder must copy its capture of the
    output before the write wherever the buffer lives by then."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.child = _Twice(), _Twice()

    def forward(self, x):
        y = self.a(x)
        z = self.child(y.t())
        y.add_(1.0)
        return z.sum() + y.sum()


def test_digest_of_a_shared_buffer_does_not_move_it_under_the_recorder():
    """Main: ``storage_digest`` read a copy-on-write view through ``numpy()``, which gave the
    shared buffer a private copy at a new address; the op recorder's index still named the old
    one, so ``add_`` overwrote the reference's capture of ``a``'s mul and its row was an
    ``error`` for ops that computed the same values (2·x, numpy). Now ``equal``."""
    from parity_tracker.run import run_parity
    from parity_tracker.tensor_checker import DumpMode

    x = torch.randn(256, 128, generator=torch.Generator().manual_seed(4))
    result = run_parity(
        _Moved(), _Moved(), inputs=(x,), mode="equal", dump_mode=DumpMode.NOT, capture_ops=True
    )
    rows = {r["tag"]: r for r in result.ops.to_pylist()}
    mul = rows["a@0::mul#0"]
    assert mul["status"] == "equal", mul
    expected = (x.numpy().astype(np.float64) * 2.0).astype(np.float32)
    header = f"float32|{tuple(x.shape)}|".encode()
    assert mul["ref_hash"] == xxhash.xxh3_64(header + expected.tobytes()).hexdigest()
    assert all(r["status"] == "equal" for r in rows.values()), rows


def test_storage_digest_reads_a_copy_on_write_view_in_place():
    """The digest of a lazily cloned tensor's transposed view: the bytes in storage order
    (numpy on a private copy), and the buffer stays where it was (shared, not copied)."""
    from parity_tracker.compare.hashing import storage_digest

    lazy_clone = getattr(torch, "_lazy_clone", None)
    if lazy_clone is None:
        pytest.skip("torch has no _lazy_clone")
    t = torch.randn(64, 32, generator=torch.Generator().manual_seed(8))
    keep = lazy_clone(t)
    address = torch._C._data_address(t)
    view = t.t()
    assert storage_digest(view) == xxhash.xxh3_64_intdigest(t.clone().numpy().tobytes())
    assert torch._C._data_address(t) == address and torch._C._is_cow_tensor(t)
    assert storage_digest(t) == xxhash.xxh3_64_intdigest(t.clone().numpy().tobytes())
    assert torch._C._data_address(t) == address
    del keep


def _views() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 3, 4, 5, generator=g)
    return [
        torch.randn(1, 6, 4, 5, generator=g).permute(0, 2, 3, 1),  # channels-last, batch 1
        x.permute(0, 2, 3, 1),
        x.permute(3, 1, 0, 2),
        x[:, 1:, ::2],  # gaps
        x[:1].transpose(1, 3),
        torch.randn(3, 1, generator=g).expand(3, 4).t(),  # stride 0
        torch.randn(5, 1, 7, generator=g).transpose(0, 2),
        (torch.randn(4, 6, generator=g) > 0).t(),  # bool
        torch.randn(4, 6, generator=g).to(torch.bfloat16).t(),
    ]


@pytest.mark.parametrize("i", range(9))
def test_content_hash_of_a_view_hashes_its_c_order_bytes(i):
    """xxh3-64 of the header and the C-order bytes numpy gives for the view, whatever the view
    (``hashing.c_order`` merges dimensions before copying)."""
    from parity_tracker.compare.hashing import content_hash

    t = _views()[i]
    shape = tuple(t.shape)
    dtype = str(t.dtype).removeprefix("torch.")
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its 16-bit patterns, C order
        data = np.ascontiguousarray(t.view(torch.int16).numpy()).tobytes()
    else:
        data = np.ascontiguousarray(t.numpy()).tobytes()
    expected = xxhash.xxh3_64(f"{dtype}|{shape}|".encode() + data).hexdigest()
    assert content_hash(t) == expected


@pytest.mark.parametrize("i", range(9))
def test_c_order_is_the_contiguous_copy(i):
    """Same shape, strides of a contiguous tensor, and the values numpy reads in C order."""
    from parity_tracker.compare.hashing import c_order

    t = _views()[i]
    out = c_order(t)
    assert out.is_contiguous() and tuple(out.shape) == tuple(t.shape) and out.dtype == t.dtype
    as_int = (lambda v: v.view(torch.int16)) if t.dtype == torch.bfloat16 else (lambda v: v)
    assert np.array_equal(as_int(out).numpy(), np.ascontiguousarray(as_int(t).numpy()))
