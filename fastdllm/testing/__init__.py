"""Test support shipped with the package (as `torch.testing` is): tiny random-weight checkpoints in
the exact published layouts of each family, written by `tiny_*.py` on `files.py`. Used by tests/,
benchmarks/ and scripts/; nothing in the product imports it."""
