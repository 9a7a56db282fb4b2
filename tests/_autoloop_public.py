# ruff: noqa  (the loops and their helpers are kept as their authors write them)
"""Loops as the authors of public PyTorch code write them (CRFs, QRNN/SRU/IndRNN cells, seq2seq
decoders, ODE solvers, samplers, filters, iterative solvers, dynamic programming), each kept in
its authors' style rather than the style ``torchscan.autoloop`` prefers: what it makes of each
(``converts``, or the words of the reason its report gives) measures which real styles convert.
The same :class:`Program` as ``tests/_autoloop_corpus.py``."""

from __future__ import annotations

import math
import random
from typing import List, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._autoloop_corpus import Program

B, H, D = 2, 6, 3  # batch, hidden, features
TAGS, VOCAB = 4, 5


def _gen(n: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + n)


def _unit_init(module: nn.Module, seed: int) -> None:
    """weights of unit scale, as a trained decoder's are: at PyTorch's default initialisation
    greedy decoding emits one token forever (and never or always stops)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g))


def _seq(n: int, *tail: int, batch_first: bool = False) -> Tensor:
    shape = (B, n, *tail) if batch_first else (n, B, *tail)
    return torch.randn(shape, generator=_gen(n))


# -- pytorch-crf (kmkurn/pytorch-crf) ----------------------------------------------------------


class _CRF(nn.Module):
    def __init__(self, num_tags: int = TAGS, batch_first: bool = False) -> None:
        if num_tags <= 0:
            raise ValueError(f"invalid number of tags: {num_tags}")
        super().__init__()
        self.num_tags = num_tags
        self.batch_first = batch_first
        self.start_transitions = nn.Parameter(torch.empty(num_tags))
        self.end_transitions = nn.Parameter(torch.empty(num_tags))
        self.transitions = nn.Parameter(torch.empty(num_tags, num_tags))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.uniform_(self.start_transitions, -0.1, 0.1)
        nn.init.uniform_(self.end_transitions, -0.1, 0.1)
        nn.init.uniform_(self.transitions, -0.1, 0.1)


class CRFLogLikelihood(_CRF):
    """pytorch-crf's forward: _compute_score (`score +=` along the tags) minus
    _compute_normalizer (range(1, seq_length), torch.where on the mask)."""

    def forward(self, emissions: Tensor, tags: Tensor, mask: Tensor) -> Tensor:
        if self.batch_first:
            emissions = emissions.transpose(0, 1)
            tags = tags.transpose(0, 1)
            mask = mask.transpose(0, 1)
        numerator = self._compute_score(emissions, tags, mask)
        denominator = self._compute_normalizer(emissions, mask)
        llh = numerator - denominator
        return llh.sum()

    def _compute_score(self, emissions: Tensor, tags: Tensor, mask: Tensor) -> Tensor:
        # emissions: (seq_length, batch_size, num_tags)
        # tags: (seq_length, batch_size)
        # mask: (seq_length, batch_size)
        assert emissions.dim() == 3 and tags.dim() == 2
        assert emissions.shape[:2] == tags.shape
        assert emissions.size(2) == self.num_tags
        assert mask.shape == tags.shape

        seq_length, batch_size = tags.shape
        mask = mask.type_as(emissions)

        # Start transition score and first emission
        # shape: (batch_size,)
        score = self.start_transitions[tags[0]]
        score += emissions[0, torch.arange(batch_size), tags[0]]

        for i in range(1, seq_length):
            # Transition score to next tag, only added if next timestep is valid (mask == 1)
            # shape: (batch_size,)
            score += self.transitions[tags[i - 1], tags[i]] * mask[i]

            # Emission score for next tag, only added if next timestep is valid (mask == 1)
            # shape: (batch_size,)
            score += emissions[i, torch.arange(batch_size), tags[i]] * mask[i]

        # End transition score
        # shape: (batch_size,)
        seq_ends = mask.long().sum(dim=0) - 1
        # shape: (batch_size,)
        last_tags = tags[seq_ends, torch.arange(batch_size)]
        # shape: (batch_size,)
        score += self.end_transitions[last_tags]

        return score

    def _compute_normalizer(self, emissions: Tensor, mask: Tensor) -> Tensor:
        # emissions: (seq_length, batch_size, num_tags)
        # mask: (seq_length, batch_size)
        assert emissions.dim() == 3 and mask.dim() == 2
        assert emissions.shape[:2] == mask.shape
        assert emissions.size(2) == self.num_tags

        seq_length = emissions.size(0)

        # Start transition score and first emission; score has size of
        # (batch_size, num_tags) where for each batch, the j-th column stores
        # the score that the first timestep has tag j
        # shape: (batch_size, num_tags)
        score = self.start_transitions + emissions[0]

        for i in range(1, seq_length):
            # Broadcast score for every possible next tag
            # shape: (batch_size, num_tags, 1)
            broadcast_score = score.unsqueeze(2)

            # Broadcast emission score for every possible current tag
            # shape: (batch_size, 1, num_tags)
            broadcast_emissions = emissions[i].unsqueeze(1)

            # Compute the score tensor of size (batch_size, num_tags, num_tags) where
            # for each sample, entry at row i and column j stores the sum of scores of all
            # possible tag sequences so far that end with transitioning from tag i to tag j
            # and emitting
            # shape: (batch_size, num_tags, num_tags)
            next_score = broadcast_score + self.transitions + broadcast_emissions

            # Sum over all possible current tags, but we're in score space, so a sum
            # becomes a log-sum-exp: for each sample, entry i stores the sum of scores of
            # all possible tag sequences so far, that end in tag i
            # shape: (batch_size, num_tags)
            next_score = torch.logsumexp(next_score, dim=1)

            # Set score to the next score if this timestep is valid (mask == 1)
            # shape: (batch_size, num_tags)
            score = torch.where(mask[i].unsqueeze(1), next_score, score)

        # End transition score
        # shape: (batch_size, num_tags)
        score += self.end_transitions

        # Sum (log-sum-exp) over all possible tags
        # shape: (batch_size,)
        return torch.logsumexp(score, dim=1)


class CRFNormalizer(_CRF):
    """pytorch-crf's _compute_normalizer alone: the forward algorithm, range(1, seq_length),
    torch.where on the mask, `score +=` after the loop."""

    forward = CRFLogLikelihood._compute_normalizer


class CRFViterbi(_CRF):
    """pytorch-crf's _viterbi_decode: history.append(indices), then a Python backtrace per
    batch item over reversed(history[:seq_ends[idx]]) with .item()."""

    def forward(self, emissions: Tensor, mask: Tensor) -> List[List[int]]:
        return self._viterbi_decode(emissions, mask)

    def _viterbi_decode(
        self, emissions: torch.FloatTensor, mask: torch.ByteTensor
    ) -> List[List[int]]:
        # emissions: (seq_length, batch_size, num_tags)
        # mask: (seq_length, batch_size)
        assert emissions.dim() == 3 and mask.dim() == 2
        assert emissions.shape[:2] == mask.shape
        assert emissions.size(2) == self.num_tags

        seq_length, batch_size = mask.shape

        # Start transition and first emission
        # shape: (batch_size, num_tags)
        score = self.start_transitions + emissions[0]
        history = []

        # score is a tensor of size (batch_size, num_tags) where for every batch,
        # value at column j stores the score of the best tag sequence so far that ends
        # with tag j
        # history saves where the best tags candidate transitioned from; this is used
        # when we trace back the best tag sequence

        # Viterbi algorithm recursive case: we compute the score of the best tag sequence
        # for every possible next tag
        for i in range(1, seq_length):
            # Broadcast viterbi score for every possible next tag
            # shape: (batch_size, num_tags, 1)
            broadcast_score = score.unsqueeze(2)

            # Broadcast emission score for every possible current tag
            # shape: (batch_size, 1, num_tags)
            broadcast_emission = emissions[i].unsqueeze(1)

            # Compute the score tensor of size (batch_size, num_tags, num_tags) where
            # for each sample, entry at row i and column j stores the score of the best
            # tag sequence so far that ends with transitioning from tag i to tag j and emitting
            # shape: (batch_size, num_tags, num_tags)
            next_score = broadcast_score + self.transitions + broadcast_emission

            # Find the maximum score over all possible current tag
            # shape: (batch_size, num_tags)
            next_score, indices = next_score.max(dim=1)

            # Set score to the next score if this timestep is valid (mask == 1)
            # and save the index that produces the next score
            # shape: (batch_size, num_tags)
            score = torch.where(mask[i].unsqueeze(1), next_score, score)
            history.append(indices)

        # End transition score
        # shape: (batch_size, num_tags)
        score += self.end_transitions

        # Now, compute the best path for each sample

        # shape: (batch_size,)
        seq_ends = mask.long().sum(dim=0) - 1
        best_tags_list = []

        for idx in range(batch_size):
            # Find the tag which maximizes the score at the last timestep; this is our best tag
            # for the last timestep
            _, best_last_tag = score[idx].max(dim=0)
            best_tags = [best_last_tag.item()]

            # We trace back where the best last tag comes from, append that to our best tag
            # sequence, and trace it back again, and so on
            for hist in reversed(history[: seq_ends[idx]]):
                best_last_tag = hist[idx][best_tags[-1]]
                best_tags.append(best_last_tag.item())

            # Reverse the order because we start from the last timestep
            best_tags.reverse()
            best_tags_list.append(best_tags)

        return best_tags_list


def _crf_inputs(n: int, with_tags: bool = False) -> tuple[Tensor, ...]:
    g = _gen(n)
    length = n + 1  # pytorch-crf requires the first timestep on for every sequence
    emissions = torch.randn(length, B, TAGS, generator=g)
    mask = torch.ones(length, B, dtype=torch.bool)
    mask[length // 2 + 1 :, 1] = False  # the second sequence is shorter
    if not with_tags:
        return emissions, mask
    tags = torch.randint(TAGS, (length, B), generator=g)
    return emissions, tags, mask


# -- QRNN, SRU, IndRNN, custom LSTMs, mLSTM -----------------------------------------------------


class CPUForgetMult(nn.Module):
    """salesforce/pytorch-qrnn's CPUForgetMult: enumerate((f * x).split(1, dim=0)), forgets[i],
    `if prev_h is not None` in the step, h.view(h.size()[1:]), append then stack."""

    def forward(self, f: Tensor, x: Tensor, hidden_init: Tensor | None = None) -> Tensor:
        result = []
        ###
        forgets = f.split(1, dim=0)
        prev_h = hidden_init
        for i, h in enumerate((f * x).split(1, dim=0)):
            if prev_h is not None:
                h = h + (1 - forgets[i]) * prev_h
            # h is (1, batch, hidden) when it needs to be (batch_hidden)
            # Calling squeeze will result in badness if batch size is 1
            h = h.view(h.size()[1:])
            result.append(h)
            prev_h = h
        ###
        return torch.stack(result)


class FastaiForgetMult(nn.Module):
    """fastai's forget_mult (the CPU/script fallback): result = torch.empty_like(x) written at
    result[i], `i = x.size(0) - 1 - i` when backward, a conditional expression on None."""

    def __init__(self, batch_first: bool = True, backward: bool = False) -> None:
        super().__init__()
        self.batch_first, self.backward = batch_first, backward

    def forward(self, x: Tensor, f: Tensor, hidden_init: Tensor | None = None) -> Tensor:
        batch_first, backward = self.batch_first, self.backward
        if batch_first:
            x = x.transpose(0, 1)
            f = f.transpose(0, 1)
        result = torch.empty_like(x)
        prev_h = hidden_init
        for i in range(x.size(0)):
            if backward:
                i = x.size(0) - 1 - i
            prev_h = x[i] * f[i] if prev_h is None else x[i] * f[i] + (1 - f[i]) * prev_h
            result[i] = prev_h
        if batch_first:
            result = result.transpose(0, 1)
        return result


class SRUComputeCPU(nn.Module):
    """taolei87/sru's CPU reference (SRU_Compute_CPU): a buffer h written at h[t, :, di, :],
    time_seq = range(length) or range(length - 1, -1, -1) per direction, a Python activation
    switch in the step, c_t read after the loop."""

    def __init__(self, d: int = H, bidirectional: bool = True) -> None:
        super().__init__()
        self.d_out = d
        self.bidirectional = bidirectional
        self.activation_type = 1
        bidir = 2 if bidirectional else 1
        self.weight = nn.Parameter(torch.randn(D, bidir * d * 4) / d)  # input size != d: k == 4
        self.bias = nn.Parameter(torch.zeros(2 * bidir * d))

    def forward(self, x: Tensor, init: Tensor | None = None) -> tuple[Tensor, Tensor]:
        u = x.reshape(-1, x.size(-1)).mm(self.weight)
        return self.sru_compute_cpu(u, x, self.bias, init)

    def sru_compute_cpu(
        self, u: Tensor, x: Tensor, bias: Tensor, init: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        bidir = 2 if self.bidirectional else 1
        length = x.size(0) if x.dim() == 3 else 1
        batch = x.size(-2)
        d = self.d_out
        k = u.size(-1) // d // bidir

        u = u.view(length, batch, bidir, d, k)

        x_tilde = u[..., 0]

        forget_bias, reset_bias = bias.view(2, bidir, d)
        forget = (u[..., 1] + forget_bias).sigmoid()
        reset = (u[..., 2] + reset_bias).sigmoid()

        x_prime = x.view(length, batch, bidir, d) if k == 3 else u[..., 3]

        h = x.new_zeros(length, batch, bidir, d)

        c_init = x.new_zeros(batch, bidir, d) if init is None else init.view(batch, bidir, d)

        c_final = []
        for di in range(bidir):
            time_seq = range(length) if di == 0 else range(length - 1, -1, -1)

            c_prev = c_init[:, di, :]
            for t in time_seq:
                c_t = (c_prev - x_tilde[t, :, di, :]) * forget[t, :, di, :] + x_tilde[t, :, di, :]
                c_prev = c_t

                if self.activation_type == 0:
                    g_c_t = c_t
                elif self.activation_type == 1:
                    g_c_t = c_t.tanh()
                else:
                    g_c_t = F.relu(c_t)

                h[t, :, di, :] = (g_c_t - x_prime[t, :, di, :]) * reset[t, :, di, :] + x_prime[
                    t, :, di, :
                ]

            c_final.append(c_t)

        return h.view(length, batch, -1), torch.stack(c_final, dim=1).view(batch, -1)


class IndRNNCell(nn.Module):
    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight_ih = nn.Parameter(torch.randn(hidden_size, input_size) / input_size)
        self.weight_hh = nn.Parameter(torch.rand(hidden_size))
        self.bias_ih = nn.Parameter(torch.zeros(hidden_size))
        self.activation = F.relu

    def forward(self, input: Tensor, hx: Tensor) -> Tensor:
        return self.activation(
            F.linear(input, self.weight_ih, self.bias_ih) + torch.mul(self.weight_hh, hx)
        )


class IndRNN(nn.Module):
    """StefOe/indrnn-pytorch's IndRNN: layers of a ModuleList, lst_inputs = torch.unbind(x),
    seq_len = len(lst_inputs), lst_inputs[t], outputs += [hx], hiddens.append(hx)."""

    def __init__(self, input_size: int = D, hidden_size: int = H, n_layer: int = 2) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.n_layer = n_layer
        self.cells = nn.ModuleList(
            IndRNNCell(input_size if i == 0 else hidden_size, hidden_size) for i in range(n_layer)
        )

    def forward(self, x: Tensor, hidden: Tensor | None = None) -> tuple[Tensor, Tensor]:
        batch_size = x.size(1)
        if hidden is None:
            hidden = x.new_zeros(self.n_layer, batch_size, self.hidden_size)
        hiddens = []
        for i, cell in enumerate(self.cells):
            hx = hidden[i]
            outputs = []
            lst_inputs = torch.unbind(x)
            seq_len = len(lst_inputs)
            for t in range(seq_len):
                hx = cell(lst_inputs[t], hx)
                outputs += [hx]
            x = torch.stack(outputs, 0)
            hiddens.append(hx)
        return x, torch.cat(hiddens, -1)


def reverse(lst: List[Tensor]) -> List[Tensor]:
    return lst[::-1]


class LSTMCell(nn.Module):
    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight_ih = nn.Parameter(torch.randn(4 * hidden_size, input_size) / hidden_size)
        self.weight_hh = nn.Parameter(torch.randn(4 * hidden_size, hidden_size) / hidden_size)
        self.bias_ih = nn.Parameter(torch.randn(4 * hidden_size) / hidden_size)
        self.bias_hh = nn.Parameter(torch.randn(4 * hidden_size) / hidden_size)

    def forward(
        self, input: Tensor, state: Tuple[Tensor, Tensor]
    ) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        hx, cx = state
        gates = (
            torch.mm(input, self.weight_ih.t())
            + self.bias_ih
            + torch.mm(hx, self.weight_hh.t())
            + self.bias_hh
        )
        ingate, forgetgate, cellgate, outgate = gates.chunk(4, 1)

        ingate = torch.sigmoid(ingate)
        forgetgate = torch.sigmoid(forgetgate)
        cellgate = torch.tanh(cellgate)
        outgate = torch.sigmoid(outgate)

        cy = (forgetgate * cx) + (ingate * cellgate)
        hy = outgate * torch.tanh(cy)

        return hy, (hy, cy)


class LSTMLayer(nn.Module):
    def __init__(self, *cell_args: int) -> None:
        super().__init__()
        self.cell = LSTMCell(*cell_args)

    def forward(
        self, input: Tensor, state: Tuple[Tensor, Tensor]
    ) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        inputs = input.unbind(0)
        outputs = torch.jit.annotate(List[Tensor], [])
        for i in range(len(inputs)):
            out, state = self.cell(inputs[i], state)
            outputs += [out]
        return torch.stack(outputs), state


class ReverseLSTMLayer(nn.Module):
    def __init__(self, *cell_args: int) -> None:
        super().__init__()
        self.cell = LSTMCell(*cell_args)

    def forward(
        self, input: Tensor, state: Tuple[Tensor, Tensor]
    ) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        inputs = reverse(input.unbind(0))
        outputs = torch.jit.annotate(List[Tensor], [])
        for i in range(len(inputs)):
            out, state = self.cell(inputs[i], state)
            outputs += [out]
        return torch.stack(reverse(outputs)), state


class BidirLSTMLayer(nn.Module):
    """pytorch/benchmarks/fastrnns/custom_lstms.py: inputs = input.unbind(0), outputs =
    torch.jit.annotate(List[Tensor], []), range(len(inputs)), inputs[i], outputs += [out], a
    reverse() helper on both sides; the layers in a ModuleList loop with an int counter."""

    def __init__(self, input_size: int = D, hidden_size: int = H) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.directions = nn.ModuleList(
            [LSTMLayer(input_size, hidden_size), ReverseLSTMLayer(input_size, hidden_size)]
        )

    def forward(self, input: Tensor) -> Tuple[Tensor, List[Tuple[Tensor, Tensor]]]:
        zeros = input.new_zeros(input.size(1), self.hidden_size)
        states = [(zeros, zeros), (zeros, zeros)]
        # List[LSTMState]: [forward LSTMState, backward LSTMState]
        outputs = torch.jit.annotate(List[Tensor], [])
        output_states = torch.jit.annotate(List[Tuple[Tensor, Tensor]], [])
        # XXX: enumerate https://github.com/pytorch/pytorch/issues/14471
        i = 0
        for direction in self.directions:
            state = states[i]
            out, out_state = direction(input, state)
            outputs += [out]
            output_states += [out_state]
            i += 1
        return torch.cat(outputs, -1), output_states


class mLSTM(nn.Module):
    def __init__(self, data_size: int, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.data_size = data_size
        self.wx = nn.Linear(data_size, 4 * hidden_size, bias=False)
        self.wh = nn.Linear(hidden_size, 4 * hidden_size, bias=True)
        self.wmx = nn.Linear(data_size, hidden_size, bias=False)
        self.wmh = nn.Linear(hidden_size, hidden_size, bias=False)

    def forward(self, data: Tensor, last_hidden: Tuple[Tensor, Tensor]) -> Tuple[Tensor, Tensor]:
        hx, cx = last_hidden
        m = self.wmx(data) * self.wmh(hx)
        gates = self.wx(data) + self.wh(m)
        i, f, o, u = gates.chunk(4, 1)

        i = torch.sigmoid(i)
        f = torch.sigmoid(f)
        u = torch.tanh(u)
        o = torch.sigmoid(o)

        cy = f * cx + i * u
        hy = o * torch.tanh(cy)

        return hy, cy


class StackedLSTM(nn.Module):
    def __init__(
        self, cell: type, num_layers: int, input_size: int, rnn_size: int, dropout: float
    ) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.num_layers = num_layers
        self.h_size = rnn_size
        self.layers = nn.ModuleList()
        for _ in range(num_layers):
            self.layers.append(cell(input_size, rnn_size))
            input_size = rnn_size

    def forward(
        self, input: Tensor, hidden: Tuple[Tensor, Tensor]
    ) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        h_0, c_0 = hidden
        h_1, c_1 = [], []
        for i, layer in enumerate(self.layers):
            h_1_i, c_1_i = layer(input, (h_0[i], c_0[i]))
            input = h_1_i if i == 0 else input + h_1_i
            if i != len(self.layers):
                input = self.dropout(input)
            h_1 += [h_1_i]
            c_1 += [c_1_i]

        h_1 = torch.stack(h_1)
        c_1 = torch.stack(c_1)

        return input, (h_1, c_1)


class SentimentNeuron(nn.Module):
    """the sentiment-neuron port's mLSTM (openai/generating-reviews-discovering-sentiment in
    PyTorch): a StackedLSTM of mLSTM cells stepped by `for s in range(input.size(0))` with
    hidden = (h, c) of stacked layers, outputs.append then torch.stack."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(D, H)
        self.rnn = StackedLSTM(mLSTM, 2, H, H, dropout=0.0)
        self.decoder = nn.Linear(H, VOCAB)

    def init_hidden(self, batch_size: int) -> Tuple[Tensor, Tensor]:
        h = torch.zeros(self.rnn.num_layers, batch_size, self.rnn.h_size)
        c = torch.zeros(self.rnn.num_layers, batch_size, self.rnn.h_size)
        return (h, c)

    def forward(self, input: Tensor) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        hidden = self.init_hidden(input.size(1))
        outputs = []
        for s in range(input.size(0)):
            emb = self.encoder(input[s])
            output, hidden = self.rnn(emb, hidden)
            outputs.append(self.decoder(output))
        return torch.stack(outputs), hidden


