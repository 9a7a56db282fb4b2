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
import onnx

from torchscan._errors import TorchscanValueError
from torchscan.onnx import _ir
from torchscan.onnx._check import _lint
from torchscan.onnx._check._inputs import _dtype_name, graph_inputs

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


def random_inputs(model: onnx.ModelProto, dims: Mapping[str, int]) -> dict[str, Any]:
    """Random values for the model's inputs, from their types (see :func:`check`)."""
    infos = graph_inputs(model)
    sizes = _dim_sizes(model, infos, dims)
    rng = np.random.default_rng(SEED)
    return {info.name: _random_value(info.name, info.type, sizes, rng) for info in infos}


def _dim_sizes(
    model: onnx.ModelProto, infos: Sequence[onnx.ValueInfoProto], dims: Mapping[str, int]
) -> dict[str, int]:
    """The size of each dynamic dimension of the inputs: as ``dims`` sets it, else as the
    dimensions it must equal (:func:`_equal_dims`), else one of its own that no static
    dimension of the model has."""
    named: list[str] = []
    for info in infos:
        for dim in _tensor_dims(info.type):
            if dim.HasField("dim_param") and dim.dim_param not in named:
                named.append(dim.dim_param)
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
    for why, group in _equal_dims(model):
        params = [d.dim_param for d in group if d.HasField("dim_param") and d.dim_param in parent]
        values = {d.dim_value for d in group if d.HasField("dim_value")}
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


def _static_sizes(model: onnx.ModelProto) -> set[int]:
    """The sizes of the static dimensions of the model's inputs, outputs and initializers."""
    graph = model.graph
    sizes = {int(d) for t in graph.initializer for d in t.dims}
    for value in (*graph.input, *graph.output, *graph.value_info):
        sizes |= {d.dim_value for d in _tensor_dims(value.type) if d.HasField("dim_value")}
    return sizes


def _equal_dims(model: onnx.ModelProto) -> list[tuple[str, list[onnx.TensorShapeProto.Dimension]]]:
    """Dimensions the specification makes equal, with what makes them so: the lengths of the
    scan inputs of each Scan node along their scan axes, and at Scan-8 the batch sizes of its
    inputs too. The shapes are the model's, completed by ONNX shape inference."""
    opset = _lint.default_opset(model.opset_import)
    version = None if opset is None else _lint.version_in_force("Scan", opset)
    if version is None:
        return []
    types: dict[str, onnx.TypeProto] = {}
    found: list[tuple[str, list[onnx.TensorShapeProto.Dimension]]] = []

    def visit(graph: onnx.GraphProto, prefix: str) -> None:
        for value in (*graph.input, *graph.value_info, *graph.output):
            types.setdefault(value.name, value.type)
        for index, node in enumerate(graph.node):
            label = f"{node.op_type} {node.name!r}" if node.name else f"{node.op_type} #{index}"
            if node.op_type == "Scan" and _ir.is_default_domain(node.domain):
                found.extend(_scan_dims(node, prefix + label, types, version))
            for attr in node.attribute:
                for body in [attr.g] if attr.HasField("g") else attr.graphs:
                    visit(body, f"{prefix}{label} > {attr.name} > ")

    visit(_lint._with_inferred_types(model).graph, "")
    return found


def _scan_dims(
    node: onnx.NodeProto, label: str, types: Mapping[str, onnx.TypeProto], version: Any
) -> list[tuple[str, list[onnx.TensorShapeProto.Dimension]]]:
    attrs = {a.name: a for a in node.attribute}
    variadic = list(node.input[1:] if version.batch_axis else node.input)
    m = attrs["num_scan_inputs"].i if "num_scan_inputs" in attrs else 0
    if not 1 <= m <= len(variadic):
        return []
    shapes = [
        list(_tensor_dims(types[name])) if name in types and _has_shape(types[name]) else None
        for name in variadic
    ]
    if version.batch_axis:
        axes = [1] * m
    elif "scan_input_axes" in attrs:
        axes = list(attrs["scan_input_axes"].ints)
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


def _has_shape(type_proto: onnx.TypeProto) -> bool:
    return type_proto.WhichOneof("value") == "tensor_type" and type_proto.tensor_type.HasField(
        "shape"
    )


def _tensor_dims(type_proto: onnx.TypeProto) -> list[onnx.TensorShapeProto.Dimension]:
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        return list(type_proto.tensor_type.shape.dim)
    if kind == "sequence_type":
        return _tensor_dims(type_proto.sequence_type.elem_type)
    if kind == "optional_type":
        return _tensor_dims(type_proto.optional_type.elem_type)
    return []


def _random_value(
    name: str, type_proto: onnx.TypeProto, sizes: dict[str, int], rng: np.random.Generator
) -> Any:
    kind = type_proto.WhichOneof("value")
    if kind == "sequence_type":
        elem = type_proto.sequence_type.elem_type
        return [_random_value(name, elem, sizes, rng) for _ in range(2)]
    if kind == "optional_type":
        return _random_value(name, type_proto.optional_type.elem_type, sizes, rng)
    if kind != "tensor_type":
        raise TorchscanValueError(f"input {name!r} is of type {kind}: give its values with inputs")
    tensor = type_proto.tensor_type
    if not tensor.HasField("shape"):
        raise TorchscanValueError(f"input {name!r} has no shape (not even a rank): give its values")
    shape = tuple(
        d.dim_value if d.HasField("dim_value") else sizes.get(d.dim_param, FIRST_DEFAULT_DIM)
        for d in tensor.shape.dim
    )
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
    what = f"random input {name!r}, {_dtype_name(np.dtype(dtype))}{list(shape)},"
    count = math.prod(shape)
    if count > MAX_RANDOM_ELEMENTS:
        raise TorchscanValueError(
            f"{what} would hold {count:,} elements, more than the {MAX_RANDOM_ELEMENTS:,} a "
            f"random input may hold; give its dynamic dimensions smaller sizes with dims "
            f"(--dim NAME=SIZE)"
        )
    try:
        return _random_array(dtype, shape, rng)
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
