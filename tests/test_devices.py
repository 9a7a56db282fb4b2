"""Every way a scan runs, on every real device this machine has (the ``device`` fixture: the CPU,
and a GPU where there is one), against the hand-written loop or ``torch.nn``'s own modules on
the same device: hoisted and unhoisted scans with gradients, random steps, ``loop`` and
``until``, padded batches, ``torch.func.vmap``, ``torch.compile`` and the export."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.utils._pytree as pytree
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import torchscan
from torchscan import _hoist

from ._export import onnx_export
from ._oracles import loop_loop, scan_loop

T, B, H = 12, 3, 6


@pytest.fixture(autouse=True)
def _full_precision_and_a_fresh_cache():
    """TF32 would round cuDNN's and the loop's products differently from float32."""
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    _hoist.clear()
    yield
    _hoist.clear()
    torch.backends.cudnn.allow_tf32 = tf32


def leaves_close(got, want) -> None:
    for g, w in zip(pytree.tree_leaves(got), pytree.tree_leaves(want), strict=True):
        assert g.device == w.device
        torch.testing.assert_close(g, w)


def grads(outputs, inputs):
    total = sum(leaf.pow(2).sum() for leaf in pytree.tree_leaves(outputs))
    return torch.autograd.grad(total, inputs)


class LSTMStep(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.LSTMCell(H, H)
        self.out = torch.nn.Linear(H, 2)

    def forward(self, carry, x):
        h, c = self.cell(x, carry)
        return (h, c), {"logits": self.out(h), "x": torch.relu(x)}


@pytest.mark.parametrize("hoist", [None, False], ids=["hoisted", "not hoisted"])
@pytest.mark.parametrize("reverse", [False, True])
def test_scan_results_and_gradients_are_the_python_loops(device, hoist, reverse) -> None:
    torch.manual_seed(0)
    step = LSTMStep().to(device)
    xs = torch.randn(T, B, H, device=device, requires_grad=True)
    init = tuple(torch.randn(B, H, device=device, requires_grad=True) for _ in range(2))
    for _ in range(_hoist.TRACE_AT_CALL):
        got = torchscan.scan(step, init, xs, reverse=reverse, hoist=hoist)
    if hoist is None:
        assert _hoist.last.what == "hoisted", _hoist.last.reason
    want = scan_loop(step, init, xs, reverse=reverse)
    leaves_close(got, want)
    inputs = [xs, *init, *step.parameters()]
    for g, w in zip(grads(got, inputs), grads(want, inputs), strict=True):
        torch.testing.assert_close(g, w)


def test_a_hoisted_random_step_draws_the_loops_numbers(device) -> None:
    lin = torch.nn.Linear(H, H).to(device)

    def step(h, x):
        h = torch.tanh(torch.nn.functional.dropout(lin(x), 0.3) + h) + 0.1 * torch.randn_like(h)
        return h, h

    xs, h = torch.randn(T, B, H, device=device), torch.randn(B, H, device=device)
    for _ in range(_hoist.TRACE_AT_CALL - 1):
        torchscan.scan(step, h, xs)
    torch.manual_seed(5)
    got = torchscan.scan(step, h, xs)
    assert _hoist.last.what == "hoisted", _hoist.last.reason
    torch.manual_seed(5)
    leaves_close(got, scan_loop(step, h, xs))


@pytest.mark.parametrize("last", [2, 5], ids=["stops after 3", "runs all 6"])
def test_loop_with_until_is_the_onnx_loop(device, last) -> None:
    cell = torch.nn.GRUCell(H, H).to(device)
    xs = torch.randn(6, B, H, device=device, requires_grad=True)
    init = torch.randn(B, H, device=device, requires_grad=True)

    def body(i, h):
        h = cell(xs[i], h)
        return h, h.sum(-1), torchscan.until(i >= last)

    counters = []
    got = torchscan.loop(lambda i, h: counters.append(i) or body(i, h), init, trip_count=6)
    assert {(i.device, i.dtype, i.shape) for i in counters} == {(init.device, torch.int64, ())}
    want = loop_loop(body, init, trip_count=6)
    leaves_close(got, want)
    inputs = [init, xs, *cell.parameters()]
    for g, w in zip(grads(got, inputs), grads(want, inputs), strict=True):
        torch.testing.assert_close(g, w)


def test_padded_batches_are_torch_lstm_on_packed_sequences(device) -> None:
    torch.manual_seed(0)
    module = torch.nn.LSTM(H, H).to(device)
    cell = torch.nn.LSTMCell(H, H).to(device)
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(cell, name).copy_(getattr(module, f"{name}_l0"))
    lengths = torch.tensor([4, 1, 6, 0, 3])
    x = torch.randn(6, len(lengths), H, device=device)
    h0, c0 = (torch.randn(1, len(lengths), H, device=device) for _ in range(2))

    def step(carry, x):
        h, c = cell(x, carry)
        return (h, c), h

    for _ in range(_hoist.TRACE_AT_CALL):
        (h, c), ys = torchscan.scan(step, (h0[0], c0[0]), x, lengths=lengths.to(device))
    nonzero = lengths > 0
    packed = pack_padded_sequence(x[:, nonzero], lengths[nonzero], enforce_sorted=False)
    with torch.no_grad():
        out, (h_n, c_n) = module(packed, (h0[:, nonzero], c0[:, nonzero]))
    expected, _ = pad_packed_sequence(out, total_length=6)
    torch.testing.assert_close(ys[:, nonzero].detach(), expected)
    torch.testing.assert_close(h[nonzero].detach(), h_n[0])
    torch.testing.assert_close(c[nonzero].detach(), c_n[0])
    assert (ys[:, ~nonzero] == 0).all()
    torch.testing.assert_close(h[~nonzero], h0[0, ~nonzero])


def test_vmap_over_a_batch_of_scans(device) -> None:
    weight = torch.randn(H, H, device=device) / H**0.5

    def run(h, xs):
        return torchscan.scan(lambda h, x: (torch.tanh(x + h @ weight), h), h, xs)

    hs, xss = torch.randn(4, H, device=device), torch.randn(4, T, H, device=device)
    got = torch.func.vmap(run)(hs, xss)
    want = [
        scan_loop(lambda h, x: (torch.tanh(x + h @ weight), h), h, xs)
        for h, xs in zip(hs, xss, strict=True)
    ]
    leaves_close(got, tuple(torch.stack(column) for column in zip(*want, strict=True)))


def test_compiled_scan_has_the_eager_gradients(device) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    step = LSTMStep().to(device)
    xs = torch.randn(T, B, H, device=device, requires_grad=True)
    init = tuple(torch.randn(B, H, device=device, requires_grad=True) for _ in range(2))

    def run(init, xs):
        return torchscan.scan(step, init, xs)

    # Inductor on the CPU is tests/test_compile.py's; on a GPU it generates Triton kernels
    backend = "aot_eager" if device == "cpu" else "inductor"
    try:
        got = torch.compile(run, backend=backend)(init, xs)
        inputs = [xs, *init, *step.parameters()]
        actual = grads(got, inputs)
    finally:
        torch._dynamo.reset()
    want = scan_loop(step, init, xs)
    leaves_close(got, want)
    for g, w in zip(actual, grads(want, inputs), strict=True):
        torch.testing.assert_close(g, w)


def test_a_model_on_the_device_exports_one_scan_that_onnxruntime_runs(device) -> None:
    torch.manual_seed(0)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.input, self.hidden = torch.nn.Linear(H, H), torch.nn.Linear(H, H, bias=False)
            self.out = torch.nn.Linear(H, 2)

        def forward(self, h, c, xs):
            # torch.nn's cells are kernels of their own on a GPU, which torch.onnx does not
            # translate (tests/onnx/test_export_errors.py): a cell written out
            def step(carry, x):
                h, c = carry
                h = torch.tanh(self.input(x) + self.hidden(h)) + 0.5 * c
                return (h, c), self.out(h)

            (h, c), ys = torchscan.scan(step, (h, c), xs)
            return h, ys

    model = Model().to(device).eval()
    args = (torch.zeros(B, H, device=device), torch.zeros(B, H, device=device))
    time = torch.export.Dim("time")
    program = onnx_export(
        model, (*args, torch.randn(T, B, H, device=device)),
        dynamic_shapes=(None, None, {0: time}), dynamo=True,
    )  # fmt: skip
    proto = program.model_proto
    assert [node.op_type for node in proto.graph.node].count("Scan") == 1
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    xs = torch.randn(2 * T + 1, B, H, device=device)
    names = [i.name for i in sess.get_inputs()]
    got = sess.run(None, dict(zip(names, (t.cpu().numpy() for t in (*args, xs)), strict=True)))
    with torch.no_grad():
        want = model(*args, xs)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w.cpu().numpy(), rtol=1e-5, atol=1e-5)
