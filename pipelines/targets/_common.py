"""Helpers shared by the built-in targets: settings validation, seeding, input casting, caching.

Nothing here imports transformers, diffusers, onnxruntime or scikit-* (the targets import those
inside ``build``), so ``import parity_tracker.builtin_targets`` stays cheap.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

# the setting values shared by targets live in ``_settings`` (torch-free, read by ``targets``)
from parity_tracker.builtin_targets._settings import ENGINES as ENGINES
from parity_tracker.builtin_targets._settings import IMPLEMENTATIONS as IMPLEMENTATIONS
from parity_tracker.builtin_targets._settings import ORT_OPTIMIZATIONS as ORT_OPTIMIZATIONS
from parity_tracker.errors import InputError

#: Recorded for every built-in target: all of them run on the CPU.
DEVICE = "cpu"

#: Settings keys every case records besides the target's own ones (design.md, "A run's settings").
RECORDED_KEYS = (
    "target",
    "candidate",
    "device",
    "dtype",
    "quantization",
    "cache",
    "implementation",
)

#: torch dtype of each ``quantization`` value that is a plain cast of the weights.
CAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_settings(
    target: str, allowed: Mapping[str, list[str]], settings: Mapping[str, Any] | None
) -> dict[str, str]:
    """Validate ``settings`` against a target's ``SETTINGS`` and fill in the defaults.

    Args:
        target: the target's ``NAME`` (used in error messages).
        allowed: the target's ``SETTINGS``: allowed values per setting, the first is the default.
        settings: the requested settings; ``None`` or missing keys take the defaults. The keys
            ``target`` and ``device`` are accepted when they hold this target's own values
            (so a case's recorded settings can be fed back to ``build``).

    Returns:
        One value (a string) per key of ``allowed``.

    Raises:
        InputError: an unknown setting, or a value outside the allowed list; the message names
            the setting and the allowed values.
    """
    given = dict(settings or {})
    passthrough = {"target": target, "device": DEVICE}
    out: dict[str, str] = {}
    for key, value in given.items():
        if key in passthrough and key not in allowed:
            if str(value) != passthrough[key]:
                raise InputError(
                    f"target {target!r}: setting {key!r}={value!r} is not supported; "
                    f"allowed: {passthrough[key]!r}"
                )
            continue
        if key not in allowed:
            raise InputError(
                f"target {target!r} has no setting {key!r}; its settings are: "
                + ", ".join(f"{k} ({'|'.join(v)})" for k, v in allowed.items())
            )
        if str(value) not in allowed[key]:
            raise InputError(
                f"target {target!r}: setting {key!r}={value!r} is not allowed; "
                f"allowed values: {', '.join(allowed[key])} (default {allowed[key][0]})"
            )
        out[key] = str(value)
    return {key: out.get(key, values[0]) for key, values in allowed.items()}


def recorded_settings(target: str, chosen: Mapping[str, str], **recorded: str) -> dict[str, str]:
    """The settings dict a case carries: the target's own settings plus the recorded keys.

    Args:
        target: the target's ``NAME``.
        chosen: the resolved target settings (from :func:`resolve_settings`).
        **recorded: values for ``candidate``, ``dtype``, ``implementation`` and, where the
            target has no such setting, ``quantization`` / ``cache``.

    Returns:
        A dict with every key of ``chosen`` and every key of ``RECORDED_KEYS``; ``quantization``
        defaults to ``none`` and ``cache`` to ``off`` when neither the target nor the caller
        sets them.

    Raises:
        ValueError: a recorded key is missing (a bug in the target, not user input).
    """
    out = {"target": target, "device": DEVICE, "quantization": "none", "cache": "off"}
    out.update(chosen)
    out.update(recorded)
    lacking = [k for k in RECORDED_KEYS if k not in out]
    if lacking:
        raise ValueError(f"target {target!r} did not record settings {lacking}")
    return out


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the block with torch's global RNG seeded, restoring the caller's RNG state after."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@contextlib.contextmanager
def num_threads(n: int) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(n)``, restoring the previous count after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def frozen_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``module`` in eval mode with gradients off (the weights are copied)."""
    twin = copy.deepcopy(module).eval()
    twin.requires_grad_(False)
    return twin


def cast_inputs(
    module: torch.nn.Module,
    dtype: torch.dtype | None = None,
    memory_format: torch.memory_format | None = None,
) -> torch.nn.Module:
    """Make ``module`` convert its floating-point tensor inputs before its forward runs.

    A forward pre-hook on the root: the candidate takes the same inputs as the reference (the
    runner hands both the same tuple) and casts them as its engine would. Hooks registered later
    (the checker's) see the converted inputs.

    Args:
        module: the candidate model (modified in place and returned).
        dtype: convert floating tensors to this dtype (``None``: keep).
        memory_format: convert 4-D tensors to this memory format (``None``: keep).

    Returns:
        ``module``.
    """

    def convert(value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            return value
        if dtype is not None:
            value = value.to(dtype)
        if memory_format is not None and value.dim() == 4:
            value = value.contiguous(memory_format=memory_format)
        return value

    def hook(_module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(convert(a) for a in args)

    module.register_forward_pre_hook(hook)
    return module


def cache_dir() -> Path:
    """Where targets cache checkpoints: ``$PARITY_TRACKER_CACHE_DIR`` or ``./.parity/cache``.

    The directory is created if missing.
    """
    root = Path(os.environ.get("PARITY_TRACKER_CACHE_DIR") or Path.cwd() / ".parity" / "cache")
    root.mkdir(parents=True, exist_ok=True)
    return root


def atomic_save(obj: Any, path: Path) -> None:
    """``torch.save`` to a temporary file beside ``path``, then rename it into place.

    A reader never sees a half-written checkpoint (``os.replace`` is atomic on POSIX and
    Windows within one file system).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def sequence_align(tag: str, reference: Any, candidate: Any) -> tuple[Any, Any] | None:
    """Align a full recompute with an incremental (KV-cache) step by slicing trailing positions.

    The recompute sees all ``T`` positions, the cached step only the newest ``n``. Where the two
    tensors differ in exactly one dimension, the *query-position* dimension (dim 1 of a 2-D/3-D
    tensor such as ``(batch, seq, hidden)``; dim -2 of a 4-D tensor such as attention weights
    ``(batch, heads, query, key)`` or a mask ``(batch, 1, query, key)``), and the candidate is the
    shorter one, the reference is cut to its last ``n`` positions along that dimension (a 1-D
    tensor such as ``cache_position`` is cut along dim 0). Any other
    pair is left as it is (``None``), so a genuine shape bug still shows as ``shape_mismatch``.

    Args:
        tag: the tag (unused: the rule is shape-based).
        reference: the recompute's tensor.
        candidate: the cached step's tensor.

    Returns:
        ``(sliced_reference, candidate)`` or ``None``.
    """
    del tag
    if not (isinstance(reference, torch.Tensor) and isinstance(candidate, torch.Tensor)):
        return None
    if reference.dim() != candidate.dim() or not 1 <= reference.dim() <= 4:
        return None
    differing = [d for d in range(reference.dim()) if reference.shape[d] != candidate.shape[d]]
    query_dim = {1: 0, 2: 1, 3: 1, 4: 2}[reference.dim()]
    if differing != [query_dim]:
        return None
    n = candidate.shape[query_dim]
    if n > reference.shape[query_dim]:
        return None
    return reference.narrow(query_dim, reference.shape[query_dim] - n, n), candidate


def nudge_one_ulp(tensor: torch.Tensor, index: int | None = None) -> int:
    """Move one element of a floating-point tensor up by one ULP, in place (a known perturbation).

    Uses ``torch.nextafter(x, +inf)``: the next representable value of the tensor's dtype.

    Args:
        tensor: a parameter or buffer (modified in place, under ``torch.no_grad()``).
        index: the flat index of the element; default the element of largest magnitude (the
            one whose change is least likely to be rounded away downstream).

    Returns:
        The flat index that was moved.
    """
    with torch.no_grad():
        flat = tensor.view(-1)
        i = int(flat.abs().argmax()) if index is None else int(index)
        flat[i] = torch.nextafter(flat[i], torch.tensor(float("inf"), dtype=flat.dtype))
    return i


def compile_candidate(candidate: torch.nn.Module, implementation: str, **options: Any) -> Any:
    """``torch.compile`` the candidate for ``implementation`` (``same``: returned unchanged).

    Raises:
        InputError: ``inductor`` without a C++ compiler (the message names what to install).
    """
    if implementation == "same":
        return candidate
    from parity_tracker.adapters.compiled import compile_model

    return compile_model(candidate, implementation, **options)


def engine_settings(
    target: str, chosen: dict[str, str], **exclusive: str
) -> tuple[bool, dict[str, str]]:
    """Check the ``candidate`` / ``ort_optimization`` combination; the settings to record.

    ``candidate=onnxruntime`` exports the fp32 reference itself, so it combines with no other
    candidate change (``exclusive``: each such setting's default, e.g. ``quantization="none"``).
    ``ort_optimization`` is recorded only with ``candidate=onnxruntime`` (so the fingerprints
    of the torch cells are those they had before the setting existed).

    Returns:
        ``(onnx, chosen_to_record)``.

    Raises:
        InputError: ``candidate=onnxruntime`` with a non-default value of an exclusive setting.
    """
    onnx = chosen.get("candidate") == "onnxruntime"
    clash = [f"{k}={chosen[k]}" for k, default in exclusive.items() if chosen.get(k) != default]
    if onnx and clash:
        raise InputError(
            f"target {target!r}: candidate=onnxruntime runs the export of the fp32 reference and "
            f"cannot be combined with {', '.join(clash)}; use the defaults "
            + ", ".join(f"{k}={v}" for k, v in exclusive.items())
        )
    record = dict(chosen)
    if not onnx:
        record.pop("ort_optimization", None)
    return onnx, record


def onnx_drives(
    reference: torch.nn.Module, steps: list[tuple[Any, ...]], chosen: Mapping[str, str]
) -> Any:
    """The onnxruntime candidate of a target: export, name map, both drives.

    Returns:
        A ``parity_tracker.adapters.foreign.ForeignCandidate`` (``reference_drive`` for the
        reference, ``drive`` for the candidate).

    Raises:
        InfrastructureError: onnx, onnxscript or onnxruntime is missing.
    """
    from parity_tracker.adapters.onnx import onnx_candidate

    return onnx_candidate(reference, steps, ort_optimization=chosen["ort_optimization"])


def onnx_case(
    target: str,
    reference: torch.nn.Module,
    candidate: Any,
    chosen: Mapping[str, str],
    record: Mapping[str, str],
    how: str,
) -> Any:
    """The ``candidate=onnxruntime`` case of a target, around its ``ForeignCandidate``.

    Args:
        target: the target's name (for the recorded settings).
        reference: the PyTorch reference module.
        candidate: the ``ForeignCandidate`` (:func:`onnx_drives` or ``onnx_candidate``).
        chosen: the resolved settings (``ort_optimization`` is read).
        record: the settings recorded with the run.
        how: the notes' head, up to the words "in onnxruntime".

    Returns:
        A ``parity_tracker.pipeline.case.ParityCase`` driving the reference with
        ``candidate.reference_drive`` and the candidate with ``candidate.drive``.
    """
    from parity_tracker.pipeline.case import ParityCase

    return ParityCase(
        reference=reference,
        candidate=candidate,
        drive=candidate.reference_drive,
        candidate_drive=candidate.drive,
        settings=recorded_settings(
            target, record, candidate="onnxruntime", dtype="float32", implementation="onnxruntime"
        ),
        notes=(
            f"{how} in onnxruntime (CPU, 1 thread, "
            f"ort_optimization={chosen['ort_optimization']}); module values from the marked "
            "graph are diagnostic, the output verdict is the deployed graph's"
        ),
    )
