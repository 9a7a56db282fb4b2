"""torchscan's higher-order operators: what ``scan`` becomes while a model is being exported.

Eagerly, ``scan`` is a Python loop. Under ``torch.export`` (which ``torch.onnx.export(...,
dynamo=True)`` runs) it calls the operator ``torchscan_scan`` instead, so that the exported program
holds one node with the traced body as a subgraph and the loop's static description (the axis and
direction of every sequence and output) as plain Python arguments. ``torchscan.onnx`` translates
that node into one ONNX ``Scan``.

``torchscan_scan(body, carries, xs, captured, in_axes, in_reverse, out_axes, out_reverse)``
returns ``(*final_carries, *ys)``. ``body(*carries, *x_slices, *captured)`` returns
``(*new_carries, *y_slices)``; every argument is a flat tuple of tensors (pytrees and ``None``
leaves are handled before and after, in ``traced_scan``). ``out_axes`` and ``out_reverse`` may
hold one entry to apply to every output, since the number of outputs is only known once the body
has been traced.

The operator follows ``torch/_higher_order_ops/scan.py``: a dense implementation (so that
``ExportedProgram.module()`` runs), a fake one for shapes, functionalization, and a tracing one
that records the body as a subgraph. Tracing also does what torch's own scan refuses to: outputs
that alias each other or an input (``return h, h``) get a copy, and tensors and sizes the body
captures by closure become explicit inputs.

Everything here uses torch's private APIs, all imported from ``torchscan._compat``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from torchscan import _checks, _pytree, _steps
from torchscan._compat import (
    DispatchKey,
    HigherOrderOperator,
    ProxyTorchDispatchMode,
    autograd_not_implemented,
    check_input_alias_and_mutation_return_outputs,
    detect_fake_mode,
    disable_proxy_modes_tracing,
    maybe_run_with_interpreter,
    non_strict_torch_function_handler,
    pytree,
    reenter_make_fx,
    register_fake,
    symbolic_symbols,
    track_tensor_tree,
    unique_graph_id,
)
from torchscan._errors import ExportError, TorchscanValueError


class ScanOp(HigherOrderOperator):
    def __init__(self) -> None:
        super().__init__("torchscan_scan")

    def __call__(self, body, carries, xs, captured, in_axes, in_reverse, out_axes, out_reverse):
        return super().__call__(
            body,
            tuple(carries),
            tuple(xs),
            tuple(captured),
            tuple(int(a) for a in in_axes),
            tuple(bool(r) for r in in_reverse),
            tuple(int(a) for a in out_axes),
            tuple(bool(r) for r in out_reverse),
        )


torchscan_scan = ScanOp()


# -- shapes ------------------------------------------------------------------------------------


def _broadcast(values: tuple, n: int) -> tuple:
    return values * n if len(values) == 1 else values


def _stacking_axis(axis: int, slice_rank: int) -> int:
    return axis % (slice_rank + 1)


def _slice_like(x: torch.Tensor, axis: int) -> torch.Tensor:
    """A fresh tensor shaped like one step of ``x``: indexing would guard on the length."""
    shape = list(x.shape)
    del shape[axis]
    return x.new_empty(shape)


def _stacked_like(y: torch.Tensor, length: Any, axis: int) -> torch.Tensor:
    shape = list(y.shape)
    shape.insert(axis, length)
    return y.new_empty(shape)


def _scan_length(xs: Sequence[torch.Tensor], in_axes: Sequence[int]) -> Any:
    return xs[0].shape[in_axes[0]]


# -- implementations ---------------------------------------------------------------------------


@torchscan_scan.py_impl(DispatchKey.CompositeExplicitAutograd)
def _dense(body, carries, xs, captured, in_axes, in_reverse, out_axes, out_reverse):
    length = _scan_length(xs, in_axes)
    if length == 0:
        empty = _fake(body, carries, xs, captured, in_axes, in_reverse, out_axes, out_reverse)
        return (*carries, *empty[len(carries) :])
    carries = list(carries)
    steps = []
    for k in range(length):
        x = [
            leaf.select(a, length - 1 - k if r else k)
            for leaf, a, r in zip(xs, in_axes, in_reverse, strict=True)
        ]
        out = body(*carries, *x, *captured)
        carries = list(out[: len(carries)])
        steps.append(out[len(carries) :])
    n_ys = len(steps[0])
    outputs = []
    for j, (a, r) in enumerate(
        zip(_broadcast(out_axes, n_ys), _broadcast(out_reverse, n_ys), strict=True)
    ):
        column = [step[j] for step in steps]
        if r:
            column.reverse()
        outputs.append(torch.stack(column, dim=_stacking_axis(a, column[0].ndim)))
    return (*carries, *outputs)


@register_fake(torchscan_scan, skip_cache=True)
def _fake(body, carries, xs, captured, in_axes, in_reverse, out_axes, out_reverse):
    x = [_slice_like(leaf, a) for leaf, a in zip(xs, in_axes, strict=True)]
    with _as_traced_body():
        out = body(*carries, *x, *captured)
    ys = out[len(carries) :]
    length = _scan_length(xs, in_axes)
    axes = _broadcast(out_axes, len(ys))
    return (
        *[c.new_empty(c.shape) for c in carries],
        *[
            _stacked_like(y, length, _stacking_axis(a, y.ndim))
            for y, a in zip(ys, axes, strict=True)
        ],
    )


# Export records inference graphs; a backward through the operator is never needed there.
torchscan_scan.py_impl(DispatchKey.Autograd)(
    autograd_not_implemented(torchscan_scan, deferred_error=True)
)


@torchscan_scan.py_functionalize_impl
def _functionalize(ctx, body, carries, xs, captured, in_axes, in_reverse, out_axes, out_reverse):
    unwrapped = [ctx.unwrap_tensors(group) for group in (carries, xs, captured)]
    with ctx.redispatch_to_next():
        functional_body = ctx.functionalize(maybe_run_with_interpreter(body))
        out = torchscan_scan(
            functional_body, *unwrapped, in_axes, in_reverse, out_axes, out_reverse
        )
    return ctx.wrap_tensors(out)


@torchscan_scan.py_impl(ProxyTorchDispatchMode)
def _trace(mode, body, carries, xs, captured, in_axes, in_reverse, out_axes, out_reverse):
    with disable_proxy_modes_tracing():
        # Cloned, so that a closure reference to the initial carry stays the outer value.
        sample_carries = [c.clone() for c in carries]
        sample_xs = [_slice_like(leaf, a) for leaf, a in zip(xs, in_axes, strict=True)]
    body_gm, captured = trace_body(mode, body, [*sample_carries, *sample_xs], captured)
    _refuse_mutation(body_gm, len(carries), len(xs))
    outputs = _output_values(body_gm)
    ys = outputs[len(carries) :]
    out_axes = tuple(
        _stacking_axis(a, y.ndim) for a, y in zip(_broadcast(out_axes, len(ys)), ys, strict=True)
    )
    out_reverse = _broadcast(out_reverse, len(ys))
    args = (body_gm, carries, xs, captured, in_axes, in_reverse, out_axes, out_reverse)
    length = _scan_length(xs, in_axes)
    with disable_proxy_modes_tracing():
        example = (
            *[c.new_empty(c.shape) for c in carries],
            *[_stacked_like(y, length, a) for y, a in zip(ys, out_axes, strict=True)],
        )
    return record(mode, torchscan_scan, body_gm, args, example)


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
    both want every body output to be a value of its own.
    """
    n_inputs = len(sample_inputs) + len(captured)
    symbols = _outer_symbols(mode.tracer)

    def body_with_symbols(*args):
        return body(*args[:n_inputs])

    with _as_traced_body():
        gm = reenter_make_fx(body_with_symbols)(*sample_inputs, *captured, *symbols)
    used_symbols = _drop_unused_symbols(gm, n_inputs, symbols)
    lifted = _lift_closure_tensors(gm)
    _copy_aliased_outputs(gm)
    gm.recompile()  # once, after the three edits of the graph
    return gm, (*captured, *used_symbols, *lifted)


