"""``python -m torchscan``: the ``torchscan`` command line (see :mod:`torchscan._cli`)."""

from torchscan._cli import entry

if __name__ == "__main__":
    entry()
