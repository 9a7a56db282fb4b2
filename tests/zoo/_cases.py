"""Ports of recurrent loops from well-known PyTorch code, written with torchscan.scan / loop.

Each case has: the port (a torch.nn.Module whose forward calls torchscan), inputs at any sequence
length, the dynamic shapes to export with, an independent oracle (an installed library computing
the same thing, or a plain Python loop of the same code), and the number of torchscan loops the
export should contain.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import torchscan

Dim = torch.export.Dim


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(g, *shape):
    return torch.randn(*shape, generator=g)


def rand(g, *shape):
    return torch.rand(*shape, generator=g)


def seeded(make):
    def build():
        torch.manual_seed(0)
        return make()

    return build


def random_lengths(g, batch: int, t: int) -> torch.Tensor:
    """Lengths in [1, t], the first of them t."""
    lengths = torch.randint(1, t + 1, (batch,), generator=g)
    lengths[0] = t
    return lengths


def length_mask(lengths: torch.Tensor, t: int) -> torch.Tensor:
    return torch.arange(t)[None, :] < lengths[:, None]


@dataclasses.dataclass
class ZooCase:
    name: str
    family: str
    source: str
    make: Callable[[], nn.Module]
    inputs: Callable[[int], tuple]
    dynamic_shapes: Callable[[], Any]
    oracle: Callable[[nn.Module, tuple], Any]
    loops: dict[str, int]
    """torchscan loops expected in the export: {'Scan': n, 'Loop': m}."""
    oracle_kind: str = "python loop"
    export_length: int = 4
    run_lengths: tuple[int, ...] = (1, 2, 5)
    grad_inputs: tuple[int, ...] = ()
    """Indices of the float inputs to take gradients with respect to."""
    random: bool = False
    """The model draws random numbers: runtimes cannot match eager value for value."""
    stops_gradients: bool = False
    """The model detaches values (``.detach()``, ``torch.no_grad()``): ONNX has no stop-gradient,
    so a module imported from its export differentiates through them."""
    atol: float = 1e-5
    rtol: float = 1e-4


CASES: dict[str, ZooCase] = {}


def register(case: ZooCase) -> ZooCase:
    CASES[case.name] = case
    return case


# ---------------------------------------------------------------------------------------------
# CRF (kmkurn/pytorch-crf torchcrf/__init__.py): log-likelihood and Viterbi, batch_first.
# ---------------------------------------------------------------------------------------------
K_TAGS, B_CRF = 5, 3


class CRFLogLikelihood(nn.Module):
    """CRF.forward(emissions, tags, mask, reduction='none') with batch_first=True."""

    def __init__(self, num_tags: int = K_TAGS) -> None:
        super().__init__()
        self.start_transitions = nn.Parameter(torch.empty(num_tags).uniform_(-0.1, 0.1))
        self.end_transitions = nn.Parameter(torch.empty(num_tags).uniform_(-0.1, 0.1))
        self.transitions = nn.Parameter(torch.empty(num_tags, num_tags).uniform_(-0.1, 0.1))

    def forward(self, emissions, tags, mask):
        return self._compute_score(emissions, tags, mask) - self._compute_normalizer(
            emissions, mask
        )

    def _compute_score(self, emissions, tags, mask):
        # the original: for i in range(1, seq_length): score += transitions[tags[i-1], tags[i]]...
        batch = torch.arange(emissions.shape[0])
        maskf = mask.to(emissions.dtype)
        score = self.start_transitions[tags[:, 0]] + emissions[batch, 0, tags[:, 0]]

        def body(i, score):
            i = i + 1
            score = score + self.transitions[tags[:, i - 1], tags[:, i]] * maskf[:, i]
            score = score + emissions[batch, i, tags[:, i]] * maskf[:, i]
            return score, None

        score, _ = torchscan.loop(body, score, trip_count=emissions.shape[1] - 1)
        seq_ends = mask.long().sum(dim=1) - 1
        last_tags = tags[batch, seq_ends]
        return score + self.end_transitions[last_tags]

    def _compute_normalizer(self, emissions, mask):
        score = self.start_transitions + emissions[:, 0]

        def step(score, x):
            emission, m = x
            next_score = score.unsqueeze(2) + self.transitions + emission.unsqueeze(1)
            next_score = torch.logsumexp(next_score, dim=1)
            return torch.where(m.unsqueeze(1), next_score, score), None

        score, _ = torchscan.scan(step, score, (emissions[:, 1:], mask[:, 1:]), axis=1)
        score = score + self.end_transitions
        return torch.logsumexp(score, dim=1)


class CRFViterbi(CRFLogLikelihood):
    """CRF.decode(emissions, mask) with back-pointers, returning padded tags and the best score."""

    def forward(self, emissions, mask):
        score = self.start_transitions + emissions[:, 0]

        def step(score, x):
            emission, m = x
            next_score = score.unsqueeze(2) + self.transitions + emission.unsqueeze(1)
            next_score, indices = next_score.max(dim=1)
            return torch.where(m.unsqueeze(1), next_score, score), indices

        score, history = torchscan.scan(
            step, score, (emissions[:, 1:], mask[:, 1:]), axis=1
        )  # history: (B, T-1, K)
        score = score + self.end_transitions
        best_score, best_last_tag = score.max(dim=1)
        seq_ends = mask.long().sum(dim=1) - 1
        positions = torch.arange(history.shape[1]).expand(emissions.shape[0], -1)

        def back(cur, x):
            hist, j = x
            prev = hist.gather(1, cur.unsqueeze(1)).squeeze(1)
            cur = torch.where(j < seq_ends, prev, cur)
            return cur, cur

        _, tags = torchscan.scan(back, best_last_tag, (history, positions), axis=1, reverse=True)
        tags = torch.cat([tags, best_last_tag.unsqueeze(1)], dim=1)
        return best_score, torch.where(mask, tags, torch.zeros_like(tags))


def crf_inputs(t):
    g = gen(100 + t)
    lengths = random_lengths(g, B_CRF, t)
    return (
        randn(g, B_CRF, t, K_TAGS),
        torch.randint(0, K_TAGS, (B_CRF, t), generator=g),
        length_mask(lengths, t),
    )


def crf_shapes():
    t = Dim("T", min=1)
    return ({1: t}, {1: t}, {1: t})


def torchcrf_from(port):
    import torchcrf

    crf = torchcrf.CRF(K_TAGS, batch_first=True)
    crf.start_transitions = port.start_transitions
    crf.end_transitions = port.end_transitions
    crf.transitions = port.transitions
    return crf


def crf_llh_oracle(port, inputs):
    emissions, tags, mask = inputs
    return torchcrf_from(port)(emissions, tags, mask, reduction="none")


def viterbi_score_loop(port, emissions, mask):
    score = port.start_transitions + emissions[:, 0]
    for i in range(1, emissions.shape[1]):
        nxt = (score.unsqueeze(2) + port.transitions + emissions[:, i].unsqueeze(1)).max(1)[0]
        score = torch.where(mask[:, i].unsqueeze(1), nxt, score)
    return (score + port.end_transitions).max(1)[0]


def crf_viterbi_oracle(port, inputs):
    emissions, mask = inputs
    best = torchcrf_from(port).decode(emissions, mask)
    tags = torch.zeros(mask.shape, dtype=torch.int64)
    for b, seq in enumerate(best):
        tags[b, : len(seq)] = torch.tensor(seq)
    return viterbi_score_loop(port, emissions, mask), tags


register(
    ZooCase(
        "crf-loglik",
        "CRF",
        "kmkurn/pytorch-crf torchcrf/__init__.py CRF.forward (_compute_score, _compute_normalizer)",
        seeded(CRFLogLikelihood),
        crf_inputs,
        crf_shapes,
        crf_llh_oracle,
        {"Scan": 1, "Loop": 1},
        oracle_kind="torchcrf.CRF(batch_first=True)",
        grad_inputs=(0,),
    )
)
register(
    ZooCase(
        "crf-viterbi",
        "CRF",
        "kmkurn/pytorch-crf torchcrf/__init__.py CRF.decode (_viterbi_decode)",
        seeded(CRFViterbi),
        lambda t: (crf_inputs(t)[0], crf_inputs(t)[2]),
        lambda: (lambda t: ({1: t}, {1: t}))(Dim("T", min=1)),
        crf_viterbi_oracle,
        {"Scan": 2},
        oracle_kind="torchcrf.CRF.decode (tags) + Python loop (score)",
        grad_inputs=(0,),
    )
)


# ---------------------------------------------------------------------------------------------
# Greedy and beam-search decoding with early stop (seq2seq decoders: GRU + dot attention).
# ---------------------------------------------------------------------------------------------
VOCAB, EMB, HID, EOS, PAD, B_DEC, BEAM = 7, 6, 8, 1, 0, 2, 3


class AttnDecoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, EMB)
        self.cell = nn.GRUCell(EMB + HID, HID)
        self.out = nn.Linear(2 * HID, VOCAB)
        with torch.no_grad():
            self.out.bias[EOS] += 1.5  # so that decoding ends within a few steps

    def step(self, h, token, memory):
        # memory: (N, S, HID); Luong-style dot attention with bmm
        scores = torch.bmm(memory, h.unsqueeze(2)).squeeze(2)
        context = torch.bmm(scores.softmax(-1).unsqueeze(1), memory).squeeze(1)
        h = self.cell(torch.cat([self.embed(token), context], -1), h)
        return h, self.out(torch.cat([h, context], -1))


class GreedyDecode(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.decoder = AttnDecoder()

    def forward(self, memory, h0, bos, max_len):
        def body(i, carry):
            h, token, finished = carry
            h, logits = self.decoder.step(h, token, memory)
            nxt = logits.argmax(-1)
            nxt = torch.where(finished, torch.full_like(nxt, PAD), nxt)
            finished = finished | (nxt == EOS)
            return (h, nxt, finished), nxt, torchscan.until(finished.all())

        init = (h0, bos, torch.zeros_like(bos, dtype=torch.bool))
        (h, _, finished), tokens = torchscan.loop(body, init, trip_count=max_len)
        return h, tokens.transpose(0, 1), finished


def greedy_oracle(port, inputs):
    memory, h, token, max_len = inputs
    finished = torch.zeros_like(token, dtype=torch.bool)
    tokens = []
    for _ in range(int(max_len)):
        h, logits = port.decoder.step(h, token, memory)
        nxt = logits.argmax(-1)
        nxt = torch.where(finished, torch.full_like(nxt, PAD), nxt)
        finished = finished | (nxt == EOS)
        token = nxt
        tokens.append(nxt)
        if bool(finished.all()):
            break
    return h, torch.stack(tokens, 1), finished


def decode_inputs(t):
    g = gen(200 + t)
    return (
        randn(g, B_DEC, t, HID),
        randn(g, B_DEC, HID),
        torch.randint(2, VOCAB, (B_DEC,), generator=g),
        torch.tensor(6),
    )


def decode_shapes():
    return ({1: Dim("S", min=1)}, None, None, None)


register(
    ZooCase(
        "greedy-decode",
        "decoding",
        "seq2seq greedy decoding (OpenNMT/fairseq style: argmax, finished mask, "
        "stop when all finished)",
        seeded(GreedyDecode),
        decode_inputs,
        decode_shapes,
        greedy_oracle,
        {"Loop": 1},
        grad_inputs=(0, 1),
    )
)


class BeamSearch(nn.Module):
    """Beam search: topk over (beam x vocab), gather of the surviving beams' states,
    back-pointers, finished beams extended by EOS at no cost, stop when every beam finished."""

    def __init__(self) -> None:
        super().__init__()
        self.decoder = AttnDecoder()
        eos_row = torch.full((VOCAB,), -1e9)
        eos_row[EOS] = 0.0
        self.register_buffer("eos_row", eos_row)

    def forward(self, memory, h0, bos, max_len):
        n = memory.shape[0]
        memory_k = memory.repeat_interleave(BEAM, dim=0)  # (N*K, S, H)
        h0 = h0.repeat_interleave(BEAM, dim=0)
        token0 = bos.repeat_interleave(BEAM, dim=0)
        scores0 = torch.tensor([0.0] + [-1e9] * (BEAM - 1)).repeat(n, 1)
        finished0 = torch.zeros(n, BEAM, dtype=torch.bool)

        def body(i, carry):
            h, token, scores, finished = carry
            h, logits = self.decoder.step(h, token, memory_k)
            logp = logits.log_softmax(-1).view(n, BEAM, VOCAB)
            logp = torch.where(finished.unsqueeze(-1), self.eos_row, logp)
            cand = (scores.unsqueeze(-1) + logp).view(n, BEAM * VOCAB)
            top_scores, top_idx = cand.topk(BEAM, dim=-1)
            beam_idx = top_idx // VOCAB
            token = top_idx % VOCAB
            h = h.view(n, BEAM, HID).gather(1, beam_idx.unsqueeze(-1).expand(n, BEAM, HID))
            finished = finished.gather(1, beam_idx) | (token == EOS)
            carry = (h.reshape(n * BEAM, HID), token.reshape(-1), top_scores, finished)
            return carry, (token, beam_idx), torchscan.until(finished.all())

        (_, _, scores, _), (tokens, back) = torchscan.loop(
            body, (h0, token0, scores0, finished0), trip_count=max_len
        )

        def backtrack(cur, x):
            tok, bp = x
            return bp.gather(1, cur), tok.gather(1, cur)

        cur0 = torch.arange(BEAM).repeat(n, 1)
        _, seqs = torchscan.scan(backtrack, cur0, (tokens, back), reverse=True)
        return scores, seqs.permute(1, 2, 0)  # (N, K, steps)


def beam_oracle(port, inputs):
    memory, h, bos, max_len = inputs
    n = memory.shape[0]
    memory_k = memory.repeat_interleave(BEAM, dim=0)
    h = h.repeat_interleave(BEAM, dim=0)
    token = bos.repeat_interleave(BEAM, dim=0)
    scores = torch.tensor([0.0] + [-1e9] * (BEAM - 1)).repeat(n, 1)
    finished = torch.zeros(n, BEAM, dtype=torch.bool)
    history = []
    for _ in range(int(max_len)):
        h, logits = port.decoder.step(h, token, memory_k)
        logp = logits.log_softmax(-1).view(n, BEAM, VOCAB)
        logp = torch.where(finished.unsqueeze(-1), port.eos_row, logp)
        cand = (scores.unsqueeze(-1) + logp).view(n, BEAM * VOCAB)
        scores, idx = cand.topk(BEAM, dim=-1)
        beam_idx, tok = idx // VOCAB, idx % VOCAB
        h = h.view(n, BEAM, HID)[torch.arange(n)[:, None], beam_idx].reshape(n * BEAM, HID)
        finished = finished[torch.arange(n)[:, None], beam_idx] | (tok == EOS)
        token = tok.reshape(-1)
        history.append((tok, beam_idx))
        if bool(finished.all()):
            break
    cur = torch.arange(BEAM).repeat(n, 1)
    seq = []
    for tok, bp in reversed(history):
        seq.append(tok.gather(1, cur))
        cur = bp.gather(1, cur)
    return scores, torch.stack(seq[::-1], -1)


register(
    ZooCase(
        "beam-search",
        "decoding",
        "beam search as in fairseq/HF generate: topk over beam*vocab, //, %, gather, back-pointers",
        seeded(BeamSearch),
        decode_inputs,
        decode_shapes,
        beam_oracle,
        {"Loop": 1, "Scan": 1},
        grad_inputs=(0, 1),
    )
)


# ---------------------------------------------------------------------------------------------
# CTC forward (alpha) recursion in log space.
# ---------------------------------------------------------------------------------------------
C_CTC, S_CTC, B_CTC, BLANK = 5, 3, 3, 0


class CTCForward(nn.Module):
    """-log p(target | logits) by the alpha recursion over the blank-extended target."""

    def forward(self, logits, targets, input_lengths, target_lengths):
        log_probs = logits.log_softmax(-1)  # (T, N, C)
        n, s = targets.shape
        blanks = torch.full_like(targets, BLANK)
        ext = torch.cat([torch.stack([blanks, targets], -1).view(n, 2 * s), blanks[:, :1]], 1)
        prev2 = F.pad(ext[:, :-2], (2, 0), value=BLANK)
        skip = (ext != BLANK) & (ext != prev2)
        neg_inf = torch.tensor(float("-inf"))
        first = torch.arange(2 * s + 1) < 2
        alpha = torch.where(first, log_probs[0].gather(1, ext), neg_inf)

        def step(alpha, x):
            lp, t = x
            a2 = F.pad(alpha[:, :-1], (1, 0), value=float("-inf"))
            a3 = F.pad(alpha[:, :-2], (2, 0), value=float("-inf"))
            a3 = torch.where(skip, a3, neg_inf)
            paths = torch.stack([alpha, a2, a3])
            # logsumexp whose gradient stays finite where no path reaches a state yet
            dead = torch.isinf(paths).all(0)
            lse = torch.logsumexp(torch.where(dead, torch.zeros_like(paths), paths), 0)
            new = torch.where(dead, neg_inf, lse) + lp.gather(1, ext)
            return torch.where((t < input_lengths).unsqueeze(1), new, alpha), None

        times = torch.arange(1, log_probs.shape[0])
        alpha, _ = torchscan.scan(step, alpha, (log_probs[1:], times))
        ends = torch.stack([2 * target_lengths, 2 * target_lengths - 1], 1)
        return -torch.logsumexp(alpha.gather(1, ends), 1)


def ctc_oracle(port, inputs):
    logits, targets, input_lengths, target_lengths = inputs
    return F.ctc_loss(
        logits.log_softmax(-1), targets, input_lengths, target_lengths, BLANK, reduction="none"
    )


def ctc_inputs(t):
    g = gen(300 + t)
    return (
        randn(g, t, B_CTC, C_CTC),
        torch.randint(1, C_CTC, (B_CTC, S_CTC), generator=g),
        (t - torch.randint(0, 3, (B_CTC,), generator=g)).clamp(min=1),
        torch.tensor([S_CTC, 1, 2])[:B_CTC],
    )


register(
    ZooCase(
        "ctc-alpha",
        "CTC",
        "CTC forward variable recursion (Graves 2006; as in torch's ctc_loss CPU kernel)",
        seeded(CTCForward),
        ctc_inputs,
        lambda: ({0: Dim("T", min=1)}, None, None, None),
        ctc_oracle,
        {"Scan": 1},
        oracle_kind="torch.nn.functional.ctc_loss(reduction='none')",
        export_length=7,
        run_lengths=(1, 2, 9),
        grad_inputs=(0,),
    )
)


# ---------------------------------------------------------------------------------------------
# Fixed-grid ODE solvers (rtqichen/torchdiffeq _impl/solvers.py FixedGridODESolver.integrate).
# ---------------------------------------------------------------------------------------------
D_ODE, B_ODE = 3, 2


class ODEFunc(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(D_ODE + 1, 16), nn.Tanh(), nn.Linear(16, D_ODE))

    def forward(self, t, y):
        return self.net(torch.cat([y, t.expand(*y.shape[:-1], 1)], -1))


class FixedGridODE(nn.Module):
    def __init__(self, method: str) -> None:
        super().__init__()
        self.func = ODEFunc()
        self.method = method

    def _step_func(self, t0, dt, t1, y0):
        f = self.func
        if self.method == "euler":
            return dt * f(t0, y0)
        if self.method == "midpoint":
            half_dt = 0.5 * dt
            y_mid = y0 + f(t0, y0) * half_dt
            return dt * f(t0 + half_dt, y_mid)
        # torchdiffeq's rk4 is rk4_alt_step_func (the 3/8 rule)
        k1 = f(t0, y0)
        k2 = f(t0 + dt / 3, y0 + dt * k1 / 3)
        k3 = f(t0 + dt * 2 / 3, y0 + dt * (k2 - k1 / 3))
        k4 = f(t1, y0 + dt * (k1 - k2 + k3))
        return (k1 + 3 * (k2 + k3) + k4) * dt * 0.125

    def forward(self, y0, t):
        def step(y0, ts):
            t0, t1 = ts
            y1 = y0 + self._step_func(t0, t1 - t0, t1, y0)
            return y1, y1

        _, ys = torchscan.scan(step, y0, (t[:-1], t[1:]))
        return torch.cat([y0.unsqueeze(0), ys], 0)


def ode_oracle(port, inputs):
    import torchdiffeq

    y0, t = inputs
    return torchdiffeq.odeint(port.func, y0, t, method=port.method)


def ode_inputs(t):
    g = gen(400 + t)
    return randn(g, B_ODE, D_ODE), torch.cumsum(0.05 + 0.2 * rand(g, t), 0)


for _method in ("euler", "midpoint", "rk4"):
    register(
        ZooCase(
            f"ode-{_method}",
            "ODE",
            f"rtqichen/torchdiffeq fixed_grid.py {_method} + FixedGridODESolver.integrate",
            seeded(lambda m=_method: FixedGridODE(m)),
            ode_inputs,
            lambda: (None, {0: Dim("T", min=1)}),
            ode_oracle,
            {"Scan": 1},
            oracle_kind=f"torchdiffeq.odeint(method='{_method}')",
            grad_inputs=(0, 1),
        )
    )


# ---------------------------------------------------------------------------------------------
# Diffusion samplers: DDPM p_sample_loop (openai/improved-diffusion gaussian_diffusion.py) and
# DDIM step (huggingface/diffusers schedulers/scheduling_ddim.py), eps-prediction MLP.
# ---------------------------------------------------------------------------------------------
D_DIFF, B_DIFF, NUM_TRAIN = 4, 2, 1000


def timestep_embedding(timesteps, dim, max_period=10000):
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half)
    args = timesteps[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class EpsModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.temb = nn.Linear(8, 16)
        self.inp = nn.Linear(D_DIFF, 16)
        self.out = nn.Linear(16, D_DIFF)

    def forward(self, x, t):
        h = self.inp(x) + self.temb(timestep_embedding(t, 8))
        return self.out(F.silu(h))


def _extract_into_tensor(arr, timesteps, broadcast_shape):
    res = arr[timesteps].float()
    while len(res.shape) < len(broadcast_shape):
        res = res[..., None]
    return res.expand(broadcast_shape)


class DDPMSampler(nn.Module):
    def __init__(self, num_timesteps: int = NUM_TRAIN, random: bool = False) -> None:
        super().__init__()
        self.model = EpsModel()
        self.random = random
        betas = torch.linspace(1e-4, 0.02, num_timesteps, dtype=torch.float64)
        alphas_cumprod = torch.cumprod(1.0 - betas, 0)
        prev = torch.cat([torch.ones(1, dtype=torch.float64), alphas_cumprod[:-1]])
        post_var = betas * (1.0 - prev) / (1.0 - alphas_cumprod)
        for name, value in {
            "sqrt_recip_alphas_cumprod": (1.0 / alphas_cumprod).sqrt(),
            "sqrt_recipm1_alphas_cumprod": (1.0 / alphas_cumprod - 1).sqrt(),
            "posterior_log_variance_clipped": torch.log(torch.cat([post_var[1:2], post_var[1:]])),
            "posterior_mean_coef1": betas * prev.sqrt() / (1.0 - alphas_cumprod),
            "posterior_mean_coef2": (1.0 - prev) * (1.0 - betas).sqrt() / (1.0 - alphas_cumprod),
        }.items():
            self.register_buffer(name, value.float())

    def p_sample(self, x, t, noise):
        eps = self.model(x, t)
        pred_xstart = (
            _extract_into_tensor(self.sqrt_recip_alphas_cumprod, t, x.shape) * x
            - _extract_into_tensor(self.sqrt_recipm1_alphas_cumprod, t, x.shape) * eps
        )
        pred_xstart = pred_xstart.clamp(-1, 1)
        mean = (
            _extract_into_tensor(self.posterior_mean_coef1, t, x.shape) * pred_xstart
            + _extract_into_tensor(self.posterior_mean_coef2, t, x.shape) * x
        )
        log_var = _extract_into_tensor(self.posterior_log_variance_clipped, t, x.shape)
        nonzero_mask = (t != 0).float().view(-1, *([1] * (len(x.shape) - 1)))
        return mean + nonzero_mask * torch.exp(0.5 * log_var) * noise

    def forward(self, x_T, timesteps, noise):
        # for i in indices[::-1]: t = th.tensor([i] * shape[0]); img = p_sample(model, img, t)
        def step(img, x):
            i, z = x
            t = i.expand(img.shape[0])
            if self.random:
                z = torch.randn_like(img)
            img = self.p_sample(img, t, z)
            return img, None

        img, _ = torchscan.scan(step, x_T, (timesteps, noise), reverse=True)
        return img


def ddpm_oracle(port, inputs):
    img, timesteps, noise = inputs
    for k in reversed(range(timesteps.shape[0])):
        t = torch.tensor([int(timesteps[k])] * img.shape[0])
        z = torch.randn_like(img) if port.random else noise[k]
        img = port.p_sample(img, t, z)
    return img


def ddpm_inputs(t):
    g = gen(500 + t)
    stride = NUM_TRAIN // t
    return randn(g, B_DIFF, D_DIFF), torch.arange(t) * stride, randn(g, t, B_DIFF, D_DIFF)


register(
    ZooCase(
        "ddpm-sample",
        "diffusion",
        "openai/improved-diffusion gaussian_diffusion.py p_sample_loop / p_sample / "
        "_extract_into_tensor",
        seeded(DDPMSampler),
        ddpm_inputs,
        lambda: (lambda t: (None, {0: t}, {0: t}))(Dim("T", min=1)),
        ddpm_oracle,
        {"Scan": 1},
        grad_inputs=(0, 2),
    )
)
register(
    ZooCase(
        "ddpm-sample-randn",
        "diffusion",
        "as ddpm-sample, with the noise drawn inside the loop (th.randn_like(x)), as the original",
        seeded(lambda: DDPMSampler(random=True)),
        ddpm_inputs,
        lambda: (lambda t: (None, {0: t}, {0: t}))(Dim("T", min=1)),
        ddpm_oracle,
        {"Scan": 1},
        grad_inputs=(0,),
        random=True,
    )
)


class DDIMSampler(nn.Module):
    """for t in scheduler.timesteps: eps = unet(sample, t); sample = scheduler.step(eps, t,
    sample).prev_sample, with eta = 0 (diffusers DDIMScheduler.step)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = EpsModel()
        betas = torch.linspace(0.0001, 0.02, NUM_TRAIN, dtype=torch.float32)
        self.register_buffer("alphas_cumprod", torch.cumprod(1.0 - betas, 0))
        self.register_buffer("final_alpha_cumprod", torch.tensor(1.0))

    def step_fn(self, model_output, timestep, sample, num_inference_steps):
        prev_timestep = timestep - NUM_TRAIN // num_inference_steps
        alpha_prod_t = self.alphas_cumprod[timestep]
        # original: alphas_cumprod[prev] if prev >= 0 else final_alpha_cumprod
        alpha_prod_t_prev = torch.where(
            prev_timestep >= 0,
            self.alphas_cumprod[prev_timestep.clamp(min=0)],
            self.final_alpha_cumprod,
        )
        beta_prod_t = 1 - alpha_prod_t
        pred_original_sample = (sample - beta_prod_t**0.5 * model_output) / alpha_prod_t**0.5
        pred_sample_direction = (1 - alpha_prod_t_prev) ** 0.5 * model_output
        return alpha_prod_t_prev**0.5 * pred_original_sample + pred_sample_direction

    def forward(self, sample, timesteps):
        n = timesteps.shape[0]

        def step(sample, t):
            eps = self.model(sample, t.expand(sample.shape[0]))
            return self.step_fn(eps, t, sample, n), None

        sample, _ = torchscan.scan(step, sample, timesteps)
        return sample


