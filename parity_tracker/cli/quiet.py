"""Library log lines the CLI keeps off the terminal: progress chatter and known-harmless warnings.

Installed by the ``parity-tracker`` group (:func:`quiet_libraries`), the entry point we own;
a library caller keeps its own logging configuration. Narrow on purpose: only the loggers and
messages listed here, never our own warnings or errors, never a library's other warnings.

- MLflow's database setup (``mlflow.store.db.utils``: "Creating initial MLflow database
  tables...", "Updating database tables") and alembic's migrations (``alembic``: "INFO
  [alembic.runtime.migration] Context impl SQLiteImpl.", ...) print INFO lines on every fresh
  SQLite store: their INFO records are dropped, their warnings and errors kept.
- ``torch.onnx``'s exporter warns once per torchvision op when torchvision is not installed
  ("torchvision is not installed. Skipping torchvision::nms"): the ONNX candidates need none.
- diffusers warns on ``model.to(dtype)`` that modules "should be kept in float32: []" even
  when that list is empty (nothing to keep); with a non-empty list the warning still shows.

- ``parity-tracker ui``'s server child (``mlflow server``: uvicorn and MLflow's job executor)
  logs text lines in another process, so they pass :func:`server_line_shown` instead (the
  ``cli.serve.serve`` pump): its INFO lines (uvicorn's start-up and shutdown steps, one per
  HTTP request; MLflow's executor discovery) and MLflow's "Registry store URI not provided"
  notice (printed on stdout, where it broke ``ui --json``) are dropped; uvicorn's "Uvicorn
  running on http://..." line, which says where the UI is, and every warning and error are
  kept.

Our own warnings (:func:`plain_warnings`): a ``warnings.warn`` of this package shows as one
``warning: <message>`` line on stderr, without Python's ``file:line: Category:`` prefix and the
echoed source line; the spool warning of ``track.log.log_run`` ("parity run ... not logged to
...: spooled to ...") is not shown at all, because the command reports the same run and path
itself (``run``: its ``Error:`` line; ``nightly``: its "spooled to" line). Other libraries'
warnings keep Python's format.

Filters, not levels, for loggers another library configures: ``logging.config.dictConfig``
(MLflow's, on import) resets the level of an existing child logger but keeps its filters.
"""

from __future__ import annotations

import logging
import re
import warnings
from importlib.util import find_spec
from pathlib import Path
from typing import Any

#: Loggers whose records below WARNING are dropped (their own records; children have theirs).
QUIET_INFO = ("mlflow.store.db.utils", "alembic", "alembic.runtime.migration",
              "alembic.runtime.plugins")  # fmt: skip
#: ``(logger, pattern)``: WARNING records of that logger whose message matches are dropped.
HARMLESS = (
    ("torch.onnx._internal.exporter._registration", r"torchvision is not installed\. Skipping "),
    ("diffusers.models.modeling_utils", r"There are modules in \w+ that should be kept in "
     r"float32: \[\]\."),
)  # fmt: skip


#: Lines of ``ui``'s server child that are dropped: INFO lines (uvicorn's ``INFO:     ...``,
#: MLflow's ``2026/12/01 03:16:33 INFO mlflow.server...``, with or without MLflow's date
#: prefix), and MLflow's registry notice.
SERVER_QUIET = re.compile(
    r"^(?:\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2} )?INFO\b|^Registry store URI not provided\."
)
#: The one INFO line of the server that is kept: uvicorn saying where the UI is served.
SERVER_KEEP = re.compile(r"Uvicorn running on https?://")


def server_line_shown(line: str) -> bool:
    """Whether a line the ``ui`` server child printed is shown (module docstring)."""
    return bool(SERVER_KEEP.search(line)) or not SERVER_QUIET.match(line)


class _DropRecords(logging.Filter):
    """Drops a logger's records below ``level``, and those whose message matches ``pattern``."""

    def __init__(self, level: int = logging.NOTSET, pattern: str | None = None) -> None:
        super().__init__()
        self.level = level
        self.pattern = re.compile(pattern) if pattern else None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.level:
            return False
        return self.pattern is None or not self.pattern.match(record.getMessage())


def quiet_libraries() -> None:
    """Install the filters of this module (once per process; calling again changes nothing)."""
    wanted = [(name, _DropRecords(level=logging.WARNING)) for name in QUIET_INFO]
    wanted += [(name, _DropRecords(pattern=pattern)) for name, pattern in HARMLESS]
    for name, flt in wanted:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropRecords) for f in logger.filters):
            logger.addFilter(flt)


#: Our warning the CLI reports itself (module docstring): the run and its spool path.
REPORTED_BY_THE_COMMAND = r"parity run \S+ not logged to .*: spooled to "
#: Packages whose warnings :func:`plain_warnings` shows as one line (``dashboards`` and
#: ``builtin_targets`` live in folders of their own, mapped by setuptools' package-dir).
OWN_PACKAGES = ("parity_tracker", "parity_tracker.dashboards", "parity_tracker.builtin_targets")


def _own_roots() -> tuple[str, ...]:
    roots: list[str] = []
    for name in OWN_PACKAGES:
        spec = find_spec(name)  # None: a layout without that package (a source checkout)
        locations = (spec.submodule_search_locations or []) if spec is not None else []
        roots += [str(Path(p).resolve()) for p in locations]
    return tuple(roots)


def plain_warnings() -> None:
    """Show this package's warnings as one line each; drop the one the command reports.

    Installs a ``warnings.formatwarning`` (once per process) that writes ``warning: <message>``
    for a warning raised from a file of :data:`OWN_PACKAGES` and hands any other warning to
    the previous formatter (a formatter, not ``showwarning``: ``warnings.catch_warnings(record=
    True)`` callers still record every warning); and an ``ignore`` filter for
    :data:`REPORTED_BY_THE_COMMAND`.
    """
    warnings.filterwarnings("ignore", message=REPORTED_BY_THE_COMMAND, category=RuntimeWarning)
    previous = warnings.formatwarning
    if getattr(previous, "parity_plain", False):
        return
    roots = _own_roots()

    def plain(message: Any, category: Any, filename: str, lineno: int, line: Any = None) -> str:
        if str(Path(filename).resolve()).startswith(roots):
            return f"warning: {message}\n"
        return previous(message, category, filename, lineno, line)

    plain.parity_plain = True  # type: ignore[attr-defined]
    warnings.formatwarning = plain
