"""What a TensorChecker check returns, and the seed's text printout of it.

:class:`TagResult` (one tag at one step) and :class:`CheckResult` (a whole check) are the
records; :func:`format_line` and :func:`print_result` write the seed document's lines
(``TensorChecker: 2 tensors equal in checker_conv_in``) byte for byte.
"""

from __future__ import annotations

import enum
import functools
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from parity_tracker.compare.core import Comparison
from parity_tracker.statuses import BUDGET, WEIGHT_KINDS, is_failing, is_passing

__all__ = [
    "CheckResult",
    "DumpMode",
    "LazyCheckResult",
    "TagResult",
    "format_line",
    "print_result",
    "result_columns",
    "results_from_columns",
    "table_columns",
]


class DumpMode(enum.Enum):
    """Which tensors ``check_*`` writes as ``.npy`` files (seed document, section 3.3).

    Attributes:
        NOT: write nothing (the default).
        ALL: every tensor of every tag.
        NOT_EQUAL: the tensors of every tag that does not pass (not equal / not close,
            missing, shape mismatch, error).
        FIRST_NOT_EQUAL: the tensors of the first failing tag in execution order (the first
            divergence; the first failing weight when only weights fail).
    """

    NOT = "not"
    ALL = "all"
    NOT_EQUAL = "not_equal"
    FIRST_NOT_EQUAL = "first_not_equal"


@dataclass(frozen=True)
class TagResult:
    """The verdict for one compared tag at one step.

    Attributes:
        tag: e.g. ``checker_conv_in`` (design.md, "Public names").
        module: the module's display name (``model`` for the root; no ``@k``), or ``None`` for
            a manual registration made outside any hooked forward.
        kind: ``param`` | ``buffer`` | ``input`` | ``output`` | ``manual`` (``op`` from the
            op recorder).
        slot: where in the module the tensor sits: ``output``, ``output.{path}``,
            ``input.{i}`` / ``input.{name}``, the local parameter/buffer name, or ``manual``.
        call_index: k for the k-th call of the module in the step (0 for the first).
        exec_order: position of the reference's capture in its side's execution order (a
            counter over the whole run, so it also orders steps); -1 when nothing was captured.
        step: the step of a multi-step run (0 for one forward; weights are always step 0).
        cache_hit: whether a cache skipped the module at this step; ``None`` when no cache is
            in play (``mark_cache_hit`` never called).
        comparison: the comparison record (for groups of more than two tensors, the first
            non-passing candidate's, else the first candidate's).
        dump_paths: dumped ``.npy`` files, relative to the check's ``dump_path``.
        n_tensors: how many tensors were registered under the tag (the printout's count).
    """

    tag: str
    module: str | None
    kind: str
    slot: str
    call_index: int
    exec_order: int
    step: int
    cache_hit: bool | None
    comparison: Comparison
    dump_paths: tuple[str, ...] = ()
    n_tensors: int = 2

    @classmethod
    def _fast(cls, values: dict[str, Any]) -> TagResult:
        """A record from ALL its field values without the frozen ``__init__`` (issue 19).

        The generated frozen ``__init__`` sets each of the 11 fields through
        ``object.__setattr__``; handing ``values`` over as the instance ``__dict__`` gives an
        identical, still frozen record (as ``Comparison._fast``). ``values`` must name every
        field and nothing else, and is owned by the record afterwards.
        """
        record = object.__new__(cls)
        object.__setattr__(record, "__dict__", values)
        return record

    @property
    def status(self) -> str:
        """The comparison's status."""
        return self.comparison.status

    @property
    def passed(self) -> bool:
        """True for ``equal`` / ``close``."""
        return is_passing(self.comparison.status)

    @property
    def failed(self) -> bool:
        """True for a divergence: not passing and not ``skipped``."""
        return is_failing(self.comparison.status)

    def to_row(self) -> dict[str, Any]:
        """One ``modules`` table row: exactly ``compare.columns.MODULES_SCHEMA``'s column names."""
        cols, nulls, comp_cols, pick = _module_columns()
        comp = self.comparison
        if type(comp) is Comparison:
            # a Comparison keeps every field in its __dict__ (frozen dataclass, no slots): its
            # columns are picked from it at C level, into a copy of the row of nulls (issue 19)
            row = nulls.copy()
            row.update(zip(comp_cols, pick(comp.__dict__), strict=True))
        else:
            merged = {**nulls, **comp.to_dict()}
            row = {c: merged[c] for c in cols}
        row.update(
            tag=self.tag,
            module=self.module,
            kind=self.kind,
            slot=self.slot,
            call_index=self.call_index,
            exec_order=self.exec_order if self.exec_order >= 0 else None,
            step=self.step,
            cache_hit=self.cache_hit,
            dump_path=self.dump_paths[0] if self.dump_paths else None,
        )
        return row


