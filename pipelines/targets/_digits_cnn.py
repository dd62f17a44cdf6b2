"""The digits-cnn target's code (imports torch at import time).

Its metadata (``NAME``, ``DESCRIPTION``, ``SETTINGS``) and the module docstring are in
``parity_tracker.builtin_targets.digits_cnn``, the entry point, which reads without torch and loads
this module on first use of ``build`` or any other name.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import numpy as np
import torch
import xxhash
from filelock import FileLock
from torch import nn

from parity_tracker.builtin_targets import _common
from parity_tracker.builtin_targets.digits_cnn import DESCRIPTION as DESCRIPTION
from parity_tracker.builtin_targets.digits_cnn import NAME as NAME
from parity_tracker.builtin_targets.digits_cnn import SETTINGS as SETTINGS
from parity_tracker.capture.tags import param_tag
from parity_tracker.pipeline.case import ParityCase

#: The training recipe; its hash (with the data's and torch's version) keys the checkpoint cache.
RECIPE: dict[str, Any] = {
    "arch": "conv16-conv32-pool-fc64-fc10",
    "split": {"test_size": 0.25, "random_state": 0, "stratify": True},
    "scale": 1.0 / 16.0,  # load_digits pixels are integers 0..16
    "seed": 0,
    "epochs": 12,
    "batch_size": 64,
    "optimizer": "adam",
    "lr": 3e-3,
    "num_threads": 1,
}
EVAL_BATCH = 64


class DigitsCNN(nn.Module):
    """Conv(1→16) → ReLU → Conv(16→32) → ReLU → MaxPool(2) → Linear(512→64) → ReLU → Linear(64→10).

    Input ``(N, 1, 8, 8)`` float pixels in [0, 1]; output ``(N, 10)`` logits.
    """

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.relu3 = nn.ReLU()
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu2(self.conv2(self.relu1(self.conv1(x)))))
        return self.fc2(self.relu3(self.fc1(self.flatten(x))))


def load_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """scikit-learn's digits split by the recipe: ``(x_train, y_train, x_test, y_test)``.

    Images are ``(N, 1, 8, 8)`` float32 scaled to [0, 1]; labels ``(N,)`` int64.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images.astype(np.float32) * RECIPE["scale"])[:, None]
    split = RECIPE["split"]
    x_tr, x_te, y_tr, y_te = train_test_split(
        images,
        digits.target,
        test_size=split["test_size"],
        random_state=split["random_state"],
        stratify=digits.target if split["stratify"] else None,
    )
    as_t = torch.from_numpy
    return as_t(x_tr), as_t(y_tr).long(), as_t(np.ascontiguousarray(x_te)), as_t(y_te).long()


def _recipe_key(x_train: torch.Tensor, y_train: torch.Tensor) -> str:
    h = xxhash.xxh64()
    h.update(json.dumps(RECIPE, sort_keys=True).encode())
    h.update(torch.__version__.encode())
    h.update(x_train.numpy().tobytes())
    h.update(y_train.numpy().tobytes())
    return h.hexdigest()


def train(x_train: torch.Tensor, y_train: torch.Tensor) -> DigitsCNN:
    """Train a :class:`DigitsCNN` by the recipe (Adam, cross-entropy), deterministically.

    Seeded init and shuffling, one thread (a different thread count may sum in another order).
    """
    with _common.seeded(RECIPE["seed"]), _common.num_threads(RECIPE["num_threads"]):
        model = DigitsCNN()
        opt = torch.optim.Adam(model.parameters(), lr=RECIPE["lr"])
        gen = torch.Generator().manual_seed(RECIPE["seed"])
        bs = RECIPE["batch_size"]
        for _ in range(RECIPE["epochs"]):
            order = torch.randperm(len(x_train), generator=gen)
            for start in range(0, len(order), bs):
                idx = order[start : start + bs]
                opt.zero_grad()
                nn.functional.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
                opt.step()
    return model.eval()


def trained_model() -> tuple[DigitsCNN, torch.Tensor, float]:
    """The trained model (from the cache, training it on a miss) and the held-out data.

    Returns:
        ``(model, x_test, accuracy)``: the fp32 model in eval mode, the held-out images
        ``(N, 1, 8, 8)`` and the model's held-out accuracy in [0, 1].
    """
    x_tr, y_tr, x_te, y_te = load_data()
    path = _common.cache_dir() / f"digits-cnn-{_recipe_key(x_tr, y_tr)}.pt"
    with FileLock(str(path) + ".lock"):
        if not path.exists():
            _common.atomic_save(train(x_tr, y_tr).state_dict(), path)
    model = DigitsCNN()
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    model.eval().requires_grad_(False)
    with torch.no_grad():
        accuracy = float((model(x_te).argmax(1) == y_te).float().mean())
    return model, x_te, accuracy


