"""Each test file of the zoo names its cases in ``NAMES``; the shared test functions of
``_harness`` are parametrized over them, and over the opsets where they export (a sample of them
unless ``TORCHSCAN_TEST_ALL_OPSETS=1``: ``tests/onnx/_roundtrip.opset_pairs``)."""

from __future__ import annotations

import pytest

from ..onnx._roundtrip import EVERY_PAIR, opset_pairs
from ._cases import CASES
from ._harness import OPSETS


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    names = getattr(metafunc.module, "NAMES", None)
    if names is None or "zoo_case" not in metafunc.fixturenames:
        return
    if metafunc.function.__name__ == "test_eager_gradients_match_oracle":
        names = [name for name in names if CASES[name].grad_inputs or _has_parameters(name)]
    if "opset" not in metafunc.fixturenames:
        metafunc.parametrize("zoo_case", names)
        return
    # (case, opset, test) -> why that point cannot pass there: the file tests that error instead.
    outside = getattr(metafunc.module, "OUTSIDE_TORCHSCAN", {})
    pairs = [
        (name, opset)
        for name, opset in opset_pairs(list(names), OPSETS)
        if (name, opset, metafunc.function.__name__) not in outside
    ]
    if metafunc.function.__name__ == "test_imported_module_matches_eager" and not EVERY_PAIR:
        # one opset per case (18, which every case exports): the module's computation is the
        # same whatever the opset, which the other points check
        pairs = [(name, opset) for name, opset in pairs if opset == 18]
    metafunc.parametrize(("zoo_case", "opset"), pairs, ids=[f"{n}-{o}" for n, o in pairs])


def _has_parameters(name: str) -> bool:
    from ._harness import module_of

    return any(True for _ in module_of(name).parameters())
