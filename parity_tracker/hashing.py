"""Old import path of :mod:`parity_tracker.compare.hashing` (the same module object)."""

import sys

from parity_tracker.compare import hashing as _module

sys.modules[__name__] = _module
