"""Random scan/loop programs as a small tree of dataclasses that renders itself as Python.

A :class:`Program` is an ``nn.Module`` written out as source: its ``forward`` takes the model
inputs (:class:`Input`), and calls ``scan`` or ``loop`` once (a :class:`Call`), whose step
function is a list of statements, some of which are nested calls. ``repr(program)`` is that
source, so a failing case that hypothesis shrinks prints as a program one can read and paste.

The source names ``scan``, ``loop`` and ``until`` without a module: :meth:`Program.module`
compiles it against torchscan's functions, or against the independent oracle of
``_oracle.py``, so one text runs both ways.
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any

import torch

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "int64": torch.int64,
    "bool": torch.bool,
}
FLOATS = ("float32", "float64")


@dataclasses.dataclass(frozen=True)
class Val:
    """A value a step can read: a name in the source, its dtype and its (static) shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Input:
    """A model input. ``time_axis`` is the axis of dynamic length ``T``, if any; ``role`` says
    how its value is made: ``data`` (random), ``count`` (a 0-d int64 equal to ``T``) or ``flag``
    (a random 0-d bool)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    time_axis: int | None = None
    role: str = "data"

    def make(self, length: int, gen: torch.Generator) -> torch.Tensor:
        shape = list(self.shape)
        if self.time_axis is not None:
            shape.insert(
                self.time_axis if self.time_axis >= 0 else len(shape) + 1 + self.time_axis, length
            )
        if self.role == "count":
            return torch.tensor(length, dtype=torch.int64)
        if self.dtype in FLOATS:
            return torch.randn(shape, generator=gen, dtype=DTYPES[self.dtype])
        if self.dtype == "int64":
            return torch.randint(-5, 6, shape, generator=gen, dtype=torch.int64)
        return torch.rand(shape, generator=gen) > 0.5


@dataclasses.dataclass
class Stmt:
    """``target = expr``."""

    target: str
    expr: str

    def lines(self) -> list[str]:
        return [f"{self.target} = {self.expr}"]


@dataclasses.dataclass
class Call:
    """One ``scan`` or ``loop`` call and its step function.

    ``params`` is the step's signature, ``unpack`` the lines that name the leaves of its
    arguments, ``body`` its statements, ``returns`` the expression it returns and ``expr`` the
    call itself (``scan(step0, ...)``)."""

    kind: str
    fn: str
    params: str
    unpack: list[str]
    body: list[Stmt | Nested]
    returns: str
    expr: str

    def definition(self) -> list[str]:
        lines = [line for stmt in self.body for line in stmt.lines()]
        inner = [*self.unpack, *lines, f"return {self.returns}"]
        return [
            f"def {self.fn}({self.params}):",
            *textwrap.indent("\n".join(inner), "    ").splitlines(),
        ]


@dataclasses.dataclass
class Nested:
    """A call inside a step function: ``target = scan(...)``."""

    target: str
    call: Call

    def lines(self) -> list[str]:
        return [*self.call.definition(), f"{self.target} = {self.call.expr}"]


def reshaped_in_place(value: torch.Tensor) -> torch.Tensor:
    """A view of ``value`` whose shape is changed in place and back: what the fuzzed steps call
    for shape-only in-place changes (the same function for torchscan and the oracle)."""
    view = value.unsqueeze(0)
    view.squeeze_(0)
    return view


@dataclasses.dataclass
class Program:
    """A model: its inputs and the one loop its ``forward`` returns the result of; with
    ``sizes``, also a tensor made with the sizes of its outputs, which a model reads after a
    loop (``ys.shape[0]``: the number of steps that ran)."""

    inputs: list[Input]
    call: Call
    seed: int = 0
    lengths: tuple[int, ...] = (3,)
    """The lengths ``T`` it runs at; the first is the one it is exported at."""
    sizes: bool = False

    @property
    def dynamic(self) -> bool:
        return any(i.time_axis is not None or i.role == "count" for i in self.inputs)

    def source(self) -> str:
        args = ", ".join(["self", *(i.name for i in self.inputs)])
        if self.sizes:
            body = [
                *self.call.definition(),
                f"result = {self.call.expr}",
                "ys = [t for t in tree_leaves(result[1]) if isinstance(t, torch.Tensor)]",
                "return result, [torch.ones(t.shape[0], 2) * t.shape[0] + t.numel() for t in ys]",
            ]
        else:
            body = [*self.call.definition(), f"return {self.call.expr}"]
        lines = [
            "class Program(torch.nn.Module):",
            f"    def forward({args}):",
            *textwrap.indent("\n".join(body), "        ").splitlines(),
        ]
        return "\n".join(lines)

    def __repr__(self) -> str:
        shapes = ", ".join(
            f"{i.name}: {i.dtype}{list(i.shape)}"
            + (f" T at {i.time_axis}" if i.time_axis is not None else "")
            + (f" ({i.role})" if i.role != "data" else "")
            for i in self.inputs
        )
        return f"# inputs: {shapes}; lengths {self.lengths}, seed {self.seed}\n{self.source()}\n"

    def vmappable(self) -> bool:
        """Whether vmap can run its Python loop: no step stops early (each example would stop
        at its own step)."""
        return "until(" not in self.source()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # hypothesis prints a failing example with this: the source, not the dataclass fields.
        printer.text(repr(self))

    def module(self, namespace: dict[str, Any]) -> torch.nn.Module:
        """The program compiled against ``namespace``'s ``scan``, ``loop`` and ``until``."""
        scope = {
            "torch": torch,
            "F": torch.nn.functional,
            "tree_leaves": torch.utils._pytree.tree_leaves,
            "reshaped_in_place": reshaped_in_place,
            **namespace,
        }
        exec(compile(self.source(), "<fuzzed program>", "exec"), scope)
        return scope["Program"]().eval()

    def inputs_at(self, length: int) -> tuple[torch.Tensor, ...]:
        gen = torch.Generator().manual_seed(self.seed * 1000 + length)
        return tuple(i.make(length, gen) for i in self.inputs)

    def dynamic_shapes(self) -> tuple[Any, ...] | None:
        if not any(i.time_axis is not None for i in self.inputs):
            return None
        t = torch.export.Dim("T", min=0)
        return tuple(None if i.time_axis is None else {self._axis(i): t} for i in self.inputs)

    @staticmethod
    def _axis(i: Input) -> int:
        return i.time_axis if i.time_axis >= 0 else len(i.shape) + 1 + i.time_axis
