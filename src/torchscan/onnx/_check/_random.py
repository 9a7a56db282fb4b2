"""Random inputs for a model, from its input types, the same on every run: each dynamic dimension
gets the size ``dims`` sets, else one of its own that no static dimension of the model has, except
that dimensions the specification makes equal (the lengths of one Scan's scan inputs along their
scan axes, and Scan-8's batch sizes) get one size; inputs too large for the memory are refused.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from torchscan._errors import TorchscanValueError
from torchscan.onnx import _ir
from torchscan.onnx._check._inputs import (
    _dtype_name,
    _kind,
    _numpy_dtypes,
    graph_inputs,
    value_type,
)
from torchscan.onnx._lint import _driver as _lint

SEED = 0
"""Random inputs are drawn from ``numpy.random.default_rng(SEED)``: the same model gets the same
inputs on every run."""
FIRST_DEFAULT_DIM = 3
"""The smallest size of a dynamic dimension that ``dims`` leaves unset. Each such dimension gets
a size of its own, 3, 4, 5, ... skipping the sizes of the model's static dimensions, so that two
axes an export mixed up do not go unnoticed by being of one size; the exception is dimensions the
specification makes equal (the lengths of the scan inputs of one Scan), which get one size."""
MAX_RANDOM_ELEMENTS = 2**24
"""The most elements a random input may hold (16,777,216): larger sizes in ``dims`` are refused
rather than left to exhaust the memory."""


def random_inputs(model: ir.Model, dims: Mapping[str, int], typed: ir.Model) -> dict[str, Any]:
    """Random values for the model's inputs, from their types (see :func:`check`).

    Args:
      model: the model as given.
      dims: sizes of named dynamic dimensions.
      typed: the model with the types ONNX shape inference adds
        (:attr:`~torchscan.onnx._lint._load.LoadedModel.typed`), which say which dimensions
        must be equal.

    Returns:
      A value per input, by input name, in the model's input order.
    """
    infos = graph_inputs(model)
    sizes = _dim_sizes(model, infos, dims, typed)
    rng = np.random.default_rng(SEED)
    values: dict[str, Any] = {}
    for info in infos:
        name = _ir.name_of(info)
        values[name] = _random_value(name, value_type(info), info.shape, sizes, rng)
    return values


Dim = int | ir.SymbolicDim
"""A dimension as onnx_ir reads it: a static size, or a symbolic one, named or not."""


def _dim_sizes(
    model: ir.Model, infos: Sequence[ir.Value], dims: Mapping[str, int], typed: ir.Model
) -> dict[str, int]:
    """The size of each dynamic dimension of the inputs: as ``dims`` sets it, else as the
    dimensions it must equal (:func:`_equal_dims`), else one of its own that no static
    dimension of the model has."""
    named: list[str] = []
    for info in infos:
        for dim in _tensor_dims(info):
            name = _param(dim)
            if name is not None and name not in named:
                named.append(name)
    for name, size in dims.items():
        if name not in named:
            listed = ", ".join(named) or "none"
            raise TorchscanValueError(
                f"dims sets {name!r}, which is not a dynamic dimension of the model's inputs; "
                f"theirs are: {listed}"
            )
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise TorchscanValueError(
                f"dims sets {name!r} to {size!r}, not a size (an int at least 0)"
            )
    parent = {name: name for name in named}

    def root(name: str) -> str:
        while parent[name] != name:
            name = parent[name]
        return name

    groups = []
    for why, group in _equal_dims(typed):
        params = [p for p in map(_param, group) if p is not None and p in parent]
        values = {d for d in group if isinstance(d, int)}
        for name in params[1:]:
            parent[root(name)] = root(params[0])
        if params:
            groups.append((params[0], why, values))
    why_of: dict[str, str] = {}
    static: dict[str, int] = {}
    for first, why, values in groups:
        why_of.setdefault(root(first), why)
        if len(values) == 1:  # several: the lint reports the Scan's inputs
            static.setdefault(root(first), values.pop())
    chosen: dict[str, tuple[str, int]] = {}
    for name in named:
        if name not in dims:
            continue
        group, size = root(name), dims[name]
        if group in static and static[group] != size:
            raise TorchscanValueError(
                f"dims sets {name!r} to {size}, but it is one of {why_of[group]}, which must be "
                f"equal, and another of them is {static[group]}"
            )
        if group in chosen and chosen[group][1] != size:
            other, other_size = chosen[group]
            raise TorchscanValueError(
                f"dims sets {other!r} to {other_size} and {name!r} to {size}, but they must be "
                f"equal: both are among {why_of[group]}"
            )
        chosen[group] = (name, size)
    taken = _static_sizes(model) | set(dims.values()) | set(static.values())
    free = (n for n in itertools.count(FIRST_DEFAULT_DIM) if n not in taken)
    sizes = {}
    for name in named:
        group = root(name)
        if group not in chosen:
            chosen[group] = (name, static[group] if group in static else next(free))
        sizes[name] = chosen[group][1]
    return sizes


def _param(dim: Dim) -> str | None:
    """The name of a named dynamic dimension (``dim_param``, which may be empty), or None."""
    return None if isinstance(dim, int) else dim.value


def _static_sizes(model: ir.Model) -> set[int]:
    """The sizes of the static dimensions of the model's inputs, outputs, initializers and the
    other values whose types it declares."""
    graph = model.graph
    sizes = {
        int(d)
        for value in graph.initializers.values()
        if value.const_value is not None
        for d in value.const_value.shape.numpy()  # a tensor's dims are all ints
    }
    for value in (*graph.inputs, *graph.outputs, *graph.initializers.values(), *_declared(graph)):
        sizes |= {d for d in _tensor_dims(value) if isinstance(d, int)}
    return sizes


def _declared(graph: ir.Graph) -> list[ir.Value]:
    """The values of the nodes of ``graph`` (not of their bodies) whose types the model declares
    (its ``value_info``, and its graph outputs)."""
    return [
        value
        for node in graph
        for value in node.outputs
        if value.type is not None or value.shape is not None
    ]


def _equal_dims(model: ir.Model) -> list[tuple[str, list[Dim]]]:
    """Dimensions the specification makes equal, with what makes them so: the lengths of the
    scan inputs of each Scan node along their scan axes, and at Scan-8 the batch sizes of its
    inputs too. The shapes are those of ``model``, the model with the types ONNX shape inference
    adds (:attr:`~torchscan.onnx._lint._load.LoadedModel.typed`)."""
    opset = _ir.default_opset(model.opset_imports)
    version = None if opset is None else _lint.version_in_force("Scan", opset)
    if version is None:
        return []
    types: dict[str, ir.Value] = {}
    found: list[tuple[str, list[Dim]]] = []

    def visit(graph: ir.Graph, prefix: str) -> None:
        for value in (*graph.inputs, *_declared(graph), *graph.outputs):
            if value.name is not None:
                types.setdefault(value.name, value)
        for index, node in enumerate(graph):
            label = f"{node.op_type} {node.name!r}" if node.name else f"{node.op_type} #{index}"
            if node.op_type == "Scan" and _ir.is_default_domain(node.domain):
                found.extend(_scan_dims(node, prefix + label, types, version))
            for attr in node.attributes.values():
                if attr.is_ref():
                    continue
                if attr.type == ir.AttributeType.GRAPH:
                    bodies = [attr.as_graph()]
                elif attr.type == ir.AttributeType.GRAPHS:
                    bodies = list(attr.as_graphs())
                else:
                    bodies = []
                for body in bodies:
                    visit(body, f"{prefix}{label} > {attr.name} > ")

    visit(model.graph, "")
    return found


def _scan_dims(
    node: ir.Node, label: str, types: Mapping[str, ir.Value], version: Any
) -> list[tuple[str, list[Dim]]]:
    attrs = node.attributes
    variadic = list(node.inputs[1:] if version.batch_axis else node.inputs)
    m = _int(attrs.get("num_scan_inputs"))
    if not 1 <= m <= len(variadic):
        return []
    declared = [types.get(value.name or "") if value is not None else None for value in variadic]
    shapes = [
        list(_tensor_dims(value)) if value is not None and _has_shape(value) else None
        for value in declared
    ]
    if version.batch_axis:
        axes = [1] * m
    elif "scan_input_axes" in attrs:
        axes = _ints(attrs["scan_input_axes"])
    else:
        axes = [0] * m
    scans = shapes[len(variadic) - m :]
    lengths = [
        dims[axis]
        for dims, axis in zip(scans, axes, strict=False)
        if dims is not None and -len(dims) <= axis < len(dims)
    ]
    found = [(f"the lengths of the scan inputs of {label}", lengths)]
    if version.batch_axis:
        batch = [dims[0] for dims in shapes if dims]
        found.append((f"the batch sizes of the inputs of {label}", batch))
    return found


def _int(attr: ir.Attr | None) -> int:
    """An int attribute's value; 0 where it is absent, of another type or a reference."""
    if attr is None or attr.is_ref() or attr.type != ir.AttributeType.INT:
        return 0
    return attr.as_int()