def ddim_oracle(port, inputs):
    sample, timesteps = inputs
    n = timesteps.shape[0]
    for t in timesteps:
        eps = port.model(sample, t.expand(sample.shape[0]))
        prev_t = int(t) - NUM_TRAIN // n
        a_t = port.alphas_cumprod[t]
        a_prev = port.alphas_cumprod[prev_t] if prev_t >= 0 else port.final_alpha_cumprod
        x0 = (sample - (1 - a_t) ** 0.5 * eps) / a_t**0.5
        sample = a_prev**0.5 * x0 + (1 - a_prev) ** 0.5 * eps
    return sample


def ddim_inputs(t):
    g = gen(600 + t)
    step_ratio = NUM_TRAIN // t
    return randn(g, B_DIFF, D_DIFF), (torch.arange(t) * step_ratio).flip(0)


register(
    ZooCase(
        "ddim-sample",
        "diffusion",
        "huggingface/diffusers scheduling_ddim.py DDIMScheduler.step (eta=0) in the pipeline loop",
        seeded(DDIMSampler),
        ddim_inputs,
        lambda: (None, {0: Dim("T", min=1)}),
        ddim_oracle,
        {"Scan": 1},
        grad_inputs=(0,),
    )
)


# ---------------------------------------------------------------------------------------------
# State-space models: Mamba selective_scan_ref, LRU diagonal complex recurrence.
# ---------------------------------------------------------------------------------------------
B_SSM, D_SSM, N_SSM = 2, 4, 3


