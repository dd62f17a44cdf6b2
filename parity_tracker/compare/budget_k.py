"""The default error-budget factor, importable without torch (reports of stored runs read it).

:mod:`parity_tracker.compare.budget` explains the rule and re-exports :data:`DEFAULT_K`.
"""

DEFAULT_K = 2.0
"""Default budget factor: FlashAttention's tests (``compare.budget``'s docstring gives the line)."""
