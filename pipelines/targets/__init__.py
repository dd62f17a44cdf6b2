"""The built-in targets: real model pairs on real inputs, run by the nightly pipeline.

Installed as ``parity_tracker.builtin_targets`` (``[tool.setuptools.package-dir]`` in
pyproject.toml maps this folder there) and registered like any third-party target, through the
``parity_tracker.targets`` entry-point group of pyproject.toml; ``parity_tracker.pipeline.targets``
is the one registry. Each module defines ``NAME``, ``DESCRIPTION``, ``SETTINGS`` (allowed values
per setting, the first is the default) and ``build(settings) -> ParityCase``, and imports no
torch: ``build`` and every other name load the model code from ``_<module>.py`` on first use.
Heavy libraries (transformers, diffusers, onnxruntime, scikit-*) are imported inside ``build``.
"""
