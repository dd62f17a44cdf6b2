"""Setting values shared by several built-in targets, importable without torch.

The targets' metadata (``NAME``, ``DESCRIPTION``, ``SETTINGS``) is read by ``parity-tracker
targets`` without importing torch; ``_common`` re-exports these lists.
"""

#: ``implementation`` setting of the targets that can compile their candidate: ``same`` (the
#: copy runs eagerly), ``inductor`` / ``eager`` (``torch.compile`` backend; eager = Dynamo's
#: capture only, the backend sanity check). See ``parity_tracker.adapters.compiled``.
IMPLEMENTATIONS = ["same", "inductor", "eager"]
#: ``candidate`` setting of the targets that can run their ONNX export in onnxruntime.
ENGINES = ["torch", "onnxruntime"]
#: ``ort_optimization`` setting: onnxruntime's graph optimisation level for the export.
ORT_OPTIMIZATIONS = ["disable_all", "enable_all"]
