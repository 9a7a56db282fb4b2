"""What hoisting means, written once for the three hoisters: the eager one (this package, on the
ATen graph of a step traced on fake tensors), the one under ``torch.compile`` (``_inductor.py``,
an Inductor pass over the loop operator's body) and the one of ONNX bodies
(``torchscan.onnx._export._hoist_bodies``, on ``Scan`` and ``Loop`` bodies in onnx_ir).

Every operation of a step gets a :class:`Kind`, the join (the greatest) of its inputs' kinds:

* ``CONSTANT``: it reads captured tensors and constants only; computed once per call;
* ``SEQUENCE``: it reads the step's slice of the sequences too, but not the carry; computed once
  over every step (batched), where that pays (from :data:`BATCH_FROM` steps);
* ``CARRY``: it reads the carry, or draws random numbers (the random stream stays the loop's,
  in the loop's order: :data:`RANDOM_ONNX_OPS`, and ATen operations tagged
  ``nondeterministic_seeded``); computed at every step.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Kind(enum.IntEnum):
    """What an operation of a step depends on, ordered: an operation is of the greatest kind
    among its inputs' (:func:`join`)."""

    CONSTANT = 0
    SEQUENCE = 1
    CARRY = 2


def join(kinds: Iterable[Kind]) -> Kind:
    """The kind of an operation whose inputs are of ``kinds``: ``CONSTANT`` where it has none."""
    return max(kinds, default=Kind.CONSTANT)


TRACE_AT_CALL = 3
"""A signature's step is traced at its third call: tracing costs about as much as a few calls of
a scan of a hundred steps, which a step called once or twice would not get back."""

BATCH_FROM = 16
"""A scan of fewer steps computes the work that depends on ``x`` alone at every step, in the
loop: batching it over the steps costs more than it saves there."""

AUTO_MEMORY_LIMIT = 1 << 30
"""With ``hoist=None``, a scan whose sequence values, batched over every step, would take more
bytes than this computes them at every step instead (as the Python loop does)."""


RANDOM_ONNX_OPS = frozenset(
    {
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Bernoulli",
        "Multinomial",
    }
)
"""The operators of the default ONNX domain that draw random numbers: of kind ``CARRY`` in a body,
and compared by shape only by the check tool."""
