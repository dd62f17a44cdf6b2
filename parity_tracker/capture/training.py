"""Which modules compute differently in training mode (issue 13, item 15).

A model left in training mode only matters when some module's forward depends on the mode:
dropout (any ``p > 0``), batch/instance norm with running statistics (training mode uses the
batch's statistics and updates the running ones), ``RReLU`` (random slopes), and
``MultiheadAttention`` with attention dropout, per the ``torch.nn`` sources
(``torch/nn/modules/{dropout,batchnorm,instancenorm,activation}.py``). Any other module
counts when its class's ``forward`` reads ``self.training`` (its source is inspected, once per
class); a forward without readable source does not count.
"""

from __future__ import annotations

import functools
import inspect

from torch import nn
from torch.nn.modules.batchnorm import _NormBase
from torch.nn.modules.dropout import _DropoutNd


def mode_dependence(module: nn.Module) -> str | None:
    """Why ``module``'s own forward depends on training mode, or None when it does not.

    Args:
        module: one module (its children are not looked at).

    Returns:
        A short reason, e.g. ``"Dropout(p=0.1)"``, ``"BatchNorm2d with running statistics"``,
        ``"forward reads self.training"``; None for a mode-independent module.
    """
    name = type(module).__name__
    if isinstance(module, _DropoutNd):
        return f"{name}(p={module.p})" if module.p > 0 else None
    if isinstance(module, _NormBase):
        return f"{name} with running statistics" if module.track_running_stats else None
    if isinstance(module, nn.RReLU):
        return f"{name} (random slopes)"
    if isinstance(module, nn.MultiheadAttention):
        return f"{name}(dropout={module.dropout})" if module.dropout > 0 else None
    if type(module).__module__.startswith("torch.nn."):
        return None
    return "forward reads self.training" if _reads_training(type(module)) else None


@functools.cache
def _reads_training(cls: type) -> bool:
    forward = getattr(cls, "forward", None)
    if forward is None or forward is nn.Module.forward:
        return False
    try:
        return "self.training" in inspect.getsource(forward)
    except (OSError, TypeError):  # built-in, generated or without a source file
        return False


def training_mode_dependent(model: nn.Module) -> list[tuple[str, str]]:
    """``(qualified name, reason)`` of every module in training mode whose forward depends on it.

    Args:
        model: the model (its root included, name ``""``).

    Returns:
        The modules found, in ``named_modules`` order; empty when switching the model to eval
        would change nothing.
    """
    found = []
    for qname, m in model.named_modules():
        if m.training:
            reason = mode_dependence(m)
            if reason is not None:
                found.append((qname, reason))
    return found
