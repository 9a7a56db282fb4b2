"""The checkpointed run of a scan (``checkpoint=``, :class:`torchscan.Checkpoint`).

With ``every=``, the steps run in segments, each a scan of its own (eager or hoisted, as any scan
runs): a hoisted segment as an autograd function of its carry, its slice of ``xs`` and what its
step captures, which runs it again in the backward pass (:func:`_recomputed`); any other under
``torch.utils.checkpoint`` (non-reentrant), whose forward pass keeps the carry the segment starts
from, the random generators' states and nothing else.

With ``snapshots=``, the forward pass runs without autograd and keeps the carries where the
binomial schedule places them (the online schedule where only ``until`` ends a loop); the
backward pass reverses the steps between them one at a time, each run again with autograd from a
kept or recomputed carry (:mod:`torchscan._reversal`)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import traceback
from collections.abc import Callable
from typing import Any

import torch

from torchscan import _compat, _hoist, _pytree, _reversal, _source
from torchscan._errors import TorchscanValueError
from torchscan._plan import LoopPlan, ScanPlan
from torchscan._reversal import gradients as _gradients
from torchscan._reversal import same_states as _same_states
from torchscan._reversal import states as _states
from torchscan._until import Until

Runner = Callable[[Any], tuple[Any, Any]]
Prepare = Callable[[ScanPlan], "tuple[_hoist.Hoisted, list[torch.Tensor]] | None"]


def scan(plan: ScanPlan, run: Runner, prepare: Prepare | None = None) -> tuple[Any, Any]:
    """``(carry, ys)`` of ``plan`` with its ``checkpoint``; ``run`` runs a segment's plan (one
    without ``checkpoint``); ``prepare`` gives a segment's hoisted step and the tensors it
    captures, or None where it is not hoisted (:func:`torchscan._hoist.prepare`)."""
    segments = _Segments(plan, run, prepare)
    assert plan.checkpoint is not None
    if plan.checkpoint.snapshots is not None:
        return _reversal.run(segments, plan.checkpoint.snapshots, plan.length)
    carry, pieces = _schedule(segments, plan.length)
    return carry, segments.join(pieces)


def loop(plan: LoopPlan, run: Runner) -> tuple[Any, Any]:
    """``(carry, ys)`` of the loop ``plan`` with its ``checkpoint``: its iterations in segments,
    each a loop of its own with the iteration numbers of its place; ``run`` runs a segment's
    plan."""
    total = None if plan.trip_count is None else max(int(plan.trip_count), 0)
    policy = plan.checkpoint
    assert policy is not None
    if total is None and policy.every == "sqrt":
        raise TorchscanValueError(
            f"{plan.protocol.api}: checkpoint={_shown(plan.checkpoint)} needs the number of "
            "iterations, but trip_count is None (the loop ends at until). Give trip_count= "
            "(the most iterations), checkpoint=Checkpoint(snapshots=c) (c carries placed "
            "as the iterations run), or checkpoint=k, which keeps a carry every k iterations "
            "however many run."
        )
    segments = _LoopSegments(plan, run)
    if policy.snapshots is not None:
        return _reversal.run(segments, policy.snapshots, total)
    carry, pieces = _schedule(segments, total)
    return carry, segments.join(pieces)


def _shown(policy: Any) -> str:
    return '"sqrt"' if policy.every == "sqrt" and policy.save is None else repr(policy)


def _schedule(segments: _Segments, total: int | None) -> tuple[Any, list[Any]]:
    """The carry after the steps, and the pieces of ``ys`` in the order the steps ran, in
    segments of the plan's ``every`` steps (``total`` steps; ``None``: until a step stops the
    loop)."""
    policy = segments.plan.checkpoint
    assert policy is not None
    k = policy.segment(total) if total is not None else policy.every
    assert isinstance(k, int)
    carry, pieces = segments.plan.carry.init, []
    for start in itertools.count(0, k) if total is None else range(0, total, k):
        if segments.stopped_before(start):
            break
        stop = start + k if total is None else min(start + k, total)
        carry, ys = segments.kept_segment(carry, start, stop)
        pieces.append(ys)
    return carry, pieces


@dataclasses.dataclass
class _Segments:
    """Runs of steps ``start`` to ``stop`` (in the order the steps run) of ``plan``, each as a
    scan of its own, and the pieces of ``ys`` they give put together."""

    plan: Any  # ScanPlan; LoopPlan for _LoopSegments
    runner: Runner
    prepare: Prepare | None = None
    stop: int | None = None
    """The step that returned ``until`` with a true stop, if one did: no step runs after it (in
    the forward pass, and where the backward pass runs a segment again)."""
    returns_until: bool | None = None
    """Whether the step returns ``until``, known from its first run: the segments after the
    first of a step that does not run it unwrapped, so that they are hoisted as the scan without
    ``checkpoint`` is (what :meth:`_watching` wraps it in captures too much for a hoisting
    signature)."""

    def __post_init__(self) -> None:
        policy = self.plan.checkpoint
        assert policy is not None
        self.context_fn: Callable[[], Any] | None = None
        if policy.save is not None:
            from torch.utils import checkpoint

            def keep(_ctx: Any, op: Any, *_: Any, **__: Any) -> Any:
                policies = checkpoint.CheckpointPolicy
                return policies.MUST_SAVE if policy.keeps(op) else policies.PREFER_RECOMPUTE

            def contexts() -> tuple[Any, Any]:
                forward, again = checkpoint.create_selective_checkpoint_contexts(keep)
                stack = contextlib.ExitStack()
                stack.enter_context(forward)  # below: what it keeps passes the guard first
                stack.enter_context(_KeptUnchanged(self))
                return stack, again

            self.context_fn = contexts

    def kept(self, run: Callable[..., Any], carry: Any, *args: Any, **kwargs: Any) -> Any:
        """``run(carry, ...)``, whose backward pass runs it again from ``carry``, with the random
        numbers it drew (:class:`_Again`).

        The carry goes to ``torch.utils.checkpoint`` leaf by leaf: it keeps a tensor argument
        as a saved tensor, which a segment around it drops and runs again, but any other
        argument (a tuple of tensors) as it is, for as long as the graph lives."""
        from torch.utils import checkpoint

        options: dict[str, Any] = {"use_reentrant": False, "preserve_rng_state": False}
        if self.context_fn is not None:
            options["context_fn"] = self.context_fn
        leaves, spec = _pytree.tree_flatten(carry)
        again = _Again(
            lambda *leaves: run(_pytree.tree_unflatten(list(leaves), spec), *args, **kwargs),
            self.devices,
        )
        return checkpoint.checkpoint(again, *leaves, **options)

    @functools.cached_property
    def devices(self) -> list[int]:
        """The CUDA devices of the carry and the sequences, whose random generators a segment
        may draw from (as ``torch.utils.checkpoint`` takes them)."""
        tensors = [*self.plan.carry.leaves, *self.xs_leaves]
        return sorted(
            {t.device.index or 0 for t in tensors if t is not None and t.device.type == "cuda"}
        )

    def stopped_before(self, step: int) -> bool:
        """Whether a step before ``step`` stopped the scan."""
        return self.stop is not None and self.stop < step

    def kept_segment(self, carry: Any, start: int, stop: int) -> tuple[Any, Any]:
        """``run(carry, start, stop)`` kept by its carry: where the segment is hoisted (and its
        step returns no ``until``, and ``save=`` keeps nothing), as a function of its tensors
        and of those its step captures (:class:`_Recomputed`), which runs without autograd
        in the forward pass and pays no saved-tensor hook; else by ``torch.utils.checkpoint``
        (:meth:`kept`)."""
        if self.prepare is not None and self.context_fn is None and self.returns_until is False:
            segment = self._segment(carry, start, stop)
            found = self.prepare(segment)
            if found is not None:
                out = _recomputed(segment, *found, self.devices)
                if out is not None:
                    return out
        return self.kept(self.run, carry, start, stop)

    def run(
        self, carry: Any, start: int, stop: int, xs: tuple[Any, ...] | None = None
    ) -> tuple[Any, Any]:
        """Steps ``start`` to ``stop`` from ``carry``: ``(carry, ys)``; ``xs``: the leaves of
        the sequences for these steps (:meth:`slices`), in place of the plan's."""
        return self.runner(self._segment(carry, start, stop, xs))

    @property
    def xs_leaves(self) -> tuple[Any, ...]:
        """The leaves of the sequences, whole."""
        return self.plan.xs_leaves

    def offset(self, leaf: int, start: int, stop: int) -> int:
        """Where steps ``start`` to ``stop`` lie along the axis of the sequence leaf ``leaf``."""
        return self.plan.length - stop if self.plan.in_reverse[leaf] else start

    def slices(self, leaves: tuple[Any, ...], start: int, stop: int) -> tuple[Any, ...]:
        """Steps ``start`` to ``stop`` of the sequence leaves ``leaves`` (the plan's, or tensors
        in their place)."""
        return tuple(
            None
            if leaf is None or axis is None
            else leaf.narrow(axis, self.offset(j, start, stop), stop - start)
            for j, (leaf, axis) in enumerate(zip(leaves, self.plan.in_axes, strict=True))
        )

    def _segment(
        self, carry: Any, start: int, stop: int, xs: tuple[Any, ...] | None = None
    ) -> ScanPlan:
        """The plan of steps ``start`` to ``stop`` from ``carry``."""
        plan = self.plan
        return dataclasses.replace(
            plan,
            # (the first segment wrapped whenever it runs: a recomputation takes its forward's path)
            fn=self._watching(plan.fn, start) if start == 0 or self.returns_until else plan.fn,
            carry=plan.carry.of(carry, _pytree.tree_flatten(carry)[0]),
            xs_leaves=self.slices(plan.xs_leaves, start, stop) if xs is None else xs,
            length=stop - start,
            padded_length=None,
            checkpoint=None,
        )

    def _watching(self, fn: Callable[[Any, Any], Any], start: int) -> Callable[[Any, Any], Any]:
        """``fn`` as the steps from ``start`` on, noting in :attr:`stop` the one that returns a
        true stop (``until``)."""
        steps = itertools.count(start)

        @functools.wraps(fn)
        def step(carry: Any, x: Any) -> Any:
            out, t = fn(carry, x), next(steps)
            returns_until = isinstance(out, tuple) and len(out) == 3 and isinstance(out[2], Until)
            if self.returns_until is None:
                self.returns_until = returns_until
            if returns_until:
                stop = out[2].stop
                if isinstance(stop, torch.Tensor) and stop.numel() == 1 and bool(stop):
                    self.stop = t if self.stop is None else min(self.stop, t)
            return out

        return step

    def _written_after_kept(self, op: Any, kept: Any) -> TorchscanValueError:
        """The refusal of a step that writes (``op``) into a result that ``save=`` keeps
        (``kept``'s), naming the line of the step that does it."""
        frames = traceback.extract_stack()
        return self._refusal(
            frames,
            f"checkpoint keeps the result of {kept} (save= names it), and {op} then changes that "
            "result in place, so the backward pass would read the changed values. Leave "
            f"{kept} out of save= (torch.nn.GRUCell and LSTMCell change the products they take "
            "in place).",
        )

    def _refusal(self, frames: Any, what: str) -> TorchscanValueError:
        plan = self.plan
        source = _source.StepSource.of(plan.user, plan.protocol.api, plan.protocol.fn_name)
        where = next(
            (
                f"{frame.filename}:{frame.lineno}"
                for frame in reversed(frames)
                if frame.lineno is not None
                and source.owns(frame.filename, frame.name, frame.lineno)
            ),
            source.defined,
        )
        return TorchscanValueError(f"{source.who}{', ' + where if where else ''}: {what}")

    def join(self, pieces: list[Any]) -> Any:
        """The ``ys`` of the pieces (in the order their steps ran), each leaf concatenated along
        its axis, from its end where it is stacked from its end."""
        if len(pieces) == 1:
            return pieces[0]
        flat = [_pytree.tree_flatten(piece)[0] for piece in pieces]
        axes, backwards = self.plan.out.axes(pieces[0]), self.plan.out.reverse(pieces[0])
        leaves = []
        for j, (axis, reverse) in enumerate(zip(axes, backwards, strict=True)):
            parts = [leaves_of[j] for leaves_of in flat]
            if parts[0] is None:
                leaves.append(None)
                continue
            leaves.append(torch.cat(parts[::-1] if reverse else parts, dim=axis))
        return _pytree.tree_unflatten(leaves, _pytree.tree_flatten(pieces[0])[1])


