"""``torchscan.scan``: the public function, its argument checks and its eager execution."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, SupportsIndex, TypeVar, overload

import torch

from torchscan import _checks, _compiled, _outputs, _pytree, _steps, _torch_onnx_hook, _traced
from torchscan._until import Until

Carry = TypeVar("Carry")
X = TypeVar("X")
Y = TypeVar("Y")

_API = "torchscan.scan"
_OUTPUTS = _outputs.Outputs(_API, "fn", "xs index")
_PROTOCOL = _steps.Protocol(_OUTPUTS, "step", "x")


@overload
def scan(
    fn: Callable[[Carry, None], tuple[Carry, Y] | tuple[Carry, Y, Until]],
    init: Carry,
    xs: None = None,
    *,
    length: SupportsIndex,
    axis: SupportsIndex = 0,
    reverse: bool = False,
) -> tuple[Carry, Y]: ...


@overload
def scan(
    fn: Callable[[Carry, X], tuple[Carry, Y] | tuple[Carry, Y, Until]],
    init: Carry,
    xs: X,
    *,
    length: SupportsIndex | None = None,
    axis: SupportsIndex = 0,
    reverse: bool = False,
) -> tuple[Carry, Y]: ...


def scan(
    fn: Callable[[Carry, X], tuple[Carry, Y] | tuple[Carry, Y, Until]],
    init: Carry,
    xs: X | None = None,
    *,
    length: SupportsIndex | None = None,
    axis: SupportsIndex = 0,
    reverse: bool = False,
) -> tuple[Carry, Y]:
    """Loop ``fn`` over an axis of ``xs`` while carrying state, stacking what each step returns.

    The semantics of ``scan`` are given by this Python, where ``take(xs, t)`` selects index ``t``
    along ``axis`` from every leaf of the pytree ``xs`` and ``stack(ys)`` stacks every leaf of the
    per-step results along ``axis``::

        def scan(fn, init, xs=None, *, length=None, axis=0, reverse=False):
            n = length if xs is None else xs.shape[axis]  # of every leaf
            carry, ys = init, [None] * n
            for t in (reversed(range(n)) if reverse else range(n)):
                carry, ys[t] = fn(carry, None if xs is None else take(xs, t))
            return carry, stack(ys)

    With ``reverse=True`` the steps run from the last element to the first, and ``ys[t]`` is
    still the output of the step that consumed ``xs[t]``, as in ``jax.lax.scan``.

    Unlike that Python version, ``scan`` checks its arguments and the types ``fn`` returns at
    every step and says which leaf is wrong; it refuses a ``fn`` that changes its carry or its
    ``x`` in place (which the Python version would let change ``xs``, ``init`` or earlier
    ``ys``), and never changes ``init`` or ``xs``; it returns ``ys`` of the right shape and
    dtype when ``n == 0`` (found by running ``fn`` on fake tensors, never on real data); and under
    ``torch.onnx.export`` it becomes one ONNX ``Scan`` node instead of an unrolled graph.
    Eagerly it runs at the speed of the Python loop, on the device of its inputs, and autograd
    flows through it to ``init``, ``xs`` and every tensor ``fn`` captures.

    Args:
        fn: ``fn(carry, x) -> (new_carry, y)``. ``new_carry`` must have the structure, shapes,
            dtypes and devices of ``init``. ``y`` is any pytree of tensors and ``None``; its
            structure and leaf types must be the same at every step. ``fn`` may return one
            tensor as both carry and y, close over tensors and modules, and use Python scalars;
            it must not change its arguments in place (``c += x``): write ``c = c + x``, and
            clone a carried buffer before writing into it.
        init: the initial carry: a pytree (tuples, lists, dicts, namedtuples) of tensors and
            ``None``; ``None`` means no carry.
        xs: the sequences: a pytree of tensors (``None`` leaves pass through as ``None``) that
            all have the same size along ``axis``; ``x`` is that pytree with ``axis`` removed
            from every leaf. ``None`` means no sequence: then ``length`` is needed and ``x`` is
            ``None``.
        length: the number of steps. Needed when ``xs`` is ``None``; otherwise optional, and it
            must agree with ``xs``.
        axis: the scanned axis of every ``xs`` leaf and the stacking axis of every ``ys`` leaf;
            negative values count from the back of each leaf.
        reverse: run from the last element to the first (``True`` or ``False``).

    Returns:
        ``(carry, ys)``: the carry after the last step, and every leaf of ``y`` stacked along
        ``axis`` (``None`` leaves stay ``None``). For zero steps, ``init`` itself and ``ys`` of
        length 0 along ``axis``.

    Raises:
        TypeError: ``fn`` is not callable or does not return a pair; a leaf of ``init``, ``xs``
            or ``y`` is not a tensor or ``None``; the carry or ``y`` changes structure, shape,
            dtype or device at any step; ``reverse`` is not a bool.
        ValueError: ``axis`` is out of range for an ``xs`` or ``y`` leaf; the ``xs`` leaves have
            different lengths; ``length`` is missing, negative or disagrees with ``xs``; the
            tensors of ``init`` and ``xs`` are on different devices; ``fn`` changes its carry
            or ``x`` in place.

    Example:
        A cumulative sum that also returns the running total at each step:

        >>> import torch, torchscan
        >>> def add(total, x):
        ...     return total + x, total + x
        >>> torchscan.scan(add, torch.tensor(0.0), torch.arange(4.0))
        (tensor(6.), tensor([0., 1., 3., 6.]))
    """
    return scan_in_order(fn, init, xs, length=length, axis=axis, reverse=reverse, realign=True)


def scan_in_order(
    fn: Callable, init: Any, xs: Any, *, length: Any, axis: Any, reverse: bool, realign: bool
) -> tuple[Any, Any]:
    """``scan``, with a choice the public function does not offer: ``realign=False`` leaves
    ``ys`` in the order the steps ran when ``reverse`` (Theano's ``go_backwards``), where ``scan``
    aligns them with ``xs``. Exported, that is ``scan_output_directions`` 0 instead of 1."""
    _checks.check_callable(_API, "fn", fn)
    reverse = _checks.check_bool(_API, "reverse", reverse)
    _checks.refuse_torchscript(_API)
    _checks.refuse_strict_export(_API)
    plan = _plan(init, xs, length, axis)
    if torch.compiler.is_exporting() or _outputs.probing_shapes():
        check_types = _torch_onnx_hook.install_if_exporting(_API)
        return _traced.traced_scan(
            fn, plan, _PROTOCOL, axis, reverse, reverse and realign, check_types
        )
    if plan.length == 0:
        return init, _empty_ys(fn, init, plan, axis)
    if torch.compiler.is_dynamo_compiling():
        return _compiled_scan(fn, plan, axis, reverse, realign)
    steps = _slices(plan)
    carry, ys = _PROTOCOL.run(
        fn,
        reversed(steps) if reverse else steps,
        plan.carry_type,
        axis,
        sources=_steps.Sources(plan.xs_leaves, plan.xs_spec),
    )
    if reverse and realign:
        ys.reverse()
    return carry, _OUTPUTS.stack(ys, axis)


def _compiled_scan(fn: Callable, plan: _Plan, axis: int, reverse: bool, realign: bool) -> Any:
    """``scan`` under ``torch.compile``: the first step traced as it is, the others as one loop
    (:mod:`torchscan._compiled`)."""
    n = plan.length
    xs = [
        None if leaf is None else leaf.movedim(a, 0)
        for leaf, a in zip(plan.xs_leaves, plan.axes, strict=True)
    ]

    def take(t: Any) -> Any:
        if isinstance(t, torch.Tensor):
            position = n - 1 - t if reverse else t
            leaves = [None if x is None else x.index_select(0, position.reshape(1))[0] for x in xs]
        else:
            leaves = [None if x is None else x.select(0, t) for x in xs]
        return _pytree.tree_unflatten(leaves, plan.xs_spec)

    out, broke = _compiled.first_step(fn, plan.carry_type.init, take(n - 1 if reverse else 0))
    has_until = _PROTOCOL.check_first(out, plan.carry_type, axis)
    if broke or not _compiled.loop_operators_apply(out, has_until):
        # fn breaks the graph, or torch cannot train the loop operator: the other steps run as
        # eagerly (TorchDynamo unrolls them where it can trace them)
        steps = _slices(plan)
        later = list(reversed(steps))[1:] if reverse else steps[1:]
        carry, ys = _PROTOCOL.run_after_first(fn, later, plan.carry_type, out)
        if reverse and realign:
            ys.reverse()
        return carry, _OUTPUTS.stack(ys, axis)
    init = plan.carry_type.init
    if has_until:
        device = _compiled.device_of([*plan.carry_type.leaves, *plan.xs_leaves])
        return _compiled.run_loop(
            fn, _PROTOCOL, init, out, take, n, reverse and realign, axis, device
        )
    return _compiled.run_scan(fn, _PROTOCOL, init, out, xs, plan.xs_spec, n, reverse, realign, axis)


_Plan = _checks.ScanPlan


def _plan(init: Any, xs: Any, length: Any, axis: Any) -> _Plan:
    carry_type = _checks.CarryType(_API, "fn", init)
    init_leaves = carry_type.leaves
    _checks.check_tensor_leaves(_API, "init", init, init_leaves)
    xs_leaves, xs_spec = _pytree.tree_flatten(xs)
    _checks.check_tensor_leaves(_API, "xs", xs, xs_leaves)
    axes = _checks.scan_axes(_API, axis, xs, xs_leaves)
    n = _checks.scan_length(_API, xs, xs_leaves, axes, length)
    _checks.check_same_device(_API, [("init", init, init_leaves), ("xs", xs, xs_leaves)])
    return _Plan(carry_type, xs_leaves, xs_spec, axes, n)


def _slices(plan: _Plan) -> Sequence[Any]:
    """The ``x`` of every step, as views into ``xs`` (``unbind`` gives all of them at once, and
    its backward is one ``stack`` instead of one scatter per step)."""
    columns = [
        (None,) * plan.length if leaf is None else leaf.unbind(a)
        for leaf, a in zip(plan.xs_leaves, plan.axes, strict=True)
    ]
    if not columns:  # xs is an empty container: every step gets one like it
        return [_pytree.tree_unflatten([], plan.xs_spec)] * plan.length
    if _pytree.is_leaf_spec(plan.xs_spec):
        return columns[0]
    return [_pytree.tree_unflatten(list(step), plan.xs_spec) for step in zip(*columns, strict=True)]


def _empty_ys(fn: Callable, init: Any, plan: _Plan, axis: int) -> Any:
    """``ys`` of a scan with zero steps, with the shapes and dtypes ``fn`` would give them."""
    fake_x = _pytree.tree_unflatten(
        [
            None if leaf is None else _without_axis(leaf, a)
            for leaf, a in zip(plan.xs_leaves, plan.axes, strict=True)
        ],
        plan.xs_spec,
    )
    out = _OUTPUTS.call_on_fake("xs has length 0", _traced.on_fake_tensors(fn), init, fake_x)
    return _OUTPUTS.empty(_PROTOCOL.check_fake_result(out, plan.carry_type, axis), axis)


def _without_axis(leaf: torch.Tensor, axis: int) -> torch.Tensor:
    shape = leaf.shape[:axis] + leaf.shape[axis + 1 :]
    return torch.empty(shape, dtype=leaf.dtype, device=leaf.device)
