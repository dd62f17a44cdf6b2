"""The built-in targets: real model pairs on real inputs, run by the nightly pipeline.

Each module defines ``NAME``, ``DESCRIPTION``, ``SETTINGS`` (allowed values per setting, the first
is the default) and ``build(settings) -> parity_tracker.case.ParityCase``. Heavy libraries
(transformers, diffusers, onnxruntime, scikit-*) are imported inside ``build``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from parity_tracker.errors import InputError

#: Target name → module (relative to this package), in the order the nightly lists them.
BUILTIN: dict[str, str] = {
    "digits-cnn": "digits_cnn",
    "vae-tiny": "vae_tiny",
    "llama-tiny": "llama_tiny",
    "flux-tiny": "flux_tiny",
    "silero-vad": "silero_vad",
}


def load(name: str) -> ModuleType:
    """The module of built-in target ``name`` (with ``NAME``, ``SETTINGS``, ``build``).

    Raises:
        InputError: ``name`` is not a built-in target; the message lists them.
    """
    if name not in BUILTIN:
        raise InputError(
            f"unknown built-in target {name!r}; built-in targets: {', '.join(BUILTIN)}"
        )
    return importlib.import_module(f"{__name__}.{BUILTIN[name]}")
