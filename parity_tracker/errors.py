"""Errors that carry the CLI exit code of the contract (design.md, "CLI").

Exit codes: 0 parity holds / no regression, 1 parity failure or regression,
2 usage or input error, 3 infrastructure error (store unreachable, ...).
The library raises these; only ``parity_tracker.cli`` turns them into output
(the pattern of click's ``exceptions.py``: the error knows its exit code).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_PARITY_FAILURE = 1
EXIT_USAGE = 2
EXIT_INFRA = 3


def brief(text: object, limit: int = 300) -> str:
    """``text`` on one line, about ``limit`` characters at most, never cut inside a word.

    Whitespace runs become one space. A longer text keeps whole words from its start (up to
    two thirds of ``limit``) and from its end (where a wrapped library error says why, e.g.
    "... Connection refused"), joined by `` … ``; a single word longer than that is kept whole.
    """
    words = str(text).split()
    flat = " ".join(words)
    if len(flat) <= limit:
        return flat
    head = _fit(words, limit * 2 // 3)
    tail = _fit(words[len(head) :][::-1], limit - len(" ".join(head)) - 3, at_least=0)[::-1]
    if len(head) + len(tail) == len(words):
        return flat  # nothing left out (a single word longer than the limit)
    return " ".join([*head, "…", *tail])


def _fit(words: list[str], room: int, at_least: int = 1) -> list[str]:
    """The longest start of ``words`` whose joined length is at most ``room`` (``at_least``)."""
    size, n = -1, 0
    while n < len(words) and (n < at_least or size + 1 + len(words[n]) <= room):
        size, n = size + 1 + len(words[n]), n + 1
    return words[:n]


class ParityTrackerError(Exception):
    """Base class of every error this package raises on purpose.

    Attributes:
        exit_code: the CLI exit code this error maps to.
    """

    exit_code = EXIT_USAGE


class InputError(ParityTrackerError, ValueError):
    """Bad input from the user: an unknown target, setting value, run id or a malformed file.

    The message names the thing (file, key, id) and the allowed values or the fix.
    """

    exit_code = EXIT_USAGE


class InfrastructureError(ParityTrackerError, RuntimeError):
    """The tracking store or another service could not be reached; nothing computed is lost."""

    exit_code = EXIT_INFRA


class StoreDamagedError(InfrastructureError):
    """A stored run's file is missing, truncated or unreadable: the store is damaged (exit 3).

    Never a parity verdict: CI must not read a damaged artifact as a parity failure (exit 1).

    Attributes:
        run_id: the MLflow run id whose file is damaged.
        file: the artifact path inside the run (``tables/modules.parquet``, ``summary.json``).
    """

    def __init__(self, run_id: str, file: str, detail: str) -> None:
        self.run_id, self.file = run_id, file
        super().__init__(f"run {run_id}: {file} is damaged or unreadable ({detail})")


class IncompleteRunError(InfrastructureError):
    """A stored run was never completed: its writer died during the upload (exit 3).

    ``parity-tracker sync`` finishes the upload from the spool, or marks the run KILLED.

    Attributes:
        run_id: the MLflow run id.
    """

    def __init__(self, run_id: str, detail: str) -> None:
        self.run_id = run_id
        super().__init__(
            f"run {run_id} is incomplete ({detail}): its writer stopped during the upload; "
            "`parity-tracker sync` finishes it from the spool or marks it KILLED"
        )
