"""``lengths=``: a scan over a batch of padded sequences of different lengths.

Example ``b`` of the batch runs its first ``lengths[b]`` steps (the last ones, read backwards,
with ``reverse``): the scan runs over the whole padded axis, and a step that reads a padded
position keeps the carry of example ``b`` as it was and gives it a ``y`` of zeros. The validity
of every step for every example is one more (boolean) sequence, ``arange(T)[:, None] < lengths``,
read in the scan's direction: eagerly, exported (one more input of the ONNX ``Scan``, which
masks inside its body) and compiled alike.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch

from torchscan import _checks, _dispatch, _pytree
from torchscan._compat import FakeTensor
from torchscan._errors import TorchscanTypeError, TorchscanValueError
from torchscan._plan import ScanPlan


def refuse_packed(api: str, xs: Any) -> None:
    """A ``PackedSequence`` is a namedtuple: flattened as a pytree, its data would be scanned
    as if it were padded."""
    if isinstance(xs, torch.nn.utils.rnn.PackedSequence):
        raise TorchscanTypeError(
            f"{api}: xs is a PackedSequence, whose data has no time axis to scan. Pad it and "
            "pass its lengths:\n"
            "    xs, lengths = torch.nn.utils.rnn.pad_packed_sequence(packed)\n"
            "    carry, ys = torchscan.scan(fn, init, xs, lengths=lengths)\n"
            "(with pad_packed_sequence(packed, batch_first=True), scan with axis=1 as well)."
        )


def masked(plan: ScanPlan, lengths: Any, batch_axis: int) -> ScanPlan:
    """The scan of ``plan`` over padded sequences of ``lengths``, as a scan without them: the
    step wrapped to mask its results, and the validity mask as one more sequence."""
    api = plan.protocol.api
    reverse = plan.reverse
    if reverse is None:
        raise TorchscanValueError(
            f"{api}: with lengths, every sequence and output must have the same direction "
            "(each example runs its own first lengths[b] steps, or its last ones read "
            "backwards), but in_reverse and out_reverse give them different ones. Run each "
            "direction as its own scan (reverse=False and reverse=True), as a bidirectional "
            "RNN over padded sequences does."
        )
    lengths, longest = _check_lengths(api, lengths, plan)
    batch = lengths.shape[0]
    _check_batch(api, "init", plan.carry.init, batch, batch_axis, "carry")
    # Eagerly, positions past the longest example are padding for every example, in either
    # direction: they are not run, and their ys are zeros (:func:`extend`).
    length = plan.length if longest is None else longest
    xs_leaves = plan.xs_leaves
    if length != plan.length:
        xs_leaves = tuple(
            None if leaf is None or a is None else leaf.narrow(a, 0, length)  # None: no axis
            for leaf, a in zip(xs_leaves, plan.in_axes, strict=True)
        )
    # The step runs at padded positions too (its results there are dropped): on a copy of the
    # example's first element rather than on the padding, which may hold NaN, inf or garbage
    # that would make NaN gradients (0 * NaN) where pack_padded_sequence gives none. An exported
    # model computes no gradients, and its values are those of the valid positions whatever the
    # padding holds: it reads the sizes of no sequence for this.
    if not _dispatch.traced():
        xs_leaves = tuple(
            None if leaf is None or a is None else _unpadded(leaf, a, lengths, batch_axis)
            for leaf, a in zip(xs_leaves, plan.in_axes, strict=True)
        )
    # Shaped to broadcast against a carry leaf as it is (B examples along batch_axis), so that a
    # step selects with it as it comes. Built with unsqueezes: a reshape exports as a Reshape
    # whose shape may hold 0, which opsets before 14 read otherwise.
    rank = next((leaf.ndim for leaf in plan.carry.leaves if leaf is not None), 1)
    positions = torch.arange(length, device=lengths.device)[(..., *[None] * rank)]
    mask = positions < _spread(lengths, rank, batch_axis)[None]
    leaves, spec = _pytree.tree_flatten(
        (_pytree.tree_unflatten(list(xs_leaves), plan.xs_spec), mask)
    )
    return dataclasses.replace(
        plan,
        fn=_masked(api, plan.fn, plan.carry, batch, batch_axis, eager=longest is not None),
        xs_leaves=tuple(leaves),
        xs_spec=spec,
        in_axes=(*plan.in_axes, 0),
        in_reverse=(*plan.in_reverse, reverse),
        length=length,
        padded_length=None if longest is None or longest == plan.length else plan.length,
    )


def _unpadded(
    leaf: torch.Tensor, axis: int, lengths: torch.Tensor, batch_axis: int
) -> torch.Tensor:
    """``leaf`` (a sequence scanned along ``axis``) with the padded positions of every example
    holding the example's first element (zeros for an example of length 0), so that the step,
    which runs there too, computes on values it can take.

    The examples of ``leaf`` are along the one axis of its elements of the batch's size; where
    several are, along ``batch_axis`` if it is one of them, and then only non-finite values
    (NaN, inf) are replaced: a wrong guess changes no finite value. A leaf with no such axis is
    shared by every example and has no padding."""
    batch, step_rank = lengths.shape[0], leaf.ndim - 1
    element = [leaf.shape[_full_axis(d, axis)] for d in range(step_rank)]
    candidates = [d for d, size in enumerate(element) if size == batch]
    if not candidates or leaf.shape[axis] == 0:
        return leaf
    only_non_finite = len(candidates) > 1
    if only_non_finite:
        if not -step_rank <= batch_axis < step_rank or batch_axis % step_rank not in candidates:
            return leaf
        if not (leaf.is_floating_point() or leaf.is_complex()):
            return leaf  # nothing that is not finite to replace
        chosen = batch_axis % step_rank
    else:
        chosen = candidates[0]
    full = _full_axis(chosen, axis)
    positions = torch.arange(leaf.shape[axis], device=leaf.device)
    keep = _along(positions, leaf.ndim, axis) < _along(lengths, leaf.ndim, full)
    if only_non_finite:
        keep = keep | torch.isfinite(leaf)
    first = leaf.narrow(axis, 0, 1)
    fill = torch.where(_along(lengths > 0, leaf.ndim, full), first, torch.zeros_like(first))
    if only_non_finite:
        fill = torch.nan_to_num(fill, nan=0.0, posinf=0.0, neginf=0.0)
    return torch.where(keep, leaf, fill)


def _full_axis(step_axis: int, scan_axis: int) -> int:
    """The axis of a sequence that is axis ``step_axis`` of its elements."""
    return step_axis if step_axis < scan_axis else step_axis + 1


def _along(values: torch.Tensor, rank: int, axis: int) -> torch.Tensor:
    """The 1-d ``values`` laid along ``axis`` of a tensor of rank ``rank``."""
    return values[(*[None] * axis, slice(None), *[None] * (rank - axis - 1))]


def _check_lengths(api: str, lengths: Any, plan: ScanPlan) -> tuple[torch.Tensor, int | None]:
    """``lengths``, checked, and eagerly the longest of them (``None`` while traced)."""
    if not isinstance(lengths, torch.Tensor):
        raise TorchscanTypeError(
            f"{api}: lengths must be a 1-d tensor of integers (one length per example), but got "
            f"{_checks.describe(lengths)}."
        )
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise TorchscanTypeError(
            f"{api}: lengths must be a tensor of integers, but got {_checks.describe(lengths)}; "
            "convert it with lengths.long()."
        )
    if lengths.ndim != 1:
        raise TorchscanValueError(
            f"{api}: lengths must be 1-d, one length per example of the batch, but got "
            f"{_checks.describe(lengths)}."
        )
    devices = {leaf.device for leaf in [*plan.carry.leaves, *plan.xs_leaves] if leaf is not None}
    if devices and lengths.device not in devices:
        raise TorchscanValueError(
            f"{api}: lengths is on {lengths.device}, but init and xs are on "
            f"{', '.join(sorted(map(str, devices)))}; move it with lengths.to(xs.device)."
        )
    if _dispatch.traced() or _dispatch.compiling() or _is_fake(lengths):
        return lengths, None
    if lengths.numel():
        low, high = int(lengths.min()), int(lengths.max())
        if low < 0 or high > plan.length:
            index = int((lengths < 0).nonzero()[0, 0] if low < 0 else lengths.argmax())
            value = int(lengths[index])
            raise TorchscanValueError(
                f"{api}: every length must be in [0, {plan.length}] (the padded axis has "
                f"{plan.length} steps), but lengths[{index}] is {value}."
            )
        return lengths, high
    return lengths, None


def _is_fake(tensor: torch.Tensor) -> bool:
    return isinstance(tensor, FakeTensor)


def _check_batch(api: str, root: str, tree: Any, batch: int, batch_axis: int, word: str) -> None:
    """Every tensor of ``tree`` has ``batch`` examples along ``batch_axis``."""
    bad = []
    for name, leaf in _pytree.named_tensors(tree, root):
        if not -leaf.ndim <= batch_axis < leaf.ndim:
            bad.append(f"{name} is {_checks.describe(leaf)}, which has no axis {batch_axis}")
        elif leaf.shape[batch_axis] != batch:
            bad.append(
                f"{name} is {_checks.describe(leaf)}, with {leaf.shape[batch_axis]} along axis "
                f"{batch_axis}"
            )
    if bad:
        raise TorchscanValueError(
            f"{api}: with lengths of {batch} examples, every tensor of the {word} must have "
            f"{batch} examples along batch_axis={batch_axis}, but:{_checks.bullets(bad)}"
        )


def _masked(
    api: str,
    fn: Callable,
    carry_type: _checks.CarryType,
    batch: int,
    batch_axis: int,
    eager: bool,
) -> Callable:
    """``fn`` whose new carry is the old one, and whose ``y`` is zeros, for every example
    whose step this is not (``valid`` false)."""
    checked_y = False
    zeros: dict[Any, torch.Tensor] = {}

    def zero(leaf: torch.Tensor) -> torch.Tensor:
        """A 0-d zero of the dtype of ``leaf``, made once eagerly (a constant when traced)."""
        if not eager:
            return torch.zeros((), dtype=leaf.dtype, device=leaf.device)
        made = zeros.get(leaf.dtype)
        if made is None:
            made = zeros[leaf.dtype] = torch.zeros((), dtype=leaf.dtype, device=leaf.device)
        return made

    @functools.wraps(fn)
    def masked(carry: Any, x_and_valid: Any) -> Any:
        nonlocal checked_y
        x, valid = x_and_valid
        out = fn(carry, x)
        if not (isinstance(out, tuple) and len(out) == 2):
            if isinstance(out, tuple) and len(out) == 3:
                raise TorchscanValueError(
                    f"{api}: fn returned until, which cannot be combined with "
                    "lengths: every example stops at its own length."
                )
            return out  # refused, with the usual message, by the caller
        new, y = out
        if not checked_y:
            _checks.check_tensor_leaves(api, "y", y, _pytree.tree_leaves(y))
            checked_y = True
        rank = valid.ndim
        # torch.where would broadcast a y or carry of another shape to the right one.
        if isinstance(new, torch.Tensor) and isinstance(carry, torch.Tensor):
            if new.shape != carry.shape or new.dtype != carry.dtype:
                carry_type.check(new, "")
            new = torch.where(valid if new.ndim == rank else flags(valid, new), new, carry)
        else:
            new = _select_carry(carry_type, valid, new, carry)
        if isinstance(y, torch.Tensor):
            if not _has_batch(y, batch, batch_axis):
                _check_batch(api, "y", y, batch, batch_axis, "y of every step")
            return new, torch.where(valid if y.ndim == rank else flags(valid, y), y, zero(y))
        y_leaves, y_spec = _pytree.tree_flatten(y)
        if not all(t is None or _has_batch(t, batch, batch_axis) for t in y_leaves):
            _check_batch(api, "y", y, batch, batch_axis, "y of every step")
        return new, _pytree.tree_unflatten(
            [t if t is None else torch.where(flags(valid, t), t, zero(t)) for t in y_leaves],
            y_spec,
        )

    def flags(valid: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
        """The flags of the step shaped to broadcast against ``leaf``."""
        if leaf.ndim == valid.ndim:
            return valid
        others = [d for d in range(valid.ndim) if d != batch_axis % valid.ndim]
        return _spread(valid.squeeze(others) if others else valid, leaf.ndim, batch_axis)

    def _select_carry(
        carry_type: _checks.CarryType, valid: torch.Tensor, new: Any, carry: Any
    ) -> Any:
        new_leaves, new_spec = _pytree.tree_flatten(new)
        old_leaves = _pytree.tree_leaves(carry)
        if len(new_leaves) != len(old_leaves) or not all(
            n is o or (n is not None and o is not None and _same(n, o))
            for n, o in zip(new_leaves, old_leaves, strict=True)
        ):
            carry_type.check(new, "")
        return _pytree.tree_unflatten(
            [
                n if n is None else torch.where(flags(valid, n), n, o)
                for n, o in zip(new_leaves, old_leaves, strict=True)
            ],
            new_spec,
        )

    return masked


def _same(new: torch.Tensor, old: torch.Tensor) -> bool:
    return new.shape == old.shape and new.dtype == old.dtype


def _has_batch(leaf: torch.Tensor, batch: int, batch_axis: int) -> bool:
    return -leaf.ndim <= batch_axis < leaf.ndim and leaf.shape[batch_axis] == batch


def _spread(flags: torch.Tensor, rank: int, batch_axis: int) -> torch.Tensor:
    """``flags``, one per example, with axes of 1 around them: rank ``rank``, the examples along
    ``batch_axis``."""
    axis = batch_axis % rank
    return flags[(*[None] * axis, slice(None), *[None] * (rank - axis - 1))]