def _quantize_int8(model: nn.Module) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization deprecation notices
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def build(settings: dict[str, Any] | None = None) -> ParityCase:
    """Build the digits-cnn case.

    Args:
        settings: ``quantization`` (none | fp16 | bf16 | int8) and ``memory_format``
            (contiguous | channels_last); missing keys take the first value.

    Returns:
        A single-forward :class:`ParityCase` with ``inputs=(x,)``, ``x`` the first 64 held-out
        digits ``(64, 1, 8, 8)`` float32.

    Raises:
        InputError: an unknown setting or value.
    """
    chosen = _common.resolve_settings(NAME, SETTINGS, settings)
    onnx, chosen_rec = _common.engine_settings(
        NAME, chosen, quantization="none", memory_format="contiguous"
    )
    reference, x_test, accuracy = trained_model()
    if onnx:
        return _onnx_case(reference, x_test[:EVAL_BATCH].clone(), chosen, chosen_rec, accuracy)
    candidate = _common.frozen_copy(reference)
    quant, layout = chosen["quantization"], chosen["memory_format"]
    channels_last = layout == "channels_last"
    cast = _common.CAST_DTYPES.get(quant)
    if cast is not None:
        candidate = candidate.to(cast)
    if quant == "int8":
        candidate = _quantize_int8(candidate)
    if channels_last:
        candidate = candidate.to(memory_format=torch.channels_last)
    candidate = _common.cast_inputs(
        candidate, dtype=cast, memory_format=torch.channels_last if channels_last else None
    )
    names = {"none": "copy", "fp16": "fp16-cast", "bf16": "bf16-cast", "int8": "int8-dynamic"}
    notes = [f"held-out accuracy of the reference: {accuracy:.4f} on {len(x_test)} digits"]
    tolerances = None
    if quant == "int8":
        tolerances = _int8_weight_tolerances(candidate)
        notes.append(
            "int8 = dynamic quantization of fc1/fc2 (torch.ao quantize_dynamic, qint8 weights per "
            "tensor, activations quantized per batch); their packed weights are unpacked and "
            "compared dequantized, within half a quantization step (atol = scale / 2)"
        )
    if channels_last:
        notes.append(
            "channels_last changes only the memory layout (same kernels by the seed's principle): "
            "expected bitwise equal, so auto mode stays equal; measured equal at every module "
            "on torch 2.13 CPU (x86)"
        )
    recorded = _common.recorded_settings(
        NAME,
        chosen_rec,
        candidate=names[quant] + ("+channels_last" if channels_last else ""),
        dtype={"fp16": "float16", "bf16": "bfloat16", "int8": "qint8"}.get(quant, "float32"),
        implementation="same",
    )
    return ParityCase(
        reference=reference,
        candidate=candidate,
        inputs=(x_test[:EVAL_BATCH].clone(),),
        settings=recorded,
        notes="; ".join(notes),
        tolerances=tolerances,
    )


def _int8_weight_tolerances(candidate: nn.Module) -> dict[str, tuple[float, float]]:
    """``{checker_<name>.weight: (0, scale / 2)}`` for each dynamic int8 Linear of ``candidate``.

    Per-tensor affine rounding to the nearest step moves a weight by at most half a step
    (``scale / 2``; no clipping, since the range is the weight's own min/max), plus the float32
    rounding of the dequantization, covered by a relative margin of 1e-3 of that bound.
    """
    out = {}
    for name, mod in candidate.named_modules():
        weight = getattr(type(mod), "weight", None)
        if callable(weight) and hasattr(mod, "_packed_params"):
            scale = float(mod.weight().q_scale())
            out[param_tag(f"{name}.weight")] = (0.0, 0.5 * scale * (1 + 1e-3))
    return out


def _onnx_case(
    reference: nn.Module, x: torch.Tensor, chosen: dict, record: dict, accuracy: float
) -> ParityCase:
    """``candidate=onnxruntime``: the reference exported to ONNX, run in onnxruntime."""
    cand = _common.onnx_drives(reference, [(x,)], chosen)
    how = (
        f"held-out accuracy of the reference: {accuracy:.4f}; candidate: "
        "torch.onnx.export(dynamo=True)"
    )
    return _common.onnx_case(NAME, reference, cand, chosen, record, how)
