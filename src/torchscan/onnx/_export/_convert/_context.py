"""What adapters read and make while a model is converted: the :class:`Context`, its refusal
(:class:`OpsetConversionError`), and helpers for the attributes and constants of ``onnx_ir``
nodes.

Adapters read types, shapes and constant values from the context, and make new values and
initializers with it; they make nodes with a :class:`Builder` only. An adapter either changes the
node it is given in place and returns it among its nodes, or returns nodes that replace it: a
node made with ``outputs=[v]`` (or ``output=v``), ``v`` an output of the node given, computes the
value that every reader of ``v`` then reads, under ``v``'s name and type. The converter
(``_converter``) puts the nodes in the graph and makes those replacements.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, TypeGuard

import numpy as np
import onnx
import onnx.shape_inference
import onnx.version_converter
import onnx_ir as ir

from torchscan import _compat
from torchscan._errors import ExportError
from torchscan.onnx import _ir, _schema_diff


class OpsetConversionError(ExportError):
    """A node that cannot be expressed exactly at an older opset.

    ``op`` is its operator, ``node`` its name (``""`` where it has none), ``from_version`` the
    opset whose version of the operator could not be carried over to ``target_opset``, and
    ``reason`` what is missing there.
    """

    __module__ = "torchscan.onnx"

    def __init__(
        self, op: str, from_version: int, target_opset: int, reason: str, node: str = ""
    ) -> None:
        self.op = op
        self.from_version = from_version
        self.target_opset = target_opset
        self.node = node
        self.reason = reason
        where = f" (node '{node}')" if node else ""
        super().__init__(
            f"torch.onnx.export: cannot convert {op}{where} from opset {from_version} to opset "
            f"{target_opset}: {reason}. Export with a newer opset_version (at opset {from_version} "
            f"this {op} is kept as it is), or compute it in the step with operators that opset "
            f"{target_opset} has."
        )


# -- node helpers ---------------------------------------------------------------------------------


def attribute(node: ir.Node, name: str, default: Any = None) -> Any:
    """The value of attribute ``name`` of ``node`` (lists as lists), or ``default``."""
    found = node.attributes.get(name)
    if found is None or found.is_ref():
        return default
    value = found.value
    if found.type in (
        ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS
    ):  # fmt: skip
        return list(value)
    return value


def make_attribute(name: str, value: Any) -> ir.Attr:
    """An attribute of the type ``value`` has: an empty list is one of ints."""
    if isinstance(value, ir.Attr):
        return value
    if isinstance(value, np.ndarray):
        return ir.AttrTensor(name, as_tensor(value))
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, (int, np.integer)) for v in value):
            return ir.AttrInt64s(name, [int(v) for v in value])
        if all(isinstance(v, (int, float, np.number)) for v in value):
            return ir.AttrFloat32s(name, [float(v) for v in value])
    if isinstance(value, (bool, int, np.integer)):
        return ir.AttrInt64(name, int(value))
    if isinstance(value, (float, np.floating)):
        return ir.AttrFloat32(name, float(value))
    return ir.convenience.convert_attribute(name, value)


def set_attribute(node: ir.Node, name: str, value: Any) -> None:
    node.attributes[name] = make_attribute(name, value)


def remove_attribute(node: ir.Node, name: str) -> None:
    node.attributes.pop(name, None)


def present_inputs(node: ir.Node) -> list[ir.Value | None]:
    """The inputs of ``node`` without the omitted optional ones at the end."""
    inputs = list(node.inputs)
    while inputs and inputs[-1] is None:
        inputs.pop()
    return inputs


def given(node: ir.Node, index: int) -> ir.Value | None:
    """Input ``index`` of ``node``, or None where it is omitted."""
    return node.inputs[index] if index < len(node.inputs) else None


def required(node: ir.Node, index: int) -> ir.Value:
    """Input ``index`` of ``node``, one that its operator requires: there in every valid model."""
    value = node.inputs[index]
    assert value is not None, f"{node.op_type} '{node.name}' lacks its required input {index}"
    return value


def is_present(value: ir.Value | None) -> TypeGuard[ir.Value]:
    """Whether an input or output is there: omitted outputs have no name."""
    return value is not None and bool(value.name)


def constant_of_node(node: ir.Node) -> np.ndarray | None:
    """The value of a ``Constant`` node, or None for one that holds no tensor."""
    for name, found in node.attributes.items():
        if found.is_ref():
            continue
        if name == "value":
            return found.as_tensor().numpy()
        if name == "sparse_value":
            return _dense(found.value)
        if name in ("value_float", "value_floats"):
            return np.array(found.value, dtype=np.float32)
        if name in ("value_int", "value_ints"):
            return np.array(found.value, dtype=np.int64)
        if name in ("value_string", "value_strings"):
            return np.array(found.value, dtype=object)
    return None


def _dense(sparse: Any) -> np.ndarray:
    values = np.asarray(sparse.values.numpy())
    indices = np.asarray(sparse.indices.numpy())
    dims = tuple(sparse.dims)
    dense = np.zeros(int(np.prod(dims)), dtype=values.dtype)
    if indices.ndim == 2:  # one row of coordinates per value
        indices = np.ravel_multi_index(tuple(indices.T), dims)
    dense[indices] = values
    return dense.reshape(dims)


# Wider types that hold every value of a type exactly, preferred first. int64 and uint64 have
# none: a double holds integers exactly only up to 2**53.
VALUE_PRESERVING = {
    "bool": ["int32", "int64", "float", "double"],
    "int8": ["int16", "int32", "int64", "float", "double"],
    "uint8": ["int16", "uint16", "int32", "uint32", "int64", "uint64", "float", "double"],
    "int16": ["int32", "int64", "float", "double"],
    "uint16": ["int32", "uint32", "int64", "uint64", "float", "double"],
    "int32": ["int64", "double"],
    "uint32": ["int64", "uint64", "double"],
    "float16": ["float", "double"],
    "bfloat16": ["float", "double"],
    "float": ["double"],
}

FLOATS = frozenset({ir.DataType.FLOAT16, ir.DataType.FLOAT, ir.DataType.DOUBLE})


def type_name(elem_type: ir.DataType) -> str:
    """The schema spelling of an element type: ``float``, ``int64``."""
    return ir.DataType(elem_type).name.lower()


def np_dtype(elem_type: ir.DataType) -> np.dtype:
    return ir.DataType(elem_type).numpy()


def exactly(value: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
    """``value`` converted to ``dtype``, or None where some element changes on the way."""
    with np.errstate(all="ignore"):
        converted = value.astype(dtype)
        back = converted.astype(value.dtype)
    nan = value.dtype.kind == "f" and bool(np.isnan(value).any())
    return converted if np.array_equal(back, value, equal_nan=nan) else None


def dtype_of(array: np.ndarray) -> ir.DataType:
    """The element type of a tensor holding ``array``: strings are held in object arrays."""
    if array.dtype == object or array.dtype.kind in "SU":
        return ir.DataType.STRING
    return ir.DataType.from_numpy(array.dtype)


def as_tensor(array: np.ndarray, name: str | None = None) -> ir.TensorProtocol:
    """A tensor holding ``array``."""
    if dtype_of(array) == ir.DataType.STRING:
        strings = [s.encode() if isinstance(s, str) else bytes(s) for s in array.reshape(-1)]
        return ir.StringTensor(strings, shape=ir.Shape(array.shape), name=name)
    return ir.tensor(array, name=name)


def static_shape(shape: Sequence[int | None] | None) -> list[int] | None:
    """``shape`` where every dimension of it is known, else None."""
    if shape is None or None in shape:
        return None
    return [d for d in shape if d is not None]


def tensor_value(name: str, elem: ir.DataType, shape: Sequence[int | None] | None) -> ir.Value:
    """A new value of a tensor type, as a graph input or output is declared."""
    return ir.Value(
        name=name,
        type=ir.TensorType(elem),
        shape=ir.Shape(shape) if shape is not None else None,
    )


# -- the context ----------------------------------------------------------------------------------


class Context:
    """One model being converted, and what adapters need from it: names, types, constants."""

    def __init__(self, model: ir.Model, source: int, target_opset: int) -> None:
        self.source = source
        self.target_opset = target_opset
        self.root = model.graph
        self.names = _ir.Names.of(model.graph)
        self._constants: dict[ir.Value, np.ndarray | None] = {}
        self._replacing: dict[ir.Value, ir.Value] = {}

    def target_has(self, op: str) -> bool:
        """Whether the target opset has the default-domain operator ``op``."""
        return _schema_diff.since_in_force(op, self.target_opset) is not None

    # -- names, types and constants --------------------------------------------------------------

    def fresh(self, base: str) -> str:
        """A value or node name used nowhere in the model."""
        return self.names.fresh(base)

    def const(self, value: ir.Value | None) -> np.ndarray | None:
        """The value of ``value`` where it is an initializer or a ``Constant``, else None."""
        if value is None:
            return None
        if value not in self._constants:
            found = None
            if value.is_initializer() and value.const_value is not None:
                found = value.const_value.numpy()
            else:
                producer = value.producer()
                if (
                    producer is not None
                    and producer.op_type == "Constant"
                    and _ir.is_default_domain(producer.domain)
                ):
                    found = constant_of_node(producer)
            self._constants[value] = found
        return self._constants[value]

    def type_of(self, value: ir.Value | None) -> ir.TypeProtocol | None:
        """The type of ``value``, also of a constant declared without one, or None."""
        if value is None:
            return None
        if value.type is not None:
            return value.type
        constant = self.const(value)
        if constant is not None:
            return ir.TensorType(dtype_of(constant))
        return None

    def elem_type(self, value: ir.Value | None) -> ir.DataType | None:
        """The element type of tensor ``value``, or None where unknown."""
        found = self.type_of(value)
        if not isinstance(found, ir.TensorType) or found.dtype == ir.DataType.UNDEFINED:
            return None
        return found.dtype

    def shape(self, value: ir.Value | None) -> list[int | None] | None:
        """The dimensions of tensor ``value`` (None for one of unknown size), or None where even
        the rank is unknown."""
        constant = self.const(value)
        if constant is not None:
            return list(constant.shape)
        if value is None or value.shape is None or not isinstance(value.type, ir.TensorType):
            return None
        return [d if isinstance(d, int) else None for d in value.shape.dims]

    def rank(self, value: ir.Value | None) -> int | None:
        shape = self.shape(value)
        return None if shape is None else len(shape)

    def set_type(
        self, value: ir.Value, elem_type: ir.DataType | None, shape: Sequence[int | None] | None
    ) -> None:
        if elem_type:
            value.type = ir.TensorType(ir.DataType(elem_type))
            value.shape = ir.Shape(shape) if shape is not None else None

    def value(self, base: str, elem: ir.DataType, shape: Sequence[int | None] | None) -> ir.Value:
        """A new value with a fresh name, as a graph input or output is declared."""
        return tensor_value(self.fresh(base), elem, shape)

    def add_const(self, value: Any, base: str) -> ir.Value:
        """A new initializer of the main graph, which every subgraph sees."""
        return self.register_const(np.asarray(value), self.fresh(base))

    def register_const(self, array: np.ndarray, name: str) -> ir.Value:
        """``array`` as an initializer of the main graph named ``name`` (a name not in use)."""
        constant = ir.Value(
            name=name,
            type=ir.TensorType(dtype_of(array)),
            shape=ir.Shape(array.shape),
            const_value=as_tensor(array, name),
        )
        self.root.register_initializer(constant)
        self._constants[constant] = array
        return constant

    # -- replacements and refusals ---------------------------------------------------------------

    def replace(self, old: ir.Value, new: ir.Value) -> None:
        """Make ``new``, under ``old``'s name and type, the value that every reader of ``old``
        reads once the rewrite is in place (all but the node computing ``new``)."""
        new.name = old.name
        if old.type is not None:
            new.type = old.type
        if old.shape is not None:
            new.shape = old.shape
        self._replacing[old] = new

    def take_replacements(self) -> dict[ir.Value, ir.Value]:
        replacing, self._replacing = self._replacing, {}
        return replacing

    def refuse(self, node: ir.Node, boundary: int, reason: str) -> OpsetConversionError:
        return OpsetConversionError(node.op_type, boundary, boundary - 1, reason, node.name or "")

    def require_const(self, node: ir.Node, boundary: int, index: int, what: str) -> np.ndarray:
        """The constant value of input ``index``, which opset ``boundary - 1`` needs as an
        attribute."""
        value = self.const(given(node, index))
        if value is None:
            raise self.refuse(
                node, boundary, f"its input '{what}' is computed at run time, and opset "
                f"{boundary - 1} needs its value before"
            )  # fmt: skip
        return value

    def require_rank(self, node: ir.Node, boundary: int, value: ir.Value) -> int:
        rank = self.rank(value)
        if rank is None:
            raise self.refuse(node, boundary, f"the rank of '{value.name}' is unknown")
        return rank

    # -- one-node models -------------------------------------------------------------------------

    def run_onnx_adapter(self, node: ir.Node, boundary: int) -> list[ir.Node]:
        """onnx's own C++ adapter for ``boundary``, run on a model of ``node`` alone.

        Constant inputs, also those of enclosing graphs, become initializers of that model, as
        onnx's adapters read axes and sizes from initializers.
        """
        mini = self.mini_model([ir.serde.serialize_node(node)], node.inputs, node.outputs, boundary)
        try:
            converted = onnx.version_converter.convert_version(mini, boundary - 1)
        except Exception as error:  # onnx raises RuntimeError subclasses with the assertion text
            message = str(error).split("\n")[0].split(_compat.ONNX_CONVERTER_ASSERTION)[-1]
            raise self.refuse(node, boundary, message) from None
        return self.splice(converted, node)

    def value_info(self, value: ir.Value) -> onnx.ValueInfoProto:
        """``value`` declared with the type and shape known here."""
        shape = value.shape
        constant = self.const(value)
        if shape is None and constant is not None:
            shape = ir.Shape(constant.shape)
        return ir.serde.serialize_value(
            ir.Value(name=value.name, type=self.type_of(value), shape=shape)
        )

    def mini_model(
        self,
        nodes: list[onnx.NodeProto],
        inputs: Sequence[ir.Value | None],
        outputs: Sequence[ir.Value],
        opset: int,
        functions: Sequence[onnx.FunctionProto] = (),
    ) -> onnx.ModelProto:
        """A model of ``nodes``, serialized, reading ``inputs`` and computing ``outputs``:
        constant inputs as initializers, the others as graph inputs of the types known here."""
        graph = onnx.GraphProto(name="node", node=nodes)
        for value in dict.fromkeys(v for v in inputs if v is not None):
            constant = self.const(value)
            if constant is not None:
                graph.initializer.append(ir.serde.serialize_tensor(as_tensor(constant, value.name)))
            else:
                graph.input.append(self.value_info(value))
        graph.output.extend(self.value_info(v) for v in outputs if is_present(v))
        imports = [onnx.OperatorSetIdProto(domain="", version=opset)]
        imports += [onnx.OperatorSetIdProto(domain=f.domain, version=1) for f in functions]
        return onnx.ModelProto(
            ir_version=onnx.IR_VERSION, graph=graph, opset_import=imports, functions=functions
        )

    def splice(self, model: onnx.ModelProto, node: ir.Node) -> list[ir.Node]:
        """The nodes of a converted one-node model, made values of this model: the inputs of
        ``node`` are read where the model reads them, its outputs are replaced by the model's,
        and every other value gets a fresh name and the type ONNX infers for it."""
        graph = ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(model)).graph
        inputs = {v.name: v for v in node.inputs if v is not None}
        outputs = {v.name: v for v in node.outputs if v.name}
        mapping: dict[ir.Value, ir.Value] = {}
        for value in graph.inputs:
            mapping[value] = inputs[value.name]
        for name, value in graph.initializers.items():
            if name in inputs and self.const(inputs[name]) is not None:
                mapping[value] = inputs[name]
            else:
                tensor = value.const_value
                assert tensor is not None  # an initializer holds its tensor
                mapping[value] = self.add_const(tensor.numpy(), name)
        nodes = list(graph)
        graph.outputs.clear()
        graph.inputs.clear()
        graph.remove(nodes)
        for new in nodes:
            for inner in itertools.chain(
                [new], *(ir.traversal.RecursiveGraphIterator(g) for g in _ir.subgraphs(new))
            ):
                for i, read in enumerate(inner.inputs):
                    if read in mapping:
                        inner.replace_input_with(i, mapping[read])
            for made in new.outputs:
                if made.name in outputs:
                    self.replace(outputs[made.name], made)
                elif made.name:
                    made.name = self.fresh(made.name)
            # a node that stays one node keeps its name
            if not (len(nodes) == 1 and new.name == node.name):
                new.name = self.fresh(new.name or f"{node.name}_{new.op_type}")
        return nodes


def replace_graph_output(old: ir.Value, new: ir.Value) -> None:
    """Where ``old`` is an output of its graph, ``new`` becomes that output instead."""
    if old.is_graph_output():
        assert old.graph is not None  # an output of a graph belongs to it
        outputs = old.graph.outputs
        for i, output in enumerate(outputs):
            if output is old:
                outputs[i] = new


class Builder:
    """The nodes an adapter makes, one after another: the one way adapters make nodes.

    Each node is a default-domain node with a fresh name, kept in :attr:`nodes` in the order
    made; :meth:`op` also gives its one output the type of what it computes, which later
    adapters and the check of types at the target read. A node's outputs are new values, or
    replace outputs of the node being rewritten (see ``Context.replace``)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.nodes: list[ir.Node] = []
        self.made: dict[Any, Any] = {}
        """Values made once and read several times by the adapter, by a key of its own."""

    def node(
        self,
        op: str,
        inputs: Sequence[ir.Value | None],
        outputs: Sequence[ir.Value | str | None] | None = None,
        *,
        num_outputs: int = 1,
        name: str | None = None,
        **attributes: Any,
    ) -> ir.Node:
        """A node of ``op`` made and kept, named ``name`` or a fresh name. Each entry of
        ``outputs`` is None for a new value with a fresh name, a string for a new value with a
        fresh name of that base, or an output of the node being rewritten, which the new output
        replaces; without ``outputs``, the node has ``num_outputs`` new values."""
        ctx = self.ctx
        count = len(outputs) if outputs is not None else num_outputs
        node = ir.Node(
            "",
            op,
            inputs,
            attributes=[make_attribute(k, v) for k, v in attributes.items()],
            num_outputs=count,
            name=ctx.fresh(op) if name is None else name,
        )
        for made, replaced in zip(node.outputs, outputs or [None] * count, strict=True):
            if replaced is None:
                made.name = ctx.fresh(op.lower())
            elif isinstance(replaced, str):
                made.name = ctx.fresh(replaced)
            else:
                ctx.replace(replaced, made)
        self.nodes.append(node)
        return node

    def op(
        self,
        op: str,
        inputs: Sequence[ir.Value | None],
        elem: ir.DataType | None,
        shape: Sequence[int | None] | None = None,
        *,
        output: ir.Value | None = None,
        **attributes: Any,
    ) -> ir.Value:
        """A node of ``op`` made and kept; its one output, of type ``elem`` and shape ``shape``,
        or replacing ``output`` of the node being rewritten."""
        node = self.node(op, inputs, None if output is None else [output], **attributes)
        if output is None:
            self.ctx.set_type(node.outputs[0], elem, shape)
        return node.outputs[0]

    def const(self, value: Any, base: str) -> ir.Value:
        return self.ctx.add_const(value, base)


def truncate_inputs(node: ir.Node, count: int) -> None:
    """Drop the inputs of ``node`` from ``count`` on."""
    if len(node.inputs) > count:
        node.resize_inputs(count)


def clear_attributes(node: ir.Node) -> None:
    """Remove every attribute of ``node``."""
    for name in list(node.attributes):
        remove_attribute(node, name)
