"""Hoisting under ``torch.compile``: the work of a scan's step that does not depend on the carry,
moved out of the loop operator before Inductor compiles it.

TorchDynamo captures a compiled scan as torch's ``scan`` operator, whose body is a graph of the
step: placeholders for the carry, for one element of each sequence and for what the step reads
from outside (parameters, captured tensors), then the step's operations. This pass, which
Inductor runs on the captured graph before it differentiates it (``pre_grad_custom_pass``, set
for the compilations that hold a torchscan scan), gives every operation of the body a class: the
carry's, where any of its inputs is of the carry; the sequence's, where it reads an element of a
sequence but nothing of the carry; a constant's otherwise. The sequence's operations whose values
the carry's operations or the outputs read are computed before the loop, once over every step
(``torch.func.vmap`` of a graph of them), and their values become sequences of the loop operator;
the constants they read are computed once before it too (:func:`run_once`), and become outside
values of the loop operator; the body keeps the rest. Under ``torch.compile`` an input
projection ``x @ W`` is then one matrix product over the whole sequence, in the forward and in
the backward pass.

Only steps made of operations known to have no effects and to draw no random numbers are
rewritten (:data:`PURE_FUNCTIONS`, :data:`PURE_METHODS`): a body with any other operation, a
module call, or a layout this pass does not know is left as it is.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.fx

from torchscan import _compat
from torchscan._hoist._policy import Kind, join

__all__ = ["PURE_FUNCTIONS", "PURE_METHODS", "hoist_scans", "install_for_this_compile", "last"]


_F = torch.nn.functional
PURE_FUNCTIONS: frozenset[Any] = frozenset(
    {
        operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
        operator.mod, operator.matmul, operator.neg, operator.pos, operator.abs, operator.pow,
        operator.invert, operator.and_, operator.or_, operator.xor, operator.lshift,
        operator.rshift, operator.getitem, operator.lt, operator.le, operator.gt, operator.ge,
        operator.eq, operator.ne,
        torch.add, torch.sub, torch.mul, torch.div, torch.neg, torch.pow, torch.abs,
        torch.sign, torch.floor, torch.ceil, torch.round, torch.remainder, torch.fmod,
        torch.reciprocal, torch.square, torch.exp, torch.expm1, torch.log, torch.log1p,
        torch.sqrt, torch.rsqrt, torch.sin, torch.cos, torch.tan, torch.atan, torch.sinh,
        torch.cosh, torch.tanh, torch.sigmoid, torch.relu, torch.erf, torch.clamp, torch.clip,
        torch.where, torch.maximum, torch.minimum, torch.eq, torch.ne, torch.lt, torch.le,
        torch.gt, torch.ge, torch.logical_and, torch.logical_or, torch.logical_not,
        torch.logical_xor, torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor,
        torch.bitwise_not, torch.matmul, torch.mm, torch.bmm, torch.mv, torch.dot,
        torch.addmm, torch.baddbmm, torch.addmv, torch.outer, torch.einsum, torch.cat,
        torch.stack, torch.reshape, torch.transpose, torch.permute, torch.movedim,
        torch.swapaxes, torch.unsqueeze, torch.squeeze, torch.flatten, torch.flip, torch.roll,
        torch.chunk, torch.split, torch.unbind, torch.narrow, torch.select, torch.index_select,
        torch.gather, torch.masked_fill, torch.broadcast_to, torch.tril, torch.triu,
        torch.diagonal, torch.sum, torch.prod, torch.mean, torch.amax, torch.amin,
        torch.argmax, torch.argmin, torch.any, torch.all, torch.cumsum, torch.cumprod,
        torch.softmax, torch.log_softmax, torch.zeros, torch.ones, torch.full, torch.arange,
        torch.tensor, torch.zeros_like, torch.ones_like, torch.full_like,
        # _F.linear is torch._C._nn.linear itself, the function that TorchDynamo records
        _F.linear, _F.relu, _F.gelu, _F.silu, _F.softplus, _F.elu, _F.leaky_relu, _F.softmax,
        _F.log_softmax, _F.layer_norm, _F.normalize, _F.embedding, _F.one_hot,
    }
)  # fmt: skip
"""The functions a step's body may call to be rewritten: none changes its inputs or draws
random numbers."""

PURE_METHODS: frozenset[str] = frozenset(
    {
        "view", "view_as", "reshape", "reshape_as", "transpose", "t", "permute", "movedim",
        "swapaxes", "unsqueeze", "squeeze", "flatten", "flip", "roll", "chunk", "split",
        "unbind", "narrow", "select", "index_select", "gather", "masked_fill", "where",
        "expand", "expand_as", "repeat", "contiguous", "clone", "diagonal", "tril", "triu",
        "sum", "prod", "mean", "amax", "amin", "argmax", "argmin", "any", "all", "cumsum",
        "cumprod", "softmax", "log_softmax", "abs", "neg", "sign", "floor", "ceil", "round",
        "remainder", "fmod", "reciprocal", "square", "exp", "expm1", "log", "log1p", "sqrt",
        "rsqrt", "sin", "cos", "tan", "atan", "tanh", "sigmoid", "relu", "clamp", "clip",
        "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
        "logical_not", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor",
        "bitwise_not", "matmul", "mm", "bmm", "mv", "dot", "add", "sub", "mul", "div", "pow",
        "to", "type", "type_as", "float", "double", "half", "bfloat16", "int", "long", "bool",
        "new_zeros", "new_ones", "new_full", "new_tensor", "__getitem__", "size", "dim",
        "numel",
    }
)  # fmt: skip
"""The tensor methods a step's body may call to be rewritten."""

