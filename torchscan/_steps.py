"""The loop ``scan`` and ``loop`` share: call the step function, check it, stop, stack.

Both public functions describe their step function the same way: it returns ``(carry, y)`` or
``(carry, y, torchscan.until(stop))``. This module holds that protocol, the eager loop that runs
it, and the checks, worded for the function that calls them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from torchscan import _checks, _outputs, _pytree
from torchscan._errors import TorchscanTypeError, TorchscanValueError
from torchscan._until import Until, until

__all__ = ["Protocol", "Sources", "Until", "refuse_changes_in_place", "until"]


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
        axis: int,
        refuse_without_until: str | None = None,
        sources: Sequence[Any] | None = None,
    ) -> tuple[Any, list[Any]]:
        """``carry, y = call(carry, item)`` for every item until a stop; the ``y`` of each step.

        The first step runs on copies of ``init`` and of its item, so that a step function that
        changes its arguments in place is refused before it can change the caller's tensors;
        every step is then checked for changes in place (through the tensors' version
        counters) and for a carry of another shape or dtype. ``sources`` are the tensors of
        which every later item is a view (the leaves of ``xs``), watched in place of the items;
        without them, the items themselves are. ``refuse_without_until`` is the error to raise
        when the first step returns no ``until`` and nothing else would end the loop.
        """
        items = iter(items)
        first, carry = next(items), carry_type.init
        # TorchDynamo, compiling the loop, keeps eager semantics itself and cannot read
        # versions; inference tensors have none.
        watching = not (torch.compiler.is_compiling() or torch.is_inference_mode_enabled())
        if not torch.compiler.is_compiling():
            first, carry = _copies(first), _copies(carry)
        before = _versions(carry, first) if watching else ()
        out = call(carry, first)
        if watching and _versions(carry, first) != before:
            self._refuse_first_changes(carry_type, carry, first, before)
        has_until = self.check_first(out, carry_type, axis, refuse_without_until)
        carry, y = out[0], out[1]
        ys = [y]
        if has_until and self.check_stop(out[2].stop, 0):
            return carry, ys
        append = ys.append
        # Later steps: the carry's versions and type at every step, in a loop specialised for
        # the common single-tensor carry; the versions of xs once at the end (every x is a view
        # of them), and never the counter i of a loop (a fresh tensor at every iteration).
        sources_before = sources.versions() if watching and sources is not None else ()
        single = carry_type.single
        if single and watching and not has_until:
            carry = self._run_single(call, items, carry, carry_type, append)
        else:
            carry = self._run_any(call, items, carry, carry_type, append, has_until, watching)
        if watching and sources is not None and sources.versions() != sources_before:
            named = [(f"a slice of {name}", leaf) for name, leaf in sources.named()]
            where = f"a later {self.step_name}"
            refuse_changes_in_place(
                self.api, self.fn_name, named, sources_before, where, "", skip_none=True
            )
        carry_type.check(carry, f" in a later {self.step_name}")
        return carry, ys

    def check_first(
        self,
        out: Any,
        carry_type: _checks.CarryType,
        axis: int,
        refuse_without_until: str | None = None,
    ) -> bool:
        """Check what the first step returned; whether it returned ``until``."""
        has_until = self.has_until(out)
        if refuse_without_until and not has_until:
            raise TorchscanValueError(refuse_without_until)
        carry_type.check(out[0], f" in its first {self.step_name}")
        self.outputs.check_first(out[1], axis)
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
        if has_until and self.check_stop(out[2].stop, 0):
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
    ) -> Any:
        """The steps after the first, for a carry that is one tensor and a step function that
        returns no ``until``: the loop of :meth:`_run_any` with nothing it does not need."""
        shape, dtype = carry_type.shapes[0]  # type: ignore[misc]
        tensor = torch.Tensor
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
            if before != -1 and carry._version != before:
                where = f"{self.step_name} {index}"
                refuse_changes_in_place(
                    self.api, self.fn_name, [("carry", carry)], (before,), where, ""
                )
            if not (isinstance(new, tensor) and new.shape == shape and new.dtype is dtype):
                carry_type.check(new, f" in {self.step_name} {index}")
            carry = new
            append(y)
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
    ) -> Any:
        """The steps after the first: call, read, check, until a stop."""
        single = carry_type.single
        shape, dtype = carry_type.shapes[0] if single else (None, None)  # type: ignore[misc]
        leaves = None if single else carry_type.tensor_leaves(carry)
        before: Any = None
        stop: Any = None
        for index, item in enumerate(items, 1):
            if watching:
                before = _version(carry) if single else [_version(leaf) for leaf in leaves]
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
            if watching and before != (
                _version(carry) if single else [_version(leaf) for leaf in leaves]
            ):
                named = self._named_carry(carry_type, carry)
                versions = (before,) if single else before
                where = f"{self.step_name} {index}"
                refuse_changes_in_place(self.api, self.fn_name, named, versions, where, "")
            if single:
                if not (
                    isinstance(new, torch.Tensor) and new.shape == shape and new.dtype is dtype
                ):
                    carry_type.check(new, f" in {self.step_name} {index}")
            else:
                leaves = carry_type.tensor_leaves(new)
                if leaves is None:
                    carry_type.check(new, f" in {self.step_name} {index}")
            carry = new
            append(y)
            if has_until and self.check_stop(stop, index):
                break
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

    def _refuse_first_changes(
        self, carry_type: _checks.CarryType, carry: Any, item: Any, before: tuple[int, ...]
    ) -> None:
        """Raise if the first step changed its carry or its item (copies, whose versions were
        ``before``) in place."""
        named = [
            *self._named_carry(carry_type, carry),
            *_pytree.named_tensors(item, self.item_name),
        ]
        where, copies = f"its first {self.step_name}", f"that {self.step_name} ran on copies"
        refuse_changes_in_place(self.api, self.fn_name, named, before, where, copies)

    def refuse_traced_changes(self, arguments: Sequence[tuple[str, Any]]) -> Callable[[], None]:
        """Record the versions of the arguments of one call of the step function being traced
        (``[("carry", carry), ("x", x)]``); the function returned refuses the call if it changed
        one of them in place."""
        named = [
            (name, leaf)
            for root, tree in arguments
            for name, leaf in _pytree.named_tensors(tree, root)
            if isinstance(leaf, torch.Tensor)
        ]
        before = tuple(_version(leaf) for _, leaf in named)
        return lambda: refuse_changes_in_place(self.api, self.fn_name, named, before, "", "")

    def check_fake_result(self, out: Any, carry_type: _checks.CarryType, axis: int) -> Any:
        """Check what the step function returned on fake tensors; return its ``y``."""
        if self.has_until(out):
            self.check_stop(out[2].stop, 0)
        carry_type.check(out[0], "")
        self.outputs.check_first(out[1], axis)
        return out[1]


def refuse_changes_in_place(
    api: str,
    fn_name: str,
    named: Sequence[tuple[str, torch.Tensor]],
    before: Sequence[int],
    where: str,
    copies: str,
    *,
    skip_none: bool = False,
) -> None:
    """Raise if one of the ``named`` tensors that ``fn_name`` received has another version than
    ``before``: the function changed it in place. ``where`` names the step (``step 3``), and
    ``copies`` says when that step ran on copies of the caller's tensors. With ``skip_none``,
    ``None`` among ``named`` has no entry in ``before``."""
    if skip_none:
        named = [(name, leaf) for name, leaf in named if leaf is not None]
    changed = [
        name
        for (name, leaf), version in zip(named, before, strict=True)
        if _version(leaf) != version
    ]
    if not changed:
        return
    untouched = f" ({copies}: the tensors passed to {api} are left as they were)" if copies else ""
    raise TorchscanValueError(
        f"{api}: {fn_name} must not change its arguments in place, but"
        f"{f' in {where}' if where else ''} it changed {', '.join(changed)}{untouched}. An "
        "exported loop could not do the same. Compute new tensors instead: h = h * 2 rather than "
        "h.mul_(2) or h *= 2, and o = o.clone() before writing into o[i]."
    )


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
    return spread.copy_(t)


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


def _versions(carry: Any, item: Any) -> tuple[int, ...]:
    leaves = [*_pytree.tree_leaves(carry), *_pytree.tree_leaves(item)]
    return tuple(_version(leaf) for leaf in leaves if isinstance(leaf, torch.Tensor))


def _version(leaf: torch.Tensor) -> int:
    """The version counter of ``leaf``; -1 for an inference tensor, which has none."""
    try:
        return leaf._version
    except RuntimeError:
        return -1


def _describe_result(out: Any) -> str:
    if isinstance(out, tuple) and len(out) == 3:
        return f"a tuple whose last item is {_checks.describe(out[2])}"
    if isinstance(out, tuple):
        return f"a tuple of length {len(out)}"
    return _checks.describe(out)
