"""Shared pieces of the harness: side-by-side timing, result rows, availability guards.

Every figure is a ratio measured in one process: the contenders run alternately (the order
reversed on every other repeat, so a slow drift of the machine hits both), after a warm-up,
with a fixed number of torch threads; the figure is the median over repeats of the per-repeat
ratio, which holds on a busy, shared machine where absolute times do not.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

NOT_AVAILABLE = "not available yet"


@dataclass
class Row:
    """One figure of the benchmark table (and one entry of ``latest.json``).

    Attributes:
        measurement: the issue's measurement number and name, e.g. ``"1 module-level"``.
        case: what was measured, e.g. ``"transformer 8×512, seq 256, batch 2"``.
        value: the figure (a ratio, seconds, bytes, GiB); ``None`` when not measured.
        unit: ``"×"`` for ratios, ``"s"``, ``"B/row"``, ``"GiB"``.
        target: the target as text (``"≤ 1.25"``) or ``""`` when the figure is informative.
        passed: whether the target holds; ``None`` without a target or a value.
        status: ``"ok"``, ``"missed"``, ``"info"``, ``NOT_AVAILABLE`` or ``"error"``.
        detail: how it was measured, coverage, raw medians, or why it is missing.
        extra: raw numbers for the JSON file (per-contender medians, repeats, sizes).
    """

    measurement: str
    case: str
    value: float | None
    unit: str
    target: str = ""
    passed: bool | None = None
    status: str = "info"
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The row as plain JSON-ready data."""
        return asdict(self)


def judged(
    measurement: str,
    case: str,
    value: float,
    unit: str,
    limit: float,
    *,
    at_least: bool = False,
    detail: str = "",
    extra: dict[str, Any] | None = None,
) -> Row:
    """A row whose value is held to ``≤ limit`` (or ``≥ limit`` when ``at_least``)."""
    passed = value >= limit if at_least else value <= limit
    target = f"{'≥' if at_least else '≤'} {limit:g}"
    return Row(
        measurement,
        case,
        value,
        unit,
        target,
        passed,
        "ok" if passed else "missed",
        detail,
        extra or {},
    )


#: Why ``--quick`` rows are not judged: its small sizes are dominated by fixed per-call costs.
QUICK_REASON = (
    "quick size: informational; the target is set for the full size (make bench), and at the "
    "quick sizes the fixed cost per captured tensor or per call dominates the figure"
)


def informational(row: Row, reason: str = QUICK_REASON) -> Row:
    """``row`` with its verdict lifted: status ``info``, target ``full: ≤ x``, reason in detail.

    Rows without a verdict (``info``, ``error``, not available) are returned unchanged.
    """
    if row.status not in ("ok", "missed"):
        return row
    detail = f"{reason}; {row.detail}" if row.detail else reason
    return replace(row, target=f"full: {row.target}", passed=None, status="info", detail=detail)


def missing(measurement: str, case: str, what: str, target: str = "") -> Row:
    """A row for a piece of the code under test that does not exist yet (never a fake figure)."""
    return Row(measurement, case, None, "", target, None, NOT_AVAILABLE, what)


def failed(measurement: str, case: str, exc: BaseException, target: str = "") -> Row:
    """A row for a measurement that raised: the harness reports it and goes on."""
    msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    return Row(measurement, case, None, "", target, None, "error", msg)


def find(qualified: str) -> tuple[Any | None, str]:
    """Import ``package.module:attr`` if its module exists.

    Returns:
        ``(object, "")`` when found, or ``(None, reason)`` when the module file or the attribute
        does not exist yet. An import that fails *inside* an existing module raises: that is a
        bug to report, not a missing piece.
    """
    module_name, _, attr = qualified.partition(":")
    try:
        spec = importlib.util.find_spec(module_name)
    except ModuleNotFoundError:
        spec = None
    if spec is None:
        return None, f"{NOT_AVAILABLE}: module {module_name} does not exist"
    module = importlib.import_module(module_name)
    if attr and not hasattr(module, attr):
        return None, f"{NOT_AVAILABLE}: {module_name}.{attr} does not exist"
    return (getattr(module, attr) if attr else module), ""


