"""Copies in a step: the delta rule as reference implementations write it, with and without them.

Reference implementations of recurrences copy the state before they read or update it
(``S.clone()``; the delta rule of DeltaNet, ``delta_rule_recurrence`` in flash-linear-attention's
``naive.py``, copies ``v[:, :, i]`` and ``S`` at every step). The copies change nothing the step
computes; a hoisted scan leaves them out (``torchscan._hoist``), so the step runs at the speed of
the same step written without them.

For each of the two ways to loop the step, the step with its copies and without them run
interleaved in one process (each repetition runs both, in rotating order), on one thread,
forward (``no_grad``), forward with autograd on (nothing requires grad) and forward + backward;
the medians are reported as ratios to the same loop without the copies:

* ``python loop``: flash-linear-attention's loop, as written upstream (with its copies) and
  without them, on time-major sequences;
* ``torchscan.scan``: the same step in ``torchscan.scan``, hoisted (from its third call).

The two loops run in separate interleaved groups: what a copy costs depends on the allocator's
state (a fresh buffer of a large state is memory the system maps anew), which each group keeps
to itself. Every implementation is checked against the reference loop before it is timed.
Options: ``--B --H --D --T --repeats --threads``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

import suite

import torchscan


def reference(q, k, v, beta, copies: bool):
    """flash-linear-attention's ``delta_rule_recurrence`` with its copies or without, on
    time-major sequences (q, k, v: (T, B, H, D), beta: (T, B, H)), the layout a scan reads."""
    length, b, h, d = q.shape
    o = torch.zeros_like(v)
    S = q.new_zeros(b, h, d, d)
    for i in range(length):
        _k, _q = k[i], q[i]
        _v = v[i].clone() if copies else v[i]
        beta_i = beta[i]
        _v = _v - ((S.clone() if copies else S) * _k[..., None]).sum(-2)
        _v = _v * beta_i[..., None]
        S = (S.clone() if copies else S) + _k.unsqueeze(-1) * _v.unsqueeze(-2)
        o[i] = torch.einsum("bhd,bhdm->bhm", _q, S)
    return o


def step_with_copies(S, x):
    q, k, v, beta = x
    v = v.clone()
    v = (v - (S.clone() * k[..., None]).sum(-2)) * beta[..., None]
    S = S.clone() + k.unsqueeze(-1) * v.unsqueeze(-2)
    return S, torch.einsum("bhd,bhdm->bhm", q, S)


def step(S, x):
    q, k, v, beta = x
    v = (v - (S * k[..., None]).sum(-2)) * beta[..., None]
    S = S + k.unsqueeze(-1) * v.unsqueeze(-2)
    return S, torch.einsum("bhd,bhdm->bhm", q, S)


def scanned(fn, q, k, v, beta):
    _, b, h, d = q.shape
    return torchscan.scan(fn, q.new_zeros(b, h, d, d), (q, k, v, beta))[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--B", type=int, default=4)
    parser.add_argument("--H", type=int, default=4)
    parser.add_argument("--D", type=int, default=64)
    parser.add_argument("--T", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    q, k, v = (torch.randn(args.T, args.B, args.H, args.D) for _ in range(3))
    k = torch.nn.functional.normalize(k, dim=-1)
    beta = torch.rand(args.T, args.B, args.H)
    groups = {
        "python loop": (
            lambda *a: reference(*a, copies=True),
            lambda *a: reference(*a, copies=False),
        ),
        "torchscan.scan": (
            lambda *a: scanned(step_with_copies, *a),
            lambda *a: scanned(step, *a),
        ),
    }
    print(
        f"*the delta rule, B={args.B}, H={args.H}, D={args.D}, T={args.T}, "
        f"{args.threads} thread(s), median of {args.repeats}, torch {torch.__version__}*\n"
    )
    print("| mode | implementation | median (ms) | ratio to the same without copies |")
    print("| --- | --- | ---: | ---: |")
    for mode in ("forward, no_grad", "forward, autograd on", "forward + backward"):
        grad, backward = mode != "forward, no_grad", mode == "forward + backward"
        inputs = [t.clone().requires_grad_(backward) for t in (q, k, v, beta)]
        want = reference(*inputs, copies=True).detach()

        def run(implementation, inputs=inputs, grad=grad, backward=backward):
            with torch.set_grad_enabled(grad):
                out = implementation(*inputs)
                if backward:
                    out.sum().backward()
            return out

        for loop, (with_copies, without) in groups.items():
            for implementation in (with_copies, without):
                for _ in range(3):  # a signature is hoisted from its third call
                    suite.check_close(loop, [run(implementation).detach()], [want])
            runs = {"copies": lambda f=with_copies: run(f), "none": lambda f=without: run(f)}
            medians = suite.interleaved_medians(runs, args.repeats)
            for name, label in (("copies", f"{loop}, copies"), ("none", loop)):
                seconds = medians[name]
                ratio = seconds / medians["none"]
                print(f"| {mode} | {label} | {seconds * 1e3:.2f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
