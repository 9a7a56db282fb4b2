"""An RNN written once with ``torchscan.scan``: trained eagerly, exported to ONNX with a dynamic
length, run in onnxruntime at another length, and checked.

Run it with ``python examples/elman_rnn.py`` (about half a minute on two cores). Each step
prints what it found:

1. the scan computes what ``torch.nn.RNN`` computes with the same weights;
2. a few steps of training (autograd through the scan);
3. ``torch.onnx.export`` with a dynamic sequence length gives one ONNX ``Scan`` node;
4. onnxruntime runs that model at a length it was not exported with, and agrees with eager;
5. ``torchscan.onnx.check`` (``torchscan check model.onnx`` on the command line) lints the
   ``Scan`` node and compares onnxruntime, onnx's reference evaluator and PyTorch.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import torch

import torchscan


class ElmanRNN(torch.nn.Module):
    """``h[t] = tanh(x[t] @ W_ih.T + b_ih + h[t-1] @ W_hh.T + b_hh)`` over a batch-first input,
    and a linear readout of every ``h[t]``."""

    def __init__(self, input_size: int, hidden_size: int, output_size: int) -> None:
        super().__init__()
        self.cell = torch.nn.RNNCell(input_size, hidden_size)
        self.readout = torch.nn.Linear(hidden_size, output_size)

    def forward(self, xs: torch.Tensor, h0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def step(h, x):
            h = self.cell(x, h)
            return h, h  # the new state is both the carry and this step's output

        h_last, hs = torchscan.scan(step, h0, xs, axis=1)  # scan over time, axis 1
        return self.readout(hs), h_last


def main() -> None:
    # torch.export's deep copy of its own tree specs warns in torch 2.13, whatever the model
    warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)`", FutureWarning)
    torch.manual_seed(0)
    batch, time, features, hidden = 16, 20, 3, 32
    model = ElmanRNN(features, hidden, 1)
    h0 = torch.zeros(batch, hidden)

    print("1. scan against torch.nn.RNN with the same weights")
    reference = torch.nn.RNN(features, hidden, batch_first=True)
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(reference, f"{name}_l0").copy_(getattr(model.cell, name))
    xs = torch.randn(batch, time, features)
    _, h_last = model(xs, h0)
    _, h_reference = reference(xs, h0[None])
    torch.testing.assert_close(h_last, h_reference[0])
    print(f"   same last state {tuple(h_last.shape)}: ok")

    print("2. training: learn the running sum of the first feature")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(61):
        xs = torch.randn(batch, time, features)
        target = xs[..., :1].cumsum(dim=1) / time**0.5
        prediction, _ = model(xs, h0)
        loss = torch.nn.functional.mse_loss(prediction, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 20 == 0:
            print(f"   step {step:3d}  loss {loss.item():.4f}")

    print("3. torch.onnx.export with a dynamic length")
    model.eval()
    length = torch.export.Dim("time", min=1)
    path = Path(tempfile.mkdtemp()) / "elman_rnn.onnx"
    program = torch.onnx.export(
        model,
        (xs, h0),
        str(path),
        dynamo=True,
        dynamic_shapes=({1: length}, None),
        input_names=["xs", "h0"],
        output_names=["ys", "h_last"],
        verbose=False,
    )
    ops = [node.op_type for node in program.model_proto.graph.node]
    print(f"   {path.name}: {ops.count('Scan')} Scan node, {len(ops)} nodes in all: ok")
    assert ops.count("Scan") == 1

    print("4. onnxruntime at length 57 (exported at 20) against eager")
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    longer = torch.randn(batch, 57, features)
    ys, last = session.run(None, {"xs": longer.numpy(), "h0": h0.numpy()})
    with torch.no_grad():
        eager_ys, eager_last = model(longer, h0)
    torch.testing.assert_close(torch.from_numpy(ys), eager_ys, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.from_numpy(last), eager_last, rtol=1e-5, atol=1e-5)
    print(f"   ys {ys.shape}, largest difference {abs(ys - eager_ys.numpy()).max():.1e}: ok")

    print("5. torchscan check: lint, then onnxruntime, reference evaluator and PyTorch compared")
    import torchscan.onnx

    report = torchscan.onnx.check(
        path, inputs=[longer.numpy(), h0.numpy()], module=model, args=(longer, h0)
    )
    print("   " + report.summary().replace("\n", "\n   "))
    assert report.verdict == "ok", report.verdict


if __name__ == "__main__":
    main()
