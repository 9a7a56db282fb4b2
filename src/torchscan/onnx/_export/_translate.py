"""ONNX translations of torchscan's operators, called by torch.onnx while it builds the model.

torch.onnx hands each translation the operator's arguments as it recorded them: tensors as
``onnx_ir`` values, the body subgraph as an ``ir.Function`` (translated before the node that uses
it), and the static description of the loop as the Python ints and bools it was called with. A
translation appends its node to the exporter's current recorder, as torch's own translations of
its higher-order operators do (``torch/onnx/_internal/exporter/_torchlib/ops/hop.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx_ir as ir

from torchscan._errors import ExportError
from torchscan._traced._scan_op import ScanStatic
from torchscan.onnx._export._empty_loops import MAY_RUN_NO_ITERATION


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


def _dtype(value: ir.Value) -> ir.DataType:
    """The element type of a tensor that torch.onnx recorded: it gives every tensor one."""
    assert value.dtype is not None, f"torch.onnx recorded {value.name!r} without a type"
    return value.dtype


def _input_like(name: str, value: ir.Value, drop_axis: int | None = None) -> ir.Value:
    shape = value.shape
    if shape is not None and drop_axis is not None:
        dims = list(shape.dims)
        del dims[drop_axis]
        shape = ir.Shape(dims)
    return ir.Value(name=name, shape=shape, type=ir.TensorType(_dtype(value)))


def scan_to_onnx(
    body: ir.Function,
    carries: Sequence[ir.Value],
    xs: Sequence[ir.Value],
    captured: Sequence[ir.Value],
    *static: Any,
) -> Sequence[ir.Value]:
    """``torchscan_scan`` as one ``Scan`` node; ``static`` is the operator's
    :class:`~torchscan._traced._scan_op.ScanStatic`.

    Axes are non-negative (the operator normalises them), which every Scan version from 9 on
    accepts; Scan-8's batch axis is made by the down-conversion to opset 8. ``nonempty`` says
    that the exported program's shapes keep the length at 1 or more; where they do not, the
    Scan is guarded against a length of 0 (see :class:`_EmptyGuard`).
    """
    in_axes, in_reverse, out_axes, out_reverse, nonempty = ScanStatic.of(*static)
    recorder = _recorder()
    tag = body.name
    inputs = [_input_like(f"{tag}_state_{i}", c) for i, c in enumerate(carries)] + [
        _input_like(f"{tag}_x_{i}", x, a) for i, (x, a) in enumerate(zip(xs, in_axes, strict=True))
    ]
    guard = (
        _EmptyGuard(recorder, body, xs, in_axes)
        if not nonempty and _may_be_empty(xs, in_axes)
        else None
    )
    node = ir.Node(
        "",
        "Scan",
        [*carries, *(guard.sequences if guard else xs)],
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
    if guard is None:
        return node.outputs
    return guard.outputs(node.outputs, carries, out_axes)


def _may_be_empty(xs: Sequence[ir.Value], in_axes: Sequence[int]) -> bool:
    """Whether the scan's length, read from the first sequence, is not known to be at least 1."""
    if not xs:
        return False
    shape = xs[0].shape
    if shape is None:
        return True
    length = shape.dims[in_axes[0]]
    return not (isinstance(length, int) and length >= 1)


