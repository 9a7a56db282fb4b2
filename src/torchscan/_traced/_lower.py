"""``torchscan_scan`` and ``torchscan_loop`` as torch's own ``scan`` operator, which back ends
other than ONNX know (ExecuTorch's ``to_edge``, Inductor).

:func:`call_torch_scan` has the graphs of a program's module (its bodies included) call
:func:`scan_with_torch` and :func:`loop_with_torch` where they called torchscan's operators:
exported again, the module holds ``torch.ops.higher_order.scan`` instead. torch's scan runs
every sequence and output along axis 0 and in one direction, and refuses outputs of the step
that alias its inputs or each other, so the sequences are flipped and moved to axis 0 before it,
the outputs moved back after it, and every output of the step is copied. A loop with a trip
count is a scan over ``arange(trip_count)``; a loop that may stop early (``until``, ``cond``)
has no equivalent in torch that trains. The graphs are edited rather than the operators
redirected: torch's scan traces its step with TorchDynamo, which does not call torchscan's
operators of a nested body but refuses them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchscan._compat import scan_operator
from torchscan._errors import TorchscanValueError
from torchscan._traced._loop_op import torchscan_loop
from torchscan._traced._scan_op import ScanStatic, torchscan_scan


def call_torch_scan(module: torch.nn.Module) -> None:
    """Have every graph of ``module`` call torch's scan where it calls torchscan's operators."""
    replacements = {torchscan_scan: scan_with_torch, torchscan_loop: loop_with_torch}
    for gm in module.modules():
        if not isinstance(gm, torch.fx.GraphModule):
            continue
        nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in replacements]
        for node in nodes:
            node.target = replacements[node.target]
        if nodes:
            gm.recompile()


def _broadcast(values: Sequence[Any], n: int) -> list[Any]:
    return list(values) * n if len(values) == 1 else list(values)


def _move(t: torch.Tensor, source: int, destination: int) -> torch.Tensor:
    return t if source % t.ndim == destination % t.ndim else t.movedim(source, destination)


def _copies(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t.clone(memory_format=torch.contiguous_format) for t in tensors]


def _run_scan(step: Any, carries: Sequence[torch.Tensor], xs: Sequence[torch.Tensor]) -> Any:
    """torch's scan of ``step(carries, x_slices) -> (new_carries, ys)`` over axis 0 of ``xs``,
    with a placeholder carry where there is none (torch's scan needs one); returns the final
    carries and the ys stacked on axis 0. A tensor given as several carries (``(h0, h0)``) is
    copied for all but the first: torch's scan traces its step with the carries that are one
    tensor as one input, and they part after the first step."""
    carries = _distinct(carries)
    if carries:
        return scan_operator()(
            lambda c, x: tuple(map(_copies, step(c, x))), list(carries), list(xs)
        )
    placeholder = xs[0].new_zeros(())

    def with_placeholder(c: list[torch.Tensor], x: list[torch.Tensor]) -> Any:
        _, ys = step([], x)
        return [c[0].clone()], _copies(ys)

    _, ys = scan_operator()(with_placeholder, [placeholder], list(xs))
    return [], ys


def _distinct(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    seen: set[int] = set()
    distinct = []
    for t in tensors:
        distinct.append(t.clone() if id(t) in seen else t)
        seen.add(id(t))
    return distinct


def scan_with_torch(body, carries, xs, captured, *static) -> tuple[torch.Tensor, ...]:
    """``torchscan_scan(...)`` computed by torch's scan."""
    in_axes, in_reverse, out_axes, out_reverse, _ = ScanStatic(*static)
    n = len(carries)
    xs = [
        _move((x.flip(a) if r else x), a, 0)
        for x, a, r in zip(xs, in_axes, in_reverse, strict=True)
    ]

    def step(c: list[torch.Tensor], x: list[torch.Tensor]) -> Any:
        out = body(*c, *x, *captured)
        return list(out[:n]), list(out[n:])

    final, ys = _run_scan(step, carries, xs)
    ys = [
        _move((y.flip(0) if r else y), 0, a)
        for y, a, r in zip(
            ys, _broadcast(out_axes, len(ys)), _broadcast(out_reverse, len(ys)), strict=True
        )
    ]
    return (*final, *ys)


def loop_with_torch(
    body, trip_count, cond, carries, captured, has_until
) -> tuple[torch.Tensor, ...]:
    """``torchscan_loop(...)`` computed by torch's scan over ``arange(trip_count)``."""
    if has_until or cond is not None or trip_count is None:
        stop = "until" if has_until else "cond" if cond is not None else "no trip count"
        raise TorchscanValueError(
            "torchscan.lower_to_torch: a torchscan_loop that may stop early (it has "
            f"{stop}) cannot become torch's scan, which always runs a number of steps known "
            "before it starts, and torch has no loop operator that stops early and trains "
            "(torch.while_loop's outputs cannot stack per-step values). Export it for ONNX, or "
            "give the loop a trip_count and no until or cond."
        )
    reference = next((t for t in (*carries, *captured) if isinstance(t, torch.Tensor)), None)
    device = None if reference is None else reference.device
    if isinstance(trip_count, torch.Tensor):
        raise TorchscanValueError(
            "torchscan.lower_to_torch: a torchscan_loop whose trip count is a tensor cannot "
            "become torch's scan, which needs the number of steps as a size of the program (a "
            "Python int, or "
            "a size of an input such as xs.shape[0]): a count read from a tensor's value is "
            "known only when the program runs."
        )
    steps = torch.arange(trip_count, device=device)
    n = len(carries)

    def step(c: list[torch.Tensor], x: list[torch.Tensor]) -> Any:
        out = body(x[0], *c, *captured)
        return list(out[:n]), list(out[n:])

    final, ys = _run_scan(step, carries, [steps])
    return (*final, *ys)
