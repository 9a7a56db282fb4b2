"""The split of a traced step: every node classified (:mod:`._policy`), the copies that a batched
run does not need removed, and the programs of each class, with what crosses between them."""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from torchscan import _compat, _pytree
from torchscan._hoist._codegen import _generate, _generate_loop
from torchscan._hoist._policy import Kind, join
from torchscan._hoist._signature import Hoisted, _NotHoistable, _Walk


def _split(gm: torch.fx.GraphModule, walk: _Walk, n_carry: int, shape: dict[str, Any]) -> Hoisted:
    """The programs of a traced step: every node of ``gm`` (whose first ``n_carry`` placeholders
    are the carry's leaves, the rest ``x``'s) gets its :class:`~._policy.Kind` (the captured
    tensors, read by ``get_attr``, found among ``walk``'s; a tensor written in place is raised to
    the kind of its writer until nothing changes); then ``once`` (the constant nodes, from the
    captured tensors), ``over`` (the sequence nodes, from ``x`` and what ``once`` gives, batched
    over the steps by the caller), and the loop of the carry's nodes, which reads the sequence
    values ``over`` gives where they cross into it (``loop``) or computes them at every step
    (``inline``, below :data:`~._policy.BATCH_FROM` steps). ``shape`` says whether the step
    returns ``until``. Raises :class:`_NotHoistable` for a graph it cannot split."""
    graph = gm.graph
    graph.eliminate_dead_code()
    _without_copies(graph)
    by_id = {id(t): i for i, t in enumerate(walk.tensors)}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    carry_in, x_in = placeholders[:n_carry], placeholders[n_carry:]
    klass: dict[torch.fx.Node, Kind] = {}
    captured: dict[torch.fx.Node, int] = {}  # get_attr node -> walked tensor index
    fresh: dict[torch.fx.Node, torch.Tensor] = {}  # tensors the step makes from Python values
    for node in carry_in:
        klass[node] = Kind.CARRY
    for node in x_in:
        klass[node] = Kind.SEQUENCE
    output = next(n for n in graph.nodes if n.op == "output")
    for node in graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, node.target)  # type: ignore[arg-type]
            index = by_id.get(id(value))
            if index is not None:
                captured[node] = index
            elif all(
                user.op == "call_function" and user.target is torch.ops.aten.lift_fresh_copy.default
                for user in node.users
            ):
                fresh[node] = value
            else:
                raise _NotHoistable("it reads a tensor that its signature does not reach")
            klass[node] = Kind.CONSTANT
        elif node.op not in ("placeholder", "output", "call_function"):
            raise _NotHoistable(f"its graph has a {node.op} node")
    # A write in place into a value runs where the value is made: a value written at every
    # step (a random mask drawn into an empty tensor) is made at every step. Raise the class
    # of what is written into until nothing changes.
    floor: dict[torch.fx.Node, Kind] = {}
    for _ in range(Kind.CARRY + 1):
        for node in graph.nodes:
            if node.op == "call_function":
                klass[node] = max(_classify(node, klass), floor.get(node, Kind.CONSTANT))
        raised = False
        for node in graph.nodes:
            if node.op != "call_function":
                continue
            for written in _written(node):
                for value in (written, _root(written)):
                    if value.op == "call_function" and klass[value] < klass[node]:
                        floor[value] = klass[node]
                        raised = True
        if not raised:
            break
    else:
        raise _NotHoistable("it writes in place into values of several classes")
    outputs: list[Any] = list(output.args[0])  # type: ignore[arg-type]
    lifted = sorted(set(captured.values()))

    def crossing(level: int) -> list[torch.fx.Node]:
        """The nodes of ``level`` that a node of a later class (or the output) reads."""
        needed: dict[torch.fx.Node, None] = {}
        for node in graph.nodes:
            if node.op == "output" or (node.op == "call_function" and klass[node] > level):
                for source in node.all_input_nodes:
                    if klass.get(source) == level and source.op != "placeholder":
                        needed[source] = None
        return list(needed)

    nodes = [n for n in graph.nodes if n.op in ("get_attr", "call_function")]
    constant_out = crossing(Kind.CONSTANT)
    sequence_out = crossing(Kind.SEQUENCE)
    x_used = tuple(
        i
        for i, node in enumerate(x_in)
        if any(klass.get(u, Kind.CARRY) == Kind.CARRY for u in node.users)
    )
    names: dict[torch.fx.Node, str] = {}
    for k, index in enumerate(lifted):
        for node, i in captured.items():
            if i == index:
                names[node] = f"captured_{k}"
    once = _generate(
        "once",
        [f"captured_{k}" for k in range(len(lifted))],
        [n for n in nodes if klass[n] == Kind.CONSTANT],
        constant_out,
        dict(names),
        fresh,
        fast=True,  # run at every call, like the loop
    )
    over_names = {node: f"x_{i}" for i, node in enumerate(x_in)}
    over_names.update({node: f"constant_{k}" for k, node in enumerate(constant_out)})
    over = _generate(
        "over",
        [
            *(f"x_{i}" for i in range(len(x_in))),
            *(f"constant_{k}" for k in range(len(constant_out))),
        ],
        [n for n in nodes if klass[n] == Kind.SEQUENCE],
        sequence_out,
        over_names,
        fresh,
        fast=False,
    )
    columns = [*sequence_out, *(x_in[i] for i in x_used)]
    loop_names = {node: f"k_{len(lifted) + j}" for j, node in enumerate(constant_out)}
    loop_names.update({node: f"k_{lifted.index(i)}" for node, i in captured.items()})
    loop, source = _generate_loop(
        carry_in,
        columns,
        len(lifted) + len(constant_out),
        [n for n in nodes if klass[n] == Kind.CARRY],
        outputs[:n_carry],
        outputs[n_carry : len(outputs) - shape["until"]],
        loop_names,
        outputs[-1] if shape["until"] else None,
    )
    # Below BATCH_FROM steps the sequence part runs at every step, in the loop: batching it
    # costs more than it saves there.
    inline, _ = _generate_loop(
        carry_in,
        list(x_in),
        len(lifted) + len(constant_out),
        [n for n in nodes if klass[n] in (Kind.SEQUENCE, Kind.CARRY) and n.op != "placeholder"],
        outputs[:n_carry],
        outputs[n_carry : len(outputs) - shape["until"]],
        loop_names,
        outputs[-1] if shape["until"] else None,
    )
    return Hoisted(
        once=once,
        over=over,
        loop=loop,
        inline=inline,
        captured=tuple(lifted),
        x_used=x_used,
        y_tensor=shape["y_tensor"],
        y_spec=shape["y_spec"],
        y_leaf=_pytree.is_leaf_spec(shape["y_spec"]) and shape["y_tensor"] == (True,),
        sequence_count=len(sequence_out),
        sequence_bytes=sum(_bytes(n) for n in sequence_out),
        source=source,
        stops=bool(shape["until"]),
        operations=tuple(
            str(getattr(n.target, "__name__", n.target))
            for n in nodes
            if klass[n] == Kind.CARRY and n.op == "call_function"
        ),
    )


