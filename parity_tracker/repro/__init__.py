"""Reproducers: a standalone failing operator or module test for a run's divergence (issue 20).

``writer`` turns the material a run kept (``run.keep``: ``tensors/repro/`` of the run) into a
folder with ``test_repro.py`` that needs only pytest, torch, numpy and
``parity_tracker.testing``; ``command`` fetches the material from the store (through
``parity_tracker.track``) and optionally logs the folder under the run's ``repro/`` artifacts.
"""

from __future__ import annotations

from parity_tracker.repro.command import reproduce_run, upload_first_reproducer
from parity_tracker.repro.writer import write_reproducer

__all__ = ["reproduce_run", "upload_first_reproducer", "write_reproducer"]
