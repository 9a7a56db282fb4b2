"""Plain Python loops that define what torchscan computes, written without torchscan's code."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree


def scan_loop(fn, init, xs=None, *, length=None, axis=0, reverse=False) -> tuple[Any, Any]:
    """``scan`` as the hand-written loop: index every leaf with ``select``, stack at the end;
    a step that returns ``until(stop)`` with a true ``stop`` is the last."""
    leaves = [leaf for leaf in pytree.tree_leaves(xs) if leaf is not None]
    n = leaves[0].shape[axis] if leaves else length
    carry, ys = init, {}
    for t in reversed(range(n)) if reverse else range(n):
        x = pytree.tree_map(lambda leaf, t=t: None if leaf is None else leaf.select(axis, t), xs)
        carry, ys[t], *stop = fn(carry, x)
        if stop and bool(stop[0].stop):
            break
    return carry, stack_trees([ys[t] for t in sorted(ys)], axis)


def stack_trees(trees: list[Any], axis: int) -> Any:
    flat = [pytree.tree_flatten(tree) for tree in trees]
    spec = flat[0][1]
    columns = zip(*(leaves for leaves, _ in flat), strict=True)
    stacked = [
        None if column[0] is None else torch.stack(list(column), dim=axis) for column in columns
    ]
    return pytree.tree_unflatten(stacked, spec)


def loop_loop(body, init, *, trip_count=None, cond=None) -> tuple[Any, Any]:
    """``loop`` as the ONNX Loop's C-like pseudo-code, run in Python; at least one iteration."""
    keep_going = True if cond is None else bool(cond)
    carry, ys, i = init, [], 0
    while keep_going and (trip_count is None or i < int(trip_count)):
        out = body(torch.tensor(i), carry)
        carry, y = out[0], out[1]
        ys.append(y)
        if len(out) == 3:
            keep_going = not bool(out[2].stop)
        i += 1
    return carry, stack_trees(ys, 0)