_COPIES = (torch.ops.aten.clone.default, torch.ops.aten._to_copy.default)


def _without_copies(graph: torch.fx.Graph) -> None:
    """The graph without the copies that change nothing it computes.

    Reference implementations copy values before they update them (``S = S.clone()``, then
    ``S = S + k * v`` or ``S += k * v``; ``v[:, i].clone()``), which costs a copy per step:

    * a copy (``clone``, ``to`` of the same dtype and device) with the strides of its source,
      into which nothing writes, of a source into which nothing writes, that is not an output
      (the carry or ``y`` returned must not be the caller's tensor), is its source;
    * a copy written into once, by an operation with a functional form (``add_``, ``mul_``,
      ...), is that functional operation on its source (a new tensor, returned or not), where
      it gives the dtype, shape and strides of the copy, nothing wrote into the source between
      them and nothing read a view of the copy before the write.
    """
    nodes = list(graph.nodes)
    order = {node: i for i, node in enumerate(nodes)}
    output = nodes[-1]
    outputs = {_root(n) for n in _pytree.tree_leaves(output.args) if isinstance(n, torch.fx.Node)}
    writes: dict[torch.fx.Node, list[int]] = {}  # root -> positions of the writes into it
    for node in nodes:
        for written in _written(node):
            writes.setdefault(_root(written), []).append(order[node])
    for node in nodes:
        if node.op != "call_function" or node.target not in _COPIES:
            continue
        source = node.args[0]
        if not isinstance(source, torch.fx.Node) or not _same_layout(node, source):
            continue
        source_writes = writes.get(_root(source), [])
        if node in writes:
            _fold_copy_into_write(graph, node, source, order, writes[node], source_writes)
        elif node not in outputs and not any(at > order[node] for at in source_writes):
            node.replace_all_uses_with(source)
            graph.erase_node(node)


