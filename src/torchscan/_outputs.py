"""What loops do with the ``y`` of every step: check it, stack it, or make it empty.

Shared by ``scan`` and ``loop``, which differ only in words: what the function is called and how
a step is named in messages (``xs index 3``, ``iteration 3``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

import torch

from torchscan import _checks, _context, _pytree
from torchscan._errors import TorchscanError, TorchscanTypeError, TorchscanValueError
from torchscan._layout import OutLayout


@dataclasses.dataclass(frozen=True)
class Outputs:
    api: str
    fn_name: str
    step_name: str

    def check_first(self, y: Any, layout: OutLayout) -> None:
        """``y`` holds tensors and ``None`` only, and each tensor can be stacked on the axis
        ``layout`` gives it."""
        leaves = _pytree.tree_leaves(y)
        _checks.check_tensor_leaves(self.api, "y", y, leaves)
        axes = layout.axes(y)
        one_axis = layout.axes_prefix is None
        bad = [i for i, leaf in enumerate(leaves) if leaf is not None and not _fits(axes[i], leaf)]
        if bad:
            names = _pytree.leaf_names(y, "y")
            lines = [
                f"{names[i]} has shape {tuple(leaves[i].shape)}, so ys gets rank "
                f"{leaves[i].ndim + 1} and {'axis' if one_axis else 'its axis'} "
                "must be in "
                f"[{-leaves[i].ndim - 1}, {leaves[i].ndim}]"
                + ("" if one_axis else f", but out_axes gives it {axes[i]}")
                for i in bad
            ]
            what = (
                f"axis={layout.axis} is also the axis that ys are stacked on, and it does not fit"
                if one_axis
                else "out_axes does not fit"
            )
            raise TorchscanValueError(
                f"{self.api}: {what} every leaf of y:{_checks.bullets(lines)}"
            )

    def stack(self, ys: list[Any], layout: OutLayout) -> Any:
        """Stack every leaf of the per-step outputs (``ys``, in the order the steps ran) along
        the axis, and in the direction, that ``layout`` gives it: a reversed leaf is stacked
        from its end."""
        spec = _pytree.tree_structure(ys[0])
        uniform = layout.axes_prefix is None and isinstance(layout.reverse_prefix, bool)
        if _pytree.is_leaf_spec(spec) and uniform:
            return self._stack_leaf(
                ys[::-1] if layout.reverse_prefix else ys, layout.axis, ys[0], 0
            )
        flat = [_pytree.tree_flatten(y) for y in ys]
        for _, step_spec in flat:
            if step_spec != spec and not _pytree.same_structure(step_spec, spec):
                raise TorchscanTypeError(
                    f"{self.api}: {self.fn_name} must return y of the same structure at every "
                    f"step, but:\n"
                    f"  * the first step returned {_pytree.structure_text(spec)}\n"
                    f"  * a later step returned {_pytree.structure_text(step_spec)}"
                )
        columns = [list(c) for c in zip(*(step_leaves for step_leaves, _ in flat), strict=True)]
        return self.stack_columns(columns, layout, ys[0])

    def stack_columns(self, columns: Sequence[list[Any]], layout: OutLayout, y: Any) -> Any:
        """Stack ``columns``, leaf ``i`` of every step's ``y`` in the order the steps ran, as
        :meth:`stack` stacks the leaves of ``y``; ``y`` is the first step's."""
        axes, reverse = layout.axes(y), layout.reverse(y)
        stacked = [
            self._stack_leaf(column[::-1] if r else column, a, y, i)
            for i, (column, a, r) in enumerate(zip(columns, axes, reverse, strict=True))
        ]
        return _pytree.tree_unflatten(stacked, _pytree.tree_structure(y))

    def _stack_leaf(self, column: list[Any], axis: int, y: Any, index: int) -> torch.Tensor | None:
        """Stack leaf ``index`` of every step's ``y`` (``column``); ``y`` names it in errors."""
        first = column[0]
        if first is None:
            if any(leaf is not None for leaf in column):
                self._raise_changed(column, y, index)
            return None
        try:
            stacked = torch.stack(column, dim=axis)
        except (RuntimeError, TypeError):
            self._raise_changed(column, y, index)
        # stack promotes mixed dtypes, so every step's dtype is read (dtypes are singletons).
        dtype = first.dtype
        if stacked.dtype is not dtype or not all(leaf.dtype is dtype for leaf in column):
            self._raise_changed(column, y, index)
        return stacked

    def _raise_changed(self, column: Sequence[Any], y: Any, index: int) -> NoReturn:
        name = _pytree.leaf_names(y, "y")[index]
        first = _checks.describe(column[0])
        step, other = next(
            (step, _checks.describe(leaf))
            for step, leaf in enumerate(column)
            if _checks.describe(leaf) != first
        )
        raise TorchscanTypeError(
            f"{self.api}: {self.fn_name} must return y of the same type at every step, but "
            f"{name} is {first} for {self.step_name} 0 and {other} for {self.step_name} {step}."
        )

    def empty(self, fake_y: Any, layout: OutLayout) -> Any:
        """``ys`` of zero steps: every tensor of ``fake_y`` with a 0-length axis inserted."""
        leaves = _pytree.tree_leaves(fake_y)
        data_dependent = [
            i
            for i, leaf in enumerate(leaves)
            if leaf is not None and not all(isinstance(d, int) for d in leaf.shape)
        ]
        if data_dependent:
            names = _pytree.leaf_names(fake_y, "y")
            raise TorchscanValueError(
                f"{self.api}: no step runs, and the shape of "
                f"{', '.join(names[i] for i in data_dependent)} depends on data, so ys cannot "
                "be made empty with the right shape."
            )
        leaves, spec = _pytree.tree_flatten(fake_y)
        axes = layout.axes(fake_y)
        return _pytree.tree_unflatten(
            [t if t is None else _empty_stack(t, a) for t, a in zip(leaves, axes, strict=True)],
            spec,
        )

    def call_on_fake(self, why: str, fn: Callable, *args: Any, real: Callable | None = None) -> Any:
        """Call ``fn(*args)`` on fake tensors (shapes and dtypes, no data) to learn what it
        returns; ``why`` says in errors why it had to be called that way. Where ``fn`` reads a
        tensor's value in Python (``if torch.all(x == 0):``), which fake tensors have none of,
        ``real`` (the step itself) is called on zeros instead, without gradients and with the
        random number generators left as they were: its values are never used."""
        from torchscan import _compat

        # A shape environment lets values read from data stay symbolic, and torch.export's
        # indexing rules turn ``x[i]`` with a 0-d tensor ``i`` into a select at such a value.
        fake_mode = _compat.FakeTensorMode(
            allow_non_fake_inputs=True, shape_env=_compat.shape_env(), static_shapes=True
        )
        reads_values: BaseException | None = None
        try:
            with (
                _context.probing(_context.Probe.SHAPES),
                torch.no_grad(),
                fake_mode as mode,
                _compat.non_strict_torch_function_handler()(),
                _dropping(_compat.UNFOUND_USER_CODE_WARNING),
            ):
                fake_args = _pytree.tree_map(
                    lambda t: mode.from_tensor(t.detach()) if isinstance(t, torch.Tensor) else t,
                    args,
                )
                return fn(*fake_args)
        except TorchscanError:
            raise  # torchscan's own refusal says what is wrong, as it would eagerly
        except Exception as error:
            # A step that reads values, or that fake tensors cannot run (one under
            # torch.func.vmap with a loop of its own): called on zeros instead.
            if real is None:
                raise self._fake_call_failed(why, error) from error
            reads_values = error
        assert real is not None
        assert reads_values is not None
        return self._call_on_zeros(why, real, args, reads_values)

    def _fake_call_failed(self, why: str, error: BaseException) -> TorchscanValueError:
        return TorchscanValueError(
            f"{self.api}: {why}, so the shapes of ys are found by calling {self.fn_name} once on "
            f"fake tensors (no data), and that call failed with {type(error).__name__}: {error}"
        )

    def _call_on_zeros(
        self, why: str, fn: Callable, args: tuple[Any, ...], reads_values: BaseException
    ) -> Any:
        """``fn`` on zeros shaped like ``args``: for a step that reads values of tensors."""
        tensors = [t for t in _pytree.tree_leaves(args) if isinstance(t, torch.Tensor)]
        devices = sorted({t.device for t in tensors if t.device.type != "cpu"}, key=str)
        with (
            torch.no_grad(),
            torch.random.fork_rng(devices=devices, device_type=_device_type(devices)),
        ):
            zeros = _pytree.tree_map(
                lambda t: torch.zeros_like(t) if isinstance(t, torch.Tensor) else t, args
            )
            try:
                return fn(*zeros)
            except TorchscanError:
                raise
            except Exception as error:
                from torchscan import _compat

                if not isinstance(reads_values, _compat.guard_on_data_dependent_error()):
                    raise self._fake_call_failed(why, reads_values) from reads_values
                where = _users_line(reads_values)
                raise TorchscanValueError(
                    f"{self.api}: {why}, so the shapes of ys are found by calling "
                    f"{self.fn_name} once: it reads the value of a tensor{where}, which fake "
                    f"tensors (no data) do not have, and called on zeros it failed with "
                    f"{type(error).__name__}: {error}. Choose between values with "
                    "torch.where(condition, a, b) instead of Python control flow on a tensor."
                ) from error


