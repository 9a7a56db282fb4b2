"""Stacked bidirectional LSTM and GRU from cells, batch first, with length masks, against
``torch.nn.LSTM``/``GRU`` on ``pack_padded_sequence``; and the layer-norm LSTM of PyTorch's
``benchmarks/fastrnns/custom_lstms.py``."""

from ._harness import *  # noqa: F403

NAMES = ["lstm-bi-stacked-packed", "gru-bi-stacked-packed", "layernorm-lstm-bi-stacked"]
