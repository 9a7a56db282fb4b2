"""The operators of the ``ai.onnx.ml`` domain that scikit-learn's converters emit around a
model, in torch: feature extraction and preprocessing (``ArrayFeatureExtractor``,
``Binarizer``, ``Normalizer``, ``Scaler``, ``Imputer``, ``FeatureVectorizer``, ``LabelEncoder``
of numbers, ``OneHotEncoder`` of integer categories), the linear models (``LinearRegressor``,
``LinearClassifier``) and the tree ensembles (``TreeEnsembleRegressor``,
``TreeEnsembleClassifier``, ``TreeEnsemble``).

Each computes what onnxruntime's kernel computes, in float32 where its output is float32 (the
scores, the scaled and normalized features), with the score transforms (``post_transform``) of
onnxruntime's ``ml_common.h``. Strings (labels, keys, categories) and maps (``ZipMap``,
``CastMap``, ``DictVectorizer``) have no torch type: a node that needs them is refused.

A tree ensemble's nodes are read once into tables (feature, threshold, mode and children of
every node, the weights of every leaf); every example then walks all the trees at once, one
level per step, so that the ensemble runs as a few tensor operations per level of its deepest
tree.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch

from torchscan import _context
from torchscan.onnx._import._graph import Call, Node
from torchscan.onnx._import._registry import implements

ML = "ai.onnx.ml"

_TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")


def _checking() -> bool:
    """Whether to check data-dependent rules (not while torch.compile or torch.export trace)."""
    return not _context.compiling()


def _strings(call: Call, *names: str) -> None:
    """Refuse a node that gives any of the attributes ``names`` (strings)."""
    for name in names:
        if call.attribute(name):
            raise call.refuse(
                f"attribute {name}: strings have no torch type (to_torch implements the "
                "operator on numbers only)",
                not_implemented=True,
            )


def _rows(call: Call, x: torch.Tensor) -> torch.Tensor:
    """``x`` as a matrix of examples by features, as onnxruntime reads the input of a model:
    a vector is one example."""
    if x.dim() == 0 or x.dim() > 2:
        raise call.refuse(f"an input of rank {x.dim()} (the operator takes a vector or a matrix)")
    return x.reshape(1, -1) if x.dim() == 1 else x


def _probit(p: torch.Tensor) -> torch.Tensor:
    """``sqrt(2) * erfinv(2 p - 1)`` with onnxruntime's approximation of ``erfinv``."""
    x = 2 * p - 1
    sign = torch.where(x < 0, -1.0, 1.0).to(p.dtype)
    log = torch.log((1 - x) * (1 + x))
    v = 2 / (math.pi * 0.147) + 0.5 * log
    v2 = 1 / 0.147 * log
    return math.sqrt(2) * sign * torch.sqrt(-v + torch.sqrt(v * v - v2))