@functools.cache
def _module_columns() -> tuple[
    tuple[str, ...], dict[str, None], tuple[str, ...], Callable[[dict], tuple]
]:
    """``columns.MODULES_SCHEMA``'s column names, a row of nulls, and the ``Comparison`` columns.

    Built once (``Schema.names`` builds a new list per call). The last two: the columns that
    are ``Comparison`` fields, in schema order, and one C-level getter of them from a
    ``Comparison``'s ``__dict__`` (issue 19: cost per captured tensor).
    """
    from parity_tracker.compare.columns import MODULES_SCHEMA

    cols = tuple(MODULES_SCHEMA.names)
    comp_cols = tuple(c for c in cols if c in _COMPARISON_FIELDS)
    return cols, dict.fromkeys(cols), comp_cols, _getter(comp_cols)


def _getter(names: tuple[str, ...]) -> Callable[[dict], tuple]:
    """``operator.itemgetter`` that always returns a tuple (also for 0 or 1 name)."""
    if len(names) > 1:
        return operator.itemgetter(*names)
    return lambda d: tuple(d[n] for n in names)


_COMPARISON_FIELDS = frozenset(f.name for f in fields(Comparison))

#: Every ``TagResult`` field, in field order, and one C-level getter of them from a record's
#: ``__dict__``: the by-field form of a list of results (:func:`result_columns`).
RESULT_FIELDS = tuple(f.name for f in fields(TagResult))
_PICK_RESULT = operator.itemgetter(*RESULT_FIELDS)


def result_columns(results: list[TagResult]) -> dict[str, tuple[Any, ...]]:
    """``{field: (value of each result, in order)}`` for every ``TagResult`` field."""
    if not results:
        return {name: () for name in RESULT_FIELDS}
    by_field = zip(*map(_PICK_RESULT, (r.__dict__ for r in results)), strict=True)
    return dict(zip(RESULT_FIELDS, by_field, strict=True))


def results_from_columns(
    columns: Mapping[str, Sequence[Any]], made: Mapping[int, TagResult] | None = None
) -> list[TagResult]:
    """The ``TagResult`` records of :func:`result_columns`-shaped columns, in order.

    ``made``: records already made for some positions (``{index: record}``), used as they are
    (a check's first divergence stays the very object in its ``results``).
    """
    values = zip(*(columns[name] for name in RESULT_FIELDS), strict=True)
    # each v has one value per field (the zip above); a zip(strict=True) per row: ≈ 0.4 µs
    out = [TagResult._fast(dict(zip(RESULT_FIELDS, v))) for v in values]  # noqa: B905
    for i, record in (made or {}).items():
        out[i] = record
    return out


def result_at(columns: Mapping[str, Sequence[Any]], i: int) -> TagResult:
    """The ``TagResult`` at position ``i`` of :func:`result_columns`-shaped columns."""
    return TagResult._fast({name: columns[name][i] for name in RESULT_FIELDS})


#: The ``TagResult`` fields that are ``modules`` columns as they are (same name, same value).
_AS_IS = ("tag", "module", "kind", "slot", "call_index", "step", "cache_hit")


def table_columns(columns: Mapping[str, Sequence[Any]]) -> dict[str, Sequence[Any] | None]:
    """The ``modules`` table by column from :func:`result_columns`-shaped columns.

    The same values as :meth:`TagResult.to_row` of each result, by column, in
    ``MODULES_SCHEMA`` order: the ``Comparison`` columns picked at C level from each
    comparison's ``__dict__`` (``_module_columns``), then the result's own fields (which win,
    as in ``to_row``): ``exec_order`` ``-1`` → null, ``dump_path`` the first dump path or
    null. A column no result fills is ``None`` (null in every row). A comparison of another
    type than ``Comparison`` sends every row through ``to_row``.
    """
    cols, _, comp_cols, pick = _module_columns()
    comps = columns["comparison"]
    if not comps:
        return {c: [] for c in cols}
    if not all(type(c) is Comparison for c in comps):
        rows = [r.to_row() for r in results_from_columns(columns)]
        return {c: [row[c] for row in rows] for c in cols}
    out: dict[str, Any] = dict.fromkeys(cols)
    picked = zip(*map(pick, (c.__dict__ for c in comps)), strict=True)
    out.update(zip(comp_cols, picked, strict=True))
    out.update((name, tuple(columns[name])) for name in _AS_IS)
    out["exec_order"] = [e if e >= 0 else None for e in columns["exec_order"]]
    out["dump_path"] = [p[0] if p else None for p in columns["dump_paths"]]
    return out


