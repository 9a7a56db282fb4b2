"""How many times a call crosses from one torchscan module into another, by ``sys.setprofile``.

A crossing is a Python call whose caller and callee are in two different modules of the
package. Counted for a 20-step Elman scan: its first eager call (checked, its plan made), a later
call (its plan reused, its step hoisted), an export through ``torch.onnx.export`` at opsets 18
and 11, and a forward of the module ``torchscan.onnx.to_torch`` imports from that export. Fewer
crossings mean a route a reader can follow; the figure is exact, not a timing. Run ``python
benchmarks/routes.py --pairs`` for the pairs of modules that cross most.
"""

from __future__ import annotations

import argparse
import collections
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

import torchscan
import torchscan.onnx

T, B, H = 20, 4, 8


class Elman(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.RNNCell(H, H)

    def forward(self, xs: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        def step(h: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = self.cell(x, h)
            return h, h

        return torchscan.scan(step, h, xs)[1]


def _module(frame: Any) -> str | None:
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    return name if name == "torchscan" or name.startswith("torchscan.") else None


def crossings(run: Callable[[], Any]) -> collections.Counter[tuple[str, str]]:
    """The calls of ``run()`` from one torchscan module into another, by (caller, callee)."""
    found: collections.Counter[tuple[str, str]] = collections.Counter()

    def profile(frame: Any, event: str, _: Any) -> None:
        if event != "call":
            return
        callee = _module(frame)
        if callee is None:
            return
        caller = _module(frame.f_back)
        if caller is not None and caller != callee:
            found[(caller, callee)] += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return found


def _export(model: Elman, xs: torch.Tensor, h: torch.Tensor, opset: int) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.onnx.export(
            model,
            (xs, h),
            dynamo=True,
            opset_version=opset,
            dynamic_shapes=({0: torch.export.Dim("T")}, None),
            verbose=False,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=0, help="show the N pairs that cross most")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = Elman()
    xs, h = torch.randn(T, B, H), torch.zeros(B, H)
    program = _export(model, xs, h, 18)
    imported = torchscan.onnx.to_torch(program.model_proto)
    with torch.no_grad():
        imported(xs, h)  # its first call, outside the count

    cases: dict[str, Callable[[], Any]] = {
        "eager, first call": lambda: model(torch.randn(T, B, H), h),
        "eager, later call": lambda: model(torch.randn(T, B, H), h),
        "export, opset 18": lambda: _export(model, xs, h, 18),
        "export, opset 11": lambda: _export(model, xs, h, 11),
        "imported module": lambda: imported(xs, h),
    }
    for _ in range(3):  # the later call: its plan reused, its step hoisted
        model(torch.randn(T, B, H), h)
    from torchscan import _hoist

    _hoist.clear()
    torchscan._scan._checked.clear()  # the first call: checked in full
    print(f"torch {torch.__version__}, torchscan {torchscan.__version__}, Elman T={T}\n")
    print("| call | crossings |\n| --- | ---: |")
    pairs = []
    for name, run in cases.items():
        if name == "eager, later call":
            for _ in range(3):
                run()
        with torch.no_grad() if name == "imported module" else torch.enable_grad():
            found = crossings(run)
        print(f"| {name} | {sum(found.values())} |")
        pairs += [
            f"{name}: {n} {caller} -> {callee}"
            for (caller, callee), n in found.most_common(args.pairs)
        ]
    if pairs:
        print("\n" + "\n".join(pairs))


if __name__ == "__main__":
    main()
