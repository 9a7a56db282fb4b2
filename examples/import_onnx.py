"""Import an ONNX model with a Scan as a PyTorch module, fine-tune it, and export it again.

An Elman RNN written with ``torchscan.scan`` is exported to ONNX (one ``Scan`` node), imported
back with ``torchscan.onnx.to_torch``, checked against the original at another length, trained
a few steps (its initializers are parameters), and exported again: still one ``Scan``, which
onnxruntime runs at any length, and which ``torchscan check`` compares across onnxruntime, onnx's
reference evaluator and the module imported from it.
"""

from __future__ import annotations

import onnxruntime as ort
import torch

import torchscan
import torchscan.onnx


class Elman(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.RNNCell(3, 8)

    def forward(self, xs: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torchscan.scan(lambda h, x: (self.cell(x, h),) * 2, h, xs)


def scans(model) -> int:
    return sum(node.op_type == "Scan" for node in model.graph.node)


torch.manual_seed(0)
original = Elman().eval()
xs, h = torch.randn(5, 4, 3), torch.zeros(4, 8)
time = torch.export.Dim("T", min=1)
exported = torch.onnx.export(
    original, (xs, h), dynamo=True, dynamic_shapes=({0: time}, None), verbose=False
).model_proto
print(f"exported: {scans(exported)} Scan node(s)")

module = torchscan.onnx.to_torch(exported)
longer = torch.randn(12, 4, 3)
difference = (module(longer, h)[1] - original(longer, h)[1]).abs().max().item()
print(f"imported, at length 12: largest difference to the original {difference:.1e}")
assert difference < 1e-5

optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
target = torch.randn(12, 4, 8).tanh()
for step in range(3):
    loss = (module(longer, h)[1] - target).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"fine-tuning step {step}: loss {loss.item():.4f}")

again = torch.onnx.export(
    module.eval(), (xs, h), dynamo=True, dynamic_shapes=({0: time}, None), verbose=False
).model_proto
print(f"exported again: {scans(again)} Scan node(s)")
assert scans(again) == 1
session = ort.InferenceSession(again.SerializeToString(), providers=["CPUExecutionProvider"])
names = [i.name for i in session.get_inputs()]
ys = session.run(None, dict(zip(names, [longer.numpy(), h.numpy()], strict=True)))[1]
with torch.no_grad():
    difference = (torch.from_numpy(ys) - module(longer, h)[1]).abs().max().item()
print(f"onnxruntime at length 12: largest difference to the fine-tuned module {difference:.1e}")
assert difference < 1e-5

# torchscan check runs the imported module as a runtime of its own ("imported"), next to
# onnxruntime and onnx's reference evaluator, on the model exported again.
report = torchscan.onnx.check(again, inputs=[longer.numpy(), h.numpy()])
print(report.summary())
assert report.ok
assert {c.source: c.status for c in report.comparisons}["imported"] == "ok"