class _LoopSegments(_Segments):
    """Runs of iterations ``start`` to ``stop`` of a loop, each a loop of its own whose body sees
    the iteration numbers of its place."""

    @property
    def xs_leaves(self) -> tuple[Any, ...]:
        return ()

    def slices(self, leaves: tuple[Any, ...], start: int, stop: int) -> tuple[Any, ...]:
        return ()

    def run(
        self, carry: Any, start: int, stop: int, xs: tuple[Any, ...] | None = None
    ) -> tuple[Any, Any]:
        plan = self.plan
        body = self._watching(plan.body, start)
        segment = dataclasses.replace(
            plan,
            body=body if start == 0 else lambda i, carry: body(i + start, carry),
            carry=plan.carry.of(carry, _pytree.tree_flatten(carry)[0]),
            trip_count=stop - start,
            cond=None,
            never_ends="",
            checkpoint=None,
        )
        return self.runner(segment)

    def _watching(self, fn: Callable[[Any, Any], Any], start: int) -> Callable[[Any, Any], Any]:
        """The body, noting a true stop in :attr:`stop`; refusing, as the loop without
        ``checkpoint`` does, a first iteration that returns no ``until`` where nothing else
        would end the loop."""
        watched = super()._watching(lambda i, carry: fn(i, carry), start)
        never_ends = self.plan.never_ends

        @functools.wraps(fn)
        def body(i: Any, carry: Any) -> Any:
            out = watched(i, carry)
            if (
                never_ends
                and start == 0
                and not (isinstance(out, tuple) and len(out) == 3 and isinstance(out[2], Until))
            ):
                raise TorchscanValueError(never_ends)
            return out

        return body