@dataclass
class CheckResult:
    """What ``check_*`` returns.

    Attributes:
        results: every compared tag in first-registration order, weights included.
        weights: the parameter/buffer pre-flight, reported apart so that a weight-loading
            error is never blamed on a module.
        first_divergence: the first failing tag in execution order (``step``, then
            ``exec_order``), weights and cache hits left out
            (:func:`parity_tracker.compare.verdict.first_divergence`), or ``None``.
        passed: no tag failed (``skipped`` tags, e.g. never-called modules, do not fail).
        mode: ``"equal"`` or ``"allclose"``.
        dump_dir: the per-check dump folder relative to ``dump_path`` (``None`` if no dump).
        structure_differences: the tags present on one side only, in execution order
            (:func:`parity_tracker.compare.verdict.structure_differences`); never a first
            divergence.
    """

    results: list[TagResult]
    weights: list[TagResult]
    first_divergence: TagResult | None
    passed: bool
    mode: str = "equal"
    dump_dir: str | None = None
    structure_differences: list[TagResult] = field(default_factory=list)

    def to_rows(self) -> list[dict[str, Any]]:
        """``modules`` table rows, one per result."""
        return [r.to_row() for r in self.results]

    def to_columns(self) -> dict[str, list[Any] | tuple[Any, ...] | None]:
        """The ``modules`` table by column: ``{name: values}`` in ``MODULES_SCHEMA`` order.

        ``values[i]`` is ``self.to_rows()[i][name]`` (the same objects, no conversion); a
        column no result fills (``run_id``, ``ranks``, ``local_*``) is ``None``: null in every
        row. Records of the exact type ``TagResult`` are transposed at C level
        (:func:`result_columns`, then :func:`table_columns`) instead of one dict per row
        (issue 19: 2.7 ms → ≈ 1.3 ms for 1,002 results); any other record takes
        :meth:`to_rows`'s path.
        """
        results = self.results
        if all(type(r) is TagResult for r in results):
            return table_columns(result_columns(results))
        cols = _module_columns()[0]
        rows = self.to_rows()
        return {c: [row[c] for row in rows] for c in cols}

    @property
    def failing(self) -> list[TagResult]:
        """The failing results, in first-registration order."""
        return [r for r in self.results if r.failed]

    def get(self, tag: str, step: int = 0) -> TagResult | None:
        """The result for ``tag`` at ``step``, or ``None``."""
        return next((r for r in self.results if r.tag == tag and r.step == step), None)

    def __getitem__(self, tag: str) -> TagResult:
        found = self.get(tag)
        if found is None:
            raise KeyError(tag)
        return found


class LazyCheckResult(CheckResult):
    """A :class:`CheckResult` kept by column: its ``TagResult`` records made when first read.

    A run reads a check's table (:meth:`to_columns`), ``passed`` and ``dump_dir``, never its
    records: they are made from the same columns (:func:`results_from_columns`) on the first
    read of ``results`` or ``weights`` (issue 19: no record per row for a run). The failing
    records (``made``) exist from the start: ``first_divergence`` and
    ``structure_differences`` are chosen among them and stay the same objects in ``results``.

    Args:
        results...structure_differences: as :class:`CheckResult` (``results``/``weights``
            given: an ordinary check result, e.g. from ``dataclasses.replace``).
        columns: :func:`result_columns`-shaped columns of every result, in order.
        made: ``{index: record}`` already made (the failing ones).
    """

    def __init__(
        self,
        results: list[TagResult] | None = None,
        weights: list[TagResult] | None = None,
        first_divergence: TagResult | None = None,
        passed: bool = True,
        mode: str = "equal",
        dump_dir: str | None = None,
        structure_differences: list[TagResult] | None = None,
        *,
        columns: Mapping[str, Sequence[Any]] | None = None,
        made: Mapping[int, TagResult] | None = None,
    ) -> None:
        if results is not None or columns is None:
            self.results = list(results or [])
            self.weights = [] if weights is None else weights
        else:
            self._columns, self._made = columns, dict(made or {})
        self.first_divergence, self.passed, self.mode = first_divergence, passed, mode
        self.dump_dir = dump_dir
        self.structure_differences = list(structure_differences or [])

    def __getattr__(self, name: str) -> Any:
        state = self.__dict__
        if "_columns" not in state or name not in ("results", "weights"):
            raise AttributeError(name)
        # both at once, as CheckResult fixes them when built: an edit of ``results`` made
        # after this read does not reach ``weights`` (w9brk2)
        results = results_from_columns(state["_columns"], state["_made"])
        state["results"] = results
        state["weights"] = [r for r in results if r.kind in WEIGHT_KINDS]
        return state[name]

    def __eq__(self, other: object) -> bool:
        """Dataclass equality with any :class:`CheckResult` (lazy or not) of the same fields."""
        if not isinstance(other, CheckResult):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(CheckResult))

    __hash__ = None  # type: ignore[assignment]  # as the dataclass: equal means same fields

    def to_columns(self) -> dict[str, list[Any] | tuple[Any, ...] | None]:
        """As :meth:`CheckResult.to_columns`, from the columns while no record was made."""
        if "results" in self.__dict__:  # the records as they are now (a caller may edit them)
            return super().to_columns()
        return table_columns(self.__dict__["_columns"])


