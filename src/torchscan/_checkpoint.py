"""``torchscan.Checkpoint``: what a scan keeps for its backward pass, and what it computes again.

The schedules are those of Theano's ``scan_checkpoints`` (a carry kept every ``k`` steps) and of
Griewank's binomial checkpointing (``revolve``: at most ``c`` carries kept, placed so that the
steps run again are as few as they can be); what a step keeps besides is a policy on torch
operators, as ``torch.utils.checkpoint``'s selective checkpointing reads it."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection
from typing import Any, Literal

from torchscan import _checks
from torchscan._errors import TorchscanTypeError, TorchscanValueError

_NAME = "torchscan.Checkpoint"


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """How ``scan`` saves memory for the backward pass: it keeps some carries, and runs the steps
    between them again when the backward pass needs what they computed.

    Without checkpointing, the backward pass of ``n`` steps holds what every step saved for it
    (for a GRU cell, its gates and the products it took: several times the carry, at every
    step). ``Checkpoint(every=k)`` is this Python, where ``xs[a:b]`` slices every sequence along
    its axis::

        def scan(fn, init, xs, checkpoint=Checkpoint(every=k)):
            carry, ys = init, []
            for start in range(0, n, k):
                # the backward pass runs the segment again, from the carry it started from
                carry, y = torch.utils.checkpoint.checkpoint(
                    scan, fn, carry, xs[start:start + k], use_reentrant=False
                )
                ys.append(y)
            return carry, torch.cat(ys)

    The forward pass keeps the carry at the start of every segment and nothing of its steps; the
    backward pass holds what one segment saved at a time. Memory is ``n / k`` carries and one
    segment's activations, for one more forward pass; ``every="sqrt"`` takes ``k`` about
    ``sqrt(n)``, which keeps both terms near ``sqrt(n)``.

    ``Checkpoint(snapshots=c)`` keeps at most ``c`` carries besides ``init`` at any time, and the
    last step (its input and what it saves, which the backward pass needs first), placed by
    Griewank's binomial schedule (``revolve``): the fewest steps run again that ``c`` carries
    allow, about ``r`` evaluations of each step where ``n`` is about ``c**r / r!`` (``r`` the
    least with ``n <= comb(c + 1 + r, r)``). It is the schedule for a tight memory budget: with
    ``c = 10``, 16,000 steps cost under 7 evaluations each. Over a ``loop`` that only ``until``
    ends, whose length is known at its end, the ``c`` carries are placed as the iterations run
    (the online schedule of Stumm and Walther, then Wang and Moin, as equinox's
    ``checkpointed_while_loop`` places them) and each run between two of them is reversed by the
    binomial schedule.

    As in the Python version, the steps run again draw the random numbers they drew the first
    time, and the gradients are those of the scan without checkpointing (the same operations on
    the same values). Unlike it, checkpointing applies where autograd records (not under
    ``torch.no_grad``, nor while ``torch.onnx.export`` traces the model, whose graph it leaves
    unchanged), and ``ys`` are stacked once.

    Attributes:
        every: the number of steps in a segment, an int of at least 1, or ``"sqrt"`` (the ceiling
            of the square root of the number of steps); ``None`` with ``snapshots``.
        snapshots: the most carries kept besides ``init`` (Griewank's binomial schedule), an int
            of at least 0 (0 runs the steps before each one again, ``n * (n + 1) / 2``
            evaluations); ``None`` with ``every``.
        save: what the first run of a segment keeps besides the carry, so that running it again
            need not compute it: ``None`` (nothing), a collection of torch operators
            (``torch.ops.aten.mm.default``, or ``torch.ops.aten.mm`` for every overload), or a
            function of an operator that says whether to keep its results, as
            ``torch.utils.checkpoint.create_selective_checkpoint_contexts`` reads them. With
            ``every`` only.
    """

    every: int | Literal["sqrt"] | None = None
    snapshots: int | None = None
    save: Collection[Any] | Callable[[Any], bool] | None = None

    def __post_init__(self) -> None:
        if (self.every is None) == (self.snapshots is None):
            raise TorchscanValueError(
                f"{_NAME}: give one of every= (a carry kept every k steps) and snapshots= (the "
                "most carries kept, placed by the binomial schedule), but "
                f"{'both are' if self.every is not None else 'neither is'} given."
            )
        if self.every is not None and self.every != "sqrt":
            _count(f"{_NAME}: every", self.every, 1, 'or "sqrt"')
        if self.snapshots is not None:
            _count(f"{_NAME}: snapshots", self.snapshots, 0)
        if self.save is not None:
            if self.snapshots is not None:
                raise TorchscanValueError(
                    f"{_NAME}: save= applies to the segments of every=, but snapshots= is given: "
                    "the binomial schedule keeps carries alone."
                )
            if isinstance(self.save, (str, bytes)) or not (
                callable(self.save) or isinstance(self.save, Collection)
            ):
                raise TorchscanTypeError(
                    f"{_NAME}: save must be None, a collection of torch operators or a function "
                    f"of an operator, but it is {_checks.describe(self.save)}."
                )

    def segment(self, length: int) -> int:
        """The number of steps of a segment, of ``every``, for a scan of ``length`` steps."""
        if self.every == "sqrt":
            return math.isqrt(length - 1) + 1 if length > 0 else 1  # the ceiling of the root
        assert isinstance(self.every, int)
        return self.every

    def keeps(self, op: Any) -> bool:
        """Whether the first run of a segment keeps the results of ``op`` (``save``)."""
        save = self.save
        if save is None:
            return False
        if callable(save) and not isinstance(save, Collection):
            return bool(save(op))
        return op in save or getattr(op, "overloadpacket", None) in save


def _count(name: str, value: Any, least: int, alternative: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TorchscanTypeError(
            f"{name} must be an int{' ' + alternative if alternative else ''}, but it is "
            f"{_checks.describe(value)}."
        )
    if value < least:
        raise TorchscanValueError(f"{name} must be at least {least}, but it is {value}.")


def resolve(api: str, value: Any) -> Checkpoint | None:
    """The ``checkpoint=`` argument of ``api`` as a :class:`Checkpoint`: ``None``, an int ``k``
    (``Checkpoint(every=k)``), ``"sqrt"`` or a :class:`Checkpoint`."""
    if value is None or isinstance(value, Checkpoint):
        return value
    if value == "sqrt" or (isinstance(value, int) and not isinstance(value, bool)):
        if not isinstance(value, str):
            _count(f"{api}: checkpoint", value, 1)
        return Checkpoint(every=value)
    raise TorchscanTypeError(
        f"{api}: checkpoint must be None, an int (a carry kept every that many steps), "
        f'"sqrt" or a torchscan.Checkpoint, but it is {_checks.describe(value)}.'
    )


def binomial_split(length: int, snapshots: int) -> int:
    """The number of steps to run before keeping the next carry, of a run of ``length > 1`` steps
    that may keep ``snapshots`` carries besides its first: one of Griewank's optimal choices.

    With ``s = snapshots + 1`` carries and ``beta(s, r) = comb(s + r, s)``, ``r`` is the least
    number of repetitions with ``length <= beta(s, r)``; the first part must be reversible with
    ``s`` carries in ``r - 1`` repetitions (at most ``beta(s, r - 1)`` steps) and the rest with
    ``s - 1`` carries in ``r`` (at most ``beta(s - 1, r)``). This takes the longest first part
    that leaves the rest at least ``beta(s - 1, r - 1)`` steps, the largest of the interval of
    optimal choices."""
    s, r = snapshots + 1, repetitions(length, snapshots)
    return min(_beta(s, r - 1), length - _beta(s - 1, r - 1))


def binomial_points(length: int, snapshots: int) -> list[int]:
    """The steps before which the binomial schedule's forward pass keeps the carry, of a run of
    ``length`` steps that may keep ``snapshots`` carries besides its first: each the split
    (:func:`binomial_split`) of the rest, with one carry fewer than the one before; the last is
    ``length - 1`` (the step that runs with autograd at once), where ``length > 1``."""
    points, start = [], 0
    while length - start > 1:
        start += binomial_split(length - start, snapshots)
        points.append(start)
        snapshots = max(snapshots - 1, 0)
    return points


def repetitions(length: int, snapshots: int) -> int:
    """Griewank's repetition number of ``length`` steps with ``snapshots`` carries besides the
    first: the least ``r`` with ``length <= comb(snapshots + 1 + r, r)``, about how many times the
    binomial schedule runs each step (and how deep it nests its segments)."""
    r = 0
    while _beta(snapshots + 1, r) < length:
        r += 1
    return r


def _beta(s: int, r: int) -> int:
    return 0 if r < 0 else math.comb(s + r, s)


class OnlinePlacement:
    """Where the forward pass of a loop whose number of iterations is known only at its end keeps
    its carries: ``slots`` places, the first holding the carry before step 0.

    For its first ``(slots + 1) * (slots + 2) / 2 - 1`` steps, Stumm and Walther's Algorithm I
    ("New algorithms for optimal online checkpointing", SIAM J. Sci. Comput. 32(2), 2010), whose
    reversal then costs what the binomial schedule of a known length does; after them, Wang and
    Moin's dynamic checkpointing ("Minimal repetition dynamic checkpointing algorithm for
    unsteady adjoint calculation", SIAM J. Sci. Comput. 31(4), 2009), which keeps a carry at
    every step in place of one its levels make dispensable. The placement depends on the step
    numbers alone, as equinox's ``checkpointed_while_loop`` computes it.

    Call :meth:`slot` with steps 0, 1, 2, ... in order: the place to keep the carry from before
    that step in (over what was there), or ``None``.
    """

    _NEVER = 1 << 62  # the step of a place that holds nothing yet (after every real step)

    def __init__(self, slots: int) -> None:
        assert slots >= 1, slots
        self.slots = slots
        self.switch = (slots + 1) * (slots + 2) // 2 - 1
        self.next_step = 0
        self.i, self.o, self.p, self.s = 0, slots, slots, True  # Algorithm I's state
        self.levels = [self._NEVER] + [0] * (slots - 1)  # the first place is never dispensable
        self.dispensable = [False] * slots
        self.steps = [self._NEVER] * slots  # the step whose carry each place holds

    def slot(self, step: int) -> int | None:
        """The place for the carry from before ``step`` (the next step in order), or None."""
        assert step == self.next_step, f"steps are placed in order: {self.next_step} next"
        self.next_step += 1
        place = self._stumm_walther(step) if step < self.switch else self._wang_moin()
        if place is not None:
            self.steps[place] = step
        return place

    def _stumm_walther(self, step: int) -> int | None:
        i, o, p, s = self.i, self.o, self.p, self.s
        place = i if s else None
        if s:
            i += 1
            if i > o:
                i = 1
        if step + 1 == p:
            s = False
        if step == p:
            p, o = p + o, o - 1
            i, s = o, o > 0
        self.i, self.o, self.p, self.s = i, o, p, s
        return place

    def _wang_moin(self) -> int | None:
        if self.slots == 1:  # the one place holds the first carry
            return None
        steps, levels = self.steps, self.levels
        if any(self.dispensable):
            # the latest dispensable carry gives its place, at level 0
            place = max(
                (j for j in range(self.slots) if self.dispensable[j]), key=lambda j: steps[j]
            )
            level = 0
            self.dispensable[place] = False
        else:
            # the latest carry gives its place a level up; those of lower levels are dispensable
            place = max(range(self.slots), key=lambda j: (steps[j], -j))
            level = levels[place] + 1
            self.dispensable = [
                d or levels[j] < levels[place] for j, d in enumerate(self.dispensable)
            ]
        levels[place] = level
        return place