def _fold_copy_into_write(
    graph: torch.fx.Graph,
    copy: torch.fx.Node,
    source: torch.fx.Node,
    order: dict[torch.fx.Node, int],
    copy_writes: list[int],
    source_writes: list[int],
) -> None:
    """``copy = clone(source); copy.add_(v)`` as ``add(source, v)`` (see :func:`_without_copies`):
    what reads the copy before the write (no view: a view would see the write) reads
    ``source``, what reads it after reads the new tensor."""
    if len(copy_writes) != 1:
        return
    write = next((user for user in copy.users if order[user] == copy_writes[0]), None)
    if (
        write is None
        or write.args[:1] != (copy,)
        or copy in (*write.args[1:], *write.kwargs.values())
    ):
        return
    before = [user for user in copy.users if order[user] < order[write]]
    if any(
        not isinstance(user.target, _compat.OpOverload) or user.target.is_view for user in before
    ) or any(order[copy] < at <= order[write] for at in source_writes):
        return
    target = write.target
    if not isinstance(target, _compat.OpOverload):
        return
    name = target.overloadpacket.__name__
    packet = getattr(torch.ops.aten, name[:-1], None) if name.endswith("_") else None
    functional = getattr(packet, target._overloadname, None) if packet is not None else None
    if functional is None or functional._schema.arguments[0].is_write:
        return
    value = copy.meta.get("val")
    if not isinstance(value, _compat.FakeTensor):
        return
    arguments = [source, *write.args[1:]]
    try:
        with value.fake_mode:
            made = functional(*_pytree.tree_map(_meta_value, arguments), **write.kwargs)
    except Exception:  # the functional form does not take these arguments
        return
    if not (
        isinstance(made, torch.Tensor)
        and made.dtype == value.dtype
        and made.shape == value.shape
        and made.stride() == value.stride()
    ):
        return
    with graph.inserting_before(write):
        folded = graph.call_function(functional, tuple(arguments), dict(write.kwargs))
    folded.meta = dict(write.meta)
    folded.meta["val"] = made
    for user in before:
        user.replace_input_with(copy, source)
    write.replace_all_uses_with(folded)
    copy.replace_all_uses_with(folded)
    graph.erase_node(write)
    graph.erase_node(copy)


def _meta_value(value: Any) -> Any:
    return value.meta["val"] if isinstance(value, torch.fx.Node) else value


def _same_layout(copy: torch.fx.Node, source: torch.fx.Node) -> bool:
    """Whether ``copy`` has the dtype, device, shape and strides of ``source``."""
    a, b = copy.meta.get("val"), source.meta.get("val")
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.dtype == b.dtype
        and a.device == b.device
        and a.shape == b.shape
        and a.stride() == b.stride()
    )


def _classify(node: torch.fx.Node, klass: dict[torch.fx.Node, Kind]) -> Kind:
    """The class of an operation: that of its latest input, every step for a random one;
    refuse a write in place into an input or a captured tensor."""
    level = join(klass[n] for n in node.all_input_nodes)
    target = node.target
    if target is operator.getitem:
        return level
    if not isinstance(target, _compat.OpOverload):
        raise _NotHoistable(f"it calls {target}")
    if torch.Tag.nondeterministic_seeded in target.tags:
        level = Kind.CARRY  # random: at every step, in the loop's order
    for written in _written(node):
        if _root(written).op in ("placeholder", "get_attr"):
            raise _NotHoistable(f"it writes in place into an input or captured tensor ({target})")
    return level


def _written(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The values an operation writes into, as its schema says (``Tensor(a!)``)."""
    _, written = _compat.written_arguments(node)
    flat = [
        item
        for value in written
        for item in (value if isinstance(value, (list, tuple)) else [value])
    ]
    return [item for item in flat if isinstance(item, torch.fx.Node)]


def _bytes(node: torch.fx.Node) -> int:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    return 0


def _root(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose storage ``node`` views (following view operations)."""
    while node.op == "call_function":
        target = node.target
        if target is not operator.getitem and not (
            isinstance(target, _compat.OpOverload) and target.is_view
        ):
            break
        node = node.args[0]  # type: ignore[assignment]
    return node
