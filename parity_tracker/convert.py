"""Old import path of :mod:`parity_tracker.compare.convert` (the same module object)."""

import sys

from parity_tracker.compare import convert as _module

sys.modules[__name__] = _module
