"""``torchscan.scan``: the public function and its argument checks, which make its plan."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, SupportsIndex, TypeVar, overload

import torch

from torchscan import (
    _checkpoint,
    _checks,
    _context,
    _dispatch,
    _layout,
    _lengths,
    _outputs,
    _pytree,
    _steps,
)
from torchscan._checkpoint import Checkpoint
from torchscan._errors import TorchscanTypeError
from torchscan._plan import ScanPlan, arguments_key
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
    in_axes: int | Sequence[Any] | Mapping[Any, Any] | None = None,
    out_axes: int | Sequence[Any] | Mapping[Any, Any] | None = None,
    in_reverse: bool | Sequence[Any] | Mapping[Any, Any] | None = None,
    out_reverse: bool | Sequence[Any] | Mapping[Any, Any] | None = None,
    lengths: torch.Tensor | None = None,
    batch_axis: SupportsIndex = 0,
    hoist: bool | None = None,
    checkpoint: int | Literal["sqrt"] | Checkpoint | None = None,
    unroll: int | bool | None = None,
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
    in_axes: int | Sequence[Any] | Mapping[Any, Any] | None = None,
    out_axes: int | Sequence[Any] | Mapping[Any, Any] | None = None,
    in_reverse: bool | Sequence[Any] | Mapping[Any, Any] | None = None,
    out_reverse: bool | Sequence[Any] | Mapping[Any, Any] | None = None,
    lengths: torch.Tensor | None = None,
    batch_axis: SupportsIndex = 0,
    hoist: bool | None = None,
    checkpoint: int | Literal["sqrt"] | Checkpoint | None = None,
    unroll: int | bool | None = None,
) -> tuple[Carry, Y]: ...


def scan(
    fn: Callable[[Carry, X], tuple[Carry, Y] | tuple[Carry, Y, Until]],
    init: Carry,
    xs: X | None = None,
    *,
    length: SupportsIndex | None = None,
    axis: SupportsIndex = 0,
    reverse: bool = False,
    in_axes: int | Sequence[Any] | Mapping[Any, Any] | None = None,
    out_axes: int | Sequence[Any] | Mapping[Any, Any] | None = None,
    in_reverse: bool | Sequence[Any] | Mapping[Any, Any] | None = None,
    out_reverse: bool | Sequence[Any] | Mapping[Any, Any] | None = None,
    lengths: torch.Tensor | None = None,
    batch_axis: SupportsIndex = 0,
    hoist: bool | None = None,
    checkpoint: int | Literal["sqrt"] | Checkpoint | None = None,
    unroll: int | bool | None = None,
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

    Each sequence may have its own axis and direction, and each output its own axis and
    direction, given as pytrees in the manner of ``jax.vmap``'s ``in_axes`` and ``out_axes``
    (one value for all leaves, or a pytree that is a prefix of ``xs``, or of ``y``)::

        for t in range(n):
            x = {i: take(xs[i], n - 1 - t if in_reverse[i] else t, in_axes[i]) for i in xs}
            carry, y = fn(carry, x)
            for j in y:  # a reversed output is built by prepending
                ys[j][n - 1 - t if out_reverse[j] else t] = y[j]  # stacked on out_axes[j]

    ``reverse=True`` is ``in_reverse=True, out_reverse=True``. A bidirectional RNN is one scan
    over ``(x, x)`` with ``in_reverse=(False, True), out_reverse=(False, True)``.

    With ``lengths``, ``xs`` is a batch of padded sequences, and every example runs alone over
    its own first ``lengths[b]`` positions::

        for b in range(batch):
            carry_b, m = carry[b], lengths[b]  # along batch_axis
            for t in range(m):
                p = m - 1 - t if reverse else t
                carry_b, ys[b, p] = fn(carry_b, xs[b, p])
            carry[b], ys[b, m:] = carry_b, 0

    It is computed batched over the whole padded axis: a step at a padded position of example
    ``b`` leaves its carry as it was and gives it a ``y`` of zeros (``torch.where``), so
    gradients flow through valid steps only (but a step that makes ``inf`` or ``nan`` from
    padding still computes it, and its gradient may then be ``nan``: pad with values the step
    can take). ``fn`` sees the whole batch, padding included.

    Unlike that Python version, ``scan`` checks its arguments and the types ``fn`` returns at
    every step and says which leaf is wrong; it refuses a ``fn`` that changes its carry or its
    ``x`` in place (which the Python version would let change ``xs``, ``init`` or earlier
    ``ys``), and never changes ``init`` or ``xs``; it returns ``ys`` of the right shape and
    dtype when ``n == 0`` (found by running ``fn`` on fake tensors, never on real data); and under
    ``torch.onnx.export`` it becomes one ONNX ``Scan`` node instead of an unrolled graph.
    Eagerly it runs on the device of its inputs, autograd flows through it to ``init``, ``xs``
    and every tensor ``fn`` captures, and from the third call with the same signature it does
    the work of ``fn`` that does not depend on the carry once for the whole sequence (an input
    projection ``x @ W`` becomes one product), which may round differently from one product per
    step (see ``hoist``).

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
        in_axes: the scanned axis of each ``xs`` leaf: an int, or a pytree prefix of ``xs`` of
            ints; by default ``axis``.
        out_axes: the stacking axis of each ``ys`` leaf: an int, or a pytree prefix of ``y``;
            by default ``axis``.
        in_reverse: whether each sequence is read from its end: a bool, or a pytree prefix of
            ``xs``; by default ``reverse``.
        out_reverse: whether each output is stacked from its end (prepended), so that it lines
            up with a sequence read backwards: a bool, or a pytree prefix of ``y``; by default
            ``reverse``.
        lengths: the valid length of every example of a padded batch: a 1-d integer tensor on
            the device of ``xs``, each in ``[0, n]``. Every sequence and output must then run in
            the same direction, and ``fn`` may not return ``until``. A ``PackedSequence``
            becomes ``xs, lengths = torch.nn.utils.rnn.pad_packed_sequence(packed)``.
        batch_axis: with ``lengths``, the batch axis of every carry leaf and of every leaf of
            ``y`` (as ``fn`` sees and returns them).
        hoist: whether the work of ``fn`` that does not depend on the carry is done once, over
            every step: ``None`` (the default) from the third call of a signature (``fn``'s
            code and what it captures, the structures, shapes, dtypes and devices of ``init``
            and ``x``; from the first under saved-tensor hooks, as ``torch.utils.checkpoint``
            sets, so that a recomputation runs as its forward did), where ``fn`` allows it (no
            Python control flow on tensor values, no state changed, no write into an argument
            or a captured tensor; random operations stay at every step); ``True`` from the
            first call, warning (``HoistWarning``) where ``fn`` does not allow it; ``False``
            never. A step that is not hoisted runs as the Python loop, every step as written.
            See the guide's "Speed: hoisting".
        checkpoint: what the backward pass keeps of the steps, and what it runs again (see
            :class:`torchscan.Checkpoint`): ``None`` (the default) keeps what every step saves
            for it; an int ``k`` keeps the carry every ``k`` steps and runs each segment of
            ``k`` steps again in the backward pass (``Checkpoint(every=k)``); ``"sqrt"`` takes
            ``k`` about the square root of the number of steps; a ``torchscan.Checkpoint``
            also gives the binomial schedule (``snapshots=``) and what a segment keeps
            (``save=``). It changes no result, and applies where autograd records and neither
            ``torch.compile`` nor a ``torch.func`` transform runs the scan; an export is the
            same with and without it. See the guide's "Long sequences".
        unroll: under ``torch.compile``, how many steps each iteration of the compiled loop
            runs (as ``jax.lax.scan``'s ``unroll``), which divides the loop's cost per
            iteration by as many: an int ``k`` runs the first ``(n - 1) % k + 1`` steps one by
            one, then the others in blocks of ``k`` (one by one where fewer than two blocks
            remain); ``True`` runs every step in the compiled graph itself, which is then
            compiled again for each length; ``False`` or ``1`` runs one step per iteration;
            ``None`` (the default) chooses from the cost of the step, more for a step of small
            kernels (up to 8), 1 for a large one. It changes no result, and nothing eagerly,
            with ``until`` (a loop that may stop runs one step per iteration) or in an export.
            See the guide's "Unrolling".

    Returns:
        ``(carry, ys)``: the carry after the last step, and every leaf of ``y`` stacked along
        ``axis`` (``None`` leaves stay ``None``). For zero steps, ``init`` itself and ``ys`` of
        length 0 along ``axis``. With ``lengths``, ys are zero at every padded position.

    Raises:
        TypeError: ``fn`` is not callable or does not return a pair; a leaf of ``init``, ``xs``
            or ``y`` is not a tensor or ``None``; the carry or ``y`` changes structure, shape,
            dtype or device at any step; ``reverse`` is not a bool; ``lengths`` is not a tensor
            of integers; ``xs`` is a ``PackedSequence``; ``hoist`` is not a bool or ``None``;
            ``checkpoint`` is not an int, ``"sqrt"``, a ``Checkpoint`` or ``None``; ``unroll``
            is not an int, a bool or ``None``.
        ValueError: ``axis`` is out of range for an ``xs`` or ``y`` leaf; the ``xs`` leaves have
            different lengths; ``length`` is missing, negative or disagrees with ``xs``; the
            tensors of ``init`` and ``xs`` are on different devices; ``fn`` changes its carry
            or ``x`` in place; ``in_axes``, ``out_axes``, ``in_reverse`` or ``out_reverse`` is
            not a prefix of its tree or does not fit a leaf; ``lengths`` is not 1-d, holds a
            length out of ``[0, n]``, is on another device, or a carry or ``y`` leaf has
            another batch size along ``batch_axis``; ``checkpoint`` or ``unroll`` is an int
            below 1; the
            backward pass of ``Checkpoint(snapshots=c)`` over a step that reads a tensor
            requiring gradients where no torch function mode sees it.

    Example:
        A cumulative sum that also returns the running total at each step:

        >>> import torch, torchscan
        >>> def add(total, x):
        ...     return total + x, total + x
        >>> torchscan.scan(add, torch.tensor(0.0), torch.arange(4.0))
        (tensor(6.), tensor([0., 1., 3., 6.]))
    """
    return scan_in_order(
        fn,
        init,
        xs,
        length=length,
        axis=axis,
        reverse=reverse,
        realign=True,
        in_axes=in_axes,
        out_axes=out_axes,
        in_reverse=in_reverse,
        out_reverse=out_reverse,
        lengths=lengths,
        batch_axis=batch_axis,
        hoist=hoist,
        checkpoint=checkpoint,
        unroll=unroll,
    )


