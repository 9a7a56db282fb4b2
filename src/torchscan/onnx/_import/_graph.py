"""An ONNX graph compiled once into nodes that call torch, and the module that runs it.

:func:`compile_model` checks the model (``onnx.checker``), resolves every node to the
implementation of its operator's version (:mod:`._registry`) and every subgraph (the bodies of
``Scan`` and ``Loop``, the branches of ``If``) to a :class:`Graph` of its own; initializers become
parameters (the weights, :mod:`._weights`) or buffers of the :class:`OnnxModule`, the
subgraphs' included.
Running a graph binds its inputs and initializers to names and calls its nodes in order; a
subgraph reads the values of the graphs around it by name, as ONNX scopes them.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import keyword
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import onnx
import onnx.inliner
import onnx.numpy_helper
import onnx.shape_inference
import torch

from torchscan import _compat
from torchscan._errors import OnnxImportError, TorchscanTypeError, TorchscanValueError
from torchscan.onnx._import import _inputs, _registry, _weights
from torchscan.onnx._import._types import torch_dtype

_API = "the module of torchscan.onnx.to_torch"

Known = tuple[list[Any], tuple[int, ...]]
"""The values of a 0-D or 1-D integer tensor as Python integers (``torch.SymInt`` for sizes
read while ``torch.export`` traces), and its shape."""

_KNOWN: dict[int, tuple[torch.Tensor, Known]] = {}
"""While the module is traced: the integer values known in Python of tensors in scope (shapes,
axes, sizes, the integer constants of the model, and what is computed of them), by ``id``,
the tensor kept with them so that a reused id is not taken for it."""


def ints(values: torch.Tensor | None) -> list[Any]:
    """The integers of a tensor that holds shapes, axes or sizes, as Python values. While
    ``torch.export`` traces the module, a tensor whose values are known in Python (computed from
    the model's constants and its inputs' shapes by :func:`_fold`) gives them, sizes as
    ``torch.SymInt``: so that a ``Reshape`` to a shape computed from a dynamic dimension traces,
    rather than reading a traced tensor's data."""
    if values is None:
        return []
    entry = _KNOWN.get(id(values))
    if entry is not None and entry[0] is values:
        return list(entry[1][0])
    if torch.compiler.is_compiling() and not torch.compiler.is_dynamo_compiling():
        raise _NotTraceable  # (TorchDynamo, tracing a branch of torch.cond, reads the data)
    return [int(v) for v in values.reshape(-1).tolist()]


_PROBING: contextvars.ContextVar[bool] = contextvars.ContextVar("probing", default=False)
"""Set while a body runs on fake tensors to find the shapes of its outputs (a Loop that runs no
iteration): its sizes are read as while traced."""


@contextlib.contextmanager
def probing(scope: Mapping[str, Any]) -> Iterator[None]:
    """Run bodies on fake tensors with the values known in Python (see :data:`_PROBING`): the
    small integer tensors of ``scope``, the values around the body, whose data a fake tensor
    does not give."""
    token = _PROBING.set(True)
    added = []
    for value in scope.values():
        known = _constant(value)
        if known is not None and _known(value) is None:
            added.append(_remember(value, known))
    try:
        yield
    finally:
        _PROBING.reset(token)
        for key in added:
            _KNOWN.pop(key, None)


class _NotTraceable(Exception):
    """An implementation read sizes, axes or positions from a tensor whose values are not
    known in Python while the module is traced: computed from the data."""


