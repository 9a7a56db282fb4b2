import os

import hypothesis
import pytest
import torch

from ._export import share_torch_onnx_registry

# Several cores would make timings irrelevant here anyway; one keeps results bit-reproducible.
torch.set_num_threads(1)

# torch.onnx builds its registry of translations once per opset in each test process, not at
# every export (tests/_export.py)
share_torch_onnx_registry()

hypothesis.settings.register_profile(
    "default", deadline=None, max_examples=40, derandomize=True, print_blob=True
)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fuzz",
        type=int,
        default=None,
        metavar="N",
        help="run N random programs per test of tests/fuzz, from random seeds (docs/fuzzing.md)",
    )


DEVICES = ["cpu", "meta"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=[d for d in DEVICES if d != "meta"])
def device(request) -> str:
    """Every real device this machine has: the CPU, and a GPU where there is one."""
    return request.param


@pytest.fixture
def every_loop_scanned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Converted loops scanned at every length, as something tracing them has them: eagerly,
    those of fewer steps than ``_runtime.AS_WRITTEN_BELOW`` run as written
    (tests/test_autoloop.py tests that)."""
    from torchscan._autoloop import _runtime

    monkeypatch.setattr(_runtime, "AS_WRITTEN_BELOW", 0)
