"""The checkpointed run of a scan (``checkpoint=``, :class:`torchscan.Checkpoint`).

The steps run in segments, each a scan of its own (eager or hoisted, as any scan runs) under
``torch.utils.checkpoint`` (non-reentrant): its forward pass keeps the carry the segment starts
from, the random generators' states and nothing else; the backward pass runs the segment again
and takes its gradients. The binomial schedule nests the segments: a segment's first part is a
checkpointed segment within it, so that running it again keeps carries of its own, as revolve
does."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import traceback
from collections.abc import Callable
from typing import Any

import torch

from torchscan import _checkpoint, _compat, _pytree, _source
from torchscan._errors import TorchscanValueError
from torchscan._plan import ScanPlan
from torchscan._until import Until

Runner = Callable[[ScanPlan], tuple[Any, Any]]

MOST_NESTED = 48
"""The most segments the binomial schedule nests in one another (its repetition number): each
level is a few frames of Python, in the forward pass and again where the backward pass runs it."""


def scan(plan: ScanPlan, run: Runner) -> tuple[Any, Any]:
    """``(carry, ys)`` of ``plan`` with its ``checkpoint``; ``run`` runs a segment's plan (one
    without ``checkpoint``)."""
    policy = plan.checkpoint
    assert policy is not None
    segments = _Segments(plan, run)
    n = plan.length
    if policy.snapshots is None:
        k = policy.segment(n)
        carry, pieces = plan.carry.init, []
        for start in range(0, n, k):
            if segments.stopped_before(start):
                break
            carry, ys = segments.kept(segments.run, carry, start, min(start + k, n))
            pieces.append(ys)
    else:
        _refuse_deep(plan, policy.snapshots)
        carry, pieces = _binomial(segments, plan.carry.init, 0, n, policy.snapshots)
    return carry, segments.join(pieces)


def _binomial(
    segments: _Segments, carry: Any, start: int, stop: int, snapshots: int
) -> tuple[Any, list[Any]]:
    """Steps ``start`` to ``stop`` from ``carry``, keeping at most ``snapshots`` carries besides
    ``carry``: the first part is a segment kept by its carry (which runs itself with the same
    number of carries), the rest runs with one carry fewer, for as long as it is longer than one
    step; each step runs alone. The pieces of ``ys``, in the order the steps ran."""
    pieces: list[Any] = []
    while stop - start > 1 and not segments.stopped_before(start):
        middle = start + _checkpoint.binomial_split(stop - start, snapshots)
        first = functools.partial(
            _binomial, segments, start=start, stop=middle, snapshots=snapshots
        )
        carry, ys = segments.kept(first, carry)
        pieces += ys
        start, snapshots = middle, max(snapshots - 1, 0)
    if not segments.stopped_before(start):
        carry, ys = segments.run(carry, start, stop)
        pieces.append(ys)
    return carry, pieces


def _refuse_deep(plan: ScanPlan, snapshots: int) -> None:
    nested = _checkpoint.repetitions(plan.length, snapshots)
    if nested > MOST_NESTED:
        least = next(
            c
            for c in range(snapshots + 1, plan.length)
            if _checkpoint.repetitions(plan.length, c) <= MOST_NESTED
        )
        raise TorchscanValueError(
            f"{plan.protocol.api}: checkpoint=Checkpoint(snapshots={snapshots}) over "
            f"{plan.length} steps would run every step about {nested} times, in segments nested "
            f"{nested} deep (at most {MOST_NESTED}); give it snapshots={least} or more, or "
            "every= instead."
        )


@dataclasses.dataclass
class _Segments:
    """Runs of steps ``start`` to ``stop`` (in the order the steps run) of ``plan``, each as a
    scan of its own, and the pieces of ``ys`` they give put together."""

    plan: ScanPlan
    runner: Runner
    stop: int | None = None
    """The step that returned ``until`` with a true stop, if one did: no step runs after it (in
    the forward pass, and where the backward pass runs a segment again)."""

    def __post_init__(self) -> None:
        policy = self.plan.checkpoint
        assert policy is not None
        self.context_fn: Callable[[], Any] | None = None
        if policy.save is not None:
            from torch.utils import checkpoint

            def keep(_ctx: Any, op: Any, *_: Any, **__: Any) -> Any:
                policies = checkpoint.CheckpointPolicy
                return policies.MUST_SAVE if policy.keeps(op) else policies.PREFER_RECOMPUTE

            self.context_fn = functools.partial(
                checkpoint.create_selective_checkpoint_contexts, keep
            )

    def kept(self, run: Callable[..., Any], carry: Any, *args: Any, **kwargs: Any) -> Any:
        """``run(carry, ...)``, whose backward pass runs it again from ``carry``."""
        from torch.utils import checkpoint

        options: dict[str, Any] = {"use_reentrant": False}
        if self.context_fn is not None:
            options["context_fn"] = self.context_fn
        return checkpoint.checkpoint(run, carry, *args, **kwargs, **options)

    def stopped_before(self, step: int) -> bool:
        """Whether a step before ``step`` stopped the scan."""
        return self.stop is not None and self.stop < step

    def run(self, carry: Any, start: int, stop: int) -> tuple[Any, Any]:
        """Steps ``start`` to ``stop`` from ``carry``: ``(carry, ys)``."""
        plan, n = self.plan, self.plan.length
        leaves = tuple(
            None
            if leaf is None or axis is None
            else leaf.narrow(axis, n - stop if backwards else start, stop - start)
            for leaf, axis, backwards in zip(
                plan.xs_leaves, plan.in_axes, plan.in_reverse, strict=True
            )
        )
        segment = dataclasses.replace(
            plan,
            fn=self._watching(plan.fn, start),
            carry=plan.carry.of(carry, _pytree.tree_flatten(carry)[0]),
            xs_leaves=leaves,
            length=stop - start,
            padded_length=None,
            checkpoint=None,
        )
        return self.runner(segment)

    def _watching(self, fn: Callable[[Any, Any], Any], start: int) -> Callable[[Any, Any], Any]:
        """``fn`` as the steps from ``start`` on, noting in :attr:`stop` the one that returns a
        true stop (``until``)."""
        steps = itertools.count(start)

        @functools.wraps(fn)
        def step(carry: Any, x: Any) -> Any:
            try:
                out, t = fn(carry, x), next(steps)
            except RuntimeError as error:
                if str(error) != _compat.CACHED_RESULT_CHANGED_ERROR:
                    raise
                raise self._changed_after_kept(error) from error
            if isinstance(out, tuple) and len(out) == 3 and isinstance(out[2], Until):
                stop = out[2].stop
                if isinstance(stop, torch.Tensor) and stop.numel() == 1 and bool(stop):
                    self.stop = t if self.stop is None else min(self.stop, t)
            return out

        return step

    def _changed_after_kept(self, error: RuntimeError) -> TorchscanValueError:
        """The refusal of a step that changes in place a result that ``save=`` keeps, naming the
        line of the step where torch found it (at the step's run in the backward pass)."""
        plan = self.plan
        source = _source.StepSource.of(plan.user, plan.protocol.api, plan.protocol.fn_name)
        frames = traceback.extract_tb(error.__traceback__)
        where = next(
            (
                f"{frame.filename}:{frame.lineno}"
                for frame in reversed(frames)
                if frame.lineno is not None
                and source.owns(frame.filename, frame.name, frame.lineno)
            ),
            source.defined,
        )
        return TorchscanValueError(
            f"{source.who}{', ' + where if where else ''}: checkpoint keeps the result of an "
            "operator that save= names, and the step changes that result in place after "
            "computing it, so torch.utils.checkpoint cannot give it back as it was to the "
            "backward pass. Leave that operator out of save=, or change a copy (torch.matmul "
            "of a 1-D tensor squeezes its product in place: write "
            "(h.unsqueeze(0) @ w).squeeze(0))."
        )

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