@dataclasses.dataclass(frozen=True)
class Node:
    """One node, resolved: its implementation, its inputs and outputs by name (``""`` for an
    omitted optional one) and its attributes as Python values (a subgraph as a :class:`Graph`)."""

    op_type: str
    version: int
    name: str
    run: Callable[..., Any]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: Mapping[str, Any]
    where: str
    domain: str = ""

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled without its implementation, found again in the registry when unpickled (some
        are closures, which do not pickle)."""
        fields = (self.op_type, self.version, self.name, None, self.inputs, self.outputs)
        return (_unpickled_node, (*fields, dict(self.attributes), self.where, self.domain))

    def refuse(self, reason: str, *, not_implemented: bool = False) -> OnnxImportError:
        """The error of this node: names it, its operator and version, and the reason;
        ``not_implemented`` where to_torch or torch lacks what the node needs."""
        return OnnxImportError(
            f"torchscan.onnx.to_torch: {self.where}: {reason}", not_implemented=not_implemented
        )


def _unpickled_node(*fields: Any) -> Node:
    node = Node(*fields)
    run = _registry.lookup(node.domain, node.op_type, node.version)
    assert run is not None  # (it was found when the node was made)
    object.__setattr__(node, "run", run)
    return node


@dataclasses.dataclass(frozen=True)
class Graph:
    """A graph: its inputs, outputs, initializers (by name, to the module attribute that holds
    them) and nodes in the order they run."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    initializers: Mapping[str, str]
    nodes: tuple[Node, ...]
    constants: Mapping[str, Known] = dataclasses.field(default_factory=dict)
    """The values of its small integer initializers of rank 0 or 1, read while tracing."""
    output_types: tuple[tuple[torch.dtype, tuple[int, ...]] | None, ...] = ()
    """The dtype and shape its outputs declare, where they declare a tensor of a static shape
    (else None)."""
    input_types: tuple[_inputs.Declared | None, ...] = ()
    """What its inputs declare, where they declare a tensor (else None)."""

    def run(
        self, module: torch.nn.Module, inputs: Sequence[Any], outer: Mapping[str, Any] | None = None
    ) -> list[Any]:
        """The values of the outputs of the graph for the values of its ``inputs``; ``outer``
        holds the values of the graphs around it, which its nodes may read."""
        env: dict[str, Any] | collections.ChainMap[str, Any]
        env = {} if outer is None else collections.ChainMap({}, outer)  # type: ignore[arg-type]
        for name, attribute in self.initializers.items():
            env[name] = getattr(module, attribute)
        for name, value in zip(self.inputs, inputs, strict=True):
            env[name] = value
        traced = torch.compiler.is_compiling() or _PROBING.get()
        if not traced or torch.compiler.is_dynamo_compiling():
            # eager; or a branch of torch.cond, which TorchDynamo traces, and where the values
            # known in Python are not kept (a change to a dict outside the branch)
            return self._run_nodes(module, env)
        added: list[int] = []
        try:
            for name, known in self.constants.items():
                added.append(_remember(env[name], known))
            return self._run_nodes(module, env, added)
        finally:
            for key in added:
                _KNOWN.pop(key, None)

    def _run_nodes(
        self, module: torch.nn.Module, env: Any, added: list[int] | None = None
    ) -> list[Any]:
        """Run the nodes in ``env``; while tracing (``added`` a list), remember the values of
        their outputs that are known in Python (:func:`_fold`)."""
        for node in self.nodes:
            args = [env[name] if name else None for name in node.inputs]
            try:
                result = node.run(Call(node, module, env), *args)
            except OnnxImportError:
                raise
            except _NotTraceable:
                raise node.refuse(
                    "torch.export cannot trace it: it reads sizes, axes or positions from values "
                    "computed from the data (a loop's iteration number, for one), not from "
                    "shapes and constants. The module runs it eagerly.",
                    not_implemented=True,
                ) from None
            except (RuntimeError, NotImplementedError, TypeError, ValueError, IndexError) as error:
                if torch.compiler.is_compiling():
                    raise  # torch's own errors of tracing, which it may handle
                first = str(error).strip().splitlines()[0] if str(error).strip() else ""
                described = ", ".join(_describe(a) for a in args)
                raise node.refuse(
                    f"torch cannot compute it on inputs ({described}): "
                    f"{type(error).__name__}: {first}",
                    not_implemented=isinstance(error, NotImplementedError),
                ) from error
            if isinstance(result, torch.Tensor) or not isinstance(result, (list, tuple)):
                result = (result,)
            for name, value in zip(node.outputs, result, strict=False):
                if name:
                    env[name] = value
            if added is not None and len(node.outputs) == 1:
                known = _fold(node, args, result[0])
                if known is not None:
                    added.append(_remember(result[0], known))
        return [env[name] for name in self.outputs]


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    return "omitted" if value is None else type(value).__name__


