"""The ``torchscan`` command line: ``torchscan check MODEL.onnx`` (see ``docs/check.md``).

This module imports neither onnx nor onnxruntime until a command runs, so that ``import
torchscan`` stays light. ``check`` always ends: each source of outputs runs within ``--timeout``
seconds, and Ctrl-C stops it at once (exit status 130); with ``--json``, what is printed on
stdout is one JSON document whatever happens, errors included.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from torchscan._errors import TorchscanValueError, reduce_error

EXIT_OK = 0
EXIT_FAILED = 1
"""Findings, outputs that disagree, or a runtime that failed on the model or did not end within
the timeout."""
EXIT_UNREADABLE = 2
"""The model or the inputs cannot be read, or the options do not fit the model."""
EXIT_NOT_COMPARED = 3
"""The model is clean, but fewer than two independent sources ran it, so no outputs were held
against anything (unless ``--allow-single-source``)."""
EXIT_INTERRUPTED = 130
"""Ctrl-C: 128 + SIGINT, as shells report a command that SIGINT ended."""
DEFAULT_TIMEOUT = 60.0
"""Seconds each source of outputs may run, by default."""


class _UsageError(Exception):
    """Options that argparse refuses; raised in place of its exit, so that ``--json`` is kept."""

    __reduce__ = reduce_error

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(self, message)


def entry() -> NoReturn:
    """The ``torchscan`` console script and ``python -m torchscan``: :func:`main`, then exit
    with its status. A source stopped by Ctrl-C or a time limit may still be inside a runtime's
    C++ code, which interpreter shutdown must not wait on or tear down under it (onnxruntime
    aborts the process): then the process ends at once, its output flushed."""
    import os
    import threading

    code = main()
    if threading.active_count() > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``torchscan`` command with ``argv`` (``sys.argv[1:]`` by default).

    Returns:
      The exit status: 0 when the model is clean, 1 on findings, mismatches or timeouts, 2 when
      the model, the inputs or the options cannot be used (one line on stderr says why, and
      with ``--json`` a JSON document on stdout), 3 when fewer than two independent sources
      ran the model (not compared), 130 on Ctrl-C.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    as_json = "--json" in argv[: argv.index("--")] if "--" in argv else "--json" in argv
    parser = _parser()
    try:
        options = parser.parse_args(argv)
        if options.command is None:
            parser.print_help(sys.stderr)
            return EXIT_UNREADABLE
        return _check(options)
    except _UsageError as error:
        if not as_json:
            error.parser.print_usage(sys.stderr)
        return _fail(str(error), as_json, EXIT_UNREADABLE, prog=error.parser.prog)
    except KeyboardInterrupt:
        return _fail("interrupted", as_json, EXIT_INTERRUPTED, status="interrupted")
    except ImportError as error:
        if error.name != "torchscan.onnx":  # not the onnx extra missing
            raise
        return _fail(str(error), as_json, EXIT_UNREADABLE)


def _fail(
    message: str, as_json: bool, code: int, *, status: str = "error", prog: str = "torchscan check"
) -> int:
    """Say why the command stops on one line of stderr, ``PROG: error: MESSAGE``, and with
    ``--json`` as one JSON document on stdout: ``{"status": "error", "error": MESSAGE,
    "exit_status": 2}`` (``"interrupted"`` and 130 on Ctrl-C)."""
    line = f"{prog}: error: {message}" if status == "error" else f"{prog}: {message}"
    print(line, file=sys.stderr, flush=True)
    if as_json:
        document = {"status": status, "error": message, "exit_status": code}
        print(json.dumps(document, ensure_ascii=False), flush=True)
    return code


def _parser() -> argparse.ArgumentParser:
    """The command line's parser: ``torchscan --version``, and ``torchscan check`` with its
    options (docs/check.md)."""
    from torchscan import __version__

    parser = _Parser(
        prog="torchscan", description="Tools for loops exported to ONNX Scan and Loop nodes."
    )
    parser.add_argument("--version", action="version", version=f"torchscan {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    check = commands.add_parser(
        "check",
        help="lint the Scan, Loop and If nodes of an ONNX model and compare runtimes on it",
        description=(
            "Lint every Scan, Loop and If node of MODEL against the rules of its version, run "
            "the model in onnxruntime, onnx's reference evaluator and the module "
            "torchscan.onnx.to_torch makes of it (imported), and compare their outputs "
            "(with the expected outputs where the inputs come with them, and with a PyTorch "
            "module given by --module: without either, a model that computes the wrong thing "
            "the same way in every runtime passes). Exit status: 0 "
            "clean, 1 findings, mismatches or timeouts, 2 unreadable input or wrong options, "
            "3 not compared (fewer than two independent runtimes ran the model), 130 Ctrl-C."
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
    check.add_argument(
        "--runtimes",
        type=_runtimes,
        default=None,
        metavar="NAMES",
        help="the runtimes to run, comma-separated, among onnxruntime, reference and imported "
        "(the module torchscan.onnx.to_torch makes of the model; all three by default)",
    )
    check.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"seconds each runtime (and PyTorch) may run the model before it is stopped and "
        f"reported as timed out, a failure ({DEFAULT_TIMEOUT:g}); a child process's start-up "
        f"does not count",
    )
    check.add_argument(
        "--allow-single-source",
        action="store_true",
        help="pass (exit 0) where fewer than two independent sources ran the model, so nothing "
        "was compared (exit 3 by default)",
    )
    check.add_argument(
        "--strict",
        action="store_true",
        help="the default: a check that fewer than two independent sources ran exits 3",
    )
    check.add_argument(
        "--module",
        metavar="PACKAGE.MODULE:FACTORY",
        help="a PyTorch baseline: FACTORY() returns the nn.Module (put in eval mode) or callable "
        "that is run on the model's inputs, in their order, and compared with the runtimes",
    )
    check.add_argument(
        "--json",
        action="store_true",
        help='print the report as JSON; errors too, as {"status": "error", "error": ...}',
    )
    check.add_argument(
        "--lint-only", action="store_true", help="lint the nodes without running the model"
    )
    return parser


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds greater than 0, not {text!r}"
        )
    return seconds


def _runtimes(text: str) -> tuple[str, ...]:
    from torchscan.onnx._check._compare import unknown_runtime
    from torchscan.onnx._check._runtimes import RUNTIMES

    names = tuple(name.strip() for name in text.split(","))
    unknown = [name for name in names if name not in RUNTIMES]
    if unknown or not names:
        name = unknown[0] if unknown else ""
        raise argparse.ArgumentTypeError(unknown_runtime(name, f" in {text!r}", "--module"))
    return tuple(dict.fromkeys(names))


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
    from torchscan.onnx._check._compare import API as CHECK_API
    from torchscan.onnx._check._compare import RUNTIMES, check

    if options.strict and options.allow_single_source:
        return _fail(
            "--strict fails where fewer than two sources ran the model, and "
            "--allow-single-source passes; give one of them",
            options.json,
            EXIT_UNREADABLE,
        )
    for option, does in (("strict", "fails"), ("allow_single_source", "passes")):
        if getattr(options, option) and options.lint_only:
            return _fail(
                f"--{option.replace('_', '-')} {does} where fewer than two sources ran the model, "
                "and --lint-only runs none; give one of them",
                options.json,
                EXIT_UNREADABLE,
            )
    if options.runtimes and options.lint_only:
        return _fail(
            "--runtimes names runtimes to run, and --lint-only runs none; give one of them",
            options.json,
            EXIT_UNREADABLE,
        )
    if options.module and options.lint_only:
        return _fail(
            "--module gives a baseline for the runtimes, and --lint-only runs none; give one of "
            "them",
            options.json,
            EXIT_UNREADABLE,
        )
    try:
        module = None if options.module is None else _baseline(options.module)
        report = check(
            options.model,
            inputs=options.inputs,
            atol=options.atol,
            rtol=options.rtol,
            dims=dict(options.dim) or None,
            runtimes=() if options.lint_only else (options.runtimes or RUNTIMES),
            module=module,
            timeout=options.timeout,
            strict=not options.allow_single_source,
        )
    except (OSError, ValueError) as error:
        # the command names itself on the line already (``torchscan check: error: ...``)
        message = str(error).removeprefix(f"{CHECK_API}: ")
        return _fail(message, options.json, EXIT_UNREADABLE)
    except MemoryError:
        return _fail(
            "out of memory reading or running the model; give dynamic dimensions smaller sizes "
            "with --dim NAME=SIZE",
            options.json,
            EXIT_UNREADABLE,
        )
    if options.json:
        print(report.to_json())
    else:
        _print(report)
    if report.ok:
        return EXIT_OK
    return EXIT_NOT_COMPARED if report.verdict == "not compared" else EXIT_FAILED


def _baseline(spec: str) -> Any:
    """The PyTorch baseline that ``--module PACKAGE.MODULE:FACTORY`` names: what ``FACTORY()``
    returns, an ``nn.Module`` put in eval mode, or another callable. The module is imported
    with the current folder on ``sys.path``, as ``python -m`` does.

    Raises:
      ValueError: the module cannot be imported, has no such attribute, or what it names or
        returns cannot be called; the message says which.
    """
    import importlib
    import os

    name, sep, attribute = spec.partition(":")
    if not (sep and name and attribute):
        raise TorchscanValueError(f"--module {spec}: expected PACKAGE.MODULE:FACTORY")
    where = f"--module {spec}"
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: Any = importlib.import_module(name)
    except Exception as error:  # any error of the user's module, ImportError or other
        raise TorchscanValueError(
            f"{where}: cannot import {name} ({type(error).__name__}: {error})"
        ) from None
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise TorchscanValueError(f"{where}: {name} has no attribute {attribute!r}")
        found = getattr(found, part)
    if not callable(found):
        raise TorchscanValueError(
            f"{where}: {name}.{attribute} is {_a(type(found).__name__)}, not a factory to call"
        )
    try:
        baseline = found()
    except Exception as error:
        raise TorchscanValueError(
            f"{where}: {attribute}() raised {type(error).__name__}: {error}"
        ) from None
    if not callable(baseline):
        raise TorchscanValueError(
            f"{where}: {attribute}() returned {_a(type(baseline).__name__)}, not an nn.Module "
            f"or a callable"
        )
    if hasattr(baseline, "eval") and hasattr(baseline, "training"):  # an nn.Module
        baseline.eval()
    return baseline


def _a(noun: str) -> str:
    """``"a str"``, ``"an int"``."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _print(report: object) -> None:
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=120)  # a pipe or a file: wide enough for the tables
    console.print(report, soft_wrap=True)  # a line of text, as a runtime's reason, stays one