class _Again:
    """A segment's run: the first call runs it, noting the random generators' states where it
    draws from them; a later one (the backward pass's) runs it again from those states. A segment
    that draws no random number keeps no state: ``torch.utils.checkpoint`` would keep one for
    every segment (5 KiB for the CPU's generator), more than a carry where segments nest, as the
    binomial schedule's do."""

    def __init__(self, run: Callable[..., Any], devices: list[int]) -> None:
        self.run, self.devices = run, devices
        self.states: tuple[torch.Tensor, list[torch.Tensor]] | None = None
        self.ran = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.ran:
            self.ran = True
            before = _states(self.devices)
            out = self.run(*args, **kwargs)
            if not _same_states(before, _states(self.devices)):
                self.states = before
            return out
        if self.states is None:
            return self.run(*args, **kwargs)
        with torch.random.fork_rng(devices=self.devices):
            cpu, cuda = self.states
            torch.set_rng_state(cpu)
            for device, state in zip(self.devices, cuda, strict=True):
                torch.cuda.set_rng_state(state, device)
            return self.run(*args, **kwargs)


class _KeptUnchanged(_compat.TorchDispatchMode):
    """Within the first run of a segment whose ``save=`` keeps results: refuses an operator that
    writes into the storage of a kept result. Selective checkpointing tells such a write by the
    result's version counter, which a write through ``unsafe_chunk`` (``torch.nn.GRUCell``'s)
    leaves as it was: the backward pass would then read the changed values."""

    def __init__(self, segments: _Segments) -> None:
        super().__init__()
        self.segments = segments
        self.kept: dict[int, Any] = {}  # storage address -> the operator whose result it holds

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        for value in _written(func, args, kwargs):
            if isinstance(value, torch.Tensor) and _address(value) in self.kept:
                raise self.segments._written_after_kept(func, self.kept[_address(value)])
        out = func(*args, **kwargs)
        policy = self.segments.plan.checkpoint
        if policy is not None and policy.keeps(func):
            for leaf in _pytree.tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    self.kept[_address(leaf)] = func
        return out


