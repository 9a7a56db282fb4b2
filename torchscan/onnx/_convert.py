"""Converting an ONNX model down to an older opset, Scan, Loop and If bodies included.

torch.onnx builds every model at opset 18 and converts it down with onnx's version converter,
which lacks adapters for many operators and then keeps the model at opset 18. torchscan calls
:func:`convert_model` instead, which either returns a model of exactly the opset asked for or
raises :class:`OpsetConversionError`.

Every node of the default domain is moved down one *boundary* at a time: the since versions of
its operator above the target, newest first (``_schema_diff``). At a boundary ``b``, from the
operator's version ``b`` to the version in force at opset ``b - 1``, the first rule that applies
is used:

1. an operator that does not exist below ``b`` and whose inputs are all constants is evaluated
   now, with ``onnx.reference``, and its outputs become initializers;
2. an adapter registered for ``(op, b)`` in ``_convert_adapters`` rewrites the node into nodes
   valid at opset ``b - 1``: hand-written where the meaning changed, or onnx's own C++ adapter,
   run on a model of that one node, where that adapter is correct;
3. a change of allowed element types only keeps the node as it is;
4. an operator that ONNX defines as a function of other operators is replaced by that function
   body: the specification's own definition, whose nodes are then converted in turn;
5. anything else is refused.

The nodes a rule returns continue down the boundaries that remain. At the target, the element
types a node actually has are checked against the target's schema; a type the target does not
allow is computed in a wider type (a ``Cast`` before and after) only where that gives the same
result for every value. Then the node's subgraphs are converted the same way.

No rewrite approximates. Where the older opset cannot express a node exactly, for every input
the node accepts, the conversion fails and names the node, the operator and the two opsets.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.defs
import onnx.inliner
import onnx.reference
import onnx.shape_inference
import onnx.version_converter
from onnx import TensorProto, helper, numpy_helper

from torchscan._errors import ExportError, TorchscanValueError
from torchscan.onnx import _convert_adapters, _schema_diff
from torchscan.onnx._convert_adapters import attribute, constant_of_node, copy_node

MIN_TARGET_OPSET = 8
"""The oldest opset a model is converted to: ``Scan`` appeared in opset 8."""

_DEFAULT_DOMAINS = ("", "ai.onnx")
_SUBGRAPH_TYPES = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


class OpsetConversionError(ExportError):
    """A node that cannot be expressed exactly at an older opset.

    ``op`` is its operator, ``node`` its name (``""`` where it has none), ``from_version`` the
    opset whose version of the operator could not be carried over to ``to_version``, and
    ``reason`` what is missing there.
    """

    __module__ = "torchscan.onnx"

    def __init__(
        self, op: str, from_version: int, to_version: int, reason: str, node: str = ""
    ) -> None:
        self.op = op
        self.from_version = from_version
        self.to_version = to_version
        self.node = node
        self.reason = reason
        where = f" (node '{node}')" if node else ""
        super().__init__(
            f"torchscan: cannot convert {op}{where} from opset {from_version} to opset "
            f"{to_version}: {reason}. Export with a newer opset_version (at opset {from_version} "
            f"this {op} is kept as it is), or compute it in the step with operators that opset "
            f"{to_version} has."
        )


def convert_model(model: onnx.ModelProto, target_opset: int) -> onnx.ModelProto:
    """A copy of ``model`` converted to default-domain opset ``target_opset``, every graph
    included, or :class:`OpsetConversionError` where a node cannot be expressed exactly there.

    ``model`` is not changed. Model-local functions are inlined first. The IR version is lowered
    to the oldest one that knows ``target_opset``, as older runtimes read no newer one.
    """
    source = _default_opset(model)
    if target_opset < MIN_TARGET_OPSET:
        raise TorchscanValueError(
            f"opsets below {MIN_TARGET_OPSET} are not supported, but opset {target_opset} was asked"
        )
    if target_opset > source:
        raise TorchscanValueError(
            f"the model is at opset {source} and cannot be converted up to opset {target_opset}"
        )
    converted = onnx.ModelProto()
    converted.CopyFrom(model)
    if target_opset == source:
        return converted
    if converted.functions:
        converted = onnx.inliner.inline_local_functions(converted)
    converted = onnx.shape_inference.infer_shapes(converted, data_prop=True)
    Converter(converted, source, target_opset).lower_graph(converted.graph)
    _drop_stale_value_info(converted.graph)
    for opset in converted.opset_import:
        if opset.domain in _DEFAULT_DOMAINS:
            opset.version = target_opset
    converted.ir_version = min(converted.ir_version, _ir_version_for(target_opset))
    if converted.ir_version < 4:
        _declare_initializers_as_inputs(converted.graph)
    return converted


def _default_opset(model: onnx.ModelProto) -> int:
    for opset in model.opset_import:
        if opset.domain in _DEFAULT_DOMAINS:
            return opset.version
    raise TorchscanValueError("the model imports no default-domain opset")


def _ir_version_for(opset: int) -> int:
    """The oldest IR version released with ``opset`` (IR 3 came with opset 8)."""
    return max(3, min(ir for _, ir, ops, *_ in helper.VERSION_TABLE if ops >= opset))


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for found in node.attribute:
        if found.type == onnx.AttributeProto.GRAPH:
            yield found.g
        yield from found.graphs


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every graph nested in it."""
    yield graph
    for node in graph.node:
        for subgraph in _subgraphs(node):
            yield from _graphs(subgraph)