class SelectiveScanRef(nn.Module):
    """state-spaces/mamba mamba_ssm/ops/selective_scan_interface.py selective_scan_ref, real A,
    variable B and C, D skip, z gate, delta_bias and softplus."""

    def __init__(self) -> None:
        super().__init__()
        self.A_log = nn.Parameter(torch.log(torch.arange(1, N_SSM + 1.0)).repeat(D_SSM, 1))
        self.D = nn.Parameter(torch.ones(D_SSM))
        self.delta_bias = nn.Parameter(torch.rand(D_SSM) * 0.1)

    def forward(self, u, delta, B, C, z):
        A = -torch.exp(self.A_log)
        delta = F.softplus(delta + self.delta_bias[..., None])
        batch, dim, dstate = u.shape[0], A.shape[0], A.shape[1]
        x0 = A.new_zeros((batch, dim, dstate))
        deltaA = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
        deltaB_u = torch.einsum("bdl,bnl,bdl->bdln", delta, B, u)

        def body(i, x):
            x = deltaA[:, :, i] * x + deltaB_u[:, :, i]
            y = torch.einsum("bdn,bn->bd", x, C[:, :, i])
            return x, y

        last_state, ys = torchscan.loop(body, x0, trip_count=u.shape[2])
        y = ys.permute(1, 2, 0)  # torch.stack(ys, dim=2)
        out = y + u * self.D[:, None]
        return out * F.silu(z), last_state


