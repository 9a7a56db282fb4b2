"""The rules that ``Scan`` and ``Loop`` share: the node's attributes and arity against the schema
of the version in force, the types its type constraint V allows, one type for a value at the node
and in the body, scalars of the right element type, and which inputs may be omitted.
"""

from __future__ import annotations

import enum
from typing import cast

import onnx
import onnx.defs
import onnx_ir as ir

from torchscan.onnx import _opsets
from torchscan.onnx._lint._rules import (
    _allowed_statement,
    _allowed_types,
    _attribute_list_text,
    _attribute_text,
    _listing,
    _type_constraint_quote,
)
from torchscan.onnx._lint._site import _dims, _named, _Site, _text, _type_str


def _check_attributes(site: _Site, needed: dict[str, str]) -> bool:
    """Attributes against the schema of the version in force; True when those in ``needed``
    (name -> type name) are there with their types, so that the other rules can run."""
    rule = f"{site.version.op.lower()}-attribute"
    schema_attrs = site.schema.attributes
    for name, attr in site.node.attributes.items():
        expected = schema_attrs.get(name)
        if expected is None:
            owners = _versions_with_attribute(site.version, name)
            where = f"; it is an attribute of {owners}" if owners else ""
            site.report(
                rule,
                f"{site.op} has no attribute {name!r}{where}. The attributes of {site.op} are "
                f"{_listing(sorted(schema_attrs))}.",
                _attribute_list_text(site.schema),
                f"{site.op}, attributes",
            )
        elif not attr.is_ref() and attr.type.name != _type_name(expected):
            site.report(
                rule,
                f"attribute {name!r} is of type {attr.type.name}, where {site.op} expects "
                f"{_type_name(expected)}.",
                _attribute_text(expected),
                f"{site.op}, attribute {name}",
            )
    for name, a in schema_attrs.items():
        if a.required and name not in site.node.attributes:
            site.report(
                rule,
                f"the required attribute {name!r} is missing.",
                _attribute_text(a),
                f"{site.op}, attribute {name}",
            )
    return all(
        name in site.node.attributes
        and not site.node.attributes[name].is_ref()
        and site.node.attributes[name].type.name == type_name
        for name, type_name in needed.items()
    )


def _type_name(attribute: onnx.defs.OpSchema.Attribute) -> str:
    """The name of the type of a schema's attribute (``INT``, ``GRAPH``): an ``IntEnum`` member,
    which onnx's stub declares as a plain class."""
    return cast(enum.Enum, attribute.type).name


def _versions_with_attribute(version: _opsets.OpVersion, name: str) -> str:
    versions = _opsets.SCAN_VERSIONS if version.op == "Scan" else _opsets.LOOP_VERSIONS
    owners = [
        f"{v.op}-{v.since}"
        for v in versions
        if name in onnx.defs.get_schema(v.op, v.since, "").attributes
    ]
    return ", ".join(owners)


def _check_arity(site: _Site) -> None:
    schema, rule = site.schema, f"{site.version.op.lower()}-arity"
    for what, count, low, high in (
        ("inputs", len(site.node.inputs), schema.min_input, schema.max_input),
        ("outputs", len(site.node.outputs), schema.min_output, schema.max_output),
    ):
        if not low <= count <= high:
            site.report(
                rule,
                f"the node has {count} {what}, where {site.op} takes {low} to {high}.",
                f"Between {low} and {high} {what}.",
                f"{site.op}, {what}",
            )


def _check_types(site: _Site, roles: list[tuple[str, ir.Value | None]]) -> None:
    """Each input and output of the node has a type that the version in force allows."""
    allowed = _allowed_types(site.version)
    for role, value in roles:
        name = _type_str(value)
        if value is None or name is None or name in allowed:
            continue
        first = _first_opset_allowing(site.version, value, name)
        later = (
            f"; the first opset that allows it is {first}"
            if first
            else f"; no {site.version.op} version allows it"
        )
        quote, source = _type_constraint_quote(site.version)
        site.report(
            f"{site.version.op.lower()}-element-type",
            f"{role}, {_named(value)}, is of type {name}, which {site.op} (in force at opset "
            f"{site.opset}) does not allow: {_allowed_statement(site.version)}{later}.",
            quote,
            source,
        )


def _first_opset_allowing(version: _opsets.OpVersion, value: ir.Value, name: str) -> int | None:
    versions = _opsets.SCAN_VERSIONS if version.op == "Scan" else _opsets.LOOP_VERSIONS
    if isinstance(value.type, ir.TensorType):
        return _opsets.first_opset_allowing(versions, value.type.dtype)
    return next((v.since for v in versions if name in _allowed_types(v)), None)


def _check_same_type(site: _Site, rule: str, what: str, sides: list[tuple[str, ir.Value]]) -> None:
    """The values on ``sides`` (where, value) are one value: their known types must agree."""
    typed = [(where, v, t) for where, v in sides if (t := _type_str(v)) is not None]
    # An optional carried value holds its element once set: optional(T) and T are one type,
    # as in ONNX's own test_loop16_seq_none.
    if len({_unwrap_optional(t) for _, _, t in typed}) > 1:
        listed = "; ".join(f"{where} {v.name!r}: {t}" for where, v, t in typed)
        site.report(rule, f"{what} changes type: {listed}.")


def _unwrap_optional(name: str) -> str:
    return name[len("optional(") : -1] if name.startswith("optional(") else name


def _check_scalar(site: _Site, rule: str, what: str, value: ir.Value | None, dtype: str) -> None:
    """``value``, where given and known, is a scalar tensor of element type ``dtype``."""
    name, dims = _type_str(value), _dims(value)
    if value is None:
        return
    if name is not None and name != f"tensor({dtype})":
        site.report(rule, f"{what}, {_named(value)}, is of type {name}, not tensor({dtype}).")
    elif dims is not None and dims:
        site.report(rule, f"{what}, {_named(value)}, has shape {_text(dims)}, not a scalar.")


def _optional_inputs(site: _Site) -> str:
    """Which inputs of the version in force are optional, from its schema, in words."""
    optional = [
        p.name
        for p in site.schema.inputs
        if p.option == onnx.defs.OpSchema.FormalParameterOption.Optional
    ]
    if not optional:
        return f"{site.op} has none"
    if len(optional) == 1:
        return f"the only optional input of {site.op} is {optional[0]}"
    return f"the optional inputs of {site.op} are {_listing(optional)}"