def _drop_stale_value_info(root: onnx.GraphProto) -> None:
    """Forget the shapes of values that rewrites removed."""
    for graph in _graphs(root):
        produced = {o for n in graph.node for o in n.output}
        produced |= {i.name for i in graph.input} | {i.name for i in graph.initializer}
        kept = [info for info in graph.value_info if info.name in produced]
        del graph.value_info[:]
        graph.value_info.extend(kept)


def _declare_initializers_as_inputs(root: onnx.GraphProto) -> None:
    """IR 3 requires every initializer to be a graph input; subgraphs cannot take new inputs, so
    their initializers move to the main graph, whose values every subgraph sees.

    A subgraph's output must be computed by a node of that subgraph: an initializer that is one
    (a body that emits a constant or a captured weight at every step) moves under a new name and
    the subgraph passes it on with an ``Identity``."""
    taken = _all_names(root)
    for graph in itertools.islice(_graphs(root), 1, None):
        outputs = {o.name for o in graph.output}
        copies = []
        for init in graph.initializer:
            if init.name in outputs:
                moved = _fresh_name(f"{init.name}_value", taken)
                name = _fresh_name("Identity", taken)
                copies.append(helper.make_node("Identity", [moved], [init.name], name=name))
                init.name = moved
        if copies:  # first, for the nodes of the body that read them
            nodes = [*copies, *graph.node]
            del graph.node[:]
            graph.node.extend(nodes)
        root.initializer.extend(graph.initializer)
        del graph.initializer[:]
    declared = {i.name for i in root.input}
    for init in root.initializer:
        if init.name not in declared:
            root.input.append(helper.make_tensor_value_info(init.name, init.data_type, init.dims))


def _fresh_name(base: str, taken: set[str]) -> str:
    """A name not in ``taken``, which it is added to."""
    name, counter = base, itertools.count()
    while name in taken:
        name = f"{base}_{next(counter)}"
    taken.add(name)
    return name


