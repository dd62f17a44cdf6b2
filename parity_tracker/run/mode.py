"""The comparison mode of a run (seed §2), its configuration fingerprint and its baseline key.

The baseline key (:func:`baseline_key`, :func:`baseline_params`) is the configuration
fingerprint and the judged mode: what a stored run must share with a run to be its baseline.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from parity_tracker.adapters import MEASURED_PARAMS
from parity_tracker.run.environment import ENV_KEYS
from parity_tracker.statuses import BUDGET, RUN_MODES

#: Settings whose allclose the error budget cannot replace (issue 15): a cache skips or reuses
#: computation and random ops draw differently in float64, so a float64 golden says nothing.
BUDGET_BLOCKERS = frozenset({"cache", "random"})
#: Settings the error budget does not support yet: a sharded run is compared per rank by
#: ``parity_tracker.distributed`` (its own pairing), which has no golden side.
BUDGET_NOT_YET = frozenset({"distributed"})
BUDGET_NOTE = "; error budget against a float64 golden instead of a tolerance"
#: Run param (and ``mode_reason`` note) of a budget run whose reference side is the twin
#: (``run.budget``, amended 2026-12-01): its value, :func:`twin_reference_side`, says so.
REFERENCE_SIDE = "reference_side"

#: Run params naming the two sides by class (:func:`side_names`): what the report's title
#: calls a run whose settings name no ``target`` / ``candidate`` (a ``run_parity`` of the
#: caller's own models, a ``module:function`` target without a ``candidate`` setting).
REFERENCE_MODEL, CANDIDATE_MODEL = "reference_model", "candidate_model"
#: Both, for the readers that list settings (``RunInfo.settings``, the MLflow view's columns):
#: the class names are facts of the run, not settings.
SIDE_NAMES = (REFERENCE_MODEL, CANDIDATE_MODEL)

#: Settings keys that are not part of the configuration fingerprint (run params measured by
#: the adapters, e.g. graph breaks, are facts of the run, not configuration; the sides' class
#: names, so renaming a class keeps a configuration's baselines).
NOT_FINGERPRINTED = frozenset(
    {
        *ENV_KEYS,
        *("mode", "mode_reason", "config_fingerprint", REFERENCE_SIDE),
        *SIDE_NAMES,
        *MEASURED_PARAMS,
    }
)


def side_names(reference: Any, candidate: Any) -> dict[str, str]:
    """``{REFERENCE_MODEL: ..., CANDIDATE_MODEL: ...}``: each side's class name.

    A ``torch.compile``-d module (``OptimizedModule``) is named by the module it compiles,
    ``"MyNet (torch.compile)"``; anything else (an ``nn.Module``, an ONNX or foreign candidate
    wrapper) by ``type(side).__name__``.
    """
    return {REFERENCE_MODEL: _class_name(reference), CANDIDATE_MODEL: _class_name(candidate)}


def _class_name(side: Any) -> str:
    name = type(side).__name__
    if name == "OptimizedModule" and hasattr(side, "_orig_mod"):  # torch._dynamo's wrapper
        return f"{type(side._orig_mod).__name__} (torch.compile)"
    return name


def twin_reference_side(dtype: Any = None) -> str:
    """The ``reference_side`` param of a budget run whose twin is its reference side.

    Args:
        dtype: the dtype the reference was cast to (``make_twin``); ``None``: the caller's twin.

    Returns:
        e.g. ``"twin (the reference at bfloat16; its own forward not run)"``.
    """
    if dtype is None:
        return "twin (the caller's twin; the reference's own forward not run)"
    name = str(dtype).removeprefix("torch.")
    return f"twin (the reference at {name}; its own forward not run)"


def _off(value: Any, *off_values: str) -> bool:
    """True when a setting value means "not in play" (None, False, '', or one of off_values)."""
    if value is None or value is False:
        return True
    return str(value).strip().lower() in {"", "false", "0", "no", *off_values}


def _integer_without_twin(settings: Mapping[str, Any]) -> bool:
    """An integer quantization (``int8``, ``int4``, ``uint8``, ``qint8``) and no ``twin`` set.

    PyTorch's own error at int8 is a fake-quantized reference only the caller can build
    (issue 15: "quantized int8 candidates without a twin stay on allclose").
    """
    quant = str(settings.get("quantization") or "").strip().lower()
    return quant.startswith(("int", "uint", "qint", "quint")) and _off(settings.get("twin"))


def choose_mode(settings: Mapping[str, Any], requested: str = "auto") -> tuple[str, str]:
    """The comparison mode for a run and the reason, following the seed's section 2.

    ``equal`` (bitwise, ``torch.equal``) is expected when both sides run the same LibTorch
    kernels on the same values; ``allclose`` is prescribed when any of these settings is on:
    ``quantization`` (not ``none``), ``cache`` (not ``off``), ``distributed`` (not ``none``),
    ``random`` (truthy: dropout, sampling) or ``implementation`` (present and not ``same``).

    Where approximate arithmetic alone calls for it (a cast or other quantization, another
    implementation: no cache, no random ops; sharding is not supported yet), ``auto`` picks
    ``budget`` (issue 15) instead; ``run_parity`` still falls back to ``allclose``, with the
    reason recorded, when the budget cannot run (int8 weights without a twin, random ops in the
    golden, a golden that cannot run in float64: ``parity_tracker.run.budget``).

    Args:
        settings: the run's settings.
        requested: ``"auto"``, ``"equal"``, ``"allclose"`` or ``"budget"``; anything but auto
            is kept.

    Returns:
        ``(mode, reason)``, e.g. ``("allclose", "quantization=int8 (approximate arithmetic);
        no error budget: integer quantization needs a twin")``.

    Raises:
        InputError: ``requested`` is not one of the four modes.
    """
    from parity_tracker.errors import InputError

    if requested not in ("auto", *RUN_MODES):
        raise InputError(f"mode must be one of auto, {', '.join(RUN_MODES)}; got {requested!r}")
    if requested != "auto":
        return requested, f"mode={requested} requested explicitly"
    checks = (
        ("quantization", ("none",), "approximate arithmetic"),
        ("cache", ("off", "none"), "some computation is skipped or reused"),
        ("distributed", ("none",), "reduction order across ranks varies"),
        ("random", (), "random operators draw differently per run"),
        ("implementation", ("same",), "the two implementations run different kernels"),
    )
    reasons = [
        (key, settings[key], f"{key}={settings[key]} ({why})")
        for key, off, why in checks
        if key in settings and not _off(settings[key], *off)
    ]
    text = "; ".join(why for _, _, why in reasons)
    blocked = [key for key, _, _ in reasons if key in BUDGET_BLOCKERS]
    if reasons and not blocked and any(key in BUDGET_NOT_YET for key, _, _ in reasons):
        return "allclose", text + "; no error budget: not supported for sharded runs yet"
    if reasons and not blocked and not _integer_without_twin(settings):
        return BUDGET, text + BUDGET_NOTE
    if reasons and not blocked:
        return "allclose", text + "; no error budget: integer quantization needs a twin"
    if reasons:
        return "allclose", text
    return "equal", "no quantization, cache, distribution, random ops or other implementation"


def config_fingerprint(settings: Mapping[str, Any]) -> str:
    """The baseline key of a configuration: xxh64 of its settings, environment left out.

    Hashes ``target``, ``candidate``, ``device``, ``dtype`` and every other setting (sorted by
    key, each value as ``str(value)``), leaving out the recorded environment (``ENV_KEYS``:
    commit, versions, ...) and the judged ``mode`` (derived from the settings, or a CLI
    override), so the same configuration has the same fingerprint on every commit.

    Returns:
        16 lowercase hex digits.
    """
    import xxhash

    items = sorted((str(k), str(v)) for k, v in settings.items() if k not in NOT_FINGERPRINTED)
    return xxhash.xxh64(json.dumps(items, separators=(",", ":")).encode()).hexdigest()


def baseline_params(fingerprint: str, mode: str) -> dict[str, str]:
    """The run params a baseline must match: ``config_fingerprint`` and ``mode``.

    The fingerprint leaves the judged mode out (:func:`config_fingerprint`), but the mode
    decides the statuses: the same numbers are ``close`` under a ``budget`` run (error against
    PyTorch's own at that precision, issue 15) and ``mismatch`` under ``allclose``, so runs of
    different modes are never each other's baseline (a change of mode alone would show as
    fixes or regressions). Every run ``track.log_run`` stores carries its judged mode as the
    ``mode`` param (since the first store format), so stored runs keep the mode they were
    judged in; a run without that param matches nothing (its mode is unknown).

    Args:
        fingerprint: the run's ``config_fingerprint``.
        mode: the run's judged mode (``RunSummary.mode``: equal, allclose or budget).

    Returns:
        ``{"config_fingerprint": fingerprint, "mode": mode}``, for ``track.RunStore.find``.
    """
    return {"config_fingerprint": str(fingerprint), "mode": str(mode)}


def baseline_key(fingerprint: str | None, mode: str | None) -> str | None:
    """The baseline key of a run as one string, ``"<fingerprint>/<mode>"``, or None.

    Two runs may be each other's baseline only when their keys are equal (see
    :func:`baseline_params`). None when either part is unknown: such a run is never paired.
    """
    if not fingerprint or not mode:
        return None
    return f"{fingerprint}/{mode}"
