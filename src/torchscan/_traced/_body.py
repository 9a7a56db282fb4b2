"""Tracing a loop body into a subgraph of the outer program, and recording the call."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from torchscan._compat import (
    HigherOrderOperator,
    ProxyTorchDispatchMode,
    detect_fake_mode,
    pytree,
    reenter_make_fx,
    symbolic_symbols,
    track_tensor_tree,
    unique_graph_id,
    written_arguments,
)
from torchscan._errors import ExportError
from torchscan._inplace import METADATA_ONLY
from torchscan._source import StepSource, name_in
from torchscan._traced import _step_errors
from torchscan._traced._indexing import body_indexing

# -- tracing a body ----------------------------------------------------------------------------


def trace_body(
    mode: ProxyTorchDispatchMode,
    body: Callable,
    sample_inputs: Sequence[Any],
    captured: Sequence[Any],
) -> tuple[torch.fx.GraphModule, tuple[Any, ...]]:
    """Trace ``body(*sample_inputs, *captured)`` into a graph module whose only free values are
    its inputs, and return it with the full list of captured values.

    Tensors the body reads by closure (parameters, buffers, values of the outer graph, and
    constants it builds) arrive in the trace as attributes; they become trailing inputs, so that
    the outer graph passes them in (and, for a nested loop, lifts them further out). Sizes of the
    outer graph that the body reads (``n = x.shape[0]``) are offered as inputs too, and kept
    when used. Outputs that repeat another output or an input get a copy: ONNX and torch.export
    both want every body output to be a value of its own. The graph module keeps the step
    function ``body`` stands for, which refusals name, and a body that calls an operator with a
    side effect is refused.
    """
    step = _step_errors.step_of(body)
    n_inputs = len(sample_inputs) + len(captured)
    symbols = _outer_symbols(mode.tracer)

    def body_with_symbols(*args):
        return body(*args[:n_inputs])

    with as_traced_body():
        gm = reenter_make_fx(body_with_symbols)(*sample_inputs, *captured, *symbols)
    _step_errors.refuse_side_effects(gm, step)
    _step_errors.keep_with_graph(gm, step)
    used_symbols = _drop_unused_symbols(gm, n_inputs, symbols)
    lifted = _lift_closure_tensors(gm)
    _copy_aliased_outputs(gm)
    gm.recompile()  # once, after the three edits of the graph
    return gm, (*captured, *used_symbols, *lifted)


@contextlib.contextmanager
def as_traced_body() -> Iterator[None]:
    """Where a body runs on fake tensors (traced, probed, or run for its shapes): indexing as
    at the top level of an exported model, and sizes read from data kept to the body."""
    with _ignore_fresh_unbacked_symbols(), _export_indexing():
        yield


def _export_indexing() -> Any:
    """Indexing with 0-d integer tensors (the step number, values read with it) that never
    reads their values: see ``_indexing``. torch.export's non-strict mode does part of it at the
    top level of a model, but a body is traced below the operator's dispatch, where that handler
    is no longer active."""
    return body_indexing()


def _ignore_fresh_unbacked_symbols() -> Any:
    """Sizes a body computes from data (``x[i]`` with a tensor ``i`` reads ``i``'s value) belong to
    the body: they must not be taken for outputs of the outer graph, as torch's while_loop does."""
    fake_mode = detect_fake_mode()
    if fake_mode is None or fake_mode.shape_env is None:
        return contextlib.nullcontext()
    return fake_mode.shape_env.ignore_fresh_unbacked_symbols()


def record(
    mode: ProxyTorchDispatchMode,
    op: HigherOrderOperator,
    body_gm: torch.fx.GraphModule,
    args: tuple,
    example: tuple,
) -> Any:
    """Add one call of ``op`` with ``args`` to the outer graph; ``example`` gives its outputs."""
    _, name = unique_graph_id(mode, prefix=f"{op.name()}_body")
    mode.tracer.root.register_module(name, body_gm)
    proxy_args = pytree.tree_map(mode.tracer.unwrap_proxy, args)
    out_proxy = mode.tracer.create_proxy("call_function", op, proxy_args, {}, name=op.name())
    return track_tensor_tree(example, out_proxy, constant=None, tracer=mode.tracer)


def output_values(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return [node.meta["val"] for node in output.args[0]]


def _outer_symbols(tracer: Any) -> list[torch.SymInt]:
    import sympy

    tracked = symbolic_symbols(tracer)
    symbols = [v.value for expr, v in tracked.items() if isinstance(expr, sympy.Symbol)]
    return sorted(symbols, key=lambda s: str(s.node.expr))


def _drop_unused_symbols(
    gm: torch.fx.GraphModule, n_inputs: int, symbols: list[torch.SymInt]
) -> list[torch.SymInt]:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    used = []
    for node, symbol in zip(placeholders[n_inputs:], symbols, strict=True):
        if node.users:
            used.append(symbol)
        else:
            gm.graph.erase_node(node)
    return used


def _lift_closure_tensors(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    """Turn every tensor attribute of ``gm`` into a trailing input; return those tensors."""
    graph = gm.graph
    anchor = [n for n in graph.nodes if n.op == "placeholder"][-1]
    lifted: list[torch.Tensor] = []
    inputs: dict[int, torch.fx.Node] = {}
    targets = set()
    for node in list(graph.nodes):
        value = getattr(gm, node.target, None) if node.op == "get_attr" else None
        if not isinstance(value, torch.Tensor):
            continue
        placeholder = inputs.get(id(value))
        if placeholder is None:
            with graph.inserting_after(anchor):
                placeholder = graph.placeholder(f"captured_{len(lifted)}")
            placeholder.meta["val"] = value
            anchor = inputs[id(value)] = placeholder
            lifted.append(value)
        node.replace_all_uses_with(placeholder)
        graph.erase_node(node)
        targets.add(node.target)
    for target in targets:
        delattr(gm, target)
    return lifted


def _copy_aliased_outputs(gm: torch.fx.GraphModule) -> None:
    graph = gm.graph
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    values = list(output.args[0])
    seen: set[torch.fx.Node] = set()
    for i, value in enumerate(values):
        if value in seen or value.op == "placeholder":
            with graph.inserting_before(output):
                copy = graph.call_function(torch.ops.aten.clone.default, (value,))
            copy.meta = dict(value.meta)
            values[i] = copy
        seen.add(values[i])
    output.args = (tuple(values),)


@dataclasses.dataclass(frozen=True)
class Written:
    """One input of a body that it writes into in place: the position of a sequence of the scan
    (``sequence``), or the name of a tensor it reads by closure (``closure``); ``op`` is the
    operator (``add_``) and ``where`` the user's line (`` at file.py:12``) or ``""``."""

    sequence: int | None
    closure: str
    op: str
    where: str

    def text(self, names: Sequence[str]) -> str:
        if self.sequence is not None:
            what = f"a slice of {names[self.sequence]}" if names else "a slice of xs"
        else:
            what = self.closure
        return f"{what} with {self.op}{self.where}"


class InPlaceWrite(ExportError):
    """A body writes in place into what it may not: slices of the scan's sequences, or tensors it
    reads by closure (a module's buffer, a parameter). :meth:`naming` words it with the names of
    the sequences."""

    def __init__(
        self, step: StepSource | None, written: Sequence[Written], names: Sequence[str] = ()
    ) -> None:
        self.step, self.written = step, list(written)
        self.sequences = [w.sequence for w in self.written if w.sequence is not None]
        who = step.who if step is not None else "torch.onnx.export: the loop body"
        what = " and ".join(dict.fromkeys(w.text(names) for w in self.written))
        super().__init__(
            f"{who} modifies in place {what}, which an exported loop cannot do (the model would "
            "compute something else than eager PyTorch). Return the new value as part of the "
            "carry instead (a running statistic or a counter updated at every step is a carry "
            "of the loop)."
        )

    def naming(self, names: Sequence[str]) -> InPlaceWrite:
        """The same refusal, naming the sequences by ``names`` (``xs['b']``)."""
        return InPlaceWrite(self.step, self.written, names)


def mutated_inputs(gm: torch.fx.GraphModule) -> dict[int, torch.fx.Node]:
    """The inputs of ``gm`` that an operator of it writes into, through a view or directly, by
    position, with the first node that does; a shape-only change of a view
    (``x.view(...).squeeze_()``) changes no input."""
    storages: dict[StorageWeakRef, int] = {}
    for i, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            storages.setdefault(StorageWeakRef(value.untyped_storage()), i)
    mutated: dict[int, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        op, written = written_arguments(node)
        for arg in written:
            if not isinstance(arg, torch.fx.Node):
                continue
            if op in METADATA_ONLY and arg.op != "placeholder":
                continue
            value = arg.meta.get("val")
            if isinstance(value, torch.Tensor):
                found = storages.get(StorageWeakRef(value.untyped_storage()))
                if found is not None:
                    mutated.setdefault(found, node)
    return mutated


def refuse_mutation(
    gm: torch.fx.GraphModule, n_carries: int, n_sequences: int, captured: Sequence[Any] = ()
) -> None:
    """A body that writes in place into a sequence slice or a captured tensor has an effect an
    ONNX loop cannot express; the carry is a per-step value and may be changed freely.
    ``captured`` are the values of the inputs after the carries and sequences, which the
    refusal names where the step function's closure, globals or ``self`` hold them."""
    bad = {i: node for i, node in mutated_inputs(gm).items() if i >= n_carries}
    if not bad:
        return
    step = _step_errors.step_of(gm)
    written = []
    for i, node in sorted(bad.items()):
        op = written_arguments(node)[0] or str(node.target)
        where = _step_errors.where(step, node) if step is not None else ""
        if i < n_carries + n_sequences:
            written.append(Written(i - n_carries, "", op, where))
            continue
        position = i - n_carries - n_sequences
        value = captured[position] if position < len(captured) else None
        written.append(Written(None, _closure_name(step, value), op, where))
    raise InPlaceWrite(step, written)


def _closure_name(step: StepSource | None, value: Any) -> str:
    if isinstance(value, torch.Tensor) and step is not None and step.function is not None:
        found = name_in(step.function, value)
        if not found.startswith("a tensor "):
            return found
    return "a tensor it reads by closure"