def scan_in_order(
    fn: Callable,
    init: Any,
    xs: Any,
    *,
    length: Any,
    axis: Any,
    reverse: bool,
    realign: bool,
    loop_operator: bool = True,
    in_axes: int | Sequence[Any] | Mapping[Any, Any] | None = None,
    out_axes: int | Sequence[Any] | Mapping[Any, Any] | None = None,
    in_reverse: bool | Sequence[Any] | Mapping[Any, Any] | None = None,
    out_reverse: bool | Sequence[Any] | Mapping[Any, Any] | None = None,
    lengths: Any = None,
    batch_axis: Any = 0,
    hoist: bool | None = None,
    checkpoint: Any = None,
    unroll: Any = None,
) -> tuple[Any, Any]:
    """``scan``, with choices the public function does not offer: ``realign=False`` leaves
    ``ys`` in the order the steps ran when ``reverse`` (Theano's ``go_backwards``), where ``scan``
    aligns them with ``xs``. Exported, that is ``scan_output_directions`` 0 instead of 1.
    ``loop_operator=False`` keeps the steps as they are under ``torch.compile``, for a ``fn``
    that changes Python state (which torch's loop operators refuse)."""
    if _dispatch.checkpoints_outside_compile(checkpoint):
        return _dispatch.run_outside_compile(
            scan_in_order,
            fn,
            init,
            xs,
            length=length,
            axis=axis,
            reverse=reverse,
            realign=realign,
            loop_operator=loop_operator,
            in_axes=in_axes,
            out_axes=out_axes,
            in_reverse=in_reverse,
            out_reverse=out_reverse,
            lengths=lengths,
            batch_axis=batch_axis,
            hoist=hoist,
            checkpoint=checkpoint,
            unroll=unroll,
        )
    options = None
    if (
        in_axes is None
        and out_axes is None
        and in_reverse is None
        and out_reverse is None
        and lengths is None
    ):
        options = (
            axis,
            reverse,
            length,
            realign,
            loop_operator,
            hoist,
            batch_axis,
            checkpoint,
            unroll,
        )
        done = _run_checked(fn, init, xs, options)
        if done is not None:
            return done
    _checks.check_callable(_API, "fn", fn)
    _check_parameters(fn)
    _checks.refuse_torchscript(_API)
    _checks.refuse_strict_export(_API)
    if hoist is not None and not isinstance(hoist, bool):
        raise TorchscanTypeError(
            f"{_API}: hoist must be True, False or None, but it is {_checks.describe(hoist)}."
        )
    policy = _checkpoint.resolve(_API, checkpoint)
    unroll = _checks.check_unroll(_API, unroll)
    _lengths.refuse_packed(_API, xs)
    xs_leaves, xs_spec = _pytree.tree_flatten(xs)
    read_backwards, stacked_backwards = _layout.directions(
        _API, xs, xs_leaves, reverse, in_reverse, out_reverse
    )
    carry = _checks.CarryType(_API, "fn", init)
    _checks.check_tensor_leaves(_API, "init", init, carry.leaves)
    _checks.check_tensor_leaves(_API, "xs", xs, xs_leaves)
    _checks.check_int(_API, "axis", axis)
    axes = _layout.in_axes(_API, xs, xs_leaves, axis, in_axes)
    n = _checks.scan_length(_API, xs, xs_leaves, axes, length)
    _checks.check_same_device(_API, [("init", init, carry.leaves), ("xs", xs, xs_leaves)])
    if isinstance(out_axes, int) and not isinstance(out_axes, bool):
        axis, out_axes = out_axes, None  # one axis for every output
    # Without realigning, ys are stacked in the order the steps ran.
    out_reverse = stacked_backwards if realign else False
    plan = ScanPlan(
        protocol=_PROTOCOL,
        fn=fn,
        user=fn,
        carry=carry,
        xs_leaves=tuple(xs_leaves),
        xs_spec=xs_spec,
        in_axes=tuple(axes),
        in_reverse=read_backwards,
        out=_layout.OutLayout(_API, int(axis), out_axes, out_reverse),
        length=n,
        loop_operator=loop_operator,
        hoist=hoist,
        checkpoint=policy,
        unroll=unroll,
    )
    _checks.check_int(_API, "batch_axis", batch_axis)
    if lengths is not None:
        plan = _lengths.masked(plan, lengths, batch_axis)
    elif options is not None and not _context.compiling():
        key = arguments_key(options, (carry.spec, carry.leaves), (xs_spec, xs_leaves))
        if key is not None:  # a later call with arguments like these reuses the plan
            if len(_checked) >= _CHECKED_SIZE:
                del _checked[next(iter(_checked))]
            _checked[key] = plan.without_values()
    return _dispatch.run(plan)


