"""Rank 0's side of a sharded run: run the reference once, merge the ranks' files tag by tag.

The merge is an ordinary ``run_parity``: the unsharded reference is hooked (side 0) and the
candidate is a drive that, for each ``(tag, step)`` the ranks recorded, reads every rank's part
from its file (memory-mapped), decides the placement (``placements.py``), makes the full tensor
(``unshard.py``), names the ranks whose part differs from the reference's part, and registers
the full tensor as the candidate's. The TensorChecker compares it at once and releases it, so
one full tensor (plus its parts) is held at a time.

Afterwards each ``modules`` row gets its ``ranks`` (the failing ranks; ``[]`` when every rank's
part agrees; null when no rank can be named), a refused placement turns its row into ``error``
with the refusal, a replicated tensor whose copies disagree fails even if rank 0's copy passes,
and a rank that raised makes the run ``failed`` with that rank's error. The summary is rebuilt
from the final rows (``run.build_summary``) and gains ``summary["distributed"]``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from parity_tracker.compare.tolerances import Tolerances
from parity_tracker.distributed import placements as pl
from parity_tracker.distributed.record import RankFiles, ShardRecorder
from parity_tracker.distributed.unshard import blame, unshard
from parity_tracker.files.tables import MODULES_SCHEMA, rows_to_table
from parity_tracker.run.mode import choose_mode
from parity_tracker.run.result import RunResult
from parity_tracker.run.run import run_parity
from parity_tracker.run.summary import build_summary
from parity_tracker.statuses import is_failing, is_passing


@dataclass
class MergeFacts:
    """What the merge learnt, per ``(tag, step)`` and for the run.

    Attributes:
        ranks: failing ranks per key (None: no rank can be named).
        notes: extra text for a key's row message.
        refused: the refusal message of keys whose placement could not be decided.
        replicas_differ: keys whose replicated copies disagree with the reference.
        placements: ``{tag: "shard(0) (inferred)"}``, one per tag (all steps agree).
        peak_bytes: the most bytes held at once by the merge (parts + full + reference part).
        full_bytes: the bytes of every full candidate tensor together (never held at once).
    """

    ranks: dict[tuple[str, int], list[int] | None] = field(default_factory=dict)
    notes: dict[tuple[str, int], str] = field(default_factory=dict)
    refused: dict[tuple[str, int], str] = field(default_factory=dict)
    replicas_differ: set[tuple[str, int]] = field(default_factory=set)
    placements: dict[str, str] = field(default_factory=dict)
    peak_bytes: int = 0
    full_bytes: int = 0


def _nbytes(*ts: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


class _Both:
    """The reference's step recorder, also moving the merge's reference recorder's step."""

    def __init__(self, rec: Any, mine: ShardRecorder) -> None:
        self._rec, self._mine = rec, mine

    def __call__(self, step: int) -> _Both:
        self._mine.step = int(step)
        self._rec(step)
        return self

    def __enter__(self) -> _Both:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def register(self, tag: str, tensor: Any) -> None:
        self._mine.keep(tag, tensor, "manual", None, self._mine.step)
        self._rec.register(tag, tensor)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rec, name)


def _ordered_keys(files: list[RankFiles]) -> list[tuple[str, int]]:
    """Every recorded ``(tag, step)``: rank 0's order, then keys only other ranks have."""
    keys: dict[tuple[str, int], None] = {}
    for f in files:
        keys.update(dict.fromkeys(f.index))
    return list(keys)


