"""Adapters: capture a candidate that is not a plain eager ``nn.Module``, module by module.

- :mod:`parity_tracker.adapters.compiled`: a ``torch.compile`` candidate (``OptimizedModule``);
  the checker's hooks are traced into the compiled graph, tags drop ``_orig_mod.``.
- :mod:`parity_tracker.adapters.foreign`: the public API for any engine that returns named
  intermediate values plus a map from those names to module tags.
- :mod:`parity_tracker.adapters.onnx`: ONNX Runtime as the first foreign engine (export with
  ``torch.onnx.export(..., dynamo=True)``, every intermediate marked as a graph output, mapped
  back to module names through the exporter's name scopes).

Importing this package imports neither ``torch._dynamo`` nor onnx/onnxruntime.
"""