# -- seq2seq decoders ------------------------------------------------------------------------


class GreedyUntilEOS(nn.Module):
    """batched greedy decoding: a GRUCell encoder over the source rows, then
    `for _ in range(self.max_len)` feeding back argmax, tokens.append, `if (inp == self.eos_idx).all():
    break`, torch.stack(tokens, 1)."""

    def __init__(self, max_len: int = 6, bos_idx: int = 0, eos_idx: int = 1) -> None:
        super().__init__()
        self.max_len, self.bos_idx, self.eos_idx = max_len, bos_idx, eos_idx
        self.encoder = nn.GRUCell(D, H)
        self.embedding = nn.Embedding(VOCAB, H)
        self.decoder = nn.GRUCell(H, H)
        self.out = nn.Linear(H, VOCAB)
        _unit_init(self, 1)

    def forward(self, src: Tensor) -> Tensor:
        h = src.new_zeros(src.size(1), H)
        for x_t in src:
            h = self.encoder(x_t, h)
        inp = torch.full((src.size(1),), self.bos_idx, dtype=torch.long)
        tokens = []
        for _ in range(self.max_len):
            h = self.decoder(self.embedding(inp), h)
            inp = self.out(h).argmax(-1)
            tokens.append(inp)
            if (inp == self.eos_idx).all():
                break
        return torch.stack(tokens, 1)