@dataclasses.dataclass(frozen=True)
class Call:
    """What an implementation reads besides its inputs: the node, and for a node with
    subgraphs, the module and the values around it (:meth:`run_graph`)."""

    node: Node
    module: torch.nn.Module
    env: Mapping[str, Any]

    def attribute(self, name: str, default: Any = None) -> Any:
        return self.node.attributes.get(name, default)

    def run_graph(self, name: str, inputs: Sequence[Any]) -> list[Any]:
        """Run the subgraph of attribute ``name`` on ``inputs``, reading the values in scope
        here."""
        graph: Graph = self.node.attributes[name]
        if len(inputs) != len(graph.inputs):
            raise self.node.refuse(
                f"its {name} takes {len(graph.inputs)} inputs, but {len(inputs)} are given"
            )
        return graph.run(self.module, inputs, self.env)

    def refuse(self, reason: str, *, not_implemented: bool = False) -> OnnxImportError:
        return self.node.refuse(reason, not_implemented=not_implemented)


class _Compiler:
    """Compiles a model's graphs, and collects the initializers of all of them."""

    def __init__(self, opsets: Mapping[str, int], weights: AbstractSet[str]) -> None:
        self.opsets = opsets
        self.weights = weights  # the ONNX names of the tensors that are parameters
        self.tensors: dict[str, torch.Tensor] = {}  # module attribute -> value
        self.parameters: set[str] = set()  # the module attributes that are parameters
        self.used: set[str] = set()

    def graph(self, graph: onnx.GraphProto, where: str) -> Graph:
        initializers: dict[str, str] = {}
        constants: dict[str, Known] = {}
        for tensor in graph.initializer:
            attribute = self._attribute_name(tensor.name)
            value = torch.from_numpy(onnx.numpy_helper.to_array(tensor).copy())
            self.tensors[attribute] = value
            initializers[tensor.name] = attribute
            if tensor.name in self.weights:
                self.parameters.add(attribute)
            known = _constant(value)
            if known is not None:
                constants[tensor.name] = known
        held = []  # the Constant nodes that hold weights: parameters, as initializers are
        for node in graph.node:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if node.op_type == "Constant" and node.output and node.output[0] in self.weights:
                assert value is not None  # (a weight is a tensor: _weights.candidates)
                attribute = self._attribute_name(node.output[0])
                self.tensors[attribute] = torch.from_numpy(onnx.numpy_helper.to_array(value).copy())
                self.parameters.add(attribute)
                initializers[node.output[0]] = attribute
                held.append(node)
        for sparse in graph.sparse_initializer:
            raise OnnxImportError(
                f"torchscan.onnx.to_torch: {where} has a sparse initializer "
                f"'{sparse.values.name}', which to_torch does not implement",
                not_implemented=True,
            )
        inputs = tuple(i.name for i in graph.input if i.name not in initializers)
        for value in graph.input:
            kind = value.type.WhichOneof("value")  # untyped, as a body's inputs may be
            if value.name not in initializers and kind in ("map_type", "sparse_tensor_type"):
                raise OnnxImportError(
                    f"torchscan.onnx.to_torch: {where}: input '{value.name}' is a "
                    f"{kind.removesuffix('_type').replace('_', ' ')} (maps and sparse tensors "
                    "are not implemented)",
                    not_implemented=True,
                )
        nodes = tuple(
            self.node(node, i, where)
            for i, node in enumerate(graph.node)
            if not any(node is h for h in held)
        )
        return Graph(
            graph.name,
            inputs,
            tuple(o.name for o in graph.output),
            initializers,
            nodes,
            constants,
            tuple(_static_type(o.type) for o in graph.output),
            tuple(_inputs.declared(i) for i in graph.input if i.name not in initializers),
        )

    def node(self, node: onnx.NodeProto, index: int, graph_where: str) -> Node:
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        label = f"node '{node.name}'" if node.name else f"node #{index}"
        opset = self.opsets.get(domain)
        version = None if opset is None else _registry.schema_version(domain, node.op_type, opset)
        op = node.op_type if not domain else f"{domain}.{node.op_type}"
        if version is None:
            raise OnnxImportError(
                f"torchscan.onnx.to_torch: {label} ({op}) of {graph_where}: onnx knows no "
                f"operator {op} at opset {opset}",
                not_implemented=True,
            )
        where = f"{label} ({op}-{version}) of {graph_where}"
        run = _registry.lookup(domain, node.op_type, version)
        if run is None:
            others = _registry.implemented().get(node.op_type) if not domain else None
            known = f" (implemented: versions {others})" if others else ""
            raise OnnxImportError(
                f"torchscan.onnx.to_torch: {where}: {op}-{version} is not implemented{known}. "
                "The operators and versions to_torch implements are listed in "
                "docs/import.md.",
                not_implemented=True,
            )
        attributes: dict[str, Any] = {}
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                attributes[attribute.name] = self.graph(
                    attribute.g, f"the {attribute.name} of {label} ({op}-{version})"
                )
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                raise OnnxImportError(
                    f"torchscan.onnx.to_torch: {where}: attribute '{attribute.name}' is a list "
                    "of graphs, which to_torch does not implement",
                    not_implemented=True,
                )
            elif attribute.ref_attr_name:
                raise OnnxImportError(
                    f"torchscan.onnx.to_torch: {where}: attribute '{attribute.name}' refers to "
                    "a function's attribute (functions are inlined first)",
                    not_implemented=True,
                )
            else:
                attributes[attribute.name] = _attribute_value(attribute)
        return Node(
            node.op_type,
            version,
            node.name,
            run,
            tuple(node.input),
            tuple(node.output),
            attributes,
            where,
            domain,
        )

    def _attribute_name(self, onnx_name: str) -> str:
        name = re.sub(r"\W", "_", onnx_name) or "_"
        if name[0].isdigit():
            name = f"_{name}"
        name, base, count = f"init_{name}", f"init_{name}", 1
        while name in self.used:
            count += 1
            name = f"{base}_{count}"
        self.used.add(name)
        return name


