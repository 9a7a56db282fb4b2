"""What changed at each version of an ONNX operator, read from the schemas in ``onnx.defs``.

A new version of an operator (its *since version*) is a boundary that a model crossing from the
newer opset to the older one must undo. :func:`classify` sorts every boundary into one of four
kinds by comparing the two schemas:

``new-op``
    the operator does not exist below the boundary;
``type-only``
    inputs, outputs, attributes and arities are the same, only the allowed element types
    differ: the node keeps its meaning and is valid below the boundary if its types are allowed
    there;
``identical``
    the two schemas are equal in everything, types included: the version was bumped for a change
    of meaning the schema cannot show (negative axes at opset 11, ``If`` branches of different
    shapes), so a node is never relabelled without an adapter;
``structural``
    anything else (an attribute or input added or removed, a default changed): an adapter must
    rewrite the node.

Formal parameter names and type-parameter names are ignored: a node refers to its inputs by
position and to types by the values it carries.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Literal

import onnx
import onnx.defs
import onnx_ir as ir

from torchscan._errors import TorchscanValueError

BoundaryKind = Literal["new-op", "type-only", "identical", "structural"]


@dataclasses.dataclass(frozen=True)
class Boundary:
    """The change an operator went through at ``since``: its kind and, for a structural change,
    which parts of the signature differ."""

    kind: BoundaryKind
    detail: str = ""


@functools.cache
def _schemas() -> dict[tuple[str, str], list[onnx.defs.OpSchema]]:
    found: dict[tuple[str, str], list[onnx.defs.OpSchema]] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        found.setdefault((schema.domain, schema.name), []).append(schema)
    return found


@functools.cache
def since_versions(op: str, domain: str = "") -> tuple[int, ...]:
    """Every opset at which ``op`` got a new version, oldest first."""
    return tuple(sorted(s.since_version for s in _schemas().get((domain, op), [])))


def since_in_force(op: str, opset: int, domain: str = "") -> int | None:
    """The since version of the ``op`` in force at ``opset``, or None where ``op`` is absent."""
    versions = [v for v in since_versions(op, domain) if v <= opset]
    return versions[-1] if versions else None


@functools.cache
def schema_in_force(op: str, opset: int, domain: str = "") -> onnx.defs.OpSchema | None:
    """The schema of ``op`` in force at ``opset``, or None where ``op`` is absent."""
    if since_in_force(op, opset, domain) is None:
        return None
    return onnx.defs.get_schema(op, opset, domain)


def _canonical_type_params(schema: onnx.defs.OpSchema) -> dict[str, str]:
    """Type-parameter names renamed by first use (``T``, ``V`` -> ``T0``, ``T1``)."""
    names = {c.type_param_str for c in schema.type_constraints}
    canonical: dict[str, str] = {}
    for param in [*schema.inputs, *schema.outputs]:
        if param.type_str in names and param.type_str not in canonical:
            canonical[param.type_str] = f"T{len(canonical)}"
    return canonical


def _signature(schema: onnx.defs.OpSchema) -> dict[str, object]:
    """Everything a node can observe in ``schema`` except the allowed element types."""
    canonical = _canonical_type_params(schema)

    def param(p: onnx.defs.OpSchema.FormalParameter) -> tuple[object, ...]:
        return (p.option, p.is_homogeneous, p.min_arity, canonical.get(p.type_str, p.type_str))

    def attribute(a: onnx.defs.OpSchema.Attribute) -> tuple[object, ...]:
        default = a.default_value
        serialized = default.SerializeToString(deterministic=True) if default.ByteSize() else b""
        return (a.name, a.type, a.required, serialized)

    return {
        "inputs": [param(p) for p in schema.inputs],
        "outputs": [param(p) for p in schema.outputs],
        "attributes": sorted(attribute(a) for a in schema.attributes.values()),
        "arity": (schema.min_input, schema.max_input, schema.min_output, schema.max_output),
        "type parameters": len(schema.type_constraints),
    }


def _allowed_types(schema: onnx.defs.OpSchema) -> dict[str, frozenset[str]]:
    canonical = _canonical_type_params(schema)
    return {
        canonical.get(c.type_param_str, c.type_param_str): frozenset(c.allowed_type_strs)
        for c in schema.type_constraints
    }


@functools.cache
def classify(op: str, since: int, domain: str = "") -> Boundary:
    """What changed when ``op`` got its version ``since`` (a key of :func:`since_versions`)."""
    new = schema_in_force(op, since, domain)
    if new is None or new.since_version != since:
        raise TorchscanValueError(f"{op} has no version introduced at opset {since}")
    old = schema_in_force(op, since - 1, domain)
    if old is None:
        return Boundary("new-op")
    new_signature, old_signature = _signature(new), _signature(old)
    changed = [key for key in new_signature if new_signature[key] != old_signature[key]]
    if changed:
        return Boundary("structural", ", ".join(changed) + " changed")
    if _allowed_types(new) != _allowed_types(old):
        return Boundary("type-only")
    return Boundary("identical")


def allowed_types(schema: onnx.defs.OpSchema, type_str: str) -> frozenset[str]:
    """The type strings (``tensor(float)``) a formal parameter of type ``type_str`` accepts."""
    for constraint in schema.type_constraints:
        if constraint.type_param_str == type_str:
            return frozenset(constraint.allowed_type_strs)
    return frozenset([type_str])


def type_string(type_: ir.TypeProtocol) -> str | None:
    """The schema spelling of a value's type (``tensor(float)``, ``seq(tensor(int64))``), or
    None where the type is not fully known."""
    if isinstance(type_, ir.TensorType):
        elem = type_.dtype
        return f"tensor({tensor_type_name(elem)})" if elem != ir.DataType.UNDEFINED else None
    if isinstance(type_, (ir.SequenceType, ir.OptionalType)):
        inner = type_string(type_.elem_type)
        wrapper = "seq" if isinstance(type_, ir.SequenceType) else "optional"
        return f"{wrapper}({inner})" if inner else None
    return None


def tensor_type_name(elem_type: int) -> str:
    """The schema spelling of an element type: ``float``, ``int64``, ``float16``."""
    return ir.DataType(elem_type).name.lower()
