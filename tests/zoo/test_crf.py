"""Linear-chain CRF (pytorch-crf's ``torchcrf.CRF``, batch first): the log-likelihood (score
of the tags by indexing with the step number, normalizer by the forward algorithm over
``emissions[:, 1:]``) and Viterbi decoding with back-pointers; the oracle is ``torchcrf.CRF``."""

from ._harness import *  # noqa: F403

NAMES = ["crf-loglik", "crf-loglik-gather", "crf-viterbi"]