class _Scope:
    """The types and constant values visible in one graph; a subgraph also sees its parents'."""

    def __init__(self, graph: onnx.GraphProto, parent: _Scope | None) -> None:
        self.graph = graph
        self.parent = parent
        self.types: dict[str, onnx.TypeProto] = {}
        self.constants: dict[str, np.ndarray] = {}
        self.producers = {name: node for node in graph.node for name in node.output if name}
        for info in itertools.chain(graph.input, graph.output, graph.value_info):
            if info.type.WhichOneof("value"):
                self.types[info.name] = info.type
        for init in graph.initializer:
            self.add_constant(init.name, numpy_helper.to_array(init))
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in _DEFAULT_DOMAINS:
                value = constant_of_node(node)
                if value is not None:
                    self.add_constant(node.output[0], value)

    def add_constant(self, name: str, value: np.ndarray) -> None:
        self.constants[name] = value
        self.types.setdefault(name, _tensor_type(value))

    def find(self, table: str, name: str) -> Any:
        scope: _Scope | None = self
        while scope is not None:
            found = getattr(scope, table).get(name)
            if found is not None:
                return found
            scope = scope.parent
        return None


def _tensor_type(value: np.ndarray) -> onnx.TypeProto:
    return helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)


class Converter:
    """The walk over one model, and what adapters need from it: names, types, constants."""

    def __init__(self, model: onnx.ModelProto, source: int, target: int) -> None:
        self.source = source
        self.target = target
        self._root = model.graph
        self._taken = _all_names(model.graph)
        self._counter = itertools.count()
        self._root_scope = _Scope(model.graph, None)
        self._scope = self._root_scope

    # -- names, types and constants, for adapters ------------------------------------------------

    def fresh(self, base: str) -> str:
        """A value or node name used nowhere in the model."""
        name = base
        while name in self._taken:
            name = f"{base}_{next(self._counter)}"
        self._taken.add(name)
        return name

    def type_of(self, name: str) -> onnx.TypeProto | None:
        return self._scope.find("types", name) if name else None

    def elem_type(self, name: str) -> int | None:
        """The element type of tensor ``name``, or None where unknown."""
        found = self.type_of(name)
        if found is None or found.WhichOneof("value") != "tensor_type":
            return None
        return found.tensor_type.elem_type or None

    def shape(self, name: str) -> list[int | None] | None:
        """The dimensions of tensor ``name`` (None for one of unknown size), or None where even
        the rank is unknown."""
        value = self.const(name)
        if value is not None:
            return list(value.shape)
        found = self.type_of(name)
        if found is None or not found.tensor_type.HasField("shape"):
            return None
        return [
            d.dim_value if d.HasField("dim_value") else None for d in found.tensor_type.shape.dim
        ]

    def rank(self, name: str) -> int | None:
        shape = self.shape(name)
        return None if shape is None else len(shape)

    def set_type(
        self, name: str, elem_type: int | None, shape: Sequence[int | None] | None
    ) -> None:
        if elem_type:
            self._scope.types[name] = helper.make_tensor_type_proto(elem_type, shape)

    def const(self, name: str) -> np.ndarray | None:
        """The value of ``name`` where it is an initializer or a ``Constant``, else None."""
        return self._scope.find("constants", name) if name else None

    def producer(self, name: str) -> onnx.NodeProto | None:
        """The node of the model as given that computes ``name``, or None."""
        return self._scope.find("producers", name) if name else None

    def add_const(self, value: Any, base: str) -> str:
        """A new initializer of the main graph, which every subgraph sees; returns its name."""
        array = np.asarray(value)
        name = self.fresh(base)
        self._root.initializer.append(numpy_helper.from_array(array, name))
        self._root_scope.add_constant(name, array)
        return name

    def make_node(
        self,
        op: str,
        inputs: Sequence[str],
        outputs: Sequence[str] | None = None,
        **attributes: Any,
    ) -> onnx.NodeProto:
        """A default-domain node with a fresh name, and fresh outputs where none are given."""
        outputs = outputs if outputs is not None else [self.fresh(op.lower())]
        return helper.make_node(op, inputs, outputs, name=self.fresh(op), **attributes)

    def refuse(self, node: onnx.NodeProto, boundary: int, reason: str) -> OpsetConversionError:
        return OpsetConversionError(node.op_type, boundary, boundary - 1, reason, node.name)

    def require_const(
        self, node: onnx.NodeProto, boundary: int, index: int, what: str
    ) -> np.ndarray:
        """The constant value of input ``index``, which opset ``boundary - 1`` needs as an
        attribute."""
        value = self.const(node.input[index]) if index < len(node.input) else None
        if value is None:
            raise self.refuse(
                node, boundary, f"its input '{what}' is computed at run time, and opset "
                f"{boundary - 1} needs its value before"
            )  # fmt: skip
        return value

    def require_rank(self, node: onnx.NodeProto, boundary: int, name: str) -> int:
        rank = self.rank(name)
        if rank is None:
            raise self.refuse(node, boundary, f"the rank of '{name}' is unknown")
        return rank

    def run_onnx_adapter(self, node: onnx.NodeProto, boundary: int) -> list[onnx.NodeProto]:
        """onnx's own C++ adapter for ``boundary``, run on a model of ``node`` alone.

        Constant inputs, also those of enclosing graphs, become initializers of that model, as
        onnx's adapters read axes and sizes from initializers.
        """
        mini = self._mini_model([copy_node(node)], boundary)
        try:
            converted = onnx.version_converter.convert_version(mini, boundary - 1)
        except Exception as error:  # onnx raises RuntimeError subclasses with the assertion text
            message = str(error).split("\n")[0].split("failed: ")[-1]
            raise self.refuse(node, boundary, message) from None
        return self._splice(converted, node)

    # -- the walk --------------------------------------------------------------------------------

    def lower_graph(self, graph: onnx.GraphProto) -> None:
        outer = self._scope
        if graph is not self._root:
            self._scope = _Scope(graph, outer)
        try:
            lowered: list[onnx.NodeProto] = []
            for node in list(graph.node):
                lowered += self._lower(node, self.source, self.source)
            del graph.node[:]
            graph.node.extend(lowered)
        finally:
            self._scope = outer

    def _lower(self, node: onnx.NodeProto, level: int, crossed: int) -> list[onnx.NodeProto]:
        """``node``, valid at opset ``level``, as nodes valid at the target. ``crossed`` is the
        last boundary crossed on the way, which errors about types name."""
        if node.domain not in _DEFAULT_DOMAINS:
            self._lower_subgraphs(node)
            return [node]
        if node.op_type == "Constant":
            # later nodes may need its value, as one that adapters or expansions made
            value = constant_of_node(node)
            if value is not None:
                self._scope.add_constant(node.output[0], value)
        since = _schema_diff.since_in_force(node.op_type, level)
        if since is None:
            raise OpsetConversionError(
                node.op_type, level, self.target, f"no {node.op_type} exists at opset {level}",
                node.name,
            )  # fmt: skip
        if since <= self.target:
            return self._finish(node, since, crossed)
        rewritten, rewritten_level = self._cross(node, since)
        lowered: list[onnx.NodeProto] = []
        for new in rewritten:
            lowered += self._lower(new, rewritten_level, since)
        return lowered

    def _cross(self, node: onnx.NodeProto, boundary: int) -> tuple[list[onnx.NodeProto], int]:
        """``node`` rewritten across ``boundary``, and the opset its rewrite is valid at."""
        change = _schema_diff.classify(node.op_type, boundary)
        if change.kind == "new-op":
            folded = self._fold(node, boundary)
            if folded is not None:
                return folded, boundary - 1
        adapter = _convert_adapters.ADAPTERS.get((node.op_type, boundary))
        if adapter is not None:
            return adapter(node, self, boundary), boundary - 1
        if change.kind == "type-only":
            return [node], boundary - 1
        expanded = self._expand_function(node, boundary)
        if expanded is not None:
            return expanded
        if change.kind == "new-op":
            reason = f"{node.op_type} does not exist before opset {boundary}"
            if any(node.input):
                reason += " and its inputs are not constants"
        elif change.kind == "identical":
            reason = (
                f"{node.op_type}-{boundary} changed meaning without changing its schema, and no "
                "adapter undoes that change"
            )
        else:
            reason = f"no adapter undoes the change at {node.op_type}-{boundary} ({change.detail})"
        raise self.refuse(node, boundary, reason)

    def _finish(self, node: onnx.NodeProto, since: int, crossed: int) -> list[onnx.NodeProto]:
        """``node`` at the target: its types checked and its subgraphs converted."""
        schema = onnx.defs.get_schema(node.op_type, self.target)
        mixed = _mixed_types(node, schema, self.type_of)
        if mixed is not None:
            (a, type_a), (b, type_b) = mixed
            raise OpsetConversionError(
                node.op_type, crossed, self.target,
                f"'{a}' and '{b}' are of types {_short(type_a)} and {_short(type_b)}, and "
                f"{node.op_type}-{since} wants one type for both",
                node.name,
            )  # fmt: skip
        wrong = _type_violations(node, schema, self.type_of)
        if not wrong:
            self._lower_subgraphs(node)
            return [node]
        if node.op_type == "Constant":
            value = constant_of_node(node)
            if value is not None:
                return self._emit_constant(node.output[0], value)
        widened = self._widen(node, schema, wrong)
        if widened is None:
            param, name, type_str = wrong[0]
            allowed = sorted(_short(t) for t in _schema_diff.allowed_types(schema, param.type_str))
            raise OpsetConversionError(
                node.op_type, crossed, self.target,
                f"'{name}' is of type {_short(type_str)}, which {node.op_type}-{since} does not "
                f"allow (it allows {', '.join(allowed)}), and no wider type it allows holds "
                "every value exactly",
                node.name,
            )  # fmt: skip
        before, widened_node, after = widened
        self._lower_subgraphs(widened_node)
        # the casts are checked too: before opset 13, Cast does not take bfloat16
        cast_since = _schema_diff.since_in_force("Cast", self.target)
        lowered: list[onnx.NodeProto] = []
        for cast in before:
            lowered += self._finish(cast, cast_since, crossed)
        lowered.append(widened_node)
        for cast in after:
            lowered += self._finish(cast, cast_since, crossed)
        return lowered

    def _lower_subgraphs(self, node: onnx.NodeProto) -> None:
        for graph in _subgraphs(node):
            self.lower_graph(graph)

    # -- generic rules ---------------------------------------------------------------------------

    def _fold(self, node: onnx.NodeProto, boundary: int) -> list[onnx.NodeProto] | None:
        """Evaluate ``node`` now where all its inputs are constants: its outputs become
        initializers, and the nodes this needs are returned. None where it cannot be folded."""
        if any(a.type in _SUBGRAPH_TYPES for a in node.attribute):
            return None
        inputs = {name: self.const(name) for name in node.input if name}
        if any(value is None for value in inputs.values()):
            return None
        graph = helper.make_graph(
            [copy_node(node)],
            "fold",
            [helper.make_value_info(name, _tensor_type(v)) for name, v in inputs.items()],
            [helper.make_empty_tensor_value_info(o) for o in node.output if o],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", boundary)])
        results = onnx.reference.ReferenceEvaluator(model).run(None, inputs)
        emitted: list[onnx.NodeProto] = []
        for name, value in zip([o for o in node.output if o], results, strict=True):
            emitted += self._emit_constant(name, np.asarray(value))
        return emitted

    def _emit_constant(self, name: str, value: np.ndarray) -> list[onnx.NodeProto]:
        """Make ``name`` an initializer holding ``value``. A graph output of a subgraph must be
        computed in that subgraph, so there it becomes an ``Identity`` of a new initializer."""
        if (
            name in {o.name for o in self._scope.graph.output}
            and self._scope is not self._root_scope
        ):
            source = self.add_const(value, name)
            return [self.make_node("Identity", [source], [name])]
        self._root.initializer.append(numpy_helper.from_array(value, name))
        self._root_scope.add_constant(name, value)
        return []

    def _expand_function(
        self, node: onnx.NodeProto, boundary: int
    ) -> tuple[list[onnx.NodeProto], int] | None:
        """``node`` replaced by the function body that defines its operator in ONNX, and the
        opset of that body; None where the operator is not defined as a function."""
        schema = onnx.defs.get_schema(node.op_type, boundary)
        call = copy_node(node)
        for name, declared in schema.attributes.items():
            if attribute(call, name) is None and declared.default_value.ByteSize():
                call.attribute.append(declared.default_value)
        if schema.has_function:
            opset = _function_opset(schema.function_opset_versions, boundary)
            body = schema.get_function_with_opset_version(opset)
        elif schema.has_context_dependent_function:
            opset = _function_opset(schema.context_dependent_function_opset_versions, boundary)
            types = [self.type_of(name) for name in call.input if name]
            if any(t is None for t in types):
                return None
            body = schema.get_context_dependent_function_with_opset_version(
                opset, call.SerializeToString(), [t.SerializeToString() for t in types]
            )
        else:
            return None
        function = onnx.FunctionProto()
        function.ParseFromString(body)
        function.domain = "torchscan.expanded"
        call.domain = function.domain
        mini = self._mini_model([call], opset, functions=[function])
        return self._splice(onnx.inliner.inline_local_functions(mini), node), opset

    def _widen(
        self,
        node: onnx.NodeProto,
        schema: onnx.defs.OpSchema,
        wrong: list[tuple[onnx.defs.OpSchema.FormalParameter, str, str]],
    ) -> tuple[list[onnx.NodeProto], onnx.NodeProto, list[onnx.NodeProto]] | None:
        """``node`` computed in wider element types where that is exact: the casts before, the
        node, the casts after. None where some type has no exact wider one."""
        chosen: dict[str, tuple[int, int]] = {}
        for param, _, type_str in wrong:
            if param.type_str in chosen:
                continue
            if not type_str.startswith("tensor("):
                return None
            source = _short(type_str)
            allowed = _schema_diff.allowed_types(schema, param.type_str)
            wider = next(
                (t for t in _exact_wider_types(node.op_type, source) if f"tensor({t})" in allowed),
                None,
            )
            if wider is None:
                return None
            chosen[param.type_str] = (_ELEM_TYPES[source], _ELEM_TYPES[wider])
        widened = copy_node(node)
        before: list[onnx.NodeProto] = []
        after: list[onnx.NodeProto] = []
        cast_inputs: dict[str, str] = {}
        for param, name in _bind(schema.inputs, list(widened.input)):
            if param.type_str not in chosen or self.elem_type(name) != chosen[param.type_str][0]:
                continue
            if name not in cast_inputs:
                cast_inputs[name] = self.fresh(f"{name}_widened")
                self.set_type(cast_inputs[name], chosen[param.type_str][1], self.shape(name))
                before.append(
                    self.make_node(
                        "Cast", [name], [cast_inputs[name]], to=chosen[param.type_str][1]
                    )
                )
        for i, name in enumerate(widened.input):
            widened.input[i] = cast_inputs.get(name, name)
        for param, name in _bind(schema.outputs, list(widened.output)):
            if param.type_str not in chosen:
                continue
            narrow, wide = chosen[param.type_str]
            wide_name = self.fresh(f"{name}_widened")
            self.set_type(wide_name, wide, self.shape(name))
            widened.output[list(widened.output).index(name)] = wide_name
            after.append(self.make_node("Cast", [wide_name], [name], to=narrow))
        return before, widened, after

    # -- one-node models -------------------------------------------------------------------------

    def _mini_model(
        self,
        nodes: list[onnx.NodeProto],
        opset: int,
        functions: Sequence[onnx.FunctionProto] = (),
    ) -> onnx.ModelProto:
        """A model of ``nodes`` alone: constant inputs as initializers, the others as graph
        inputs of the types known here, the outputs of the first node as graph outputs."""
        produced = {o for n in nodes for o in n.output}
        inputs, initializers = [], []
        for name in dict.fromkeys(i for n in nodes for i in n.input if i and i not in produced):
            value = self.const(name)
            if value is not None:
                initializers.append(numpy_helper.from_array(value, name))
            else:
                known = self.type_of(name)
                inputs.append(helper.make_value_info(name, known or onnx.TypeProto()))
        outputs = [
            helper.make_value_info(o, self.type_of(o) or onnx.TypeProto())
            for o in nodes[0].output
            if o
        ]
        graph = helper.make_graph(nodes, "node", inputs, outputs, initializer=initializers)
        imports = [helper.make_opsetid("", opset)]
        imports += [helper.make_opsetid(f.domain, 1) for f in functions]
        return helper.make_model(graph, opset_imports=imports, functions=functions)

    def _splice(self, model: onnx.ModelProto, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        """The nodes of a converted one-node model, renamed into this model: the inputs and
        outputs of ``node`` keep their names, every other value gets a fresh one."""
        graph = model.graph
        kept = {name for name in itertools.chain(node.input, node.output) if name}
        renamed: dict[str, str] = {}
        for init in graph.initializer:
            if init.name in kept and self.const(init.name) is not None:
                continue
            renamed[init.name] = self.add_const(numpy_helper.to_array(init), init.name)
        for produced in itertools.chain.from_iterable(n.output for n in graph.node):
            if produced and produced not in kept and produced not in renamed:
                renamed[produced] = self.fresh(produced)
        for info in onnx.shape_inference.infer_shapes(model).graph.value_info:
            if info.name in renamed:
                self._scope.types[renamed[info.name]] = info.type
        nodes = list(graph.node)
        for new in nodes:
            _rename(new, renamed)
            # a node that stays one node keeps its name
            if not (len(nodes) == 1 and new.name == node.name):
                new.name = self.fresh(new.name or f"{node.name}_{new.op_type}")
        return nodes


def _rename(node: onnx.NodeProto, renamed: dict[str, str]) -> None:
    """Rename the inputs and outputs of ``node``, and the outer values its subgraphs read."""
    for i, name in enumerate(node.input):
        node.input[i] = renamed.get(name, name)
    for i, name in enumerate(node.output):
        node.output[i] = renamed.get(name, name)
    for graph in _subgraphs(node):
        for inner in graph.node:
            _rename(inner, renamed)
        for output in graph.output:
            output.name = renamed.get(output.name, output.name)


def _all_names(root: onnx.GraphProto) -> set[str]:
    names: set[str] = set()
    for graph in _graphs(root):
        names.update(v.name for v in itertools.chain(graph.input, graph.output, graph.value_info))
        names.update(i.name for i in graph.initializer)
        for node in graph.node:
            names.update(node.input)
            names.update(node.output)
            names.add(node.name)
    return names


def _function_opset(versions: Iterable[int], since: int) -> int:
    """The opset of the function body to expand an operator of version ``since`` with: the
    oldest one that is not older than the operator."""
    versions = sorted(versions)
    return next((v for v in versions if v >= since), versions[-1])


def _bind(
    params: Sequence[onnx.defs.OpSchema.FormalParameter], names: list[str]
) -> list[tuple[onnx.defs.OpSchema.FormalParameter, str]]:
    """The formal parameter each present input or output of a node is bound to."""
    bound: list[tuple[onnx.defs.OpSchema.FormalParameter, str]] = []
    for i, param in enumerate(params):
        if param.option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
            bound += [(param, name) for name in names[i:]]
            break
        if i < len(names):
            bound.append((param, names[i]))
    return [(param, name) for param, name in bound if name]


def _type_violations(
    node: onnx.NodeProto,
    schema: onnx.defs.OpSchema,
    type_of: Callable[[str], onnx.TypeProto | None],
) -> list[tuple[onnx.defs.OpSchema.FormalParameter, str, str]]:
    """The inputs and outputs of ``node`` whose known type ``schema`` does not allow."""
    wrong = []
    bindings = _bind(schema.inputs, list(node.input)) + _bind(schema.outputs, list(node.output))
    for param, name in bindings:
        found = type_of(name)
        type_str = _schema_diff.type_string(found) if found is not None else None
        if type_str is not None and type_str not in _schema_diff.allowed_types(
            schema, param.type_str
        ):
            wrong.append((param, name, type_str))
    return wrong


def _mixed_types(
    node: onnx.NodeProto,
    schema: onnx.defs.OpSchema,
    type_of: Callable[[str], onnx.TypeProto | None],
) -> tuple[tuple[str, str], tuple[str, str]] | None:
    """Two values of ``node`` bound to one type parameter of ``schema`` whose known types
    differ, or None."""
    seen: dict[str, tuple[str, str]] = {}
    bindings = _bind(schema.inputs, list(node.input)) + _bind(schema.outputs, list(node.output))
    for param, name in bindings:
        if param.option == onnx.defs.OpSchema.FormalParameterOption.Variadic and not (
            param.is_homogeneous
        ):
            continue
        found = type_of(name)
        type_str = _schema_diff.type_string(found) if found is not None else None
        if type_str is None:
            continue
        first = seen.setdefault(param.type_str, (name, type_str))
        if first[1] != type_str:
            return first, (name, type_str)
    return None


def _short(type_str: str) -> str:
    return type_str.removeprefix("tensor(").removesuffix(")")


_ELEM_TYPES = {_schema_diff.tensor_type_name(t): t for t in TensorProto.DataType.values() if t}

# Operators whose result is one of their inputs' values, or a comparison of them: computed on
# values converted exactly to a wider type, they give the same result.
_SELECTING = frozenset(
    {
        "ArgMax", "ArgMin", "Clip", "Concat", "Equal", "Expand", "Flatten", "Gather", "Greater",
        "Identity", "Less", "Max", "Min", "Pad", "ReduceMax", "ReduceMin", "Relu", "Reshape",
        "Sign", "Slice", "Split", "Squeeze", "Tile", "TopK", "Transpose", "Unsqueeze", "Where",
    }
)  # fmt: skip

# Operators that are sums and products of integers. Integer arithmetic wraps around modulo
# 2**bits, and casting down to fewer bits keeps the residue, so any wider integer type gives the
# same result.
_INTEGER_ARITHMETIC = frozenset(
    {"Abs", "Add", "CumSum", "Div", "Gemm", "MatMul", "Mul", "Neg", "ReduceProd", "ReduceSum",
     "Sub", "Sum"}
)  # fmt: skip

# Operators with one rounding per result: computing a float16 one in float and rounding back
# gives the correctly rounded float16 result, as float has more than twice float16's precision.
_ONE_ROUNDING = frozenset({"Abs", "Add", "Div", "Mul", "Neg", "Sub"})

# onnxruntime implements Clip-6 and Clip-11 for float only.
_ONLY_WIDER = {"Clip": ["float"]}

_INTEGERS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]


def _exact_wider_types(op: str, source: str) -> list[str]:
    """The types ``op`` can compute a ``source`` tensor in with the same result, preferred
    first."""
    if op in _SELECTING:
        wider = _convert_adapters.VALUE_PRESERVING.get(source, [])
        return [t for t in wider if t in _ONLY_WIDER.get(op, wider)]
    if op in _INTEGER_ARITHMETIC and source in _INTEGERS:
        bits = np.iinfo(source).bits
        return [t for t in _INTEGERS if np.iinfo(t).bits > bits]
    if op in _ONE_ROUNDING and source in ("float16", "bfloat16"):
        return ["float", "double"]
    return []
