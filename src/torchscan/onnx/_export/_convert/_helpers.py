"""The rewrites that the adapters of several operators share: onnx's own adapter, axes counted
from the front, attributes added with a default that keeps the older behaviour, and inputs that
were attributes.

An operator's class (in an ``_ops_*`` module) names the one it uses at a boundary:
``below_11 = negative_axes("axes")``. The factories return a new adapter for each use, holding
what differs from one operator to another (the attribute, its neutral value).
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from torchscan.onnx._export._convert._context import (
    Context,
    attribute,
    present_inputs,
    remove_attribute,
    required,
    set_attribute,
    truncate_inputs,
)
from torchscan.onnx._export._convert._registry import Adapter


def onnx_adapter(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """onnx's C++ adapter, where it is exact: it drops an attribute the older version lacks when
    the attribute has the value that means the older behaviour (``select_last_index=0``,
    ``layout=0``, Resize's ``antialias=0`` and no ``axes``, ScatterElements' and ScatterND's
    ``reduction=none``), and refuses any other value; BatchNormalization-9 dropped ``spatial``,
    whose default BatchNormalization-7 keeps."""
    return ctx.run_onnx_adapter(node, boundary)


def negative_axes(name: str = "axis", rank_added: int | None = 0, *, sort: bool = False) -> Adapter:
    """The adapter for opset 11, which lets axes count from the back ("negative value means
    counting dimensions from the back"): the axes of attribute ``name`` are counted from the
    front, in the rank of the input plus ``rank_added`` (the result's rank: OneHot's is one
    more; None for Unsqueeze's, one more for each axis), and sorted where ``sort``. (An axis of
    Flatten may be r: it is counted in the input's rank too.)"""

    def adapter(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        value = attribute(node, name)
        values = value if isinstance(value, list) else [] if value is None else [value]
        if any(v < 0 for v in values):
            rank = ctx.require_rank(node, boundary, required(node, 0))
            rank += len(values) if rank_added is None else rank_added
            counted = [v + rank if v < 0 else v for v in values]
            if sort:
                counted.sort()
            set_attribute(node, name, counted if isinstance(value, list) else counted[0])
        return [node]

    return adapter


def drop_added_attributes(**added: Any) -> Adapter:
    """The adapter for a boundary that added the attributes ``added``, each given with the
    value that means what the older version did (for a list, every entry): an attribute is
    dropped where it has that value, and refused otherwise."""

    def adapter(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        for name, neutral in added.items():
            value = attribute(node, name)
            values = value if isinstance(value, list) else [value]
            if value is not None and any(v != neutral for v in values):
                raise ctx.refuse(
                    node, boundary, f"{name}={value} has no equivalent before opset {boundary}"
                )
        for name in added:
            remove_attribute(node, name)
        return [node]

    return adapter


def input_as_attribute(name: str) -> Adapter:
    """The adapter for a boundary that made the attribute ``name`` the optional second input of
    that name: the input, a constant, moved to the attribute (left out where the input is)."""

    def adapter(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        values = None
        if len(present_inputs(node)) > 1:
            values = ctx.require_const(node, boundary, 1, name)
        truncate_inputs(node, 1)
        if values is not None:
            set_attribute(node, name, [int(v) for v in values.reshape(-1)])
        return [node]

    return adapter
