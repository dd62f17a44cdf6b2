"""Op-level module snapshots of channels-last outputs read the op store's sealed file (issue 19).

In an op-level run a module's output is usually its last op's output, which the op store
captured and, past its budget, wrote to a sealed spill file (``op_store._seal``). A
channels-last output used to be snapshotted again as a C-order copy, which the snapshot store
wrote a second time. ``OpStore.sealed_spill`` lets ``Snapshotter.take`` read that file
instead when it provably holds the output's bytes (same address, layout, version counter and
storage digest). The expected values here are numpy copies taken by the user's forward hooks.
"""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
import torch
import torch.nn as nn

import parity_tracker.ops as ops_module
import parity_tracker.tensor_checker as checker_module
from parity_tracker.capture import store as store_module
from parity_tracker.capture.op_store import OpStore
from parity_tracker.capture.tags import module_tag
from parity_tracker.run import run_parity
from parity_tracker.tensor_checker import DumpMode

BUDGET = 64 << 10  # both stores: every 1x16x64x64 fp32 output (256 KiB) spills


@pytest.fixture(autouse=True)
def _small_budgets(tmp_path, monkeypatch):
    """Spills land in ``tmp_path``; both resident budgets small, so a tiny model spills."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(ops_module, "DEFAULT_MAX_RESIDENT_BYTES", BUDGET)
    monkeypatch.setattr(checker_module, "OPS_RUN_RESIDENT_BYTES", BUDGET)


@pytest.fixture
def writes(monkeypatch):
    """Bytes written to spill files, by store (folder prefix: ``ops-`` or ``checker-``)."""
    seen: dict[str, int] = {"ops-spill-": 0, "checker-spill-": 0}
    real = store_module.SpillDir.append

    def spy(self, tensor):
        out = real(self, tensor)
        seen[self.prefix] = seen.get(self.prefix, 0) + out.nbytes
        return out

    monkeypatch.setattr(store_module.SpillDir, "append", spy)
    return seen


@pytest.fixture
def borrowed(monkeypatch):
    """Snapshots served from a sealed op-store file (fails on code without ``sealed_spill``)."""
    hits: list[tuple[int, ...]] = []
    real = OpStore.sealed_spill

    def spy(self, t):
        out = real(self, t)
        if out is not None:
            hits.append(tuple(t.shape))
        return out

    monkeypatch.setattr(OpStore, "sealed_spill", spy)
    return hits


def _conv(seed: int, cin: int, cout: int, zero: bool = False) -> nn.Conv2d:
    torch.manual_seed(seed)
    conv = nn.Conv2d(cin, cout, 3, padding=1)
    if zero:
        nn.init.zeros_(conv.weight)
        nn.init.zeros_(conv.bias)
    return conv.to(memory_format=torch.channels_last)


def _x() -> torch.Tensor:
    torch.manual_seed(7)
    return torch.randn(1, 3, 64, 64).to(memory_format=torch.channels_last)


def _record(module: nn.Module, into: dict, name: str) -> None:
    """A user forward hook keeping a numpy copy of ``module``'s output at the hook."""

    def hook(_m, _args, out):
        assert not out.is_contiguous() and out.is_contiguous(memory_format=torch.channels_last)
        into[name] = out.detach().clone().numpy()

    module.register_forward_hook(hook)


def _run(ref: nn.Module, cand: nn.Module) -> dict[str, dict]:
    with torch.no_grad():
        result = run_parity(
            ref, cand, (_x(),), mode="allclose", capture_ops=True, dump_mode=DumpMode.NOT
        )
    return {r["tag"]: r for r in result.modules.to_pylist()}


def _chain() -> nn.Sequential:
    return nn.Sequential(_conv(1, 3, 16), nn.ReLU(), _conv(2, 16, 16), nn.ReLU(), _conv(3, 16, 8))