def mamba_oracle(port, inputs):
    u, delta, B, C, z = inputs
    A = -torch.exp(port.A_log)
    delta = F.softplus(delta + port.delta_bias[..., None])
    x = A.new_zeros((u.shape[0], A.shape[0], A.shape[1]))
    deltaA = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
    deltaB_u = torch.einsum("bdl,bnl,bdl->bdln", delta, B, u)
    ys = []
    for i in range(u.shape[2]):
        x = deltaA[:, :, i] * x + deltaB_u[:, :, i]
        ys.append(torch.einsum("bdn,bn->bd", x, C[:, :, i]))
    y = torch.stack(ys, dim=2) if ys else u.new_zeros(u.shape)
    return (y + u * port.D[:, None]) * F.silu(z), x


def mamba_inputs(t):
    g = gen(700 + t)
    return (
        randn(g, B_SSM, D_SSM, t),
        randn(g, B_SSM, D_SSM, t),
        randn(g, B_SSM, N_SSM, t),
        randn(g, B_SSM, N_SSM, t),
        randn(g, B_SSM, D_SSM, t),
    )


register(
    ZooCase(
        "mamba-selective-scan",
        "SSM",
        "state-spaces/mamba mamba_ssm/ops/selective_scan_interface.py selective_scan_ref",
        seeded(SelectiveScanRef),
        mamba_inputs,
        lambda: (lambda t: tuple({2: t} for _ in range(5)))(Dim("L", min=1)),
        mamba_oracle,
        {"Loop": 1},
        grad_inputs=(0, 1, 2, 3, 4),
    )
)


class LRU(nn.Module):
    """Linear Recurrent Unit (Orvieto et al. 2023), complex diagonal recurrence
    h_t = Lambda * h_{t-1} + gamma * (B u_t), y_t = Re(C h_t) + D * u_t, as in its PyTorch ports."""

    def __init__(self, d_model: int = 3, d_state: int = 4, r_min=0.4, r_max=0.9) -> None:
        super().__init__()
        u1, u2 = torch.rand(d_state), torch.rand(d_state)
        nu_log = torch.log(-0.5 * torch.log(u1 * (r_max**2 - r_min**2) + r_min**2))
        theta_log = torch.log(u2 * math.pi * 2)
        self.nu_log = nn.Parameter(nu_log)
        self.theta_log = nn.Parameter(theta_log)
        lam_abs = torch.exp(-torch.exp(nu_log))
        self.gamma_log = nn.Parameter(torch.log(torch.sqrt(1 - lam_abs**2)))
        self.B_re = nn.Parameter(torch.randn(d_state, d_model) / math.sqrt(2 * d_model))
        self.B_im = nn.Parameter(torch.randn(d_state, d_model) / math.sqrt(2 * d_model))
        self.C_re = nn.Parameter(torch.randn(d_model, d_state) / math.sqrt(d_state))
        self.C_im = nn.Parameter(torch.randn(d_model, d_state) / math.sqrt(d_state))
        self.D = nn.Parameter(torch.randn(d_model))

    def forward(self, u, h0_re):  # u: (B, T, d_model)
        lam = torch.exp(torch.complex(-torch.exp(self.nu_log), torch.exp(self.theta_log)))
        b_norm = torch.complex(self.B_re, self.B_im) * torch.exp(self.gamma_log).unsqueeze(-1)
        c = torch.complex(self.C_re, self.C_im)
        bu = u.to(b_norm.dtype) @ b_norm.T  # (B, T, d_state) complex

        def step(h, bu_t):
            h = lam * h + bu_t
            return h, (h @ c.T).real

        h0 = torch.complex(h0_re, torch.zeros_like(h0_re))
        h, ys = torchscan.scan(step, h0, bu, axis=1)
        return ys + self.D * u, h.real


