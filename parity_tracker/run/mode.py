"""The comparison mode of a run (seed §2) and its configuration fingerprint (the baseline key)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from parity_tracker.adapters import MEASURED_PARAMS
from parity_tracker.run.environment import ENV_KEYS

#: Settings keys that are not part of the configuration fingerprint (run params measured by
#: the adapters, e.g. graph breaks, are facts of the run, not configuration).
NOT_FINGERPRINTED = frozenset(
    {*ENV_KEYS, *("mode", "mode_reason", "config_fingerprint"), *MEASURED_PARAMS}
)


def _off(value: Any, *off_values: str) -> bool:
    """True when a setting value means "not in play" (None, False, '', or one of off_values)."""
    if value is None or value is False:
        return True
    return str(value).strip().lower() in {"", "false", "0", "no", *off_values}


def choose_mode(settings: Mapping[str, Any], requested: str = "auto") -> tuple[str, str]:
    """The comparison mode for a run and the reason, following the seed's section 2.

    ``equal`` (bitwise, ``torch.equal``) is expected when both sides run the same LibTorch
    kernels on the same values; ``allclose`` is prescribed when any of these settings is on:
    ``quantization`` (not ``none``), ``cache`` (not ``off``), ``distributed`` (not ``none``),
    ``random`` (truthy: dropout, sampling) or ``implementation`` (present and not ``same``).

    Args:
        settings: the run's settings.
        requested: ``"auto"``, ``"equal"`` or ``"allclose"``; anything but auto is kept.

    Returns:
        ``(mode, reason)``, e.g. ``("allclose", "quantization=int8 (seed §2: approximate
        arithmetic)")``.

    Raises:
        InputError: ``requested`` is not one of the three modes.
    """
    from parity_tracker.errors import InputError

    if requested not in ("auto", "equal", "allclose"):
        raise InputError(f"mode must be 'auto', 'equal' or 'allclose', got {requested!r}")
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
        f"{key}={settings[key]} (seed §2: {why})"
        for key, off, why in checks
        if key in settings and not _off(settings[key], *off)
    ]
    if reasons:
        return "allclose", "; ".join(reasons)
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
