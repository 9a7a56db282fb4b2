"""The walk over every node of a model, moving each across the boundaries of its operator with
the first rule that applies (see the package's docstring), and the generic rules: folding,
function expansion, and the check and widening of element types at the target.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import numpy as np
import onnx
import onnx.defs
import onnx.inliner
import onnx.reference
import onnx_ir as ir

from torchscan.onnx import _ir, _schema_diff
from torchscan.onnx._export._convert import (  # noqa: F401  (importing them registers their adapters)
    _ops_control,
    _ops_einsum,
    _ops_gather,
    _ops_math,
    _ops_nn,
    _ops_reduce,
    _ops_shape,
    _ops_tensor,
)
from torchscan.onnx._export._convert._context import (
    VALUE_PRESERVING,
    Builder,
    Context,
    OpsetConversionError,
    constant_of_node,
    is_present,
    replace_graph_output,
)
from torchscan.onnx._export._convert._registry import registry

_Binding = tuple[onnx.defs.OpSchema.FormalParameter, ir.Value]


class _FunctionSchema(Protocol):
    """The function bodies of an ``OpSchema``, which onnx's stub of the class leaves out."""

    @property
    def has_function(self) -> bool: ...
    @property
    def function_opset_versions(self) -> list[int]: ...
    def get_function_with_opset_version(self, opset: int, /) -> bytes: ...
    @property
    def has_context_dependent_function(self) -> bool: ...
    @property
    def context_dependent_function_opset_versions(self) -> list[int]: ...
    def get_context_dependent_function_with_opset_version(
        self, opset: int, node: bytes, input_types: Sequence[bytes], /
    ) -> bytes: ...