def _attribute_value(attribute: onnx.AttributeProto) -> Any:
    value = onnx.helper.get_attribute_value(attribute)
    if attribute.type == onnx.AttributeProto.TENSOR:
        return torch.from_numpy(onnx.numpy_helper.to_array(value).copy())
    if attribute.type == onnx.AttributeProto.STRING:
        return value.decode()
    if attribute.type == onnx.AttributeProto.STRINGS:
        return [v.decode() for v in value]
    if attribute.type == onnx.AttributeProto.TYPE_PROTO:
        return value
    return value


def _static_type(type_: onnx.TypeProto) -> tuple[torch.dtype, tuple[int, ...]] | None:
    """The dtype and shape of a declared tensor type whose every dimension is a number."""
    if not type_.HasField("tensor_type") or not type_.tensor_type.HasField("shape"):
        return None
    dtype = torch_dtype(type_.tensor_type.elem_type)
    dims = type_.tensor_type.shape.dim
    if dtype is None or not all(d.HasField("dim_value") for d in dims):
        return None
    return dtype, tuple(d.dim_value for d in dims)


_INTEGERS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _constant(value: Any) -> Known | None:
    """The values of a small integer tensor of rank 0 or 1, else None."""
    if (
        isinstance(value, torch.Tensor)
        and value.dtype in _INTEGERS
        and value.dim() <= 1
        and value.numel() <= 64
    ):
        return [int(v) for v in value.reshape(-1).tolist()], tuple(value.shape)
    return None


def _remember(tensor: Any, known: Known) -> int:
    _KNOWN[id(tensor)] = (tensor, known)
    return id(tensor)


def _known(value: Any) -> Known | None:
    entry = _KNOWN.get(id(value))
    return entry[1] if entry is not None and entry[0] is value else None


_ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Max": torch.sym_max,
    "Min": torch.sym_min,
}


