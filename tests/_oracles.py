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


def theano_scan_loop(
    fn, sequences=(), outputs_info=(), non_sequences=(), n_steps=None, go_backwards=False
) -> list[torch.Tensor]:
    """Theano's ``scan`` by index arithmetic: step ``s`` reads ``input[before + t + k]`` for each
    sequence tap ``k`` (``t`` counts down from the last position when going backwards), and the
    history of each output at ``k`` steps back."""
    seqs = [
        (s["input"], list(s.get("taps", [0]))) if isinstance(s, dict) else (s, [0])
        for s in sequences
    ]
    outs = []
    for info in outputs_info:
        if isinstance(info, dict):
            taps = info.get("taps", [-1])
            outs.append(
                (
                    info.get("initial"),
                    list(taps) if taps and info.get("initial") is not None else [],
                )
            )
        else:
            outs.append((info, [] if info is None else [-1]))
    before = [max(0, -min(taps)) for _, taps in seqs]
    available = [len(x) - b - max(0, max(taps)) for (x, taps), b in zip(seqs, before, strict=True)]
    backwards = go_backwards
    if n_steps is None:
        n = min(available)
    else:
        n, backwards = abs(int(n_steps)), go_backwards != (int(n_steps) < 0)
    history = {
        i: ([init] if taps == [-1] else list(init[: -min(taps)]))
        for i, (init, taps) in enumerate(outs)
        if taps
    }
    results: dict[int, list] = {}
    for s in range(n):
        args = []
        for (x, taps), b, av in zip(seqs, before, available, strict=True):
            t = av - 1 - s if backwards else s
            args += [x[b + t + k] for k in taps]
        for i, (_, taps) in enumerate(outs):
            args += [history[i][len(history[i]) + k] for k in taps]
        ret = fn(*args, *non_sequences)
        stop = None
        if isinstance(ret, tuple) and type(ret[-1]).__name__ == "Until":
            stop, ret = ret[-1], (ret[0] if len(ret) == 2 else ret[:-1])
        values = list(ret) if isinstance(ret, (list, tuple)) else [ret]
        for i, value in enumerate(values):
            results.setdefault(i, []).append(value)
            if i in history:
                history[i].append(value)
        if stop is not None and bool(stop.stop):
            break
    return [torch.stack(results[i]) for i in sorted(results)]
