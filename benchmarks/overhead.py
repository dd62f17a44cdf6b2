"""One side-by-side timing session per model pair, shared by measurements 1, 2 and 3.

All contenders of a pair (the plain forwards, our module-level and op-level parity runs, the
peers) run alternately in the same loop, so their ratios come from the same minutes of the
same machine. The session is cached: measurement 3 reuses the times measurement 1 took.

The fused ``nn.MultiheadAttention`` / ``TransformerEncoderLayer`` fast path is switched off for
every contender: with it, a no-hook forward runs one fused aten op per layer, while any hook
(ours, Numeric Suite's) silently falls back to the per-module path, so "plain" would not compute
the same ops as the runs it is the baseline of. The fast path's own effect is reported apart.
"""

from __future__ import annotations

import copy
import inspect
import os
from collections.abc import Callable
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from typing import Any

import torch

from benchmarks._common import (
    CLOCK,
    Contender,
    Row,
    alternate,
    find,
    judged,
    medians,
    missing,
    paired_ratio,
)
from benchmarks.models import Pair, plain_forwards

RUN_PARITY = "parity_tracker.run:run_parity"


@dataclass
class Session:
    """The times of one pair's contenders and what each one covered."""

    label: str
    times: dict[str, list[float]] = field(default_factory=dict)
    coverage: dict[str, str] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def median(self, name: str) -> float:
        """Median seconds of contender ``name``."""
        return medians({name: self.times[name]})[name]


_SESSIONS: dict[tuple[str, bool], Session] = {}


def parity_runner(pair: Pair, capture_ops: bool) -> tuple[Callable[[], Any] | None, str]:
    """A zero-argument call of ``run_parity`` on ``pair`` (equal mode, no dumps), or a reason."""
    run_parity, why = find(RUN_PARITY)
    if run_parity is None:
        return None, why
    if capture_ops and "capture_ops" not in inspect.signature(run_parity).parameters:
        return None, "not available yet: run_parity has no capture_ops parameter"
    dump_mode, why = find("parity_tracker.tensor_checker:DumpMode")
    if dump_mode is None:
        return None, why
    kwargs: dict[str, Any] = {
        "settings": {"target": f"bench:{pair.label}"},
        "mode": "equal",
        "dump_mode": dump_mode.NOT,
    }
    if capture_ops:
        kwargs["capture_ops"] = True

    def call() -> Any:
        with open(os.devnull, "w") as sink, redirect_stdout(sink):
            return run_parity(pair.reference, pair.candidate, pair.inputs, **kwargs)

    return call, ""


def numeric_suite_contender(pair: Pair, with_equal: bool) -> Contender:
    """Torch's Numeric Suite ``compare_model_outputs`` on fresh copies of the pair.

    It attaches loggers to the models it is given, in place, so every call gets deep copies
    made outside the timed region. ``with_equal`` adds a ``torch.equal`` verdict per logged
    pair (Numeric Suite itself only collects the outputs).
    """
    from torch.ao.ns import _numeric_suite as ns

    def setup() -> tuple[torch.nn.Module, torch.nn.Module]:
        return copy.deepcopy(pair.reference), copy.deepcopy(pair.candidate)

    def run(models: tuple[torch.nn.Module, torch.nn.Module]) -> Any:
        with torch.no_grad():
            logged = ns.compare_model_outputs(models[0], models[1], *pair.inputs)
            if with_equal:
                return [torch.equal(v["float"][0], v["quantized"][0]) for v in logged.values()]
            return logged

    return Contender(run, setup)


def torchlens_runner(pair: Pair) -> tuple[Callable[[], Any] | None, str]:
    """Two torchlens traces (reference, candidate) saving every layer's output.

    ``torchlens.trace`` (2.x, every layer saved by default), else the older
    ``log_forward_pass(..., layers_to_save="all")``.
    """
    try:
        import torchlens
    except ImportError:
        return None, "torchlens not installed (pip install -e '.[bench]')"

    if hasattr(torchlens, "trace"):  # torchlens >= 2: saves every layer by default

        def trace(model: torch.nn.Module) -> Any:
            return torchlens.trace(model, list(pair.inputs))

    elif hasattr(torchlens, "log_forward_pass"):  # torchlens 0.x / 1.x

        def trace(model: torch.nn.Module) -> Any:
            return torchlens.log_forward_pass(
                model, list(pair.inputs), layers_to_save="all", vis_opt="none"
            )

    else:
        return None, "torchlens has neither trace() nor log_forward_pass()"

    def call() -> Any:
        with torch.no_grad():
            return [trace(m) for m in (pair.reference, pair.candidate)]

    return call, ""


