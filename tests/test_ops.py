"""OpSession: per-op capture, alignment, root causes and cases A/B/C (issue 5 §1-§3, §5).

Expected tags and statuses are worked out by hand from each model's forward (which aten ops
run, in which module call); the numeric expectations are recomputed with plain torch.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from parity_tracker.errors import InputError
from parity_tracker.files.tables import OPS_SCHEMA, rows_to_table
from parity_tracker.ops import OpSession, suspended


def _run(reference, candidate, *inputs, mode="equal", **kwargs):
    session = OpSession(mode=mode, **kwargs)
    with torch.no_grad():
        with session.recording(0, model=reference):
            reference(*inputs)
        with session.recording(1, model=candidate):
            candidate(*inputs)
    return session


def _by_tag(session):
    return {r["tag"]: r for r in session.rows()}


# -- a small transformer block ---------------------------------------------------------------


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        out = torch.matmul(scores.softmax(dim=-1), v)
        return self.proj(out.transpose(1, 2).reshape(b, s, d))


class MLP(nn.Module):
    def __init__(self, dim, approximate="none"):
        super().__init__()
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU(approximate=approximate)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim=16, heads=2, approximate="none", eps=1e-5):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim, eps=eps)
        self.attn = Attention(dim, heads)
        self.ln2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = MLP(dim, approximate)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def _block_pair(**cand_kwargs):
    torch.manual_seed(0)
    ref = Block().eval()
    cand = Block(**cand_kwargs).eval()
    cand.load_state_dict(ref.state_dict())
    return ref, cand, torch.randn(2, 6, 16)


def test_identical_models_all_ops_equal_and_no_root_cause():
    ref, cand, x = _block_pair()
    s = _run(ref, cand, x)
    rows = s.rows()
    assert rows and all(r["status"] == "equal" for r in rows)
    assert s.root_causes() == []
    assert [r["exec_order"] for r in rows] == list(range(len(rows)))
    rows_to_table(rows, OPS_SCHEMA)  # conforms to the table contract


def test_gelu_tanh_first_root_cause_is_the_mlp_activation_case_a():
    ref, cand, x = _block_pair(approximate="tanh")
    s = _run(ref, cand, x)
    causes = s.root_causes()
    first = causes[0]
    assert first["tag"] == "mlp.act@0::gelu#0"
    assert (first["module"], first["call_index"], first["op"], first["op_index"]) == (
        "mlp.act",
        0,
        "gelu",
        0,
    )
    assert first["kind"] == "op"
    assert first["status"] == "mismatch"
    assert first["inputs_status"] == "passing"
    assert first["cause"] == "A"
    assert "case A" in first["message"]
    assert len(causes) == 1  # everything after it is propagated
    rows = _by_tag(s)
    # Everything before the activation is equal, by hand: ln1, attention, residual, ln2, fc1.
    assert rows["mlp.fc1@0::addmm#0"]["status"] == "equal"
    assert rows["ln2@0::native_layer_norm#0"]["status"] == "equal"
    assert rows["attn@0::_softmax#0"]["status"] == "equal"
    # After it: fc2 and the residual add differ, propagated (their inputs fail).
    for tag in ("mlp.fc2@0::addmm#0", "model@0::add#1"):
        assert rows[tag]["status"] == "mismatch"
        assert rows[tag]["inputs_status"] == "failing"
        assert rows[tag]["root_cause"] is False and rows[tag]["cause"] is None
    # The reported difference is the real one (tanh-approximate vs exact GELU), in float64.
    with torch.no_grad():
        h = ref.mlp.fc1(ref.ln2(x + ref.attn(ref.ln1(x))))
    expected = (F.gelu(h, approximate="tanh").double() - F.gelu(h).double()).abs().max().item()
    assert first["max_abs_diff"] == pytest.approx(expected, rel=1e-3)


def test_functional_calls_and_operators_are_seen():
    ref, cand, x = _block_pair()
    tags = set(_by_tag(_run(ref, cand, x)))
    # chunk/reshape/transpose are views (skipped); matmul on 4-D tensors runs bmm, the
    # division by sqrt(d) is aten.div, softmax is aten._softmax, residuals are aten.add.
    assert {
        "attn@0::bmm#0",
        "attn@0::bmm#1",
        "attn@0::div#0",
        "attn@0::_softmax#0",
        "model@0::add#0",
        "model@0::add#1",
    } <= tags
    assert not any("::transpose" in t or "::view#" in t or "::split" in t for t in tags)


def test_layer_norm_eps_root_cause_is_native_layer_norm():
    ref, cand, x = _block_pair(eps=1e-1)
    s = _run(ref, cand, x)
    first = s.root_causes()[0]
    assert first["tag"] == "ln1@0::native_layer_norm#0"
    assert first["op"] == "native_layer_norm"
    assert first["inputs_status"] == "passing"
    assert first["cause"] == "A"
    rows = _by_tag(s)
    # Outputs of native_layer_norm: 0 = normalized, 1 = mean (eps-free, equal), 2 = rstd.
    assert rows["ln1@0::native_layer_norm#0:1"]["status"] == "equal"
    assert rows["ln1@0::native_layer_norm#0:2"]["status"] == "mismatch"
    expected_rstd = (
        (1 / torch.sqrt(x.double().var(-1, unbiased=False) + 1e-5))
        - (1 / torch.sqrt(x.double().var(-1, unbiased=False) + 1e-1))
    ).abs()
    assert rows["ln1@0::native_layer_norm#0:2"]["max_abs_diff"] == pytest.approx(
        expected_rstd.max().item(), rel=1e-4
    )


# -- case B: equal values, other layout -------------------------------------------------------


class RowSum(nn.Module):
    """Reference: sums a contiguous (rows, cols) parameter over its last dimension."""

    def __init__(self, w):
        super().__init__()
        self.w = nn.Parameter(w.clone())

    def forward(self, x):
        return x * self.w.sum(-1)


class RowSumTransposed(nn.Module):
    """Candidate: stores the parameter transposed and feeds a non-contiguous view to sum."""

    def __init__(self, w):
        super().__init__()
        self.wt = nn.Parameter(w.t().contiguous())

    def forward(self, x):
        return x * self.wt.t().sum(-1)


@pytest.mark.parametrize(("rows", "cols"), [(4, 8), (64, 1000), (33, 777)])
def test_transposed_view_with_equal_values_case_b(rows, cols):
    torch.manual_seed(rows)
    w = torch.randn(rows, cols)
    x = torch.randn(rows)
    s = _run(RowSum(w), RowSumTransposed(w), x)
    row = _by_tag(s)["model@0::sum#0"]
    bitwise = torch.equal(w.sum(-1), w.t().contiguous().t().sum(-1))  # independent verdict
    if bitwise:
        assert row["status"] == "equal"
        assert s.root_causes() == []
    else:
        assert row["status"] == "mismatch"
        assert row["inputs_status"] == "passing"
        assert row["root_cause"] is True and row["cause"] == "B"
        assert f"input 0 stride ({cols}, 1) vs (1, {rows})" in row["message"]
        assert "contiguous vs non-contiguous" in row["message"]
        assert s.root_causes()[0]["tag"] == "model@0::sum#0"


def test_case_b_branch_is_exercised_on_this_machine():
    """Guard: at least one shape above really differs bitwise, so the case-B branch ran."""
    torch.manual_seed(64)
    w = torch.randn(64, 1000)
    w2 = (torch.manual_seed(33), torch.randn(33, 777))[1]
    assert not (
        torch.equal(w.sum(-1), w.t().contiguous().t().sum(-1))
        and torch.equal(w2.sum(-1), w2.t().contiguous().t().sum(-1))
    )


class Proj(nn.Module):
    def __init__(self, w, transposed_copy=False):
        super().__init__()
        self.w = nn.Parameter(w.clone())
        self.transposed_copy = transposed_copy

    def forward(self, x):
        h = x @ self.w  # internal producer (mm)
        if self.transposed_copy:  # same values through a column-major copy
            h = h.t().contiguous().t()
        return h.sum(-1)


def test_internal_view_with_equal_values_is_compared_by_value_case_b():
    torch.manual_seed(3)
    w, x = torch.randn(40, 900), torch.randn(64, 40)
    s = _run(Proj(w), Proj(w, transposed_copy=True), x)
    rows = _by_tag(s)
    assert rows["model@0::mm#0"]["status"] == "equal"
    extra = rows["model@0::clone#0"]
    assert extra["status"] == "missing_reference"
    assert extra["root_cause"] is False  # a pure copy is a layout difference, not case C
    h = x @ w
    if torch.equal(h.sum(-1), h.t().contiguous().t().sum(-1)):
        assert rows["model@0::sum#0"]["status"] == "equal"
    else:
        row = rows["model@0::sum#0"]
        assert row["inputs_status"] == "passing"  # checked by value: the clone kept the values
        assert row["cause"] == "B"
        assert "input 0 stride (900, 1) vs (1, 64)" in row["message"]


def test_dtype_plumbing_is_case_b():
    class Act(nn.Module):
        def __init__(self, dtype):
            super().__init__()
            self.dtype = dtype

        def forward(self, x):
            return torch.tanh(x.to(self.dtype))

    x = torch.tensor([0.5, 0.25, 1.0])  # exactly representable in float32 and float64
    s = _run(Act(torch.float32), Act(torch.float64), x)
    row = s.root_causes()[0]
    assert row["op"] == "tanh" and row["cause"] == "B"
    assert "input 0 dtype float32 vs float64" in row["message"]


# -- case C and alignment ------------------------------------------------------------------


class Steps(nn.Module):
    def __init__(self, extra=False):
        super().__init__()
        self.extra = extra

    def forward(self, x):
        h = torch.relu(x)
        if self.extra:
            h = torch.abs(h)  # an extra op that keeps the values (h >= 0)
        return (h * 2 + 1).sum()


class Outer(nn.Module):
    def __init__(self, extra=False):
        super().__init__()
        self.inner = Steps(extra)

    def forward(self, x):
        return self.inner(x) - 1


def test_one_extra_op_is_one_missing_reference_row_and_the_rest_match():
    x = torch.randn(5, 7)
    s = _run(Outer(), Outer(extra=True), x)
    rows = s.rows()
    inner = [(r["tag"], r["status"]) for r in rows if r["module"] == "inner"]
    assert inner == [
        ("inner@0::relu#0", "equal"),
        ("inner@0::abs#0", "missing_reference"),
        ("inner@0::mul#0", "equal"),
        ("inner@0::add#0", "equal"),
        ("inner@0::sum#0", "equal"),
    ]
    assert sum(r["status"] == "missing_reference" for r in rows) == 1
    assert _by_tag(s)["model@0::sub#0"]["status"] == "equal"
    (cause,) = s.root_causes()
    assert cause["tag"] == "inner@0::abs#0" and cause["cause"] == "C"


def test_op_missing_in_candidate_is_case_c_and_substitution_both_sides():
    class Act(nn.Module):
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def forward(self, x):
            return self.fn(x) * 3

    x = torch.randn(4)
    s = _run(Act(torch.sigmoid), Act(torch.tanh), x)
    rows = _by_tag(s)
    assert rows["model@0::sigmoid#0"]["status"] == "missing_candidate"
    assert rows["model@0::tanh#0"]["status"] == "missing_reference"
    assert {r["tag"]: r["cause"] for r in s.root_causes()} == {
        "model@0::sigmoid#0": "C",
        "model@0::tanh#0": "C",
    }
    assert rows["model@0::mul#0"]["status"] == "mismatch"
    assert rows["model@0::mul#0"]["root_cause"] is False


def test_module_never_called_by_candidate_reports_missing_candidate():
    class Maybe(nn.Module):
        def __init__(self, use):
            super().__init__()
            self.branch = nn.Linear(3, 3)
            self.use = use

        def forward(self, x):
            return self.branch(x) if self.use else x * 1.0

    torch.manual_seed(0)
    ref, cand = Maybe(True), Maybe(False)
    cand.load_state_dict(ref.state_dict())
    s = _run(ref, cand, torch.randn(2, 3))
    rows = _by_tag(s)
    assert rows["branch@0::addmm#0"]["status"] == "missing_candidate"
    assert rows["model@0::mul#0"]["status"] == "missing_reference"
    # In execution order: the reference-only op ran first (nothing matched before it).
    assert [r["tag"] for r in s.rows()] == ["branch@0::addmm#0", "model@0::mul#0"]


# -- calls, steps, in-place ops, manual registrations --------------------------------------


def test_repeated_module_calls_and_steps_restart_call_indices():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(self.lin(x))

    torch.manual_seed(0)
    ref, cand = Twice(), Twice()
    cand.load_state_dict(ref.state_dict())
    step = {"k": 0}
    s = OpSession(mode="equal", step_getter=lambda: step["k"])
    x = torch.randn(2, 3)
    with torch.no_grad():
        for side, model in ((0, ref), (1, cand)):
            with s.recording(side, model=model):
                for k in range(2):
                    step["k"] = k
                    model(x)
    got = [(r["step"], r["tag"]) for r in s.rows()]
    assert got == [
        (0, "lin@0::addmm#0"),
        (0, "lin@1::addmm#0"),
        (1, "lin@0::addmm#0"),
        (1, "lin@1::addmm#0"),
    ]
    assert all(r["status"] == "equal" for r in s.rows())


def test_in_place_op_keeps_the_value_its_producer_made():
    class AddInPlace(nn.Module):
        def __init__(self, amount):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.amount = amount

        def forward(self, x):
            h = self.lin(x)
            h.add_(self.amount)
            return h * 2

    torch.manual_seed(0)
    ref, cand = AddInPlace(1.0), AddInPlace(2.0)
    cand.load_state_dict(ref.state_dict())
    s = _run(ref, cand, torch.randn(3, 4))
    rows = _by_tag(s)
    # Without copy-on-write both addmm captures would hold the post-add_ values and differ.
    assert rows["lin@0::addmm#0"]["status"] == "equal"
    add = rows["model@0::add_#0"]
    assert add["status"] == "mismatch" and add["max_abs_diff"] == pytest.approx(1.0)
    assert add["inputs_status"] == "passing" and add["cause"] == "A"
    assert rows["model@0::mul#0"]["inputs_status"] == "failing"


def test_manual_registrations_are_kind_manual_rows():
    class Reg(nn.Module):
        def __init__(self, session, side, offset):
            super().__init__()
            self.session, self.side, self.offset = session, side, offset

        def forward(self, x):
            h = x * 2
            self.session.record_manual(self.side, "after_mul", h + self.offset)
            if self.side == 0:
                self.session.record_manual(self.side, "only_ref", h)
            return h

    s = OpSession(mode="equal")
    x = torch.arange(4.0)
    with s.recording(0):
        Reg(s, 0, 0.0)(x)
    with s.recording(1):
        Reg(s, 1, 0.5)(x)
    manual = {r["tag"]: r for r in s.rows() if r["kind"] == "manual"}
    assert manual["after_mul"]["status"] == "mismatch"
    assert manual["after_mul"]["max_abs_diff"] == pytest.approx(0.5)
    assert manual["after_mul"]["module"] == "model"
    assert manual["only_ref"]["status"] == "missing_candidate"
    # The `h + offset` of the manual call ran in the forward, so it is an op row too.
    assert _by_tag(s)["model@0::add#0"]["status"] == "mismatch"


def test_suspended_work_is_not_recorded():
    s = OpSession(mode="equal")
    x = torch.ones(3)
    with s.recording(0):
        y = x * 2
        with suspended():
            y.clone()
    with s.recording(1):
        y = x * 2
    assert [r["tag"] for r in s.rows()] == ["_top_@0::mul#0"]


def test_tolerance_override_by_glob():
    class Scale(nn.Module):
        def __init__(self, f):
            super().__init__()
            self.f = f

        def forward(self, x):
            return x * self.f

    x = torch.ones(3)
    s = _run(
        Scale(1.0),
        Scale(1.001),
        x,
        mode="allclose",
        tolerances={"model@0::mul#*": (0.0, 0.01)},
    )
    assert _by_tag(s)["model@0::mul#0"]["status"] == "close"
    s2 = _run(Scale(1.0), Scale(1.001), x, mode="allclose")
    assert _by_tag(s2)["model@0::mul#0"]["status"] == "mismatch"


def test_recording_order_is_enforced():
    s = OpSession(mode="equal")
    with pytest.raises(InputError, match="reference"), s.recording(1):
        pass
    with pytest.raises(InputError, match="use 0"), s.recording(2):
        pass
    with pytest.raises(InputError, match="inside recording"):
        s.record_manual(0, "t", torch.ones(1))
    with pytest.raises(InputError, match="max_resident_bytes"):
        OpSession(mode="equal", max_resident_bytes=-1)


def test_in_place_update_of_a_buffer_compares_pre_write_inputs():
    """Two steps of a stateful module: ``state`` is multiplied in, then bumped in place."""

    class Stateful(nn.Module):
        def __init__(self, increment):
            super().__init__()
            self.register_buffer("state", torch.ones(3))
            self.increment = increment

        def forward(self, x):
            y = x * self.state
            self.state.add_(self.increment)
            return y

    x = torch.arange(3.0)
    step = {"k": 0}
    s = OpSession(mode="equal", step_getter=lambda: step["k"])
    with torch.no_grad():
        for side, model in ((0, Stateful(1.0)), (1, Stateful(2.0))):
            with s.recording(side, model=model):
                for k in range(2):
                    step["k"] = k
                    model(x)
    rows = {(r["step"], r["tag"]): r for r in s.rows()}
    # Step 0 by hand: state = 1 on both sides, so the product is equal; add_ makes 2 vs 3.
    assert rows[(0, "model@0::mul#0")]["status"] == "equal"
    bump = rows[(0, "model@0::add_#0")]
    assert bump["status"] == "mismatch" and bump["max_abs_diff"] == 1.0
    assert bump["inputs_status"] == "passing"  # the pre-write state (1 vs 1), not 2 vs 3
    assert bump["cause"] == "A"
    # Step 1: the product sees 2 vs 3 (produced by the failing add_): propagated.
    mul1 = rows[(1, "model@0::mul#0")]
    assert mul1["status"] == "mismatch" and mul1["max_abs_diff"] == 2.0  # x[2] * (3 - 2)
    assert mul1["inputs_status"] == "failing" and mul1["root_cause"] is False
    assert [r["tag"] for r in s.root_causes()] == ["model@0::add_#0"]


def test_parameter_changed_in_place_between_calls_is_compared_again():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, x):
            return x * self.w

    ref, cand = Scale(), Scale()
    x = torch.ones(4)
    s = OpSession(mode="equal")
    with torch.no_grad():
        with s.recording(0, model=ref):
            ref(x)
            ref(x)
        with s.recording(1, model=cand):
            cand(x)
            with suspended():  # changed in place, unseen: only the version counter tells
                cand.w[0] = 5.0
            cand(x)
    rows = [r for r in s.rows() if r["op"] == "mul"]
    assert [(r["status"], r["inputs_status"]) for r in rows] == [
        ("equal", "passing"),
        ("mismatch", "failing"),
    ]


def test_candidate_that_raises_keeps_what_was_compared():
    class Fails(nn.Module):
        def __init__(self, fail):
            super().__init__()
            self.inner = Steps()
            self.fail = fail

        def forward(self, x):
            y = self.inner(x)
            if self.fail:
                raise RuntimeError("engine error")
            return y * 5

    from torch.nn.modules import module as module_mod

    pre_hooks = len(module_mod._global_forward_pre_hooks)
    post_hooks = len(module_mod._global_forward_hooks)
    x = torch.randn(3, 4)
    s = OpSession(mode="equal")
    with s.recording(0, model=Fails(False)):
        Fails(False)(x)
    with pytest.raises(RuntimeError, match="engine error"), s.recording(1, model=Fails(True)):
        Fails(True)(x)
    rows = _by_tag(s)
    assert rows["inner@0::sum#0"]["status"] == "equal"  # compared before the failure
    assert rows["model@0::mul#0"]["status"] == "missing_candidate"  # never reached
    # The global module hooks are gone after the failed recording.
    assert len(module_mod._global_forward_pre_hooks) == pre_hooks
    assert len(module_mod._global_forward_hooks) == post_hooks


class _Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x).relu()


class _ForCausalLM(nn.Module):  # the backbone is a child named "model" (Hugging Face shape)
    def __init__(self):
        super().__init__()
        self.model = _Backbone()

    def forward(self, x):
        return self.model(x) * 2


def test_op_tags_name_the_root_root_when_a_child_is_named_model():
    """Op tags use capture.tags.root_name: the root's ``mul`` is ``root@0``, the child's ops
    stay under ``model`` (before, both were attributed to ``model``)."""
    torch.manual_seed(0)
    ref = _ForCausalLM()
    cand = copy.deepcopy(ref)
    session = _run(ref, cand, torch.randn(2, 4))
    modules = {r["tag"]: r["module"] for r in session.rows()}
    assert modules["root@0::mul#0"] == "root"
    assert {m for t, m in modules.items() if "::addmm#" in t} == {"model.fc"}
    assert {m for t, m in modules.items() if "::relu#" in t} == {"model"}