@contextlib.contextmanager
def _as_traced_body() -> Iterator[None]:
    """Where a body runs on fake tensors (traced, probed, or run for its shapes): indexing as
    at the top level of an exported model, and sizes read from data kept to the body."""
    with _ignore_fresh_unbacked_symbols(), _export_indexing():
        yield


def _export_indexing() -> Any:
    """Indexing as torch.export's non-strict mode does it at the top level of a model, where
    ``x[i]`` with a 0-d integer tensor ``i`` becomes ``select(x, 0, i.item())`` instead of
    failing on a value known only when the model runs. A body is traced below the operator's
    dispatch, where that handler is no longer active."""

    class BodyIndexing(non_strict_torch_function_handler()):
        def _override(self, func, args, kwargs):
            if getattr(func, "__name__", "") == "__getitem__" and len(args) == 2:
                args = (args[0], _pytree.tree_map(_own_index, args[1], is_leaf=_is_index_leaf))
            return super()._override(func, args, kwargs)

    return BodyIndexing()


def _is_index_leaf(item: Any) -> bool:
    return isinstance(item, (torch.Tensor, slice))


def _own_index(item: Any) -> Any:
    """A tensor index of the body's own trace. A tensor of an enclosing trace (``w[i]`` in a
    scan nested in a loop reads the loop's ``i``) reaches a nested body as a constant, and the
    value read from a constant is known to no trace; a copy made in the body is its own."""
    if isinstance(item, slice):
        return slice(*(_own_index(bound) for bound in (item.start, item.stop, item.step)))
    if isinstance(item, torch.Tensor) and item.ndim == 0 and not item.is_floating_point():
        return item.clone()
    return item


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


