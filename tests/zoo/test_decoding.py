"""Sequence-to-sequence decoding with early stop: greedy decoding with attention over a memory
of dynamic length, and beam search with back-pointers and a reverse scan to read the best beam
back; the oracle is the Python loop of the same decoder."""

from ._harness import *  # noqa: F403

NAMES = ["greedy-decode", "beam-search"]