def _softmax_zero(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the scores that are not 0 (within 1e-7); those stay 0."""
    top = scores.max(dim=-1, keepdim=True).values
    nonzero = scores.abs() > 1e-7
    exp = torch.where(nonzero, torch.exp(scores - top), scores * torch.exp(-top))
    total = torch.where(nonzero, exp, torch.zeros_like(exp)).sum(dim=-1, keepdim=True)
    return exp / total


def _transform(call: Call, scores: torch.Tensor, name: str, *, columns: int) -> torch.Tensor:
    """``post_transform`` of a matrix of scores of ``columns`` columns: as onnxruntime's
    ``batched_update_scores_inplace``, a single column is only transformed by ``PROBIT``."""
    if name not in _TRANSFORMS:
        raise call.refuse(f"post_transform {name!r} (one of {', '.join(_TRANSFORMS)})")
    if name == "PROBIT":
        return _probit(scores)
    if name == "NONE" or columns == 1:
        return scores
    if name == "LOGISTIC":
        return torch.sigmoid(scores)
    if name == "SOFTMAX":
        return torch.softmax(scores, dim=-1)
    return _softmax_zero(scores)


# ---------------------------------------------------------------------------------------------
# Features


@implements("ArrayFeatureExtractor", 1, domain=ML)
def array_feature_extractor(call: Call, x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """The elements of the last axis at ``indices`` (flattened); a vector gives one row."""
    index = indices.reshape(-1).to(torch.int64)
    size = x.shape[-1] if x.dim() else 0
    if _checking() and index.numel() and bool(((index < 0) | (index >= size)).any()):
        raise call.refuse(
            f"indices {index.tolist()} out of range for a last axis of {size} elements"
        )
    y = x.index_select(-1, index.to(x.device))
    return y.reshape(1, -1) if x.dim() == 1 else y


@implements("Binarizer", 1, domain=ML)
def binarizer(call: Call, x: torch.Tensor) -> torch.Tensor:
    return (x > call.attribute("threshold", 0.0)).to(x.dtype)


@implements("Normalizer", 1, domain=ML)
def normalizer(call: Call, x: torch.Tensor) -> torch.Tensor:
    """Each row divided by its maximum (not of the absolute values, as the specification and
    onnxruntime say), its L1 or its L2 norm; a row whose divisor is 0 is left as it is."""
    norm = call.attribute("norm", "MAX")
    rows = _rows(call, x).float()
    if norm == "MAX":
        divisor = rows.max(dim=1, keepdim=True).values
    elif norm == "L1":
        divisor = rows.abs().sum(dim=1, keepdim=True)
    elif norm == "L2":
        divisor = torch.sqrt((rows * rows).sum(dim=1, keepdim=True))
    else:
        raise call.refuse(f"norm {norm!r} (one of 'MAX', 'L1', 'L2')")
    y = torch.where(divisor != 0, rows / torch.where(divisor != 0, divisor, 1.0), rows)
    return y.reshape(x.shape)


def _per_feature(call: Call, name: str, values: Sequence[float], features: int) -> list[float]:
    if len(values) not in (1, features):
        raise call.refuse(
            f"{name} gives {len(values)} values for {features} features (one, or one for each)"
        )
    return list(values)


@implements("Scaler", 1, domain=ML)
def scaler(call: Call, x: torch.Tensor) -> torch.Tensor:
    """``(x - offset) * scale``, per feature (the last axis) or for all, in float32."""
    features = x.shape[-1] if x.dim() else 1
    scale = call.attribute("scale") or []
    offset = call.attribute("offset") or []
    if not scale or len(scale) != len(offset):
        raise call.refuse(
            f"scale ({len(scale)} values) and offset ({len(offset)}) must give as many values"
        )
    scale = _per_feature(call, "scale", scale, features)
    offset = _per_feature(call, "offset", offset, features)
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    shift = torch.tensor(offset, dtype=compute, device=x.device)
    factor = torch.tensor(scale, dtype=compute, device=x.device)
    return ((x.to(compute) - shift) * factor).float()


@implements("Imputer", 1, domain=ML)
def imputer(call: Call, x: torch.Tensor) -> torch.Tensor:
    """The elements equal to ``replaced_value_*`` (NaN: the NaNs) replaced by the imputed value
    of their feature (the last axis), or the one imputed value."""
    floats = call.attribute("imputed_value_floats") or []
    integers = call.attribute("imputed_value_int64s") or []
    if bool(floats) == bool(integers):
        raise call.refuse("exactly one of imputed_value_floats and imputed_value_int64s is needed")
    if floats:
        values, replaced = floats, float(call.attribute("replaced_value_float", 0.0))
    else:
        values, replaced = integers, int(call.attribute("replaced_value_int64", 0))
    features = x.shape[-1] if x.dim() else 1
    values = _per_feature(call, "the imputed values", values, features)
    imputed = torch.tensor(values, device=x.device).to(x.dtype)
    if isinstance(replaced, float) and math.isnan(replaced):
        hit = torch.isnan(x) if x.is_floating_point() else torch.zeros_like(x, dtype=torch.bool)
    else:
        hit = x == replaced
    return torch.where(hit, imputed, x)


@implements("FeatureVectorizer", 1, domain=ML)
def feature_vectorizer(call: Call, *inputs: torch.Tensor) -> torch.Tensor:
    """The inputs' features side by side, in float32: each input's first
    ``inputdimensions[i]`` features (a row of zeros added where it has fewer)."""
    dimensions = [int(d) for d in call.attribute("inputdimensions") or []]
    if len(dimensions) != len(inputs):
        raise call.refuse(
            f"inputdimensions {dimensions} do not give one size for each of the {len(inputs)} "
            "inputs"
        )
    examples = 1 if inputs[0].dim() <= 1 else inputs[0].shape[0]
    parts = []
    for x, width in zip(inputs, dimensions, strict=True):
        rows = x.reshape(examples, -1).float()
        if rows.shape[1] >= width:
            parts.append(rows[:, :width])
        else:
            parts.append(torch.nn.functional.pad(rows, (0, width - rows.shape[1])))
    return torch.cat(parts, dim=1)


def _lookup(
    x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, default: torch.Tensor, bitwise: bool
) -> torch.Tensor:
    """Each element of ``x`` mapped to the value of its key, else to ``default``; a NaN key
    matches a NaN of the same bits (``bitwise``, version 2) or any NaN (version 4)."""
    flat = x.reshape(-1)
    keys = keys.to(x.device, flat.dtype)
    equal = flat[:, None] == keys[None, :]
    if flat.is_floating_point():
        nan = torch.isnan(flat)[:, None] & torch.isnan(keys)[None, :]
        if bitwise:
            bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()]
            nan = nan & (flat.view(bits)[:, None] == keys.view(bits)[None, :])
        equal = equal | nan
    found = equal.any(dim=1)
    first = torch.argmax(equal.to(torch.int8), dim=1)
    picked = values.to(x.device)[first]
    return torch.where(found, picked, default.to(x.device, values.dtype)).reshape(x.shape)


@implements("LabelEncoder", 2, 4, domain=ML)
def label_encoder(call: Call, x: torch.Tensor) -> torch.Tensor:
    """Numbers to numbers: ``keys_*`` to ``values_*`` (or the ``*_tensor`` attributes of
    version 4), the other elements to the default of the values' type. A NaN key matches a NaN
    of its bits in version 2 ("bit-wise comparison"), any NaN in version 4, as the
    specification says (onnxruntime's version 2 matches none)."""
    _strings(call, "keys_strings", "values_strings")
    keys = _attribute_values(call, "keys")
    values = _attribute_values(call, "values")
    if keys is None or values is None or keys.numel() != values.numel():
        raise call.refuse("the keys and values must be given, as many of each")
    if values.dtype == torch.float32 and call.attribute("values_floats"):
        default = torch.tensor(call.attribute("default_float", -0.0))
    elif values.dtype == torch.int64 and call.attribute("values_int64s"):
        default = torch.tensor(call.attribute("default_int64", -1))
    else:
        given = call.attribute("default_tensor")
        default = given.reshape(()) if given is not None else torch.zeros((), dtype=values.dtype)
    if keys.is_floating_point() != x.is_floating_point():
        raise call.refuse(f"keys of {keys.dtype} for an input of {x.dtype}")
    return _lookup(x, keys, values, default, bitwise=call.node.version < 4)


_KEY_TYPES = (torch.int16, torch.int32, torch.int64)


def _attribute_values(call: Call, kind: str) -> torch.Tensor | None:
    floats, integers = call.attribute(f"{kind}_floats"), call.attribute(f"{kind}_int64s")
    tensor = call.attribute(f"{kind}_tensor")
    if floats:
        return torch.tensor(floats, dtype=torch.float32)
    if integers:
        return torch.tensor(integers, dtype=torch.int64)
    if tensor is not None:
        if not tensor.is_floating_point() and tensor.dtype not in _KEY_TYPES:
            raise call.refuse(f"{kind}_tensor of {tensor.dtype}", not_implemented=True)
        return tensor.reshape(-1)
    return None


@implements("OneHotEncoder", 1, domain=ML)
def one_hot_encoder(call: Call, x: torch.Tensor) -> torch.Tensor:
    """A float32 vector of ``len(cats_int64s)`` per element, 1 at the category of the element
    (truncated to an integer, as onnxruntime reads floats); an element of no category gives
    zeros, or is refused where ``zeros`` is 0."""
    _strings(call, "cats_strings")
    categories = [int(c) for c in call.attribute("cats_int64s") or []]
    if not categories:
        raise call.refuse("no categories (cats_int64s)")
    if x.dim() > 2:
        raise call.refuse(f"an input of rank {x.dim()} (the operator takes at most 2)")
    table = torch.tensor(categories, dtype=torch.int64, device=x.device)
    hot = x.to(torch.int64).unsqueeze(-1) == table
    if not call.attribute("zeros", 1) and _checking() and not bool(hot.any(dim=-1).all()):
        raise call.refuse("an element of no category, with zeros=0")
    return hot.float()


# ---------------------------------------------------------------------------------------------
# Linear models


def _coefficients(call: Call, x: torch.Tensor, targets: int) -> torch.Tensor:
    coefficients = call.attribute("coefficients") or []
    features = x.shape[1]
    if targets <= 0 or len(coefficients) != targets * features:
        raise call.refuse(
            f"{len(coefficients)} coefficients for {targets} targets of {features} features"
        )
    return torch.tensor(coefficients, dtype=torch.float32, device=x.device).reshape(
        targets, features
    )


@implements("LinearRegressor", 1, domain=ML)
def linear_regressor(call: Call, x: torch.Tensor) -> torch.Tensor:
    rows = _rows(call, x).float()
    targets = int(call.attribute("targets", 1))
    weights = _coefficients(call, rows, targets)
    y = rows @ weights.T
    intercepts = call.attribute("intercepts") or []
    if intercepts:
        if len(intercepts) != targets:
            raise call.refuse(f"{len(intercepts)} intercepts for {targets} targets")
        y = y + torch.tensor(intercepts, dtype=torch.float32, device=x.device)
    return _transform(call, y, call.attribute("post_transform", "NONE"), columns=targets)


@implements("LinearClassifier", 1, domain=ML)
def linear_classifier(call: Call, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The label of the largest score, and the scores: ``x @ coefficients.T + intercepts``
    transformed by ``post_transform``. One score ``s`` and two labels: the second label where
    ``s`` is positive, and the scores ``[1 - p, p]``, ``p`` the logistic of ``s`` for
    ``LOGISTIC``, else ``s`` itself (as onnxruntime gives them); one score and no labels:
    the label 1 or 0 and the score."""
    _strings(call, "classlabels_strings")
    rows = _rows(call, x).float()
    labels = [int(v) for v in call.attribute("classlabels_ints") or []]
    intercepts = call.attribute("intercepts") or []
    features = rows.shape[1]
    classes = len(intercepts) or len(call.attribute("coefficients") or []) // max(features, 1)
    scores = rows @ _coefficients(call, rows, classes).T
    if intercepts:
        scores = scores + torch.tensor(intercepts, dtype=torch.float32, device=x.device)
    transform = call.attribute("post_transform", "NONE")
    if classes == 1:
        if len(labels) not in (0, 2):
            raise call.refuse(f"{len(labels)} classlabels_ints for one score (0 or 2)")
        positive, negative = (labels[1], labels[0]) if labels else (1, 0)
        label = torch.where(scores[:, 0] > 0, positive, negative).to(torch.int64)
        if not labels:
            return label, _transform(call, scores, transform, columns=1)
        if transform == "PROBIT":
            raise call.refuse(
                "post_transform PROBIT of one score for two labels (onnxruntime writes one "
                "score where it declares two)",
                not_implemented=True,
            )
        if transform not in _TRANSFORMS:
            raise call.refuse(f"post_transform {transform!r} (one of {', '.join(_TRANSFORMS)})")
        p = torch.sigmoid(scores) if transform == "LOGISTIC" else scores
        return label, torch.cat([1 - p, p], dim=1)
    if len(labels) != classes:
        raise call.refuse(f"{len(labels)} classlabels_ints for {classes} classes")
    table = torch.tensor(labels, dtype=torch.int64, device=x.device)
    label = table[torch.argmax(scores, dim=1)]
    return label, _transform(call, scores, transform, columns=classes)


# ---------------------------------------------------------------------------------------------
# Tree ensembles

_MODES = {"BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3, "BRANCH_EQ": 4}
_MODES |= {"BRANCH_NEQ": 5, "BRANCH_MEMBER": 6}
_AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")


@dataclasses.dataclass(frozen=True)
class _Forest:
    """The trees of an ensemble as tables. Slots ``0 .. M-1`` are the branches, slots
    ``M ..`` the leaves; a tree is the slot of its root."""

    features: torch.Tensor  # (M,) the feature each branch reads
    thresholds: torch.Tensor  # (M,) float64
    modes: torch.Tensor  # (M,) the comparison, as _MODES numbers it
    missing: torch.Tensor  # (M,) whether a NaN takes the true branch
    true_slots: torch.Tensor  # (M,)
    false_slots: torch.Tensor  # (M,)
    members: torch.Tensor  # (M, S) float64, the sets of BRANCH_MEMBER, padded with NaN
    roots: torch.Tensor  # (T,)
    weights: torch.Tensor  # (L, K) float64, the weight of each leaf for each output
    scored: torch.Tensor  # (L, K) whether the leaf gives the output a weight
    depth: int  # the number of branches of the longest path

    def leaves(self, call: Call, x: torch.Tensor) -> torch.Tensor:
        """The slot of the leaf each example (row of ``x``) reaches in each tree, (N, T)."""
        device = x.device
        branches = self.features.numel()
        if branches and _checking() and int(self.features.max()) >= x.shape[1]:
            raise call.refuse(
                f"a node reads feature {int(self.features.max())} of inputs of "
                f"{x.shape[1]} features"
            )
        values = x.to(torch.float64)
        state = self.roots.to(device).expand(x.shape[0], -1)
        tables = [
            t.to(device)
            for t in (
                self.features,
                self.thresholds,
                self.modes,
                self.missing,
                self.true_slots,
                self.false_slots,
                self.members,
            )
        ]
        features, thresholds, modes, missing, true_slots, false_slots, members = tables
        for _ in range(self.depth):
            branch = state < branches
            slot = torch.where(branch, state, torch.zeros_like(state)) if branches else state
            if not branches:
                break
            value = values.gather(1, features[slot])
            threshold = thresholds[slot]
            mode = modes[slot]
            outcomes = torch.stack(
                [
                    value <= threshold,
                    value < threshold,
                    value >= threshold,
                    value > threshold,
                    value == threshold,
                    value != threshold,
                    (value.unsqueeze(-1) == members[slot]).any(dim=-1),
                ]
            )
            taken = outcomes.gather(0, mode.unsqueeze(0)).squeeze(0)
            taken = taken | (missing[slot] & torch.isnan(value))
            following = torch.where(taken, true_slots[slot], false_slots[slot])
            state = torch.where(branch, following, state)
        return state - branches

    def aggregate(self, call: Call, x: torch.Tensor, function: str) -> tuple[torch.Tensor, ...]:
        """The outputs summed, averaged, or the least or greatest of the trees' weights, in
        float64, and whether any tree gave each (N, K)."""
        leaves = self.leaves(call, x)
        weights = self.weights.to(x.device)[leaves]  # (N, T, K)
        scored = self.scored.to(x.device)[leaves]
        trees = self.roots.numel()
        if function in ("SUM", "AVERAGE"):
            total = weights.sum(dim=1)
            return (total / trees if function == "AVERAGE" else total), scored.any(dim=1)
        if function not in _AGGREGATES:
            raise call.refuse(f"aggregate_function {function!r} (one of {', '.join(_AGGREGATES)})")
        fill = math.inf if function == "MIN" else -math.inf
        masked = torch.where(scored, weights, torch.full_like(weights, fill))
        best = masked.amin(dim=1) if function == "MIN" else masked.amax(dim=1)
        hit = scored.any(dim=1)
        return torch.where(hit, best, torch.zeros_like(best)), hit


_FORESTS: dict[int, tuple[Node, _Forest]] = {}
"""The tables of the tree ensembles read so far, by node (kept with the node, so that a reused
id is not taken for it)."""


def _cached_forest(call: Call, build: Any) -> _Forest:
    entry = _FORESTS.get(id(call.node))
    if entry is not None and entry[0] is call.node:
        return entry[1]
    forest = build()
    _FORESTS[id(call.node)] = (call.node, forest)
    return forest


def _depth(call: Call, roots: list[int], true_slots: list[int], false_slots: list[int]) -> int:
    """The number of branches on the longest path from a root; a cycle is refused."""
    branches = len(true_slots)
    depth, level = 0, {r for r in roots if r < branches}
    while level:
        depth += 1
        if depth > branches:
            raise call.refuse("the nodes of a tree form a cycle")
        level = {c for s in level for c in (true_slots[s], false_slots[s]) if c < branches}
    return depth


def _legacy_forest(call: Call, prefix: str, outputs: int, thresholds_of: torch.dtype) -> _Forest:
    """The tables of a TreeEnsembleRegressor or TreeEnsembleClassifier (versions 1 and 3):
    nodes named by tree and node id, leaf weights by ``{prefix}_treeids``, ``_nodeids``,
    ``_ids`` and ``_weights``."""
    tree_ids = [int(v) for v in call.attribute("nodes_treeids") or []]
    node_ids = [int(v) for v in call.attribute("nodes_nodeids") or []]
    modes = list(call.attribute("nodes_modes") or [])
    count = len(tree_ids)
    lists = {
        name: list(call.attribute(name) or [])
        for name in (
            "nodes_featureids",
            "nodes_truenodeids",
            "nodes_falsenodeids",
        )
    }
    values_tensor = call.attribute("nodes_values_as_tensor")
    values = (
        values_tensor.reshape(-1).to(torch.float64).tolist()
        if values_tensor is not None
        else list(call.attribute("nodes_values") or [])
    )
    missing = list(call.attribute("nodes_missing_value_tracks_true") or [0] * count)
    if not count or any(
        len(v) != count for v in (node_ids, modes, missing, values, *lists.values())
    ):
        raise call.refuse("the nodes_* attributes must give a value for each of the nodes")
    unknown = [m for m in modes if m not in _MODES or m == "BRANCH_MEMBER"]
    unknown = [m for m in unknown if m != "LEAF"]
    if unknown:
        raise call.refuse(f"node mode {unknown[0]!r}")
    key = {(t, n): i for i, (t, n) in enumerate(zip(tree_ids, node_ids, strict=True))}
    branch_rows = [i for i in range(count) if modes[i] != "LEAF"]
    leaf_rows = [i for i in range(count) if modes[i] == "LEAF"]
    slot = {row: s for s, row in enumerate(branch_rows)}
    slot |= {row: len(branch_rows) + s for s, row in enumerate(leaf_rows)}

    def child(row: int, name: str) -> int:
        found = key.get((tree_ids[row], int(lists[name][row])))
        if found is None:
            raise call.refuse(
                f"node {node_ids[row]} of tree {tree_ids[row]}: its {name.split('_')[1]} "
                "node is not a node of the tree"
            )
        return slot[found]

    true_slots = [child(r, "nodes_truenodeids") for r in branch_rows]
    false_slots = [child(r, "nodes_falsenodeids") for r in branch_rows]
    roots, trees = [], set()
    for row, tree in enumerate(tree_ids):  # a tree's root: its first node, as onnxruntime reads
        if tree not in trees:
            trees.add(tree)
            roots.append(slot[row])
    weights = torch.zeros(len(leaf_rows), outputs, dtype=torch.float64)
    scored = torch.zeros(len(leaf_rows), outputs, dtype=torch.bool)
    weight_tensor = call.attribute(f"{prefix}_weights_as_tensor")
    leaf_weights = (
        weight_tensor.reshape(-1).to(torch.float64).tolist()
        if weight_tensor is not None
        else list(call.attribute(f"{prefix}_weights") or [])
    )
    leaf_trees = [int(v) for v in call.attribute(f"{prefix}_treeids") or []]
    leaf_nodes = [int(v) for v in call.attribute(f"{prefix}_nodeids") or []]
    leaf_ids = [int(v) for v in call.attribute(f"{prefix}_ids") or []]
    if not len(leaf_trees) == len(leaf_nodes) == len(leaf_ids) == len(leaf_weights):
        raise call.refuse(f"the {prefix}_* attributes must give as many values each")
    for tree, node, target, weight in zip(
        leaf_trees, leaf_nodes, leaf_ids, leaf_weights, strict=True
    ):
        row = key.get((tree, node))
        if row is None or modes[row] != "LEAF" or not 0 <= target < outputs:
            raise call.refuse(
                f"a weight for output {target} of node {node} of tree {tree}, which is no leaf "
                f"or no output of the {outputs}"
            )
        weights[slot[row] - len(branch_rows), target] += weight
        scored[slot[row] - len(branch_rows), target] = True
    thresholds = torch.tensor([values[r] for r in branch_rows], dtype=torch.float64)
    return _Forest(
        features=torch.tensor(
            [int(lists["nodes_featureids"][r]) for r in branch_rows], dtype=torch.int64
        ),
        thresholds=thresholds.to(thresholds_of).to(torch.float64),
        modes=torch.tensor([_MODES[modes[r]] for r in branch_rows], dtype=torch.int64),
        missing=torch.tensor([bool(missing[r]) for r in branch_rows], dtype=torch.bool),
        true_slots=torch.tensor(true_slots, dtype=torch.int64),
        false_slots=torch.tensor(false_slots, dtype=torch.int64),
        members=torch.zeros(len(branch_rows), 0, dtype=torch.float64),
        roots=torch.tensor(roots, dtype=torch.int64),
        weights=weights,
        scored=scored,
        depth=_depth(call, roots, true_slots, false_slots),
    )


def _threshold_type(x: torch.Tensor) -> torch.dtype:
    """The type onnxruntime compares an input's features in: double for double, else float."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _base_values(call: Call, outputs: int) -> torch.Tensor | None:
    tensor = call.attribute("base_values_as_tensor")
    values = (
        tensor.reshape(-1).to(torch.float64).tolist()
        if tensor is not None
        else list(call.attribute("base_values") or [])
    )
    if not values:
        return None
    return torch.tensor(values, dtype=torch.float64)


@implements("TreeEnsembleRegressor", 1, 3, domain=ML)
def tree_ensemble_regressor(call: Call, x: torch.Tensor) -> torch.Tensor:
    """The targets' weights of the leaves each example reaches, aggregated over the trees, plus
    ``base_values``, transformed; float32. Of several targets, one that none of the leaves
    reached weighs is 0, as onnxruntime gives it."""
    rows = _rows(call, x)
    targets = int(call.attribute("n_targets", 1))
    forest = _cached_forest(
        call, lambda: _legacy_forest(call, "target", targets, _threshold_type(x))
    )
    total, hit = forest.aggregate(call, rows, call.attribute("aggregate_function", "SUM"))
    base = _base_values(call, targets)
    if base is not None:
        if base.numel() != targets:
            raise call.refuse(f"{base.numel()} base_values for {targets} targets")
        total = total + base.to(x.device)
    if targets > 1:  # a target no leaf weighs is 0, its base value not added (onnxruntime)
        total = torch.where(hit, total, torch.zeros_like(total))
    transform = call.attribute("post_transform", "NONE")
    return _transform(call, total.float(), transform, columns=targets)


@implements("TreeEnsembleClassifier", 1, 3, domain=ML)
def tree_ensemble_classifier(call: Call, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The label and the scores of each example: the classes' weights of the leaves it
    reaches, summed over the trees, plus ``base_values``, as onnxruntime finalizes them. More
    than two classes: the label of the greatest score of a class some leaf or base value
    scores, the scores transformed by ``post_transform``. Two classes, as onnxruntime gives
    them: where the leaves weigh only one class, the second label where the positive score is
    above 0.5 (0 where some weight is negative), else the label 1 where it is above 0 (the
    number, not a class label); an example whose leaves score only the first class has the
    scores ``[1 - s, s]`` or ``[-s, s]`` (of the logistic ``s`` for ``LOGISTIC``)."""
    _strings(call, "classlabels_strings")
    labels = [int(v) for v in call.attribute("classlabels_int64s") or []]
    classes = len(labels)
    if classes < 2:
        raise call.refuse(f"{classes} classlabels_int64s (at least 2)")
    rows = _rows(call, x)
    forest = _cached_forest(
        call, lambda: _legacy_forest(call, "class", classes, _threshold_type(x))
    )
    scores, scored = forest.aggregate(call, rows, "SUM")
    base = _base_values(call, classes)
    transform = call.attribute("post_transform", "NONE")
    table = torch.tensor(labels, dtype=torch.int64, device=x.device)
    if classes > 2:
        if base is not None:
            if base.numel() > classes:
                raise call.refuse(f"{base.numel()} base_values for {classes} classes")
            padded = torch.zeros(classes, dtype=torch.float64)
            padded[: base.numel()] = base
            scores = scores + padded.to(x.device)
            scored = scored | (torch.arange(classes) < base.numel()).to(x.device)
        ranked = torch.where(scored, scores, torch.full_like(scores, -math.inf))
        label = table[torch.argmax(ranked, dim=1)]
        scores = torch.where(scored, scores, torch.zeros_like(scores)).float()
        return label, _transform(call, scores, transform, columns=classes)
    return _binary_trees(call, scores, scored, base, transform, table)


def _binary_trees(
    call: Call,
    scores: torch.Tensor,
    scored: torch.Tensor,
    base: torch.Tensor | None,
    transform: str,
    table: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The label and scores of a tree classifier of two classes, as onnxruntime's
    ``TreeAggregatorClassifier`` finalizes them (an example whose leaves score only the first
    class has one score, written as a pair)."""
    weights = [float(w) for w in call.attribute("class_weights") or []]
    given = call.attribute("class_weights_as_tensor")
    if given is not None:
        weights = [float(w) for w in given.reshape(-1).tolist()]
    one_class = len({int(c) for c in call.attribute("class_ids") or []}) == 1
    positive_weights = all(w >= 0 for w in weights)
    h0, h1 = scored[:, 0], scored[:, 1]
    s0, s1 = scores[:, 0], scores[:, 1]
    count = 0 if base is None else base.numel()
    written = -1  # onnxruntime's write_additional_scores
    if base is not None and count == 2:
        s1, s0 = torch.where(h1, base[1] + s0, s1 + base[1]), s0
        s0 = torch.where(h1, -s1, s0 + base[0])
        pair = torch.ones_like(h1)
    elif base is not None and count == 1:
        s0 = s0 + base[0]
        pair = h1
    elif count == 0:
        written, pair = 3, h1
    else:
        raise call.refuse(f"{count} base_values for 2 classes")
    positive = torch.where(pair & h1, s1, torch.where(h0, s0, torch.zeros_like(s0)))
    codes = torch.full_like(s0, written, dtype=torch.int64)
    if one_class:
        up = positive > (0.5 if positive_weights else 0.0)
        label = torch.where(up, table[1], table[0])
        codes = torch.where(up, 0, 1) if positive_weights else torch.where(up, 2, 3)
    else:
        label = torch.where(positive > 0, 1, 0).to(torch.int64)
    v0 = torch.where(h0, s0, torch.zeros_like(s0)).float().unsqueeze(1)
    v1 = torch.where(h1, s1, torch.zeros_like(s1)).float().unsqueeze(1)
    both = _transform(call, torch.cat([v0, v1], dim=1), transform, columns=2)
    if _checking() and not bool(pair.all()):
        alone = ~pair
        if transform == "PROBIT" or bool((codes[alone] < 0).any()):
            raise call.refuse(
                "an example whose trees score only the first of two classes, with "
                f"post_transform {transform} and {count} base_values (onnxruntime writes one "
                "score where it declares two)",
                not_implemented=True,
            )
    if transform == "LOGISTIC":
        signed = torch.cat([torch.sigmoid(-v0), torch.sigmoid(v0)], dim=1)
    else:
        signed = torch.cat([-v0, v0], dim=1)
    p = torch.sigmoid(v0) if transform == "LOGISTIC" else v0
    complement = torch.cat([1 - p, p], dim=1)
    single = torch.where((codes <= 1).unsqueeze(1), complement, signed)
    return label, torch.where(pair.unsqueeze(1), both, single)


_TRANSFORMS_5 = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")
"""TreeEnsemble-5's post_transform, by number."""


def _forest_5(call: Call, thresholds_of: torch.dtype) -> _Forest:
    """The tables of a TreeEnsemble-5: nodes by index, their children nodes or leaves by index
    (``nodes_trueleafs``, ``nodes_falseleafs``), the sets of ``BRANCH_MEMBER`` nodes in
    ``membership_values`` (each ended by a NaN)."""

    def ints(name: str) -> list[int]:
        value = call.attribute(name)
        if isinstance(value, torch.Tensor):
            return [int(v) for v in value.reshape(-1).tolist()]
        return [int(v) for v in value or []]

    features = ints("nodes_featureids")
    count = len(features)
    modes = ints("nodes_modes")
    splits = call.attribute("nodes_splits")
    true_ids, false_ids = ints("nodes_truenodeids"), ints("nodes_falsenodeids")
    true_leafs, false_leafs = ints("nodes_trueleafs"), ints("nodes_falseleafs")
    missing = ints("nodes_missing_value_tracks_true") or [0] * count
    targets = ints("leaf_targetids")
    leaf_weights = call.attribute("leaf_weights")
    outputs = int(call.attribute("n_targets", 1))
    assert splits is not None  # (required: onnx.checker)
    assert leaf_weights is not None
    split_values = splits.reshape(-1).to(torch.float64)
    weights_list = leaf_weights.reshape(-1).to(torch.float64)
    lengths = (modes, true_ids, false_ids, true_leafs, false_leafs, missing)
    if any(len(v) != count for v in lengths) or split_values.numel() != count:
        raise call.refuse("the nodes_* attributes must give a value for each of the nodes")
    if len(targets) != weights_list.numel() or any(not 0 <= t < outputs for t in targets):
        raise call.refuse(
            f"leaf_targetids {targets} and leaf_weights must give as many values, each target "
            f"below n_targets {outputs}"
        )
    if any(not 0 <= m <= 6 for m in modes):
        raise call.refuse(f"nodes_modes {modes} (0 to 6)")
    membership = call.attribute("membership_values")
    sets: list[list[float]] = []
    if 6 in modes:
        flat = [] if membership is None else membership.reshape(-1).to(torch.float64).tolist()
        current: list[float] = []
        for value in flat:
            if math.isnan(value):
                sets.append(current)
                current = []
            else:
                current.append(value)
        if len(sets) != modes.count(6):
            raise call.refuse(
                "membership_values must give a set, ended by a NaN, for each BRANCH_MEMBER node"
            )
    width = max((len(m) for m in sets), default=0)
    members = torch.full((count, width), math.nan, dtype=torch.float64)
    for row, values in zip([i for i in range(count) if modes[i] == 6], sets, strict=True):
        members[row, : len(values)] = torch.tensor(values, dtype=torch.float64)
    leaves = len(targets)

    def slot(index: int, leaf: int) -> int:
        if not 0 <= index < (leaves if leaf else count):
            kind = "leaf" if leaf else "node"
            raise call.refuse(f"a child {kind} {index} out of range")
        return count + index if leaf else index

    true_slots = [slot(i, t) for i, t in zip(true_ids, true_leafs, strict=True)]
    false_slots = [slot(i, f) for i, f in zip(false_ids, false_leafs, strict=True)]
    roots = []
    for root in ints("tree_roots"):
        if not 0 <= root < count:
            raise call.refuse(f"tree root {root} out of range")
        degenerate = true_leafs[root] and false_leafs[root] and true_ids[root] == false_ids[root]
        roots.append(true_slots[root] if degenerate else root)
    if not roots:
        raise call.refuse("no tree_roots")
    weights = torch.zeros(leaves, outputs, dtype=torch.float64)
    scored = torch.zeros(leaves, outputs, dtype=torch.bool)
    index = torch.arange(leaves)
    target_index = torch.tensor(targets, dtype=torch.int64)
    weights[index, target_index] = weights_list
    scored[index, target_index] = True
    return _Forest(
        features=torch.tensor(features, dtype=torch.int64),
        thresholds=split_values.to(thresholds_of).to(torch.float64),
        modes=torch.tensor(modes, dtype=torch.int64),
        missing=torch.tensor([bool(m) for m in missing], dtype=torch.bool),
        true_slots=torch.tensor(true_slots, dtype=torch.int64),
        false_slots=torch.tensor(false_slots, dtype=torch.int64),
        members=members.to(thresholds_of).to(torch.float64),
        roots=torch.tensor(roots, dtype=torch.int64),
        weights=weights,
        scored=scored,
        depth=_depth(call, roots, true_slots, false_slots),
    )


@implements("TreeEnsemble", 5, domain=ML)
def tree_ensemble(call: Call, x: torch.Tensor) -> torch.Tensor:
    """The targets' weights of the leaves each example reaches, aggregated over the trees and
    transformed, in the input's type."""
    rows = _rows(call, x)
    forest = _cached_forest(call, lambda: _forest_5(call, x.dtype))
    function = int(call.attribute("aggregate_function", 1))
    transform = int(call.attribute("post_transform", 0))
    if not 0 <= function < len(_AGGREGATES) or not 0 <= transform < len(_TRANSFORMS_5):
        raise call.refuse(
            f"aggregate_function {function} (0 to 3) or post_transform {transform} (0 to 4)"
        )
    total, _ = forest.aggregate(call, rows, _AGGREGATES[function])
    targets = total.shape[1]
    return _transform(call, total.to(x.dtype), _TRANSFORMS_5[transform], columns=targets)
