"""OpSession memory bound (issue 5 §4): resident captured bytes stay within the budget
whatever the depth, spilled captures compare exactly like resident ones."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from parity_tracker.ops import OpSession

BATCH, WIDTH = 8, 64
OUT_BYTES = BATCH * WIDTH * 4  # one float32 (8, 64) op output: 2048 bytes


def _deep(depth: int, seed: int = 0, tanh_layer: int | None = None) -> nn.Sequential:
    torch.manual_seed(seed)
    layers = []
    for i in range(depth):
        layers += [nn.Linear(WIDTH, WIDTH), nn.GELU("tanh" if i == tanh_layer else "none")]
    return nn.Sequential(*layers).eval()


def _pair(depth: int, wrong_layer: int | None = None):
    """Reference and candidate with equal weights; the candidate's GELU number
    ``wrong_layer`` uses the tanh approximation."""
    ref = _deep(depth)
    cand = _deep(depth, seed=1, tanh_layer=wrong_layer)
    cand.load_state_dict(ref.state_dict())
    return ref, cand


def _record(ref, cand, x, **kwargs) -> OpSession:
    s = OpSession(mode="equal", **kwargs)
    with torch.no_grad():
        with s.recording(0, model=ref):
            ref(x)
        x_cand = x.clone()  # each side its own input, as run_parity does
        with s.recording(1, model=cand):
            cand(x_cand)
    return s


@pytest.mark.parametrize("depth", [4, 16])
def test_without_a_budget_resident_bytes_grow_with_depth(depth):
    # By hand. Reference: each layer captures its addmm and gelu outputs (2 x 2048 B), plus a
    # reference to the model input x (made outside the recorded ops; weights and biases are
    # parameters, not counted). Candidate: every module call is compared and released as it
    # ends; the most it holds at once is one op output plus a reference to that op's input
    # (x for the first addmm, the previous call's output for each later op): 2 x 2048 B.
    ref, cand = _pair(depth)
    s = _record(ref, cand, torch.randn(BATCH, WIDTH))
    reference_bytes = (depth * 2 + 1) * OUT_BYTES
    assert s.resident_bytes == reference_bytes  # the reference's captures remain
    assert s.peak_resident_bytes == reference_bytes + 2 * OUT_BYTES
    assert s.spilled_bytes == 0
    assert len(s.rows()) == depth * 2


@pytest.mark.parametrize("depth", [4, 16, 48])
def test_budget_bounds_resident_bytes_independently_of_depth(depth, tmp_path):
    budget = 3 * OUT_BYTES
    ref, cand = _pair(depth, wrong_layer=depth // 2)
    x = torch.randn(BATCH, WIDTH)
    s = _record(ref, cand, x, max_resident_bytes=budget, spill_dir=tmp_path)
    assert s.peak_resident_bytes <= budget
    # Everything the reference captured beyond the budget went to disk.
    assert s.spilled_bytes >= depth * 2 * OUT_BYTES - budget
    spilled_rows = s.rows()
    # Same verdicts and metrics as with everything resident.
    resident = _record(ref, cand, x)
    keep = ("tag", "status", "max_abs_diff", "inputs_status", "root_cause", "cause")
    assert [{k: r[k] for k in keep} for r in spilled_rows] == [
        {k: r[k] for k in keep} for r in resident.rows()
    ]
    (first,) = s.root_causes()
    assert first["tag"] == f"{2 * (depth // 2) + 1}@0::gelu#0"
    assert first["cause"] == "A"
    s.close()
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_zero_budget_spills_every_capture(tmp_path):
    ref, cand = _pair(3, wrong_layer=1)
    s = _record(ref, cand, torch.randn(BATCH, WIDTH), max_resident_bytes=0, spill_dir=tmp_path)
    assert s.peak_resident_bytes == 0
    # By hand (depth 3): reference 2 captures per layer + the input x = 7 x 2048 B; candidate
    # per layer: the addmm's input, its output, the gelu's input and output = 4 x 2048 B.
    assert s.spilled_bytes == (7 + 3 * 4) * OUT_BYTES
    assert [r["tag"] for r in s.root_causes()] == ["3@0::gelu#0"]


def test_spilled_bfloat16_and_strided_captures_round_trip(tmp_path):
    class Perm(nn.Module):
        def forward(self, x):
            return (x.to(torch.bfloat16) * 3).permute(1, 0).contiguous() + 1

    x = torch.randn(5, 7)
    s = _record(Perm(), Perm(), x, max_resident_bytes=0, spill_dir=tmp_path)
    assert s.spilled_bytes > 0
    assert all(r["status"] == "equal" for r in s.rows())


class ResidualStack(nn.Module):
    """The root adds every layer's output to a running sum (ops of the root's own call)."""

    def __init__(self, depth: int, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(depth))

    def forward(self, h):
        for layer in self.layers:
            h = h + layer(h)
        return h


def test_budget_holds_when_the_root_call_spans_every_layer(tmp_path):
    # Without counting the candidate's input references, the open root call would keep every
    # layer's output alive until the end: memory growing with depth.
    depth, budget = 24, 3 * OUT_BYTES
    ref, cand = ResidualStack(depth), ResidualStack(depth, seed=1)
    cand.load_state_dict(ref.state_dict())
    x = torch.randn(BATCH, WIDTH)
    s = _record(ref, cand, x, max_resident_bytes=budget, spill_dir=tmp_path)
    assert s.peak_resident_bytes <= budget
    rows = s.rows()
    assert len(rows) == 2 * depth  # by hand: addmm in layers.i, add in the root, per layer
    assert all(r["status"] == "equal" and r["inputs_status"] == "passing" for r in rows)
    unbounded = _record(ref, cand, x)
    # Same check without a budget: the root's add outputs and the candidate's references to
    # the layer outputs pile up (depth-proportional), so the budget really did the bounding.
    assert unbounded.peak_resident_bytes >= 2 * depth * OUT_BYTES
