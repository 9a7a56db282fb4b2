"""The outputs of a Loop that runs no iteration, shaped as the specification wants them.

A Loop's scan outputs stack one value per iteration. After zero iterations the specification
gives each an empty leading axis and the per-iteration shape after it; onnxruntime 1.32 gives
the leading axis and every dimension it does not know statically a size of 0, so that a
``(0, B, H)`` output comes out as ``(0, 0, H)``. A ``torchscan.loop`` whose trip count may be 0
(``trip_count=T - 1``), or whose condition may be false at the start, would give a result of
the wrong shape.

This pass, run on the translated model, reshapes each such output to ``(len(y), *step_shape)``,
with the per-iteration shape read from the model's inputs: the Loop's output as it is when the
loop ran, and of the right shape when it did not. A per-iteration dimension must be a
number or the name of a dimension of a model input (``B``) for that; where one is not (a size the
body computes), the output is left as onnxruntime makes it, which docs/loop.md states.
"""

from __future__ import annotations

import onnx_ir as ir

from torchscan.onnx import _ir

MAY_RUN_NO_ITERATION = "torchscan.may_run_no_iteration"
"""The key of ``ir.Node.meta`` that the translation of ``torchscan_loop`` sets on a Loop whose
trip count may be 0 or whose condition may be false at the start."""


def shape_empty_loop_outputs(model: ir.Model) -> int:
    """Reshape the scan outputs of every marked Loop of ``model`` as described above, in
    place. Returns how many outputs were reshaped."""
    graph = model.graph
    dims = _input_dims(graph)
    names = _ir.Names.of(graph)
    routed = 0
    for found in list(_ir.graphs(graph)):
        for node in list(found):
            if node.op_type == "Loop" and node.meta.pop(MAY_RUN_NO_ITERATION, False):
                routed += _route(found, node, dims, names)
    return routed


def _input_dims(graph: ir.Graph) -> dict[str, tuple[ir.Value, int]]:
    """Each named dimension of the model's inputs: the input and axis it can be read from."""
    dims: dict[str, tuple[ir.Value, int]] = {}
    for value in graph.inputs:
        if value.shape is None:
            continue
        for axis, dim in enumerate(value.shape.dims):
            if isinstance(dim, ir.SymbolicDim) and dim.value:
                dims.setdefault(dim.value, (value, axis))
    return dims


def _route(
    graph: ir.Graph,
    loop: ir.Node,
    dims: dict[str, tuple[ir.Value, int]],
    names: _ir.Names,
) -> int:
    body = loop.attributes["body"].as_graph()
    n_carried = len(loop.inputs) - 2
    steps = body.outputs[1 + n_carried :]
    outputs = loop.outputs[n_carried:]
    routable = [
        (y, step.shape)
        for y, step in zip(outputs, steps, strict=True)
        if step.shape is not None and all(_readable(d, dims) for d in step.shape.dims)
    ]
    version = loop.version
    made: list[ir.Node] = []
    for y, step_shape in routable:
        made.extend(_reshaped(graph, y, step_shape, dims, names, version))
    graph.insert_after(loop, made)
    return len(routable)


def _reshaped(
    graph: ir.Graph,
    y: ir.Value,
    step_shape: ir.Shape,
    dims: dict[str, tuple[ir.Value, int]],
    names: _ir.Names,
    version: int | None,
) -> list[ir.Node]:
    """Nodes that reshape the scan output ``y`` to ``(len(y), *step_shape)``, and give the
    result ``y``'s place: after iterations ran that is ``y`` as it is, after none it puts the
    sizes onnxruntime left out. Both hold no element, so the Reshape is valid either way, and a
    0 in the shape (a dimension of size 0, which Reshape reads as "as in the input") copies a
    size that is 0 in both. The result's shape is left unknown but for its rank: a static shape
    here would be false for some run, and onnxruntime's optimizations would fold sizes read from
    it into constants."""
    nodes: list[ir.Node] = []

    def add(op: str, inputs: list[ir.Value], **attributes) -> ir.Value:
        node = ir.node(op, inputs, attributes, version=version)
        node.outputs[0].name = names.fresh(f"{y.name}_{op.lower()}")
        nodes.append(node)
        return node.outputs[0]

    def constant(values: list[int]) -> ir.Value:
        return add("Constant", [], value=ir.tensor(values, dtype=ir.DataType.INT64))

    parts = [add("Gather", [add("Shape", [y]), constant([0])], axis=0)]
    for dim in step_shape.dims:
        if isinstance(dim, int):
            parts.append(constant([dim]))
        else:
            assert dim.value is not None  # a dimension _readable found in dims
            source, axis = dims[dim.value]
            parts.append(add("Gather", [add("Shape", [source]), constant([axis])], axis=0))
    shape = add("Concat", parts, axis=0)
    # The Loop's output has the per-iteration sizes only when it iterated (onnxruntime gives
    # (0, 0, H) after none): it states none, so that no optimizer takes this Reshape for a no-op.
    y.shape = ir.Shape([None] * (1 + len(step_shape.dims)))
    reshape = ir.node("Reshape", [y, shape], version=version)
    result = reshape.outputs[0]
    result.name = names.fresh(f"{y.name}_shaped")
    result.type = y.type
    result.shape = ir.Shape([None] * (1 + len(step_shape.dims)))
    nodes.append(reshape)
    for use in list(y.uses()):
        if use.node not in nodes:
            use.node.replace_input_with(use.idx, result)
    _replace_graph_output(graph, y, result)
    return nodes


def _readable(dim: object, dims: dict[str, tuple[ir.Value, int]]) -> bool:
    if isinstance(dim, int):
        return True
    return isinstance(dim, ir.SymbolicDim) and dim.value in dims


def _replace_graph_output(graph: ir.Graph, old: ir.Value, new: ir.Value) -> None:
    """Where ``old`` is an output of ``graph``, ``new`` takes its place and its name."""
    for i, value in enumerate(graph.outputs):
        if value is old:
            name = old.name
            old.name = _ir.name_of(new) + "_loop"
            new.name = name
            graph.outputs[i] = new
