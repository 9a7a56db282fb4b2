"""The ``torchscan`` command line: ``torchscan check MODEL.onnx`` (see ``docs/check.md``).

This module imports neither onnx nor onnxruntime until a command runs, so that ``import
torchscan`` stays light.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

EXIT_OK = 0
EXIT_FAILED = 1
"""Findings, outputs that disagree, or a runtime that failed on the model."""
EXIT_UNREADABLE = 2
"""The model or the inputs cannot be read, or the options do not fit the model."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``torchscan`` command with ``argv`` (``sys.argv[1:]`` by default).

    Returns:
      The exit status: 0 when the model is clean, 1 on findings or mismatches, 2 when the
      model or the inputs cannot be read (one line on stderr says why).
    """
    parser = _parser()
    options = parser.parse_args(argv)
    if options.command is None:
        parser.print_help(sys.stderr)
        return EXIT_UNREADABLE
    return _check(options)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchscan", description="Tools for loops exported to ONNX Scan and Loop nodes."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    check = commands.add_parser(
        "check",
        help="lint the Scan and Loop nodes of an ONNX model and compare runtimes on it",
        description=(
            "Lint every Scan and Loop node of MODEL against the rules of its version, run the "
            "model in onnxruntime and onnx's reference evaluator, and compare their outputs "
            "(with the expected outputs where the inputs come with them). Exit status: 0 "
            "clean, 1 findings or mismatches, 2 unreadable input."
        ),
    )
    check.add_argument("model", metavar="MODEL.onnx", help="the ONNX model to check")
    check.add_argument(
        "--inputs",
        metavar="FILE",
        help="a .npz file of inputs by name, or a folder of input_*.pb (and output_*.pb) files "
        "as in ONNX test cases; random inputs by default",
    )
    check.add_argument(
        "--atol", type=float, default=1e-5, metavar="A", help="absolute tolerance (1e-5)"
    )
    check.add_argument(
        "--rtol", type=float, default=1e-5, metavar="R", help="relative tolerance (1e-5)"
    )
    check.add_argument(
        "--dim",
        action="append",
        type=_dim,
        default=[],
        metavar="NAME=SIZE",
        help="size of a dynamic dimension of random inputs (repeatable); each unset one gets a "
        "size of its own, 3, 4, ... skipping static sizes, except that the lengths of one Scan's "
        "scan inputs get one size",
    )
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.add_argument(
        "--lint-only", action="store_true", help="lint the nodes without running the model"
    )
    return parser


def _dim(text: str) -> tuple[str, int]:
    name, sep, size = text.partition("=")
    if not (sep and name and size.isascii() and size.isdigit()):
        raise argparse.ArgumentTypeError(
            f"expected NAME=SIZE with SIZE a whole number, not {text!r}"
        )
    if len(size.lstrip("0")) > 18:  # int() refuses past 4300 digits; no size is near this
        raise argparse.ArgumentTypeError(f"SIZE is too large in {text!r}")
    return name, int(size)


def _check(options: argparse.Namespace) -> int:
    from torchscan.onnx._check._compare import RUNTIMES, check

    try:
        report = check(
            options.model,
            inputs=options.inputs,
            atol=options.atol,
            rtol=options.rtol,
            dims=dict(options.dim) or None,
            runtimes=() if options.lint_only else RUNTIMES,
        )
    except (OSError, ValueError) as error:
        print(f"torchscan check: error: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    except MemoryError:
        print(
            "torchscan check: error: out of memory reading or running the model; give dynamic "
            "dimensions smaller sizes with --dim NAME=SIZE",
            file=sys.stderr,
        )
        return EXIT_UNREADABLE
    if options.json:
        print(report.to_json())
    else:
        _print(report)
    return EXIT_OK if report.ok else EXIT_FAILED


def _print(report: object) -> None:
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=120)  # a pipe or a file: wide enough for the tables
    console.print(report, soft_wrap=True)  # a line of text, as a runtime's reason, stays one