class _EmptyGuard:
    """A Scan that runs for every length, 0 included.

    The ONNX specification lets a Scan run zero steps, but onnxruntime 1.32 fails on a sequence
    of length 0 (along axis 0) or ends the process (along other axes). Where the length is not
    known to be positive, the Scan reads its sequences through an ``If``: the sequences
    themselves when the length is positive, else one step of zeros shaped like a step of each
    sequence. A second ``If`` returns the Scan's results when the length is positive, else the
    initial carry unchanged and each output with its scan axis cut to length 0: the step run on
    zeros only gives the outputs their shapes, and its values are dropped.
    """

    def __init__(
        self,
        recorder,
        body: ir.Function,
        xs: Sequence[ir.Value],
        in_axes: Sequence[int],
    ) -> None:
        self._recorder, self._tag, self._body_outputs = recorder, body.name, list(body.outputs)
        tag = body.name
        length = _append(recorder, "Shape", [xs[0]])
        length = _append(
            recorder,
            "Gather",
            [length, _constant(recorder, in_axes[0])],
            axis=0,
        )
        self.nonempty = _append(recorder, "Cast", [length], to=ir.DataType.BOOL)
        version = recorder.opset.version
        # The sequences pass through a Slice to a length known only at run time: If-1's shape
        # inference gives the If the then branch's shapes, and onnxruntime would plan for the
        # sequence's length on the one step of zeros.
        zero = _append(recorder, "Constant", [], value=ir.tensor([0], dtype=ir.DataType.INT64))
        ends = _append(recorder, "Reshape", [length, _constant(recorder, [1])])
        self._length = ends
        then_nodes = [
            ir.node("Slice", [x, zero, ends, _constant(recorder, [axis])], version=version)
            for x, axis in zip(xs, in_axes, strict=True)
        ]
        else_nodes: list[ir.Node] = []
        stand_ins = [
            _one_step_of_zeros(else_nodes, x, axis, version)
            for x, axis in zip(xs, in_axes, strict=True)
        ]
        choice = _if(
            self.nonempty, f"{tag}_xs", then_nodes, else_nodes, stand_ins, len(xs), version
        )
        for value, x, axis in zip(choice.outputs, xs, in_axes, strict=True):
            value.type = ir.TensorType(_dtype(x))
            value.shape = _with_dim(x.shape, axis, None)
        recorder.nodes.append(choice)
        self.sequences = list(choice.outputs)

    def outputs(
        self,
        results: Sequence[ir.Value],
        carries: Sequence[ir.Value],
        out_axes: Sequence[int],
    ) -> Sequence[ir.Value]:
        recorder, version = self._recorder, self._recorder.opset.version
        n_carries = len(carries)
        ys = list(results[n_carries:])
        then_nodes = [ir.node("Identity", [value], version=version) for value in results]
        else_nodes = [ir.node("Identity", [c], version=version) for c in carries]
        zero = ir.node(
            "Constant", [], {"value": ir.tensor([0], dtype=ir.DataType.INT64)}, version=version
        )
        else_nodes.append(zero)
        for y, axis in zip(ys, out_axes, strict=True):
            axes = ir.node(
                "Constant",
                [],
                {"value": ir.tensor([axis], dtype=ir.DataType.INT64)},
                version=version,
            )
            # Cut to the length of the sequence, which is 0 on this branch: a constant end
            # would give the branch a static size of 0, which If-1's shape inference can keep
            # for the If, and onnxruntime's optimizations then fold sizes read from it.
            empty = ir.node(
                "Slice", [y, zero.outputs[0], self._length, axes.outputs[0]], version=version
            )
            else_nodes.extend([axes, empty])
        else_outputs = [n.outputs[0] for n in else_nodes if n.op_type in ("Identity", "Slice")]
        choice = _if(
            self.nonempty,
            f"{self._tag}_out",
            then_nodes,
            else_nodes,
            else_outputs,
            len(results),
            version,
        )
        for result, carry in zip(results, carries, strict=False):
            result.type, result.shape = ir.TensorType(_dtype(carry)), carry.shape
        for result, step, axis in zip(ys, self._body_outputs[n_carries:], out_axes, strict=True):
            # On an empty sequence, the Scan itself runs one step of zeros: its length is unknown.
            result.type = step.type
            if step.shape is not None:
                dims: list[int | ir.SymbolicDim | None] = list(step.shape.dims)
                dims.insert(axis, None)
                result.shape = ir.Shape(dims)
        recorder.nodes.append(choice)
        return choice.outputs


