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
import dataclasses
import itertools
import keyword
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import onnx
import onnx.inliner
import onnx.shape_inference
import onnx_ir as ir
import torch

from torchscan import _compat, _context
from torchscan._errors import OnnxImportError, TorchscanTypeError, TorchscanValueError
from torchscan.onnx import _ir
from torchscan.onnx._import import _inputs, _registry, _weights
from torchscan.onnx._import._types import torch_dtype, torch_tensor
from torchscan.onnx._opsets import op_key

_API = "the module of torchscan.onnx.to_torch"

Known = tuple[list[Any], tuple[int, ...]]
"""The values of a 0-D or 1-D integer tensor as Python integers (``torch.SymInt`` for sizes
read while ``torch.export`` traces), and its shape."""


@dataclasses.dataclass
class _Trace:
    """What one trace of the module (by ``torch.export``, or a probe of a body on fake tensors)
    knows in Python: the integer values of tensors in scope (shapes, axes, sizes, the integer
    constants of the model, and what is computed of them), by ``id``, each tensor kept with its
    values so that no other tensor takes its id while the trace lasts."""

    known: dict[int, tuple[torch.Tensor, Known]] = dataclasses.field(default_factory=dict)
    probing: bool = False
    """A body run on fake tensors to find the shapes of its outputs (a Loop that runs no
    iteration): its sizes are read as while traced."""

    def remember(self, tensor: Any, known: Known) -> None:
        self.known[id(tensor)] = (tensor, known)

    def values(self, tensor: Any) -> Known | None:
        entry = self.known.get(id(tensor))
        return entry[1] if entry is not None and entry[0] is tensor else None


def _current() -> _Trace | None:
    """The trace in progress in this context, if any."""
    probes = _probes()
    return probes.get(_IMPORT) if probes else None  # eagerly, none: no lookup


_probes = _context.probes
_IMPORT = _context.Probe.IMPORT


def ints(values: torch.Tensor | None) -> list[Any]:
    """The integers of a tensor that holds shapes, axes or sizes, as Python values. While
    ``torch.export`` traces the module, a tensor whose values are known in Python (computed from
    the model's constants and its inputs' shapes by :func:`_fold`) gives them, sizes as
    ``torch.SymInt``: so that a ``Reshape`` to a shape computed from a dynamic dimension traces,
    rather than reading a traced tensor's data."""
    if values is None:
        return []
    known = None if _context.dynamo_tracing() else _known(values)
    if known is not None:
        return list(known[0])
    if _context.compiling() and not _context.dynamo_tracing():
        raise _NotTraceable  # (TorchDynamo, tracing a branch of torch.cond, reads the data)
    return [int(v) for v in values.reshape(-1).tolist()]


