"""The CTC forward (alpha) recursion over ``log_probs[1:]`` with the blank-extended target; the
oracle is ``torch.nn.functional.ctc_loss``. ``ctc-alpha-logsumexp`` is the form many ports write
(``torch.logsumexp`` over ``-inf`` paths): forward only, its gradient is NaN in eager PyTorch
too."""

from ._harness import *  # noqa: F403

NAMES = ["ctc-alpha", "ctc-alpha-logsumexp"]
