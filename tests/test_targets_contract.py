"""The contract every built-in target keeps, checked once for all of them.

For each target registered in the ``parity_tracker.targets`` entry-point group by this project:

1. the identity candidate (the default settings, or the one setting that gives a copy) is
   bitwise ``equal`` at every tensor of every step, with no cache hit;
2. one known parameter of the candidate moved by one ULP (``torch.nextafter``) is exactly the
   first divergence, at step 0, while named tensors before it stay ``equal``.

What is special about one target (its inputs, its other settings' cells) stays in its own
``tests/test_target_<name>.py``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from helpers import build_target, nudge_all_one_ulp, rows_by, run_quiet

from parity_tracker.builtin_targets import _common
from parity_tracker.pipeline.targets import list_targets


@dataclass(frozen=True)
class Contract:
    """What one target's identity and one-ULP runs must show.

    Attributes:
        identity: settings that make the candidate a copy of the reference.
        steps: steps of one run (the target's ``STEPS``/``CHUNKS``; 1 for one forward).
        nudge: ``nudge(case)`` moves one parameter of the candidate by one ULP.
        first: ``(field, value)`` the first divergence must have (``module`` or ``tag``).
        mismatch: the tag that must be ``mismatch`` at step 0 after the nudge.
        still_equal: tags that must stay ``equal`` at step 0 after the nudge.
        modules: module names the identity run must report (the names a user reads).
        compared: the number of tensors compared in the identity run, when fixed.
    """

    identity: dict[str, str]
    steps: int
    nudge: Callable[[Any], None]
    first: tuple[str, str]
    mismatch: str
    still_equal: tuple[str, ...] = ()
    modules: frozenset[str] = field(default_factory=frozenset)
    compared: int | None = None


def _ulp(name: str) -> Callable[[Any], None]:
    def nudge(case: Any) -> None:
        _common.nudge_one_ulp(case.candidate.get_submodule(name).weight)

    return nudge


def _silero_output_conv(case: Any) -> None:
    # every element of the final 1x1 conv's weight: a single element's ULP is absorbed by
    # rounding on this input (measured); the TorchScript graph reads the weight live
    params = dict(case.candidate.engine.named_parameters())
    nudge_all_one_ulp(params["_model.decoder.decoder.2.weight"])


def _steps(module: str, name: str) -> int:
    return getattr(importlib.import_module(f"parity_tracker.builtin_targets.{module}"), name)


CONTRACTS = {
    "digits-cnn": Contract(
        identity={},
        steps=1,
        nudge=_ulp("conv2"),
        first=("module", "conv2"),
        mismatch="checker_conv2",
        still_equal=("checker_conv1", "checker_relu1"),
    ),
    "vae-tiny": Contract(
        identity={},
        steps=1,
        nudge=_ulp("encoder.down_blocks.0.downsamplers.0.conv"),
        first=("module", "encoder.down_blocks.0.downsamplers.0.conv"),
        mismatch="checker_encoder.down_blocks.0.downsamplers.0.conv",
        still_equal=("checker_encoder.down_blocks.0.resnets.0",),
        modules=frozenset(
            {"encoder.conv_in", "encoder.down_blocks.0.downsamplers.0", "decoder.conv_out"}
        ),
    ),
    "llama-tiny": Contract(
        identity={},
        steps=_steps("llama_tiny", "STEPS"),
        nudge=_ulp("model.layers.1.mlp.down_proj"),
        first=("module", "model.layers.1.mlp.down_proj"),
        mismatch="checker_model.layers.1.mlp.down_proj",
        still_equal=("checker_model.layers.1.mlp.up_proj", "checker_model.layers.0"),
    ),
    "flux-tiny": Contract(
        identity={},
        steps=_steps("flux_tiny", "STEPS"),
        nudge=_ulp("single_transformer_blocks.0.proj_mlp"),
        first=("module", "single_transformer_blocks.0.proj_mlp"),
        mismatch="checker_single_transformer_blocks.0.proj_mlp",
        still_equal=("checker_transformer_blocks.1_output_0",),
    ),
    "silero-vad": Contract(
        identity={"candidate": "torchscript"},
        steps=_steps("silero_vad", "CHUNKS"),
        nudge=_silero_output_conv,
        first=("tag", "checker_model_output_0"),
        mismatch="checker_model_output_0",
        still_equal=("checker_model_output_1", "checker_model_input_1"),
        compared=4 * _steps("silero_vad", "CHUNKS"),
    ),
}


def test_every_builtin_target_has_a_contract():
    builtins = sorted(t.name for t in list_targets() if t.source == "builtin")
    assert builtins == sorted(CONTRACTS)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONTRACTS))
def test_identity_candidate_is_bitwise_equal_at_every_step(name):
    contract = CONTRACTS[name]
    case = build_target(name, contract.identity)
    assert case.settings["implementation"] == "same"
    result = run_quiet(case)
    s = result.summary
    assert s["mode"] == "equal" and s["passed"] and s["output_equal"]
    statuses = result.modules.column("status").to_pylist()
    assert statuses and set(statuses) <= {"equal", "skipped"}
    # skipped: only non-tensor leaves (e.g. a DynamicCache object), named, never compared
    for row in result.modules.to_pylist():
        assert row["status"] == "equal" or row["message"].startswith("not compared"), row
    assert s["counts"]["equal"] + s["counts"]["skipped"] == s["tensors_compared"] == len(statuses)
    assert sorted(set(result.modules.column("step").to_pylist())) == list(range(contract.steps))
    assert not any(result.modules.column("cache_hit").to_pylist())
    assert contract.modules <= set(result.modules.column("module").to_pylist())
    if contract.compared is not None:
        assert s["tensors_compared"] == contract.compared


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONTRACTS))
def test_one_ulp_is_the_first_divergence(name):
    contract = CONTRACTS[name]
    case = build_target(name, contract.identity)
    contract.nudge(case)
    result = run_quiet(case)
    first = result.summary["first_divergence"]
    key, value = contract.first
    assert first[key] == value and first["step"] == 0
    rows = rows_by(result, "tag", "step")
    assert rows[(contract.mismatch, 0)]["status"] == "mismatch"
    for tag in contract.still_equal:
        assert rows[(tag, 0)]["status"] == "equal", tag