@contextlib.contextmanager
def probing(scope: Mapping[str, Any]) -> Iterator[None]:
    """Run bodies on fake tensors with the values known in Python (a trace whose ``probing``
    is set, :class:`_Trace`): those known already, and the small integer tensors of ``scope``,
    the values around the body, whose data a fake tensor does not give."""
    outer = _current()
    trace = _Trace(dict(outer.known) if outer is not None else {}, probing=True)
    for value in scope.values():
        known = _constant(value)
        if known is not None and trace.values(value) is None:
            trace.remember(value, known)
    with _context.probing(_context.Probe.IMPORT, trace):
        yield


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
            env[name] = _held(module, attribute)
        for name, value in zip(self.inputs, inputs, strict=True):
            env[name] = value
        if _context.dynamo_tracing():
            # a branch of torch.cond, which TorchDynamo traces, and where the values known in
            # Python are not kept (TorchDynamo reads no context variable)
            return self._run_nodes(module, env)
        trace = _current()
        if not _context.compiling() and (trace is None or not trace.probing):
            return self._run_nodes(module, env)  # eager
        if trace is None:  # the module's graph, traced: the trace starts
            with _context.probing(_context.Probe.IMPORT, _Trace()):
                return self.run(module, inputs, outer)
        for name, known in self.constants.items():
            trace.remember(env[name], known)
        return self._run_nodes(module, env, trace)

    def _run_nodes(
        self, module: torch.nn.Module, env: Any, trace: _Trace | None = None
    ) -> list[Any]:
        """Run the nodes in ``env``; while tracing (``trace``), remember the values of their
        outputs that are known in Python (:func:`_fold`)."""
        for node in self.nodes:
            args = [env[name] if name else None for name in node.inputs]
            try:
                result = node.run(Call(node, module, env, node.attributes.get), *args)
            except OnnxImportError:
                raise
            except _NotTraceable:
                raise node.refuse(
                    "torch.export cannot trace it: it reads sizes, axes or positions from values "
                    "computed from the data (a loop's iteration number, for one), not from "
                    "shapes and constants. The module runs it eagerly.",
                    not_implemented=True,
                ) from None
            except _compat.guard_on_data_dependent_error() as error:
                if not _context.compiling() or _context.dynamo_tracing():
                    raise
                first = str(error).strip().splitlines()[0]
                raise node.refuse(
                    "torch.export cannot trace it: a size it needs depends on values computed "
                    f"from the data ({first}). The module runs it eagerly.",
                    not_implemented=True,
                ) from error
            except (RuntimeError, NotImplementedError, TypeError, ValueError, IndexError) as error:
                if _context.compiling():
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
            if trace is not None and len(node.outputs) == 1:
                known = _fold(node, args, result[0])
                if known is not None:
                    trace.remember(result[0], known)
        return [env[name] for name in self.outputs]


def _held(module: torch.nn.Module, path: str) -> Any:
    """The tensor the module holds at ``path`` (``rnn.weight``)."""
    for part in path.split("."):
        module = getattr(module, part)
    return module


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    return "omitted" if value is None else type(value).__name__


