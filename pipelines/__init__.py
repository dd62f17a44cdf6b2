"""What the nightly parity pipeline runs.

- ``pipelines/nightly.toml``: the matrix (targets × their settings), read by
  ``parity-tracker nightly``;
- ``pipelines/expected.toml``: known, dated divergences shown as ``expected``;
- ``pipelines.targets``: the built-in targets (one module per target, see
  ``parity_tracker.targets``).
"""
