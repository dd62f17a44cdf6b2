"""Constants shared by the night tests (``test_night*.py``); the ``night_env`` fixture that
writes ``MATRIX`` is in ``conftest.py``."""

from __future__ import annotations

#: The two-cell matrix of the night tests, over ``cli_targets.tiny``.
TINY = "cli_targets:tiny"
MATRIX = f'[[matrix]]\ntarget = "{TINY}"\nquantization = ["none", "bf16"]\n'
#: Its cells' names, in matrix order (perturb is tiny's first setting, filled in as default).
CELLS = [f"{TINY}[perturb=none,quantization=none]", f"{TINY}[perturb=none,quantization=bf16]"]
