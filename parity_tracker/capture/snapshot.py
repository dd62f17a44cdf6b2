"""Snapshots of captured tensors that later in-place operations cannot rewrite."""

from __future__ import annotations

import contextlib
import itertools
import os
import weakref
from collections.abc import Callable
from typing import Any

import torch

from parity_tracker.capture.store import BoundedStore
from parity_tracker.compare.convert import tensor_version
from parity_tracker.compare.hashing import digestible, storage_digest


class _Entry:
    """What :class:`Snapshotter` remembers of one source tensor and its copy."""

    __slots__ = ("copy", "copy_digest", "layout", "source", "version")

    def __init__(self, source, version, layout, copy) -> None:
        self.source = source
        self.version = version
        self.layout = layout
        self.copy = copy
        self.copy_digest: int | None = None


def _layout(t: torch.Tensor) -> tuple:
    """Everything but the contents that a reuse must find unchanged (``.data =`` swaps them)."""
    return (
        t.data_ptr(),
        t.storage_offset(),
        tuple(t.shape),
        t.stride(),
        t.dtype,
        t.device,
    )


class Snapshotter:
    """Detach-and-clone snapshots; one copy is shared only while its source provably is unchanged.

    A module's input is usually the previous module's output: the same tensor object, not
    modified in between. Handing out one copy for both halves the memory of a module-level
    capture. The version counter alone does not prove the tensor unchanged: writes through
    ``.data``, ``.numpy()`` and DLPack views, ``out=`` kernels of C++ extensions and custom ops
    that mutate their inputs do not bump it (issue 13, item 1). So a copy is reused only when
    the same object (weak reference: a freed object never aliases a new one), with the same
    version counter, data pointer, offset, shape, strides, dtype and device, also has the same
    bytes as the copy: the xxh3-64 digest (``compare.hashing.storage_digest``) of the source,
    read now, equals the copy's (computed once, the copy is never written). Anything whose
    bytes cannot be read cheaply (GPU, gaps or broadcasts, subclasses, quantized) is copied
    again. Cost:
    one hash of the source and, once per copy, of the copy (``benchmarks/README.md``, "Shared
    snapshots"). The cache holds the copies weakly: a copy lives exactly as long as some
    capture holds it, so releasing captures (the eager path) frees memory.
    """

    def __init__(self) -> None:
        self._seen: dict[int, _Entry] = {}
        self._copies: dict[int, weakref.ref] = {}

    def owns(self, value: object) -> bool:
        """True for a live copy this snapshotter made (nobody writes it: no re-check needed)."""
        ref = self._copies.get(id(value))
        return ref is not None and ref() is value

    def take(self, t: torch.Tensor) -> torch.Tensor:
        """A detached copy of ``t`` that no later write to ``t``, counted or not, can change."""
        version = tensor_version(t)
        key = id(t)
        copy = self._reusable(key, t, version)
        if copy is not None:
            return copy
        copy = t.detach().clone()  # a detached clone records no autograd graph
        self._own(copy)
        if version is not None and copy.stride() == t.stride() and digestible(t):
            # an object that refuses weak references gets no reuse
            with contextlib.suppress(TypeError):
                ref = weakref.ref(t, self._forget(key))
                self._seen[key] = _Entry(ref, version, _layout(t), weakref.ref(copy))
        return copy

    def _reusable(self, key: int, t: torch.Tensor, version: int | None) -> torch.Tensor | None:
        """The earlier copy of ``t`` when every check above holds, else None."""
        entry = self._seen.get(key)
        if entry is None or version is None or entry.source() is not t:
            return None
        copy = entry.copy()
        if copy is None or entry.version != version or entry.layout != _layout(t):
            return None
        if entry.copy_digest is None:
            entry.copy_digest = storage_digest(copy)
        return copy if storage_digest(t) == entry.copy_digest else None

    def _own(self, copy: torch.Tensor) -> None:
        key = id(copy)
        copies = self._copies

        def gone(ref: weakref.ref) -> None:
            if copies.get(key) is ref:
                del copies[key]

        self._copies[key] = weakref.ref(copy, gone)

    def _forget(self, key: int):
        seen = self._seen

        def callback(ref: weakref.ref) -> None:
            entry = seen.get(key)
            if entry is not None and entry.source is ref:
                del seen[key]

        return callback

    def __len__(self) -> int:
        return len(self._seen)

    def clear(self) -> None:
        """Forget every snapshot (they stay alive where someone else holds them)."""
        self._seen.clear()
        self._copies.clear()


class SnapshotStore(BoundedStore):
    """Module snapshots within ``max_resident_bytes``, the oldest spilled to ``spill_dir``.

    A snapshot is held by one or more captures (objects with a ``value`` attribute). Each
    snapshot is tracked by a weak reference: it stops counting as soon as no capture holds it
    (the eager path releasing a pair); spilling swaps every holder's ``value`` for the
    :class:`~parity_tracker.capture.store.Spilled` record, whose file is deleted once no
    capture holds the record.
    """

    def __init__(self, max_resident_bytes: float, spill_dir: str | os.PathLike[str] | None):
        super().__init__(max_resident_bytes, spill_dir, self._spill_entry, "checker-spill-")
        self._ids = itertools.count()

    def clear(self) -> None:
        """Forget every snapshot, reset the counters and delete the spill folder."""
        self.close(reset_counters=True)

    def admit(self, copy: torch.Tensor, cap: Any) -> None:  # type: ignore[override]
        """Count ``copy`` (held by ``cap``) and spill the oldest snapshots past the budget."""
        key = id(copy)
        entry = self.get(key)
        if entry is not None and entry[0]() is copy:
            entry[1].append(cap)  # a snapshot shared with an earlier capture counts once
            return
        self.discard(key)  # a stale entry under a reused id
        payload = (weakref.ref(copy, self._gone(key)), [cap])
        super().admit(key, copy.untyped_storage().nbytes(), payload)

    def _gone(self, key: int) -> Callable[[weakref.ref], None]:
        def callback(ref: weakref.ref) -> None:
            entry = self.get(key)
            if entry is not None and entry[0] is ref:
                self.discard(key)

        return callback

    def _spill_entry(self, _key: int, payload: tuple[weakref.ref, list[Any]]) -> bool:
        ref, caps = payload
        copy = ref()
        if copy is None:
            return False
        spilled = self.write(copy, f"{next(self._ids)}.bin")
        weakref.finalize(spilled, spilled.path.unlink, True)
        for c in caps:
            if c.value is copy:
                c.value = spilled
        return True
