"""``Checkpoint(snapshots=c)``: carries kept by a forward pass without autograd, and a reversal.

The forward pass runs the steps without autograd and keeps at most ``c`` carries besides
``init``: where Griewank's binomial schedule places them, or, for a loop that only ``until``
ends, where the online schedule places them as the steps run. The backward pass reverses the
steps between two kept carries by the binomial schedule, each step run once more with autograd
from a kept or recomputed carry, its captured tensors read through stand-ins cut from their
history (:class:`_StandIns`)."""

from __future__ import annotations

import contextlib
import dataclasses
import traceback
from typing import Any

import torch

from torchscan import _checkpoint, _pytree

Segments = Any
"""How steps run: :class:`torchscan._checkpointed._Segments` (which imports this module)."""


CHUNK = 64
"""The most steps run as one scan (one loop) without autograd: a hoisted step computes what does
not depend on the carry for that many steps at once, which must not grow with their number."""


@dataclasses.dataclass
class _Snapshot:
    """A carry kept for the backward pass: its step, its leaves, and the random generators'
    states before that step (``None`` where the steps draw no random number)."""

    step: int
    leaves: list[Any]
    states: tuple[torch.Tensor, list[torch.Tensor]] | None


def run(segments: Segments, snapshots: int, total: int | None) -> tuple[Any, Any]:
    """``(carry, ys)`` of ``total`` steps (``None``: a loop that ends at ``until``) with
    ``Checkpoint(snapshots=c)``.

    The forward pass runs without autograd, keeping at most ``c`` carries besides ``init``: where
    Griewank's binomial schedule places them (:func:`torchscan._checkpoint.binomial_points`),
    or, where the number of steps is known only at the end, where
    :class:`torchscan._checkpoint.OnlinePlacement` places them as the steps run. It notes the
    tensors requiring gradients that the step reads from outside (:class:`_Captured`). The
    result is a function of ``init``'s tensors, of the sequences and of those
    (:class:`_Reversed`), whose backward pass reverses each run of steps between two kept
    carries by the binomial schedule, with the places the carries before it leave free. Where
    ``total`` is known, its last step runs with autograd at once, as revolve's does: the
    backward pass starts from what it saved."""
    plan = segments.plan
    if total is not None and total <= 1:  # one step: what it saves is all there is to keep
        return segments.run(plan.carry.init, 0, total)
    last: int | None = None
    if total is None:
        online = _checkpoint.OnlinePlacement(snapshots + 1)
        place = online.slot
    else:
        points = _checkpoint.binomial_points(total, snapshots)
        *kept_at, last = points
        places = {0: 0} | {step: j + 1 for j, step in enumerate(kept_at)}
        place = places.get
    devices = segments.devices
    before = states(devices)
    kept: dict[int, _Snapshot] = {}
    carry, pieces, step = plan.carry.init, [], 0
    found = _Captured()
    with torch.no_grad(), found:
        first = place(0)
        assert first == 0
        kept[0] = _Snapshot(0, list(plan.carry.leaves), before)
        while step != last:
            end, slot = step + 1, place(step + 1)
            while slot is None and end - step < CHUNK and end != last:
                end += 1
                slot = place(end)
            carry, ys = segments.run(carry, step, end)
            pieces.append(ys)
            if segments.stop is not None:
                break
            step = end
            if slot is not None:
                kept[slot] = _Snapshot(end, _pytree.tree_flatten(carry)[0], states(devices))
    # only a loop that ends at until has no total
    assert total is not None or segments.stop is not None
    if same_states(before, states(devices)):
        for snapshot in kept.values():
            snapshot.states = None
    carry_leaves, carry_spec = _pytree.tree_flatten(carry)
    ys = segments.join(pieces)
    del pieces  # (joined: their memory free before the last step's ys are joined to them)
    ys_leaves, ys_spec = _pytree.tree_flatten(ys)
    reversal = _Reversal(
        segments,
        kept=sorted(kept.values(), key=lambda k: k.step),
        slots=snapshots + 1,
        length=step if segments.stop is None else segments.stop + 1,
        captured=list(found.tensors.values()),
        ys_present=[isinstance(t, torch.Tensor) for t in ys_leaves],
        ys_axes=segments.plan.out.axes(ys),
        ys_reverse=segments.plan.out.reverse(ys),
    )
    inputs = reversal.inputs()
    outputs = [t for t in (*carry_leaves, *ys_leaves) if isinstance(t, torch.Tensor)]
    given = {id(t) for t in (*inputs, *reversal.captured)}
    outputs = [t.clone() if t._is_view() or id(t) in given else t for t in outputs]
    results = iter(_Reversed.apply(reversal, outputs, *inputs, *reversal.captured))
    carry_leaves = [next(results) if isinstance(t, torch.Tensor) else t for t in carry_leaves]
    ys_leaves = [next(results) if isinstance(t, torch.Tensor) else t for t in ys_leaves]
    carry = _pytree.tree_unflatten(carry_leaves, carry_spec)
    ys = _pytree.tree_unflatten(ys_leaves, ys_spec)
    del outputs, ys_leaves, results
    if total is None or segments.stop is not None:
        return carry, ys
    carry, ys_last = segments.run(carry, step, total)
    return carry, segments.join([ys, ys_last])


