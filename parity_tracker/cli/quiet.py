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

Filters, not levels, for loggers another library configures: ``logging.config.dictConfig``
(MLflow's, on import) resets the level of an existing child logger but keeps its filters.
"""

from __future__ import annotations

import logging
import re

#: Loggers whose records below WARNING are dropped (their own records; children have theirs).
QUIET_INFO = ("mlflow.store.db.utils", "alembic", "alembic.runtime.migration",
              "alembic.runtime.plugins")  # fmt: skip
#: ``(logger, pattern)``: WARNING records of that logger whose message matches are dropped.
HARMLESS = (
    ("torch.onnx._internal.exporter._registration", r"torchvision is not installed\. Skipping "),
    ("diffusers.models.modeling_utils", r"There are modules in \w+ that should be kept in "
     r"float32: \[\]\."),
)  # fmt: skip


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
