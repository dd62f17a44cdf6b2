r"""The nightly matrix: cells (a target with complete settings) and shards of them.

A ``[[matrix]]`` entry of the matrix file (``pipeline.config``) expands to the cartesian product
of its setting axes (:func:`expand`); settings it does not name take the target's default.
Shards split the cells deterministically (:func:`shard_cells`).

A cell's identity is its target and its settings as a set (:attr:`Cell.identity`); its name
(:attr:`Cell.name`, the MLflow run name a merge finds it by) quotes any part holding
``, = [ ] " \``, so two distinct cells never share a name. :func:`matrix_hash` fingerprints the
resolved cell list, so a merge can tell shards of different matrices apart.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import xxhash

from parity_tracker.errors import InputError
from parity_tracker.pipeline.targets import resolve_target

#: Dump mode of a nightly cell unless its entry says otherwise: one tensor pair per failing
#: cell is enough to start from, and keeps a nightly's artifacts small (``NOT_EQUAL`` on a
#: bf16 VAE writes ~200 MB per run).
DEFAULT_DUMP_MODE = "FIRST_NOT_EQUAL"
#: Characters that make a part of a cell name be written as a JSON string (``"1,b=2"``).
_SPECIAL = re.compile(r'[,=\[\]"\\]')


def _part(text: str) -> str:
    """``text`` as is, or JSON-quoted when it holds a separator of a cell name."""
    return json.dumps(text, ensure_ascii=False) if _SPECIAL.search(text) else text


@dataclass(frozen=True)
class Cell:
    """One cell of the matrix: a target with complete, validated settings.

    Attributes:
        target: the target name or spec.
        settings: every setting of the target (defaults filled in).
        mode: ``auto``, ``equal`` or ``allclose``.
        ops: capture per-op outputs too.
        rtol: allclose rtol for every tag of the cell (None: the target's own overrides, else
            the per-dtype defaults of ``torch.testing.assert_close``); set with ``atol``.
        atol: allclose atol for every tag of the cell.
        dump_mode: which tensors the cell dumps (``DumpMode`` name).
    """

    target: str
    settings: tuple[tuple[str, str], ...]
    mode: str = "auto"
    ops: bool = False
    rtol: float | None = None
    atol: float | None = None
    dump_mode: str = DEFAULT_DUMP_MODE

    @property
    def name(self) -> str:
        r"""``digits-cnn[quantization=int8,memory_format=contiguous]``, one name per cell.

        A target, key or value holding ``, = [ ] " \`` is written as a JSON string
        (``t[a="1,b=2"]`` vs ``t[a=1,b=2]``): unquoted parts hold none of them and quoted ones
        end where the JSON string ends, so a name reads back one way only.
        """
        items = ",".join(f"{_part(str(k))}={_part(str(v))}" for k, v in self.settings)
        return f"{_part(self.target)}[{items}]"

    @property
    def identity(self) -> str:
        """The cell's identity: canonical JSON of ``[target, [[key, value], ...] sorted]``.

        Two cells with one identity are the same configuration whatever their settings' order
        or options; the nightly merge keys cells by it.
        """
        return json.dumps([self.target, sorted(self.settings)], ensure_ascii=False)


def expand(
    target: str, axes: Mapping[str, Sequence[str]], *, where: str, **options: object
) -> list[Cell]:
    """The cells of one entry: every combination of ``axes`` validated against the target.

    Args:
        target: the target name or ``module:function`` spec.
        axes: ``{setting: [values]}``, each list one axis.
        where: the entry's location, prefixed to errors (``nightly.toml [[matrix]] #2``).
        **options: the other :class:`Cell` fields (mode, ops, rtol, atol, dump_mode).

    Raises:
        InputError: unknown target, setting or value (prefixed with ``where``).
    """
    try:
        resolved = resolve_target(target)
        return [
            Cell(
                target,
                tuple(resolved.validate(dict(zip(axes, combo, strict=True))).items()),
                **options,  # type: ignore[arg-type]
            )
            for combo in itertools.product(*axes.values())
        ]
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from exc


def matrix_hash(cells: Sequence[Cell]) -> str:
    """16 hex digits of ``xxhash.xxh3_64`` over the resolved cell list, in matrix order.

    Canonical JSON (sorted keys, ``ensure_ascii``) of every field of every cell (target,
    settings as ``[key, value]`` pairs, mode, ops, rtol, atol, dump_mode): the same on every
    machine for the same matrix, whatever the file's formatting. Tagged on each shard's parent
    (``track.parents.TAG_MATRIX``); a merge refuses shards whose hashes differ.
    """
    doc = [dataclasses.asdict(c) for c in cells]
    return xxhash.xxh3_64_hexdigest(json.dumps(doc, sort_keys=True).encode("utf-8"))


def parse_shard(spec: str | None) -> tuple[int, int]:
    """``"2/4"`` → ``(2, 4)``; None → ``(1, 1)``.

    Raises:
        InputError: not ``I/N`` with 1 ≤ I ≤ N.
    """
    if not spec:
        return 1, 1
    try:
        i, n = (int(p) for p in spec.split("/"))
    except ValueError:
        raise InputError(f"--shard expects I/N such as 1/4, got {spec!r}") from None
    if not 1 <= i <= n:
        raise InputError(f"--shard {spec}: need 1 <= I <= N")
    return i, n


def shard_cells(cells: Sequence[Cell], index: int, count: int) -> list[Cell]:
    """This shard's cells: cell k (0-based, file order) belongs to shard ``k % count + 1``.

    Deterministic and disjoint: the ``count`` shards together run every cell exactly once.
    """
    return [c for k, c in enumerate(cells) if k % count == index - 1]
