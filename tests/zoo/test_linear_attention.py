"""Recurrent forms of linear attention: gated linear attention (fla's naive recurrent form, also
writing ``o[:, :, i]`` into a carried buffer), RetNet's recurrent retention and RWKV-4's WKV with
token shift; the oracle is the Python loop."""

from ._harness import *  # noqa: F403

NAMES = ["gla-recurrent", "gla-recurrent-inplace", "retnet-recurrent", "rwkv4-wkv"]
