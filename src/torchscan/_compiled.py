"""``scan`` and ``loop`` under ``torch.compile``: one loop in the compiled graph.

TorchDynamo would unroll the eager loop of :mod:`torchscan._steps` into a graph fixed to one
length. While it traces, ``scan`` and ``loop`` instead become torch's own loop operators, which
Inductor compiles as loops: ``torch._higher_order_ops.scan`` for a fixed number of steps, and
``torch.while_loop`` for a loop that ``until`` may stop early (its outputs written into buffers of
the most steps it can run, then cut to the steps that ran).

The first step is first traced on its own, like any other code. That is where the structure
of the carry and of ``y``, and whether ``until`` is returned, are checked with the eager path's
messages, and where a step that TorchDynamo cannot capture whole (a ``print``, a Python ``if`` on
a tensor: a graph break) is found: torch's loop operators fail the whole compilation on a graph
break in their body, so such a step makes the first step run without TorchDynamo, and then the
remaining steps run as the eager loop does, correctly but unrolled. Otherwise the loop operator
runs every step from ``init``, and the compiler drops the first step traced on its own (a step
has no side effects that a loop operator could keep).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from torchscan import _compat, _context, _eager, _inplace, _layout, _pytree
from torchscan._eager import device_of
from torchscan._hoist import _inductor
from torchscan._plan import LoopPlan, ScanPlan
from torchscan._steps import Protocol

__all__ = ["FirstStep", "first_step", "loop", "loop_operators_apply", "scan"]


def scan(plan: ScanPlan) -> tuple[Any, Any]:
    """``scan`` under ``torch.compile``: the first step traced as it is, the others as one loop
    operator. Where the axes or directions are given leaf by leaf, each sequence is laid out
    forward on axis 0 first (a sequence read backwards, flipped) and the steps run forward, and
    each output is stacked on its own axis, flipped where it is stacked backwards; where they
    are one for all, the loop operator reads and stacks them that way at once."""
    direction = plan.direction
    in_reverse: Sequence[bool] = [False] * len(plan.xs_leaves)
    if direction is None:  # leaf by leaf
        direction, in_reverse = (False, True), plan.in_reverse
    reverse, realign = direction
    n, axis, protocol = plan.length, plan.out.axis, plan.protocol
    xs = [
        None  # a None leaf has no axis
        if leaf is None or a is None
        else leaf.movedim(a, 0).flip(0)
        if r
        else leaf.movedim(a, 0)
        for leaf, a, r in zip(plan.xs_leaves, plan.in_axes, in_reverse, strict=True)
    ]

    def take(t: Any) -> Any:
        if isinstance(t, torch.Tensor):
            position = n - 1 - t if reverse else t
            leaves = [None if x is None else x.index_select(0, position.reshape(1))[0] for x in xs]
        else:
            leaves = [None if x is None else x.select(0, t) for x in xs]
        return _pytree.tree_unflatten(leaves, plan.xs_spec)

    _skip_first_step()
    first = first_step(
        plan.fn,
        plan.carry.init,
        take(n - 1 if reverse else 0),
        lambda item: protocol.checked_first(plan.fn, plan.carry, item, plan.user),
    )
    out = first.out
    has_until = protocol.check_first(out, plan.carry, plan.out)
    if has_until and plan.direction is None:
        raise _layout.until_per_leaf(protocol.api, protocol.fn_name)
    if first.broke or not loop_operators_apply(out, has_until):
        # fn breaks the graph, or torch cannot train the loop operator: the other steps run as
        # eagerly (TorchDynamo unrolls them where it can trace them)
        indexed = first.reshaped_items(plan.carry.n_tensors, len(xs))
        leaf_by_leaf = plan.in_reverse if plan.direction is None else None
        steps = _eager.slices(plan, leaf_by_leaf, indexed=indexed)
        later = list(reversed(steps))[1:] if reverse else steps[1:]
        carry, ys = protocol.run_after_first(plan.fn, later, plan.carry, out)
        return carry, protocol.outputs.stack(ys, plan.out)
    init = plan.carry.init
    if has_until:
        # torch.while_loop refuses inputs that alias one another ((xs, xs), (xs, xs.T)): each
        # sequence after the first is read from a copy of its own
        present = [k for k, x in enumerate(xs) if x is not None]
        for k in present[1:]:
            xs[k] = xs[k].clone()  # type: ignore[union-attr]
        device = device_of([*plan.carry.leaves, *plan.xs_leaves])
        return run_loop(
            plan.fn,
            protocol,
            init,
            out,
            take,
            n,
            reverse=reverse and realign,
            axis=axis,
            device=device,
            copied=first.reshapes_views,
        )
    return run_scan(
        plan.fn,
        protocol,
        init,
        out,
        xs,
        plan.xs_spec,
        n,
        reverse=reverse,
        realign=realign,
        axis=axis,
        hoist=plan.hoist,
        copied=first.reshapes_views,
        per_leaf=None
        if plan.direction is not None
        else (plan.out.axes(out[1]), plan.out.reverse(out[1])),
        unroll=unroll_for(plan.unroll, first, device_of([*plan.carry.leaves, *plan.xs_leaves])),
    )


def loop(plan: LoopPlan) -> tuple[Any, Any]:
    """``loop`` under ``torch.compile``, with an int (or symbolic) ``trip_count`` or none: the
    first iteration traced as it is, the others as one loop operator."""
    trips, protocol, body = plan.trip_count, plan.protocol, plan.body
    device = device_of(plan.carry.leaves)
    first = torch.zeros((), dtype=torch.int64, device=device)

    def call(carry: Any, i: torch.Tensor) -> Any:
        return body(i, carry)

    _skip_first_step()
    found = first_step(
        call, plan.carry.init, first, lambda i: protocol.checked_first(call, plan.carry, i, body)
    )
    out = found.out
    has_until = protocol.check_first(out, plan.carry, plan.out, plan.never_ends or None)
    y_tensors = any(leaf is not None for leaf in _pytree.tree_leaves(out[1]))
    if (
        found.broke
        or not loop_operators_apply(out, has_until)
        or (has_until and trips is None and y_tensors)
    ):
        # a graph break, a loop operator torch cannot train, or outputs to stack with no bound
        # on their number: the other iterations run as eagerly
        counter = itertools.islice(_eager.counter(trips, device), 1, None)
        carry, ys = protocol.run_after_first(call, counter, plan.carry, out)
        return carry, protocol.outputs.stack(ys, plan.out)
    init = plan.carry.init
    copied = found.reshapes_views
    if has_until:
        return run_loop(
            call,
            protocol,
            init,
            out,
            lambda i: i,
            trips,
            reverse=False,
            axis=0,
            device=device,
            copied=copied,
        )
    assert trips is not None  # without until, check_first refused a loop that never ends
    counter = torch.arange(trips, device=device)
    spec = _pytree.tree_structure(first)
    return run_scan(
        call,
        protocol,
        init,
        out,
        [counter],
        spec,
        trips,
        reverse=False,
        realign=True,
        axis=0,
        copied=copied,
        unroll=unroll_for(plan.unroll, found, device),
    )


@dataclasses.dataclass(frozen=True)
class FirstStep:
    """What the first step of a compiled loop returned (``out``), and what it showed.

    ``broke``: it ran without TorchDynamo, after a graph break in the step (or one this module
    asked for); then ``bumps`` are the version bumps per step the eager loop's first step
    allowed each argument (carry tensors, then the item's). ``reshapes_views``: traced by
    TorchDynamo, it reshaped a view of an argument in place (``x.unsqueeze(0).squeeze_(0)``),
    which changes no argument but bumps its version, which torch's loop operators take for a
    change: their step is then given copies of its arguments.
    """

    out: Any
    broke: bool
    bumps: tuple[int, ...] = ()
    reshapes_views: bool = False
    cost: StepCost | None = None

    def reshaped_items(self, n_carry: int, n_items: int) -> list[bool]:
        """Which tensors of the item (an ``x`` of every ``xs`` leaf that is a tensor) the step
        reshapes through a view in place, each read then one index at a time."""
        if self.reshapes_views:
            return [True] * n_items
        return [b != 0 for b in self.bumps[n_carry:]]


def first_step(
    fn: Callable[[Any, Any], Any],
    carry: Any,
    item: Any,
    checked: Callable[[Any], tuple[Any, tuple[int, ...]]],
) -> FirstStep:
    """``fn(carry, item)``, traced by TorchDynamo as it is, or run without it after a graph break.

    TorchDynamo inlines this function into the frame it traces, where ``is_dynamo_compiling()``
    is ``True``. When ``fn`` breaks the graph, TorchDynamo runs the call of this function without
    tracing it (its code is marked to be skipped as the root of a frame): then it runs as the
    eager loop's first step does, ``checked(item)`` (on copies, refused where it changes an
    argument in place), without TorchDynamo. Traced, it runs on copies of its arguments, and
    the graph it made tells the changes in place it makes (:func:`_changes_in_place`): a write
    into an argument or a tensor from outside the step asks TorchDynamo for a graph break, so
    that the eager loop's checks run (and refuse it, or run it as Python does).
    """
    if not _context.dynamo_tracing():
        # the step itself untraced too: TorchDynamo would compile its frame, and the checks
        # would see the compiled graph's operations instead of the step's
        unchecked = cast(Callable[[Any], Any], torch.compiler.disable(checked))
        out, bumps = unchecked(item)
        return FirstStep(out, True, bumps)
    start = _graph_size()
    carry, item = _copy_tensors(carry), _copy_tensors(item)
    arguments = _graph_size()
    out = fn(carry, item)
    found = _changes_in_place(start, arguments)
    if found == _WRITES:
        _compat.dynamo_graph_break(
            "torchscan: the step changes an argument, or a tensor from outside it, in place"
        )
    cost = _step_cost(arguments)
    return FirstStep(out, False, reshapes_views=found == _RESHAPES_VIEWS, cost=cost)


def _copy_tensors(tree: Any) -> Any:
    return _pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, tree)


_NONE, _RESHAPES_VIEWS, _WRITES = 0, 1, 2


def _graph_size_now() -> int:
    """How many nodes other than placeholders the graph TorchDynamo builds has (placeholders of
    tensors a traced function captures are put first as it meets them: the other nodes come
    in the order they are traced)."""
    return sum(node.op != "placeholder" for node in _compat.dynamo_graph_nodes())


def _changes_in_place_now(start: int, arguments: int) -> int:
    """The changes in place of the nodes TorchDynamo traced since the graph had ``start`` nodes
    other than placeholders, of which those up to ``arguments`` made the step's arguments:
    :data:`_WRITES` for a write into an argument or into a tensor made before the step (or a
    shape-only change of one itself), :data:`_RESHAPES_VIEWS` for shape-only changes of views
    of the arguments alone, :data:`_NONE` for none."""
    nodes = _compat.dynamo_graph_nodes()
    traced = [node for node in nodes if node.op != "placeholder"]
    before = [node for node in nodes if node.op == "placeholder"] + traced[:start]
    argument_nodes = traced[start:arguments]
    outside = {s for s in (_storage(node) for node in before) if s is not None}
    argument_storages = {s for s in (_storage(node) for node in argument_nodes) if s is not None}
    found = _NONE
    for node in traced[arguments:]:
        change = _changed_in_place(node)
        if change is None:
            continue
        name, target = change
        storage = _storage(target)
        if storage in outside:
            return _WRITES
        if storage in argument_storages:
            if name not in _inplace.METADATA_ONLY or target in argument_nodes:
                return _WRITES
            found = _RESHAPES_VIEWS
    return found


@dataclasses.dataclass(frozen=True)
class StepCost:
    """What a step traced by TorchDynamo computes: ``operations`` nodes of its graph (views
    included), of which ``products`` are matrix products, and about ``flops`` floating-point
    operations (``2 m n k`` for a product, an element's worth for every element any other
    operation makes)."""

    operations: int
    products: int
    flops: int


_PRODUCTS = frozenset({
    "matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "linear", "einsum",
    "dot", "vdot", "inner", "tensordot", "bilinear", "conv1d", "conv2d", "conv3d",
})  # fmt: skip
_CELLS = frozenset({"lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell"})


def _step_cost_now(arguments: int) -> StepCost:
    """The :class:`StepCost` of the nodes TorchDynamo traced since its graph had ``arguments``
    nodes other than placeholders."""
    traced = [node for node in _compat.dynamo_graph_nodes() if node.op != "placeholder"]
    operations = products = flops = 0
    for node in traced[arguments:]:
        name = _name(node.target).rsplit(".", 1)[-1]
        if name in _CELLS:  # input, hx, w_ih, w_hh, ...: two products per gate
            values = [getattr(a, "meta", {}).get("example_value") for a in node.args[:4]]
            batch, _, w_ih, w_hh = (values + [None] * 4)[:4]
            if isinstance(batch, torch.Tensor) and batch.ndim:
                weights = [w for w in (w_ih, w_hh) if isinstance(w, torch.Tensor)]
                rows = _elements(batch) // max(_static(batch.shape[-1]), 1)
                operations, products = operations + 1, products + 2
                flops += 2 * rows * sum(_elements(w) for w in weights)
            continue
        value = node.meta.get("example_value")
        if not isinstance(value, torch.Tensor):
            continue
        operations += 1
        elements = _elements(value)
        if node.target is operator.matmul or name in _PRODUCTS:
            products += 1
            inner = [a for a in node.args if isinstance(a, torch.fx.Node)][:1]
            first = inner[0].meta.get("example_value") if inner else None
            depth = (
                _static(first.shape[-1]) if isinstance(first, torch.Tensor) and first.ndim else 1
            )
            flops += 2 * elements * depth
        else:
            flops += elements
    return StepCost(operations, products, flops)


def _elements(tensor: torch.Tensor) -> int:
    return math.prod(_static(size) for size in tensor.shape)


def _static(size: Any) -> int:
    """``size`` as an int, a symbolic size taken for :data:`SYMBOLIC_SIZE` (reading the value it
    has in this trace would fix it in the compiled graph)."""
    return size if isinstance(size, int) else SYMBOLIC_SIZE


SYMBOLIC_SIZE = 64


_graph_size = _compat.run_untraced_by_dynamo(_graph_size_now)
_step_cost = _compat.run_untraced_by_dynamo(_step_cost_now)
_changes_in_place = _compat.run_untraced_by_dynamo(_changes_in_place_now)

_IN_PLACE_OPERATORS = {
    operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv,
    operator.ifloordiv, operator.imod, operator.ipow, operator.imatmul, operator.iand,
    operator.ior, operator.ixor, operator.ilshift, operator.irshift,
}  # fmt: skip


def _changed_in_place(node: torch.fx.Node) -> tuple[str, torch.fx.Node] | None:
    """``(operation, node changed)`` where ``node`` (of TorchDynamo's graph) changes a tensor in
    place: a method or function whose name ends in ``_``, an in-place operator, ``out=``."""
    out = node.kwargs.get("out")
    if isinstance(out, torch.fx.Node):
        return f"{_name(node.target)}(out=)", out
    if not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    name = _name(node.target)
    if node.target in _IN_PLACE_OPERATORS or (name.endswith("_") and not name.endswith("__")):
        return name, node.args[0]
    return None


def _name(target: Any) -> str:
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def _storage(node: torch.fx.Node) -> Any:
    value = node.meta.get("example_value")
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return StorageWeakRef(value.untyped_storage())
    except (RuntimeError, NotImplementedError):  # a tensor without storage (a subclass)
        return None


def _skip_first_step_as_frame() -> bool:
    """Mark :func:`first_step`'s code for TorchDynamo (done while it traces, so that importing
    torchscan does not import TorchDynamo)."""
    _compat.skip_code_as_frame(first_step.__code__)
    return True


_skip_first_step = _compat.run_untraced_by_dynamo(_skip_first_step_as_frame)


def loop_operators_apply(out: Any, has_until: bool) -> bool:
    """Whether the steps of a loop whose first step returned ``out`` can become a loop operator.

    Always when no gradient is recorded through them. When one is: never with ``until``, whose
    ``torch.while_loop`` gives wrong gradients for what its body reads from outside (only the
    last iteration's part reaches them, in torch 2.13 to 2.15); and for ``scan``, unless the
    torch release computes the gradients of loop operators wrong under Inductor
    (:func:`torchscan._compat.train_loops_correctly_in_this_compile`, which has this
    compilation turn off what makes them wrong).
    """
    if not torch.is_grad_enabled():
        return True
    leaves = _pytree.tree_leaves((out[0], out[1]))
    if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in leaves):
        return True
    return not has_until and _train_loops_correctly()


_allow_scalar_reads = _compat.run_untraced_by_dynamo(_compat.let_loop_operators_read_scalars)
_train_loops_correctly = _compat.run_untraced_by_dynamo(
    _compat.train_loops_correctly_in_this_compile
)
_leave_out_size_asserts = _compat.run_untraced_by_dynamo(
    _compat.run_loops_without_size_asserts_in_this_compile
)
_hoist_in_this_compile = _compat.run_untraced_by_dynamo(_inductor.install_for_this_compile)


@dataclasses.dataclass(frozen=True)
class _Flat:
    """A pytree whose ``None`` leaves are left out of the list a loop operator carries."""

    spec: _pytree.TreeSpec
    present: tuple[bool, ...]

    @classmethod
    def of(cls, tree: Any) -> tuple[_Flat, list[torch.Tensor]]:
        leaves, spec = _pytree.tree_flatten(tree)
        flat = cls(spec, tuple(leaf is not None for leaf in leaves))
        return flat, [leaf for leaf in leaves if leaf is not None]

    def tensors(self, tree: Any) -> list[torch.Tensor]:
        return [leaf for leaf in _pytree.tree_leaves(tree) if leaf is not None]

    def build(self, tensors: Sequence[torch.Tensor]) -> Any:
        it = iter(tensors)
        return _pytree.tree_unflatten(
            [next(it) if present else None for present in self.present], self.spec
        )


@dataclasses.dataclass(frozen=True)
class _Codec:
    """Integer and bool tensors, carried through torch's ``scan`` as float64.

    torch's ``scan`` fails under autograd when a carry or an output is not a floating-point
    tensor. While gradients are recorded, each such tensor travels as float64, which holds every
    value of a 32-bit integer exactly; an int64 travels as two float64 halves.
    """

    dtypes: tuple[torch.dtype | None, ...]  # per tensor: the dtype to restore, None if kept

    @classmethod
    def of(cls, tensors: Sequence[torch.Tensor]) -> _Codec:
        recording = torch.is_grad_enabled()
        return cls(
            tuple(
                t.dtype if recording and not (t.is_floating_point() or t.is_complex()) else None
                for t in tensors
            )
        )

    def encode(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        out = []
        for t, dtype in zip(tensors, self.dtypes, strict=True):
            if dtype is None:
                out.append(t)
            elif dtype == torch.int64:
                out += [(t >> 32).double(), (t & 0xFFFFFFFF).double()]
            else:
                out.append(t.double())
        return out

    def decode(self, encoded: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        it = iter(encoded)
        out = []
        for dtype in self.dtypes:
            t = next(it)
            if dtype is None:
                out.append(t)
            elif dtype == torch.int64:
                out.append((t.long() << 32) | next(it).long())
            else:
                out.append(t.to(dtype))
        return out


def _fresh(t: torch.Tensor) -> torch.Tensor:
    """A dense copy: torch's loop operators refuse outputs that alias their inputs or each other,
    and carries whose strides change. The compiler removes the copies it does not need."""
    return t.clone(memory_format=torch.contiguous_format)


def run_scan(
    fn: Callable[[Any, Any], Any],
    protocol: Protocol,
    init: Any,
    out0: Any,
    xs: Sequence[torch.Tensor | None],
    xs_spec: _pytree.TreeSpec,
    length: Any,
    *,
    reverse: bool,
    realign: bool,
    axis: int,
    hoist: bool | None = None,
    copied: bool = False,
    per_leaf: tuple[Sequence[int], Sequence[bool]] | None = None,
    unroll: int | bool = 1,
) -> tuple[Any, Any]:
    """Every step of a scan without ``until`` as torch's ``scan`` operator.

    ``xs`` are the leaves of the sequences with the scanned axis moved to the front; ``out0`` is
    what the first step returned when it was traced on its own (which tells the structure of
    ``y``; the compiler drops that computation). Returns ``(carry, ys)``, ``ys`` on ``axis``.
    Unless ``hoist`` is ``False``, Inductor moves the work of the steps that does not depend on
    the carry out of the loop (:mod:`torchscan._hoist._inductor`). With ``copied``, ``fn`` is
    given copies of its arguments (a step that reshapes views of them in place). ``per_leaf``,
    the axis and the direction of every leaf of ``y`` (``None`` ones included), stacks each on its
    own, in place of ``axis`` and ``realign``. Each iteration of the loop operator runs
    ``unroll`` steps (:func:`_unrolled`).
    """
    carry_flat, carry = _Flat.of(init)
    y_flat, y0 = _Flat.of(out0[1])
    present = [leaf is not None for leaf in xs]
    sequences = [leaf for leaf in xs if leaf is not None]
    dummy = not sequences
    if dummy:  # torch's scan needs a sequence to take its length from
        sequences = [torch.empty(length, 0, device=device_of([*carry, *y0]))]
    carry_codec, y_codec = _Codec.of(carry), _Codec.of(y0)
    carry = [_fresh(c) for c in carry_codec.encode(carry)]
    n_carry = len(carry)
    if not carry:  # torch's scan needs a carry
        carry = [torch.zeros((), device=sequences[0].device)]

    def combine(c: list[torch.Tensor], x: list[torch.Tensor]) -> Any:
        it = iter(x)
        item = _pytree.tree_unflatten(
            [None] * len(present) if dummy else [next(it) if p else None for p in present],
            xs_spec,
        )
        carry = carry_flat.build(carry_codec.decode(c[:n_carry]))
        out = fn(*_copy_tensors((carry, item))) if copied else fn(carry, item)
        protocol.has_until(out, expected=False)
        new_carry = carry_codec.encode(carry_flat.tensors(out[0])) if n_carry else [c[0] + 0]
        return [_fresh(t) for t in new_carry], [
            _fresh(t) for t in y_codec.encode(y_flat.tensors(out[1]))
        ]

    _allow_scalar_reads()
    _leave_out_size_asserts()
    if hoist is not False:
        _hoist_in_this_compile()
    final, ys = _unrolled(combine, carry, sequences, length, unroll, reverse=reverse)
    final = [_compat.dense_gradient(t) for t in final[:n_carry]]
    final, ys = carry_codec.decode(final), y_codec.decode(ys)
    if per_leaf is not None:
        axes, reverses = per_leaf
        kept = [(a, r) for a, r, p in zip(axes, reverses, y_flat.present, strict=True) if p]
        ys = [(y.flip(0) if r else y).movedim(0, a) for y, (a, r) in zip(ys, kept, strict=True)]
        return carry_flat.build(final), y_flat.build(ys)
    if reverse and not realign:
        ys = [y.flip(0) for y in ys]
    return carry_flat.build(final), y_flat.build([y.movedim(0, axis) for y in ys])


@dataclasses.dataclass(frozen=True)
class DeviceCost:
    """What running a compiled loop costs on a kind of device: ``iteration_s`` seconds for each
    iteration of a loop operator (Inductor's Python wrapper calls its condition and its body,
    reads the step counter, allocates the step's buffers), ``kernel_s`` for each kernel it
    launches, and ``flops_per_s`` for the arithmetic of a small step."""

    iteration_s: float
    kernel_s: float
    flops_per_s: float


DEVICE_COSTS = {
    "cpu": DeviceCost(iteration_s=2e-6, kernel_s=1e-6, flops_per_s=1e10),
    "cuda": DeviceCost(iteration_s=2e-5, kernel_s=5e-6, flops_per_s=1e12),
}
"""The CPU's, measured by ``benchmarks/compiled_loop.py`` (Inductor's default options, one
thread); the others' assumed from the CPU's, for a device launching kernels asynchronously and
reading the step counter across a synchronization."""
ITERATION_SHARE = 0.005
"""The share of a step's time that the iterations of the loop operator may cost under the
unrolling :func:`unroll_for` chooses."""
MOST_UNROLLED = 8
"""The most steps :func:`unroll_for` puts in one iteration: past it, the measured speed-up is
under 2 percent."""
MOST_OPERATIONS = 256
"""The most operations of unrolled steps :func:`unroll_for` puts in one iteration (Inductor's
compile time grows with the body)."""


def unroll_for(requested: int | bool | None, first: FirstStep, device: Any) -> int | bool:
    """How many steps each iteration of the loop operator runs (:func:`_unrolled`): as
    ``requested`` (``True``: all of them; ``False``: one), or for ``None`` the fewest that make
    the iterations' cost at most :data:`ITERATION_SHARE` of the steps' (at most
    :data:`MOST_UNROLLED`, and :data:`MOST_OPERATIONS` operations), estimated from the first
    step's :class:`StepCost` and the device's :class:`DeviceCost`."""
    if requested is None:
        cost = first.cost
        if cost is None:
            return 1
        return _chosen(cost.operations, cost.products, cost.flops, torch.device(device).type)
    return 1 if requested is False else requested


def _chosen_now(operations: int, products: int, flops: int, device_type: str) -> int:
    device = DEVICE_COSTS.get(device_type)
    if device is None:
        return 1
    step_s = device.kernel_s * (products + 1) + flops / device.flops_per_s
    steps = 1
    while steps < MOST_UNROLLED and device.iteration_s / steps > ITERATION_SHARE * step_s:
        steps *= 2
    while steps > 1 and steps * operations > MOST_OPERATIONS:
        steps //= 2
    return steps


# run as TorchDynamo traces: traced, its floats would become symbols of the graph
_chosen = _compat.run_untraced_by_dynamo(_chosen_now)


def _unrolled(
    combine: Callable[[list[torch.Tensor], list[torch.Tensor]], Any],
    carry: list[torch.Tensor],
    sequences: list[torch.Tensor],
    length: Any,
    unroll: int | bool,
    *,
    reverse: bool,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``scan(combine, carry, sequences, reverse=reverse)`` with torch's ``scan`` operator, each
    of its iterations running ``unroll`` steps in order.

    The first ``(length - 1) % unroll + 1`` steps run in the graph itself, then the
    ``(length - 1) // unroll`` blocks of ``unroll`` steps, one block per iteration of the loop
    operator; where the steps run backward, the first ones are the last of the sequences.
    Fewer than two blocks run one step per iteration, as does a symbolic length: Inductor
    allocates the outputs of a loop operator from the symbols of its inputs, and cannot for the
    backward pass of one whose length is an expression of another size (``KeyError`` in
    ``lower_to_while_loop``, torch 2.13 to 2.15). ``unroll=True`` runs every step in the graph
    itself, no loop operator.
    """
    scan = _compat.scan_operator()
    if unroll is True:  # (a symbolic length is then fixed)
        return _block(combine, carry, sequences, int(length), reverse=reverse)
    if unroll == 1 or not _compat.known_size(length) or (length - 1) // unroll < 2:
        return scan(combine, carry, sequences, dim=0, reverse=reverse)
    blocks = (length - 1) // unroll

    def block(c: list[torch.Tensor], x: list[torch.Tensor]) -> Any:
        return _block(combine, c, x, unroll, reverse=reverse)

    if length % unroll == 0:  # whole blocks
        in_blocks = [s.reshape(length // unroll, unroll, *s.shape[1:]) for s in sequences]
        carry, ys = scan(block, carry, in_blocks, dim=0, reverse=reverse)
        return carry, [y.reshape(length, *y.shape[2:]) for y in ys]
    first = (length - 1) % unroll + 1
    whole = blocks * unroll
    head = [s.narrow(0, whole if reverse else 0, first) for s in sequences]
    carry, ys_first = _block(combine, carry, head, first, reverse=reverse)
    in_blocks = [
        s.narrow(0, 0 if reverse else first, whole).reshape(blocks, unroll, *s.shape[1:])
        for s in sequences
    ]
    carry, ys = scan(block, carry, in_blocks, dim=0, reverse=reverse)
    ys = [y.reshape(whole, *y.shape[2:]) for y in ys]
    pairs = zip(ys, ys_first, strict=True) if reverse else zip(ys_first, ys, strict=True)
    return carry, [torch.cat(pair) for pair in pairs]


def _block(
    combine: Callable[[list[torch.Tensor], list[torch.Tensor]], Any],
    carry: list[torch.Tensor],
    sequences: list[torch.Tensor],
    steps: int,
    *,
    reverse: bool,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``steps`` steps of ``combine`` over the first ``steps`` elements of ``sequences`` (from the
    last where ``reverse``), their ys stacked in the order of the elements."""
    ys: list[list[torch.Tensor]] = []
    for j in reversed(range(steps)) if reverse else range(steps):
        carry, y = combine(carry, [s[j] for s in sequences])
        ys.append(y)
    if reverse:
        ys.reverse()
    return carry, [torch.stack(column) for column in zip(*ys, strict=True)]


def run_loop(
    fn: Callable[[Any, torch.Tensor], Any],
    protocol: Protocol,
    init: Any,
    out0: Any,
    take: Callable[[torch.Tensor], Any],
    length: Any,
    *,
    reverse: bool,
    axis: int,
    device: torch.device,
    copied: bool = False,
) -> tuple[Any, Any]:
    """Every step of a loop that ``until`` may stop, as ``torch.while_loop``.

    ``take(t)`` is the item of step ``t`` (a 0-d int64 tensor), ``length`` the most steps
    (``None`` for no limit: then the steps may return no ``y`` tensor), ``out0`` what the first
    step returned when traced on its own. ``ys`` are in the order the steps ran, reversed when
    ``reverse``, and stacked on ``axis``.
    """
    carry_flat, carry = _Flat.of(init)
    y_flat, y0 = _Flat.of(out0[1])
    buffers = [y.new_zeros((length, *y.shape)) for y in y0]
    n_carry = len(carry)
    zero = torch.zeros((), dtype=torch.int64, device=device)
    going = torch.zeros((), dtype=torch.bool, device=device)

    def cond(i: torch.Tensor, stop: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        return ~stop if length is None else ~stop & (i < length)

    def body(i: torch.Tensor, stop: torch.Tensor, *rest: torch.Tensor) -> Any:
        arguments = (carry_flat.build(rest[:n_carry]), take(i))
        out = fn(*(_copy_tensors(arguments) if copied else arguments))
        protocol.has_until(out, expected=True)
        new_stop = protocol.check_stop(out[2].stop, 1)
        ys = [
            buffer.index_copy(0, i.unsqueeze(0), y.unsqueeze(0))
            for buffer, y in zip(rest[n_carry:], y_flat.tensors(out[1]), strict=True)
        ]
        return (
            i + 1,
            _fresh(new_stop),
            *[_fresh(t) for t in carry_flat.tensors(out[0])],
            *ys,
        )

    carried = (zero, going, *[_fresh(c) for c in carry], *buffers)
    _allow_scalar_reads()
    _leave_out_size_asserts()
    i, _, *rest = torch.while_loop(cond, body, carried)
    steps = i.item() if buffers else 0
    ys = []
    for buffer in rest[n_carry:]:
        ran = buffer.narrow(0, 0, steps)
        ys.append((ran.flip(0) if reverse else ran).movedim(0, axis))
    return carry_flat.build(rest[:n_carry]), y_flat.build(ys)