class GreedyFinishedMask(nn.Module):
    """batched greedy decoding with a `finished` mask: masked_fill with the pad token,
    `finished |= next_tok == self.eos_idx`, `if finished.all(): break`."""

    def __init__(
        self, max_len: int = 6, bos_idx: int = 0, eos_idx: int = 1, pad_idx: int = 2
    ) -> None:
        super().__init__()
        self.max_len, self.bos_idx, self.eos_idx, self.pad_idx = max_len, bos_idx, eos_idx, pad_idx
        self.encoder = nn.GRU(D, H)
        self.embedding = nn.Embedding(VOCAB, H)
        self.decoder = nn.GRUCell(H, H)
        self.out = nn.Linear(H, VOCAB)
        _unit_init(self, 1)

    def forward(self, src: Tensor) -> Tensor:
        _, h = self.encoder(src)
        h = h[-1]
        batch_size = src.size(1)
        inp = torch.full((batch_size,), self.bos_idx, dtype=torch.long)
        finished = torch.zeros(batch_size, dtype=torch.bool)
        tokens = []
        for t in range(self.max_len):
            h = self.decoder(self.embedding(inp), h)
            logits = self.out(h)
            next_tok = logits.argmax(-1)
            next_tok = next_tok.masked_fill(finished, self.pad_idx)
            tokens.append(next_tok)
            finished |= next_tok == self.eos_idx
            if finished.all():
                break
            inp = next_tok
        return torch.stack(tokens, dim=1)


