"""Old import path of :mod:`parity_tracker.compare.metrics` (the same module object)."""

import sys

from parity_tracker.compare import metrics as _module

sys.modules[__name__] = _module