@dataclass
class Contender:
    """A timed callable with an optional untimed ``setup`` whose result it receives.

    ``setup`` is for a peer that mutates the models it is given (Numeric Suite attaches
    loggers in place): each timed call then gets fresh copies, made outside the clock.
    """

    run: Callable[..., Any]
    setup: Callable[[], Any] | None = None

    def once(self) -> tuple[float, float]:
        """Run once; return ``(wall, cpu)`` seconds spent in ``run`` only."""
        arg = self.setup() if self.setup is not None else None
        gc.collect()
        w0, c0 = time.perf_counter(), time.process_time()
        if self.setup is not None:
            self.run(arg)
        else:
            self.run()
        return time.perf_counter() - w0, time.process_time() - c0


#: Which clock the ratios use: ``"cpu"`` (``time.process_time``: the CPU seconds of this
#: process, all its threads) or ``"wall"`` (``time.perf_counter``). Set by ``--clock``.
CLOCK = {"name": "cpu"}


def alternate(
    contenders: dict[str, Callable[[], Any] | Contender], repeats: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Time each contender ``repeats`` times, alternating them, after ``warmup`` rounds.

    The order is reversed on every other repeat; a garbage collection runs before each call
    (outside the timed region) so one contender's garbage is not billed to the next.

    With ``CLOCK["name"] == "cpu"`` (the default) a call is billed its process CPU time: on a
    machine shared with other jobs, the wall time of a single-threaded, compute-bound call
    mostly measures the other jobs, its CPU time does not. The wall times are kept too.

    Returns:
        Seconds per call on the chosen clock, ``{name: [t_repeat0, ...]}``; the other clock's
        under ``{"wall:" + name: [...]}`` or ``{"cpu:" + name: [...]}``.
    """
    items = [(k, v if isinstance(v, Contender) else Contender(v)) for k, v in contenders.items()]
    for _ in range(warmup):
        for _, contender in items:
            contender.once()
    cpu = CLOCK["name"] == "cpu"
    other = "wall:" if cpu else "cpu:"
    times: dict[str, list[float]] = {name: [] for name, _ in items}
    times.update({other + name: [] for name, _ in items})
    for r in range(repeats):
        for name, contender in items if r % 2 == 0 else reversed(items):
            wall, cpu_s = contender.once()
            times[name].append(cpu_s if cpu else wall)
            times[other + name].append(wall if cpu else cpu_s)
    return times


def paired_ratio(times: dict[str, list[float]], numerator: str, denominator: str) -> float:
    """Median over repeats of ``times[numerator][r] / times[denominator][r]``."""
    pairs = zip(times[numerator], times[denominator], strict=True)
    return statistics.median(n / d for n, d in pairs)


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    """Median seconds per contender."""
    return {name: statistics.median(ts) for name, ts in times.items()}


def timed(fn: Callable[[], Any], repeats: int = 3) -> tuple[float, float, Any]:
    """Median seconds of ``repeats`` calls of ``fn`` on the chosen clock, the other clock's.

    Returns:
        ``(chosen, other, last result)``: with ``CLOCK["name"] == "cpu"``, ``chosen`` is the
        median process CPU time (user + system, all threads: SQLite and parquet work done
        in-process is counted, time spent waiting for the disk or for a CPU held by other jobs
        is not) and ``other`` the median wall time; the reverse with ``"wall"``.
    """
    out, walls, cpus = None, [], []
    for _ in range(repeats):
        gc.collect()
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    return (cpu, wall, out) if CLOCK["name"] == "cpu" else (wall, cpu, out)


def other_clock() -> str:
    """The name of the clock not chosen (for details: "wall 2.3 s")."""
    return "wall" if CLOCK["name"] == "cpu" else "cpu"
