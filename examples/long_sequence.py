"""Training on a sequence too long for autograd's memory: ``scan(..., checkpoint="sqrt")``.

A gated linear recurrence (a diagonal state-space layer, as in LRU or Mamba-like models) with
4,096 channels reads a batch of 32 signals of 16,000 steps and learns to predict a slow average of
its input. Autograd would keep what every step saves for the backward pass: this script measures
it over a short run and scales it to the whole sequence (2 MiB a step, 31 GiB in all), more than
the 24 GiB of the 2-core machine it is sized for. With ``checkpoint="sqrt"`` the forward pass
keeps a carry every 127 steps, and the backward pass runs each segment again: the process
peaks under 2 GiB. A training step takes about 50 seconds on two cores.

    python examples/long_sequence.py            # the full size
    python examples/long_sequence.py --T 2000   # a quick run
"""

from __future__ import annotations

import argparse
import math
import resource
import time

import torch

import torchscan


class GatedLinearRecurrence(torch.nn.Module):
    """``h = a * h + (1 - a) * tanh(u) * sigmoid(g)``, with ``u, g`` linear in the input and a
    learned decay ``a`` per channel; a linear readout of ``h`` at every step."""

    def __init__(self, inputs: int, channels: int) -> None:
        super().__init__()
        self.project = torch.nn.Linear(inputs, 2 * channels)
        # decays from 0.9 to 0.999: memories of 10 to 1,000 steps
        self.decay_logit = torch.nn.Parameter(torch.linspace(2.2, 6.9, channels))
        self.readout = torch.nn.Linear(channels, 1)

    def forward(self, xs: torch.Tensor, checkpoint: str | None = "sqrt") -> torch.Tensor:
        a = torch.sigmoid(self.decay_logit)

        def step(h: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            u, g = self.project(x).chunk(2, -1)
            h = a * h + (1 - a) * torch.tanh(u) * torch.sigmoid(g)
            return h, self.readout(h).squeeze(-1)

        h0 = xs.new_zeros(xs.shape[1], self.decay_logit.shape[0])
        _, ys = torchscan.scan(step, h0, xs, checkpoint=checkpoint)
        return ys


def saved_bytes_per_step(model: GatedLinearRecurrence, xs: torch.Tensor) -> float:
    """What autograd keeps for the backward pass per step without checkpointing: the bytes of
    the tensors the forward pass saves (``saved_tensors_hooks``), parameters and inputs left
    out, over the first 100 steps."""
    seen: dict[int, int] = {}
    known = {p.untyped_storage().data_ptr() for p in model.parameters()}
    known.add(xs.untyped_storage().data_ptr())

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in known:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    steps = min(100, xs.shape[0])
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(xs[:steps], checkpoint=None)
    return sum(seen.values()) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=16_000, help="steps of the sequence")
    parser.add_argument("--B", type=int, default=32, help="signals in the batch")
    parser.add_argument("--channels", type=int, default=4096)
    parser.add_argument("--train-steps", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)

    model = GatedLinearRecurrence(16, args.channels)
    xs = torch.randn(args.T, args.B, 16)
    # the target: an average of the first input feature over the last 500 steps
    kernel = torch.full((1, 1, 500), 1 / 500)
    signal = xs[:, :, 0].T.unsqueeze(1)
    target = torch.nn.functional.conv1d(torch.nn.functional.pad(signal, (499, 0)), kernel)
    target = target.squeeze(1).T

    per_step = saved_bytes_per_step(model, xs)
    memory = 2**30
    print(
        f"without checkpointing, the forward pass would keep {per_step / 2**20:.2f} MiB per "
        f"step: {per_step * args.T / memory:.1f} GiB over {args.T} steps"
    )
    segment = math.isqrt(args.T - 1) + 1
    print(f'checkpoint="sqrt": a carry kept every {segment} steps')

    optimizer = torch.optim.Adam(model.parameters(), lr=2e-5)
    for number in range(args.train_steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xs), target)
        loss.backward()
        optimizer.step()
        print(f"step {number}: loss {loss.item():.5f} ({time.perf_counter() - start:.1f} s)")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux
    print(f"peak memory of the process: {peak / memory:.2f} GiB")

    # the gradients are those of the scan without checkpointing (checked on a short piece)
    piece = xs[:300]
    grads = [
        torch.autograd.grad(model(piece, checkpoint=c).square().sum(), model.decay_logit)[0]
        for c in ("sqrt", None)
    ]
    torch.testing.assert_close(grads[0], grads[1])
    print("gradients with and without checkpointing agree")


if __name__ == "__main__":
    main()
