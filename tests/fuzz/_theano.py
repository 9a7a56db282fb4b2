"""Random ``torchscan.theano.scan`` models: sequences of their own dynamic lengths read at random
taps, an output fed back, forwards or backwards; exported, and run in onnxruntime (both levels)
and onnx's reference evaluator at other lengths against the guide's loop of ``tests/_oracles.py``.
"""

from __future__ import annotations

import dataclasses

import hypothesis.strategies as st
import numpy as np
import torch

from torchscan import theano

from .._export import onnx_export
from .._oracles import theano_scan_loop
from ..onnx._runtimes import assert_outputs_close, run_onnxruntime, run_reference

N = 2


@dataclasses.dataclass(frozen=True)
class TheanoProblem:
    taps: tuple[tuple[int, ...], ...]  # of each sequence
    go_backwards: bool
    opset: int
    seed: int

    def span(self, j: int) -> int:
        taps = self.taps[j]
        return max(*taps, 0) - min(*taps, 0)

    def inputs(self, extra: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
        """Sequence ``j`` long enough for ``extra[j] + 1`` steps, and the initial state."""
        gen = torch.Generator().manual_seed(self.seed + sum(extra))
        sequences = [
            torch.randn(self.span(j) + 1 + extra[j], N, generator=gen)
            for j in range(len(self.taps))
        ]
        return (*sequences, torch.randn(N, generator=gen))


class TheanoModel(torch.nn.Module):
    def __init__(self, problem: TheanoProblem) -> None:
        super().__init__()
        self.problem = problem
        self.weight = torch.nn.Parameter(torch.randn(N, N) * 0.5)

    def step(self, *args):
        *reads, h = args
        return torch.tanh(h @ self.weight + sum(r * (k + 1) for k, r in enumerate(reads)))

    def forward(self, sequences: list[torch.Tensor], h0: torch.Tensor) -> torch.Tensor:
        out, _ = theano.scan(
            self.step,
            sequences=[
                {"input": s, "taps": list(taps)}
                for s, taps in zip(sequences, self.problem.taps, strict=True)
            ],
            outputs_info=[h0],
            go_backwards=self.problem.go_backwards,
        )
        return out


@st.composite
def theano_problems(draw) -> TheanoProblem:
    taps = tuple(
        tuple(draw(st.lists(st.integers(-2, 2), min_size=1, max_size=2, unique=True)))
        for _ in range(draw(st.integers(1, 2)))
    )
    return TheanoProblem(
        taps, draw(st.booleans()), draw(st.integers(9, 25)), draw(st.integers(0, 2**16))
    )


def check_theano(problem: TheanoProblem) -> None:
    torch.manual_seed(problem.seed)
    model = TheanoModel(problem).eval()
    n = len(problem.taps)
    dims = [torch.export.Dim(f"L{j}", min=problem.span(j) + 3) for j in range(n)]
    *sequences, h0 = problem.inputs((2,) * n)
    exported = onnx_export(
        model,
        (sequences, h0),
        dynamo=True,
        opset_version=problem.opset,
        dynamic_shapes=([{0: d} for d in dims], None),
    ).model_proto
    for extra in [(0,) * n, tuple(range(n)), tuple(range(n + 3, 3, -1))]:
        inputs = problem.inputs(extra)
        *sequences, h0 = inputs
        with torch.no_grad():
            eager = model(sequences, h0)
            expected = theano_scan_loop(
                model.step,
                [
                    {"input": s, "taps": list(t)}
                    for s, t in zip(sequences, problem.taps, strict=True)
                ],
                [h0],
                (),
                None,
                problem.go_backwards,
            )
        torch.testing.assert_close(eager, expected[0])
        wanted = [eager.numpy()]
        assert_outputs_close(run_onnxruntime(exported, inputs), wanted, exported)
        reference = run_reference(exported, inputs)
        np.testing.assert_allclose(reference[0], wanted[0], rtol=1e-5, atol=1e-5)
