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

#: Run params measured per run, not configuration: kept out of the config fingerprint
#: (``parity_tracker.run.mode.NOT_FINGERPRINTED``). Compiled: graph breaks, graphs compiled, whether
#: stale compiled code was discarded; foreign: tags mapped / not observable, the label of the
#: module values, and whether observing (marking outputs) changed the model outputs.
MEASURED_PARAMS = (
    "compile_graph_breaks",
    "compile_graphs",
    "compile_recompiled",
    "foreign_tags_mapped",
    "foreign_tags_not_observable",
    "foreign_module_values",
    "observing_changed_result",
    "observing_max_abs_diff",
)
