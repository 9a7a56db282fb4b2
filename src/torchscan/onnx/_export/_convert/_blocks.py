"""Building blocks of the adapters that several families of operators use, each making its
nodes with a :class:`Builder`: int64 scalars and vectors computed when the model runs (the
lengths of axes, their products and strides, indices counted from the front, ``arange``), and
``Range`` as a ``Loop``, for opsets that lack it.

Every length is a Python int where it is known before run time, and the arithmetic on ints is
folded, so a model of static shapes gets constants; the others are read with ``Shape`` when the
model runs, so dynamic shapes convert too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import overload

import numpy as np
import onnx_ir as ir

from torchscan.onnx._export._convert._context import FLOATS, Builder

_INT64, _BOOL = ir.DataType.INT64, ir.DataType.BOOL


Int = int | ir.Value
"""An int64 scalar: a Python int where it is known before run time, else a value."""


def scalar(b: Builder, value: Int) -> ir.Value:
    """``value`` as an int64 scalar value: a new constant for an int."""
    return b.const(np.int64(value), "scalar") if isinstance(value, int) else value


class Lengths:
    """The lengths of the axes of ``value``, read when asked for: ints where they are known,
    else read from one ``Shape`` of it when the model runs."""

    def __init__(self, b: Builder, value: ir.Value) -> None:
        self.b, self.value = b, value
        self.shape = b.ctx.shape(value)
        self._whole: ir.Value | None = None
        self._read: dict[int, Int] = {}

    def __getitem__(self, axis: int) -> Int:
        if axis not in self._read:
            known = self.shape[axis] if self.shape is not None else None
            if known is not None:
                self._read[axis] = known
            else:
                if self._whole is None:
                    rank = len(self.shape) if self.shape is not None else None
                    self._whole = self.b.op("Shape", [self.value], _INT64, [rank])
                index = self.b.const(np.int64(axis), "axis")
                self._read[axis] = self.b.op("Gather", [self._whole, index], _INT64, [])
        return self._read[axis]

    def of(self, axes: Sequence[int]) -> list[Int]:
        return [self[axis] for axis in axes]


def lengths_of(b: Builder, value: ir.Value) -> Lengths:
    """The :class:`Lengths` of ``value``, one for each value an adapter reads them of."""
    key = ("lengths", value)
    if key not in b.made:
        b.made[key] = Lengths(b, value)
    return b.made[key]


@overload
def multiply(b: Builder, a: int, c: int, shape: Sequence[int | None] | None = ()) -> int: ...
@overload
def multiply(
    b: Builder, a: ir.Value, c: Int, shape: Sequence[int | None] | None = ()
) -> ir.Value: ...
@overload
def multiply(
    b: Builder, a: Int, c: ir.Value, shape: Sequence[int | None] | None = ()
) -> ir.Value: ...
@overload
def multiply(b: Builder, a: Int, c: Int, shape: Sequence[int | None] | None = ()) -> Int: ...
def multiply(b: Builder, a: Int, c: Int, shape: Sequence[int | None] | None = ()) -> Int:
    """``a * c`` in int64 (``a`` may be a tensor of ``shape``), folded where both are ints or
    one is 1."""
    if isinstance(a, int) and isinstance(c, int):
        return a * c
    if isinstance(c, int) and c == 1:
        return a
    if isinstance(a, int) and a == 1:
        return c
    return b.op("Mul", [scalar(b, a), scalar(b, c)], _INT64, shape)


@overload
def add(b: Builder, a: int, c: int, shape: Sequence[int | None] | None = ()) -> int: ...
@overload
def add(b: Builder, a: ir.Value, c: Int, shape: Sequence[int | None] | None = ()) -> ir.Value: ...
@overload
def add(b: Builder, a: Int, c: ir.Value, shape: Sequence[int | None] | None = ()) -> ir.Value: ...
@overload
def add(b: Builder, a: Int, c: Int, shape: Sequence[int | None] | None = ()) -> Int: ...
def add(b: Builder, a: Int, c: Int, shape: Sequence[int | None] | None = ()) -> Int:
    """``a + c`` in int64, folded where both are ints or one is 0."""
    if isinstance(a, int) and isinstance(c, int):
        return a + c
    if isinstance(c, int) and c == 0:
        return a
    if isinstance(a, int) and a == 0:
        return c
    return b.op("Add", [scalar(b, a), scalar(b, c)], _INT64, shape)


def product(b: Builder, lengths: Sequence[Int]) -> Int:
    """The product of ``lengths``, 1 for none."""
    result: Int = 1
    for length in lengths:
        result = multiply(b, result, length)
    return result


def strides(b: Builder, length_of: Callable[[int], Int], count: int) -> list[Int]:
    """The row-major strides of ``count`` axes whose lengths ``length_of`` gives: the product of
    the lengths of the axes after each."""
    found: list[Int] = [1]
    for axis in range(count - 1, 0, -1):
        found.insert(0, multiply(b, found[0], length_of(axis)))
    return found


def vector(b: Builder, values: Sequence[Int]) -> ir.Value:
    """``values`` as one int64 vector."""
    if all(isinstance(v, int) for v in values):
        return b.const(np.array(values, np.int64), "vector")
    one = b.const(np.array([1], np.int64), "one_element")
    pieces = [b.op("Reshape", [scalar(b, v), one], _INT64, [1]) for v in values]
    if len(pieces) == 1:
        return pieces[0]
    return b.op("Concat", pieces, _INT64, [len(pieces)], axis=0)


def arange(b: Builder, node: ir.Node, boundary: int, length: Int) -> ir.Value:
    """``0, 1, ..., length - 1`` in int64: a constant where ``length`` is known; else a ``Range``
    where the target has it (opset 11 on); else, from opset 9 on, the indices of the elements of a
    tensor of ``length`` ones (``NonZero`` lists them in order), and at opset 8 a ``Loop``
    (``range_by_loop``)."""
    if isinstance(length, int):
        return b.const(np.arange(length, dtype=np.int64), "positions")
    key = ("arange", length)
    if key in b.made:
        return b.made[key]
    if b.ctx.target_has("Range"):
        zero, step = b.const(np.int64(0), "start"), b.const(np.int64(1), "delta")
        positions = b.op("Range", [zero, length, step], _INT64, [None])
    elif b.ctx.target_has("NonZero"):
        one = b.const(np.array([1], np.int64), "one_element")
        shape = b.op("Reshape", [length, one], _INT64, [1])
        ones = b.op("ConstantOfShape", [shape], _BOOL, [None], value=np.ones(1, np.bool_))
        found = b.op("NonZero", [ones], _INT64, [1, None])
        flat = b.const(np.array([-1], np.int64), "flat")
        positions = b.op("Reshape", [found, flat], _INT64, [None])
    else:
        zero, step = b.const(np.int64(0), "start"), b.const(np.int64(1), "delta")
        positions = range_by_loop(b, node, boundary, zero, length, step)
        positions.name = b.ctx.fresh("positions")
        b.ctx.set_type(positions, _INT64, [None])
    b.made[key] = positions
    return positions


def as_int64(b: Builder, indices: ir.Value) -> ir.Value:
    if b.ctx.elem_type(indices) == _INT64:
        return indices
    return b.op("Cast", [indices], _INT64, b.ctx.shape(indices), to=_INT64)


def from_front(
    b: Builder, indices: ir.Value, lengths: Int, shape: Sequence[int | None] | None
) -> ir.Value:
    """int64 ``indices`` into axes of ``lengths`` (a scalar, or a vector broadcast against them)
    counted from the front: an index ``i`` in ``[-n, n - 1]`` less ``n * ((i - n + 1) / n)``,
    where the quotient, truncated towards zero, is -1 for a negative index and 0 otherwise."""
    known = b.ctx.const(indices)
    if known is not None and not (known < 0).any():
        return indices
    if known is not None and isinstance(lengths, int):
        return b.const(np.where(known < 0, known + lengths, known).astype(np.int64), "indices")
    if isinstance(lengths, int):
        last: ir.Value = b.const(np.int64(lengths - 1), "last")
        lengths = scalar(b, lengths)
    else:
        last = b.op("Sub", [lengths, b.const(np.int64(1), "one")], _INT64, b.ctx.shape(lengths))
    shifted = b.op("Sub", [indices, last], _INT64, shape)
    quotient = b.op("Div", [shifted, lengths], _INT64, shape)
    return b.op("Sub", [indices, b.op("Mul", [quotient, lengths], _INT64, shape)], _INT64, shape)


def range_by_loop(
    b: Builder,
    node: ir.Node,
    boundary: int,
    start: ir.Value,
    limit: ir.Value,
    delta: ir.Value,
    output: ir.Value | None = None,
) -> ir.Value:
    """``Range(start, limit, delta)`` computed with a Loop (see ``_ops_control.Range``), which
    replaces ``output`` where given; refusals name ``node``."""
    ctx = b.ctx
    elem = ctx.elem_type(start)
    if elem is None:
        raise ctx.refuse(node, boundary, "the type of its inputs is unknown")
    difference = b.op("Sub", [limit, start], elem, [])
    if elem in FLOATS:
        quotient = b.op("Div", [difference, delta], elem, [])
        count = b.op("Ceil", [quotient], elem, [])
    else:
        step = ctx.const(delta)
        if step is None:
            raise ctx.refuse(
                node, boundary, "counting the elements of an integer range needs the sign of "
                "delta, and its delta is computed at run time"
            )  # fmt: skip
        sign = ctx.add_const(np.sign(step).astype(step.dtype), "sign")
        widened = b.op("Add", [difference, delta], elem, [])
        rounded = b.op("Sub", [widened, sign], elem, [])
        count = b.op("Div", [rounded, delta], elem, [])
    trip_count = b.op("Cast", [count], _INT64, [], to=_INT64)
    iteration = ctx.value("i", _INT64, [])
    condition = ctx.value("condition", _BOOL, [])
    carried = ctx.value("unused", _INT64, [])
    steps = Builder(ctx)
    condition_out = steps.op("Identity", [condition], _BOOL, [])
    condition_out.name = ctx.fresh("condition_out")
    carried_out = steps.op("Identity", [carried], _INT64, [])
    carried_out.name = ctx.fresh("unused_out")
    index = steps.op("Cast", [iteration], None, to=elem)
    scaled = steps.op("Mul", [index, delta], None)
    value = steps.op("Add", [start, scaled], elem, [])
    body = ir.Graph(
        [iteration, condition, carried],
        [condition_out, carried_out, value],
        nodes=steps.nodes,
        name=ctx.fresh("range_body"),
    )
    # Loop-1 needs a carried value: an unused one
    unused = ctx.add_const(np.int64(0), "unused")
    loop = b.node("Loop", [trip_count, None, unused], [None, output], body=body)
    loop.outputs[0].name = ctx.fresh("unused_final")
    return loop.outputs[1]
