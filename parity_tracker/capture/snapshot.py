"""Snapshots of captured tensors that later in-place operations cannot rewrite."""

from __future__ import annotations

import contextlib
import weakref

import torch


def tensor_version(t: torch.Tensor) -> int | None:
    """The tensor's version counter, or ``None`` for inference tensors (which have none)."""
    if t.is_inference():
        return None
    return t._version


class Snapshotter:
    """Detach-and-clone snapshots, taken once per unchanged tensor.

    A module's input is usually the previous module's output: the same tensor object, not
    modified in between. Cloning it once and handing out the same clone halves the memory and
    copy time of a module-level capture. Reuse is safe because the key is the object's identity
    (held by a weak reference, so a freed object cannot alias a new one) plus its version
    counter, which every in-place operation bumps (views share it). The cache holds the copies
    weakly too: a copy lives exactly as long as some capture holds it, so releasing captures
    (the eager path) frees memory.
    """

    def __init__(self) -> None:
        self._seen: dict[int, tuple[weakref.ref, int, weakref.ref]] = {}

    def take(self, t: torch.Tensor) -> torch.Tensor:
        """A detached copy of ``t`` that no later in-place operation on ``t`` can change."""
        version = tensor_version(t)
        key = id(t)
        hit = self._seen.get(key) if version is not None else None
        if hit is not None and hit[0]() is t and hit[1] == version:
            copy = hit[2]()
            if copy is not None:
                return copy
        copy = t.detach().clone()  # a detached clone records no autograd graph
        if version is not None:
            # an object that refuses weak references gets no reuse
            with contextlib.suppress(TypeError):
                self._seen[key] = (weakref.ref(t, self._forget(key)), version, weakref.ref(copy))
        return copy

    def _forget(self, key: int):
        seen = self._seen

        def callback(ref: weakref.ref) -> None:
            entry = seen.get(key)
            if entry is not None and entry[0] is ref:
                del seen[key]

        return callback

    def __len__(self) -> int:
        return len(self._seen)

    def clear(self) -> None:
        """Forget every snapshot (they stay alive where someone else holds them)."""
        self._seen.clear()