@dataclasses.dataclass(slots=True)
class Call:
    """What an implementation reads besides its inputs: the node, and for a node with
    subgraphs, the module and the values around it (:meth:`run_graph`). Made for every run of a
    node, and never changed: slotted rather than frozen, which would cost a call per field."""

    node: Node
    module: torch.nn.Module
    env: Mapping[str, Any]
    attribute: Callable[..., Any]
    """``attribute(name, default)``: the node's attribute ``name``, or ``default`` where the node
    does not have it (the attributes' own ``get``: read at every run of a node, on the path of
    every step of a loop)."""

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
        self.used: set[str] = set()  # the module paths of tensors
        self.marked = False  # whether the model marks its initializers as state or not
        self.transient: set[str] = set()  # the buffers that are no state (Constant nodes')
        self.state: set[str] = set()  # the tensors it marks as state
        self.containers: set[str] = set()  # the module paths of the modules that hold them

    def graph(self, graph: ir.Graph, where: str) -> Graph:
        initializers: dict[str, str] = {}
        constants: dict[str, Known] = {}
        for value in graph.initializers.values():
            name = _ir.name_of(value)
            assert value.const_value is not None  # (an initializer of a model read from a file)
            tensor = _tensor(value.const_value, f"initializer '{name}' of {where}")
            attribute = self._attribute_name(name)
            kind = _weights.state_kind(value.const_value)
            if kind is not None:
                self.marked = True
                if kind in ("PARAMETER", "BUFFER (persistent)"):
                    self.state.add(attribute)
            self.tensors[attribute] = tensor
            initializers[name] = attribute
            if name in self.weights:
                self.parameters.add(attribute)
            known = _constant(tensor)
            if known is not None:
                constants[name] = known
        held = set()  # the Constant nodes: parameters where they hold weights, else buffers
        for node in graph:
            if node.op_type != "Constant" or not _ir.is_default_domain(node.domain):
                continue
            tensor = _constant_node_value(node, where)
            if tensor is None:  # (a string or sparse tensor: refused when it runs)
                continue
            name = _ir.name_of(node.outputs[0])
            attribute = self._attribute_name(name)
            self.tensors[attribute] = tensor
            initializers[name] = attribute
            held.add(node)
            if name in self.weights:
                self.parameters.add(attribute)
            else:  # (a constant of the graph, not an initializer: no state of the model's)
                self.transient.add(attribute)
                known = _constant(tensor)
                if known is not None:
                    constants[name] = known
        inputs = [v for v in graph.inputs if _ir.name_of(v) not in initializers]
        nodes = tuple(self.node(node, i, where) for i, node in enumerate(graph) if node not in held)
        return Graph(
            graph.name or "",
            tuple(_ir.name_of(v) for v in inputs),
            tuple(_ir.name_of(v) for v in graph.outputs),
            initializers,
            nodes,
            constants,
            tuple(_static_type(v) for v in graph.outputs),
            tuple(_inputs.declared(v) for v in inputs),
        )

    def node(self, node: ir.Node, index: int, graph_where: str) -> Node:
        domain = "" if _ir.is_default_domain(node.domain) else node.domain
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
        for name, attribute in node.attributes.items():
            # (no operator implemented takes a list of graphs; a function's attributes, which
            # its nodes may refer to, are bound where functions are inlined)
            if attribute.type == ir.AttributeType.GRAPH:
                attributes[name] = self.graph(
                    attribute.as_graph(), f"the {name} of {label} ({op}-{version})"
                )
            else:
                attributes[name] = _attribute_value(attribute, where)
        return Node(
            node.op_type,
            version,
            node.name or "",
            run,
            tuple("" if v is None else (v.name or "") for v in node.inputs),
            tuple(v.name or "" for v in node.outputs),
            attributes,
            where,
            domain,
        )

    def _attribute_name(self, onnx_name: str) -> str:
        """Where the module holds the tensor of ``onnx_name``: at that path where the name is
        one (``encoder.rnn.weight_ih_l0``, the ``state_dict`` name torch.onnx gives a
        parameter), so that ``state_dict`` names it as the model does; else (and where the path
        is taken or names an attribute of the module) ``init_`` and the name with every
        character that is not a letter, digit or ``_`` replaced."""
        parts = onnx_name.split(".")
        if (
            all(re.fullmatch(r"\w+", part) for part in parts)
            and not any(
                part in (_TAKEN if i == 0 else _TAKEN_INSIDE) for i, part in enumerate(parts)
            )
            and not any(".".join(parts[:i]) in self.used for i in range(1, len(parts)))
            and onnx_name not in self.used
            and onnx_name not in self.containers
        ):
            self.used.add(onnx_name)
            self.containers.update(".".join(parts[:i]) for i in range(1, len(parts)))
            return onnx_name
        name = re.sub(r"\W", "_", onnx_name) or "_"
        if name[0].isdigit():
            name = f"_{name}"
        name, base, count = f"init_{name}", f"init_{name}", 1
        while name in self.used or name in self.containers:
            count += 1
            name = f"{base}_{count}"
        self.used.add(name)
        return name


_TAKEN_INSIDE = frozenset(dir(torch.nn.Module()))
"""The names a module has of its own, which no tensor of the model can take."""
_TAKEN = _TAKEN_INSIDE | {"graph", "input_names", "output_names", "onnx_names"}


def _tensor(tensor: ir.TensorProtocol, what: str) -> torch.Tensor:
    """``tensor`` as a torch tensor; refused, naming ``what``, where torch has no dtype of its
    element type."""
    value = torch_tensor(tensor)
    if value is None:
        raise OnnxImportError(
            f"torchscan.onnx.to_torch: {what} is of element type {tensor.dtype.name.lower()}, "
            "which torch has no dtype of",
            not_implemented=True,
        )
    return value


def _constant_node_value(node: ir.Node, where: str) -> torch.Tensor | None:
    """The tensor of a ``Constant`` node of a numeric value, else None."""
    for name, attribute in node.attributes.items():
        if name == "value" and attribute.type == ir.AttributeType.TENSOR:
            value = attribute.as_tensor()
            if torch_dtype(value.dtype) is None:
                return None  # (refused when it runs, naming the node)
            return _tensor(value, where)
        if name in _CONSTANT_ATTRIBUTES:
            return torch.tensor(_plain(attribute.value), dtype=_CONSTANT_ATTRIBUTES[name])
    return None