def _output_values(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
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


def _refuse_mutation(gm: torch.fx.GraphModule, n_carries: int, n_sequences: int) -> None:
    """A body that writes in place into a sequence slice or a captured tensor has an effect an
    ONNX loop cannot express; the carry is a per-step value and may be changed freely."""
    *_, mutated, _ = check_input_alias_and_mutation_return_outputs(gm)
    bad = sorted(i for i in set(mutated) if i >= n_carries)
    if bad:
        what = [
            "a slice of xs" if i < n_carries + n_sequences else "a tensor it reads by closure"
            for i in bad
        ]
        raise ExportError(
            "torchscan: the loop body modifies in place "
            f"{' and '.join(dict.fromkeys(what))}, which an exported loop cannot do (the model "
            "would compute something else than eager PyTorch). Return the new value as part of "
            "the carry instead."
        )


# -- from pytrees to the operators -------------------------------------------------------------


class _StopsEarly(Exception):
    """Raised out of the trace of a scan's step that returns ``until``: a Scan cannot stop
    early, so the scan is traced again as a loop."""


class _FlatStep:
    """A step function seen through flat tensors, as the operators call it.

    Pytrees become flat lists of tensors, ``None`` leaves (which an operator's tensors cannot
    hold) are dropped on the way in and put back on the way out, and ``until`` becomes a last
    output. What the step returns (its ``y`` structure, whether it stops) is learned the first
    time it runs.
    """

    def __init__(self, protocol: Any, carry_type: _checks.CarryType, never_ends: str = "") -> None:
        self.protocol, self.carry_type, self.never_ends = protocol, carry_type, never_ends
        self.present = [leaf is not None for leaf in carry_type.leaves]
        self.carries = [leaf for leaf in carry_type.leaves if leaf is not None]
        self.y_spec: Any = None
        self.y_present: list[bool] = []
        self.has_until = False
        # Set while a scan is traced as a Scan before it is known whether fn stops early.
        self.refuse_until = False

    def carry(self, leaves: Sequence[Any]) -> Any:
        return _pytree.tree_unflatten(_fill(self.present, leaves), self.carry_type.spec)

    def flatten(self, out: Any) -> tuple[Any, ...]:
        """The flat outputs of one step: new carries, ``y`` leaves, and the stop flag."""
        self.has_until = self.protocol.has_until(out)
        if self.has_until and self.refuse_until:
            raise _StopsEarly
        if self.never_ends and not self.has_until:
            raise TorchscanValueError(self.never_ends)
        self.carry_type.check(out[0], "")
        y_leaves, self.y_spec = _pytree.tree_flatten(out[1])
        _checks.check_tensor_leaves(self.protocol.api, "y", out[1], y_leaves)
        self.y_present = [leaf is not None for leaf in y_leaves]
        stop = [self.protocol.check_stop(out[2].stop, 0)] if self.has_until else []
        return (
            *[leaf for leaf in _pytree.tree_leaves(out[0]) if leaf is not None],
            *[leaf for leaf in y_leaves if leaf is not None],
            *stop,
        )

    def probe(self, step: Callable, *args: Any) -> None:
        """Run ``step`` once on fake copies of ``args``, outside the trace, to learn what it
        returns: whether it stops decides which operator it becomes."""
        with disable_proxy_modes_tracing(), _as_traced_body():
            step(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])

    def unflatten(self, out: Sequence[Any]) -> tuple[Any, Any]:
        n = len(self.carries)
        ys = _pytree.tree_unflatten(_fill(self.y_present, out[n:]), self.y_spec)
        return self.carry(out[:n]), ys


