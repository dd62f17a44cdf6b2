"""Old import path of :mod:`parity_tracker.capture.store` (the same module object)."""

import sys

from parity_tracker.capture import store as _module

sys.modules[__name__] = _module