def _count(result: Any, name: str) -> int | None:
    table = getattr(result, name, None)
    if table is None:
        return None
    return table.num_rows if hasattr(table, "num_rows") else len(table)


def _coverage(name: str, fn: Callable[[], Any] | Contender) -> str:
    """Run ``fn`` once, untimed, and say how many tensors it captured/compared."""
    out = fn.run(fn.setup()) if isinstance(fn, Contender) else fn()
    if name == "module":
        return f"{_count(out, 'modules')} module-table rows (params, buffers, inputs, outputs)"
    if name == "ops":
        return f"{_count(out, 'ops')} op rows + {_count(out, 'modules')} module rows"
    if name == "numeric_suite":
        return f"{len(out)} module outputs (Linear/LayerNorm only), logged not compared"
    if name == "numeric_suite+equal":
        return f"{len(out)} module outputs (Linear/LayerNorm only), torch.equal each"
    if name == "torchlens":
        return f"{len(out[0])} + {len(out[1])} traced layers (every op), saved, not compared"
    return ""


def session(pair: Pair, *, peers: bool, fast_path: bool, repeats: int, quick: bool) -> Session:
    """Time the plain forwards, our runs and (``peers``) the peers on ``pair``, side by side.

    Cached by ``(pair.label, quick)``; a later call returns the first session.
    """
    key = (pair.label, quick)
    if key in _SESSIONS:
        return _SESSIONS[key]
    torch.backends.mha.set_fastpath_enabled(False)
    s = Session(pair.label)
    contenders: dict[str, Callable[[], Any] | Contender] = {"plain": lambda: plain_forwards(pair)}
    if fast_path:
        contenders["plain_fast_path"] = lambda: _fast_path_forwards(pair)
    for name, capture_ops in (("module", False), ("ops", True)):
        fn, why = parity_runner(pair, capture_ops)
        if fn is None:
            s.unavailable[name] = why
        else:
            contenders[name] = fn
    if peers:
        contenders["numeric_suite"] = numeric_suite_contender(pair, with_equal=False)
        contenders["numeric_suite+equal"] = numeric_suite_contender(pair, with_equal=True)
        fn, why = torchlens_runner(pair)
        if fn is None:
            s.unavailable["torchlens"] = why
        else:
            contenders["torchlens"] = fn
    for name in list(contenders):
        if name.startswith("plain"):
            continue
        try:
            s.coverage[name] = _coverage(name, contenders[name])
        except Exception as exc:  # a contender that fails is reported, the others still run
            s.errors[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            del contenders[name]
    # the coverage call above warmed our runs and the peers up; --quick warms only the plain
    # forwards (cheap), --full gives every contender one more untimed round
    if quick:
        for name in contenders:
            if name.startswith("plain"):
                contenders[name]()
    s.times = alternate(contenders, repeats=repeats, warmup=0 if quick else 1)
    _SESSIONS[key] = s
    return s


def _fast_path_forwards(pair: Pair) -> None:
    torch.backends.mha.set_fastpath_enabled(True)
    try:
        plain_forwards(pair)
    finally:
        torch.backends.mha.set_fastpath_enabled(False)


def ratio_row(
    s: Session,
    measurement: str,
    numerator: str,
    denominator: str,
    limit: float | None,
    note: str = "",
) -> Row:
    """``numerator ÷ denominator`` (median of per-repeat ratios) as a table row.

    A contender that could not run gives a "not available yet" or "error" row instead.
    """
    target = f"≤ {limit:g}" if limit is not None else ""
    for name in (numerator, denominator):
        if name in s.unavailable:
            return missing(measurement, s.label, s.unavailable[name], target)
        if name in s.errors:
            return Row(measurement, s.label, None, "", target, None, "error", s.errors[name])
    value = paired_ratio(s.times, numerator, denominator)
    clock = CLOCK["name"]
    other = "wall" if clock == "cpu" else "cpu"
    other_ratio = paired_ratio(s.times, f"{other}:{numerator}", f"{other}:{denominator}")
    cov = "; ".join(f"{n}: {s.coverage[n]}" for n in (numerator, denominator) if n in s.coverage)
    detail = "; ".join(
        x
        for x in (
            note,
            cov,
            f"median {clock} s: {numerator} {s.median(numerator):.3f}, "
            f"{denominator} {s.median(denominator):.3f}; {other}-clock ratio {other_ratio:.3g}",
        )
        if x
    )
    names = (numerator, denominator, f"{other}:{numerator}", f"{other}:{denominator}")
    extra = {"clock": clock, "times_s": {n: s.times[n] for n in names}}
    if limit is None:
        return Row(measurement, s.label, value, "×", "", None, "info", detail, extra)
    return judged(measurement, s.label, value, "×", limit, detail=detail, extra=extra)
