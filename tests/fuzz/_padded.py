"""Random padded batches: ``scan(..., lengths=)`` of a recurrent cell over sequences whose padding
holds NaN, infinity, garbage or zeros, against a per-example loop that reads the valid positions
only (the padding never reaches it), for values and for every gradient; and exported with a
dynamic length and batch, against eager in onnxruntime at both optimization levels.
"""

from __future__ import annotations

import dataclasses

import hypothesis.strategies as st
import torch

import torchscan

from .._export import onnx_export
from ..onnx._runtimes import assert_outputs_close, run_onnxruntime

F, H = 3, 4
PADDINGS = ("nan", "inf", "garbage", "zeros")
CELLS = {"rnn": torch.nn.RNNCell, "gru": torch.nn.GRUCell, "lstm": torch.nn.LSTMCell}


@dataclasses.dataclass(frozen=True)
class Padded:
    cell: str
    lengths: tuple[int, ...]
    n_steps: int
    batch_first: bool
    reverse: bool
    padding: str
    seed: int
    opset: int | None  # exported at this opset, or not exported

    @property
    def axis(self) -> int:
        return 1 if self.batch_first else 0

    def module(self) -> torch.nn.Module:
        torch.manual_seed(self.seed)
        return PaddedScan(CELLS[self.cell](F, H), self.axis, self.reverse)

    def inputs(self, lengths: tuple[int, ...] | None = None, n_steps: int | None = None):
        """``(x, h0, lengths)`` with the padding of ``self.padding``."""
        lengths = self.lengths if lengths is None else lengths
        n_steps = self.n_steps if n_steps is None else n_steps
        gen = torch.Generator().manual_seed(self.seed)
        batch = len(lengths)
        x = torch.randn(n_steps, batch, F, generator=gen)
        valid = torch.arange(n_steps)[:, None] < torch.tensor(lengths)[None, :]
        count = int((~valid).sum())
        if self.padding == "nan":
            x[~valid] = float("nan")
        elif self.padding == "inf":
            x[~valid] = float("inf")
        elif self.padding == "garbage":  # bit patterns of every kind: NaNs, huge, tiny
            bits = torch.randint(-(2**31), 2**31 - 1, (count, F), generator=gen, dtype=torch.int64)
            x[~valid] = bits.to(torch.int32).view(torch.float32)
        else:
            x[~valid] = 0.0
        x = x.transpose(0, 1).contiguous() if self.batch_first else x
        return x, torch.randn(batch, H, generator=gen), torch.tensor(lengths)


class PaddedScan(torch.nn.Module):
    def __init__(self, cell: torch.nn.Module, axis: int, reverse: bool) -> None:
        super().__init__()
        self.cell, self.axis, self.reverse = cell, axis, reverse

    def step(self, carry, x):
        if isinstance(self.cell, torch.nn.LSTMCell):
            h, c = self.cell(x, carry)
            return (h, c), h
        h = self.cell(x, carry)
        return h, h

    def init(self, h0: torch.Tensor):
        return (h0, h0 * 0.5) if isinstance(self.cell, torch.nn.LSTMCell) else h0

    def forward(self, x, h0, lengths):
        carry, ys = torchscan.scan(
            self.step, self.init(h0), x, axis=self.axis, reverse=self.reverse, lengths=lengths
        )
        final = carry[0] if isinstance(carry, tuple) else carry
        return ys, final


def per_example(module: PaddedScan, x, h0, lengths) -> tuple[torch.Tensor, torch.Tensor]:
    """Each example alone over its valid positions (backwards with ``reverse``); ys zero at
    its padded positions."""
    time_major = x.movedim(module.axis, 0)
    columns, finals = [], []
    for b, n in enumerate(lengths.tolist()):
        carry = module.init(h0[b : b + 1])
        ys = [torch.zeros(1, H)] * time_major.shape[0]
        for t in reversed(range(n)) if module.reverse else range(n):
            carry, ys[t] = module.step(carry, time_major[t, b : b + 1])
        columns.append(torch.cat(ys) if ys else torch.zeros(0, H))
        finals.append(carry[0] if isinstance(carry, tuple) else carry)
    ys = torch.stack(columns, 1).movedim(0, module.axis) if columns else None
    return ys, torch.cat(finals)


@st.composite
def padded_problems(draw) -> Padded:
    batch = draw(st.integers(1, 4))
    n_steps = draw(st.integers(1, 6))
    lengths = tuple(draw(st.lists(st.integers(0, n_steps), min_size=batch, max_size=batch)))
    opset = draw(st.sampled_from([None, None, None, *range(9, 26)]))
    return Padded(
        draw(st.sampled_from(list(CELLS))),
        lengths,
        n_steps,
        draw(st.booleans()),
        draw(st.booleans()),
        draw(st.sampled_from(PADDINGS)),
        draw(st.integers(0, 2**16)),
        opset,
    )


def check_padded(problem: Padded) -> None:
    module = problem.module()
    x, h0, lengths = problem.inputs()
    valid = torch.arange(problem.n_steps)[:, None] < lengths[None, :]
    grads = []
    for run in (module, lambda *a: per_example(module, *a)):
        xg, hg = x.clone().requires_grad_(), h0.clone().requires_grad_()
        ys, final = run(xg, hg, lengths)
        loss = (ys * ys).sum() + final.sum()
        inputs = [xg, hg, *module.parameters()]
        computed = torch.autograd.grad(loss, inputs, allow_unused=True, materialize_grads=True)
        grads.append(((ys.detach(), final.detach()), computed))
    (actual, actual_grads), (expected, expected_grads) = grads
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)
    for k, (a, e) in enumerate(zip(actual_grads, expected_grads, strict=True)):
        assert torch.isfinite(a).all(), f"gradient {k} is not finite"
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"grad {k}: {m}")
    assert (actual_grads[0].movedim(problem.axis, 0)[~valid] == 0).all()
    if problem.opset is not None:
        check_padded_export(problem, module)


def check_padded_export(problem: Padded, module: torch.nn.Module) -> None:
    """Exported with a dynamic length and batch: onnxruntime gives eager's values on the
    problem's batch and on another one, padding included."""
    time, batch = torch.export.Dim("T", min=1), torch.export.Dim("B", min=1)
    x_dims = {0: batch, 1: time} if problem.batch_first else {0: time, 1: batch}
    exported = onnx_export(
        module,
        problem.inputs(lengths=(3, 0), n_steps=3),  # sizes of 1 would be taken as static
        dynamo=True,
        opset_version=problem.opset,
        dynamic_shapes=(x_dims, {0: batch}, {0: batch}),
    ).model_proto
    other = problem.inputs(lengths=(problem.n_steps + 2, 0, 1), n_steps=problem.n_steps + 2)
    for inputs in (problem.inputs(), other):
        with torch.no_grad():
            expected = [t.numpy() for t in module(*inputs)]
        assert_outputs_close(run_onnxruntime(exported, inputs), expected, exported)
