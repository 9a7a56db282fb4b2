"""Per-sequence axes and directions: ``in_axes``, ``in_reverse``, ``out_axes`` and
``out_reverse`` of ``scan``, given as pytree prefixes in the manner of ``jax.vmap``'s
``in_axes``/``out_axes`` and resolved here to one value per leaf."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from typing import Any

import optree

from torchscan import _checks, _pytree
from torchscan._errors import TorchscanTypeError, TorchscanValueError


def per_leaf(api: str, name: str, prefix: Any, tree: Any, root: str, kind: type) -> list[Any]:
    """``prefix`` (one value, or a pytree that is a prefix of ``tree``) broadcast to every leaf
    of ``tree``; every value must be of ``kind`` (``int`` or ``bool``)."""
    try:
        values = optree.broadcast_prefix(prefix, tree, none_is_leaf=True, namespace="torch")
    except ValueError:
        given = _pytree.structure_text(_pytree.tree_structure(prefix))
        raise TorchscanValueError(
            f"{api}: {name} must be one {kind.__name__} or a pytree that is a prefix of the "
            f"structure of {root}, but:\n"
            f"  * {root} has structure {_pytree.structure_text(_pytree.tree_structure(tree))}\n"
            f"  * {name} has structure {given}"
        ) from None
    checked = []
    for k, value in enumerate(values):
        if kind is bool:
            ok = isinstance(value, bool)
        else:
            ok = not isinstance(value, bool) and hasattr(value, "__index__")
        if not ok:
            leaf_name = _pytree.leaf_names(tree, root)[k]  # (named where it is refused alone)
            raise TorchscanTypeError(
                f"{api}: {name} gives {leaf_name} {_checks.describe(value)}, but it must be "
                f"{'a bool' if kind is bool else 'an int'}."
            )
        checked.append(bool(value) if kind is bool else operator.index(value))
    return checked


def in_axes(api: str, xs: Any, leaves: Sequence[Any], axis: Any, prefix: Any) -> list[int | None]:
    """The scanned axis of every ``xs`` leaf, made non-negative (``None`` for ``None`` leaves):
    ``axis`` for every leaf, or what the pytree prefix ``in_axes`` gives each."""
    if prefix is None:
        return _checks.scan_axes(api, axis, xs, leaves)
    values = per_leaf(api, "in_axes", prefix, xs, "xs", int)
    axes: list[int | None] = []
    for leaf, value in zip(leaves, values, strict=True):
        if leaf is None:
            axes.append(None)
        elif -leaf.ndim <= value < leaf.ndim:
            axes.append(value % leaf.ndim)
        else:
            axes.append(None)
    if any(a is None and leaf is not None for a, leaf in zip(axes, leaves, strict=True)):
        names = _pytree.leaf_names(xs, "xs")  # (named where one is refused alone)
        bad = [
            f"in_axes gives it {value}: {_checks.axis_out_of_range(value, name, leaf)}"
            for leaf, value, name, a in zip(leaves, values, names, axes, strict=True)
            if a is None and leaf is not None
        ]
        raise TorchscanValueError(
            f"{api}: in_axes does not fit every leaf of xs:{_checks.bullets(bad)}"
        )
    return axes


def directions(
    api: str, xs: Any, xs_leaves: Sequence[Any], reverse: Any, in_reverse: Any, out_reverse: Any
) -> tuple[tuple[bool, ...], Any]:
    """Which leaves of ``xs`` (flattened to ``xs_leaves``) are read from their end, and which
    outputs are stacked from their end (prepended): a bool, or a pytree prefix of ``y``, checked
    once the first step returns ``y``. ``reverse`` alone is every one of both."""
    reverse = _checks.check_bool(api, "reverse", reverse)
    if reverse and (in_reverse is not None or out_reverse is not None):
        raise TorchscanValueError(
            f"{api}: reverse=True reverses every sequence and every output; give directions "
            "either with reverse or with in_reverse and out_reverse, not both."
        )
    if in_reverse is None:
        inputs = (reverse,) * len(xs_leaves)
    else:
        inputs = tuple(per_leaf(api, "in_reverse", in_reverse, xs, "xs", bool))
    return inputs, reverse if out_reverse is None else out_reverse


def until_per_leaf(api: str, fn_name: str) -> TorchscanValueError:
    """The refusal of a step that returns ``until`` in a scan whose axes or directions are given
    leaf by leaf (eagerly and traced alike): a run that stops early has one length, read one
    way."""
    return TorchscanValueError(
        f"{api}: {fn_name} returned until, which cannot be combined with in_axes, out_axes, "
        "in_reverse or out_reverse given leaf by leaf: give every leaf the same axis and "
        "direction (axis=, reverse=)."
    )


@dataclasses.dataclass(frozen=True)
class OutLayout:
    """The stacking axis and the direction of every leaf of ``ys``: one ``axis`` for all, or
    pytree prefixes of ``y`` (``out_axes``, ``out_reverse``), known once a step returned ``y``."""

    api: str
    axis: int
    axes_prefix: Any = None
    reverse_prefix: Any = False

    def axes(self, y: Any) -> list[int]:
        if self.axes_prefix is None:
            return [self.axis] * len(_pytree.tree_leaves(y))
        return per_leaf(self.api, "out_axes", self.axes_prefix, y, "y", int)

    def reverse(self, y: Any) -> list[bool]:
        if isinstance(self.reverse_prefix, bool):
            return [self.reverse_prefix] * len(_pytree.tree_leaves(y))
        return per_leaf(self.api, "out_reverse", self.reverse_prefix, y, "y", bool)