_CONSTANT_ATTRIBUTES = {
    "value_float": torch.float32,
    "value_floats": torch.float32,
    "value_int": torch.int64,
    "value_ints": torch.int64,
}


def _plain(value: Any) -> Any:
    """An attribute's value as Python holds it: a list for a sequence."""
    return list(value) if isinstance(value, (tuple, list)) else value


def _attribute_value(attribute: ir.Attr, where: str) -> Any:
    if attribute.type == ir.AttributeType.TENSOR:
        value = attribute.as_tensor()
        if torch_dtype(value.dtype) is None:
            return value  # (strings: refused by the implementations that would read them)
        return _tensor(value, f"attribute '{attribute.name}' of {where}")
    if attribute.type == ir.AttributeType.TENSORS:
        return [_tensor(t, f"attribute '{attribute.name}' of {where}") for t in attribute.value]
    return _plain(attribute.value)


def _static_type(value: ir.Value) -> tuple[torch.dtype, tuple[int, ...]] | None:
    """The dtype and shape a value declares, where it declares a tensor whose every dimension
    is a number."""
    if not isinstance(value.type, ir.TensorType) or value.shape is None:
        return None
    dtype = torch_dtype(value.type.dtype)
    dims = [d for d in value.shape.dims if isinstance(d, int)]
    if dtype is None or len(dims) != len(value.shape.dims):
        return None
    return dtype, tuple(dims)


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


