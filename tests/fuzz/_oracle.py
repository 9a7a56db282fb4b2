"""``scan``, ``loop`` and ``until`` as plain Python loops, written from the documented semantics
(docs/scan.md, docs/loop.md) without torchscan's code: the oracle the fuzzed programs' eager
results are compared with.

- ``scan``: ``n`` is ``length`` or the size of the ``xs`` leaves along ``axis``; step ``t`` gets
  ``xs`` selected at ``t`` along ``axis``, in reverse order with ``reverse=True``; ``ys[t]`` is
  the output of the step that read ``xs[t]``; with ``until`` the step that stops is kept, and
  ``ys`` holds the steps that ran in the order of ``xs``; outputs are stacked along ``axis``.
- ``loop``: the ONNX Loop's pseudo-code with ``i`` a 0-d int64 tensor; outputs stacked on a new
  axis 0.
- no step: the carry is ``init`` and every output has length 0, with the shape and dtype the
  step gives it (found here by running the step on fake tensors).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode


class Stop:
    """What the oracle's ``until`` returns."""

    def __init__(self, stop: torch.Tensor) -> None:
        self.stop = stop


def until(stop: torch.Tensor) -> Stop:
    return Stop(stop)


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [leaf for leaf in pytree.tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


def _map(fn, tree: Any) -> Any:
    return pytree.tree_map(lambda leaf: leaf if leaf is None else fn(leaf), tree)


def _stack(outputs: list[Any], axis: int) -> Any:
    leaves = [pytree.tree_flatten(y) for y in outputs]
    spec = leaves[0][1]
    columns = zip(*(flat for flat, _ in leaves), strict=True)
    stacked = [None if c[0] is None else torch.stack(list(c), dim=axis) for c in columns]
    return pytree.tree_unflatten(stacked, spec)


class EmptyYs:
    """The outputs of no step, where the step cannot run on fake tensors here (it indexes an
    empty sequence with the counter, say): the caller takes their types from another length."""

    def __init__(self, axis: int) -> None:
        self.axis = axis


def _empty(call, axis: int) -> Any:
    """The outputs of no step: the step's outputs on fake tensors, with length 0 on ``axis``."""
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            y = call()[1]
    except Exception:
        return EmptyYs(axis)

    def empty(leaf):
        shape = list(leaf.shape)
        shape.insert(axis if axis >= 0 else len(shape) + 1 + axis, 0)
        return torch.empty(shape, dtype=leaf.dtype)

    return _map(empty, y)


def scan(fn, init, xs=None, *, length=None, axis=0, reverse=False) -> tuple[Any, Any]:
    leaves = _tensors(xs)
    n = leaves[0].shape[axis] if leaves else int(length)
    carry, ys = init, {}
    for t in reversed(range(n)) if reverse else range(n):
        x = _map(lambda leaf, t=t: leaf.select(axis, t), xs)
        out = fn(carry, x)
        carry, ys[t] = out[0], out[1]
        if len(out) == 3 and bool(out[2].stop):
            break
    if not ys:

        def fake_step():
            x = _map(
                lambda leaf: (
                    leaf.select(axis, 0)
                    if leaf.shape[axis]
                    else torch.empty(_without(leaf.shape, axis), dtype=leaf.dtype)
                ),
                xs,
            )
            return fn(init, x)

        return init, _empty(fake_step, axis)
    return carry, _stack([ys[t] for t in sorted(ys)], axis)


def _without(shape: torch.Size, axis: int) -> list[int]:
    out = list(shape)
    del out[axis]
    return out


def loop(body, init, *, trip_count=None, cond=None) -> tuple[Any, Any]:
    keep_going = True if cond is None else bool(cond)
    count = None if trip_count is None else int(trip_count)
    carry, ys, i = init, [], 0
    while keep_going and (count is None or i < count):
        out = body(torch.tensor(i), carry)
        carry = out[0]
        ys.append(out[1])
        if len(out) == 3:
            keep_going = not bool(out[2].stop)
        i += 1
    if not ys:
        return init, _empty(lambda: body(torch.tensor(0), init), 0)
    return carry, _stack(ys, 0)


NAMESPACE = {"scan": scan, "loop": loop, "until": until}
