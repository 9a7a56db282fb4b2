"""ONNX translations of torchscan's operators, called by torch.onnx while it builds the model.

torch.onnx hands each translation the operator's arguments as it recorded them: tensors as
``onnx_ir`` values, the body subgraph as an ``ir.Function`` (translated before the node that uses
it), and the static description of the loop as the Python ints and bools it was called with. A
translation appends its node to the exporter's current recorder, as torch's own translations of
its higher-order operators do (``torch/onnx/_internal/exporter/_torchlib/ops/hop.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir


def _recorder():
    from torchscan import _compat

    tracer = _compat.onnx_core().current_tracer
    if tracer is None:
        raise RuntimeError("torchscan's ONNX translations run only inside torch.onnx.export")
    return tracer


def _body_graph(
    body: ir.Function, inputs: Sequence[ir.Value], captured: Sequence[ir.Value]
) -> ir.Graph:
    """A graph with ``inputs`` that calls ``body`` on them and on the ``captured`` outer values.

    Outer values are read by name from inside the subgraph, as ONNX allows, so parameters stay
    initializers of the main graph instead of becoming per-step copies. The call is inlined when
    torch.onnx finishes the model.
    """
    call = ir.Node(
        body.domain,
        body.name,
        [*inputs, *captured],
        num_outputs=len(body.outputs),
        name=f"{body.name}_call",
    )
    for i, (value, declared) in enumerate(zip(call.outputs, body.outputs, strict=True)):
        value.name = f"{body.name}_out_{i}"
        value.type, value.shape = declared.type, declared.shape
    return ir.Graph(inputs, call.outputs, nodes=[call], name=f"{body.name}_graph")


def _input_like(name: str, value: ir.Value, drop_axis: int | None = None) -> ir.Value:
    shape = value.shape
    if shape is not None and drop_axis is not None:
        dims = list(shape.dims)
        del dims[drop_axis]
        shape = ir.Shape(dims)
    return ir.Value(name=name, shape=shape, type=ir.TensorType(value.dtype))


def scan_to_onnx(
    body: ir.Function,
    carries: Sequence[ir.Value],
    xs: Sequence[ir.Value],
    captured: Sequence[ir.Value],
    in_axes: Sequence[int],
    in_reverse: Sequence[bool],
    out_axes: Sequence[int],
    out_reverse: Sequence[bool],
) -> Sequence[ir.Value]:
    """``torchscan_scan`` as one ``Scan`` node.

    Axes are non-negative (the operator normalises them), which every Scan version from 9 on
    accepts; Scan-8's batch axis is made by the down-conversion to opset 8.
    """
    recorder = _recorder()
    tag = body.name
    inputs = [_input_like(f"{tag}_state_{i}", c) for i, c in enumerate(carries)] + [
        _input_like(f"{tag}_x_{i}", x, a) for i, (x, a) in enumerate(zip(xs, in_axes, strict=True))
    ]
    node = ir.Node(
        "",
        "Scan",
        [*carries, *xs],
        attributes=[
            ir.AttrGraph("body", _body_graph(body, inputs, list(captured or ()))),
            ir.AttrInt64("num_scan_inputs", len(xs)),
            ir.AttrInt64s("scan_input_axes", list(in_axes)),
            ir.AttrInt64s("scan_input_directions", [int(r) for r in in_reverse]),
            ir.AttrInt64s("scan_output_axes", list(out_axes)),
            ir.AttrInt64s("scan_output_directions", [int(r) for r in out_reverse]),
        ],
        num_outputs=len(body.outputs),
        version=recorder.opset.version,
    )
    recorder.nodes.append(node)
    return node.outputs


def _append(recorder, op_type: str, inputs: Sequence[ir.Value | None], **attributes) -> ir.Value:
    node = ir.Node(
        "",
        op_type,
        inputs,
        attributes=[ir.convenience.convert_attribute(k, v) for k, v in attributes.items()],
        version=recorder.opset.version,
    )
    recorder.nodes.append(node)
    return node.outputs[0]


def _int64_scalar(recorder, value: ir.Value | int) -> ir.Value:
    """The Loop's ``M``: an int64 scalar, whatever form the trip count arrived in."""
    if isinstance(value, int):
        return _append(recorder, "Constant", [], value=ir.tensor(value, dtype=ir.DataType.INT64))
    if value.dtype != ir.DataType.INT64:
        value = _append(recorder, "Cast", [value], to=ir.DataType.INT64)
    if value.shape is None or value.shape.rank() != 0:
        empty = _append(recorder, "Constant", [], value=ir.tensor([], dtype=ir.DataType.INT64))
        value = _append(recorder, "Reshape", [value, empty])
    return value


def loop_to_onnx(
    body: ir.Function,
    trip_count: ir.Value | int | None,
    cond: ir.Value | None,
    carries: Sequence[ir.Value],
    captured: Sequence[ir.Value],
    has_until: bool,
) -> Sequence[ir.Value]:
    """``torchscan_loop`` as one ``Loop`` node.

    The body of the ONNX Loop takes ``(i, cond_in, *carried)`` and returns ``(cond_out,
    *carried, *scan_outputs)``. With ``until``, ``cond_out`` is ``Not(stop)``, and ``cond`` is
    given to the node (``true`` when the user gave none) because a Loop without a ``cond`` input
    ignores ``cond_out``. Without ``until``, ``cond_out`` passes ``cond_in`` on, and the node's
    inputs keep the operating mode the user chose: ``(M, "")``, ``(M, cond)``.
    """
    recorder = _recorder()
    tag = body.name
    iteration = ir.Value(name=f"{tag}_i", shape=ir.Shape([]), type=ir.TensorType(ir.DataType.INT64))
    cond_in = ir.Value(name=f"{tag}_cond", shape=ir.Shape([]), type=ir.TensorType(ir.DataType.BOOL))
    carried = [_input_like(f"{tag}_state_{i}", c) for i, c in enumerate(carries)]
    inner = _body_graph(body, [iteration, *carried], list(captured or ()))
    outputs = list(inner.outputs)
    if has_until:
        stop = outputs.pop()
        cond_out = ir.node("Not", [stop], version=recorder.opset.version)
    else:
        cond_out = ir.node("Identity", [cond_in], version=recorder.opset.version)
    cond_out.outputs[0].name = f"{tag}_cond_out"
    inner.append(cond_out)
    inner.inputs.insert(1, cond_in)
    inner.outputs.clear()
    inner.outputs.extend([cond_out.outputs[0], *outputs])

    m = None if trip_count is None else _int64_scalar(recorder, trip_count)
    if cond is None and (has_until or not carries):
        # A Loop's inputs end with its carried values; with none, cond cannot be left out.
        cond = _append(recorder, "Constant", [], value=ir.tensor(True))
    node = ir.Node(
        "",
        "Loop",
        [m, cond, *carries],
        attributes=[ir.AttrGraph("body", inner)],
        num_outputs=len(outputs),
        version=recorder.opset.version,
    )
    recorder.nodes.append(node)
    return node.outputs
