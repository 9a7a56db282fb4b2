"""Selective state-space and diagonal linear recurrences: mamba's ``selective_scan_ref`` (einsum
discretisation, a loop over the steps) and the LRU's complex diagonal recurrence, written with
its real and imaginary parts; the oracle is the Python loop (complex, for the LRU)."""

from ._harness import *  # noqa: F403

NAMES = ["mamba-selective-scan", "lru-real"]
