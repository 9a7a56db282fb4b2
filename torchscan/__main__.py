"""``python -m torchscan``: the ``torchscan`` command line (see :mod:`torchscan._cli`)."""

import sys

from torchscan._cli import main

if __name__ == "__main__":
    sys.exit(main())