def _fold(node: Node, args: Sequence[Any], result: Any) -> Known | None:
    """The values of a node's one output, in Python, where they follow from values known in
    Python (:data:`_KNOWN`): ``Shape`` and ``Size`` of any tensor, small integer constants
    (``Constant``), and ``Identity``, ``Cast`` to an integer type, ``Gather``, ``Concat``,
    ``Slice``, ``Squeeze``, ``Unsqueeze``, ``Reshape`` (of one value), ``Add``, ``Sub``,
    ``Mul``, ``Max`` and ``Min`` of known 0-D and 1-D values. Anything else is not known
    (None): its consumers read the traced tensor."""
    op = node.op_type
    if not isinstance(result, torch.Tensor) or result.dtype not in _INTEGERS or result.dim() > 1:
        return None
    if op == "Shape":
        dims = list(args[0].shape)[node.attributes.get("start", 0) : node.attributes.get("end")]
        return dims, (len(dims),)
    if op == "Size":
        return [args[0].numel()], ()
    if op == "Constant":
        value = node.attributes.get("value")
        if value is None and "value_int" in node.attributes:
            return [int(node.attributes["value_int"])], ()
        if value is None and "value_ints" in node.attributes:
            values = [int(v) for v in node.attributes["value_ints"]]
            return values, (len(values),)
        return _constant(value)
    known = [None if a is None else _known(a) for a in args]
    if any(k is None for k, a in zip(known, args, strict=True) if a is not None) or not known:
        return None
    first = known[0]
    assert first is not None
    if op == "Identity" or (op == "Cast" and result.dtype in _INTEGERS):
        return first
    if op in _ARITHMETIC and len(known) == 2 and known[1] is not None:
        (a, a_shape), (b, b_shape) = first, known[1]
        if len(a) != len(b) and 1 not in (len(a), len(b)):
            return None
        n = max(len(a), len(b))
        a, b = (a * n if len(a) == 1 else a), (b * n if len(b) == 1 else b)
        shape = a_shape if len(a_shape) >= len(b_shape) else b_shape
        return [_ARITHMETIC[op](x, y) for x, y in zip(a, b, strict=True)], shape
    if op == "Reshape" and len(first[0]) == 1:  # one value, as a 0-D or a 1-D tensor
        return first[0], (1,) * result.dim()
    if op == "Squeeze" and first[1] == (1,):
        return first[0], ()
    if op == "Unsqueeze" and first[1] == ():
        return first[0], (1,)
    if op == "Concat" and all(k is not None and len(k[1]) == 1 for k in known):
        values = [v for k in known if k is not None for v in k[0]]
        return values, (len(values),)
    if op == "Gather" and len(first[1]) == 1 and node.attributes.get("axis", 0) in (0, -1):
        indices = known[1]
        assert indices is not None
        n = len(first[0])
        picked = [first[0][i + n if i < 0 else i] for i in indices[0]]
        return picked, indices[1]
    if op == "Slice" and len(first[1]) == 1 and len(known) >= 3:
        starts, ends = known[1], known[2]
        axes = known[3] if len(known) > 3 else None
        steps = known[4] if len(known) > 4 else None
        if starts is None or ends is None or len(starts[0]) != 1:
            return None
        if (axes is not None and axes[0] not in ([0], [-1])) or (
            steps is not None and steps[0] != [1]
        ):
            return None
        values = first[0][starts[0][0] : ends[0][0]]
        return values, (len(values),)
    return None


