"""``torch.compile`` candidates: the ``implementation`` setting, compile stats, Inductor's compiler.

How a compiled module is captured module by module (taps traced into the compiled graph, tags
without ``_orig_mod``, stale compiled code discarded) lives in the capture layer,
:mod:`parity_tracker.capture.compiled` (``install_compiled``, ``is_compiled`` are re-exported
here); see docs/compiled-and-onnx.md for the choice.

**Graph breaks** are counted from ``torch._dynamo.utils.counters`` around the candidate's run
(:class:`CompileStats`) and recorded as the run param ``compile_graph_breaks`` (with
``compile_graphs``, the graphs compiled); a graph break inside a tap is harmless (the tap then
runs eagerly on the values the compiled code produced).
"""

from __future__ import annotations

import shutil
from typing import Any

import torch

from parity_tracker.capture.compiled import compiled_before, install_compiled, is_compiled
from parity_tracker.errors import InputError

__all__ = [
    "IMPLEMENTATIONS",
    "CompileStats",
    "backend_name",
    "compile_model",
    "install_compiled",
    "is_compiled",
    "require_cxx_compiler",
    "unwrap",
]

#: Values of the ``implementation`` setting that compile the candidate: the ``torch.compile``
#: backend of each (``eager``: Dynamo's capture only, the backend sanity check).
IMPLEMENTATIONS = {"inductor": "inductor", "eager": "eager", "aot_eager": "aot_eager"}


def unwrap(model: Any) -> Any:
    """The module ``torch.compile`` wrapped (``_orig_mod``), or ``model`` itself."""
    return model._orig_mod if is_compiled(model) else model


def backend_name(model: Any) -> str | None:
    """The ``torch.compile`` backend of an ``OptimizedModule`` (``"inductor"``, ``"eager"``...)."""
    if not is_compiled(model):
        return None
    from torch._dynamo.eval_frame import innermost_backend

    backend = innermost_backend(model.dynamo_ctx.callback)
    return getattr(backend, "compiler_name", None) or getattr(backend, "__name__", None)


def require_cxx_compiler() -> str:
    """The C++ compiler Inductor's CPU backend will call, or an error naming what to install.

    Inductor searches ``torch._inductor.config.cpp.cxx`` (``$CXX``, else ``g++``; ``clang++``
    on macOS) and runs ``<cxx> --version`` (``torch._inductor.cpp_builder.cpp_compiler_search``).

    Returns:
        The compiler's path.

    Raises:
        InputError: none of the names is on ``PATH`` (exit code 2).
    """
    from torch._inductor import config

    names = [c for c in config.cpp.cxx if c]
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    raise InputError(
        f"implementation=inductor on the CPU needs a C++ compiler and none of {names} is on PATH: "
        "install one (Debian/Ubuntu: apt-get install g++; macOS: xcode-select --install) or set "
        "CXX to its path; implementation=eager checks the compile path without one"
    )


def compile_model(model: torch.nn.Module, implementation: str, **options: Any) -> Any:
    """``torch.compile(model, backend=...)`` for an ``implementation`` setting value.

    Args:
        model: the module to compile (a copy of the reference).
        implementation: a key of :data:`IMPLEMENTATIONS`.
        **options: passed to ``torch.compile`` (``mode``, ``dynamic``, ``fullgraph``).

    Returns:
        The ``OptimizedModule`` (not run yet: hook it before its first call).

    Raises:
        InputError: an unknown implementation, or Inductor without a C++ compiler.
    """
    if implementation not in IMPLEMENTATIONS:
        raise InputError(
            f"implementation={implementation!r} is not a torch.compile backend here; allowed: "
            + ", ".join(IMPLEMENTATIONS)
        )
    if implementation == "inductor":
        require_cxx_compiler()
    return torch.compile(model, backend=IMPLEMENTATIONS[implementation], **options)


class CompileStats:
    """Graph breaks and graphs compiled between ``start()`` and ``params()`` (Dynamo counters).

    ``torch._dynamo.utils.counters["graph_break"]`` counts each break by reason,
    ``counters["stats"]["unique_graphs"]`` each graph compiled; the differences over the
    candidate's run are its own (the reference runs eagerly and adds none).
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self.recompiled = False
        self._before = (0, 0)

    @staticmethod
    def _now() -> tuple[int, int]:
        from torch._dynamo.utils import counters

        return sum(counters["graph_break"].values()), counters["stats"]["unique_graphs"]

    def start(self) -> None:
        """Take the counters' values now (before the hooks are attached).

        Raises:
            InputError: an Inductor candidate on the CPU and no C++ compiler
                (:func:`require_cxx_compiler`).
        """
        if backend_name(self.model) == "inductor" and _on_cpu(self.model):
            require_cxx_compiler()
        self.recompiled = compiled_before(self.model)
        self._before = self._now()

    def implementation(self) -> str:
        """The ``implementation`` setting the run records when none is given.

        ``same`` for the ``eager`` backend (Dynamo's capture replays the same eager kernels, so
        the auto mode stays ``equal``: the backend sanity check), else the backend's name (the
        auto mode becomes ``allclose``: another implementation, seed §2).
        """
        name = backend_name(self.model) or "compiled"
        return "same" if name == "eager" else name

    def params(self) -> dict[str, Any]:
        """Run params: ``compile_backend``, ``compile_graph_breaks``, ``compile_graphs``, ..."""
        breaks, graphs = self._now()
        return {
            "compile_backend": backend_name(self.model),
            "compile_graph_breaks": breaks - self._before[0],
            "compile_graphs": graphs - self._before[1],
            "compile_recompiled": self.recompiled,
        }


def _on_cpu(model: Any) -> bool:
    """True when the model's first parameter or buffer is on the CPU (or it has none)."""
    for t in (*model.parameters(), *model.buffers()):
        return t.device.type == "cpu"
    return True
