"""Old import path of :mod:`parity_tracker.compare.tolerances` (the same module object)."""

import sys

from parity_tracker.compare import tolerances as _module

sys.modules[__name__] = _module