def _ints(attr: ir.Attr) -> list[int]:
    """An ints attribute's values; none where it is of another type or a reference."""
    if attr.is_ref() or attr.type != ir.AttributeType.INTS:
        return []
    return list(attr.as_ints())


def _has_shape(value: ir.Value) -> bool:
    return isinstance(value_type(value), ir.TensorType) and value.shape is not None


def _tensor_dims(value: ir.Value) -> list[Dim]:
    """The dimensions of a tensor value, or of the tensors of a sequence or optional value (which
    onnx_ir keeps as the value's shape); none where the shape is unknown or it holds no tensor."""
    type_ = value_type(value)
    while isinstance(type_, (ir.SequenceType, ir.OptionalType)):
        type_ = type_.elem_type
    if not isinstance(type_, ir.TensorType) or value.shape is None:
        return []
    return list(value.shape)


def _random_value(
    name: str,
    type_: ir.TypeProtocol | None,
    shape: ir.Shape | None,
    sizes: dict[str, int],
    rng: np.random.Generator,
) -> Any:
    if isinstance(type_, ir.SequenceType):
        return [_random_value(name, type_.elem_type, shape, sizes, rng) for _ in range(2)]
    if isinstance(type_, ir.OptionalType):
        return _random_value(name, type_.elem_type, shape, sizes, rng)
    if not isinstance(type_, ir.TensorType):
        raise TorchscanValueError(
            f"input {name!r} is of type {_kind(type_)}: give its values with inputs"
        )
    if shape is None:
        raise TorchscanValueError(f"input {name!r} has no shape (not even a rank): give its values")
    dims = tuple(
        d if isinstance(d, int) else sizes.get(d.value or "", FIRST_DEFAULT_DIM) for d in shape
    )
    dtype = _numpy_dtypes().get(int(type_.dtype))
    if dtype is None:  # UNDEFINED: the model does not say what the input holds
        raise TorchscanValueError(
            f"input {name!r} has no element type: give its values with inputs"
        )
    what = f"random input {name!r}, {_dtype_name(np.dtype(dtype))}{list(dims)},"
    count = math.prod(dims)
    if count > MAX_RANDOM_ELEMENTS:
        raise TorchscanValueError(
            f"{what} would hold {count:,} elements, more than the {MAX_RANDOM_ELEMENTS:,} a "
            f"random input may hold; give its dynamic dimensions smaller sizes with dims "
            f"(--dim NAME=SIZE)"
        )
    try:
        return _random_array(dtype, dims, rng)
    except MemoryError:
        raise TorchscanValueError(
            f"{what} does not fit in memory; give its dynamic dimensions smaller sizes with dims "
            f"(--dim NAME=SIZE)"
        ) from None


def _random_array(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator) -> Any:
    """An array (never a numpy scalar: runtimes take arrays) of random values. A bool scalar
    is True: it is most often the condition of a Loop, which would run no iteration if False."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.array(True) if shape == () else rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        values = rng.integers(1, 3, size=shape, endpoint=True)
    elif np.issubdtype(dtype, np.complexfloating):
        values = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
    elif dtype == np.object_:
        values = rng.choice(np.array(["a", "b"], dtype=object), size=shape)
    else:
        values = rng.standard_normal(shape)
    return np.asarray(values).astype(dtype)