def _written(func: Any, args: Any, kwargs: Any) -> list[Any]:
    """The values of the arguments that ``func`` writes into (``Tensor(a!)`` in its schema)."""
    written = []
    for position, argument in enumerate(func._schema.arguments):
        alias = argument.alias_info
        if alias is None or not alias.is_write:
            continue
        if argument.name in kwargs:
            written.append(kwargs[argument.name])
        elif position < len(args) and not argument.kwarg_only:
            written.append(args[position])
    return written


def _address(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _no_step(*_: Any) -> None:
    return None


def _recomputed(
    plan: ScanPlan, hoisted: _hoist.Hoisted, captured: list[torch.Tensor], devices: list[int]
) -> tuple[Any, Any] | None:
    """``(carry, ys)`` of the hoisted segment ``plan``, computed without autograd, whose
    backward pass runs it again with autograd (:class:`_Recomputed`) from its carry, its
    sequences and the tensors its step captures; None where the hoisted step cannot run (vmap
    cannot batch it: from then on it is not hoisted)."""
    carry_leaves, xs_leaves = plan.carry.leaves, plan.xs_leaves
    inputs = [t for t in (*carry_leaves, *xs_leaves) if t is not None] + list(captured)
    # What the backward pass runs again holds the plan without its tensors: they are the inputs
    # saved for the backward pass, which saved-tensor hooks (offloading, an outer checkpoint)
    # may free and bring back.
    carry_present = [leaf is not None for leaf in carry_leaves]
    xs_present = [leaf is not None for leaf in xs_leaves]
    fn, user = plan.fn, plan.user
    bare = dataclasses.replace(
        plan, carry=plan.carry.of(None, []), xs_leaves=(), fn=_no_step, user=_no_step
    )

    def run(*tensors: torch.Tensor) -> tuple[Any, Any] | None:
        given = iter(tensors)
        carry = [next(given) if present else None for present in carry_present]
        xs = tuple(next(given) if present else None for present in xs_present)
        init = _pytree.tree_unflatten(carry, bare.carry.spec)
        segment = dataclasses.replace(
            bare, fn=fn, user=user, carry=bare.carry.of(init, carry), xs_leaves=xs
        )
        return _hoist.execute(segment, hoisted, list(given))

    again = _Again(run, devices)
    with torch.no_grad():
        out = again(*inputs)
    if out is None:
        return None
    leaves, spec = _pytree.tree_flatten(out)
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    # (a view of an input, such as a carry that is a step of xs, returned as a tensor of its own)
    tensors = [t.clone() if t._is_view() else t for t in tensors]
    results = iter(_Recomputed.apply(again, tensors, *inputs))
    leaves = [next(results) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
    return _pytree.tree_unflatten(leaves, spec)


class _Recomputed(torch.autograd.Function):
    """The outputs of a segment computed without autograd (``outputs``), as a function of
    ``inputs``; the backward pass runs the segment (``again``) once more from them, with
    autograd, and takes its gradients."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, again: _Again, outputs: list[torch.Tensor], *inputs: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        ctx.again = again
        ctx.save_for_backward(*inputs)
        ctx.mark_non_differentiable(
            *(t for t in outputs if not (t.is_floating_point() or t.is_complex()))
        )
        return tuple(outputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        saved = ctx.saved_tensors
        # The gradients are taken at inputs cut from their history (else a captured weight's
        # would add the paths through the carry's history too): detached, or with create_graph
        # (grad mode on here) aliases, whose gradients flow on to the inputs themselves.
        higher = torch.is_grad_enabled()
        inputs = [
            t if not t.requires_grad else t.view_as(t) if higher else t.detach().requires_grad_()
            for t in saved
        ]
        with torch.enable_grad():
            out = ctx.again(*inputs)
        return (None, None, *_gradients(out, grads, inputs, create_graph=higher))