def _budget_base(c: Any) -> str:
    """What ``error_ratio`` divided by: ``max(twin error, floor)`` (``compare.budget``), named.

    The denominator is ``golden_max_abs_err / error_ratio``; it is the floor (one ULP of the
    compared dtype at the golden's largest magnitude) when it exceeds the twin's error, i.e.
    when PyTorch's own error at that precision is smaller than the floor. Either word only when
    the ratio is finite and positive (else both are named).
    """
    e_c, e_t, ratio = c.golden_max_abs_err, c.twin_max_abs_err, c.error_ratio
    if e_c is None or e_t is None or ratio is None or not 0 < ratio < float("inf"):
        return "max(PyTorch's own error, floor eps·max|golden|)"
    if e_c / ratio > e_t * (1 + 1e-9):
        return "floor eps·max|golden|, above PyTorch's own error"
    return "PyTorch's own error"


def _status_word(r: TagResult, mode: str) -> str:
    status = r.comparison.status
    if mode == BUDGET and status in ("close", "mismatch"):  # the words of the error budget
        ratio = r.comparison.error_ratio
        word = "within budget" if status == "close" else "over budget"
        return word if ratio is None else f"{word} ({ratio:.3g}x {_budget_base(r.comparison)})"
    if is_passing(status):
        return "equal" if mode == "equal" else "close"
    if status == "mismatch":
        return "not equal" if mode == "equal" else "not close"
    return status


def format_line(r: TagResult, mode: str) -> str:
    """The seed's line for one result, e.g. ``TensorChecker: 2 tensors equal in checker_x``.

    Non-plain statuses (missing, shape mismatch, skipped, error) append ``: {message}``; a
    step other than 0 appends `` at step {k}`` after the tag.
    """
    n = r.n_tensors
    noun = "tensor" if n == 1 else "tensors"
    where = r.tag if r.step == 0 else f"{r.tag} at step {r.step}"
    line = f"TensorChecker: {n} {noun} {_status_word(r, mode)} in {where}"
    if not is_passing(r.comparison.status) and r.comparison.status != "mismatch":
        line += f": {r.comparison.message}"
    return line


def print_result(result: CheckResult) -> None:
    """Print the seed's lines for a check: one per tag, failing weights, first divergence."""
    for r in result.results:
        print(format_line(r, result.mode))
    bad_weights = [r for r in result.weights if r.failed]
    if bad_weights:
        listed = ", ".join(f"{r.tag} ({_status_word(r, result.mode)})" for r in bad_weights)
        print(f"TensorChecker: weights differ: {listed}")
    if result.structure_differences:
        print(structure_line(result.structure_differences))
    if result.first_divergence is not None:
        r = result.first_divergence
        print(f"TensorChecker: first divergence: {r.tag} ({_status_word(r, result.mode)})")


def structure_line(rows: list[Any], limit: int = 8) -> str:
    """One line naming the tags present on one side only (at most ``limit`` of them).

    E.g. ``TensorChecker: structure differences (2 tags on one side only, not numeric
    divergences): checker_attn.qkv (reference only), checker_attn.q (candidate only)``.

    Args:
        rows: :class:`TagResult` objects or modules-table row mappings (``tag``, ``status``).
        limit: how many tags to name; the rest are counted.
    """

    def one(r: Any) -> str:
        tag, status = (r.tag, r.status) if isinstance(r, TagResult) else (r["tag"], r["status"])
        return f"{tag} ({'reference' if status == 'missing_candidate' else 'candidate'} only)"

    n = len(rows)
    named = ", ".join(one(r) for r in rows[:limit])
    more = f", and {n - limit} more" if n > limit else ""
    return (
        f"TensorChecker: structure differences ({n} tag{'s' if n != 1 else ''} on one side "
        f"only, not numeric divergences): {named}{more}"
    )
