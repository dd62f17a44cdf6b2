"""Old import path, kept working: ``parity_tracker.targets`` is ``parity_tracker.pipeline.targets``.

The module object itself is aliased (not copied), so attributes set on one are seen on the
other (issue 12 reorganisation; import the new path in new code).
"""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("parity_tracker.pipeline.targets")
