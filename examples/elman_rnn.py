"""An Elman RNN written with ``torchscan.scan``, checked against ``torch.nn.RNN`` and trained.

Run it with ``python examples/elman_rnn.py``.
"""

from __future__ import annotations

import torch

import torchscan


class ElmanRNN(torch.nn.Module):
    """``h[t] = tanh(x[t] @ W_ih.T + b_ih + h[t-1] @ W_hh.T + b_hh)`` over a batch-first input."""

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
    torch.manual_seed(0)
    batch, time, features, hidden = 16, 20, 3, 32
    model = ElmanRNN(features, hidden, 1)

    # The same weights in torch's fused RNN give the same hidden states.
    reference = torch.nn.RNN(features, hidden, batch_first=True)
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(reference, f"{name}_l0").copy_(getattr(model.cell, name))
    xs, h0 = torch.randn(batch, time, features), torch.zeros(batch, hidden)
    _, h_last = model(xs, h0)
    _, h_reference = reference(xs, h0[None])
    torch.testing.assert_close(h_last, h_reference[0])
    print("scan matches torch.nn.RNN:", tuple(h_last.shape))

    # Learn the running sum of the first feature, one output per step.
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(201):
        xs = torch.randn(batch, time, features)
        target = xs[..., :1].cumsum(dim=1) / time**0.5
        prediction, _ = model(xs, h0)
        loss = torch.nn.functional.mse_loss(prediction, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