class Merger:
    """Builds the candidate drive of the merge (one instance per run)."""

    def __init__(
        self, files: list[RankFiles], declared: Mapping[str, pl.Placement], mode: str, tol: Any
    ):
        self.files, self.declared, self.mode, self.tol = files, declared, mode, tol
        self.reference = ShardRecorder()
        self.facts = MergeFacts()

    def reference_drive(self, inputs: Any, drive: Callable | None) -> Callable[..., None]:
        """The reference's drive: the case's drive or one forward, hooked by ``self.reference``."""
        from parity_tracker.run.run import _clone_inputs, _forward

        def run(model: torch.nn.Module, rec: Any) -> None:
            with self.reference.hooked(model):
                if drive is not None:
                    drive(model, _Both(rec, self.reference))
                else:
                    _forward(model, _clone_inputs(inputs))

        return run

    def candidate_drive(self, _candidate: Any, rec: Any) -> None:
        """Merge every key of the ranks' files and register each full tensor.

        Non-tensor leaves of the reference (a ``DynamicCache``, a string) are marked not
        observable: the ranks record tensors only, so such a tag is neither compared nor missing.
        """
        for tag, step in sorted(self.reference.not_tensors, key=lambda k: (k[1], k[0])):
            rec(step)
            rec.mark_not_observable(tag, "a non-tensor leaf: sharded ranks record tensors only")
        for tag, step in _ordered_keys(self.files):
            rec(step)
            full = self._merge(tag, step)
            if full is not None:
                rec.register(tag, full)

    def _merge(self, tag: str, step: int) -> torch.Tensor | None:
        key = (tag, step)
        ref = self.reference.pop(tag, step)
        got = [f.get(tag, step) for f in self.files]
        absent = [r for r, g in enumerate(got) if g is None]
        if absent:
            self.facts.ranks[key] = absent
            self.facts.notes[key] = f"rank(s) {absent} recorded no tensor for it"
            return None
        entry = got[0][1]
        order = list(range(len(got)))
        try:
            if entry["dtensor"]:
                placement = pl.parse(entry["placement"], source="dtensor")
                order = entry["mesh"] or order  # mesh coordinate order
            else:
                placement = pl.match_declared(self.declared, tag, entry.get("module"))
                if placement is None and ref is None:
                    placement = pl.Placement("replicate", source="inferred")
            parts = [got[r][0] for r in order]
            shapes = [tuple(p.shape) for p in parts]
            ref_shape = tuple(ref.shape) if ref is not None else shapes[0]
            placement = (
                pl.infer(tag, ref_shape, shapes)
                if placement is None
                else pl.check_declared(tag, placement, ref_shape, shapes)
            )
        except pl.AmbiguousPlacement as exc:
            self.facts.refused[key] = str(exc)
            return None
        self.facts.placements.setdefault(tag, placement.describe())
        full = unshard(parts, placement)
        bad = blame(ref, parts, placement, mode=self.mode, tag=tag, tolerances=self.tol)
        self.facts.ranks[key] = None if bad is None else sorted(order[i] for i in bad)
        if placement.kind == "replicate" and bad:
            self.facts.replicas_differ.add(key)
        held = _nbytes(full, ref, *parts)
        self.facts.peak_bytes = max(self.facts.peak_bytes, held)
        self.facts.full_bytes += _nbytes(full)
        return full


def _annotate(row: dict[str, Any], facts: MergeFacts, world_size: int, errors: str) -> None:
    """Fill ``ranks`` and the messages of one ``modules`` row from the merge's facts."""
    key = (row["tag"], row["step"] or 0)
    row["ranks"] = facts.ranks.get(key)
    if row["status"] == "missing_candidate" and key not in facts.ranks:
        row["ranks"] = list(range(world_size))  # no rank recorded it
    if row["status"] == "missing_candidate" and errors:
        facts.notes[key] = f"{facts.notes.get(key, 'no rank recorded it')}; {errors}"
    placement = facts.placements.get(row["tag"])
    if key in facts.refused:
        row["status"], row["message"] = "error", facts.refused[key]
        return
    if key in facts.replicas_differ and is_passing(row["status"]):
        row["status"] = "mismatch"
        row["message"] = (
            f"the copies of rank(s) {row['ranks']} differ from the reference while rank 0's "
            "copy passes (a replicated tensor must agree on every rank)"
        )
    if key in facts.notes:
        row["message"] = f"{row.get('message') or ''} ({facts.notes[key]})".strip()
    if row["ranks"] and is_failing(row["status"]):
        hint = (
            "; if it is a partial sum, declare it: placements={...: 'partial'}"
            if placement == "replicate (inferred)"
            else ""
        )
        row["message"] = (
            f"{row.get('message') or ''} [differs on rank(s) "
            f"{', '.join(map(str, row['ranks']))} of {world_size}; placement {placement}{hint}]"
        ).strip()


def _rank_error(files: list[RankFiles]) -> dict[str, Any] | None:
    """The earliest rank error, as ``summary["error"]`` (with its ``rank``), or None.

    Earliest by wall clock: the rank that raised first, not the ranks whose collectives then
    timed out waiting for it. A rank that wrote nothing comes last.
    """
    errors = [f.error for f in files if f.error]
    if not errors:
        return None
    return dict(min(errors, key=lambda e: e.get("time") or float("inf")))


