"""A twin that loses one value never excuses the rest of the tag (w9brk1 bug 4).

Hand-worked: golden ``[1e5, 1, 2, 3]`` (float64); PyTorch at fp16 overflows the first
element (1e5 > 65504, the float16 max) and is exact on the rest. The floor is
``eps(float16) · max|golden| = 2**-10 · 1e5 = 97.65625``.
"""

import math

import torch

from parity_tracker.compare.budget import budget_compare

GOLDEN = torch.tensor([1e5, 1.0, 2.0, 3.0], dtype=torch.float64)
TWIN = GOLDEN.half()  # [inf, 1, 2, 3]
FLOOR = 2**-10 * 1e5


def test_the_twin_really_loses_one_value():
    assert math.isinf(TWIN[0].item()) and TWIN[1:].tolist() == [1.0, 2.0, 3.0]


def test_a_candidate_wrong_on_the_kept_elements_is_a_mismatch():
    cand = torch.tensor([65504.0, 1001.0, 2.0, 3.0], dtype=torch.float16)  # exact in fp16
    out = budget_compare(GOLDEN, TWIN, cand)
    # whole tag: e_cand = |65504 - 1e5| = 34496, e_twin = +inf -> 0; kept: 1000 / 97.65625
    assert out.golden_max_abs_err == 34496.0 and out.twin_max_abs_err == math.inf
    assert out.error_ratio == 1000.0 / FLOOR  # 10.24
    assert out.status == "mismatch"
    assert "the twin loses 1 value(s) here: the ratio is the larger of the whole tag" in out.message
    assert "golden 1000 is 10.24x the floor eps·max|golden|" in out.message


def test_a_candidate_exact_where_the_twin_is_kept_stays_within_budget():
    cand = torch.tensor([65504.0, 1.0, 2.0, 3.0], dtype=torch.float16)
    out = budget_compare(GOLDEN, TWIN, cand)
    assert out.error_ratio == 0.0 and out.status == "close"


def test_within_k_on_the_kept_elements_is_close():
    cand = torch.tensor([65504.0, 1.0, 2.0, 3.0], dtype=torch.float16)
    cand[3] = 3.0 + 128.0  # |Δ| = 128 (exact in fp16): ratio 128 / 97.65625 = 1.31 <= k = 2
    out = budget_compare(GOLDEN, TWIN, cand)
    assert out.error_ratio == 128.0 / FLOOR and out.status == "close"


def test_the_message_names_the_floor_when_it_is_the_denominator():
    cand = torch.tensor([65504.0, 1.0, 2.0, 3.0 + 128.0], dtype=torch.float16)
    out = budget_compare(GOLDEN, TWIN, cand)  # twin error over the kept elements: 0 < floor
    assert "1.311x the floor eps·max|golden| (PyTorch's own error at float16 is below it)" in (
        out.message
    )


def test_the_message_names_pytorchs_error_when_it_is_the_denominator():
    golden = torch.tensor([1.0], dtype=torch.float64)
    twin, cand = torch.tensor([1.25]), torch.tensor([1.5])  # errors 0.25 and 0.5 (exact)
    out = budget_compare(golden, twin, cand)  # floor 2**-23: the twin's error is larger
    assert out.error_ratio == 2.0 and out.status == "close"
    assert "0.5 is 2x PyTorch's own error at float32 (max(twin error 0.25," in out.message