class _Captured(torch.overrides.TorchFunctionMode):
    """Notes every tensor requiring gradients that a torch function or method is given while
    the forward pass runs without autograd, where nothing the step computes requires them but
    the views it makes of them: the tensors the step reads from outside (weights, the sequences,
    and ``init``'s leaves as its first carry)."""

    def __init__(self) -> None:
        super().__init__()
        self.tensors: dict[int, torch.Tensor] = {}

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        self._note(args)
        if kwargs:
            self._note(tuple(kwargs.values()))
        return func(*args, **kwargs)

    def _note(self, values: Any) -> None:
        for value in values:
            if isinstance(value, torch.Tensor):
                if value.requires_grad and not _view_without_history(value):
                    self.tensors.setdefault(id(value), value)
            elif isinstance(value, (tuple, list)):
                self._note(value)
            elif isinstance(value, dict):
                self._note(tuple(value.values()))


class _StandIns(torch.overrides.TorchFunctionMode):
    """Gives torch functions and methods a stand-in for each of ``captured`` where they are given
    it, made at its first read: with ``cut``, a tensor cut from its history, whose gradient is
    then that of the reads alone (not of the tensors it was computed from; a copy of it where the
    captured tensor has a history, so that the step may change the shape of a view of it in
    place as it may of the captured tensor); else an alias, whose gradients flow on to it.
    :attr:`targets` are the tensors to take gradients at (None where none was read).

    A scan or loop that the step runs meanwhile takes the stand-ins of its ``init`` and
    sequences (:func:`with_stand_ins`), and runs neither checkpointed nor hoisted: a trace would
    capture the stand-ins of this run, which the next replaces."""

    def __init__(self, captured: list[torch.Tensor], cut: bool) -> None:
        super().__init__()
        self.captured, self.cut = captured, cut
        self.index = {id(c): i for i, c in enumerate(captured) if c.requires_grad}
        self.targets: list[torch.Tensor | None] = [None] * len(captured)
        self.given: list[torch.Tensor | None] = [None] * len(captured)

    def __enter__(self) -> _StandIns:
        _ACTIVE.append(self)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        _ACTIVE.pop()
        super().__exit__(*exc)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        args = self._swap(args)
        kwargs = self._swap(kwargs) if kwargs else {}
        return func(*args, **kwargs)

    def swap(self, tensor: torch.Tensor) -> torch.Tensor:
        """The stand-in of ``tensor``, or ``tensor`` where it is not captured."""
        i = self.index.get(id(tensor))
        if i is None:
            return tensor
        given = self.given[i]
        if given is None:
            captured = self.captured[i]
            if self.cut:
                target = captured.detach().requires_grad_()
                given = target if captured.grad_fn is None else target.clone()
            else:
                target = given = captured.view_as(captured)
            self.targets[i], self.given[i] = target, given
        return given

    def _swap(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self.swap(value)
        if type(value) in (tuple, list):
            return type(value)(self._swap(v) for v in value)
        if type(value) is dict:
            return {k: self._swap(v) for k, v in value.items()}
        return value


_ACTIVE: list[_StandIns] = []
"""The stand-ins in force, innermost last."""


def standing_in() -> bool:
    """Whether the backward pass of ``Checkpoint(snapshots=...)`` runs a step now, reading its
    captured tensors through stand-ins (:class:`_StandIns`)."""
    return bool(_ACTIVE)


def with_stand_ins(plan: Any) -> Any:
    """``plan`` (a ScanPlan or LoopPlan) of a scan or loop that a step runs while
    :func:`standing_in`, its ``init`` and sequences read as a torch function would read them:
    their gradients then go to the stand-ins, as those of what the step reads do."""
    leaves = [_current(t) if isinstance(t, torch.Tensor) else t for t in plan.carry.leaves]
    changes: dict[str, Any] = {}
    if any(a is not b for a, b in zip(leaves, plan.carry.leaves, strict=True)):
        init = _pytree.tree_unflatten(leaves, plan.carry.spec)
        changes["carry"] = plan.carry.of(init, leaves)
    xs = getattr(plan, "xs_leaves", None)
    if xs is not None:
        swapped = tuple(_current(t) if isinstance(t, torch.Tensor) else t for t in xs)
        if any(a is not b for a, b in zip(swapped, xs, strict=True)):
            changes["xs_leaves"] = swapped
    return dataclasses.replace(plan, **changes) if changes else plan


def _current(tensor: torch.Tensor) -> torch.Tensor:
    """What a torch function given ``tensor`` reads in its place: its stand-in where one is in
    force."""
    for stand_ins in reversed(_ACTIVE):
        tensor = stand_ins.swap(tensor)
    return tensor


def _view_without_history(t: torch.Tensor) -> bool:
    """Whether ``t`` is a view made without autograd: it requires gradients as its base does, but
    the base is what is read (noted as the view was made). Torch refuses to read its history
    once its base has changed in place (a step's shape-only change of a view of its ``x``)."""
    if not t._is_view():
        return False
    try:
        return t.grad_fn is None
    except RuntimeError:
        return True


def _differentiable(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())


@dataclasses.dataclass
class _Reversal:
    """The backward pass of :func:`run`: how to run steps (``segments``), the kept carries
    in the order of their steps, the places for carries, the steps it reverses, the tensors the
    step captures, and
    which leaves of ``ys`` are tensors, along which axis and from which end they are stacked."""

    segments: Segments
    kept: list[_Snapshot]
    slots: int
    length: int
    captured: list[torch.Tensor]
    ys_present: list[bool]
    ys_axes: list[int]
    ys_reverse: list[bool]
    checked: bool = False  # whether the first step run again was checked (_check_reads)

    def inputs(self) -> list[torch.Tensor]:
        """The tensors of ``init`` and of the sequences: with the captured tensors, what the
        outputs are a function of."""
        leaves = (*self.segments.plan.carry.leaves, *self.segments.xs_leaves)
        return [t for t in leaves if isinstance(t, torch.Tensor)]

    def backward(self, grads: tuple[torch.Tensor | None, ...]) -> list[torch.Tensor | None]:
        """The gradients of :meth:`inputs` and of the captured tensors, from those of the last
        carry's tensors and of the ``ys`` tensors (``grads``)."""
        leaves = self.segments.plan.carry.leaves
        it = iter(grads)  # (the last carry has the tensors where init has them)
        cotangent = [next(it) if isinstance(t, torch.Tensor) else None for t in leaves]
        self.ys_grads = [next(it) if present else None for present in self.ys_present]
        self.found: list[torch.Tensor | None] = [None] * len(self.captured)
        self.xs_grads: list[torch.Tensor | None] = [None] * len(self.segments.xs_leaves)
        with self._random():
            end = self.length
            for j in range(len(self.kept) - 1, -1, -1):
                start = self.kept[j]
                cotangent = self._reverse(start, end, self.slots - (j + 1), cotangent)
                end = start.step
        xs = self.segments.xs_leaves
        return (
            [g for g, t in zip(cotangent, leaves, strict=True) if isinstance(t, torch.Tensor)]
            + [g for g, t in zip(self.xs_grads, xs, strict=True) if isinstance(t, torch.Tensor)]
            + self.found
        )

    def again(self, grads: tuple[torch.Tensor | None, ...]) -> list[torch.Tensor | None]:
        """:meth:`backward` where autograd records it (``create_graph=True``): the steps run
        once more with autograd from ``init`` (keeping what they save, as without
        checkpointing), whose gradients are functions of the inputs."""
        segments = self.segments
        leaves = segments.plan.carry.leaves
        # aliases, whose gradients flow on to the inputs (as those of detached tensors would not)
        carry = [t.view_as(t) if _differentiable(t) and t.requires_grad else t for t in leaves]
        xs = [
            t.view_as(t) if _differentiable(t) and t.requires_grad else t
            for t in segments.xs_leaves
        ]
        stand_ins = _StandIns(self.captured, cut=False)
        with self._random(), stand_ins:
            self._restore(self.kept[0])
            out = segments.run(
                self._carry(carry), 0, self.length, segments.slices(tuple(xs), 0, self.length)
            )
        inputs = [t for t in (*carry, *xs) if isinstance(t, torch.Tensor)]
        targets = [
            c if t is None else t for c, t in zip(self.captured, stand_ins.targets, strict=True)
        ]
        return gradients(out, grads, [*inputs, *targets], create_graph=True)

    def _random(self) -> Any:
        """Where the steps draw random numbers: the generators' states restored afterwards."""
        if self.kept[0].states is None:
            return contextlib.nullcontext()
        return torch.random.fork_rng(devices=self.segments.devices)

    def _reverse(
        self, start: _Snapshot, stop: int, free: int, cotangent: list[torch.Tensor | None]
    ) -> list[torch.Tensor | None]:
        """The cotangent of the carry at ``start`` from that of the carry at ``stop``: the
        binomial schedule over the steps between, with ``free`` places to keep carries. Each
        carry kept is the start of a run whose first part is reversed last, with one place
        fewer (at most ``free + 1`` kept at once)."""
        runs = [(start, free)]  # carries kept, each with the places for the run it starts
        while runs:
            first, places = runs[-1]
            if stop - first.step > 1:
                middle = first.step + _checkpoint.binomial_split(stop - first.step, places)
                runs.append((self._advance(first, middle), max(places - 1, 0)))
                continue
            cotangent = self._turn(first, cotangent)
            runs.pop()
            stop = first.step
        return cotangent

    def _restore(self, snapshot: _Snapshot) -> None:
        if snapshot.states is not None:
            cpu, cuda = snapshot.states
            torch.set_rng_state(cpu)
            for device, state in zip(self.segments.devices, cuda, strict=True):
                torch.cuda.set_rng_state(state, device)

    def _carry(self, leaves: list[Any]) -> Any:
        return _pytree.tree_unflatten(leaves, self.segments.plan.carry.spec)

    def _advance(self, start: _Snapshot, stop: int) -> _Snapshot:
        """The carry at ``stop``, run without autograd from ``start``."""
        self._restore(start)
        carry = self._carry(start.leaves)
        with torch.no_grad():
            for step in range(start.step, stop, CHUNK):
                carry, _ = self.segments.run(carry, step, min(step + CHUNK, stop))
        after = None if start.states is None else states(self.segments.devices)
        return _Snapshot(stop, _pytree.tree_flatten(carry)[0], after)

    def _turn(
        self, start: _Snapshot, cotangent: list[torch.Tensor | None]
    ) -> list[torch.Tensor | None]:
        """The cotangent of the carry at ``start`` from that of the carry after its step (and
        of its ``y``): the gradients of the step's slices of the sequences written into theirs,
        the captured tensors' added up."""
        self._restore(start)
        segments, t = self.segments, start.step
        leaves = [
            t.detach().requires_grad_()
            if _differentiable(t)
            else t.detach()
            if isinstance(t, torch.Tensor)
            else t
            for t in start.leaves
        ]
        xs = tuple(
            x.detach().requires_grad_() if _differentiable(x) and x.requires_grad else x
            for x in segments.slices(segments.xs_leaves, t, t + 1)
        )
        # The captured tensors, read through stand-ins cut from their history: the gradient of
        # one computed from another (a weight and its double) is its own alone, the rest flows
        # on through the history when the inputs' gradients are returned.
        stand_ins = _StandIns(self.captured, cut=True)
        with torch.enable_grad(), stand_ins:
            carry, ys = segments.run(self._carry(leaves), t, t + 1, xs)
        outputs, cotangents = [], []
        for out, g in zip(_pytree.tree_flatten(carry)[0], cotangent, strict=True):
            if g is not None and isinstance(out, torch.Tensor) and out.requires_grad:
                outputs.append(out)
                cotangents.append(g)
        for j, (out, g) in enumerate(zip(_pytree.tree_flatten(ys)[0], self.ys_grads, strict=True)):
            if g is not None and isinstance(out, torch.Tensor) and out.requires_grad:
                axis = self.ys_axes[j]
                outputs.append(out)
                cotangents.append(
                    g.narrow(axis, g.size(axis) - 1 - t if self.ys_reverse[j] else t, 1)
                )
        wanted = [x for x in leaves if isinstance(x, torch.Tensor) and x.requires_grad]
        sliced = [j for j, x in enumerate(xs) if isinstance(x, torch.Tensor) and x.requires_grad]
        read = [(i, target) for i, target in enumerate(stand_ins.targets) if target is not None]
        captured = [i for i, _ in read]
        inputs = [*wanted, *(xs[j] for j in sliced), *(target for _, target in read)]
        if not self.checked:
            self.checked = True
            self._check_reads(outputs, inputs)
        if not outputs:
            return [None] * len(leaves)
        got = torch.autograd.grad(
            outputs,
            inputs,
            cotangents,
            allow_unused=True,
        )
        carried = iter(got[: len(wanted)])
        for j, g in zip(sliced, got[len(wanted) : len(wanted) + len(sliced)], strict=True):
            if g is not None:
                whole = self.xs_grads[j]
                if whole is None:
                    whole = self.xs_grads[j] = torch.zeros_like(segments.xs_leaves[j])
                axis = segments.plan.in_axes[j]
                whole.narrow(axis, segments.offset(j, t, t + 1), 1).copy_(g)
        for i, g in zip(captured, got[len(wanted) + len(sliced) :], strict=True):
            before = self.found[i]
            if g is not None:
                self.found[i] = g if before is None else before + g
        return [
            next(carried) if isinstance(x, torch.Tensor) and x.requires_grad else None
            for x in leaves
        ]

    def _check_reads(self, outputs: list[torch.Tensor], given: list[torch.Tensor]) -> None:
        """Refuse a step whose gradients reach a tensor other than those ``given`` it (its carry,
        its slices of the sequences, the stand-ins of the captured tensors): one that the
        forward pass did not see the step read (torch code that no torch function mode sees,
        such as a compiled function), whose gradient would be missing."""
        known = {id(t) for t in given}
        seen: set[Any] = set()
        todo: list[Any] = [o.grad_fn for o in outputs if o.grad_fn is not None]
        while todo:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            variable = getattr(node, "variable", None)
            if variable is not None and id(variable) not in known:
                protocol = self.segments.plan.protocol
                raise self.segments._refusal(
                    traceback.extract_stack(),
                    f"checkpoint=Checkpoint(snapshots=...) ran the {protocol.step_name}s without "
                    f"autograd and did not see the {protocol.fn_name} read a tensor that requires "
                    f"gradients (of shape {tuple(variable.shape)}), so its gradient would be "
                    f"lost. Read it through torch functions in the {protocol.fn_name} (not in a "
                    "compiled function), or give checkpoint=k, whose segments run with autograd.",
                )
            todo.extend(next_node for next_node, _ in node.next_functions)


class _Reversed(torch.autograd.Function):
    """The outputs of steps run without autograd (``outputs``), as a function of ``init``'s
    tensors, of the sequences and of the tensors the step captures; the backward pass is
    ``reversal``'s."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, reversal: _Reversal, outputs: list[torch.Tensor], *inputs: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        ctx.reversal = reversal
        ctx.mark_non_differentiable(*(t for t in outputs if not _differentiable(t)))
        return tuple(outputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        reversal = ctx.reversal
        if torch.is_grad_enabled():
            return (None, None, *reversal.again(grads))
        return (None, None, *reversal.backward(grads))


def states(devices: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    return torch.get_rng_state(), [torch.cuda.get_rng_state(device) for device in devices]


def same_states(
    a: tuple[torch.Tensor, list[torch.Tensor]], b: tuple[torch.Tensor, list[torch.Tensor]]
) -> bool:
    return torch.equal(a[0], b[0]) and all(map(torch.equal, a[1], b[1]))


def gradients(
    out: Any, grads: tuple[torch.Tensor | None, ...], inputs: list[torch.Tensor], create_graph: bool
) -> list[torch.Tensor | None]:
    """The gradients of ``inputs`` from those (``grads``) of the tensors of ``out``: None for an
    input that does not require them, or that none reaches."""
    outputs = [t for t in _pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    pairs = [
        (o, g) for o, g in zip(outputs, grads, strict=True) if g is not None and o.requires_grad
    ]
    wanted = [i for i, t in enumerate(inputs) if t.requires_grad]
    found: list[torch.Tensor | None] = [None] * len(inputs)
    if pairs and wanted:
        got = torch.autograd.grad(
            [o for o, _ in pairs],
            [inputs[i] for i in wanted],
            [g for _, g in pairs],
            allow_unused=True,
            create_graph=create_graph,
        )
        for i, g in zip(wanted, got, strict=True):
            found[i] = g
    return found
