"""The version table: which ``Scan`` and ``Loop`` each opset uses, and what each version allows.

Every rule that differs between versions of the two operators lives here, named by the version
that introduced it (``SCAN_9``, ``LOOP_13``). Code elsewhere reads the fields of the version in
force (:func:`scan_version`, :func:`loop_version`) and never compares opset numbers itself. The
element types each version allows are read from ``onnx.defs``, not typed in; a test holds the
list of versions against ``onnx.defs`` so that a new ONNX release is reviewed before it is used.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable

import onnx.defs
import onnx_ir as ir

from torchscan._errors import TorchscanValueError
from torchscan.onnx import _ir

MIN_OPSET = 8
"""The oldest opset torchscan exports to: ``Scan`` appeared in opset 8."""

MAX_OPSET = 25
"""The newest opset torchscan has been checked against."""

TORCH_BUILD_OPSET = 18
"""torch.onnx builds every model at this opset or newer; older targets are converted down."""

IR_VERSIONS = {
    8: 3, 9: 4, 10: 5, 11: 6, 12: 7, 13: 7, 14: 7, 15: 8, 16: 8, 17: 8, 18: 8, 19: 9, 20: 9,
    21: 10, 22: 10, 23: 11, 24: 12, 25: 13,
}  # fmt: skip
"""The oldest IR version released with each opset: the one a model converted down to that
opset declares, as older runtimes read no newer one. (A test holds it against onnx's own
table.)"""


def check_opset(opset: int) -> None:
    """Refuse an ``opset`` that torchscan does not export to, as every function here does."""
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise TorchscanValueError(
            f"torchscan exports to opsets {MIN_OPSET} to {MAX_OPSET}, but opset {opset} was asked"
        )


def ir_version_for(opset: int) -> int:
    """The oldest IR version released with ``opset`` (IR 3 came with opset 8)."""
    check_opset(opset)
    return IR_VERSIONS[opset]


@dataclasses.dataclass(frozen=True)
class OpVersion:
    """One version of ``Scan`` or ``Loop`` and the rules that hold for it."""

    op: str
    since: int
    what_changed: str
    batch_axis: bool = False
    """Scan-8: every state and sequence has a leading batch axis, sequences are scanned along
    axis 1, ``sequence_lens`` is an optional first input, and ``directions`` is the only axis or
    direction attribute."""
    negative_axes: bool = False
    """Scan-11: ``scan_input_axes`` and ``scan_output_axes`` may count from the back."""

    @functools.cached_property
    def element_types(self) -> frozenset[ir.DataType]:
        """The tensor element types this version accepts, from its schema in ``onnx.defs``."""
        schema = onnx.defs.get_schema(self.op, self.since)
        variadic = schema.inputs[-1].type_str
        allowed = next(c for c in schema.type_constraints if c.type_param_str == variadic)
        return frozenset(
            _TENSOR_TYPES[name] for name in allowed.allowed_type_strs if name in _TENSOR_TYPES
        )


_TENSOR_TYPES = {f"tensor({t.name.lower()})": t for t in ir.DataType if t != ir.DataType.UNDEFINED}

SCAN_8 = OpVersion("Scan", 8, "first version: batch axis and sequence_lens", batch_axis=True)
SCAN_9 = OpVersion("Scan", 9, "no batch axis; scan_input/output_axes and _directions")
SCAN_11 = OpVersion("Scan", 11, "negative axes", negative_axes=True)
SCAN_16 = OpVersion("Scan", 16, "bfloat16", negative_axes=True)
SCAN_19 = OpVersion("Scan", 19, "float8 types", negative_axes=True)
SCAN_21 = OpVersion("Scan", 21, "int4, uint4", negative_axes=True)
SCAN_23 = OpVersion("Scan", 23, "float4e2m1", negative_axes=True)
SCAN_24 = OpVersion("Scan", 24, "float8e8m0", negative_axes=True)
SCAN_25 = OpVersion("Scan", 25, "int2, uint2", negative_axes=True)
SCAN_VERSIONS = (SCAN_8, SCAN_9, SCAN_11, SCAN_16, SCAN_19, SCAN_21, SCAN_23, SCAN_24, SCAN_25)
"""Every version of ``Scan`` torchscan knows, oldest first: the one in force at an opset is the
newest whose ``since`` is not above it (:func:`scan_version`)."""

LOOP_1 = OpVersion("Loop", 1, "first version")
LOOP_11 = OpVersion("Loop", 11, "loop-carried values are optional: 2 inputs or more")
LOOP_13 = OpVersion("Loop", 13, "sequence types")
LOOP_16 = OpVersion("Loop", 16, "optional types, bfloat16")
LOOP_19 = OpVersion("Loop", 19, "float8 types")
LOOP_21 = OpVersion("Loop", 21, "int4, uint4")
LOOP_23 = OpVersion("Loop", 23, "float4e2m1")
LOOP_24 = OpVersion("Loop", 24, "float8e8m0")
LOOP_25 = OpVersion("Loop", 25, "int2, uint2")
LOOP_VERSIONS = (LOOP_1, LOOP_11, LOOP_13, LOOP_16, LOOP_19, LOOP_21, LOOP_23, LOOP_24, LOOP_25)
"""Every version of ``Loop`` torchscan knows, oldest first: the one in force at an opset is the
newest whose ``since`` is not above it (:func:`loop_version`)."""


def _in_force(versions: tuple[OpVersion, ...], opset: int) -> OpVersion:
    check_opset(opset)
    return [v for v in versions if v.since <= opset][-1]


def scan_version(opset: int) -> OpVersion:
    """The ``Scan`` version in force in a model of default-domain ``opset``."""
    return _in_force(SCAN_VERSIONS, opset)


def loop_version(opset: int) -> OpVersion:
    """The ``Loop`` version in force in a model of default-domain ``opset``."""
    return _in_force(LOOP_VERSIONS, opset)


def first_opset_allowing(versions: tuple[OpVersion, ...], dtype: ir.DataType) -> int | None:
    """The first opset whose version of the operator accepts ``dtype``, or None."""
    return next((v.since for v in versions if dtype in v.element_types), None)


OpKey = tuple[str, str, int]
"""An operator version as torchscan's registries key it (the converter's adapters, by the
boundary each crosses; ``to_torch``'s implementations, by the schema each follows): its domain
(``""`` for the default one), its name and the ``since_version`` of its schema."""


def op_key(domain: str, op: str, since: int) -> OpKey:
    """The key of version ``since`` of ``op`` in ``domain`` (``"ai.onnx"`` is ``""``)."""
    # (made for every node at every version boundary a conversion crosses)
    return ("" if domain in _ir.DEFAULT_DOMAINS else domain, op, since)


def schema_since(domain: str, op: str, opset: int) -> int | None:
    """The ``since_version`` of the schema of ``op`` in force at ``opset`` of ``domain``, from
    ``onnx.defs`` (None where onnx knows no such operator there)."""
    try:
        return onnx.defs.get_schema(op, opset, op_key(domain, op, 0)[0]).since_version
    except onnx.defs.SchemaError:
        return None


def unknown_versions(keys: Iterable[OpKey]) -> list[tuple[OpKey, str]]:
    """The keys that name no version ``onnx.defs`` defines, each with what is wrong: no schema
    of the operator, or a schema in force at that version that starts at another."""
    wrong = []
    for key in keys:
        domain, op, since = key
        try:
            schema = onnx.defs.get_schema(op, since, domain)
        except onnx.defs.SchemaError:
            wrong.append((key, "no schema"))
            continue
        if schema.since_version != since:
            wrong.append((key, f"version in force is {schema.since_version}"))
    return wrong


def markdown_table() -> str:
    """The opset table of the docs: which Scan and Loop each opset uses, and their types."""
    rows = [
        "| opset | Scan | Loop | element types added to Scan and Loop |",
        "| ---: | --- | --- | --- |",
    ]
    for opset in range(MIN_OPSET, MAX_OPSET + 1):
        scan, loop = scan_version(opset), loop_version(opset)
        previous = scan_version(opset - 1) if opset > MIN_OPSET else None
        added = scan.element_types - previous.element_types if previous else frozenset()
        names = ", ".join(sorted(t.name.lower() for t in added)) or ""
        rows.append(f"| {opset} | Scan-{scan.since} | Loop-{loop.since} | {names} |")
    base = ", ".join(sorted(t.name.lower() for t in SCAN_8.element_types))
    return "\n".join(rows) + f"\n\nScan-8 and Loop-1 allow: {base}.\n"