class OnnxModule(torch.nn.Module):
    """An ONNX model as a module: ``forward`` takes the graph's inputs (positionally in the
    graph's order, or by name) and returns its output, or a tuple of its outputs. Each model's
    module is of a subclass whose ``forward`` names the graph's inputs (an input whose name is
    not a Python identifier is ``input_<i>``), so that ``torch.export`` binds
    ``dynamic_shapes`` to them.

    The weights are parameters, the other initializers buffers (``to_torch``'s ``trainable``),
    named after the initializer or ``Constant`` (``init_`` and the name with every character
    that is not a letter, digit or ``_`` replaced; :attr:`onnx_names` maps them back). Save the
    parameters with ``state_dict``, or the whole module with ``torch.save`` (it pickles, and
    ``copy.deepcopy`` copies it)."""

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        # (of a class made for the model's inputs, which pickle cannot find by name: made again)
        return (_unpickled_module, (self.input_names, self.__dict__))

    def __init__(
        self, graph: Graph, tensors: Mapping[str, torch.Tensor], parameters: AbstractSet[str]
    ) -> None:
        super().__init__()
        for attribute, value in tensors.items():
            if attribute in parameters:
                self.register_parameter(attribute, torch.nn.Parameter(value))
            else:
                self.register_buffer(attribute, value)
        self.graph = graph
        self.input_names: tuple[str, ...] = graph.inputs
        self.output_names: tuple[str, ...] = graph.outputs

    @property
    def onnx_names(self) -> dict[str, str]:
        """The ONNX name of every initializer of the main graph, by module attribute."""
        return {attribute: name for name, attribute in self.graph.initializers.items()}

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The graph's output (or a tuple of its outputs) for its inputs, in the graph's order
        or by name."""
        names = self.input_names
        if len(args) > len(names):
            raise TorchscanTypeError(
                f"{_API}: the model takes {len(names)} inputs ({list(names)}), but "
                f"{len(args)} were given"
            )
        values = dict(zip(names, args, strict=False))
        for name, value in kwargs.items():
            if name not in names or name in values:
                raise TorchscanTypeError(
                    f"{_API}: {name!r} is not an input of the model or is given twice; its "
                    f"inputs are {list(names)}"
                )
            values[name] = value
        missing = [name for name in names if name not in values]
        if missing:
            raise TorchscanTypeError(
                f"{_API}: inputs {missing} are missing; the model's inputs are {list(names)}"
            )
        given = [values[name] for name in names]
        _inputs.check(_API, self.graph.input_types, given)
        try:
            outputs = self.graph.run(self, given)
        except Exception as error:
            why = _inputs.disagreement(self.graph.input_types, given)
            if why is None or _compat.is_recomputation_stop(error):
                raise
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise TorchscanValueError(
                f"{_API}: the graph failed ({type(error).__name__}: {first}), and {why}"
            ) from error
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def _unpickled_module(inputs: Sequence[str], state: dict[str, Any]) -> OnnxModule:
    cls = _module_class(inputs)
    module = cls.__new__(cls)
    module.__dict__.update(state)
    return module


def _module_class(inputs: Sequence[str]) -> type[OnnxModule]:
    """A subclass of :class:`OnnxModule` whose ``forward`` takes ``inputs`` by name."""
    names: list[str] = []
    for index, name in enumerate(inputs):
        usable = name.isidentifier() and not keyword.iskeyword(name) and name != "self"
        names.append(name if usable and name not in names else f"input_{index}")
    listed = ", ".join(names)
    source = f"def forward(self, {listed}):\n    return OnnxModule.forward(self, {listed})\n"
    namespace: dict[str, Any] = {"OnnxModule": OnnxModule}
    exec(compile(source, "<torchscan.onnx.to_torch forward>", "exec"), namespace)
    forward = namespace["forward"]
    forward.__doc__ = OnnxModule.forward.__doc__
    return type("OnnxModule", (OnnxModule,), {"forward": forward, "__module__": __name__})


def _typed_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or a copy of it whose outputs that declare no type (which onnxruntime runs,
    and onnx.checker refuses) have the type ONNX shape inference gives them; refused, naming
    the output, where it gives none."""
    untyped = [o.name for o in model.graph.output if o.type.WhichOneof("value") is None]
    if not untyped:
        return model
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # any failure of inference: the outputs stay untyped, refused below
        inferred = model
    known = [*inferred.graph.output, *inferred.graph.value_info]
    types = {v.name: v.type for v in known if v.type.WhichOneof("value") is not None}
    missing = [name for name in untyped if name not in types]
    if missing:
        raise OnnxImportError(
            f"torchscan.onnx.to_torch: output '{missing[0]}' of the main graph declares no "
            "type, and ONNX shape inference finds none (onnx.checker requires one)"
        )
    typed = onnx.ModelProto()
    typed.CopyFrom(model)
    for output in typed.graph.output:
        if output.name in untyped:
            output.type.CopyFrom(types[output.name])
    return typed


def compile_model(model: onnx.ModelProto, trainable: Any = "weights") -> OnnxModule:
    """``model`` as an :class:`OnnxModule` (see the module's docstring), the tensors
    ``trainable`` names (:func:`._weights.trainable_names`) its parameters."""
    model = _typed_outputs(model)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as error:
        first = str(error).strip().splitlines()[0]
        raise OnnxImportError(
            f"torchscan.onnx.to_torch: the model fails onnx.checker: {first}"
        ) from None
    if model.functions:
        try:  # (a function whose opset imports differ from the model's: converted as inlined)
            model = onnx.inliner.inline_local_functions(model, convert_version=True)
        except Exception:  # (what the converter cannot convert stays a call, refused below)
            model = onnx.inliner.inline_local_functions(model)
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    compiler = _Compiler(opsets, _weights.trainable_names(model, trainable))
    graph = compiler.graph(model.graph, "the main graph")
    return _module_class(graph.inputs)(graph, compiler.tensors, compiler.parameters)


__all__ = ["Call", "Graph", "Node", "OnnxModule", "compile_model", "ints", "torch_dtype"]