def lru_oracle(port, inputs):
    u, h0_re = inputs
    lam = torch.exp(torch.complex(-torch.exp(port.nu_log), torch.exp(port.theta_log)))
    b_norm = torch.complex(port.B_re, port.B_im) * torch.exp(port.gamma_log).unsqueeze(-1)
    c = torch.complex(port.C_re, port.C_im)
    bu = u.to(b_norm.dtype) @ b_norm.T
    h = torch.complex(h0_re, torch.zeros_like(h0_re))
    ys = []
    for t in range(u.shape[1]):
        h = lam * h + bu[:, t]
        ys.append((h @ c.T).real)
    return torch.stack(ys, 1) + port.D * u, h.real


register(
    ZooCase(
        "lru-complex",
        "SSM",
        "LRU (Orvieto et al. 2023) complex diagonal recurrence, PyTorch ports",
        seeded(LRU),
        lambda t: (lambda g: (randn(g, 2, t, 3), randn(g, 2, 4)))(gen(800 + t)),
        lambda: ({1: Dim("T", min=1)}, None),
        lru_oracle,
        {"Scan": 1},
        grad_inputs=(0, 1),
    )
)


class LRUReal(LRU):
    """The LRU with the complex state kept as its real and imaginary parts, the form that ONNX
    can hold (ONNX has no complex arithmetic): ``(a + ib)(c + id) = (ac - bd) + i(ad + bc)``."""

    def forward(self, u, h0_re):
        modulus = torch.exp(-torch.exp(self.nu_log))
        angle = torch.exp(self.theta_log)
        lam_re, lam_im = modulus * torch.cos(angle), modulus * torch.sin(angle)
        gamma = torch.exp(self.gamma_log).unsqueeze(-1)
        bu_re, bu_im = u @ (self.B_re * gamma).T, u @ (self.B_im * gamma).T

        def step(h, bu_t):
            h_re, h_im = h
            x_re, x_im = bu_t
            h_re, h_im = lam_re * h_re - lam_im * h_im + x_re, lam_re * h_im + lam_im * h_re + x_im
            return (h_re, h_im), h_re @ self.C_re.T - h_im @ self.C_im.T

        (h_re, _), ys = torchscan.scan(
            step, (h0_re, torch.zeros_like(h0_re)), (bu_re, bu_im), axis=1
        )
        return ys + self.D * u, h_re


register(
    ZooCase(
        "lru-real",
        "SSM",
        "LRU (Orvieto et al. 2023) diagonal recurrence, complex state as real and imaginary parts",
        seeded(LRUReal),
        lambda t: (lambda g: (randn(g, 2, t, 3), randn(g, 2, 4)))(gen(800 + t)),
        lambda: ({1: Dim("T", min=1)}, None),
        lru_oracle,
        {"Scan": 1},
        grad_inputs=(0, 1),
    )
)


# ---------------------------------------------------------------------------------------------
# Linear attention: fla gated recurrent form, RetNet recurrent form, RWKV-4 WKV.
# ---------------------------------------------------------------------------------------------
B_LA, H_LA, K_LA, V_LA = 2, 2, 3, 4


class GatedLinearAttentionRecurrent(nn.Module):
    """fla (fla-org/flash-linear-attention) naive fused_recurrent reference:
    h = h * g[:, :, i].exp()[..., None] + k[:, :, i, :, None] * v[:, :, i, None, :];
    o[:, :, i] = (q[:, :, i, :, None] * h).sum(-2)."""

    def forward(self, q, k, v, g):  # (B, H, T, K|V)
        q = q * K_LA**-0.5
        h0 = q.new_zeros(q.shape[0], q.shape[1], K_LA, V_LA)

        def body(i, h):
            h = h * g[:, :, i].exp()[..., None] + k[:, :, i, :, None] * v[:, :, i, None, :]
            return h, (q[:, :, i, :, None] * h).sum(-2)

        h, o = torchscan.loop(body, h0, trip_count=q.shape[2])
        return o.permute(1, 2, 0, 3), h


def gla_oracle(port, inputs):
    q, k, v, g = inputs
    q = q * K_LA**-0.5
    h = q.new_zeros(q.shape[0], q.shape[1], K_LA, V_LA)
    o = torch.zeros_like(v)
    for i in range(q.shape[2]):
        h = h * g[:, :, i].exp()[..., None] + k[:, :, i, :, None] * v[:, :, i, None, :]
        o[:, :, i] = (q[:, :, i, :, None] * h).sum(-2)
    return o, h


def gla_inputs(t):
    g = gen(900 + t)
    return (
        randn(g, B_LA, H_LA, t, K_LA),
        randn(g, B_LA, H_LA, t, K_LA),
        randn(g, B_LA, H_LA, t, V_LA),
        F.logsigmoid(randn(g, B_LA, H_LA, t, K_LA)),
    )


register(
    ZooCase(
        "gla-recurrent",
        "linear attention",
        "fla-org/flash-linear-attention naive recurrent reference (gated linear attention)",
        seeded(GatedLinearAttentionRecurrent),
        gla_inputs,
        lambda: (lambda t: tuple({2: t} for _ in range(4)))(Dim("T", min=1)),
        gla_oracle,
        {"Loop": 1},
        grad_inputs=(0, 1, 2, 3),
    )
)


