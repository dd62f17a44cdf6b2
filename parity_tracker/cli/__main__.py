"""``python -m parity_tracker.cli``: the same as the ``parity-tracker`` console script."""

from parity_tracker.cli import main

main()
