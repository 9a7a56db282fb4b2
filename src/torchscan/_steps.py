"""The loop ``scan`` and ``loop`` share: call the step function, check it, stop, stack.

Both public functions describe their step function the same way: it returns ``(carry, y)`` or
``(carry, y, torchscan.until(stop))``. This module holds that protocol, the eager loop that runs
it, and the checks, worded for the function that calls them.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from torchscan import _checks, _context, _inplace, _outputs, _pytree
from torchscan._errors import TorchscanTypeError, TorchscanValueError
from torchscan._layout import OutLayout
from torchscan._until import Until, until

__all__ = ["Protocol", "Sources", "Until", "until"]


@dataclasses.dataclass(frozen=True)
class Protocol:
    """How one public function words the step protocol in its messages."""

    outputs: _outputs.Outputs
    step_name: str  # "step", "iteration"
    item_name: str  # what the function receives besides the carry: "x", "i"

    @property
    def api(self) -> str:
        return self.outputs.api

    @property
    def fn_name(self) -> str:
        return self.outputs.fn_name

    def has_until(self, out: Any, expected: bool | None = None) -> bool:
        """Whether ``out`` ends with ``until``; refuse anything but the two forms, and a change
        of form after the first step (``expected``)."""
        if not (
            isinstance(out, tuple) and (len(out) == 2 or (len(out) == 3 and type(out[2]) is Until))
        ):
            if isinstance(out, (tuple, list)) and any(type(item) is Until for item in out):
                position = next(i for i, item in enumerate(out) if type(item) is Until)
                raise TorchscanTypeError(
                    f"{self.api}: until(...) must be the last item of what {self.fn_name} "
                    f"returns, (carry, y, torchscan.until(stop)), but it is item {position} of "
                    f"a {type(out).__name__} of length {len(out)}."
                )
            raise TorchscanTypeError(
                f"{self.api}: {self.fn_name} must return (carry, y) or "
                f"(carry, y, torchscan.until(stop)), but it returned {_describe_result(out)}."
            )
        has_until = len(out) == 3
        if expected is not None and has_until != expected:
            raise TorchscanTypeError(
                f"{self.api}: {self.fn_name} must return torchscan.until(stop) at every "
                f"{self.step_name} or at none, but it returned "
                f"{'it only in a later' if has_until else 'no until in a later'} "
                f"{self.step_name}."
            )
        return has_until

    def stops(self, stop: Any, index: int, bounded: bool = True) -> bool:
        """Whether the flag ``stop`` that the step of ``index`` returned ends the loop;
        ``bounded``: the loop has a most number of steps (a scan's length, a ``trip_count``)."""
        flag = self.check_stop(stop, index)
        try:
            return bool(flag)
        except RuntimeError as error:
            if not _compat_vmap_refusal(error):
                raise
            remedy = (
                "Return no until, and keep a done flag in the carry instead, so that every "
                "example runs every step and an example that is done keeps its carry"
                if bounded
                else "Give the loop a bound (trip_count=) and return no until, keeping a done "
                "flag in the carry instead"
            )
            raise TorchscanValueError(
                f"{self.api}: {self.fn_name} returned until(stop) under torch.func.vmap, where "
                "each example would stop at its own step, and a vmapped function runs every "
                f"example through the same steps. {remedy}: done = done | stop; "
                "h = torch.where(done, h, new_h)."
            ) from None

    def check_stop(self, stop: Any, index: int) -> torch.Tensor:
        if not (isinstance(stop, torch.Tensor) and stop.ndim == 0 and stop.dtype == torch.bool):
            raise TorchscanTypeError(
                f"{self.api}: until(stop) needs stop to be a 0-d bool tensor, but "
                f"{self.fn_name} returned {_checks.describe(stop)} in {self.step_name} {index}."
            )
        return stop

    def run(
        self,
        call: Callable[[Any, Any], Any],
        items: Iterable[Any],
        carry_type: _checks.CarryType,
        layout: OutLayout,
        refuse_without_until: str | None = None,
        sources: Sources | None = None,
        step: Callable | None = None,
        reslice: Callable[[Sequence[int]], Iterable[Any]] | None = None,
        bounded: bool = True,
    ) -> tuple[Any, list[Any]]:
        """``carry, y = call(carry, item)`` for every item until a stop; the ``y`` of each step.

        The first step runs on copies of ``init`` and of its item, so that a step function that
        changes its arguments in place is refused before it can change the caller's tensors;
        every step is then checked for changes in place (through the tensors' version
        counters, :mod:`torchscan._inplace`) and for a carry of another shape or dtype.
        ``sources`` are the tensors of which every later item is a view (the leaves of ``xs``),
        watched in place of the items; without them, the items themselves are.
        ``refuse_without_until`` is the error to raise when the first step returns no ``until``
        and nothing else would end the loop. ``step`` is the user's function that ``call``
        calls, which refusals name (``call`` itself by default). ``reslice(bumps)``, given the
        version bumps per step that the first step showed on each leaf of ``sources`` (shape-only
        changes of views of an item), gives the items after the first anew, for a step that
        reshapes views of its item in place: autograd refuses that on the views ``unbind``
        makes, which the Python loop, indexing, never makes. ``bounded``: ``items`` end (a
        scan's steps, a loop's ``trip_count``), which a refusal of ``until`` under
        ``torch.func.vmap`` says.
        """
        items = iter(items)
        first, carry = next(items), carry_type.init
        step = call if step is None else step
        # TorchDynamo, compiling the loop, keeps eager semantics itself and cannot read
        # versions; inference tensors have none.
        watching = not (_context.compiling() or torch.is_inference_mode_enabled())
        allowed: tuple[int, ...] = ()
        if _context.compiling():
            out = call(carry, first)
        else:
            originals = (carry, first)
            first, carry = _copies(first), _copies(carry)
            if watching:
                out, allowed = self._first_step(call, step, carry_type, carry, first, originals)
            else:
                out = call(carry, first)
        has_until = self.check_first(out, carry_type, layout, refuse_without_until)
        carry, y = out[0], out[1]
        ys = [y]
        if has_until and self.stops(out[2].stop, 0, bounded):
            return carry, ys
        append = ys.append
        n_carries = carry_type.n_tensors
        if reslice is not None and sources is not None and any(allowed[n_carries:]):
            items = iter(reslice(_item_allowed(allowed[n_carries:], sources)))
        # Later steps: the carry's versions and type at every step, in a loop specialised for
        # the common single-tensor carry; the versions of xs once at the end (every x is a view
        # of them), and never the counter i of a loop (a fresh tensor at every iteration).
        sources_before = sources.versions() if watching and sources is not None else ()
        carry_allowed = allowed[:n_carries]
        single = carry_type.single
        ran = [0]
        if single and watching and not has_until:
            carry = self._run_single(
                call,
                items,
                carry,
                carry_type,
                append,
                carry_allowed[0] if carry_allowed else 0,
                step,
                ran,
            )
        else:
            carry = self._run_any(
                call, items, carry, carry_type, append, has_until, watching, carry_allowed, step,
                ran,
            )  # fmt: skip
        if watching and sources is not None:
            per_step = _item_allowed(allowed[n_carries:], sources)
            expected = [v + d * ran[0] for v, d in zip(sources_before, per_step, strict=True)]
            if sources.versions() != expected:
                named = [(f"a slice of {name}", leaf) for name, leaf in sources.named()]
                changed = [
                    name
                    for (name, leaf), want in zip(
                        [(n, t) for n, t in named if t is not None], expected, strict=True
                    )
                    if _version(leaf) != want
                ]
                raise _inplace.refuse(
                    self.api, self.fn_name, step, changed, f"in a later {self.step_name}"
                )
        carry_type.check(carry, f" in a later {self.step_name}")
        return carry, ys

    def checked_first(
        self,
        call: Callable[[Any, Any], Any],
        carry_type: _checks.CarryType,
        item: Any,
        step: Callable,
    ) -> tuple[Any, tuple[int, ...]]:
        """The first step as the eager loop runs it: on copies of ``init`` and ``item``, refused
        where it changes one of them in place; what it returned, and the version bumps per step
        each argument is allowed (those of shape-only changes of views of it; ``()`` where
        tensors have no versions, under ``torch.inference_mode()``)."""
        carry = carry_type.init
        originals = (carry, item)
        item, carry = _copies(item), _copies(carry)
        if torch.is_inference_mode_enabled():
            return call(carry, item), ()
        return self._first_step(call, step, carry_type, carry, item, originals)

    def _first_step(
        self,
        call: Callable[[Any, Any], Any],
        step: Callable,
        carry_type: _checks.CarryType,
        carry: Any,
        item: Any,
        originals: tuple[Any, Any],
    ) -> tuple[Any, tuple[int, ...]]:
        """The first step, on copies ``carry`` and ``item`` of ``originals``; what it returned,
        and the version bumps each argument is allowed per step (those of shape-only changes of
        views of it). The first time a step function runs, its first step runs under
        :class:`~torchscan._inplace.Recorder`; later calls hold it to what that found."""
        tensors = [
            *(leaf for leaf in _pytree.tree_leaves(carry) if isinstance(leaf, torch.Tensor)),
            *(leaf for leaf in _pytree.tree_leaves(item) if isinstance(leaf, torch.Tensor)),
        ]
        key = _inplace.key_of(step)
        allowed = _inplace.allowed(key, len(tensors))
        when, copies = f"in its first {self.step_name}", f"that {self.step_name} ran on copies"
        if allowed is None:
            named = self._named_arguments(carry_type, carry, item)
            with _inplace.Recorder(named) as recorder:
                out = call(carry, item)
            refused = [change for change in recorder.changes if change.refused]
            if refused:
                raise _inplace.refuse(self.api, self.fn_name, step, refused, when, copies)
            allowed = recorder.deltas()
            _inplace.remember(key, allowed)
            return out, allowed
        before = _versions(tensors)
        out = call(carry, item)
        if [a - b for a, b in zip(_versions(tensors), before, strict=True)] != list(allowed):
            # Not what the step did the first time it ran: a write, or a shape-only change this
            # call makes and the recorded one did not. The originals tell which.
            named = self._named_arguments(carry_type, carry, item)
            originals_named = self._named_arguments(carry_type, *originals)
            changed = [
                name
                for (name, copy), (_, original) in zip(named, originals_named, strict=True)
                if not _same_tensor(copy, original)
            ]
            _inplace.forget(key)  # the next call records the step again
            if changed:
                raise _inplace.refuse(self.api, self.fn_name, step, changed, when, copies)
            allowed = tuple(_version(t) - b for t, b in zip(tensors, before, strict=True))
        return out, allowed

    def _named_arguments(
        self, carry_type: _checks.CarryType, carry: Any, item: Any
    ) -> list[tuple[str, torch.Tensor]]:
        return [
            *self._named_carry(carry_type, carry),
            *_pytree.named_tensors(item, self.item_name),
        ]

    def check_first(
        self,
        out: Any,
        carry_type: _checks.CarryType,
        layout: OutLayout,
        refuse_without_until: str | None = None,
    ) -> bool:
        """Check what the first step returned; whether it returned ``until``."""
        has_until = self.has_until(out)
        if refuse_without_until and not has_until:
            raise TorchscanValueError(refuse_without_until)
        carry_type.check(out[0], f" in its first {self.step_name}")
        self.outputs.check_first(out[1], layout)
        return has_until

    def run_after_first(
        self,
        call: Callable[[Any, Any], Any],
        items: Iterable[Any],
        carry_type: _checks.CarryType,
        out: Any,
    ) -> tuple[Any, list[Any]]:
        """The steps after a first step that returned ``out`` (checked by :meth:`check_first`),
        without watching versions: under ``torch.compile``, which runs a step that breaks its
        graph this way."""
        has_until = self.has_until(out)
        carry, ys = out[0], [out[1]]
        if has_until and self.stops(out[2].stop, 0):
            return carry, ys
        carry = self._run_any(call, iter(items), carry, carry_type, ys.append, has_until, False)
        carry_type.check(carry, f" in a later {self.step_name}")
        return carry, ys

    def _run_single(
        self,
        call: Callable[[Any, Any], Any],
        items: Iterable[Any],
        carry: torch.Tensor,
        carry_type: _checks.CarryType,
        append: Callable[[Any], None],
        allowed: int,
        step: Callable,
        ran: list[int],
    ) -> Any:
        """The steps after the first, for a carry that is one tensor and a step function that
        returns no ``until``: the loop of :meth:`_run_any` with nothing it does not need.
        ``allowed`` is the carry's version bumps per step; ``ran[0]`` counts the steps."""
        shape, dtype = carry_type.shapes[0]  # type: ignore[misc]
        tensor = torch.Tensor
        index = 0
        for index, item in enumerate(items, 1):
            try:
                before = carry._version
            except RuntimeError:  # an inference tensor, which has no version
                before = -1
            out = call(carry, item)
            try:
                new, y = out
            except (TypeError, ValueError):
                self.has_until(out, expected=False)
                raise
            if before != -1 and carry._version - before != allowed:
                where = f"in {self.step_name} {index}"
                raise _inplace.refuse(self.api, self.fn_name, step, ["carry"], where)
            if not (isinstance(new, tensor) and new.shape == shape and new.dtype is dtype):
                carry_type.check(new, f" in {self.step_name} {index}")
            carry = new
            append(y)
        ran[0] = index
        return carry

    def _run_any(
        self,
        call: Callable[[Any, Any], Any],
        items: Iterable[Any],
        carry: Any,
        carry_type: _checks.CarryType,
        append: Callable[[Any], None],
        has_until: bool,
        watching: bool,
        allowed: Sequence[int] = (),
        step: Callable | None = None,
        ran: list[int] | None = None,
    ) -> Any:
        """The steps after the first: call, read, check, until a stop. ``allowed`` are the
        version bumps per step of each tensor of the carry; ``ran[0]`` counts the steps."""
        single = carry_type.single
        shape, dtype = carry_type.shapes[0] if single else (None, None)  # type: ignore[misc]
        # the tensors of a carry of several leaves, read at every step
        leaves: Sequence[torch.Tensor] = ()
        if not single:
            tensors = carry_type.tensor_leaves(carry)
            assert tensors is not None  # the first step's carry was checked
            leaves = tensors
        before: Any = None
        stop: Any = None
        index = 0
        if watching:
            allowed = list(allowed) or [0] * (1 if single else len(leaves))
        for index, item in enumerate(items, 1):
            if watching:
                before = _version(carry) if single else _versions(leaves)
            out = call(carry, item)
            if has_until:
                try:
                    new, y, flag = out
                    stop = flag.stop
                except (TypeError, ValueError, AttributeError):
                    self.has_until(out, expected=True)
                    raise
            else:
                try:
                    new, y = out
                except (TypeError, ValueError):
                    self.has_until(out, expected=False)
                    raise
            if watching:
                after = [_version(carry)] if single else _versions(leaves)
                versions = [before] if single else before
                deltas = [a - b for a, b in zip(after, versions, strict=True)]
                if deltas != allowed and -1 not in versions:
                    named = self._named_carry(carry_type, carry)
                    changed = [
                        name
                        for (name, _), d, a in zip(named, deltas, allowed, strict=True)
                        if d != a
                    ]
                    where = f"in {self.step_name} {index}"
                    raise _inplace.refuse(self.api, self.fn_name, step or call, changed, where)
            if single:
                if not (
                    isinstance(new, torch.Tensor) and new.shape == shape and new.dtype is dtype
                ):
                    carry_type.check(new, f" in {self.step_name} {index}")
            else:
                tensors = carry_type.tensor_leaves(new)
                if tensors is None:  # another type: refused
                    carry_type.check(new, f" in {self.step_name} {index}")
                else:
                    leaves = tensors
            carry = new
            append(y)
            if has_until and self.stops(stop, index):
                break
        if ran is not None:
            ran[0] = index
        return carry

    def _named_carry(self, carry_type: _checks.CarryType, carry: Any) -> list[tuple[str, Any]]:
        return [
            (name, leaf)
            for name, leaf in zip(
                _pytree.leaf_names(carry_type.init, "carry"),
                _pytree.tree_leaves(carry),
                strict=True,
            )
            if leaf is not None
        ]

    def traced_call(
        self, call: Callable[..., Any], step: Callable, arguments: Sequence[tuple[str, Any]]
    ) -> Any:
        """One call of the step function being traced, ``call(*values)`` for the named
        ``arguments`` (``[("carry", carry), ("x", x)]``), under a
        :class:`~torchscan._inplace.Recorder`: a call that changes an argument in place is
        refused as eagerly, naming ``step``, the line and the leaf."""
        named = [
            (name, leaf)
            for root, tree in arguments
            for name, leaf in _pytree.named_tensors(tree, root)
            if isinstance(leaf, torch.Tensor)
        ]
        with _inplace.Recorder(named) as recorder:
            out = call(*(tree for _, tree in arguments))
        refused = [change for change in recorder.changes if change.refused]
        if refused:
            raise _inplace.refuse(self.api, self.fn_name, step, refused, "")
        return out

    def check_fake_result(self, out: Any, carry_type: _checks.CarryType, layout: OutLayout) -> Any:
        """Check what the step function returned on fake tensors; return its ``y``."""
        if self.has_until(out):
            self.check_stop(out[2].stop, 0)
        carry_type.check(out[0], "")
        self.outputs.check_first(out[1], layout)
        return out[1]


@dataclasses.dataclass(frozen=True)
class Sources:
    """The leaves of ``xs``: every ``x`` after the first is a view of them and shares their
    version counters, so watching them watches every ``x``."""

    leaves: Sequence[torch.Tensor | None]
    spec: _pytree.TreeSpec

    def versions(self) -> list[int]:
        return [_version(leaf) for leaf in self.leaves if leaf is not None]

    def named(self) -> list[tuple[str, torch.Tensor | None]]:
        tree = _pytree.tree_unflatten(list(self.leaves), self.spec)
        return list(zip(_pytree.leaf_names(tree, "xs"), self.leaves, strict=True))


def _compat_vmap_refusal(error: RuntimeError) -> bool:
    """Whether ``error`` is torch.func.vmap's refusal of Python control flow on a tensor."""
    from torchscan._compat import VMAP_CONTROL_FLOW_ERROR

    return str(error).startswith(VMAP_CONTROL_FLOW_ERROR)


def _item_allowed(allowed: Sequence[int], sources: Sources) -> list[int]:
    """The version bumps per step of each leaf of ``xs``: those allowed its slices."""
    count = len(sources.versions())
    return list(allowed) if len(allowed) == count else [0] * count


def _same_tensor(copy: torch.Tensor, original: torch.Tensor) -> bool:
    """Whether ``copy`` still has the shape and values of ``original`` (NaNs where it has
    NaNs)."""
    if copy.shape != original.shape or copy.dtype != original.dtype:
        return False
    if torch.equal(copy, original):
        return True
    if not (copy.is_floating_point() or copy.is_complex()):
        return False
    nan = original.isnan()
    return torch.equal(copy.isnan(), nan) and torch.equal(copy[~nan], original[~nan])


def _copies(tree: Any) -> Any:
    """``tree`` with every tensor copied (differentiably), keeping its strides where it can."""
    if isinstance(tree, torch.Tensor):
        return _copy(tree)
    return _pytree.tree_map(lambda t: _copy(t) if isinstance(t, torch.Tensor) else t, tree)


def _copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` that computes as ``t`` does. ``clone`` keeps the strides of a dense
    tensor; an ``x`` of a scan over a middle axis skips elements, and a reduction over it adds
    in another order than over a dense copy, so on the CPU the copy gets the same strides (the
    memory between its elements is reserved, never touched). A tensor whose elements overlap
    (an expanded ``init``) is copied densely."""
    if t.is_contiguous():
        return t.clone()
    extent = _extent(t)
    if extent is None or extent == t.numel() or t.device.type != "cpu":
        return t.clone()
    spread = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    try:
        return spread.copy_(t)
    except RuntimeError:
        # under torch.func.vmap a copy of a batched tensor must be batched: a batched buffer
        # (new_zeros is batched like t) viewed with t's strides, so that a reduction over the
        # copy adds in the order it adds over t, as the Python loop's step does
        return t.new_zeros(extent).as_strided(t.shape, t.stride(), 0).copy_(t)


def _extent(t: torch.Tensor) -> int | None:
    """How many elements of memory ``t`` spans, or ``None`` if two of its elements share one."""
    extent = 1
    for stride, size in sorted(
        (stride, size) for size, stride in zip(t.shape, t.stride(), strict=True)
    ):
        if size == 1:
            continue
        if size == 0:
            return 0
        if stride < extent:
            return None
        extent += stride * (size - 1)
    return extent


_version = _inplace.version
_read_version = operator.attrgetter("_version")


def _versions(tensors: Sequence[torch.Tensor]) -> list[int]:
    """The version counters of ``tensors`` (read at every step), each -1 for an inference tensor,
    which has none."""
    try:
        return list(map(_read_version, tensors))
    except RuntimeError:  # an inference tensor among them
        return [_version(t) for t in tensors]


def _describe_result(out: Any) -> str:
    if isinstance(out, tuple) and len(out) == 3:
        return f"a tuple whose last item is {_checks.describe(out[2])}"
    if isinstance(out, tuple):
        return f"a tuple of length {len(out)}"
    return _checks.describe(out)
