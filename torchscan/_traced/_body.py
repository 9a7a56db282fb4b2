"""Tracing a loop body into a subgraph of the outer program, and recording the call."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from torchscan._compat import (
    HigherOrderOperator,
    ProxyTorchDispatchMode,
    check_input_alias_and_mutation_return_outputs,
    detect_fake_mode,
    pytree,
    reenter_make_fx,
    symbolic_symbols,
    track_tensor_tree,
    unique_graph_id,
)
from torchscan._errors import ExportError
from torchscan._traced import _step_errors
from torchscan._traced._indexing import BodyIndexing

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
    return BodyIndexing()


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


class InPlaceWrite(ExportError):
    """A body writes in place into what it may not: ``sequences`` are the positions, among the
    scan's sequences, of those whose slices it writes into, ``closure`` whether it writes into a
    tensor it reads by closure. :meth:`naming` words it with the names of the sequences."""

    def __init__(self, sequences: list[int], closure: bool, names: Sequence[str] = ()) -> None:
        self.sequences, self.closure = sequences, closure
        what = [
            *(f"a slice of {names[i]}" if names else "a slice of xs" for i in sequences),
            *(["a tensor it reads by closure"] if closure else []),
        ]
        super().__init__(
            "torchscan: the loop body modifies in place "
            f"{' and '.join(dict.fromkeys(what))}, which an exported loop cannot do (the model "
            "would compute something else than eager PyTorch). Return the new value as part of "
            "the carry instead."
        )

    def naming(self, names: Sequence[str]) -> InPlaceWrite:
        """The same refusal, naming the sequences by ``names`` (``xs['b']``)."""
        return InPlaceWrite(self.sequences, self.closure, names)


def refuse_mutation(gm: torch.fx.GraphModule, n_carries: int, n_sequences: int) -> None:
    """A body that writes in place into a sequence slice or a captured tensor has an effect an
    ONNX loop cannot express; the carry is a per-step value and may be changed freely."""
    *_, mutated, _ = check_input_alias_and_mutation_return_outputs(gm)
    bad = sorted(i for i in set(mutated) if i >= n_carries)
    if bad:
        sequences = [i - n_carries for i in bad if i < n_carries + n_sequences]
        raise InPlaceWrite(sequences, closure=len(sequences) < len(bad))