class Converter(Context):
    """The conversion of one model, graph by graph, node by node."""

    # -- the walk --------------------------------------------------------------------------------

    def lower_graph(self, graph: ir.Graph) -> None:
        for node in list(graph):
            self._lower(node, self.source, self.source)

    def _lower(self, node: ir.Node, level: int, crossed: int) -> None:
        """``node``, valid at opset ``level``, rewritten into nodes valid at the target.
        ``crossed`` is the last boundary crossed on the way, which errors about types name."""
        if node.domain not in _ir.DEFAULT_DOMAINS:
            self._lower_subgraphs(node)
            return
        since = _schema_diff.since_in_force(node.op_type, level)
        if since is None:
            raise OpsetConversionError(
                node.op_type, level, self.target_opset,
                f"no {node.op_type} exists at opset {level}", node.name or "",
            )  # fmt: skip
        if since <= self.target_opset:
            self._finish(node, since, crossed)
            return
        rewritten, rewritten_level = self._cross(node, since)
        for new in rewritten:
            self._lower(new, rewritten_level, since)

    def _cross(self, node: ir.Node, boundary: int) -> tuple[list[ir.Node], int]:
        """``node`` rewritten across ``boundary`` in its graph: the nodes that are now there
        instead, and the opset they are valid at."""
        self.take_replacements()
        change = _schema_diff.classify(node.op_type, boundary)
        if change.kind == "new-op":
            folded = self._fold(node, boundary)
            if folded is not None:
                return self._apply(node, folded), boundary - 1
        adapter = registry.lookup(node.domain, node.op_type, boundary)
        if adapter is not None:
            return self._apply(node, adapter(node, self, boundary)), boundary - 1
        if change.kind == "type-only":
            return [node], boundary - 1
        expanded = self._expand_function(node, boundary)
        if expanded is not None:
            nodes, opset = expanded
            return self._apply(node, nodes), opset
        if change.kind == "new-op":
            reason = f"{node.op_type} does not exist before opset {boundary}"
            if any(v is not None for v in node.inputs):
                reason += " and its inputs are not constants"
        elif change.kind == "identical":
            reason = (
                f"{node.op_type}-{boundary} changed meaning without changing its schema, and no "
                "adapter undoes that change"
            )
        else:
            reason = f"no adapter undoes the change at {node.op_type}-{boundary} ({change.detail})"
        raise self.refuse(node, boundary, reason)

    def _apply(self, node: ir.Node, nodes: list[ir.Node]) -> list[ir.Node]:
        """Put ``nodes`` in the graph of ``node`` in its place: around it where they include it,
        which then stays, else instead of it. The values they replace are replaced."""
        graph = node.graph
        assert graph is not None  # the nodes converted are those of a graph
        anchor = None
        for new in nodes:
            if new is node:
                anchor = node
            elif anchor is None:
                graph.insert_before(node, new)
            else:
                graph.insert_after(anchor, new)
                anchor = new
        for old, new in self.take_replacements().items():
            computing = new.producer()
            for use in list(old.uses()):
                if use.node is not computing:
                    use.node.replace_input_with(use.idx, new)
            replace_graph_output(old, new)
        if node not in nodes:
            graph.remove(node, safe=True)
        return nodes

    def _finish(self, node: ir.Node, since: int, crossed: int) -> None:
        """``node`` at the target: its types checked and its subgraphs converted."""
        schema = onnx.defs.get_schema(node.op_type, self.target_opset)
        mixed = _mixed_types(node, schema, self.type_of)
        if mixed is not None:
            (a, type_a), (b, type_b) = mixed
            raise OpsetConversionError(
                node.op_type, crossed, self.target_opset,
                f"'{a}' and '{b}' are of types {_short(type_a)} and {_short(type_b)}, and "
                f"{node.op_type}-{since} wants one type for both",
                node.name or "",
            )  # fmt: skip
        wrong = _type_violations(node, schema, self.type_of)
        if not wrong:
            self._lower_subgraphs(node)
            return
        if node.op_type == "Constant":
            value = constant_of_node(node)
            if value is not None:
                self.take_replacements()
                self._apply(node, self._emit_constant(node, node.outputs[0], value))
                return
        widened = self._widen(node, schema, wrong)
        if widened is None:
            param, value, type_str = wrong[0]
            allowed = sorted(_short(t) for t in _schema_diff.allowed_types(schema, param.type_str))
            raise OpsetConversionError(
                node.op_type, crossed, self.target_opset,
                f"'{value.name}' is of type {_short(type_str)}, which {node.op_type}-{since} does "
                f"not allow (it allows {', '.join(allowed)}), and no wider type it allows holds "
                "every value exactly",
                node.name or "",
            )  # fmt: skip
        before, after = widened
        self._apply(node, [*before, node, *after])
        self._lower_subgraphs(node)
        # the casts are checked too: before opset 13, Cast does not take bfloat16
        cast_since = _schema_diff.since_in_force("Cast", self.target_opset)
        assert cast_since is not None  # Cast exists at every opset
        for cast in [*before, *after]:
            self._finish(cast, cast_since, crossed)

    def _lower_subgraphs(self, node: ir.Node) -> None:
        for graph in _ir.subgraphs(node):
            self.lower_graph(graph)

    # -- generic rules ---------------------------------------------------------------------------

    def _fold(self, node: ir.Node, boundary: int) -> list[ir.Node] | None:
        """Evaluate ``node`` now where all its inputs are constants: its outputs become
        initializers, and the nodes this needs are returned. None where it cannot be folded."""
        if any(True for _ in _ir.subgraphs(node)):
            return None
        inputs = {_ir.name_of(v): (v, self.const(v)) for v in node.inputs if v is not None}
        if any(value is None for _, value in inputs.values()):
            return None
        graph = onnx.GraphProto(
            name="fold",
            node=[ir.serde.serialize_node(node)],
            input=[self.value_info(v) for v, _ in inputs.values()],
            output=[onnx.ValueInfoProto(name=v.name) for v in node.outputs if is_present(v)],
        )
        model = onnx.ModelProto(
            ir_version=onnx.IR_VERSION,
            graph=graph,
            opset_import=[onnx.OperatorSetIdProto(domain="", version=boundary)],
        )
        feeds = {name: value for name, (_, value) in inputs.items()}
        results = onnx.reference.ReferenceEvaluator(model).run(None, feeds)
        emitted: list[ir.Node] = []
        outputs = [v for v in node.outputs if is_present(v)]
        for output, value in zip(outputs, results, strict=True):
            emitted += self._emit_constant(node, output, np.asarray(value))
        return emitted

    def _emit_constant(self, node: ir.Node, output: ir.Value, value: np.ndarray) -> list[ir.Node]:
        """Make ``output`` of ``node`` an initializer holding ``value``. A graph output of a
        subgraph must be computed in that subgraph, so there it becomes an ``Identity`` of a new
        initializer."""
        if node.graph is not self.root and output.is_graph_output():
            source = self.add_const(value, _ir.name_of(output))
            b = Builder(self)
            b.op("Identity", [source], None, output=output)
            return b.nodes
        name = _ir.name_of(output)
        output.name = None
        constant = self.register_const(value, name)
        for use in list(output.uses()):
            use.node.replace_input_with(use.idx, constant)
        replace_graph_output(output, constant)
        return []

    def _expand_function(self, node: ir.Node, boundary: int) -> tuple[list[ir.Node], int] | None:
        """``node`` replaced by the function body that defines its operator in ONNX, and the
        opset of that body; None where the operator is not defined as a function."""
        schema = onnx.defs.get_schema(node.op_type, boundary)
        functions = typing.cast(_FunctionSchema, schema)
        call = ir.serde.serialize_node(node)
        for name, declared in schema.attributes.items():
            if name not in node.attributes and declared.default_value.ByteSize():
                call.attribute.append(declared.default_value)
        if functions.has_function:
            opset = _function_opset(functions.function_opset_versions, boundary)
            body = functions.get_function_with_opset_version(opset)
        elif functions.has_context_dependent_function:
            opset = _function_opset(functions.context_dependent_function_opset_versions, boundary)
            read = [v for v in node.inputs if v is not None]
            if any(self.type_of(v) is None for v in read):
                return None
            body = functions.get_context_dependent_function_with_opset_version(
                opset,
                call.SerializeToString(),
                [self.value_info(v).type.SerializeToString() for v in read],
            )
        else:
            return None
        function = onnx.FunctionProto()
        function.ParseFromString(body)
        function.domain = "torchscan.expanded"
        call.domain = function.domain
        mini = self.mini_model([call], node.inputs, node.outputs, opset, functions=[function])
        return self.splice(onnx.inliner.inline_local_functions(mini), node), opset

    def _widen(
        self,
        node: ir.Node,
        schema: onnx.defs.OpSchema,
        wrong: list[tuple[onnx.defs.OpSchema.FormalParameter, ir.Value, str]],
    ) -> tuple[list[ir.Node], list[ir.Node]] | None:
        """``node`` computed in wider element types where that is exact: it reads and writes
        the wider types in place, and the casts before and after it are returned. None, with
        ``node`` unchanged, where some type has no exact wider one."""
        chosen: dict[str, tuple[ir.DataType, ir.DataType]] = {}
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
        before, after = Builder(self), Builder(self)
        cast_inputs: dict[ir.Value, ir.Value] = {}
        for param, value in _bind(schema.inputs, list(node.inputs)):
            if param.type_str not in chosen or self.elem_type(value) != chosen[param.type_str][0]:
                continue
            if value not in cast_inputs:
                wide = chosen[param.type_str][1]
                cast = before.op("Cast", [value], wide, self.shape(value), to=wide)
                cast.name = self.fresh(f"{value.name}_widened")
                cast_inputs[value] = cast
        for i, value in enumerate(node.inputs):
            if value in cast_inputs:
                node.replace_input_with(i, cast_inputs[value])
        for param, value in _bind(schema.outputs, list(node.outputs)):
            if param.type_str not in chosen:
                continue
            narrow, wide = chosen[param.type_str]
            shape = self.shape(value)
            after.op("Cast", [value], None, output=value, to=narrow)
            value.name = self.fresh(f"{value.name}_widened")
            self.set_type(value, wide, shape)
        return before.nodes, after.nodes


