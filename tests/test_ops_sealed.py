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
    def forward(self, x):
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
@pytest.mark.parametrize("n", [64, (1 << 20) + 5])  # the small path and the chunked one
def test_spilled_identical_pair_gets_the_comparison_cores_record(tmp_path, settled, mode, n):
    x = _with_nonfinite(n)
    s = _record(_Double(), _Double(), x, mode, 0, tmp_path)  # budget 0: everything spills
    assert s.spilled_bytes > 0
    (row,) = s.rows()
    assert settled == [True]  # the reference's file was not read back
    y = x.numpy().astype(np.float64) * 2.0
    assert row["status"] == "equal"
    assert row["ref_nan"] == row["cand_nan"] == int(np.isnan(y).sum()) == 1
    assert row["ref_inf"] == row["cand_inf"] == int(np.isinf(y).sum()) == 2
    assert row["mismatch_count"] == 0 and row["max_abs_diff"] == 0.0
    header = f"float32|({n},)|".encode()
    digest = xxhash.xxh3_64(header + (x * 2.0).numpy().tobytes()).hexdigest()
    assert row["ref_hash"] == row["cand_hash"] == digest
    core = compare_tensors(x * 2.0, x * 2.0, mode=mode, tag=row["tag"]).to_dict()
    assert {k: row[k] for k in core} == core
    s.close()


class _SubWrite(nn.Module):
    """``sub`` (the same values on both sides), its output written through numpy after the op
    (or not), then ``mul``. The written side's sub output is resident when written and spilled
    by the captures after it (budget: one output)."""

    def __init__(self, write: bool) -> None:
        super().__init__()
        self.register_buffer("offset", torch.full((N,), 0.5))
        self.write = write

    def forward(self, x):
        y = torch.sub(x, self.offset)
        if self.write:
            y.numpy()[0] += 1.0  # bypasses dispatch: no version bump, no copy-on-write
        z = torch.mul(y, 2.0)
        return torch.add(z, 1.0)


@pytest.mark.parametrize("side", ["reference", "candidate"])
def test_op_output_written_behind_dispatch_then_spilled_is_an_error(tmp_path, side):
    """Both subs produced x − 0.5, so their digests taken when the ops ran agree; then one side's
    output is written through numpy. Equal digests must not settle the pair: the reference's
    bytes no longer hash as its op's output when spilled (not sealed), the candidate's no longer
    when compared, so the row is the ``error`` naming that side (main's rule), never ``equal``."""
    x = torch.randn(N, generator=torch.Generator().manual_seed(5))
    written, plain = _SubWrite(True), _SubWrite(False)
    ref, cand = (written, plain) if side == "reference" else (plain, written)
    s = _record(ref, cand, x, "equal", N * 4, tmp_path)
    assert s.spilled_bytes > 0
    rows = {r["tag"]: r for r in s.rows()}
    sub = rows["model@0::sub#0"]
    assert sub["status"] == "error", sub
    assert f"the {side}'s op output changed after the op ran" in sub["message"]
    # mul read the written y on one side only: (x[0] − 0.5 + 1)·2 vs (x[0] − 0.5)·2
    mul = rows["model@0::mul#0"]
    assert mul["status"] == "mismatch" and mul["mismatch_count"] == 1
    assert mul["max_abs_diff"] == pytest.approx(2.0, abs=1e-5)
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