def traced_scan(
    fn: Callable,
    plan: _checks.ScanPlan,
    protocol: _steps.Protocol,
    axis: int,
    reverse: bool,
    reverse_ys: bool,
) -> tuple[Any, Any]:
    """``scan`` under ``torch.export``: one ``torchscan_scan`` call on the flat tensors, or, when
    ``fn`` returns ``until``, one ``torchscan_loop`` call (a Scan cannot stop early).

    ``plan`` is the checked description of the call, ``protocol`` reads and checks what ``fn``
    returns in the words of the public function; ``reverse``
    reverses the order of the steps and ``reverse_ys`` the order in which ``ys`` are stacked.
    """
    flat = _FlatStep(protocol, plan.carry_type)
    x_present = [leaf is not None for leaf in plan.xs_leaves]
    xs = [leaf for leaf in plan.xs_leaves if leaf is not None]
    in_axes = [a for a, present in zip(plan.axes, x_present, strict=True) if present]

    def x_of(slices: Sequence[Any]) -> Any:
        return _pytree.tree_unflatten(_fill(x_present, slices), plan.xs_spec)

    def step(*args):
        n = len(flat.carries)
        return flat.flatten(fn(flat.carry(args[:n]), x_of(args[n : n + len(xs)])))

    # Whether fn stops early decides which operator the scan becomes, and only running fn tells.
    # Tracing it as a Scan is what almost every scan needs, so that is tried first rather than
    # running fn once more beforehand: a step that returns until interrupts the trace, before
    # anything is recorded in the outer graph, and the scan is traced again as a loop.
    scan_xs, scan_axes = (xs, in_axes) if xs else _empty_sequence(plan.length)
    flat.refuse_until = True
    try:
        out = torchscan_scan(
            lambda *args: step(*args[: len(flat.carries) + len(xs)]),
            flat.carries,
            scan_xs,
            (),
            scan_axes,
            (reverse,) * len(scan_xs),
            (axis,),
            (reverse_ys,),
        )
    except _StopsEarly:
        flat.refuse_until = False
        return _scan_as_loop(fn, flat, xs, in_axes, x_of, plan.length, axis, reverse, reverse_ys)
    finally:
        flat.refuse_until = False
    return flat.unflatten(out)


def _empty_sequence(length: Any) -> tuple[list[torch.Tensor], list[int]]:
    """A Scan needs a sequence to count its steps: an empty one, ``(length, 0)``, costs
    nothing."""
    return [torch.empty(length, 0)], [0]


def _scan_as_loop(
    fn, flat, xs, in_axes, x_of, length, axis, reverse, reverse_ys
) -> tuple[Any, Any]:
    """A scan that stops early, as a loop over the sequence positions it reads with ``i``."""

    def step(i, *args):
        t = length - 1 - i if reverse else i
        slices = [
            torch.index_select(x, a, t.reshape(1)).squeeze(a)
            for x, a in zip(xs, in_axes, strict=True)
        ]
        return flat.flatten(fn(flat.carry(args), x_of(slices)))

    out = torchscan_loop(step, length, None, flat.carries, (), True)
    carry, ys = flat.unflatten(out)
    # The loop stacks in the order the steps ran, on axis 0.
    ys = _pytree.tree_map(
        lambda y: None if y is None else (y.flip(0) if reverse_ys else y).movedim(0, axis % y.ndim),
        ys,
    )
    return carry, ys


def _fill(present: Sequence[bool], values: Sequence[Any]) -> list[Any]:
    """Put ``values`` where ``present`` is true and ``None`` elsewhere."""
    it = iter(values)
    return [next(it) if p else None for p in present]


# -- loop --------------------------------------------------------------------------------------


class LoopOp(HigherOrderOperator):
    """``torchscan_loop(body, trip_count, cond, carries, captured, has_until)`` returns
    ``(*final_carries, *ys)``; ``body(i, *carries, *captured)`` returns ``(*new_carries,
    *y_slices)`` followed by the stop flag when ``has_until``. ``trip_count`` is an int, a size
    of the traced program, a 0-d integer tensor or None; ``cond`` a 0-d bool tensor or None."""

    def __init__(self) -> None:
        super().__init__("torchscan_loop")

    def __call__(self, body, trip_count, cond, carries, captured, has_until):
        return super().__call__(
            body, trip_count, cond, tuple(carries), tuple(captured), bool(has_until)
        )


torchscan_loop = LoopOp()


def _n_ys(out: Sequence[Any], n_carries: int, has_until: bool) -> int:
    return len(out) - n_carries - int(has_until)


