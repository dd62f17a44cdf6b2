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
