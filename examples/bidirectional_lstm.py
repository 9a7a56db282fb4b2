"""A bidirectional LSTM layer written with ``torchscan.scan``, checked against ``torch.nn.LSTM``,
then run over a batch of padded sequences and exported to ONNX.

Run it with ``python examples/bidirectional_lstm.py``.
"""

from __future__ import annotations

import logging
import warnings

import onnxruntime as ort
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import torchscan

State = tuple[torch.Tensor, torch.Tensor]  # (h, c) of a batch


class BidirectionalLSTM(torch.nn.Module):
    """One bidirectional LSTM layer over a (T, B, F) input: two ``LSTMCell``, one per direction."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.cell_f = torch.nn.LSTMCell(input_size, hidden_size)  # reads t = 0, 1, ..., T-1
        self.cell_b = torch.nn.LSTMCell(input_size, hidden_size)  # reads t = T-1, ..., 1, 0

    def copy_from(self, lstm: torch.nn.LSTM) -> None:
        """Take the weights of ``torch.nn.LSTM(bidirectional=True)``: its layer 0 and the
        ``_reverse`` parameters of its backward direction."""
        with torch.no_grad():
            for cell, suffix in ((self.cell_f, "l0"), (self.cell_b, "l0_reverse")):
                for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                    getattr(cell, name).copy_(getattr(lstm, f"{name}_{suffix}"))

    def zeros(self, xs: torch.Tensor) -> State:
        h = xs.new_zeros(xs.shape[1], self.hidden_size)
        return h, h

    def forward(self, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both directions in ONE scan: the backward direction reads ``xs`` from its end
        (``in_reverse``) and puts its outputs back in the order of ``xs`` (``out_reverse``)."""

        def step(carry: tuple[State, State], x: tuple[torch.Tensor, torch.Tensor]) -> tuple:
            (f, b), (x_f, x_b) = carry, x
            f, b = self.cell_f(x_f, f), self.cell_b(x_b, b)
            return (f, b), (f[0], b[0])

        (f, b), (ys_f, ys_b) = torchscan.scan(
            step,
            (self.zeros(xs), self.zeros(xs)),
            (xs, xs),
            in_reverse=(False, True),
            out_reverse=(False, True),
        )
        return torch.cat([ys_f, ys_b], -1), torch.stack([f[0], b[0]])


class PaddedBidirectionalLSTM(BidirectionalLSTM):
    """The same layer over padded sequences: example ``b`` is ``xs[:lengths[b], b]``."""

    def forward(self, xs: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Two scans, as every sequence of a scan with ``lengths`` runs in the same direction;
        the backward one starts each example at its own last position, ``lengths[b] - 1``."""

        def step_f(state: State, x: torch.Tensor) -> tuple[State, torch.Tensor]:
            state = self.cell_f(x, state)
            return state, state[0]

        def step_b(state: State, x: torch.Tensor) -> tuple[State, torch.Tensor]:
            state = self.cell_b(x, state)
            return state, state[0]

        (h_f, _), ys_f = torchscan.scan(step_f, self.zeros(xs), xs, lengths=lengths)
        (h_b, _), ys_b = torchscan.scan(step_b, self.zeros(xs), xs, lengths=lengths, reverse=True)
        return torch.cat([ys_f, ys_b], -1), torch.stack([h_f, h_b])


def main() -> None:
    torch.manual_seed(0)
    time, batch, features, hidden = 12, 5, 3, 8
    reference = torch.nn.LSTM(features, hidden, bidirectional=True)

    # 1. One scan for both directions gives the outputs and final states of torch.nn.LSTM.
    model = BidirectionalLSTM(features, hidden)
    model.copy_from(reference)
    xs = torch.randn(time, batch, features)
    with torch.no_grad():
        ys, h_n = model(xs)
        ys_reference, (h_n_reference, _) = reference(xs)
    torch.testing.assert_close(ys, ys_reference)
    torch.testing.assert_close(h_n, h_n_reference)
    print("one scan matches torch.nn.LSTM(bidirectional=True):", tuple(ys.shape))

    # 2. Padded sequences: the same as torch.nn.LSTM on a PackedSequence, whose final states are
    # those at each example's own last step, and whose padded outputs are zeros.
    padded = PaddedBidirectionalLSTM(features, hidden)
    padded.copy_from(reference)
    lengths = torch.tensor([time, 7, 1, 4, 10])
    with torch.no_grad():
        ys, h_n = padded(xs, lengths)
        packed = pack_padded_sequence(xs, lengths, enforce_sorted=False)
        packed_ys, (h_n_reference, _) = reference(packed)
    ys_reference, _ = pad_packed_sequence(packed_ys, total_length=time)
    torch.testing.assert_close(ys, ys_reference)
    torch.testing.assert_close(h_n, h_n_reference)
    print("two scans with lengths match torch.nn.LSTM on a PackedSequence:", lengths.tolist())

    # 3. Export with a dynamic length and batch, lengths an input of the model, and run it in
    # onnxruntime on other sizes, an empty sequence and a full one among them.
    time_dim, batch_dim = torch.export.Dim("T", min=2), torch.export.Dim("B", min=2)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        # xs and lengths share their batch axis, which torch.onnx names once; torch.export
        # copies its own tree specs with an API that torch deprecates.
        warnings.filterwarnings("ignore", message=r"# The axis name: .* will not be used")
        warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)`")
        program = torch.onnx.export(
            padded.eval(),
            (xs, lengths),
            dynamo=True,
            opset_version=18,
            dynamic_shapes=({0: time_dim, 1: batch_dim}, {0: batch_dim}),
            verbose=False,
        )
    scans = [node.op_type for node in program.model_proto.graph.node].count("Scan")
    print(f"exported with {scans} ONNX Scan nodes, one per direction")
    session = ort.InferenceSession(
        program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    xs = torch.randn(20, 7, features)
    lengths = torch.tensor([20, 0, 3, 19, 1, 8, 20])
    with torch.no_grad():
        want = padded(xs, lengths)
    got = session.run(None, {"xs": xs.numpy(), "lengths": lengths.numpy()})
    difference = max(abs(g - w.numpy()).max() for g, w in zip(got, want, strict=True))
    print(f"onnxruntime, T=20, B=7, lengths {lengths.tolist()}: max difference {difference:.1e}")
    assert difference < 1e-5


if __name__ == "__main__":
    main()
