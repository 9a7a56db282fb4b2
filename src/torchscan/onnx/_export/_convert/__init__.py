"""Converting an ONNX model down to an older opset, Scan, Loop and If bodies included.

torch.onnx builds every model at opset 18 and converts it down with onnx's version converter,
which lacks adapters for many operators and then keeps the model at opset 18. torchscan calls
:func:`convert_model` instead, which either returns a model of exactly the opset asked for or
raises :class:`OpsetConversionError`. The model is an ``onnx_ir`` model throughout.

Every node of the default domain is moved down one *boundary* at a time: the since versions of
its operator above the target, newest first (``_schema_diff``). At a boundary ``b``, from the
operator's version ``b`` to the version in force at opset ``b - 1``, the first rule that applies
is used:

1. an operator that does not exist below ``b`` and whose inputs are all constants is evaluated
   now, with ``onnx.reference``, and its outputs become initializers;
2. an adapter registered for ``("", op, b)`` in the registry (``_registry``): the attribute
   ``version_b`` of the one class that declares every adapter of ``op``, in an ``_ops_*``
   module; it rewrites the node into nodes valid at opset ``b - 1``: hand-written where the
   meaning changed, or onnx's own C++ adapter, run on a model of that one node, where that
   adapter is correct;
3. a change of allowed element types only keeps the node as it is;
4. an operator that ONNX defines as a function of other operators is replaced by that function
   body: the specification's own definition, whose nodes are then converted in turn;
5. anything else is refused.

The nodes a rule returns continue down the boundaries that remain. At the target, the element
types a node actually has are checked against the target's schema; a type the target does not
allow is computed in a wider type (a ``Cast`` before and after) only where that gives the same
result for every value. Then the node's subgraphs are converted the same way (``_converter``).

No rewrite approximates. Where the older opset cannot express a node exactly, for every input
the node accepts, the conversion fails and names the node, the operator and the two opsets.

The modules: ``_context`` holds what adapters read (the :class:`Context`), the one way they make
nodes (``Builder``) and the refusal; ``_registry`` the adapters' registry and the decorator
``adapters`` that declares an operator's adapters; the ``_ops_*`` modules the classes that
declare them, one module for each family of operators, each operator in one class: ``_ops_reduce``
(ReduceSum and the other reductions, ArgMax, ArgMin, TopK), ``_ops_shape`` (Squeeze, Unsqueeze,
Flatten, Concat, Split, Reshape, Shape, DepthToSpace, Slice, Pad), ``_ops_tensor`` (Constant,
ConstantOfShape, CastLike), ``_ops_gather`` (Gather, Scatter, ScatterElements, OneHot, Compress,
GatherElements, GatherND, ScatterND, Where), ``_ops_math`` (Equal, Less, Greater, IsInf, Min,
Max, Clip, Mod, Pow, Gemm, Trilu), ``_ops_nn`` (Conv, ConvTranspose, the pools,
BatchNormalization, GRU, LSTM, RNN, Dropout, Softmax, LogSoftmax, Hardmax, Resize, Upsample),
``_ops_control`` (If, Loop, Scan, Range, CumSum) and ``_ops_einsum`` (Einsum); ``_helpers`` the
rewrites that several operators' classes share (onnx's own adapter, axes counted from the front,
attributes added with a neutral default, inputs that were attributes); ``_blocks`` the building
blocks adapters of several families compose (int64 lengths, strides and indices computed when
the model runs, ``Range`` as a ``Loop``); ``_converter`` the walk and the generic rules; this
module the steps on the whole model.
"""

from __future__ import annotations

import itertools

import onnx_ir as ir
from onnx_ir.passes.common import InlinePass

from torchscan._errors import TorchscanValueError
from torchscan.onnx import _ir, _opsets
from torchscan.onnx._export._convert._context import OpsetConversionError, as_tensor
from torchscan.onnx._export._convert._converter import Converter

__all__ = ["OpsetConversionError", "convert_model"]