def _if(
    cond: ir.Value,
    tag: str,
    then_nodes: Sequence[ir.Node],
    else_nodes: Sequence[ir.Node],
    else_outputs: Sequence[ir.Value],
    n: int,
    version: int | None,
) -> ir.Node:
    """An ``If`` of ``n`` outputs on ``cond``: the outputs of ``then_nodes`` where it holds, else
    ``else_outputs`` computed by ``else_nodes``; its branches named ``{tag}_then`` and
    ``{tag}_else``."""
    else_branch = ir.Graph(
        [], else_outputs, nodes=_named(else_nodes, f"{tag}_else"), name=f"{tag}_else"
    )
    return ir.Node(
        "",
        "If",
        [cond],
        attributes=[
            ir.AttrGraph("then_branch", _branch(f"{tag}_then", then_nodes)),
            ir.AttrGraph("else_branch", else_branch),
        ],
        num_outputs=n,
        version=version,
    )


def _branch(name: str, nodes: Sequence[ir.Node]) -> ir.Graph:
    nodes = _named(nodes, name)
    return ir.Graph([], [n.outputs[0] for n in nodes], nodes=nodes, name=name)


def _named(nodes: Sequence[ir.Node], prefix: str) -> Sequence[ir.Node]:
    """``nodes``, their outputs named ``{prefix}_{k}`` (the body's name is unique in the model):
    ONNX wants every value name unique across a graph and its subgraphs, and values left
    unnamed here would be named later in a count of the subgraph's own, which can meet a name
    of the outer graph."""
    for k, value in enumerate(value for node in nodes for value in node.outputs):
        if not value.name:
            value.name = f"{prefix}_{k}"
    return nodes


def _with_dim(shape: ir.Shape | None, axis: int, dim) -> ir.Shape | None:
    if shape is None:
        return None
    dims = list(shape.dims)
    dims[axis] = dim
    return ir.Shape(dims)


def _one_step_of_zeros(nodes: list[ir.Node], x: ir.Value, axis: int, version: int) -> ir.Value:
    """Append to ``nodes`` the computation of zeros shaped like ``x`` with length 1 on ``axis``."""
    rank = x.shape.rank() if x.shape is not None else None
    if rank is None:
        raise ExportError(
            f"torch.onnx.export: the rank of the scanned input {x.name!r} is unknown, so the "
            "Scan, whose length may be 0, cannot be guarded against running no step (which "
            "onnxruntime "
            "fails on). Give the scanned sequences a known rank."
        )
    keep = [0 if d == axis else 1 for d in range(rank)]
    one = [1 if d == axis else 0 for d in range(rank)]
    shape = ir.node("Shape", [x], version=version)
    keep_c = ir.node(
        "Constant", [], {"value": ir.tensor(keep, dtype=ir.DataType.INT64)}, version=version
    )
    one_c = ir.node(
        "Constant", [], {"value": ir.tensor(one, dtype=ir.DataType.INT64)}, version=version
    )
    kept = ir.node("Mul", [shape.outputs[0], keep_c.outputs[0]], version=version)
    step_shape = ir.node("Add", [kept.outputs[0], one_c.outputs[0]], version=version)
    zero = ir.node("Constant", [], {"value": ir.tensor(0, dtype=x.dtype)}, version=version)
    zeros = ir.node("Expand", [zero.outputs[0], step_shape.outputs[0]], version=version)
    nodes.extend([shape, keep_c, one_c, kept, step_shape, zero, zeros])
    # Declared with the scan axis unknown: where a branch output has no shape, If-1's shape
    # inference takes the then branch's, and onnxruntime would plan for the sequence's length.
    zeros.outputs[0].type = ir.TensorType(_dtype(x))
    zeros.outputs[0].shape = _with_dim(x.shape, axis, None)
    return zeros.outputs[0]


def _constant(recorder, value: int | list[int]) -> ir.Value:
    return _append(recorder, "Constant", [], value=ir.tensor(value, dtype=ir.DataType.INT64))


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
    if len(outputs) > len(carries) and not (isinstance(trip_count, int) and trip_count >= 1):
        # Its scan outputs need their shapes after no iteration (see _empty_loops).
        node.meta[MAY_RUN_NO_ITERATION] = True
    recorder.nodes.append(node)
    return node.outputs
