"""The three hoisters mean the same (``_hoist/_policy.py``): for a table of step functions, the
matrix products each leaves inside the loop (those that read the carry, and, where a hoister
refuses the step, all of them) — the eager hoister (on the step's ATen graph), the pass under
``torch.compile`` (on the loop operator's body, as TorchDynamo captures it) and the pass over
exported ONNX bodies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import torchscan
from torchscan import _hoist
from torchscan._hoist import _inductor

from ._export import onnx_export

T, B, H, M = 20, 2, 4, 3
torch.manual_seed(0)
WX, WH, WQ, WK, WV = (torch.randn(H, H) * 0.3 for _ in range(5))
WG, UG = torch.randn(H, 3 * H) * 0.3, torch.randn(H, 3 * H) * 0.3
MEMORY = torch.randn(B, M, H)
NORM = torch.nn.LayerNorm(H)


def rnn(h, x):
    """An Elman cell: the input projection batched, the hidden product left in."""
    h = torch.tanh(x @ WX + h @ WH)
    return h, h


def gru(h, x):
    """A GRU cell written out (``linear_before_reset``): the hidden product left in."""
    gx, gh = x @ WG, h @ UG
    r = torch.sigmoid(gx[:, :H] + gh[:, :H])
    z = torch.sigmoid(gx[:, H : 2 * H] + gh[:, H : 2 * H])
    n = torch.tanh(gx[:, 2 * H :] + r * gh[:, 2 * H :])
    h = (1 - z) * n + z * h
    return h, h


def masked_attention(h, x):
    """A query made of the carry over a fixed memory, masked by the step's input: the keys and
    values computed once, three products left in."""
    keys, values = MEMORY @ WK, MEMORY @ WV
    query = h @ WQ
    scores = (query.unsqueeze(1) @ keys.transpose(1, 2)).squeeze(1)
    scores = scores.masked_fill(x[:, :M] < -1.0, -1e4)
    context = (scores.softmax(-1).unsqueeze(1) @ values).squeeze(1)
    h = torch.tanh(context + x @ WX)
    return h, h


def random_mask(h, x):
    """A mask drawn at every step (a random operation is the carry's: the random stream stays
    the loop's), on the input projection, which is batched all the same."""
    keep = torch.rand(B, H) > 0.3
    h = torch.tanh((x @ WX) * keep + h @ WH)
    return h, h


def in_place_write(h, x):
    """The hidden product added in place into the input projection: the projection is made at
    every step, where the write is (eagerly); exported, the write is a plain addition."""
    out = x @ WX
    out.add_(h @ WH)
    h = torch.tanh(out)
    return h, h


def layer_norm(h, x):
    """A layer norm of the pre-activation, read with the carry: one product left in."""
    h = torch.tanh(F.layer_norm(x @ WX + h @ WH, (H,), NORM.weight, NORM.bias))
    return h, h


STEPS: dict[str, tuple[Callable[..., Any], dict[str, int]]] = {
    # step: (its function, the matrix products each hoister leaves in the loop)
    "rnn": (rnn, {"eager": 1, "compiled": 1, "onnx": 1}),
    "gru": (gru, {"eager": 1, "compiled": 1, "onnx": 1}),
    "masked attention": (masked_attention, {"eager": 3, "compiled": 3, "onnx": 3}),
    # torch.compile's pass rewrites no step that draws random numbers
    "random mask": (random_mask, {"eager": 1, "compiled": 2, "onnx": 1}),
    "in-place write": (in_place_write, {"eager": 2, "compiled": 2, "onnx": 1}),
    "layer norm": (layer_norm, {"eager": 1, "compiled": 1, "onnx": 1}),
}

MATMULS = {"mm", "addmm", "bmm", "matmul", "baddbmm", "linear"}


def _eager(step: Callable[..., Any]) -> int:
    _hoist.clear()
    torchscan.scan(step, torch.zeros(B, H), torch.randn(T, B, H), hoist=True)
    assert _hoist.last.what == "hoisted", _hoist.last
    (hoisted,) = [e for e in _hoist._signature._cache.values() if isinstance(e, _hoist.Hoisted)]
    return sum(name.split(".")[0] in MATMULS for name in hoisted.operations)


def _compiled(step: Callable[..., Any]) -> int:
    """The products left in the body of the loop operator TorchDynamo captures, once the pass
    that Inductor runs before differentiating has run on it."""
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, _inputs: Any) -> Any:
        _inductor.hoist_scans(gm.graph)
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    # unroll=1: the body of the loop operator is one step
    torch.compile(
        lambda h, xs: torchscan.scan(step, h, xs, unroll=1), backend=backend, fullgraph=True
    )(torch.zeros(B, H), torch.randn(T, B, H))
    torch._dynamo.reset()
    (gm,) = graphs
    (scan,) = [
        n
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target is torch.ops.higher_order.scan
    ]
    body = getattr(gm, scan.args[0].target)
    return sum(_is_matmul(n) for n in body.graph.nodes)


def _is_matmul(node: torch.fx.Node) -> bool:
    if node.op == "call_method":
        return node.target in MATMULS
    if node.op != "call_function":
        return False
    name = getattr(node.target, "__name__", str(node.target))
    return name.split(".")[0].removeprefix("_") in MATMULS or name in ("matmul", "mm", "bmm")


def _onnx(step: Callable[..., Any]) -> int:
    class Scan(torch.nn.Module):
        def forward(self, h, xs):
            return torchscan.scan(step, h, xs)

    program = onnx_export(
        Scan(),
        (torch.zeros(B, H), torch.randn(T, B, H)),
        dynamic_shapes=(None, {0: torch.export.Dim("T")}),
    )
    (scan,) = [n for n in program.model.graph if n.op_type == "Scan"]
    body = scan.attributes["body"].as_graph()
    return sum(n.op_type in ("MatMul", "Gemm", "Einsum") for n in body)


HOISTERS = {"eager": _eager, "compiled": _compiled, "onnx": _onnx}


@pytest.mark.parametrize("hoister", HOISTERS)
@pytest.mark.parametrize("name", STEPS)
def test_each_hoister_leaves_the_products_its_meaning_leaves(name: str, hoister: str) -> None:
    step, left = STEPS[name]
    assert HOISTERS[hoister](step) == left[hoister]