class RetNetRecurrent(nn.Module):
    """microsoft/torchscale MultiScaleRetention.recurrent_forward over a sequence (no xpos)."""

    def __init__(self, embed: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, embed // heads
        self.q_proj = nn.Linear(embed, embed, bias=False)
        self.k_proj = nn.Linear(embed, embed, bias=False)
        self.v_proj = nn.Linear(embed, embed, bias=False)
        self.g_proj = nn.Linear(embed, embed, bias=False)
        self.out_proj = nn.Linear(embed, embed, bias=False)
        self.group_norm = nn.LayerNorm(self.head_dim, elementwise_affine=False)
        self.register_buffer(
            "decay", torch.log(1 - 2 ** (-5 - torch.arange(heads, dtype=torch.float)))
        )

    def forward(self, x):  # (B, T, E)
        bsz, t, _ = x.shape
        q = self.q_proj(x).view(bsz, t, self.heads, self.head_dim)
        k = self.k_proj(x).view(bsz, t, self.heads, self.head_dim) * self.head_dim**-0.5
        v = self.v_proj(x).view(bsz, t, self.heads, self.head_dim)
        decay = self.decay.exp()

        def step(state, qkv):
            prev_kv, prev_scale = state
            qr, kr, vr = qkv
            kv = kr.unsqueeze(-1) * vr.unsqueeze(-2)
            scale = prev_scale * decay + 1
            kv = prev_kv * (prev_scale.sqrt() * decay / scale.sqrt()).view(
                -1, 1, 1
            ) + kv / scale.sqrt().view(-1, 1, 1)
            return (kv, scale), torch.sum(qr.unsqueeze(-1) * kv, dim=-2)

        init = (x.new_zeros(bsz, self.heads, self.head_dim, self.head_dim), x.new_zeros(self.heads))
        _, out = torchscan.scan(step, init, (q, k, v), axis=1)  # (B, T, H, D)
        out = self.group_norm(out).reshape(bsz, t, -1)
        return self.out_proj(F.silu(self.g_proj(x)) * out)


def retnet_oracle(port, inputs):
    (x,) = inputs
    bsz, t, _ = x.shape
    q = port.q_proj(x).view(bsz, t, port.heads, port.head_dim)
    k = port.k_proj(x).view(bsz, t, port.heads, port.head_dim) * port.head_dim**-0.5
    v = port.v_proj(x).view(bsz, t, port.heads, port.head_dim)
    decay = port.decay.exp()
    prev_kv = x.new_zeros(bsz, port.heads, port.head_dim, port.head_dim)
    prev_scale = x.new_zeros(port.heads)
    outs = []
    for i in range(t):
        kv = k[:, i].unsqueeze(-1) * v[:, i].unsqueeze(-2)
        scale = prev_scale * decay + 1
        kv = prev_kv * (prev_scale.sqrt() * decay / scale.sqrt()).view(
            -1, 1, 1
        ) + kv / scale.sqrt().view(-1, 1, 1)
        prev_kv, prev_scale = kv, scale
        outs.append(torch.sum(q[:, i].unsqueeze(-1) * kv, dim=-2))
    out = port.group_norm(torch.stack(outs, 1)).reshape(bsz, t, -1)
    return port.out_proj(F.silu(port.g_proj(x)) * out)


register(
    ZooCase(
        "retnet-recurrent",
        "linear attention",
        "microsoft/torchscale retnet multiscale_retention.py recurrent_forward",
        seeded(RetNetRecurrent),
        lambda t: (randn(gen(1000 + t), 2, t, 8),),
        lambda: ({1: Dim("T", min=1)},),
        retnet_oracle,
        {"Scan": 1},
        grad_inputs=(0,),
    )
)


class RWKV4TimeMix(nn.Module):
    """BlinkDL/RWKV-LM RWKV-v4 model_run.py time mixing: token shift and the numerically stable
    WKV recurrence with state (aa, bb, pp)."""

    def __init__(self, c: int = 6) -> None:
        super().__init__()
        self.time_decay = nn.Parameter(torch.randn(c) * 0.5)
        self.time_first = nn.Parameter(torch.randn(c) * 0.5)
        self.time_mix_k = nn.Parameter(torch.rand(c))
        self.time_mix_v = nn.Parameter(torch.rand(c))
        self.time_mix_r = nn.Parameter(torch.rand(c))
        self.key = nn.Linear(c, c, bias=False)
        self.value = nn.Linear(c, c, bias=False)
        self.receptance = nn.Linear(c, c, bias=False)
        self.output = nn.Linear(c, c, bias=False)

    def forward(self, x, state_x):  # x: (B, T, C); state_x: last token of the previous chunk
        xx = torch.cat([state_x.unsqueeze(1), x[:, :-1]], 1)
        k = self.key(x * self.time_mix_k + xx * (1 - self.time_mix_k))
        v = self.value(x * self.time_mix_v + xx * (1 - self.time_mix_v))
        r = torch.sigmoid(self.receptance(x * self.time_mix_r + xx * (1 - self.time_mix_r)))
        w = -torch.exp(self.time_decay)
        u = self.time_first

        def step(state, kv):
            aa, bb, pp = state
            kt, vt = kv
            ww = u + kt
            p = torch.maximum(pp, ww)
            e1, e2 = torch.exp(pp - p), torch.exp(ww - p)
            wkv = (e1 * aa + e2 * vt) / (e1 * bb + e2)
            ww = pp + w
            p = torch.maximum(ww, kt)
            e1, e2 = torch.exp(ww - p), torch.exp(kt - p)
            return (e1 * aa + e2 * vt, e1 * bb + e2, p), wkv

        zeros = x.new_zeros(x.shape[0], x.shape[2])
        init = (zeros, zeros, zeros - 1e30)
        state, wkv = torchscan.scan(step, init, (k, v), axis=1)
        return self.output(r * wkv), state


def rwkv_oracle(port, inputs):
    x, state_x = inputs
    xx = torch.cat([state_x.unsqueeze(1), x[:, :-1]], 1)
    k = port.key(x * port.time_mix_k + xx * (1 - port.time_mix_k))
    v = port.value(x * port.time_mix_v + xx * (1 - port.time_mix_v))
    r = torch.sigmoid(port.receptance(x * port.time_mix_r + xx * (1 - port.time_mix_r)))
    w, u = -torch.exp(port.time_decay), port.time_first
    aa = bb = x.new_zeros(x.shape[0], x.shape[2])
    pp = aa - 1e30
    outs = []
    for t in range(x.shape[1]):
        kt, vt = k[:, t], v[:, t]
        ww = u + kt
        p = torch.maximum(pp, ww)
        e1, e2 = torch.exp(pp - p), torch.exp(ww - p)
        outs.append((e1 * aa + e2 * vt) / (e1 * bb + e2))
        ww = pp + w
        p = torch.maximum(ww, kt)
        e1, e2 = torch.exp(ww - p), torch.exp(kt - p)
        aa, bb, pp = e1 * aa + e2 * vt, e1 * bb + e2, p
    return port.output(r * torch.stack(outs, 1)), (aa, bb, pp)


register(
    ZooCase(
        "rwkv4-wkv",
        "linear attention",
        "BlinkDL/RWKV-LM RWKV-v4 src/model_run.py (RNN mode time mixing, token shift)",
        seeded(RWKV4TimeMix),
        lambda t: (lambda g: (randn(g, 2, t, 6), randn(g, 2, 6)))(gen(1100 + t)),
        lambda: ({1: Dim("T", min=1)}, None),
        rwkv_oracle,
        {"Scan": 1},
        grad_inputs=(0, 1),
    )
)


# ---------------------------------------------------------------------------------------------
# QRNN (salesforce/pytorch-qrnn torchqrnn/qrnn.py, forget_mult.py CPUForgetMult), window 2.
# ---------------------------------------------------------------------------------------------
class QRNNLayer(nn.Module):
    def __init__(self, input_size: int = 3, hidden_size: int = 5) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.linear = nn.Linear(2 * input_size, 3 * hidden_size)

    def forget_mult(self, f, x, hidden_init):
        fx = f * x
        forgets = f

        def body(i, prev_h):
            h = fx[i] + (1 - forgets[i]) * prev_h
            return h, h

        _, result = torchscan.loop(body, hidden_init, trip_count=f.shape[0])
        return result

    def forward(self, X, hidden, prevX):  # X: (T, B, input)
        Xm1 = torch.cat([prevX.unsqueeze(0), X[:-1]], 0)  # window = 2
        Y = self.linear(torch.cat([X, Xm1], 2))
        Z, Fg, Og = Y.chunk(3, dim=2)
        Z, Fg = torch.tanh(Z), torch.sigmoid(Fg)
        C = self.forget_mult(Fg, Z, hidden)
        H = torch.sigmoid(Og) * C
        return H, C[-1:]


def qrnn_oracle(port, inputs):
    X, hidden, prevX = inputs
    Xm1 = torch.cat([prevX.unsqueeze(0), X[:-1]], 0)
    Z, Fg, Og = port.linear(torch.cat([X, Xm1], 2)).chunk(3, dim=2)
    Z, Fg = torch.tanh(Z), torch.sigmoid(Fg)
    result, prev_h = [], hidden
    forgets = Fg.split(1, dim=0)
    for i, h in enumerate((Fg * Z).split(1, dim=0)):
        h = h + (1 - forgets[i]) * prev_h
        h = h.view(h.size()[1:])
        result.append(h)
        prev_h = h
    C = torch.stack(result)
    return torch.sigmoid(Og) * C, C[-1:]


register(
    ZooCase(
        "qrnn-forget-mult",
        "QRNN",
        "salesforce/pytorch-qrnn torchqrnn/forget_mult.py CPUForgetMult + qrnn.py QRNNLayer "
        "(window 2)",
        seeded(QRNNLayer),
        lambda t: (lambda g: (randn(g, t, 2, 3), randn(g, 2, 5), randn(g, 2, 3)))(gen(1200 + t)),
        lambda: ({0: Dim("T", min=1)}, None, None),
        qrnn_oracle,
        {"Loop": 1},
        grad_inputs=(0, 1, 2),
    )
)


# ---------------------------------------------------------------------------------------------
# Kalman filter (rlabbe/filterpy kalman/kalman_filter.py predict/update), batched, with missing
# observations masked.
# ---------------------------------------------------------------------------------------------
class KalmanFilter(nn.Module):
    def __init__(self, dim_x: int = 4, dim_z: int = 2, scalar_inverse: bool = False) -> None:
        super().__init__()
        self.scalar_inverse = scalar_inverse
        dt = 0.1
        Fm = torch.eye(dim_x)
        for i in range(dim_x // 2):
            Fm[i, i + dim_x // 2] = dt  # constant velocity
        self.F = nn.Parameter(Fm)
        self.H = nn.Parameter(torch.eye(dim_z, dim_x) + 0.01 * torch.randn(dim_z, dim_x))
        self.Q = nn.Parameter(torch.eye(dim_x) * 0.01)
        self.R = nn.Parameter(torch.eye(dim_z) * 0.1)

    def forward(self, zs, observed, x0, P0):  # zs: (B, T, dim_z), observed: (B, T)
        eye = torch.eye(self.F.shape[0])

        def step(state, obs):
            x, P = state
            z, m = obs
            # predict
            x = x @ self.F.T
            P = self.F @ P @ self.F.T + self.Q
            # update
            y = z - x @ self.H.T
            PHT = P @ self.H.T
            S = self.H @ PHT + self.R
            SI = 1.0 / S if self.scalar_inverse else torch.linalg.inv(S)
            K = PHT @ SI
            x_new = x + (K @ y.unsqueeze(-1)).squeeze(-1)
            I_KH = eye - K @ self.H
            P_new = I_KH @ P @ I_KH.transpose(-1, -2) + K @ self.R @ K.transpose(-1, -2)
            x = torch.where(m[:, None], x_new, x)
            P = torch.where(m[:, None, None], P_new, P)
            return (x, P), x

        (_, P), xs = torchscan.scan(step, (x0, P0), (zs, observed), axis=1)
        return xs, P


def kalman_oracle(port, inputs):
    zs, observed, x, P = inputs
    eye = torch.eye(port.F.shape[0])
    xs = []
    for t in range(zs.shape[1]):
        z, m = zs[:, t], observed[:, t]
        x = x @ port.F.T
        P = port.F @ P @ port.F.T + port.Q
        y = z - x @ port.H.T
        PHT = P @ port.H.T
        S = port.H @ PHT + port.R
        SI = 1.0 / S if port.scalar_inverse else torch.linalg.inv(S)
        K = PHT @ SI
        x_new = x + (K @ y.unsqueeze(-1)).squeeze(-1)
        I_KH = eye - K @ port.H
        P_new = I_KH @ P @ I_KH.transpose(-1, -2) + K @ port.R @ K.transpose(-1, -2)
        x = torch.where(m[:, None], x_new, x)
        P = torch.where(m[:, None, None], P_new, P)
        xs.append(x)
    return torch.stack(xs, 1), P


def kalman_inputs(dim_z):
    def inputs(t):
        g = gen(1300 + t)
        observed = rand(g, 2, t) < 0.8
        return randn(g, 2, t, dim_z), observed, randn(g, 2, 4), torch.eye(4).repeat(2, 1, 1)

    return inputs


for _name, _dz, _scalar in (("kalman-inv", 2, False), ("kalman-scalar", 1, True)):
    register(
        ZooCase(
            _name,
            "Kalman",
            "rlabbe/filterpy kalman/kalman_filter.py predict/update (Joseph form), batched port"
            + (", 1-D observation: S^-1 as 1/S" if _scalar else ", S^-1 = linalg.inv(S)"),
            seeded(lambda dz=_dz, s=_scalar: KalmanFilter(dim_z=dz, scalar_inverse=s)),
            kalman_inputs(_dz),
            lambda: (lambda t: ({1: t}, {1: t}, None, None))(Dim("T", min=1)),
            kalman_oracle,
            {"Scan": 1},
            grad_inputs=(0, 2, 3),
        )
    )


# ---------------------------------------------------------------------------------------------
# Stacked / bidirectional LSTM and GRU built from cells; LayerNorm LSTM.
# ---------------------------------------------------------------------------------------------
I_RNN, H_RNN, L_RNN, B_RNN = 3, 4, 2, 3


def masked_direction(cell, xs, mask, h0, reverse, lstm):
    """One direction of one layer over (B, T, F) with a (B, T) mask: padded steps keep the state
    and output zeros, as pack_padded_sequence does."""

    def step(state, x):
        x_t, m = x
        m = m.unsqueeze(1)
        if lstm:
            h, c = state
            h_new, c_new = cell(x_t, (h, c))
            state = (torch.where(m, h_new, h), torch.where(m, c_new, c))
            return state, torch.where(m, h_new, torch.zeros_like(h_new))
        h_new = cell(x_t, state)
        return torch.where(m, h_new, state), torch.where(m, h_new, torch.zeros_like(h_new))

    return torchscan.scan(step, h0, (xs, mask), axis=1, reverse=reverse)


class StackedBiLSTM(nn.Module):
    def __init__(self, lstm: bool = True) -> None:
        super().__init__()
        Cell = nn.LSTMCell if lstm else nn.GRUCell
        self.lstm = lstm
        self.cells = nn.ModuleList(
            Cell(I_RNN if layer == 0 else 2 * H_RNN, H_RNN)
            for layer in range(L_RNN)
            for _ in range(2)
        )

    def forward(self, x, lengths):  # x: (B, T, I) batch_first
        mask = torch.arange(x.shape[1]) < lengths[:, None]
        zeros = x.new_zeros(x.shape[0], H_RNN)
        h0 = (zeros, zeros) if self.lstm else zeros
        finals = []
        for layer in range(L_RNN):
            outs = []
            for direction in range(2):
                cell = self.cells[2 * layer + direction]
                last, out = masked_direction(cell, x, mask, h0, direction == 1, self.lstm)
                finals.append(last)
                outs.append(out)
            x = torch.cat(outs, -1)
        if self.lstm:
            return x, torch.stack([h for h, _ in finals]), torch.stack([c for _, c in finals])
        return x, torch.stack(finals)


def torch_rnn_oracle(port, inputs):
    x, lengths = inputs
    Rnn = nn.LSTM if port.lstm else nn.GRU
    rnn = Rnn(I_RNN, H_RNN, L_RNN, batch_first=True, bidirectional=True)
    for layer in range(L_RNN):
        for direction, suffix in enumerate(("", "_reverse")):
            cell = port.cells[2 * layer + direction]
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                setattr(rnn, f"{name}_l{layer}{suffix}", getattr(cell, name))
    packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out, final = rnn(packed)
    out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
    return (out, *final) if port.lstm else (out, final)


def rnn_inputs(t):
    g = gen(1400 + t)
    return randn(g, B_RNN, t, I_RNN), random_lengths(g, B_RNN, t)


for _name, _lstm in (("lstm-bi-stacked-packed", True), ("gru-bi-stacked-packed", False)):
    register(
        ZooCase(
            _name,
            "RNN",
            "torch.nn.LSTM/GRU(num_layers=2, bidirectional=True, batch_first=True) on a "
            "pack_padded_sequence, rebuilt from cells with masks",
            seeded(lambda lstm=_lstm: StackedBiLSTM(lstm)),
            rnn_inputs,
            lambda: ({1: Dim("T", min=1)}, None),
            torch_rnn_oracle,
            {"Scan": 4},
            oracle_kind=f"torch.nn.{'LSTM' if _lstm else 'GRU'} + pack_padded_sequence",
            grad_inputs=(0,),
        )
    )


class LayerNormLSTMCell(nn.Module):
    """pytorch/benchmarks fastrnns/custom_lstms.py LayerNormLSTMCell."""

    def __init__(self, input_size, hidden_size) -> None:
        super().__init__()
        self.weight_ih = nn.Parameter(torch.randn(4 * hidden_size, input_size) * 0.3)
        self.weight_hh = nn.Parameter(torch.randn(4 * hidden_size, hidden_size) * 0.3)
        self.layernorm_i = nn.LayerNorm(4 * hidden_size)
        self.layernorm_h = nn.LayerNorm(4 * hidden_size)
        self.layernorm_c = nn.LayerNorm(hidden_size)

    def forward(self, input, state):
        hx, cx = state
        igates = self.layernorm_i(torch.mm(input, self.weight_ih.t()))
        hgates = self.layernorm_h(torch.mm(hx, self.weight_hh.t()))
        gates = igates + hgates
        ingate, forgetgate, cellgate, outgate = gates.chunk(4, 1)
        ingate, forgetgate = torch.sigmoid(ingate), torch.sigmoid(forgetgate)
        cellgate, outgate = torch.tanh(cellgate), torch.sigmoid(outgate)
        cy = self.layernorm_c((forgetgate * cx) + (ingate * cellgate))
        hy = outgate * torch.tanh(cy)
        return hy, (hy, cy)


class StackedBiLNLSTM(nn.Module):
    """custom_lstms.py StackedLSTM2 of BidirLSTMLayer of LayerNormLSTMCell (time-major), with the
    reverse direction as a reversed scan, and the unbind/stack of the original as scan axes."""

    def __init__(self) -> None:
        super().__init__()
        self.cells = nn.ModuleList(
            LayerNormLSTMCell(I_RNN if layer == 0 else 2 * H_RNN, H_RNN)
            for layer in range(L_RNN)
            for _ in range(2)
        )

    def forward(self, input, states):  # input (T, B, I); states (L*2, 2, B, H)
        output = input
        finals = []
        for layer in range(L_RNN):
            outs = []
            for direction in range(2):
                cell = self.cells[2 * layer + direction]
                k = 2 * layer + direction
                state = (states[k, 0], states[k, 1])

                def step(state, x, cell=cell):
                    out, state = cell(x, state)
                    return state, out

                state, out = torchscan.scan(step, state, output, reverse=direction == 1)
                outs.append(out)
                finals.append(torch.stack(state))
            output = torch.cat(outs, -1)
        return output, torch.stack(finals)


def ln_lstm_oracle(port, inputs):
    output, states = inputs
    finals = []
    for layer in range(L_RNN):
        outs = []
        for direction in range(2):
            cell = port.cells[2 * layer + direction]
            k = 2 * layer + direction
            state = (states[k, 0], states[k, 1])
            steps = output.unbind(0)
            order = reversed(range(len(steps))) if direction == 1 else range(len(steps))
            res = [None] * len(steps)
            for t in order:
                out, state = cell(steps[t], state)
                res[t] = out
            outs.append(torch.stack(res))
            finals.append(torch.stack(state))
        output = torch.cat(outs, -1)
    return output, torch.stack(finals)


register(
    ZooCase(
        "layernorm-lstm-bi-stacked",
        "RNN",
        "pytorch/pytorch benchmarks/fastrnns/custom_lstms.py LayerNormLSTMCell, BidirLSTMLayer, "
        "StackedLSTM2",
        seeded(StackedBiLNLSTM),
        lambda t: (lambda g: (randn(g, t, 2, I_RNN), randn(g, 2 * L_RNN, 2, 2, H_RNN)))(
            gen(1500 + t)
        ),
        lambda: ({0: Dim("T", min=1)}, None),
        ln_lstm_oracle,
        {"Scan": 4},
        grad_inputs=(0, 1),
    )
)


# ---------------------------------------------------------------------------------------------
# Transformer-XL segment-level recurrence (kimiyoung/transformer-xl mem_transformer.py: mems,
# _update_mems with detach, dec_attn_mask with memory).
# ---------------------------------------------------------------------------------------------
D_XL, L_XL, M_XL, B_XL = 8, 3, 4, 2


class TransformerXLMemory(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(D_XL, 3 * D_XL)
        self.o = nn.Linear(D_XL, D_XL)
        self.ff = nn.Sequential(nn.Linear(D_XL, 16), nn.ReLU(), nn.Linear(16, D_XL))
        self.norm1, self.norm2 = nn.LayerNorm(D_XL), nn.LayerNorm(D_XL)

    def layer(self, seg, mems):
        qlen, mlen = seg.shape[1], mems.shape[1]
        cat = torch.cat([mems, seg], 1)
        q = self.qkv(seg)[..., :D_XL]
        kv = self.qkv(cat)[..., D_XL:]
        k, v = kv.chunk(2, -1)
        score = torch.einsum("bid,bjd->bij", q, k) * D_XL**-0.5
        dec_attn_mask = torch.triu(torch.ones(qlen, mlen + qlen), diagonal=1 + mlen).bool()
        score = score.masked_fill(dec_attn_mask[None], -float("inf"))
        attn = torch.einsum("bij,bjd->bid", score.softmax(-1), v)
        h = self.norm1(seg + self.o(attn))
        return self.norm2(h + self.ff(h))

    def forward(self, segments, mems):  # segments: (B, n_seg, L, D), mems: (B, M, D)
        def step(mems, seg):
            out = self.layer(seg, mems)
            with torch.no_grad():  # _update_mems
                cat = torch.cat([mems, out], 1)
                new_mems = cat[:, -M_XL:].detach()
            return new_mems, out

        mems, outs = torchscan.scan(step, mems, segments, axis=1)
        return outs, mems


def txl_oracle(port, inputs):
    segments, mems = inputs
    outs = []
    for i in range(segments.shape[1]):
        out = port.layer(segments[:, i], mems)
        with torch.no_grad():
            mems = torch.cat([mems, out], 1)[:, -M_XL:].detach()
        outs.append(out)
    return torch.stack(outs, 1), mems


register(
    ZooCase(
        "transformer-xl-mems",
        "Transformer-XL",
        "kimiyoung/transformer-xl pytorch/mem_transformer.py segment loop with mems (_update_mems)",
        seeded(TransformerXLMemory),
        lambda t: (lambda g: (randn(g, B_XL, t, L_XL, D_XL), randn(g, B_XL, M_XL, D_XL)))(
            gen(1600 + t)
        ),
        lambda: ({1: Dim("S", min=1)}, None),
        txl_oracle,
        {"Scan": 1},
        grad_inputs=(0, 1),
        stops_gradients=True,
    )
)


# ---------------------------------------------------------------------------------------------
# Variants that keep an idiom of the original more literally, or the usual workaround.
# ---------------------------------------------------------------------------------------------
class CRFLogLikelihoodGather(CRFLogLikelihood):
    """crf-loglik with the emission score read by gather, not emissions[batch, i, tags[:, i]]."""

    def _compute_score(self, emissions, tags, mask):
        batch = torch.arange(emissions.shape[0])
        maskf = mask.to(emissions.dtype)
        score = self.start_transitions[tags[:, 0]] + emissions[batch, 0, tags[:, 0]]

        def body(i, score):
            i = i + 1
            score = score + self.transitions[tags[:, i - 1], tags[:, i]] * maskf[:, i]
            emitted = emissions[:, i].gather(1, tags[:, i].unsqueeze(1)).squeeze(1)
            return score + emitted * maskf[:, i], None

        score, _ = torchscan.loop(body, score, trip_count=emissions.shape[1] - 1)
        seq_ends = mask.long().sum(dim=1) - 1
        return score + self.end_transitions[tags[batch, seq_ends]]


register(
    dataclasses.replace(
        CASES["crf-loglik"],
        name="crf-loglik-gather",
        source=CASES["crf-loglik"].source + "; the emission score by emissions[:, i].gather(...)",
        make=seeded(CRFLogLikelihoodGather),
    )
)


class QRNNLayerSplit(QRNNLayer):
    """forget_mult as the original writes it: (f * x).split(1, dim=0) and forgets[i], i.e. slices
    fx[i:i+1] of length 1 and h.view(h.size()[1:])."""

    def forget_mult(self, f, x, hidden_init):
        fx = f * x

        def body(i, prev_h):
            h = fx[i : i + 1] + (1 - f[i : i + 1]) * prev_h
            h = h.view(h.size()[1:])
            return h, h

        _, result = torchscan.loop(body, hidden_init, trip_count=f.shape[0])
        return result


register(
    dataclasses.replace(
        CASES["qrnn-forget-mult"],
        name="qrnn-forget-mult-split",
        source=CASES["qrnn-forget-mult"].source + "; literal split(1)/forgets[i] slices x[i:i+1]",
        make=seeded(QRNNLayerSplit),
    )
)


class GatedLinearAttentionInplace(GatedLinearAttentionRecurrent):
    """The fla reference's o[:, :, i] = ... written into an output buffer carried by the loop."""

    def forward(self, q, k, v, g):
        q = q * K_LA**-0.5
        h0 = q.new_zeros(q.shape[0], q.shape[1], K_LA, V_LA)
        o0 = torch.zeros_like(v)

        def body(i, carry):
            h, o = carry
            h = h * g[:, :, i].exp()[..., None] + k[:, :, i, :, None] * v[:, :, i, None, :]
            o = o.clone()
            o[:, :, i] = (q[:, :, i, :, None] * h).sum(-2)
            return (h, o), None

        (h, o), _ = torchscan.loop(body, (h0, o0), trip_count=q.shape[2])
        return o, h


register(
    dataclasses.replace(
        CASES["gla-recurrent"],
        name="gla-recurrent-inplace",
        source=CASES["gla-recurrent"].source + "; o[:, :, i] = ... into a carried buffer",
        make=seeded(GatedLinearAttentionInplace),
    )
)


class CTCForwardPlainLogsumexp(CTCForward):
    """ctc-alpha with torch.logsumexp straight over the three paths, -inf included (forward only:
    its gradient is NaN where no path reaches a state yet)."""

    def forward(self, logits, targets, input_lengths, target_lengths):
        log_probs = logits.log_softmax(-1)
        n, s = targets.shape
        blanks = torch.full_like(targets, BLANK)
        ext = torch.cat([torch.stack([blanks, targets], -1).view(n, 2 * s), blanks[:, :1]], 1)
        prev2 = F.pad(ext[:, :-2], (2, 0), value=BLANK)
        skip = (ext != BLANK) & (ext != prev2)
        neg_inf = torch.tensor(float("-inf"))
        alpha = torch.where(torch.arange(2 * s + 1) < 2, log_probs[0].gather(1, ext), neg_inf)

        def step(alpha, x):
            lp, t = x
            a2 = F.pad(alpha[:, :-1], (1, 0), value=float("-inf"))
            a3 = torch.where(skip, F.pad(alpha[:, :-2], (2, 0), value=float("-inf")), neg_inf)
            new = torch.logsumexp(torch.stack([alpha, a2, a3]), 0) + lp.gather(1, ext)
            return torch.where((t < input_lengths).unsqueeze(1), new, alpha), None

        alpha, _ = torchscan.scan(step, alpha, (log_probs[1:], torch.arange(1, log_probs.shape[0])))
        ends = torch.stack([2 * target_lengths, 2 * target_lengths - 1], 1)
        return -torch.logsumexp(alpha.gather(1, ends), 1)


register(
    dataclasses.replace(
        CASES["ctc-alpha"],
        name="ctc-alpha-logsumexp",
        source=CASES["ctc-alpha"].source + "; plain torch.logsumexp over -inf paths (forward only)",
        make=seeded(CTCForwardPlainLogsumexp),
        grad_inputs=(),
    )
)