def finish(
    result: RunResult, files: list[RankFiles], facts: MergeFacts, info: Mapping[str, Any]
) -> RunResult:
    """Annotate the rows, fail the run for a rank error, rebuild the summary (module docstring)."""
    s = result.summary
    world_size = int(info["world_size"])
    rows = result.modules.to_pylist()
    errors = "; ".join(
        f"rank {f.rank} raised {f.error['type']}: {f.error['message']}"[:300]
        for f in files
        if f.error
    )
    for row in rows:
        _annotate(row, facts, world_size, errors)
    error, status = s.get("error"), s["status"]
    rank_error = _rank_error(files)
    if rank_error and status == "completed":
        status, error = "failed", rank_error
    modules = rows_to_table(rows, MODULES_SCHEMA)
    summary = build_summary(
        modules, result.ops, run_id=result.run_id, status=status, mode=s["mode"],
        mode_reason=s["mode_reason"], requested_mode=s["requested_mode"],
        settings=result.settings, environment=s["environment"], error=error,
        root_causes=s.get("root_causes"), durations_s=s.get("durations_s"),
        start_time_ms=s.get("start_time_ms"), root=info["root"],
    )  # fmt: skip
    # first_divergence carries its row's ``ranks`` (build_summary); the merge facts go in the
    # record's extra keys (summary.json's ``distributed``): records are never edited in place
    distributed = {
        **{k: v for k, v in info.items() if k != "root"},
        "placements": dict(facts.placements),
        "rank_errors": [f.error for f in files if f.error],
        "unshard_peak_bytes": facts.peak_bytes,
        "unshard_full_bytes": facts.full_bytes,
    }
    summary = summary.replace(extra={**summary.extra, "distributed": distributed})
    return RunResult(result.run_id, modules, result.ops, summary, result.settings, result.dump_dir)


def merge_run(
    reference: torch.nn.Module,
    out_dir: Any,
    world_size: int,
    *,
    inputs: Any = None,
    drive: Callable | None = None,
    placements: Mapping[str, str] | None = None,
    backend: str = "gloo",
    settings: Mapping[str, Any] | None = None,
    mode: str = "auto",
    tolerances: Mapping[str, tuple[float, float]] | None = None,
    **run_kwargs: Any,
) -> RunResult:
    """Run the reference unsharded and compare it with the ranks' merged captures.

    Args:
        reference: the unsharded reference model.
        out_dir: the folder holding ``rank{r}.json`` / ``rank{r}.pt`` (``record.write_rank``).
        world_size: number of ranks.
        inputs: the reference's positional inputs (exactly one of ``inputs`` and ``drive``).
        drive: the reference's ``drive(model, rec)``.
        placements: declared ``{glob: placement}`` (``placements.py``).
        backend: the process group's backend, recorded.
        settings: the run's settings; ``distributed`` defaults to ``tp{world_size}`` (so
            ``mode="auto"`` is allclose, seed §2), ``world_size``, ``backend`` and
            ``placements`` (the declared globs as JSON, ``"inferred"`` when none) are added.
        mode: as ``run_parity``.
        tolerances: as ``run_parity``.
        **run_kwargs: passed to ``run_parity`` (``dump_mode``, ``dump_path``, ``seed``,
            ``environment``, ``align``); ``capture_ops`` and ``isolate`` are refused.

    Returns:
        The ``RunResult`` (see the module docstring for what the merge adds).

    Raises:
        InputError: a bad declared placement, or ``capture_ops`` / ``isolate`` requested.
    """
    from parity_tracker.capture.tags import root_name
    from parity_tracker.errors import InputError

    for opt in ("capture_ops", "isolate"):
        if run_kwargs.pop(opt, False):
            raise InputError(f"{opt}=True is not supported for a sharded run across ranks yet")
    declared = pl.parse_declared(placements)
    settings = dict(settings or {})
    settings.setdefault("distributed", f"tp{world_size}")
    settings.update(world_size=world_size, backend=backend)
    settings["placements"] = (
        json.dumps({k: str(v) for k, v in declared.items()}) if declared else "inferred"
    )
    requested = settings.get("mode", mode) if mode == "auto" else mode
    chosen, _ = choose_mode(settings, requested or "auto")
    if chosen == "budget":
        from parity_tracker.errors import InputError

        raise InputError(
            "mode='budget' is not supported for sharded runs yet (ranks are compared by "
            "parity_tracker.distributed, which has no float64 golden side); use mode='allclose'"
        )
    files = [RankFiles(out_dir, r) for r in range(world_size)]
    merger = Merger(files, declared, chosen, Tolerances(tolerances))
    result = run_parity(
        reference, _ShardedRanks(world_size), drive=merger.reference_drive(inputs, drive),
        candidate_drive=merger.candidate_drive, settings=settings, mode=mode,
        tolerances=tolerances, **run_kwargs,
    )  # fmt: skip
    info = {"world_size": world_size, "backend": backend, "root": root_name(reference)}
    info["declared"] = {k: str(v) for k, v in declared.items()}
    return finish(result, files, merger.facts, info)


class _ShardedRanks:
    """The candidate of the merge: the ranks' files (not an ``nn.Module``: nothing to hook)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def __repr__(self) -> str:
        return f"<candidate sharded over {self.world_size} ranks>"
