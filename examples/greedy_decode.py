"""A small decoder that emits tokens until an end token or a length cap, exported to ONNX.

The decoder is trained (with ``torchscan.scan`` over the target sequence) to count down: after
token ``t`` comes ``t - 1``, and ``0`` is the end token. Greedy decoding is a ``torchscan.loop``
that stops with ``torchscan.until`` once the end token comes out, at most ``max_len`` times. The
loop exports to one ONNX ``Loop`` node, whose trip count and stop are read at run time, and
onnxruntime emits the same tokens as PyTorch.

Run it with ``python examples/greedy_decode.py``.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

import torchscan

VOCAB, EMBED, HIDDEN, END = 10, 16, 32, 0


class Decoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, EMBED)
        self.cell = torch.nn.GRUCell(EMBED, HIDDEN)
        self.out = torch.nn.Linear(HIDDEN, VOCAB)

    def step(self, h: torch.Tensor, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.cell(self.embed(token), h)
        return h, self.out(h)

    def teacher_forced(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits for every next token of ``tokens`` (batch, time), as a scan over time."""
        h0 = torch.zeros(tokens.shape[0], HIDDEN)
        _, logits = torchscan.scan(self.step, h0, tokens, axis=1)
        return logits


class GreedyDecode(torch.nn.Module):
    """Tokens after ``start``, each the most likely after the one before, up to and including
    the end token, at most ``max_len`` of them."""

    def __init__(self, decoder: Decoder) -> None:
        super().__init__()
        self.decoder = decoder

    def forward(self, start: torch.Tensor, max_len: torch.Tensor) -> torch.Tensor:
        def body(i, carry):
            h, token = carry
            h, logits = self.decoder.step(h, token)
            token = logits.argmax(-1)
            return (h, token), token[0], torchscan.until(token[0] == END)

        init = (torch.zeros(1, HIDDEN), start.reshape(1))
        _, tokens = torchscan.loop(body, init, trip_count=max_len)
        return tokens


def countdowns(batch: int, length: int) -> torch.Tensor:
    starts = torch.randint(1, VOCAB, (batch, 1))
    return (starts - torch.arange(length)).clamp(min=END)


def train(decoder: Decoder, steps: int = 300) -> float:
    optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-2)
    for _ in range(steps):
        tokens = countdowns(32, 12)
        logits = decoder.teacher_forced(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


def export(model: GreedyDecode, path: Path) -> onnx.ModelProto:
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, (torch.tensor(3), torch.tensor(20)), path, dynamo=True, verbose=False
        )
    return onnx.load(path)


def main() -> None:
    torch.manual_seed(0)
    decoder = Decoder()
    print(f"trained to count down, final loss {train(decoder):.4f}")
    model = GreedyDecode(decoder).eval()

    with tempfile.TemporaryDirectory() as tmp:
        onnx_model = export(model, Path(tmp) / "greedy_decode.onnx")
    onnx.checker.check_model(onnx_model, full_check=True)
    loops = [node for node in onnx_model.graph.node if node.op_type == "Loop"]
    print(f"exported: {len(loops)} Loop node, {len(onnx_model.graph.node)} nodes in the graph")

    session = ort.InferenceSession(onnx_model.SerializeToString())
    names = [i.name for i in session.get_inputs()]
    for start, max_len in [(7, 20), (3, 20), (9, 4), (1, 20)]:
        with torch.no_grad():
            eager = model(torch.tensor(start), torch.tensor(max_len)).tolist()
        feeds = dict(zip(names, [np.array(start), np.array(max_len)], strict=True))
        exported = session.run(None, feeds)[0].tolist()
        assert exported == eager, (start, max_len, eager, exported)
        print(f"start {start}, at most {max_len:2d}: {eager} (onnxruntime: the same)")


if __name__ == "__main__":
    main()
