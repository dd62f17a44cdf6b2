"""Issue 19 (wave 8, w8ops): the op recorder's cheaper paths give the same answers.

- ``localize.settle.same_bytes`` (memcmp of two views' storage spans) settles byte-identical op
  inputs ``equal`` without ``torch.equal``; anything it cannot prove goes to the comparison as
  before. Expected statuses are worked out by hand / with numpy below, never taken from the code.
- ``capture.op_args.split_args``: tensors and the call spec in one pass, expected values
  written out by hand.
- ``SideRecorder._learn``: one module walk for names, parameters and buffers; the expected set
  comes from ``Module.parameters()`` / ``buffers()``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.capture.op_args import TensorArg, arg_spec, split_args, tensors_in
from parity_tracker.capture.op_store import OpStore, _ptr
from parity_tracker.capture.ops import SideRecorder
from parity_tracker.compare.tolerances import Tolerances
from parity_tracker.localize.inputs import InputJudge
from parity_tracker.localize.settle import SAME_BYTES_MIN, same_bytes
from parity_tracker.ops import OpSession

N = 64 * 96  # ≥ SAME_BYTES_MIN: the memcmp path is taken


def _judge(mode: str = "equal") -> InputJudge:
    return InputJudge(mode, Tolerances(), [set(), set()], {}, {}, {})


def _pair(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(64, 96, generator=g)
    return a, a.clone()


def test_threshold_is_below_the_tested_size():
    assert N >= SAME_BYTES_MIN  # else these tests would not exercise the memcmp path


def test_identical_views_are_equal_by_memcmp():
    a, b = _pair()
    assert same_bytes(a, b)
    assert same_bytes(a.t(), b.t())  # non-contiguous, same strides: the span is compared
    assert _judge()._value_compare(a.t(), b.t()) == "equal"


@pytest.mark.parametrize("where", [0, N // 2, N - 1])  # the last element: the span's end
@pytest.mark.parametrize("transposed", [False, True])
def test_one_ulp_anywhere_is_failing(where, transposed):
    a, b = _pair(1)
    flat = b.view(-1)
    flat[where] = float(np.nextafter(np.float32(flat[where].item()), np.float32(np.inf)))
    assert not np.array_equal(a.numpy(), b.numpy())  # numpy: they differ
    if transposed:
        a, b = a.t(), b.t()
    assert not same_bytes(a, b)
    assert _judge("equal")._value_compare(a, b) == "failing"
    # allclose: one ULP passes the float32 defaults (rtol 1.3e-6) but is not bitwise equal
    assert _judge("allclose")._value_compare(a, b) == "passing"


def test_negative_zero_is_not_the_same_bytes_but_equal():
    a, b = _pair(2)
    a.view(-1)[7] = 0.0
    b.view(-1)[7] = -0.0
    assert not same_bytes(a, b)  # bytes differ (sign bit) ...
    assert _judge()._value_compare(a, b) == "equal"  # ... values are equal (0.0 == -0.0)


def test_nan_and_inf_at_the_same_places_are_equal():
    a, b = _pair(3)
    for t in (a, b):
        t.view(-1)[[1, 50, N - 1]] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    assert same_bytes(a, b)
    assert _judge()._value_compare(a, b) == "equal"
    # a NaN with another payload: other bytes, still NaN at the same place → equal
    b.view(torch.int32).view(-1)[1] = 0x7FC00001
    assert np.isnan(b.view(-1)[1].item())
    assert not same_bytes(a, b)
    assert _judge()._value_compare(a, b) == "equal"
    # NaN on one side only: failing (numpy: isnan differs)
    b.view(-1)[2] = float("nan")
    assert _judge()._value_compare(a, b) == "failing"


def test_same_bytes_under_another_dtype_is_not_equal():
    a, _ = _pair(4)
    b = a.clone().view(torch.int32)  # the same bytes read as int32
    assert not same_bytes(a, b)
    # values differ (float vs the integers of its bits, both promoted): numpy agrees
    assert not np.array_equal(a.numpy().astype(np.float64), b.numpy().astype(np.float64))
    assert _judge()._value_compare(a, b) == "failing"


def test_same_bytes_under_another_shape_or_strides_is_not_equal():
    a, _ = _pair(5)
    b = a.clone()
    assert not same_bytes(a, b.view(-1))  # another shape
    assert _judge()._value_compare(a, b.view(-1)) == "failing"
    sq = torch.randn(96, 96, generator=torch.Generator().manual_seed(6))
    other = sq.clone().t()  # same shape and span bytes, elements transposed
    assert not np.array_equal(sq.numpy(), other.numpy())
    assert not same_bytes(sq, other)
    assert _judge()._value_compare(sq, other) == "failing"
    # the same values under other strides: not proven by bytes, equal by values
    relaid = sq.t().contiguous().t()
    assert not same_bytes(sq, relaid)
    assert _judge()._value_compare(sq, relaid) == "equal"


def test_gaps_of_a_strided_view_only_make_the_proof_fail():
    a, b = _pair(7)
    b[:, 1::2] += 1.0  # only the elements between the compared ones differ
    va, vb = a[:, ::2], b[:, ::2]
    assert np.array_equal(va.numpy(), vb.numpy())
    assert not same_bytes(va, vb)  # the span includes the gaps
    assert _judge()._value_compare(va, vb) == "equal"
    vb2 = b[:, 1::2]
    assert _judge()._value_compare(a[:, 1::2], vb2) == "failing"


def test_copy_on_write_tensor_is_read_in_place():
    a, _ = _pair(8)
    lazy = getattr(torch, "_lazy_clone", None)
    is_cow = getattr(torch._C, "_is_cow_tensor", None)
    if lazy is None or is_cow is None:
        pytest.skip("this torch has no copy-on-write tensors")
    c = lazy(a)
    address = torch._C._data_address(c)
    assert same_bytes(a, c)
    assert is_cow(c) and torch._C._data_address(c) == address  # not materialized


def test_what_memcmp_cannot_read_is_left_to_the_comparison():
    a, b = _pair(9)
    assert not same_bytes(a, nn.Parameter(b, requires_grad=False))  # a subclass
    assert not same_bytes(a[:0], b[:0])  # empty
    # the same bytes under a negative / conjugate bit are other values: never "equal"
    neg = b._neg_view()
    assert not same_bytes(a, neg)
    assert _judge()._value_compare(a, neg) == "failing"
    z = torch.randn(64, 96, dtype=torch.cfloat, generator=torch.Generator().manual_seed(9))
    conj = z.clone().conj()
    assert not np.array_equal(z.numpy(), conj.resolve_conj().numpy())
    assert not same_bytes(z, conj)
    assert _judge()._value_compare(z, conj) == "failing"


def test_a_run_with_one_differing_weight_element_keeps_its_input_failing():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(96, 64), nn.ReLU()).eval()
    cand = nn.Sequential(nn.Linear(96, 64), nn.ReLU()).eval()
    cand.load_state_dict(ref.state_dict())
    with torch.no_grad():
        w = cand[0].weight.view(-1)
        w[-1] = float(np.nextafter(np.float32(w[-1].item()), np.float32(np.inf)))
    x = torch.randn(8, 96)
    s = OpSession(mode="equal")
    with torch.no_grad():
        with s.recording(0, model=ref):
            ref(x.clone())
        with s.recording(1, model=cand):
            cand(x.clone())
    rows = {r["tag"]: r for r in s.rows()}
    s.close()
    addmm = rows["0@0::addmm#0"]
    # numpy: only the weight differs (its last element), so the op's inputs fail and the
    # op is not a root cause (the difference came in with its input)
    ref_out = x.numpy().astype(np.float64) @ ref[0].weight.detach().numpy().T.astype(np.float64)
    cand_out = x.numpy().astype(np.float64) @ cand[0].weight.detach().numpy().T.astype(np.float64)
    assert not np.array_equal(ref_out, cand_out)
    assert addmm["inputs_status"] == "failing"
    assert addmm["root_cause"] is False


def test_split_args_numbers_tensors_as_tensors_in():
    x, y, z = torch.ones(1), torch.zeros(2), torch.ones(3)
    args = (x, 2, [y, 3, x], torch.Size([4, 5]), (z,), [[x]])
    kwargs = {"alpha": 0.5, "other": z, "dims": [1, y]}
    tensors, (spec_args, spec_kwargs) = split_args(args, kwargs)
    assert [id(t) for t in tensors] == [id(t) for t in (x, y, x, z, z, y)]
    assert [id(t) for t in tensors] == [id(t) for t in tensors_in(args, kwargs)]
    assert spec_args == (
        TensorArg(0), 2, [TensorArg(1), 3, TensorArg(2)], torch.Size([4, 5]), (TensorArg(3),),
        [[x]],  # depth 2 is kept as it is (one level of lists only)
    )  # fmt: skip
    assert type(spec_args[3]) is torch.Size and type(spec_args[4]) is tuple
    assert spec_kwargs == {"alpha": 0.5, "other": TensorArg(4), "dims": [1, TensorArg(5)]}
    assert arg_spec(args, kwargs) == (spec_args, spec_kwargs)
    assert args[2] == [y, 3, x]  # the caller's list is not changed
    assert split_args((), {}) == ([], ((), {}))


def test_learned_parameters_are_those_of_parameters_and_buffers():
    shared = nn.Linear(4, 4, bias=False)
    model = nn.Sequential(shared, nn.BatchNorm1d(4), nn.Sequential(shared), nn.Linear(4, 2))
    rec = SideRecorder(
        0, model, store=OpStore(1 << 20, None), params=set(), step_getter=lambda: 0,
        on_close=lambda *a: None,
    )  # fmt: skip
    expected = {_ptr(t.detach()) for t in itertools.chain(model.parameters(), model.buffers())} - {
        0
    }
    assert rec.params - {0} == expected
    assert len(expected) == 8  # shared weight; bn weight, bias, 3 buffers; linear weight, bias
    names = {rec.names[id(m)] for m in model.modules()}
    assert names == {"model", "0", "1", "2", "3"}  # the root, its children by their names