def _function_opset(versions: Iterable[int], since: int) -> int:
    """The opset of the function body to expand an operator of version ``since`` with: the
    oldest one that is not older than the operator."""
    versions = sorted(versions)
    return next((v for v in versions if v >= since), versions[-1])


def _bind(
    params: Sequence[onnx.defs.OpSchema.FormalParameter], values: list[ir.Value | None]
) -> list[_Binding]:
    """The formal parameter each present input or output of a node is bound to."""
    bound: list[tuple[onnx.defs.OpSchema.FormalParameter, ir.Value | None]] = []
    for i, param in enumerate(params):
        if param.option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
            bound += [(param, value) for value in values[i:]]
            break
        if i < len(values):
            bound.append((param, values[i]))
    return [(param, value) for param, value in bound if is_present(value)]


def _bindings(node: ir.Node, schema: onnx.defs.OpSchema) -> list[_Binding]:
    return _bind(schema.inputs, list(node.inputs)) + _bind(schema.outputs, list(node.outputs))


def _type_violations(
    node: ir.Node,
    schema: onnx.defs.OpSchema,
    type_of: Callable[[ir.Value], ir.TypeProtocol | None],
) -> list[tuple[onnx.defs.OpSchema.FormalParameter, ir.Value, str]]:
    """The inputs and outputs of ``node`` whose known type ``schema`` does not allow."""
    wrong = []
    for param, value in _bindings(node, schema):
        found = type_of(value)
        type_str = _schema_diff.type_string(found) if found is not None else None
        if type_str is not None and type_str not in _schema_diff.allowed_types(
            schema, param.type_str
        ):
            wrong.append((param, value, type_str))
    return wrong


def _mixed_types(
    node: ir.Node,
    schema: onnx.defs.OpSchema,
    type_of: Callable[[ir.Value], ir.TypeProtocol | None],
) -> tuple[tuple[str, str], tuple[str, str]] | None:
    """Two values of ``node`` bound to one type parameter of ``schema`` whose known types
    differ, as (name, type) pairs, or None."""
    seen: dict[str, tuple[str, str]] = {}
    for param, value in _bindings(node, schema):
        if param.option == onnx.defs.OpSchema.FormalParameterOption.Variadic and not (
            param.is_homogeneous
        ):
            continue
        found = type_of(value)
        type_str = _schema_diff.type_string(found) if found is not None else None
        if type_str is None:
            continue
        name = _ir.name_of(value)
        first = seen.setdefault(param.type_str, (name, type_str))
        if first[1] != type_str:
            return first, (name, type_str)
    return None


def _short(type_str: str) -> str:
    return type_str.removeprefix("tensor(").removesuffix(")")


_ELEM_TYPES = {t.name.lower(): t for t in ir.DataType if t != ir.DataType.UNDEFINED}

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
        wider = VALUE_PRESERVING.get(source, [])
        return [t for t in wider if t in _ONLY_WIDER.get(op, wider)]
    if op in _INTEGER_ARITHMETIC and source in _INTEGERS:
        bits = np.iinfo(source).bits
        return [t for t in _INTEGERS if np.iinfo(t).bits > bits]
    if op in _ONE_ROUNDING and source in ("float16", "bfloat16"):
        return ["float", "double"]
    return []
