"""Runnable examples: ``python -m parity_tracker.examples.seed_demo``."""