@contextlib.contextmanager
def _dropping(warning: tuple[str, str]) -> Iterator[None]:
    """Drop the log records of logger ``warning[0]`` that start with ``warning[1]``."""

    def keep(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(warning[1])

    logger = logging.getLogger(warning[0])
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def _device_type(devices: Sequence[torch.device]) -> str:
    return devices[0].type if devices else "cuda"


def _users_line(error: BaseException) -> str:
    """`` at file:line``: the innermost frame of the user's code in ``error``'s traceback."""
    from torchscan._source import is_users

    frames = [f for f in traceback.extract_tb(error.__traceback__) if is_users(f.filename)]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def _fits(axis: int, leaf: torch.Tensor) -> bool:
    return -leaf.ndim - 1 <= axis <= leaf.ndim


def _empty_stack(fake: torch.Tensor, axis: int) -> torch.Tensor:
    shape = list(fake.shape)
    shape.insert(axis % (fake.ndim + 1), 0)
    return torch.empty(shape, dtype=fake.dtype, device=fake.device)


def extend(ys: Any, out: OutLayout, missing: int) -> Any:
    """``ys`` extended by ``missing`` zeros along each leaf's stacking axis (``out``): the
    positions of a padded batch past its longest example, where no step ran."""
    if not missing:
        return ys
    leaves, spec = _pytree.tree_flatten(ys)
    axes = out.axes(ys)
    return _pytree.tree_unflatten(
        [
            y if y is None else _zeros_after(y, a % y.ndim, missing)
            for y, a in zip(leaves, axes, strict=True)
        ],
        spec,
    )


def _zeros_after(y: torch.Tensor, axis: int, missing: int) -> torch.Tensor:
    shape = list(y.shape)
    shape[axis] = missing
    return torch.cat([y, y.new_zeros(shape)], dim=axis)
