"""The one place that knows how pytrees are flattened.

Flattening and unflattening use torch's C++ pytree (optree, registered in torch's namespace), which
is several times faster than the pure-Python one and orders leaves the same way. Key paths, which
only error messages need, come from the pure-Python implementation.
"""

from __future__ import annotations

from typing import Any

from torchscan._compat import cxx_pytree as _fast
from torchscan._compat import pytree as _slow

TreeSpec = Any
"""An opaque structure object; compare two with ``==``."""

tree_flatten = _fast.tree_flatten
tree_unflatten = _fast.tree_unflatten
tree_leaves = _fast.tree_leaves
tree_structure = _fast.tree_structure
tree_map = _fast.tree_map


def same_structure(a: TreeSpec, b: TreeSpec) -> bool:
    """Whether two structures are the same.

    Under ``torch.compile``, TorchDynamo flattens with a Python stand-in for optree whose
    structures never compare equal to optree's own; a structure made while Dynamo traced a frame
    can meet one made in a frame it left to eager code (after a graph break). Both are then
    compared in optree's form.
    """
    if a == b:
        return True
    if type(a) is type(b):
        return False
    return _canonical(a) == _canonical(b)


def _canonical(spec: TreeSpec) -> TreeSpec:
    return _fast.tree_structure(_fast.tree_unflatten([0] * spec.num_leaves, spec))


def is_leaf_spec(spec: TreeSpec) -> bool:
    """Whether ``spec`` is the structure of a single leaf (a bare tensor or ``None``)."""
    return spec.num_nodes == 1 and spec.num_leaves == 1  # an empty tuple has one node too


def leaf_names(tree: Any, root: str) -> list[str]:
    """Every leaf of ``tree`` named by its path after ``root``: ``carry['h']``, ``xs[1]``."""
    return [root + _slow.keystr(path) for path, _ in _slow.tree_flatten_with_path(tree)[0]]


def named_tensors(tree: Any, root: str) -> list[tuple[str, Any]]:
    """The tensor leaves of ``tree`` with their names as :func:`leaf_names` gives them."""
    return [
        (root + _slow.keystr(path), leaf)
        for path, leaf in _slow.tree_flatten_with_path(tree)[0]
        if hasattr(leaf, "dtype")
    ]


class _Star:
    def __repr__(self) -> str:
        return "*"


def structure_text(spec: TreeSpec) -> str:
    """A structure as Python-like text, leaves shown as ``*``: ``{'h': *, 'c': (*, *)}``."""
    return repr(tree_unflatten([_Star()] * spec.num_leaves, spec))
