"""Theano's ``scan``, ``map``, ``reduce``, ``foldl`` and ``foldr``, on top of torchscan.

Code written for ``theano.scan`` (or PyTensor's) runs here with its arguments and its semantics:
taps on sequences and outputs, ``n_steps``, ``go_backwards``, truncated backpropagation through
time, ``strict`` and ``until``. Each call lowers onto :func:`torchscan.scan` (or, with no
sequence or with ``n_steps`` a tensor being exported, :func:`torchscan.loop`), so it runs at
eager speed and exports to one ONNX ``Scan`` or ``Loop``: sequence taps become shifted slices of
the sequence fed to one scan, and output taps a carried window of past values.

PyTorch has no shared variables, so ``updates`` is always an empty dict; a step function that
returns updates is refused. Keep such state in ``outputs_info`` instead (see
``docs/theano.md``).
"""

from torchscan._steps import until as until
from torchscan.theano._folds import foldl as foldl
from torchscan.theano._folds import foldr as foldr
from torchscan.theano._folds import map as map
from torchscan.theano._folds import reduce as reduce
from torchscan.theano._scan import Updates as Updates
from torchscan.theano._scan import scan as scan

__all__ = ["foldl", "foldr", "map", "reduce", "scan", "until"]