def decided(condition: torch.Tensor) -> bool | None:
    """While the module is traced: the value of a condition of one element known in Python
    (computed from shapes and constants, :func:`_fold`) where it holds for every size the trace
    allows, without a guard (``T != 0`` where ``torch.export`` takes ``T`` for at least 2); else
    None."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    known = _known(condition)
    if known is None or len(known[0]) != 1:
        return None
    value = known[0][0]
    if statically_known_true(value):
        return True
    if statically_known_true(torch.sym_not(value)):
        return False
    return None


def _known(value: Any) -> Known | None:
    trace = _current()
    return None if trace is None else trace.values(value)


_ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Max": torch.sym_max,
    "Min": torch.sym_min,
}


_COMPARISON: dict[str, Callable[[Any, Any], Any]] = {
    "Equal": lambda a, b: a == b,
    "Less": lambda a, b: a < b,
    "LessOrEqual": lambda a, b: a <= b,
    "Greater": lambda a, b: a > b,
    "GreaterOrEqual": lambda a, b: a >= b,
}


def _fold(node: Node, args: Sequence[Any], result: Any) -> Known | None:
    """The values of a node's one output, in Python, where they follow from values known in
    Python (:class:`_Trace`): ``Shape`` and ``Size`` of any tensor, small integer constants
    (``Constant``), and ``Identity``, ``Cast`` to an integer type or to bool, ``Gather``,
    ``Concat``, ``Slice``, ``Squeeze``, ``Unsqueeze``, ``Reshape`` (of one value), ``Add``,
    ``Sub``, ``Mul``, ``Max`` and ``Min`` of known 0-D and 1-D values, and ``Not`` and the
    comparisons of one known value with another (a condition on sizes). Anything else is not known
    (None): its consumers read the traced tensor."""
    op = node.op_type
    if not isinstance(result, torch.Tensor) or result.dim() > 1:
        return None
    if result.dtype not in _INTEGERS and result.dtype is not torch.bool:
        return None
    if op == "Shape":
        dims = list(args[0].shape)[node.attributes.get("start", 0) : node.attributes.get("end")]
        return dims, (len(dims),)
    if op == "Size":
        return [args[0].numel()], ()
    known = [None if a is None else _known(a) for a in args]
    if any(k is None for k, a in zip(known, args, strict=True) if a is not None) or not known:
        return None
    first = known[0]
    assert first is not None
    if op == "Identity" or (op == "Cast" and result.dtype in _INTEGERS):
        return first
    if op == "Cast" and result.dtype is torch.bool:
        return [v != 0 for v in first[0]], first[1]
    if op == "Not":
        return [torch.sym_not(v) for v in first[0]], first[1]
    if op in _COMPARISON and len(known) == 2 and known[1] is not None:
        (a, a_shape), (b, b_shape) = first, known[1]
        if len(a) != 1 or len(b) != 1:
            return None
        shape = a_shape if len(a_shape) >= len(b_shape) else b_shape
        return [_COMPARISON[op](a[0], b[0])], shape
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
    named after the initializer or ``Constant``: a name that is a module path (``rnn.weight``,
    as torch.onnx names a module's ``state_dict``) is kept, so that ``state_dict()`` loads
    into the module the model was exported from; any other is ``init_`` and the name with
    every character that is not a letter, digit or ``_`` replaced (:attr:`onnx_names` maps
    them back). Save the parameters with ``state_dict``, or the whole module with
    ``torch.save`` (it pickles, and ``copy.deepcopy`` copies it)."""

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        # (of a class made for the model's inputs, which pickle cannot find by name: made again)
        return (_unpickled_module, (self.input_names, self.__dict__))

    def __init__(
        self,
        graph: Graph,
        tensors: Mapping[str, torch.Tensor],
        parameters: AbstractSet[str],
        transient: AbstractSet[str] = frozenset(),
    ) -> None:
        super().__init__()
        for path, value in tensors.items():
            *outer, attribute = path.split(".")
            holder: torch.nn.Module = self
            for part in outer:
                if part not in holder._modules:
                    holder.add_module(part, torch.nn.Module())
                holder = getattr(holder, part)
            if path in parameters:
                holder.register_parameter(attribute, torch.nn.Parameter(value))
            else:
                holder.register_buffer(attribute, value, persistent=path not in transient)
        self.graph = graph
        self.input_names: tuple[str, ...] = graph.inputs
        self.output_names: tuple[str, ...] = graph.outputs

    @property
    def onnx_names(self) -> dict[str, str]:
        """The ONNX name of every initializer (and ``Constant`` held as a weight) of the main
        graph, by its name in the module's ``state_dict``."""
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
        if not _context.compiling():
            outputs = self._not_held(outputs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _not_held(self, outputs: list[Any]) -> list[Any]:
        """``outputs``, an output that is (or views) a tensor of the module copied: the caller
        may change it in place, and the module's constants must stay as they are."""
        held: set[int] | None = None
        copied = []
        for output in outputs:
            if isinstance(output, torch.Tensor) and output.device.type != "meta":
                if held is None:
                    tensors = itertools.chain(self.parameters(), self.buffers())
                    held = {t.untyped_storage().data_ptr() for t in tensors}
                if output.untyped_storage().data_ptr() in held:
                    output = output.clone()
            copied.append(output)
        return copied


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


def _lint(model: onnx.ModelProto) -> None:
    """Refuse a ``Scan`` or ``Loop`` that breaks its version's rules, in the words of
    ``torchscan check``'s lint, rather than fail when it first runs."""
    from torchscan.onnx._lint._driver import lint

    def loops(graph: onnx.GraphProto | onnx.FunctionProto) -> bool:
        return any(
            node.op_type in ("Scan", "Loop")
            or any(loops(a.g) for a in node.attribute if a.type == onnx.AttributeProto.GRAPH)
            for node in graph.node
        )

    if not loops(model.graph) and not any(loops(f) for f in model.functions):
        return
    try:
        findings: list[Any] = list(lint(model).findings)
    except ValueError:  # (what onnx_ir cannot read: refused, if at all, by what follows)
        return
    if findings:
        more = (
            f" (and {len(findings) - 1} more: torchscan check lists them)"
            if len(findings) > 1
            else ""
        )
        raise OnnxImportError(
            f"torchscan.onnx.to_torch: the model breaks the ONNX specification{more}: {findings[0]}"
        )


def _read(model: onnx.ModelProto) -> ir.Model:
    """``model`` in onnx_ir, where the importer reads it; what onnx_ir cannot read (maps, sparse
    tensors) refused, naming the value."""
    for graph, where in _graphs_of(model.graph, "the main graph"):
        for sparse in graph.sparse_initializer:
            raise OnnxImportError(
                f"torchscan.onnx.to_torch: {where} has a sparse initializer "
                f"'{sparse.values.name}', which to_torch does not implement",
                not_implemented=True,
            )
        for value in [*graph.input, *graph.output, *graph.value_info]:
            kind = _unreadable(value.type)
            if kind is not None:
                raise OnnxImportError(
                    f"torchscan.onnx.to_torch: {where}: '{value.name}' is {kind} (maps and "
                    "sparse tensors are not implemented)",
                    not_implemented=True,
                )
    return ir.serde.deserialize_model(model)


def _graphs_of(graph: onnx.GraphProto, where: str) -> Iterator[tuple[onnx.GraphProto, str]]:
    """``graph`` and the graphs nested in its nodes, each with the words that name it."""
    yield graph, where
    for index, node in enumerate(graph.node):
        label = f"node '{node.name}'" if node.name else f"node #{index}"
        for attribute in node.attribute:
            for inner in [attribute.g] if attribute.HasField("g") else attribute.graphs:
                yield from _graphs_of(inner, f"the {attribute.name} of {label} ({node.op_type})")


def _unreadable(type_: onnx.TypeProto) -> str | None:
    """What of ``type_`` onnx_ir cannot read (a map, a sparse tensor, within a sequence or an
    optional too), in words; else None."""
    kind = type_.WhichOneof("value")
    if kind == "map_type":
        return "a map"
    if kind == "sparse_tensor_type":
        return "a sparse tensor"
    if kind == "sequence_type":
        inner = _unreadable(type_.sequence_type.elem_type)
        return None if inner is None else f"a sequence of {inner.removeprefix('a ')}s"
    if kind == "optional_type":
        inner = _unreadable(type_.optional_type.elem_type)
        return None if inner is None else f"an optional {inner.removeprefix('a ')}"
    return None


def compile_model(
    model: onnx.ModelProto,
    trainable: Any = "weights",
    *,
    lint: bool = True,
    read: ir.Model | None = None,
) -> OnnxModule:
    """``model`` as an :class:`OnnxModule` (see the module's docstring), the tensors
    ``trainable`` names (:func:`._weights.trainable_names`) its parameters. The check tool,
    which lints the model's loops and reads it into onnx_ir itself, passes ``lint=False`` and
    the model it ``read`` (used where no local function is inlined first)."""
    model = _typed_outputs(model)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as error:
        first = str(error).strip().splitlines()[0]
        raise OnnxImportError(
            f"torchscan.onnx.to_torch: the model fails onnx.checker: {first}"
        ) from None
    if lint:
        _lint(model)
    if model.functions:
        read = None
        try:  # (a function whose opset imports differ from the model's: converted as inlined)
            model = onnx.inliner.inline_local_functions(model, convert_version=True)
        except Exception:  # (what the converter cannot convert stays a call, refused below)
            model = onnx.inliner.inline_local_functions(model)
    if read is None:
        read = _read(model)
    opsets = {op_key(d, "", 0)[0]: v for d, v in read.opset_imports.items()}
    compiler = _Compiler(opsets, _weights.trainable_names(read, trainable))
    graph = compiler.graph(read.graph, "the main graph")
    transient = compiler.transient
    if compiler.marked:  # the buffers that are not the state of the module the model was made of
        transient = set(compiler.tensors) - compiler.state - compiler.parameters
    module_class = _module_class(graph.inputs)
    return module_class(graph, compiler.tensors, compiler.parameters, transient)


__all__ = [
    "Call",
    "Graph",
    "Node",
    "OnnxModule",
    "compile_model",
    "decided",
    "ints",
    "torch_dtype",
]
