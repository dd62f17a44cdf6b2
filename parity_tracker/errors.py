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