@torchscan_loop.py_impl(DispatchKey.CompositeExplicitAutograd)
def _loop_dense(body, trip_count, cond, carries, captured, has_until):
    keep_going = True if cond is None else bool(cond)
    trips = None if trip_count is None else int(trip_count)
    carries, steps, i = list(carries), [], 0
    while keep_going and (trips is None or i < trips):
        out = body(torch.tensor(i), *carries, *captured)
        n_ys = _n_ys(out, len(carries), has_until)
        carries, ys = list(out[: len(carries)]), out[len(carries) : len(carries) + n_ys]
        steps.append(ys)
        if has_until:
            keep_going = not bool(out[-1])
        i += 1
    if not steps:
        empty = _loop_fake(body, trip_count, cond, carries, captured, has_until)
        return (*carries, *(y.new_empty(y.shape) for y in empty[len(carries) :]))
    return (*carries, *(torch.stack(column) for column in zip(*steps, strict=True)))


@register_fake(torchscan_loop, skip_cache=True)
def _loop_fake(body, trip_count, cond, carries, captured, has_until):
    reference = next(iter([*carries, *captured]), None)
    i = torch.zeros((), dtype=torch.int64, device=None if reference is None else reference.device)
    with _as_traced_body():
        out = body(i, *carries, *captured)
    ys = out[len(carries) : len(carries) + _n_ys(out, len(carries), has_until)]
    length = _loop_length(trip_count, cond, has_until)
    return (
        *[c.new_empty(c.shape) for c in carries],
        *[_stacked_like(y, length, 0) for y in ys],
    )


def _loop_length(trip_count: Any, cond: Any, has_until: bool) -> Any:
    """The number of iterations as the fake implementation sees it: the trip count when nothing
    else can stop the loop, else a new size known only when the model runs."""
    if not has_until and cond is None and isinstance(trip_count, (int, torch.SymInt)):
        return trip_count
    shape_env = detect_fake_mode().shape_env
    length = shape_env.create_unbacked_symint()
    torch._check(length >= 0)
    return length


torchscan_loop.py_impl(DispatchKey.Autograd)(
    autograd_not_implemented(torchscan_loop, deferred_error=True)
)


@torchscan_loop.py_functionalize_impl
def _loop_functionalize(ctx, body, trip_count, cond, carries, captured, has_until):
    unwrapped = [ctx.unwrap_tensors(group) for group in (trip_count, cond, carries, captured)]
    with ctx.redispatch_to_next():
        functional_body = ctx.functionalize(maybe_run_with_interpreter(body))
        out = torchscan_loop(functional_body, *unwrapped, has_until)
    return ctx.wrap_tensors(out)


@torchscan_loop.py_impl(ProxyTorchDispatchMode)
def _loop_trace(mode, body, trip_count, cond, carries, captured, has_until):
    with disable_proxy_modes_tracing():
        sample_carries = [c.clone() for c in carries]
        reference = next(iter([*carries, *captured]), None)
        i = torch.zeros(
            (), dtype=torch.int64, device=None if reference is None else reference.device
        )
    body_gm, captured = trace_body(mode, body, [i, *sample_carries], captured)
    _refuse_mutation(body_gm, 1 + len(carries), 0)
    args = (body_gm, trip_count, cond, carries, captured, has_until)
    outputs = _output_values(body_gm)
    ys = outputs[len(carries) : len(carries) + _n_ys(outputs, len(carries), has_until)]
    # From the traced body, not by running it again: a scan or loop nested in it would be traced
    # anew outside the tracer that knows the sizes it reads.
    with disable_proxy_modes_tracing():
        length = _loop_length(trip_count, cond, has_until)
        example = (
            *[c.new_empty(c.shape) for c in carries],
            *[_stacked_like(y, length, 0) for y in ys],
        )
    return record(mode, torchscan_loop, body_gm, args, example)


def traced_loop(
    body: Callable,
    carry_type: _checks.CarryType,
    trip_count: Any,
    cond: Any,
    protocol: _steps.Protocol,
    never_ends: str,
) -> tuple[Any, Any]:
    """``loop`` under ``torch.export``: one ``torchscan_loop`` call on the flat tensors.

    ``protocol`` reads and checks what ``body`` returns; ``never_ends`` is the message for a body
    that returns no ``until`` where nothing else ends the loop (empty where something does)."""
    flat = _FlatStep(protocol, carry_type, never_ends)

    def step(i, *args):
        return flat.flatten(body(i, flat.carry(args)))

    reference = next(iter(flat.carries), None)
    with disable_proxy_modes_tracing():
        i = torch.zeros((), dtype=torch.int64, device=getattr(reference, "device", None))
    flat.probe(step, i, *flat.carries)
    if isinstance(cond, bool):
        cond = torch.tensor(cond)
    out = torchscan_loop(step, trip_count, cond, flat.carries, (), flat.has_until)
    return flat.unflatten(out)