SOS_token, EOS_token, MAX_LENGTH = 0, 1, 6


class EncoderRNN(nn.Module):
    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.embedding = nn.Embedding(input_size, hidden_size)
        self.gru = nn.GRU(hidden_size, hidden_size, batch_first=True)

    def forward(self, input: Tensor) -> tuple[Tensor, Tensor]:
        embedded = self.embedding(input)
        output, hidden = self.gru(embedded)
        return output, hidden


class DecoderRNN(nn.Module):
    def __init__(self, hidden_size: int, output_size: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(output_size, hidden_size)
        self.gru = nn.GRU(hidden_size, hidden_size, batch_first=True)
        self.out = nn.Linear(hidden_size, output_size)

    def forward_step(self, input: Tensor, hidden: Tensor) -> tuple[Tensor, Tensor]:
        output = self.embedding(input)
        output = F.relu(output)
        output, hidden = self.gru(output, hidden)
        output = self.out(output)
        return output, hidden


class TutorialGreedyTranslate(nn.Module):
    """the PyTorch "NLP From Scratch: translation" evaluate(): for di in range(max_length),
    topv, topi = decoder_output.data.topk(1), `if topi.item() == EOS_token:` append and break
    else append the word, decoder_input = topi.squeeze().detach()."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = EncoderRNN(VOCAB, H)
        self.decoder = DecoderRNN(H, VOCAB)
        self.index2word = {i: f"w{i}" for i in range(VOCAB)}

    def forward(self, input_tensor: Tensor, max_length: int = MAX_LENGTH) -> List[str]:
        with torch.no_grad():
            encoder_outputs, encoder_hidden = self.encoder(input_tensor)
            decoder_input = torch.tensor([[SOS_token]])
            decoder_hidden = encoder_hidden
            decoded_words = []
            for di in range(max_length):
                decoder_output, decoder_hidden = self.decoder.forward_step(
                    decoder_input, decoder_hidden
                )
                topv, topi = decoder_output.data.topk(1)
                if topi.item() == EOS_token:
                    decoded_words.append("<EOS>")
                    break
                else:
                    decoded_words.append(self.index2word[topi.item()])
                decoder_input = topi.squeeze(-1).detach()
            return decoded_words


class BahdanauAttention(nn.Module):
    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.Wa = nn.Linear(hidden_size, hidden_size)
        self.Ua = nn.Linear(hidden_size, hidden_size)
        self.Va = nn.Linear(hidden_size, 1)

    def forward(self, query: Tensor, keys: Tensor) -> tuple[Tensor, Tensor]:
        scores = self.Va(torch.tanh(self.Wa(query) + self.Ua(keys)))
        scores = scores.squeeze(2).unsqueeze(1)

        weights = F.softmax(scores, dim=-1)
        context = torch.bmm(weights, keys)

        return context, weights


class AttnDecoderRNN(nn.Module):
    """the PyTorch "NLP From Scratch" AttnDecoderRNN.forward: `for i in range(MAX_LENGTH)`,
    forward_step with Bahdanau attention over the encoder outputs, two lists appended,
    `if target_tensor is not None` teacher forcing else topk feedback, torch.cat(..., dim=1)."""

    def __init__(
        self, hidden_size: int = H, output_size: int = VOCAB, dropout_p: float = 0.0
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(output_size, hidden_size)
        self.attention = BahdanauAttention(hidden_size)
        self.gru = nn.GRU(2 * hidden_size, hidden_size, batch_first=True)
        self.out = nn.Linear(hidden_size, output_size)
        self.dropout = nn.Dropout(dropout_p)

    def forward(
        self, encoder_outputs: Tensor, encoder_hidden: Tensor, target_tensor: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        batch_size = encoder_outputs.size(0)
        decoder_input = torch.empty(batch_size, 1, dtype=torch.long).fill_(SOS_token)
        decoder_hidden = encoder_hidden
        decoder_outputs = []
        attentions = []

        for i in range(MAX_LENGTH):
            decoder_output, decoder_hidden, attn_weights = self.forward_step(
                decoder_input, decoder_hidden, encoder_outputs
            )
            decoder_outputs.append(decoder_output)
            attentions.append(attn_weights)

            if target_tensor is not None:
                # Teacher forcing: Feed the target as the next input
                decoder_input = target_tensor[:, i].unsqueeze(1)  # Teacher forcing
            else:
                # Without teacher forcing: use its own predictions as the next input
                _, topi = decoder_output.topk(1)
                decoder_input = topi.squeeze(-1).detach()  # detach from history as input

        decoder_outputs = torch.cat(decoder_outputs, dim=1)
        decoder_outputs = F.log_softmax(decoder_outputs, dim=-1)
        attentions = torch.cat(attentions, dim=1)

        return decoder_outputs, decoder_hidden, attentions

    def forward_step(
        self, input: Tensor, hidden: Tensor, encoder_outputs: Tensor
    ) -> tuple[Tensor, ...]:
        embedded = self.dropout(self.embedding(input))

        query = hidden.permute(1, 0, 2)
        context, attn_weights = self.attention(query, encoder_outputs)
        input_gru = torch.cat((embedded, context), dim=2)

        output, hidden = self.gru(input_gru, hidden)
        output = self.out(output)

        return output, hidden, attn_weights


class TeacherForcedDecoder(DecoderRNN):
    """the "NLP From Scratch" DecoderRNN trained with teacher forcing over the target:
    `for i in range(target_tensor.size(1))`, forward_step on an nn.GRU, decoder_outputs.append,
    decoder_input = target_tensor[:, i].unsqueeze(1), torch.cat(decoder_outputs, dim=1)."""

    def __init__(self) -> None:
        super().__init__(H, VOCAB)

    def forward(self, target_tensor: Tensor, encoder_hidden: Tensor) -> tuple[Tensor, Tensor]:
        batch_size = target_tensor.size(0)
        decoder_input = torch.empty(batch_size, 1, dtype=torch.long).fill_(SOS_token)
        decoder_hidden = encoder_hidden
        decoder_outputs = []

        for i in range(target_tensor.size(1)):
            decoder_output, decoder_hidden = self.forward_step(decoder_input, decoder_hidden)
            decoder_outputs.append(decoder_output)
            decoder_input = target_tensor[:, i].unsqueeze(1)  # Teacher forcing

        decoder_outputs = torch.cat(decoder_outputs, dim=1)
        decoder_outputs = F.log_softmax(decoder_outputs, dim=-1)
        return decoder_outputs, decoder_hidden


class Seq2SeqBentrevett(nn.Module):
    """bentrevett/pytorch-seq2seq: outputs = torch.zeros(trg_len, ...) written at outputs[t] in
    `for t in range(1, trg_len)`, `teacher_force = random.random() < teacher_forcing_ratio`,
    input = trg[t] if teacher_force else top1 (needs random.seed for repeatable runs)."""

    def __init__(self) -> None:
        super().__init__()
        self.src_embedding = nn.Embedding(VOCAB, H)
        self.encoder = nn.LSTM(H, H)
        self.trg_embedding = nn.Embedding(VOCAB, H)
        self.decoder = nn.LSTM(H, H)
        self.fc_out = nn.Linear(H, VOCAB)
        self.output_dim = VOCAB

    def decode(self, input: Tensor, hidden: Tensor, cell: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        input = input.unsqueeze(0)
        embedded = self.trg_embedding(input)
        output, (hidden, cell) = self.decoder(embedded, (hidden, cell))
        prediction = self.fc_out(output.squeeze(0))
        return prediction, hidden, cell

    def forward(self, src: Tensor, trg: Tensor, teacher_forcing_ratio: float = 0.5) -> Tensor:
        batch_size = trg.shape[1]
        trg_len = trg.shape[0]
        trg_vocab_size = self.output_dim
        outputs = torch.zeros(trg_len, batch_size, trg_vocab_size)
        _, (hidden, cell) = self.encoder(self.src_embedding(src))
        input = trg[0, :]
        for t in range(1, trg_len):
            output, hidden, cell = self.decode(input, hidden, cell)
            outputs[t] = output
            teacher_force = random.random() < teacher_forcing_ratio
            top1 = output.argmax(1)
            input = trg[t] if teacher_force else top1
        return outputs


class BiRNNInsert(nn.Module):
    """a hand-written bidirectional RNN: forward loop appends, backward loop
    `for t in range(seq_len - 1, -1, -1)` with bw_outs.insert(0, h_b), both stacked on axis 1
    and concatenated."""

    def __init__(self) -> None:
        super().__init__()
        self.fw_cell = nn.GRUCell(D, H)
        self.bw_cell = nn.GRUCell(D, H)

    def forward(self, x: Tensor) -> Tensor:
        batch_size, seq_len, _ = x.shape
        h_f = x.new_zeros(batch_size, H)
        h_b = x.new_zeros(batch_size, H)
        fw_outs, bw_outs = [], []
        for t in range(seq_len):
            h_f = self.fw_cell(x[:, t], h_f)
            fw_outs.append(h_f)
        for t in range(seq_len - 1, -1, -1):
            h_b = self.bw_cell(x[:, t], h_b)
            bw_outs.insert(0, h_b)
        return torch.cat([torch.stack(fw_outs, 1), torch.stack(bw_outs, 1)], dim=-1)


class FirstStepBranch(nn.Module):
    """an RNN written with `if t == 0:` (no previous state) else the recurrence, h unbound
    before the loop, outputs.append then torch.stack(outputs, dim=1)."""

    def __init__(self) -> None:
        super().__init__()
        self.w_x = nn.Linear(D, H)
        self.w_h = nn.Linear(H, H, bias=False)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        seq_len = x.size(1)
        outputs = []
        for t in range(seq_len):
            if t == 0:
                h = torch.tanh(self.w_x(x[:, t]))
            else:
                h = torch.tanh(self.w_x(x[:, t]) + self.w_h(h))
            outputs.append(h)
        return torch.stack(outputs, dim=1), h


class SkipPadding(nn.Module):
    """padded batches stepped by hand: `if not mask[t].any(): continue` past all-padding steps,
    then torch.where(mask[t].unsqueeze(1), h_new, h)."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.RNNCell(D, H)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        h = x.new_zeros(x.size(1), H)
        for t in range(x.size(0)):
            if not mask[t].any():
                continue
            h_new = self.cell(x[t], h)
            h = torch.where(mask[t].unsqueeze(1), h_new, h)
        return h


class CharRNNStateful(nn.Module):
    """char-rnn style: the hidden state kept on the module (self.hidden = self.init_hidden()),
    `for c in range(len(input))`, output, self.hidden = self.gru(...)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Embedding(VOCAB, H)
        self.gru = nn.GRU(H, H)
        self.decoder = nn.Linear(H, VOCAB)

    def init_hidden(self, batch_size: int) -> Tensor:
        return torch.zeros(1, batch_size, H)

    def forward(self, input: Tensor) -> Tensor:
        self.hidden = self.init_hidden(input.size(1))
        loss = 0
        for c in range(len(input) - 1):
            embedded = self.encoder(input[c]).unsqueeze(0)
            output, self.hidden = self.gru(embedded, self.hidden)
            logits = self.decoder(output.squeeze(0))
            loss += F.cross_entropy(logits, input[c + 1])
        return loss


# -- ODE solvers ---------------------------------------------------------------------------------


class ODEFunc(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(D, H), nn.Tanh(), nn.Linear(H, D))

    def forward(self, t: Tensor, y: Tensor) -> Tensor:
        return self.net(y) * torch.cos(t)


class EulerSolution(nn.Module):
    """a torchdiffeq-like fixed-step Euler odeint: solution = [y0], `for t0, t1 in
    zip(t[:-1], t[1:])`, dt = t1 - t0, solution.append(y), torch.stack(solution)."""

    def __init__(self) -> None:
        super().__init__()
        self.func = ODEFunc()

    def forward(self, t: Tensor, y0: Tensor) -> Tensor:
        solution = [y0]
        y = y0
        for t0, t1 in zip(t[:-1], t[1:]):
            dt = t1 - t0
            y = y + dt * self.func(t0, y)
            solution.append(y)
        return torch.stack(solution)


class FixedGridODESolver(nn.Module):
    """torchdiffeq's FixedGridODESolver.integrate (midpoint step): solution =
    torch.empty(len(t), ...) written at solution[j] by an inner `while j < len(t) and t1 >= t[j]`
    with `j += 1`, _linear_interp."""

    def __init__(self) -> None:
        super().__init__()
        self.func = ODEFunc()

    @staticmethod
    def _linear_interp(t0: Tensor, t1: Tensor, y0: Tensor, y1: Tensor, t: Tensor) -> Tensor:
        if t == t0:
            return y0
        if t == t1:
            return y1
        slope = (t - t0) / (t1 - t0)
        return y0 + slope * (y1 - y0)

    def _step_func(self, func: nn.Module, t0: Tensor, dt: Tensor, t1: Tensor, y0: Tensor) -> Tensor:
        half_dt = 0.5 * dt
        f0 = func(t0, y0)
        y_mid = y0 + f0 * half_dt
        return dt * func(t0 + half_dt, y_mid)

    def forward(self, t: Tensor, y0: Tensor) -> Tensor:
        time_grid = t
        solution = torch.empty(len(t), *y0.shape, dtype=y0.dtype, device=y0.device)
        solution[0] = y0

        j = 1
        for t0, t1 in zip(time_grid[:-1], time_grid[1:]):
            dt = t1 - t0
            dy = self._step_func(self.func, t0, dt, t1, y0)
            y1 = y0 + dy

            while j < len(t) and t1 >= t[j]:
                solution[j] = self._linear_interp(t0, t1, y0, y1, t[j])
                j += 1
            y0 = y1

        return solution


class RK4Solve(nn.Module):
    """a hand-written classical RK4 odeint: ys = [y0], `for i in range(len(t) - 1)`,
    dt = t[i + 1] - t[i], k1..k4, ys.append(y), torch.stack(ys)."""

    def __init__(self) -> None:
        super().__init__()
        self.f = ODEFunc()

    def forward(self, t: Tensor, y0: Tensor) -> Tensor:
        y = y0
        ys = [y0]
        for i in range(len(t) - 1):
            dt = t[i + 1] - t[i]
            k1 = self.f(t[i], y)
            k2 = self.f(t[i] + dt / 2, y + dt * k1 / 2)
            k3 = self.f(t[i] + dt / 2, y + dt * k2 / 2)
            k4 = self.f(t[i] + dt, y + dt * k3)
            y = y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
            ys.append(y)
        return torch.stack(ys)


def _grid(n: int) -> tuple[Tensor, Tensor]:
    t = torch.linspace(0, 1, n + 1)
    y0 = torch.randn(B, D, generator=_gen(n))
    return t, y0


# -- samplers and filters ------------------------------------------------------------------------


class GaussianDiffusion(nn.Module):
    """lucidrains' denoising-diffusion-pytorch p_sample_loop: @torch.no_grad(), `for t in
    reversed(range(0, self.num_timesteps))`, torch.full((b,), t), `noise = torch.randn_like(x)
    if t > 0 else 0.` in p_sample (here from a given x_T)."""

    def __init__(self, num_timesteps: int = 5) -> None:
        super().__init__()
        self.num_timesteps = num_timesteps
        self.model = nn.Sequential(nn.Linear(D + 1, H), nn.SiLU(), nn.Linear(H, D))
        betas = torch.linspace(1e-4, 0.2, num_timesteps)
        alphas = 1.0 - betas
        alphas_cumprod = torch.cumprod(alphas, dim=0)
        alphas_cumprod_prev = F.pad(alphas_cumprod[:-1], (1, 0), value=1.0)
        self.register_buffer("betas", betas)
        self.register_buffer("sqrt_recip_alphas_cumprod", torch.sqrt(1.0 / alphas_cumprod))
        self.register_buffer("sqrt_recipm1_alphas_cumprod", torch.sqrt(1.0 / alphas_cumprod - 1))
        posterior_variance = betas * (1.0 - alphas_cumprod_prev) / (1.0 - alphas_cumprod)
        self.register_buffer(
            "posterior_log_variance_clipped", torch.log(posterior_variance.clamp(min=1e-20))
        )
        self.register_buffer(
            "posterior_mean_coef1", betas * torch.sqrt(alphas_cumprod_prev) / (1.0 - alphas_cumprod)
        )
        self.register_buffer(
            "posterior_mean_coef2",
            (1.0 - alphas_cumprod_prev) * torch.sqrt(alphas) / (1.0 - alphas_cumprod),
        )

    @staticmethod
    def extract(a: Tensor, t: Tensor, x_shape: torch.Size) -> Tensor:
        b, *_ = t.shape
        out = a.gather(-1, t)
        return out.reshape(b, *((1,) * (len(x_shape) - 1)))

    def p_mean_variance(self, x: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
        t_in = (t.float() / self.num_timesteps)[:, None, None].expand(*x.shape[:-1], 1)
        pred_noise = self.model(torch.cat([x, t_in], dim=-1))
        x_start = (
            self.extract(self.sqrt_recip_alphas_cumprod, t, x.shape) * x
            - self.extract(self.sqrt_recipm1_alphas_cumprod, t, x.shape) * pred_noise
        ).clamp(-1.0, 1.0)
        model_mean = (
            self.extract(self.posterior_mean_coef1, t, x.shape) * x_start
            + self.extract(self.posterior_mean_coef2, t, x.shape) * x
        )
        return model_mean, self.extract(self.posterior_log_variance_clipped, t, x.shape)

    @torch.no_grad()
    def p_sample(self, x: Tensor, t: int) -> Tensor:
        b = x.shape[0]
        batched_times = torch.full((b,), t, dtype=torch.long)
        model_mean, model_log_variance = self.p_mean_variance(x, batched_times)
        noise = torch.randn_like(x) if t > 0 else 0.0  # no noise if t == 0
        return model_mean + (0.5 * model_log_variance).exp() * noise

    @torch.no_grad()
    def forward(self, img: Tensor) -> Tensor:
        for t in reversed(range(0, self.num_timesteps)):
            img = self.p_sample(img, t)
        return img


class ScoreNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(D, H), nn.ELU(), nn.Linear(H, D))

    def forward(self, x: Tensor, labels: Tensor) -> Tensor:
        return self.net(x) - x / (1.0 + labels[:, None].float())


class AnnealedLangevin(nn.Module):
    """ermongroup/ncsn's anneal_Langevin_dynamics: `with torch.no_grad():`, `for c, sigma in
    enumerate(sigmas)`, labels from c, step_size from sigma / sigmas[-1], an inner
    `for s in range(n_steps_each)` with torch.randn_like, images.append(x_mod.to('cpu'))."""

    def __init__(self, n_steps_each: int = 3, step_lr: float = 0.01) -> None:
        super().__init__()
        self.scorenet = ScoreNet()
        self.n_steps_each, self.step_lr = n_steps_each, step_lr

    def forward(self, sigmas: Tensor, x_mod: Tensor) -> List[Tensor]:
        images = []
        scorenet, n_steps_each, step_lr = self.scorenet, self.n_steps_each, self.step_lr

        with torch.no_grad():
            for c, sigma in enumerate(sigmas):
                labels = torch.ones(x_mod.shape[0], device=x_mod.device) * c
                labels = labels.long()
                step_size = step_lr * (sigma / sigmas[-1]) ** 2
                for s in range(n_steps_each):
                    images.append(torch.clamp(x_mod, 0.0, 1.0).to("cpu"))
                    noise = torch.randn_like(x_mod) * torch.sqrt(step_size * 2)
                    grad = scorenet(x_mod, labels)
                    x_mod = x_mod + step_size * grad + noise

            return images


class ParticleFilter(nn.Module):
    """a bootstrap particle filter: `for t in range(T)`, propagate with torch.randn,
    torch.distributions.Normal(...).log_prob(obs[t]), normalise log-weights, means.append,
    `if ess < self.n_particles / 2:` torch.multinomial resampling."""

    def __init__(self, n_particles: int = 8, dim: int = D) -> None:
        super().__init__()
        self.n_particles, self.dim = n_particles, dim
        self.register_buffer("A", torch.eye(dim) * 0.9 + 0.05)
        self.q, self.r = 0.3, 1.0

    def forward(self, obs: Tensor) -> Tensor:
        T = obs.shape[0]
        particles = torch.randn(self.n_particles, self.dim)
        logw = torch.full((self.n_particles,), -math.log(self.n_particles))
        means = []
        for t in range(T):
            particles = particles @ self.A.T + self.q * torch.randn(self.n_particles, self.dim)
            logw = logw + torch.distributions.Normal(particles, self.r).log_prob(obs[t]).sum(-1)
            logw = logw - torch.logsumexp(logw, dim=0)
            w = logw.exp()
            means.append((w[:, None] * particles).sum(0))
            ess = 1.0 / (w**2).sum()
            if ess < self.n_particles / 2:
                idx = torch.multinomial(w, self.n_particles, replacement=True)
                particles = particles[idx]
                logw = torch.full_like(logw, -math.log(self.n_particles))
        return torch.stack(means)


def predict(x: Tensor, P: Tensor, A: Tensor, Q: Tensor) -> tuple[Tensor, Tensor]:
    x = A @ x
    P = torch.linalg.multi_dot([A, P, A.t()]) + Q
    return x, P


def update(y: Tensor, x: Tensor, P: Tensor, H: Tensor, R: Tensor) -> tuple[Tensor, Tensor]:
    K = torch.linalg.multi_dot([P, H.t(), torch.inverse(torch.linalg.multi_dot([H, P, H.t()]) + R)])
    x = x + K @ (y - H @ x)
    P = P - torch.linalg.multi_dot([K, H, P])
    return x, P


class KalmanFilter(nn.Module):
    """a torch Kalman filter (predict/update helpers with multi_dot and torch.inverse,
    state (xdim, batch)): `for y in ys:` predict, update, means.append, covs.append, stacked."""

    def __init__(self, xdim: int = 4, ydim: int = 2) -> None:
        super().__init__()
        dt = 0.1
        A = torch.eye(xdim)
        A[0, 2] = A[1, 3] = dt
        self.register_buffer("A", A)
        self.register_buffer("H", torch.eye(ydim, xdim))
        self.register_buffer("Q", 0.01 * torch.eye(xdim))
        self.register_buffer("R", 0.1 * torch.eye(ydim))
        self.register_buffer("x0", torch.zeros(xdim, B))
        self.register_buffer("P0", torch.eye(xdim))

    def forward(self, ys: Tensor) -> tuple[Tensor, Tensor]:
        x, P = self.x0, self.P0
        means, covs = [], []
        for y in ys:
            x, P = predict(x, P, self.A, self.Q)
            x, P = update(y, x, P, self.H, self.R)
            means.append(x)
            covs.append(P)
        return torch.stack(means), torch.stack(covs)


# -- iterative solvers ---------------------------------------------------------------------------


def _spd(n: int = H) -> Tensor:
    g = torch.Generator().manual_seed(7)
    M = torch.randn(n, n, generator=g)
    return M @ M.T / n + torch.eye(n)


class JacobiSolve(nn.Module):
    """a Jacobi iteration: D = torch.diagonal(A), R = A - torch.diag(D), `for it in
    range(self.max_iter)`, `if torch.linalg.norm(x_new - x) < self.tol: break`, x = x_new."""

    def __init__(self, max_iter: int = 100, tol: float = 1e-4) -> None:
        super().__init__()
        A = _spd() + 3 * torch.eye(H)  # diagonally dominant
        self.register_buffer("A", A)
        self.max_iter, self.tol = max_iter, tol

    def forward(self, b: Tensor) -> Tensor:
        x = torch.zeros_like(b)
        D = torch.diagonal(self.A)
        R = self.A - torch.diag(D)
        for it in range(self.max_iter):
            x_new = (b - x @ R.T) / D
            if torch.linalg.norm(x_new - x) < self.tol:
                break
            x = x_new
        return x


class DEQForwardIteration(nn.Module):
    """the "Deep Implicit Layers" tutorial's forward_iteration in DEQFixedPoint: `for k in
    range(max_iter)`, res.append((f0 - x).norm().item() / (1e-5 + f0.norm().item())),
    `if res[-1] < tol: break`, self.forward_res kept on the module."""

    def __init__(self, max_iter: int = 50, tol: float = 1e-4) -> None:
        super().__init__()
        self.linear = nn.Linear(H, H, bias=False)
        nn.init.normal_(self.linear.weight, 0, 0.05)
        self.inp = nn.Linear(D, H)
        self.kwargs = {"max_iter": max_iter, "tol": tol}

    def f(self, z: Tensor, x: Tensor) -> Tensor:
        return torch.tanh(self.linear(z) + x)

    @staticmethod
    def forward_iteration(f, x0: Tensor, max_iter: int = 50, tol: float = 1e-2):  # noqa: ANN001, ANN205
        f0 = f(x0)
        res = []
        for k in range(max_iter):
            x = f0
            f0 = f(x)
            res.append((f0 - x).norm().item() / (1e-5 + f0.norm().item()))
            if res[-1] < tol:
                break
        return f0, res

    def forward(self, x: Tensor) -> Tensor:
        x = self.inp(x)
        with torch.no_grad():
            z, self.forward_res = self.forward_iteration(
                lambda z: self.f(z, x), torch.zeros_like(x), **self.kwargs
            )
        z = self.f(z, x)
        return z


class ConjugateGradientWhile(nn.Module):
    """the textbook (Wikipedia) conjugate gradient: r = b - A @ x, p = r, rsold = r @ r,
    `while torch.sqrt(rsold) > self.tol:`, rsnew, p = r + (rsnew / rsold) * p, rsold = rsnew."""

    def __init__(self, tol: float = 1e-5) -> None:
        super().__init__()
        self.register_buffer("A", _spd())
        self.tol = tol

    def forward(self, b: Tensor) -> Tensor:
        A = self.A
        x = torch.zeros_like(b)
        r = b - A @ x
        p = r
        rsold = r @ r
        while torch.sqrt(rsold) > self.tol:
            Ap = A @ p
            alpha = rsold / (p @ Ap)
            x = x + alpha * p
            r = r - alpha * Ap
            rsnew = r @ r
            p = r + (rsnew / rsold) * p
            rsold = rsnew
        return x


class ConjugateGradientTRPO(nn.Module):
    """the TRPO / maml-rl conjugate_gradient(f_Ax, b, cg_iters=10, residual_tol=1e-10):
    `x += v * p`, `r -= v * z` on the carries, `if rdotr.item() < residual_tol: break`."""

    def __init__(self, cg_iters: int = 10, residual_tol: float = 1e-10) -> None:
        super().__init__()
        self.register_buffer("A", _spd())
        self.cg_iters, self.residual_tol = cg_iters, residual_tol

    def f_Ax(self, v: Tensor) -> Tensor:
        return self.A @ v

    def forward(self, b: Tensor) -> Tensor:
        p = b.clone()
        r = b.clone()
        x = torch.zeros_like(b).float()
        rdotr = torch.dot(r, r)
        for i in range(self.cg_iters):
            z = self.f_Ax(p).detach()
            v = rdotr / torch.dot(p, z)
            x += v * p
            r -= v * z
            newrdotr = torch.dot(r, r)
            mu = newrdotr / rdotr
            p = r + mu * p
            rdotr = newrdotr
            if rdotr.item() < self.residual_tol:
                break
        return x.detach()


class SinkhornDistance(nn.Module):
    """dfdazac/wassdistance's SinkhornDistance: log-domain updates of u and v, `actual_nits += 1`,
    `if err.item() < thresh: break`, then pi = exp(M(C, U, V))."""

    def __init__(self, eps: float = 0.1, max_iter: int = 100) -> None:
        super().__init__()
        self.eps = eps
        self.max_iter = max_iter

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        # The Sinkhorn algorithm takes as input three variables :
        C = self._cost_matrix(x, y)  # Wasserstein cost function
        x_points = x.shape[-2]
        y_points = y.shape[-2]
        batch_size = 1 if x.dim() == 2 else x.shape[0]

        # both marginals are fixed with equal weights
        mu = (
            torch.empty(batch_size, x_points, dtype=torch.float, requires_grad=False)
            .fill_(1.0 / x_points)
            .squeeze()
        )
        nu = (
            torch.empty(batch_size, y_points, dtype=torch.float, requires_grad=False)
            .fill_(1.0 / y_points)
            .squeeze()
        )

        u = torch.zeros_like(mu)
        v = torch.zeros_like(nu)
        # To check if algorithm terminates because of threshold
        # or max iterations reached
        actual_nits = 0
        # Stopping criterion
        thresh = 1e-1

        # Sinkhorn iterations
        for i in range(self.max_iter):
            u1 = u  # useful to check the update
            u = self.eps * (torch.log(mu + 1e-8) - torch.logsumexp(self.M(C, u, v), dim=-1)) + u
            v = (
                self.eps
                * (
                    torch.log(nu + 1e-8)
                    - torch.logsumexp(self.M(C, u, v).transpose(-2, -1), dim=-1)
                )
                + v
            )
            err = (u - u1).abs().sum(-1).mean()

            actual_nits += 1
            if err.item() < thresh:
                break

        U, V = u, v
        # Transport plan pi = diag(a)*K*diag(b)
        pi = torch.exp(self.M(C, U, V))
        # Sinkhorn distance
        cost = torch.sum(pi * C, dim=(-2, -1))
        return cost, pi, C

    def M(self, C: Tensor, u: Tensor, v: Tensor) -> Tensor:
        "Modified cost for logarithmic updates"
        "$M_{ij} = (-c_{ij} + u_i + v_j) / \\epsilon$"
        return (-C + u.unsqueeze(-1) + v.unsqueeze(-2)) / self.eps

    @staticmethod
    def _cost_matrix(x: Tensor, y: Tensor, p: int = 2) -> Tensor:
        "Returns the matrix of $|x_i-y_j|^p$."
        x_col = x.unsqueeze(-2)
        y_lin = y.unsqueeze(-3)
        C = torch.sum((torch.abs(x_col - y_lin)) ** p, -1)
        return C


# -- dynamic programming ---------------------------------------------------------------------


class DTWTable(nn.Module):
    """a DTW in torch as written from the textbook: D = torch.full((n + 1, m + 1), inf),
    D[0, 0] = 0, nested `for i in range(1, n + 1): for j in range(1, m + 1):` writing D[i, j]
    from D[i - 1, j], D[i, j - 1], D[i - 1, j - 1]."""

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        n, m = x.size(0), y.size(0)
        C = torch.cdist(x, y)
        D = torch.full((n + 1, m + 1), float("inf"))
        D[0, 0] = 0
        for i in range(1, n + 1):
            for j in range(1, m + 1):
                D[i, j] = C[i - 1, j - 1] + torch.min(
                    torch.stack([D[i - 1, j], D[i, j - 1], D[i - 1, j - 1]])
                )
        return D[n, m]


class SoftDTWRows(nn.Module):
    """a batched soft-DTW filled row by row: prev = row 0 by torch.cumsum, `for i in range(1, N)`
    with cur = [prev[:, 0] + C[:, i, 0]] and an inner `for j in range(1, M)` appending a soft-min
    of prev[:, j], prev[:, j - 1], cur[j - 1]; prev = torch.stack(cur, -1)."""

    def __init__(self, gamma: float = 0.1) -> None:
        super().__init__()
        self.gamma = gamma

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        C = torch.cdist(x, y) ** 2  # (batch, N, M)
        N, M = C.size(1), C.size(2)
        g = self.gamma
        prev = torch.cumsum(C[:, 0], dim=-1)
        for i in range(1, N):
            cur = [prev[:, 0] + C[:, i, 0]]
            for j in range(1, M):
                r = torch.stack([prev[:, j], prev[:, j - 1], cur[j - 1]], dim=-1)
                cur.append(C[:, i, j] - g * torch.logsumexp(-r / g, dim=-1))
            prev = torch.stack(cur, -1)
        return prev[:, -1]


def logadd(x0: Tensor, x1: Tensor, x2: Tensor) -> Tensor:
    # produces nan gradients in backward if -inf log-space zero element is used
    return torch.logsumexp(torch.stack([x0, x1, x2]), dim=0)


class CTCLossTable(nn.Module):
    """vadimkantorov/ctc's ctc_loss: log_alpha = torch.full((T, B, 2 + 2L + ...), zero),
    `for t in range(1, input_time_size)` writing log_alpha[t, :, 2:] from log_alpha[t - 1] via
    logadd and torch.where(diff_labels, ...)."""

    def __init__(self, blank: int = 0) -> None:
        super().__init__()
        self.blank = blank

    def forward(
        self, log_probs: Tensor, targets: Tensor, input_lengths: Tensor, target_lengths: Tensor
    ) -> Tensor:
        blank = self.blank
        input_time_size, batch_size = log_probs.shape[:2]
        B_ = torch.arange(batch_size, device=input_lengths.device)

        _t_a_r_g_e_t_s_ = torch.cat([targets, targets[:, :1]], dim=-1)
        _t_a_r_g_e_t_s_ = torch.stack(
            [torch.full_like(_t_a_r_g_e_t_s_, blank), _t_a_r_g_e_t_s_], dim=-1
        ).flatten(start_dim=-2)

        diff_labels = torch.cat(
            [
                torch.as_tensor([[False, False]], device=targets.device).expand(batch_size, -1),
                _t_a_r_g_e_t_s_[:, 2:] != _t_a_r_g_e_t_s_[:, :-2],
            ],
            dim=1,
        )

        # if zero = float('-inf') is used as neutral element, custom logsumexp must be used
        # to avoid nan grad in torch.logsumexp
        zero_padding, zero = (
            2,
            torch.tensor(
                torch.finfo(log_probs.dtype).min, device=log_probs.device, dtype=log_probs.dtype
            ),
        )
        log_probs_ = log_probs.gather(-1, _t_a_r_g_e_t_s_.expand(input_time_size, -1, -1))
        log_alpha = torch.full(
            (input_time_size, batch_size, zero_padding + _t_a_r_g_e_t_s_.shape[-1]),
            zero,
            device=log_probs.device,
            dtype=log_probs.dtype,
        )
        log_alpha[0, :, zero_padding + 0] = log_probs[0, :, blank]
        log_alpha[0, :, zero_padding + 1] = log_probs[0, B_, _t_a_r_g_e_t_s_[:, 1]]
        # log_alpha[1:, :, zero_padding:] = log_probs.gather(-1, _t_a_r_g_e_t_s_.expand(len(log_probs), -1, -1))[1:]
        for t in range(1, input_time_size):
            log_alpha[t, :, 2:] = log_probs_[t] + logadd(
                log_alpha[t - 1, :, 2:],
                log_alpha[t - 1, :, 1:-1],
                torch.where(diff_labels, log_alpha[t - 1, :, :-2], zero),
            )

        l1l2 = log_alpha[input_lengths - 1, B_].gather(
            -1,
            torch.stack(
                [zero_padding + target_lengths * 2 - 1, zero_padding + target_lengths * 2], dim=-1
            ),
        )

        loss = -torch.logsumexp(l1l2, dim=-1)
        return loss


def _ctc_inputs(n: int) -> tuple[Tensor, ...]:
    g = _gen(n)
    T = n + 2  # at least as long as the two labels
    log_probs = torch.randn(T, B, VOCAB, generator=g).log_softmax(-1)
    targets = torch.randint(1, VOCAB, (B, 2), generator=g)
    return (
        log_probs,
        targets,
        torch.full((B,), T, dtype=torch.long),
        torch.full((B,), 2, dtype=torch.long),
    )


def _ints(n: int, *shape: int, high: int = VOCAB) -> Tensor:
    return torch.randint(high, shape, generator=_gen(n))


def _padded(n: int) -> tuple[Tensor, Tensor]:
    g = _gen(n)
    x = torch.randn(n, B, D, generator=g)
    lengths = torch.tensor([n, max(n - 2, 0)])
    mask = torch.arange(n)[:, None] < lengths[None, :]
    mask[1:2] = False  # an all-padding step (packed from elsewhere)
    return x, mask


def _rhs(n: int) -> tuple[Tensor]:
    return (torch.randn(H, generator=_gen(n)) * (n + 1),)


# What torchscan.autoloop makes of each (converts: at least one loop of the program runs as a
# scan; else words of the reason its report gives). "ddpm-p-sample-loop" (a loop in a forward
# under @torch.no_grad()) and "deq-forward-iteration" (a loop in a @staticmethod) get no row in
# the report at all: reason "" there.
PUBLIC: dict[str, Program] = {
    "crf-log-likelihood": Program(
        CRFLogLikelihood, lambda n: _crf_inputs(n, with_tags=True), loops=2
    ),
    "crf-normalizer": Program(CRFNormalizer, _crf_inputs),
    # the history list is read item by item to backtrack: not only stacked
    "crf-viterbi": Program(CRFViterbi, _crf_inputs, export_error="use it only in torch.stack"),
    # the gates indexed at the step number, a tuple: read as a number in each step
    "qrnn-forget-mult": Program(
        CPUForgetMult,
        lambda n: (torch.sigmoid(_seq(n, H)), _seq(n, H) * 2),
        empty_raises=True,
        hoists=False,
    ),
    "fastai-forget-mult": Program(
        FastaiForgetMult,
        lambda n: (_seq(n, H, batch_first=True), torch.sigmoid(_seq(n, H, batch_first=True) + 1)),
        time_axis=1,
    ),
    "sru-cpu": Program(SRUComputeCPU, lambda n: (_seq(n, D),), empty_raises=True, loops=2),
    "indrnn": Program(IndRNN, lambda n: (_seq(n, D),), empty_raises=True, loops=2),
    "custom-lstms-bidir": Program(
        BidirLSTMLayer, lambda n: (_seq(n, D),), empty_raises=True, loops=2
    ),
    "mlstm-sentiment": Program(SentimentNeuron, lambda n: (_seq(n, D),), empty_raises=True),
    "greedy-eos-break": Program(GreedyUntilEOS, lambda n: (_seq(n, D),), loops=2),
    "greedy-finished-mask": Program(GreedyFinishedMask, lambda n: (_seq(n + 1, D),)),
    "tutorial-greedy-item": Program(
        TutorialGreedyTranslate,
        lambda n: (_ints(n, 1, n + 1),),
        False,
        "counts to a Python number (`range(max_length)`)",
        time_axis=1,
    ),
    "tutorial-attn-decoder": Program(
        AttnDecoderRNN,
        lambda n: (_seq(n, H, batch_first=True), torch.randn(1, B, H, generator=_gen(n))),
        False,
        "counts to a Python number (`range(MAX_LENGTH)`)",
        time_axis=1,
    ),
    "teacher-forcing": Program(
        TeacherForcedDecoder,
        lambda n: (_ints(n, B, n), torch.randn(1, B, H, generator=_gen(n))),
        empty_raises=True,
        time_axis=1,
    ),
    "bentrevett-seq2seq": Program(
        Seq2SeqBentrevett,
        lambda n: (_ints(n, n + 1, B), _ints(n + 100, n + 1, B)),
        False,
        "draws a number with Python's random",
    ),
    "birnn-insert": Program(
        BiRNNInsert,
        lambda n: (_seq(n, D, batch_first=True),),
        empty_raises=True,
        time_axis=1,
        loops=2,
    ),
    "first-step-branch": Program(
        FirstStepBranch, lambda n: (_seq(n, D, batch_first=True),), empty_raises=True, time_axis=1
    ),
    "skip-padding-continue": Program(SkipPadding, _padded),
    "char-rnn-self-hidden": Program(
        CharRNNStateful, lambda n: (_ints(n, n + 1, B),), False, "sets the attribute `self.hidden`"
    ),
    "euler-solution-list": Program(EulerSolution, _grid),
    "torchdiffeq-fixed-grid": Program(
        FixedGridODESolver, _grid, False, "writes into `solution` at an index"
    ),
    "rk4-len-minus-1": Program(RK4Solve, _grid),
    "ddpm-p-sample-loop": Program(
        GaussianDiffusion, lambda n: (_seq(n + 1, D, batch_first=True),), False, "", time_axis=1
    ),
    "ncsn-annealed-langevin": Program(
        AnnealedLangevin,
        lambda n: (torch.logspace(0, -1, n + 1), torch.rand(B, D, generator=_gen(n))),
        False,
        "changes `images`, made outside the loop",
    ),
    # resampling under `if ess < ...:` reads a tensor's value
    "particle-filter": Program(
        ParticleFilter,
        lambda n: (_seq(n, D)[:, 0],),
        empty_raises=True,
        export_error="reads the value of a tensor at",
    ),
    "kalman-filter": Program(
        KalmanFilter,
        lambda n: (_seq(n, B)[:, :2],),
        empty_raises=True,
        export_error="calls torch.linalg.inv",
    ),
    "jacobi-tol-break": Program(JacobiSolve, _rhs),
    "deq-forward-iteration": Program(
        DEQForwardIteration, lambda n: (_seq(n + 1, D, batch_first=True),), False, "", time_axis=1
    ),
    "cg-while": Program(ConjugateGradientWhile, _rhs),
    "cg-trpo": Program(ConjugateGradientTRPO, _rhs),
    "sinkhorn-wassdistance": Program(
        SinkhornDistance,
        lambda n: (_seq(n + 1, 2, batch_first=True), torch.randn(B, 4, 2, generator=_gen(n))),
        time_axis=1,
    ),
    "dtw-table": Program(
        DTWTable,
        lambda n: (_seq(n, D)[:, 0], torch.randn(4, D, generator=_gen(n))),
        False,
        "writes into `D` at an index",
    ),
    "soft-dtw-rows": Program(
        SoftDTWRows,
        lambda n: (_seq(n + 1, D, batch_first=True), torch.randn(B, 4, D, generator=_gen(n))),
        time_axis=1,
        export_error="aten._cdist_forward",
    ),
    "ctc-alpha-table": Program(CTCLossTable, _ctc_inputs),
}