last: list[tuple[int, int]] = []
"""For each scan the pass rewrote since this list was last emptied: how many operations of its
body it moved out of the loop and how many stayed (read by tests)."""


def map_over_steps(
    sequence_part: torch.fx.GraphModule, xs: Sequence[torch.Tensor], fixed: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """The sequence's part of a step, for every step at once: ``sequence_part(x_t, *fixed)``
    batched over the first axis of ``xs``."""
    dims = (0,) * len(xs) + (None,) * len(fixed)
    return torch.func.vmap(lambda *a: tuple(sequence_part(*a)), in_dims=dims)(*xs, *fixed)


def hoist_scans(graph: torch.fx.Graph) -> None:
    """Move the sequence's part of the body of every ``scan`` operator of ``graph`` before it."""
    gm = graph.owning_module
    if gm is None:
        return
    changed = False
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.higher_order.scan:
            changed |= _hoist_scan(gm, node)
    if changed:
        graph.lint()
        gm.recompile()


_INDEXING = frozenset({operator.getitem, "__getitem__", torch.select, "select", torch.narrow})


def _pure(node: torch.fx.Node) -> bool:
    if node.target in _INDEXING and any(isinstance(a, torch.fx.Node) for a in node.args[1:]):
        return False  # an index that is a tensor: a value read from it, which vmap cannot batch
    if node.op == "call_function":
        return node.target in PURE_FUNCTIONS
    if node.op == "call_method":
        return node.target in PURE_METHODS
    return node.op in ("placeholder", "get_attr", "output")


def _hoist_scan(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Rewrite the scan operator ``node`` of ``gm``, in place, where its body is made of pure
    operations only: each body node gets its :class:`~._policy.Kind` (the carry's placeholders,
    the sequences', the rest constants; a node the join of its inputs'), the sequence nodes
    that the carry's nodes or the outputs read are computed before the loop by
    :func:`map_over_steps` over every step, and their values become new sequences of the
    operator; the constant nodes they read, once by :func:`run_once`, their values new outside
    values of the operator; the body keeps the rest. Returns whether it rewrote anything
    (:data:`last` records what moved)."""
    if len(node.args) != 4 or node.kwargs:
        return False
    body_node, *lists = node.args
    if not (
        isinstance(body_node, torch.fx.Node)
        and body_node.op == "get_attr"
        and all(isinstance(a, (list, tuple)) for a in lists)
    ):
        return False
    init, xs, fixed = (list(cast("Sequence[Any]", a)) for a in lists)
    body = getattr(gm, str(body_node.target), None)
    if not isinstance(body, torch.fx.GraphModule) or len(body_node.users) != 1:
        return False
    placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
    n_carry, n_x = len(init), len(xs)
    if len(placeholders) != n_carry + n_x + len(fixed) or n_x == 0:
        return False
    if not all(_pure(n) for n in body.graph.nodes):
        return False
    # what the step computes and nothing reads (TorchDynamo keeps it) leaves first: a value of
    # the sequences read only there would leave the loop with no sequence, which torch's scan
    # refuses
    if body.graph.eliminate_dead_code():
        body.recompile()
    klass: dict[torch.fx.Node, Kind] = {}
    for i, p in enumerate(placeholders):
        klass[p] = (
            Kind.CARRY if i < n_carry else Kind.SEQUENCE if i < n_carry + n_x else Kind.CONSTANT
        )
    for n in body.graph.nodes:
        if n.op == "call_method" and n.target == "clone":
            klass[n] = Kind.CARRY  # the loop operator's copy of what it returns stays in the loop
        elif n.op in ("call_function", "call_method", "get_attr"):
            klass[n] = join(klass[a] for a in n.all_input_nodes)
    crossing = _crossing(body, klass, Kind.SEQUENCE)
    constant_crossing = _crossing(body, klass, Kind.CONSTANT)
    if not crossing and not constant_crossing:
        return False
    values: list[torch.fx.Node] = []
    new: list[torch.fx.Node] = []
    needed: set[torch.fx.Node] = set()
    if crossing:
        needed = _needed(crossing)
        sequence_part = _part(body, placeholders[n_carry:], needed, crossing)
        if not _batches_right(sequence_part, list(xs), list(fixed), crossing):
            return False
        name = f"{body_node.target}_sequence_part"
        gm.add_submodule(name, sequence_part)
        with gm.graph.inserting_before(node):
            module = gm.graph.get_attr(name)
            mapped = gm.graph.call_function(map_over_steps, (module, list(xs), list(fixed)))
            values = [
                gm.graph.call_function(operator.getitem, (mapped, i)) for i in range(len(crossing))
            ]
        with body.graph.inserting_after(placeholders[n_carry + n_x - 1]):
            for c in reversed(crossing):
                new.append(body.graph.placeholder(f"{c.name}_t"))
        for c, p in zip(crossing, reversed(new), strict=True):
            p.meta.update(c.meta)
            c.replace_all_uses_with(p)
    # the constants the loop reads, computed once before it from the outside values alone
    constants: list[torch.fx.Node] = []
    new_fixed: list[torch.fx.Node] = []
    if constant_crossing:
        constant_needed = _needed(constant_crossing)
        needed |= constant_needed
        constant_part = _part(
            body, placeholders[n_carry + n_x :], constant_needed, constant_crossing
        )
        name = f"{body_node.target}_constant_part"
        gm.add_submodule(name, constant_part)
        with gm.graph.inserting_before(node):
            module = gm.graph.get_attr(name)
            computed = gm.graph.call_function(run_once, (module, list(fixed)))
            constants = [
                gm.graph.call_function(operator.getitem, (computed, i))
                for i in range(len(constant_crossing))
            ]
        last_placeholder = [n for n in body.graph.nodes if n.op == "placeholder"][-1]
        with body.graph.inserting_after(last_placeholder):
            for c in reversed(constant_crossing):
                new_fixed.append(body.graph.placeholder(f"{c.name}_once"))
        new_fixed.reverse()
        for c, p in zip(constant_crossing, new_fixed, strict=True):
            p.meta.update(c.meta)
            c.replace_all_uses_with(p)
    output = next(n for n in body.graph.nodes if n.op == "output")
    with body.graph.inserting_before(output):  # the loop operator returns no input of its own
        output.args = torch.fx.map_arg(
            output.args,
            lambda a: body.graph.call_method("clone", (a,)) if a.op == "placeholder" else a,
        )
    body.graph.eliminate_dead_code()
    # the sequences and the outside values the loop no longer reads leave it (torch's scan would
    # otherwise give gradients for them from the loop as well)
    inputs = [*xs, *values, *fixed, *constants]
    kept_ph = placeholders[:n_carry]
    kept_inputs: list[Any] = []
    n_sequences = 0
    later = [
        *placeholders[n_carry : n_carry + n_x],
        *reversed(new),
        *placeholders[n_carry + n_x :],
        *new_fixed,
    ]
    n_scanned = n_x + len(values)
    # torch's scan takes its length from a sequence: one is kept where the loop reads none
    # (every value it read moved out of it)
    keep_one = not any(p.users for p in later[:n_scanned])
    for i, (p, value) in enumerate(zip(later, inputs, strict=True)):
        if p.users or (keep_one and i == 0):
            kept_ph.append(p)
            kept_inputs.append(value)
            n_sequences += i < n_scanned
        else:
            body.graph.erase_node(p)
    body.recompile()
    node.args = (body_node, init, kept_inputs[:n_sequences], kept_inputs[n_sequences:])
    moved = len(needed)
    stayed = sum(1 for n in body.graph.nodes if n.op in ("call_function", "call_method"))
    last.append((moved, stayed))
    return True


def _crossing(
    body: torch.fx.GraphModule, klass: dict[torch.fx.Node, Kind], kind: Kind
) -> list[torch.fx.Node]:
    """The operations of ``kind`` whose tensors the loop's carry part or its outputs read: what
    crosses into the loop once they are computed outside it."""
    return [
        n
        for n in body.graph.nodes
        if n.op in ("call_function", "call_method")
        and klass.get(n) == kind
        and isinstance(n.meta.get("example_value"), torch.Tensor)
        and any(u.op == "output" or klass.get(u) == Kind.CARRY for u in n.users)
    ]


def _needed(crossing: list[torch.fx.Node]) -> set[torch.fx.Node]:
    """The operations ``crossing`` are computed from, themselves included."""
    needed: set[torch.fx.Node] = set()
    stack = list(crossing)
    while stack:
        n = stack.pop()
        if n not in needed and n.op != "placeholder":
            needed.add(n)
            stack.extend(n.all_input_nodes)
    return needed


def _part(
    body: torch.fx.GraphModule,
    inputs: list[torch.fx.Node],
    needed: set[torch.fx.Node],
    crossing: list[torch.fx.Node],
) -> torch.fx.GraphModule:
    """The operations ``needed`` of ``body`` as a graph of their own, which takes the
    placeholders ``inputs`` and returns ``crossing``."""
    part = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for p in inputs:
        env[p] = part.placeholder(p.name)
    for n in body.graph.nodes:
        if n in needed:
            env[n] = part.node_copy(n, lambda a: env[a])
    part.output(tuple(env[c] for c in crossing))
    return torch.fx.GraphModule(body, part)


def run_once(
    constant_part: torch.fx.GraphModule, fixed: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """The constant part of a step, computed once before the loop from the outside values."""
    return tuple(constant_part(*fixed))


def _batches_right(
    part: torch.fx.GraphModule,
    xs: list[Any],
    fixed: list[Any],
    crossing: list[torch.fx.Node],
) -> bool:
    """Whether :func:`map_over_steps` runs ``part`` on the fake values TorchDynamo recorded and
    gives, for every step, what the step gave: an operation that vmap cannot batch, or batches
    into another shape or dtype, leaves the scan as it is."""
    examples = [getattr(a, "meta", {}).get("example_value") for a in [*xs, *fixed]]
    per_step_examples = [c.meta.get("example_value") for c in crossing]
    if not all(isinstance(v, torch.Tensor) for v in [*examples, *per_step_examples]):
        return False
    values = cast("list[torch.Tensor]", examples)  # every one a tensor, checked above
    per_step = cast("list[torch.Tensor]", per_step_examples)
    found = _compat.detect_fake_mode(values)
    if found is None:
        return False
    # tensors of a mode of its own (the body's values were recorded under another), sized with
    # the same symbols
    mode = _compat.FakeTensorMode(shape_env=found.shape_env, allow_non_fake_inputs=True)
    try:
        with mode:
            fresh = [
                torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
                for v in values
            ]
            batched = map_over_steps(part, fresh[: len(xs)], fresh[len(xs) :])
    except Exception:
        return False
    return all(
        b.shape[1:] == s.shape and b.dtype == s.dtype and b.device == s.device
        for b, s in zip(batched, per_step, strict=True)
    )


_pass: Any = None


def _the_pass() -> Any:
    """The pass as Inductor takes it: a ``CustomGraphPass``, whose ``uuid`` (this file's hash)
    Inductor's cache of compiled graphs reads."""
    global _pass
    if _pass is None:
        custom_graph_pass, hash_of_files, _ = _compat.inductor_graph_passes()

        class HoistScans(custom_graph_pass):  # type: ignore[misc, valid-type]
            def __call__(self, graph: torch.fx.Graph) -> None:
                hoist_scans(graph)

            def uuid(self) -> Any:
                return hash_of_files((__file__,))

        _pass = HoistScans()
    return _pass


def install_for_this_compile() -> bool:
    """Have the Inductor compilation under way run :func:`hoist_scans` before the user's own
    ``pre_grad_custom_pass``, if any; whether it is installed."""
    return _compat.run_pre_grad_pass_in_this_compile(_the_pass())