def convert_model(model: ir.Model, target_opset: int, *, in_place: bool = False) -> ir.Model:
    """``model`` converted to default-domain opset ``target_opset``, every graph included, or
    :class:`OpsetConversionError` where a node cannot be expressed exactly there.

    A copy is converted and returned, and ``model`` is not changed; with ``in_place=True``,
    ``model`` itself is converted and returned (and left partly converted where the conversion
    fails). Model-local functions are inlined first. The IR version is lowered to the oldest one
    that knows ``target_opset``, as older runtimes read no newer one.
    """
    source = _ir.default_opset(model.opset_imports)
    if source is None:
        raise TorchscanValueError("the model imports no default-domain opset")
    _opsets.check_opset(target_opset)
    if target_opset > source:
        raise TorchscanValueError(
            f"the model is at opset {source} and cannot be converted up to opset {target_opset}"
        )
    converted = model if in_place else model.clone()
    if target_opset == source:
        return converted
    if converted.functions:
        InlinePass()(converted)
    unread = {init for _, init in _unread_initializers(converted.graph)}
    Converter(converted, source, target_opset).lower_graph(converted.graph)
    # the constants that rewrites stopped reading (a Pad's pads, now an attribute) or made and
    # did not read in the end go; those the model itself did not read stay
    for graph, init in _unread_initializers(converted.graph):
        if init not in unread:
            graph.initializers.pop(_ir.name_of(init))
    # The values that rewrites removed left the graph with the nodes that computed them, and
    # their shapes with them: no stale shape remains to drop.
    for domain in list(converted.opset_imports):
        if _ir.is_default_domain(domain):
            converted.opset_imports[domain] = target_opset
    converted.ir_version = min(converted.ir_version, _opsets.ir_version_for(target_opset))
    if converted.ir_version < 4:
        _declare_initializers_as_inputs(converted.graph)
    return converted


def _unread_initializers(root: ir.Graph) -> list[tuple[ir.Graph, ir.Value]]:
    """The initializers of ``root`` and of its subgraphs that no node reads and that are no
    input or output of their graph, each with its graph."""
    return [
        (graph, init)
        for graph in _ir.graphs(root)
        for init in graph.initializers.values()
        if not init.uses() and not init.is_graph_input() and not init.is_graph_output()
    ]


def _declare_initializers_as_inputs(root: ir.Graph) -> None:
    """IR 3 requires every initializer to be a graph input; subgraphs cannot take new inputs, so
    their initializers move to the main graph, whose values every subgraph sees.

    A subgraph's output must be computed by a node of that subgraph: an initializer that is one
    (a body that emits a constant or a captured weight at every step) moves under a new name and
    the subgraph passes it on with an ``Identity``."""
    names = _ir.Names.of(root)
    for graph in list(itertools.islice(_ir.graphs(root), 1, None)):
        copies = []
        for init in list(graph.initializers.values()):
            graph.initializers.pop(_ir.name_of(init))
            if init.is_graph_output():
                # a new value, as a model and its copies share their tensors, names included
                moved = names.fresh(f"{init.name}_value")
                value = ir.Value(
                    name=moved,
                    type=init.type,
                    shape=init.shape,
                    const_value=as_tensor(_tensor_of(init).numpy(), moved),
                )
                copy = ir.Node("", "Identity", [value], name=names.fresh("Identity"))
                passed = copy.outputs[0]
                passed.name, passed.type, passed.shape = init.name, init.type, init.shape
                for i, output in enumerate(graph.outputs):
                    if output is init:
                        graph.outputs[i] = passed
                init.replace_all_uses_with(value)
                copies.append(copy)
                init = value
            root.register_initializer(init)
        if copies:  # first, for the nodes of the body that read them
            if len(graph):
                graph.insert_before(graph[0], copies)
            else:
                graph.extend(copies)
    declared = set(root.inputs)
    for init in root.initializers.values():
        if init not in declared:
            if init.type is None:
                init.type = ir.TensorType(_tensor_of(init).dtype)
            if init.shape is None:
                # a tensor's dims are all ints
                init.shape = ir.Shape(_tensor_of(init).shape.numpy())
            root.inputs.append(init)


def _tensor_of(init: ir.Value) -> ir.TensorProtocol:
    """The tensor of an initializer, which every initializer holds."""
    assert init.const_value is not None, f"initializer {init.name!r} without a tensor"
    return init.const_value
