"""The spill folder of one run: a path chosen now, created only if something spills.

``run_parity`` hands this path to every bounded store of the run (module snapshots, op
captures, the budget passes' golden snapshots); each store creates it, with its own
``mkdtemp`` folder inside (mode 0700), on its first spill (``capture.store.SpillDir``). Most
runs never spill: creating and removing an empty temporary folder per run cost ≈ 0.2–0.8 ms of
CPU here (``mkdtemp`` + ``rmdir`` on an overlay file system), a tenth of a small model's two
forwards (issue 19).
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile


class LazySpillRoot:
    """A not-yet-created folder under the system temporary folder, removed by :meth:`cleanup`.

    Attributes:
        name: the folder's path (``<tempdir>/parity-spill-<32 random hex digits>``: unguessable,
            so nobody else can have made it); it exists only once a store spilled into it.
    """

    def __init__(self, prefix: str = "parity-spill-") -> None:
        self.name = os.path.join(tempfile.gettempdir(), prefix + secrets.token_hex(16))

    def cleanup(self) -> None:
        """Delete the folder and everything spilled into it (nothing to do when never made)."""
        if os.path.lexists(self.name):
            shutil.rmtree(self.name, ignore_errors=True)
