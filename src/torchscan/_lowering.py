"""``torchscan.lower_to_torch``: an exported program whose loops are torch's ``scan`` operator."""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch

from torchscan._compat import pytree
from torchscan._errors import TorchscanValueError
from torchscan._traced import call_torch_scan

_API = "torchscan.lower_to_torch"


def lower_to_torch(
    program: torch.export.ExportedProgram,
    args: tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
    *,
    dynamic_shapes: Any = None,
) -> torch.export.ExportedProgram:
    """The program ``program`` with every ``torchscan_scan`` and ``torchscan_loop`` replaced by
    torch's own scan operator (``torch.ops.higher_order.scan``), for back ends that know torch's
    operators but not torchscan's (ExecuTorch's ``to_edge``, AOTInductor).

    ``torch.export.export(..., strict=False)`` of a model that calls ``torchscan.scan`` or
    ``torchscan.loop`` gives a program that holds torchscan's operators, which the ONNX export
    translates into ``Scan`` and ``Loop``. This exports ``program.module()`` again, with each of
    them computed by torch's scan: a sequence or output along another axis than 0, or in reverse,
    is moved to axis 0 or flipped around it, and every output of the step is copied (torch's scan
    refuses outputs that alias its inputs or each other). A ``loop`` with a trip count (and no
    ``until`` or ``cond``) becomes a scan over ``torch.arange(trip_count)``. Unlike torchscan's
    operators, torch's scan fails at run time on sequences of length 0.

    Args:
        program: what ``torch.export.export`` returned (or ``torch.export.load``, or
            ``run_decompositions``).
        args: the positional inputs to trace with; by default those ``program`` was exported
            with (``program.example_inputs``).
        kwargs: the keyword inputs, likewise.
        dynamic_shapes: as for ``torch.export.export``; by default each size of an input that
            ``program`` keeps symbolic gets a ``torch.export.Dim`` with the range ``program``
            gives it (``program.range_constraints``), shared among the inputs that share it.

    Returns:
        The new program: its module computes what ``program``'s does, and trains.

    Raises:
        ValueError: a loop that may stop early (a ``loop`` with ``until`` or ``cond``, or a
            ``scan`` whose step returns ``until``): torch's scan always runs a number of steps
            known when it starts, and torch has no operator for a loop that stops early and
            trains. Also no ``args`` when ``program`` has no example inputs.

    Example:
        >>> import torch, torchscan
        >>> class Cumsum(torch.nn.Module):
        ...     def forward(self, xs):
        ...         return torchscan.scan(lambda c, x: (c + x, c + x), xs[0] * 0, xs)[1]
        >>> T = torch.export.Dim("T", min=2, max=100)
        >>> program = torch.export.export(Cumsum(), (torch.ones(4, 2),), dynamic_shapes=({0: T},))
        >>> lowered = torchscan.lower_to_torch(program)
        >>> [n.target for n in lowered.graph.nodes].count(torch.ops.higher_order.scan)
        1
        >>> lowered.module()(torch.ones(6, 2))[:, 0]
        tensor([1., 2., 3., 4., 5., 6.])
    """
    if not isinstance(program, torch.export.ExportedProgram):
        raise TorchscanValueError(
            f"{_API}: program must be a torch.export.ExportedProgram, but got "
            f"{type(program).__qualname__}."
        )
    if args is None:
        if program.example_inputs is None:
            raise TorchscanValueError(
                f"{_API}: the program keeps no example inputs; pass args (and kwargs)."
            )
        args, example_kwargs = program.example_inputs
        kwargs = example_kwargs if kwargs is None else kwargs
    kwargs = kwargs or {}
    module = program.module()
    if dynamic_shapes is None:
        dynamic_shapes = _dynamic_shapes(program, module, tuple(args), kwargs)
    call_torch_scan(module)
    return torch.export.export(module, tuple(args), kwargs, dynamic_shapes=dynamic_shapes)


def _dynamic_shapes(
    program: torch.export.ExportedProgram,
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """The dynamic shapes of ``program``'s inputs, by argument name, as ``torch.export.Dim``s."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    dims: dict[Any, Any] = {}
    leaves = []
    for name in program.graph_signature.user_inputs:
        value = placeholders[name].meta.get("val")
        if not isinstance(value, torch.Tensor):
            leaves.append(None)
            continue
        shape = {}
        for axis, size in enumerate(value.shape):
            if isinstance(size, torch.SymInt):
                shape[axis] = _dim(program, size.node.expr, dims)
        leaves.append(shape or None)
    if not dims:
        return None
    in_spec = program.call_spec.in_spec
    assert in_spec is not None  # torch.export.export gives every program its inputs' structure
    arg_shapes, kwarg_shapes = pytree.tree_unflatten(leaves, in_spec)
    bound = inspect.signature(module.forward).bind(*arg_shapes, **kwarg_shapes)
    return dict(bound.arguments)


def _dim(program: torch.export.ExportedProgram, expr: Any, dims: dict[Any, Any]) -> Any:
    if expr in dims:
        return dims[expr]
    bounds = program.range_constraints.get(expr)
    if bounds is None or not expr.is_Symbol:
        dims[expr] = torch.export.Dim.AUTO
        return dims[expr]
    upper = bounds.upper
    dims[expr] = torch.export.Dim(
        f"d_{expr}",
        min=int(bounds.lower),
        **({"max": int(upper)} if math.isfinite(float(upper)) else {}),
    )
    return dims[expr]
