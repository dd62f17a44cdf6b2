"""Issue 19 (wave 10): the fused small-capture path decides exactly as the per-pair path.

``Snapshotter.take`` (``readable_dtype``, ``_take_bytes``), ``param_bytes`` and
``Holder._bulk_bytes`` -> ``HeldPairs.add_live`` hold a small dense CPU pair as bytes and
compare it in bulk at the check. Each case below is worked out by hand (numpy for the float
spacing): one ULP in one element at every small size, strided sides, conjugate and negative
bits, bfloat16, inference tensors, writes after the capture, re-captures, parameters.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.capture.snapshot import Snapshotter, param_bytes, pinned_whole
from parity_tracker.compare.batch import BULK_MAX_BYTES, HeldBytes, HeldPairs, readable_dtype
from parity_tracker.tensor_checker import DumpMode, TensorChecker, module_register_tensor_checker


def _checker() -> TensorChecker:
    return TensorChecker(verbose=False, eager_mode="equal", dump_mode=DumpMode.NOT)


def _results(checker: TensorChecker) -> dict:
    return {r.tag: r for r in checker.check("equal").results}


def _one_ulp_up(values: np.ndarray, index: int) -> np.ndarray:
    out = values.copy()
    out.flat[index] = np.nextafter(out.flat[index], np.float32(np.inf), dtype=np.float32)
    return out


# 1 .. 1024 float32 elements: every side is at most BULK_MAX_BYTES (held as bytes)
@pytest.mark.parametrize("numel", [1, 2, 3, 5, 16, 63, 64, 255, 1023, 1024])
def test_one_ulp_in_one_element_at_each_small_size_is_a_mismatch(numel):
    rng = np.random.default_rng(numel)
    ref = rng.standard_normal(numel).astype(np.float32)
    j = numel // 2
    cand = _one_ulp_up(ref, j)
    ulp = float(cand[j]) - float(ref[j])  # one float32 step up from ref[j] (numpy), exact
    checker = _checker()
    checker.register_tensor("same", torch.from_numpy(ref.copy()), side=0)
    checker.register_tensor("one_ulp", torch.from_numpy(ref.copy()), side=0)
    checker.register_tensor("same", torch.from_numpy(ref.copy()), side=1)
    checker.register_tensor("one_ulp", torch.from_numpy(cand), side=1)
    assert len(checker._hold.held) == 2  # both pairs held as bytes (the fused path)
    by_tag = _results(checker)
    assert by_tag["same"].status == "equal"
    comp = by_tag["one_ulp"].comparison
    assert comp.status == "mismatch"
    assert comp.mismatch_count == 1
    assert comp.max_abs_diff == ulp
    assert comp.max_abs_diff_index == (j,)
    assert comp.max_ulp == 1


def test_a_side_one_element_over_the_bound_is_compared_alone_with_the_same_verdict():
    numel = BULK_MAX_BYTES // 4 + 1  # 4100 bytes: not held as bytes
    ref = np.linspace(-1, 1, numel, dtype=np.float32)
    cand = _one_ulp_up(ref, 7)
    checker = _checker()
    checker.register_tensor("x", torch.from_numpy(ref.copy()), side=0)
    checker.register_tensor("x", torch.from_numpy(cand), side=1)
    assert len(checker._hold.held) == 0
    comp = _results(checker)["x"].comparison
    assert (comp.status, comp.mismatch_count, comp.max_abs_diff_index) == ("mismatch", 1, (7,))


def test_a_recaptured_reference_is_not_aliased_to_a_candidate_one_ulp_apart():
    # the reference object captured twice shares one HeldBytes; the two candidates differ
    # by one ULP in element 3: the second pair must not reuse the first pair's record
    ref = torch.arange(8, dtype=torch.float32) / 3
    cand_a = ref.clone()
    cand_b = torch.from_numpy(_one_ulp_up(ref.numpy(), 3))
    checker = _checker()
    checker.register_tensor("a", ref, side=0)
    checker.register_tensor("b", ref, side=0)
    first = checker._log.groups[("a", 0)].captures[0].value
    assert type(first) is HeldBytes and checker._log.groups[("b", 0)].captures[0].value is first
    checker.register_tensor("a", cand_a, side=1)
    checker.register_tensor("b", cand_b, side=1)
    by_tag = _results(checker)
    assert by_tag["a"].status == "equal"
    assert (by_tag["b"].status, by_tag["b"].comparison.max_abs_diff_index) == ("mismatch", (3,))


@pytest.mark.parametrize("which", ["ref", "cand", "both"])
def test_strided_sides_are_compared_by_their_logical_values(which):
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7
    values = base.t().contiguous().numpy()  # (4, 3), C order
    strided = base.t()  # the same values, non-contiguous
    sliced = torch.arange(24, dtype=torch.float32).reshape(4, 6)[:, ::2] / 7  # (4, 3), gaps
    ref = strided if which in ("ref", "both") else torch.from_numpy(values.copy())
    cand_same = strided.clone().t().contiguous().t() if which != "ref" else values.copy()
    cand_same = torch.as_tensor(cand_same)
    bumped = _one_ulp_up(values, 2 * 3 + 1)  # element (2, 1)
    cand_diff = torch.from_numpy(bumped).t().contiguous().t() if which != "ref" else bumped
    cand_diff = torch.as_tensor(cand_diff)
    assert which == "ref" or not cand_diff.is_contiguous()
    checker = _checker()
    for tag, cand in (("same", cand_same), ("diff", cand_diff), ("sliced", sliced)):
        checker.register_tensor(tag, ref, side=0)
        checker.register_tensor(tag, cand, side=1)
    by_tag = _results(checker)
    assert by_tag["same"].status == "equal"
    comp = by_tag["diff"].comparison
    assert (comp.status, comp.mismatch_count, comp.max_abs_diff_index) == ("mismatch", 1, (2, 1))
    # sliced: column k of (4, 6) / 7 at 2k, against t() of arange(12).reshape(3, 4) / 7
    expected = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2] / np.float32(7)
    differs = int((expected != values).sum())
    assert by_tag["sliced"].comparison.mismatch_count == differs > 0


def test_conjugate_bits_are_resolved_never_read_as_raw_memory():
    values = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    conj_of_conj = torch.tensor([1 - 2j, 3 + 4j], dtype=torch.complex64).conj()  # = values
    raw_same_memory = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj()  # 1-2j, 3+4j
    assert conj_of_conj.is_conj() and readable_dtype(conj_of_conj) is None
    assert readable_dtype(values) is torch.complex64
    checker = _checker()
    checker.register_tensor("equal_cand", values, side=0)
    checker.register_tensor("equal_cand", conj_of_conj, side=1)
    checker.register_tensor("equal_ref", conj_of_conj, side=0)
    checker.register_tensor("equal_ref", values.clone(), side=1)
    checker.register_tensor("differs", values, side=0)
    checker.register_tensor("differs", raw_same_memory, side=1)
    by_tag = _results(checker)
    assert by_tag["equal_cand"].status == "equal"
    assert by_tag["equal_ref"].status == "equal"
    assert by_tag["differs"].status == "mismatch"
    assert by_tag["differs"].comparison.mismatch_count == 2  # both imaginary parts flip


def test_negative_bits_are_resolved():
    x = torch.tensor([1.0, -2.0, 3.0])
    neg = torch._neg_view(x)  # values [-1, 2, -3] over x's memory
    assert neg.is_neg() and readable_dtype(neg) is None
    checker = _checker()
    checker.register_tensor("neg_cand", torch.tensor([-1.0, 2.0, -3.0]), side=0)
    checker.register_tensor("neg_cand", neg, side=1)
    checker.register_tensor("neg_ref", neg, side=0)
    checker.register_tensor("neg_ref", x.clone(), side=1)
    by_tag = _results(checker)
    assert by_tag["neg_cand"].status == "equal"
    assert by_tag["neg_ref"].status == "mismatch"
    assert by_tag["neg_ref"].comparison.mismatch_count == 3


def test_bfloat16_is_compared_by_the_per_pair_path_to_one_ulp():
    ref = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
    cand = ref.clone()
    cand[0] = 1.0078125  # 1 + 2**-7: the next bfloat16 after 1.0
    assert readable_dtype(ref) is None  # no numpy dtype: never held as bytes
    checker = _checker()
    checker.register_tensor("same", ref, side=0)
    checker.register_tensor("same", ref.clone(), side=1)
    checker.register_tensor("one_ulp", ref, side=0)
    checker.register_tensor("one_ulp", cand, side=1)
    by_tag = _results(checker)
    assert by_tag["same"].status == "equal"
    comp = by_tag["one_ulp"].comparison
    assert (comp.status, comp.mismatch_count, comp.max_abs_diff) == ("mismatch", 1, 2**-7)


def test_inference_tensors_are_held_and_compared():
    with torch.inference_mode():
        ref = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 9
        cand = torch.from_numpy(_one_ulp_up(ref.numpy(), 4))
        same = ref.clone()
    assert ref.is_inference() and readable_dtype(ref) is torch.float32
    checker = _checker()
    for tag, c in (("same", same), ("one_ulp", cand)):
        checker.register_tensor(tag, ref, side=0)
        checker.register_tensor(tag, c, side=1)
    assert len(checker._hold.held) == 2
    by_tag = _results(checker)
    assert by_tag["same"].status == "equal"
    comp = by_tag["one_ulp"].comparison
    assert (comp.status, comp.max_abs_diff_index) == ("mismatch", (1, 1))


def test_writes_after_the_capture_change_nothing_and_a_recapture_sees_them():
    ref = torch.tensor([0.5, 1.5, 2.5, 3.5])
    checker = _checker()
    checker.register_tensor("before", ref, side=0)
    ref.add_(1.0)  # a counted write after the capture: [1.5, 2.5, 3.5, 4.5]
    checker.register_tensor("after_add", ref, side=0)  # the same object, new values
    ref.numpy()[0] = 9.0  # an uncounted write through numpy: [9, 2.5, 3.5, 4.5]
    checker.register_tensor("after_numpy", ref, side=0)
    cand = torch.tensor([0.5, 1.5, 2.5, 3.5])
    checker.register_tensor("before", cand, side=1)
    cand.add_(1.0)  # the candidate's held bytes are its values when it was captured
    checker.register_tensor("after_add", cand, side=1)
    cand.fill_(-1.0)
    checker.register_tensor("after_numpy", torch.tensor([9.0, 2.5, 3.5, 4.5]), side=1)
    by_tag = _results(checker)
    assert {t: r.status for t, r in by_tag.items()} == {
        "before": "equal",
        "after_add": "equal",
        "after_numpy": "equal",
    }


def test_a_candidate_written_in_place_after_its_capture_is_judged_on_its_capture_values():
    ref = torch.tensor([1.0, 2.0])
    cand = torch.tensor([1.0, 2.5])
    checker = _checker()
    checker.register_tensor("x", ref, side=0)
    checker.register_tensor("x", cand, side=1)
    cand.copy_(ref)  # equal now, not when captured
    comp = _results(checker)["x"].comparison
    assert (comp.status, comp.max_abs_diff, comp.max_abs_diff_index) == ("mismatch", 0.5, (1,))


class _Lin(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)
        with torch.no_grad():
            self.lin.weight.copy_(torch.arange(8, dtype=torch.float32).reshape(2, 4) / 5)
            self.lin.bias.copy_(torch.tensor([0.25, -0.75]))

    def forward(self, x):
        return self.lin(x)


def test_parameters_are_held_as_their_bytes_of_capture_time():
    ref, cand = _Lin(), _Lin()
    with torch.no_grad():
        w = cand.lin.weight.detach().numpy()
        w[1, 2] = np.nextafter(w[1, 2], np.float32(np.inf), dtype=np.float32)
    assert param_bytes(ref.lin.weight, BULK_MAX_BYTES, None) is not None
    checker = _checker()
    x = torch.ones(1, 4)
    with torch.no_grad():
        with module_register_tensor_checker(ref, checker, side=0):
            ref(x)
        ref.lin.bias.add_(1.0)  # written after its capture: the held bytes keep [0.25, -0.75]
        with module_register_tensor_checker(cand, checker, side=1):
            cand(x)
    by_tag = _results(checker)
    weight = next(r for t, r in by_tag.items() if t.endswith("lin.weight"))
    bias = next(r for t, r in by_tag.items() if t.endswith("lin.bias"))
    assert bias.status == "equal"
    assert (weight.status, weight.comparison.max_abs_diff_index) == ("mismatch", (1, 2))


def test_param_bytes_only_for_a_parameter_filling_its_whole_storage():
    flat = torch.arange(32, dtype=torch.float32)
    whole = nn.Parameter(flat[:16].clone())
    view = nn.Parameter(flat[:16])  # a view of a 32-element buffer: pinned, not copied
    held = param_bytes(whole, BULK_MAX_BYTES, None)
    assert held is not None and held.shape == (16,)
    assert held.data == np.arange(16, dtype=np.float32).tobytes()
    assert param_bytes(view, BULK_MAX_BYTES, None) is None and not pinned_whole(view, 4096)
    assert param_bytes(whole, 63, None) is None  # 64 bytes over a 63-byte limit
    assert param_bytes(whole, BULK_MAX_BYTES, (16,)).shape == (16,)


def test_take_shares_one_copy_only_while_the_bytes_are_the_same():
    snap = Snapshotter()
    snap.bytes_max = BULK_MAX_BYTES
    t = torch.tensor([1.0, 2.0])
    first = snap.take(t)
    assert snap.take(t) is first  # the same bytes, dtype and shape: one copy
    t.numpy()[1] = 2.5  # an uncounted write
    second = snap.take(t)
    assert second is not first and second.data == np.array([1.0, 2.5], np.float32).tobytes()
    assert first.data == np.array([1.0, 2.0], np.float32).tobytes()
    v = t.view(2, 1)  # another object, another shape
    assert snap.take(v).shape == (2, 1)


def test_add_live_holds_only_the_pairs_add_holds():
    held_ref = HeldBytes(np.array([1.0, 2.0], np.float32).tobytes(), torch.float32, (2,))
    pairs = HeldPairs()
    assert not pairs.add_live(
        "k", "t", held_ref, torch.tensor([1.0, 2.0], dtype=torch.float64), True
    )
    assert not pairs.add_live("k", "t", held_ref, torch.tensor([[1.0, 2.0]]), True)
    assert not pairs.add_live("k", "t", held_ref, torch._neg_view(torch.ones(2)), True)
    assert not pairs.add_live("k", "t", held_ref, np.ones(2, np.float32), True)
    assert len(pairs) == 0
    assert pairs.add_live("k", "t", held_ref, torch.tensor([1.0, 2.0]), False)  # live ref
    assert pairs.tensors(0)[1].tolist() == [1.0, 2.0] and pairs.compare("equal")[0].status == (
        "equal"
    )