@pytest.mark.parametrize("ops_bytes", [BUDGET, 16 << 20])
def test_channels_last_outputs_written_once(monkeypatch, writes, borrowed, ops_bytes):
    # BUDGET: each op output spills at its admission, before the module hook (a sealed file);
    # 16 MiB: still resident at the hook, where the op store writes it once, now
    monkeypatch.setattr(ops_module, "DEFAULT_MAX_RESIDENT_BYTES", ops_bytes)
    ref, cand, seen = _chain(), _chain(), {}
    for i in (0, 1, 2, 3, 4):
        _record(ref[i], seen, f"ref{i}")
        _record(cand[i], seen, f"cand{i}")
    mods = _run(ref, cand)
    for i in (0, 1, 2, 3, 4):  # same weights, same input: every output equal, diff 0 (numpy)
        assert np.abs(seen[f"ref{i}"] - seen[f"cand{i}"]).max() == 0.0
        row = mods[module_tag(str(i))]
        assert (row["status"], row["max_abs_diff"]) == ("equal", 0.0), row
    assert mods["checker_model"]["status"] == "equal"
    # each of the 5 reference outputs (16 or 8 channels x 64 x 64 fp32) read the op store's file
    assert len(borrowed) >= 5
    # each reference output once: main wrote every one again from the snapshot store
    outputs = (4 * 16 + 8) * 64 * 64 * 4
    assert writes["checker-spill-"] == 0, writes
    assert writes["ops-spill-"] >= outputs


class ZeroInPlace(nn.Module):
    """Zeroes its input (the previous module's output) in place after reading it."""

    def forward(self, y):
        z = y * 1
        y.mul_(0)
        return z


@pytest.mark.parametrize("ops_bytes", [BUDGET, 16 << 20])  # spilled / resident at the hook
def test_write_after_the_module_returns_does_not_reach_the_snapshot(
    monkeypatch, borrowed, ops_bytes
):
    monkeypatch.setattr(ops_module, "DEFAULT_MAX_RESIDENT_BYTES", ops_bytes)
    # reference: conv output v, then zeroed in place by the next module; candidate: a conv
    # that outputs 0 (v's buffer after the write). The reference row must compare v (taken
    # at the hook, numpy copy), never the zeroed buffer: mismatch with max |v - 0|.
    ref = nn.Sequential(_conv(1, 3, 16), ZeroInPlace())
    cand = nn.Sequential(_conv(1, 3, 16, zero=True), ZeroInPlace())
    seen: dict[str, np.ndarray] = {}
    _record(ref[0], seen, "ref")
    _record(cand[0], seen, "cand")
    mods = _run(ref, cand)
    assert (1, 16, 64, 64) in borrowed  # the reference conv output read the op store's file
    expected = float(np.abs(seen["ref"].astype(np.float64) - seen["cand"]).max())
    assert expected > 0.1
    row = mods["checker_0"]
    assert row["status"] == "mismatch", row
    assert row["max_abs_diff"] == pytest.approx(expected, rel=0, abs=0)
    assert mods["checker_1_input_0"]["status"] == "mismatch"  # ZeroInPlace read v, not 0


class BumpOne(nn.Module):
    """A conv whose output gets ``+ 0.75`` at one element (channels-last, in place)."""

    def __init__(self, conv: nn.Conv2d):
        super().__init__()
        self.conv = conv

    def forward(self, x):
        y = self.conv(x)
        y[0, 5, 17, 33] += 0.75
        return y


@pytest.mark.parametrize("ops_bytes", [BUDGET, 16 << 20])  # spilled / resident at the hook
def test_one_element_differs_in_a_channels_last_output(monkeypatch, borrowed, ops_bytes):
    monkeypatch.setattr(ops_module, "DEFAULT_MAX_RESIDENT_BYTES", ops_bytes)
    ref = nn.Sequential(_conv(1, 3, 16), nn.ReLU(), _conv(2, 16, 8))
    cand = nn.Sequential(BumpOne(_conv(1, 3, 16)), nn.ReLU(), _conv(2, 16, 8))
    seen: dict[str, np.ndarray] = {}
    _record(ref[0], seen, "ref")
    _record(cand[0], seen, "cand")
    mods = _run(ref, cand)
    assert (1, 16, 64, 64) in borrowed
    diff = np.abs(seen["ref"].astype(np.float64) - seen["cand"])
    assert np.count_nonzero(diff) == 1 and diff[0, 5, 17, 33] > 0.7
    row = mods["checker_0"]
    assert row["status"] == "mismatch", row
    assert row["max_abs_diff"] == pytest.approx(float(diff.max()), rel=0, abs=0)