def _check_parameters(fn: Any) -> None:
    _checks.check_parameters(
        _API,
        "fn",
        fn,
        "fn(carry, x)",
        "at every step, x being the step's slice of xs (None when xs is None)",
        "Give it the parameters (carry, x); a step that reads no x still takes it: "
        "def step(carry, _).",
    )


def _run_checked(fn: Any, init: Any, xs: Any, options: tuple[Any, ...]) -> Any:
    """The result of the call, where arguments with the same :func:`arguments_key` (and so
    ``xs`` not a ``PackedSequence``, ``hoist`` a bool or ``None``, ...) passed the checks
    before: its plan is theirs with its values; ``None`` where the call is to be checked."""
    # torch documents torch.jit.is_tracing, but leaves it out of torch.jit.__all__
    if not callable(fn) or _context.compiling() or torch.jit.is_tracing():  # pyright: ignore[reportPrivateImportUsage]
        return None  # checked in full: refused, or traced with symbolic sizes
    xs_leaves, xs_spec = _pytree.tree_flatten(xs)
    init_leaves, init_spec = _pytree.tree_flatten(init)
    key = arguments_key(options, (init_spec, init_leaves), (xs_spec, xs_leaves))
    checked = _checked.get(key) if key is not None else None
    if checked is None:
        return None
    _check_parameters(fn)
    return _dispatch.run(checked.for_call(fn, init, init_leaves, xs_leaves))


_checked: dict[Any, ScanPlan] = {}
"""The plans of the last calls whose arguments passed the checks, without their values, by
:func:`torchscan._plan.arguments_key`: a call with arguments of the same key needs no checks
(they read nothing else), only its values put into the plan."""
_CHECKED_SIZE = 256


_dispatch.register_api("torchscan.scan", scan_in_order)
