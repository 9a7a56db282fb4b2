"""Types of the step functions of ``torchscan.theano``, for type checkers only.

The public functions import this module under ``typing.TYPE_CHECKING``: nothing here runs when
torchscan is used. Theano's ``scan`` returns one tensor for a step function with one output and a
list for one with several, so its overloads (and those of ``map``, ``reduce``, ``foldl`` and
``foldr``) tell the two apart by what the step function is declared to return, in this order:

1. ``OneOutputStep``: a tensor. First, because an untyped ``lambda`` (Theano's usual step)
   returns an expression of unknown type, which the first overload takes: one output.
2. ``SeveralOutputsStep``: a tuple of two tensors or more, ``until(stop)`` last if any; before
   3, which an untyped ``lambda x: (x, -x)`` would match too.
3. ``OneOutputUntilStep``: ``(tensor,)`` or ``(tensor, until(stop))``.
4. Anything else (a list of tensors, an empty dict of updates): ``Outputs``, either.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeAlias

import torch

from torchscan._until import Until

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # torch depends on typing_extensions, which is declared too
    from typing_extensions import Unpack

OneOutputStep: TypeAlias = Callable[..., torch.Tensor]
OneOutputUntilStep: TypeAlias = Callable[..., tuple[torch.Tensor] | tuple[torch.Tensor, Until]]
SeveralOutputsStep: TypeAlias = Callable[
    ..., tuple[torch.Tensor, torch.Tensor, Unpack[tuple[torch.Tensor | Until, ...]]]
]
Outputs: TypeAlias = torch.Tensor | list[torch.Tensor]
