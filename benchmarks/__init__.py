"""The performance harness: every figure a ratio measured side by side in one process.

Run ``python -m benchmarks --quick`` (CI) or ``--full`` (``make bench``); see README.md here.
"""
