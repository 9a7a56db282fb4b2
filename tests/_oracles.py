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
    """Theano's ``scan`` as the guide and the reference describe it, on timelines.

    Each sequence becomes a timeline, a dict from times to its elements: "scan will consider
    uvals[0] as u[-4]", so the first element is at the time of the most negative tap (at time 0
    without negative taps). Step ``t`` may run when every ``t + k``, for each tap ``k`` and for
    ``0`` (Theano cuts its sequences as if tap 0 were read), is on the timeline. Going backwards,
    each sequence's own runnable times are taken from the last. Each output's history is a dict
    from times to values, ``initial[0]`` at time ``-depth`` ("init_y[0] corresponds to
    output[-5]"). Returns the stacked outputs, or ``[]`` when no step runs.

    Raises ``ValueError`` where Theano has no answer: a sequence too short to reach from its
    most negative to its most positive tap (no number of steps fits it), or shorter than
    ``n_steps`` steps need.
    """
    backwards = go_backwards != (n_steps is not None and int(n_steps) < 0)
    timelines, runnable = [], []
    for j, seq in enumerate(sequences):
        x, taps = (seq["input"], seq.get("taps")) if isinstance(seq, dict) else (seq, None)
        taps = [0] if taps is None else list(taps) if isinstance(taps, (list, tuple)) else [taps]
        first_time = min([*taps, 0])
        timeline = {first_time + p: x[p] for p in range(len(x))}
        reach = [*taps, 0]
        times = []
        while all(len(times) + k in timeline for k in reach):
            times.append(len(times))
        # Zero steps fit a timeline that reaches time max(reach) - 1 (just before the furthest
        # read of step 0); one that ends earlier would be cut to a negative length.
        if not times and (first_time + len(x) - 1) < max(reach) - 1:
            raise ValueError(f"sequences[{j}] is too short for its taps {taps}")
        timelines.append((timeline, taps))
        runnable.append(times[::-1] if backwards else times)
    if n_steps is None:
        n = min(len(times) for times in runnable)
    else:
        n = abs(int(n_steps))
        for j, times in enumerate(runnable):
            if len(times) < n:
                raise ValueError(f"sequences[{j}] is too short for {n} steps")

    histories, fed_back = {}, []
    for i, info in enumerate(outputs_info):
        if isinstance(info, dict):
            initial, taps = info.get("initial"), info.get("taps", [-1])
            taps = [] if initial is None or taps is None else list(taps)
        else:
            initial, taps = info, ([] if info is None else [-1])
        if taps:
            depth = -min(taps)
            past = [initial] if taps == [-1] else [initial[d] for d in range(depth)]
            histories[i] = {time - depth: value for time, value in enumerate(past)}
        fed_back.append(taps)

    results: dict[int, list] = {}
    for s in range(n):
        args = []
        for (timeline, taps), times in zip(timelines, runnable, strict=True):
            args += [timeline[times[s] + k] for k in taps]
        for i, taps in enumerate(fed_back):
            args += [histories[i][s + k] for k in taps]
        ret = fn(*args, *non_sequences)
        stop = None
        if isinstance(ret, tuple) and type(ret[-1]).__name__ == "Until":
            stop, ret = ret[-1], (ret[0] if len(ret) == 2 else ret[:-1])
        values = list(ret) if isinstance(ret, (list, tuple)) else [ret]
        for i, value in enumerate(values):
            results.setdefault(i, []).append(value)
            if i in histories:
                histories[i][s] = value
        if stop is not None and bool(stop.stop):
            break
    return [torch.stack(results[i]) for i in sorted(results)]


def equinox_online(slots: int, n: int) -> tuple[int, int]:
    """The iterations equinox's ``checkpointed_while_loop`` runs over ``n`` iterations with
    ``slots`` checkpoints (its forward pass, then its backward pass's evaluations), and the most
    carries it holds: its controller and its treeverse, written after its source as plain
    Python."""
    never = 1 << 62
    # the forward pass: Stumm and Walther's Algorithm I, then Wang and Moin's
    switch = (slots + 1) * (slots + 2) // 2 - 1
    i, o, p, s = 0, slots, slots, True
    levels, dispensable = [never] + [0] * (slots - 1), [False] * slots
    steps = [never] * slots
    for step in range(n):
        if step < switch:
            save, index = s, i
            i = i + 1 if s else i
            i = 1 if s and i > o else i
            s = False if step + 1 == p else s
            if step == p:
                p, o = p + o, o - 1
                i, s = o, o > 0
        elif slots == 1:
            save = False
        else:
            save = True
            if any(dispensable):
                index = max((steps[j] if dispensable[j] else 0, -j) for j in range(slots))[1] * -1
                level = 0
                dispensable[index] = False
            else:
                index = -max((steps[j], -j) for j in range(slots))[1]
                level = levels[index] + 1
                dispensable = [d or levels[j] < levels[index] for j, d in enumerate(dispensable)]
            levels[index] = level
        if save:
            steps[index] = step
    store = sorted(t for t in steps if t != never)

    # the backward pass: its treeverse, a checkpoint placed halfway or, within budget, next
    def load(grad_at: int, index: int) -> tuple[int, int]:
        read = max(index - 1, 0)
        return store[read], read if store[read] + 1 == grad_at else index

    def next_checkpoint(at: int, grad_at: int, index: int) -> int:
        if index == slots or at + 1 == grad_at or at + 2 == grad_at:
            return never
        within = grad_at - at - 2 <= slots - index
        return at + 1 if within else at + (grad_at - at) // 2

    index = len(store)
    grad_at = n
    at, index = load(grad_at, index)
    upcoming = next_checkpoint(at, grad_at, index)
    evaluations, most = 0, len(store)
    while grad_at > 0:
        evaluations += 1
        if at + 1 == grad_at:
            grad_at -= 1
            if grad_at == 0:
                break
            at, index = load(grad_at, index)
            upcoming = next_checkpoint(at, grad_at, index)
        else:
            at += 1
            if at == upcoming:
                store[index:] = [at]
                index += 1
                most = max(most, index)
                upcoming = next_checkpoint(at, grad_at, index)
        del store[index:]
    return n + evaluations, most
