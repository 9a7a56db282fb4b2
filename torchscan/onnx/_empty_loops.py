"""The outputs of a Loop that runs no iteration, shaped as the specification wants them.

A Loop's scan outputs stack one value per iteration. After zero iterations the specification
gives each an empty leading axis and the per-iteration shape after it; onnxruntime 1.32 gives
the leading axis and every dimension it does not know statically a size of 0, so that a
``(0, B, H)`` output comes out as ``(0, 0, H)``. A ``torchscan.loop`` whose trip count may be 0
(``trip_count=T - 1``), or whose condition may be false at the start, would give a result of
the wrong shape.

This pass, run on the translated model, routes each such output through an ``If`` on its
leading size: the Loop's output when the loop ran, else zeros of shape ``(0, *step_shape)``, with
the per-iteration shape read from the model's inputs. A per-iteration dimension must be a
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
    """Route the scan outputs of every marked Loop of ``model`` through the ``If`` described
    above, in place. Returns how many outputs were routed."""
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
        (y, step)
        for y, step in zip(outputs, steps, strict=True)
        if step.shape is not None and all(_readable(d, dims) for d in step.shape.dims)
    ]
    if not routable:
        return 0
    version = loop.version
    made: list[ir.Node] = []

    def add(op: str, inputs: list[ir.Value], **attributes) -> ir.Value:
        node = ir.node(op, inputs, attributes, version=version)
        node.outputs[0].name = names.fresh(f"{loop.name or 'loop'}_{op.lower()}")
        made.append(node)
        return node.outputs[0]

    first = routable[0][0]
    count = add(
        "Gather",
        [add("Shape", [first]), add("Constant", [], value=ir.tensor(0, dtype=ir.DataType.INT64))],
        axis=0,
    )
    ran = add("Cast", [count], to=ir.DataType.BOOL)

    then_nodes, else_nodes, results = [], [], []
    for y, step in routable:
        result = ir.Value(name=names.fresh(f"{y.name}_shaped"), type=y.type, shape=y.shape)
        results.append((y, result))
        passed = ir.node("Identity", [y], version=version)
        passed.outputs[0].name = names.fresh(f"{y.name}_ran")
        then_nodes.append(passed)
        else_nodes.extend(_zeros(y, step.shape, dims, names, version))

    choice = ir.node(
        "If",
        [ran],
        {
            "then_branch": ir.Graph(
                [], [n.outputs[0] for n in then_nodes], nodes=then_nodes, name=names.fresh("ran")
            ),
            "else_branch": ir.Graph(
                [],
                [n.outputs[0] for n in else_nodes if n.meta.get("result")],
                nodes=else_nodes,
                name=names.fresh("ran_none"),
            ),
        },
        num_outputs=len(routable),
        version=version,
    )
    made.append(choice)
    for (y, result), out in zip(results, choice.outputs, strict=True):
        out.name, out.type, out.shape = result.name, y.type, y.shape
        for use in list(y.uses()):
            if use.node not in then_nodes and use.node not in made:
                use.node.replace_input_with(use.idx, out)
        _replace_graph_output(graph, y, out)
    graph.insert_after(loop, made)
    return len(routable)


def _readable(dim: object, dims: dict[str, tuple[ir.Value, int]]) -> bool:
    if isinstance(dim, int):
        return True
    return isinstance(dim, ir.SymbolicDim) and dim.value in dims


def _zeros(
    y: ir.Value,
    step_shape: ir.Shape,
    dims: dict[str, tuple[ir.Value, int]],
    names: _ir.Names,
    version: int | None,
) -> list[ir.Node]:
    """Nodes computing zeros of shape ``(0, *step_shape)`` with ``y``'s type; the last is the
    result (marked in its ``meta``)."""
    nodes: list[ir.Node] = []

    def add(op: str, inputs: list[ir.Value], **attributes) -> ir.Value:
        node = ir.node(op, inputs, attributes, version=version)
        node.outputs[0].name = names.fresh(f"{y.name}_{op.lower()}")
        nodes.append(node)
        return node.outputs[0]

    def constant(values: list[int]) -> ir.Value:
        return add("Constant", [], value=ir.tensor(values, dtype=ir.DataType.INT64))

    parts = [constant([0])]
    for dim in step_shape.dims:
        if isinstance(dim, int):
            parts.append(constant([dim]))
        else:
            source, axis = dims[dim.value]
            size = add("Gather", [add("Shape", [source]), constant([axis])], axis=0)
            parts.append(size)
    shape = add("Concat", parts, axis=0)
    zero = add("Constant", [], value=ir.tensor(0, dtype=y.dtype))
    add("Expand", [zero, shape])
    nodes[-1].meta["result"] = True
    return nodes


def _replace_graph_output(graph: ir.Graph, old: ir.Value, new: ir.Value) -> None:
    """Where ``old`` is an output of ``graph``, ``new`` takes its place and its name."""
    for i, value in enumerate(graph.outputs):
        if value is old:
            name = old.name
            old.name = new.name + "_loop"
            new.name = name
            graph.outputs[i] = new
