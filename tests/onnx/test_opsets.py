"""The version table against ``onnx.defs`` and against the ONNX specification."""

from __future__ import annotations

from typing import Any

import onnx.defs
import onnx_ir as ir
import pytest

from torchscan.onnx import _opsets
from torchscan.onnx._opsets import LOOP_VERSIONS, SCAN_VERSIONS, loop_version, scan_version


def since_versions(op: str) -> list[int]:
    return sorted(
        {
            s.since_version
            for s in onnx.defs.get_all_schemas_with_history()
            if s.name == op and s.domain == ""
        }
    )


@pytest.mark.parametrize(("op", "table"), [("Scan", SCAN_VERSIONS), ("Loop", LOOP_VERSIONS)])
def test_table_lists_every_version_onnx_knows(op: str, table) -> None:
    # A new ONNX release with a new Scan or Loop fails here until the table is reviewed.
    assert [v.since for v in table] == since_versions(op)
    assert all(v.op == op for v in table)


# Which version each opset uses, as the ONNX operator changelog gives it.
SCAN_AT = {8: 8, 9: 9, 10: 9, 11: 11, 13: 11, 15: 11, 16: 16, 17: 16, 18: 16, 19: 19, 20: 19,
           21: 21, 22: 21, 23: 23, 24: 24, 25: 25}  # fmt: skip
LOOP_AT = {8: 1, 9: 1, 10: 1, 11: 11, 12: 11, 13: 13, 15: 13, 16: 16, 18: 16, 19: 19, 21: 21,
           23: 23, 24: 24, 25: 25}  # fmt: skip


@pytest.mark.parametrize(("opset", "since"), SCAN_AT.items())
def test_scan_version_in_force(opset: int, since: int) -> None:
    assert scan_version(opset).since == since


@pytest.mark.parametrize(("opset", "since"), LOOP_AT.items())
def test_loop_version_in_force(opset: int, since: int) -> None:
    assert loop_version(opset).since == since


def _convert_to(opset: int) -> None:
    import onnx_ir as ir

    from torchscan.onnx._export._convert import convert_model

    convert_model(
        ir.Model(ir.Graph([], [], nodes=[], opset_imports={"": 25}), ir_version=13), opset
    )


@pytest.mark.parametrize("opset", [7, 26])
@pytest.mark.parametrize(
    "asks", [scan_version, loop_version, _convert_to], ids=["scan", "loop", "convert"]
)
def test_opsets_outside_the_range_are_refused(opset: int, asks: Any) -> None:
    """One message, wherever an opset is asked for."""
    with pytest.raises(ValueError, match=f"torchscan exports to opsets 8 to 25, but opset {opset}"):
        asks(opset)


# The element types each version added, as the ONNX specification lists them.
ADDED = {
    ir.DataType.BFLOAT16: 16,
    ir.DataType.FLOAT8E4M3FN: 19,
    ir.DataType.FLOAT8E4M3FNUZ: 19,
    ir.DataType.FLOAT8E5M2: 19,
    ir.DataType.FLOAT8E5M2FNUZ: 19,
    ir.DataType.INT4: 21,
    ir.DataType.UINT4: 21,
    ir.DataType.FLOAT4E2M1: 23,
    ir.DataType.FLOAT8E8M0: 24,
    ir.DataType.INT2: 25,
    ir.DataType.UINT2: 25,
}


@pytest.mark.parametrize("dtype", list(ADDED), ids=lambda d: d.name.lower())
@pytest.mark.parametrize("table", [SCAN_VERSIONS, LOOP_VERSIONS], ids=["Scan", "Loop"])
def test_first_opset_allowing_new_types(table, dtype: ir.DataType) -> None:
    assert _opsets.first_opset_allowing(table, dtype) == ADDED[dtype]


@pytest.mark.parametrize(
    "version", SCAN_VERSIONS + LOOP_VERSIONS, ids=lambda v: f"{v.op}-{v.since}"
)
def test_classic_types_are_allowed_everywhere(version) -> None:
    classic = {ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.INT64, ir.DataType.BOOL}
    assert classic <= version.element_types


def test_only_scan_8_has_a_batch_axis_and_negative_axes_start_at_11() -> None:
    assert [v.since for v in SCAN_VERSIONS if v.batch_axis] == [8]
    assert [v.since for v in SCAN_VERSIONS if not v.negative_axes] == [8, 9]


def test_ir_versions_match_the_releases_of_onnx() -> None:
    """The IR version a converted model declares: the oldest released with its opset, and IR 3
    (opset 8's) at the least, as ``onnx.helper.VERSION_TABLE`` lists them."""
    import onnx.helper

    expected = {
        opset: max(3, min(ir for _, ir, ops, *_ in onnx.helper.VERSION_TABLE if ops >= opset))
        for opset in range(_opsets.MIN_OPSET, _opsets.MAX_OPSET + 1)
    }
    assert expected == _opsets.IR_VERSIONS
    assert all(_opsets.ir_version_for(o) == v for o, v in expected.items())


@pytest.mark.parametrize("opset", [_opsets.MIN_OPSET - 1, _opsets.MAX_OPSET + 1])
def test_ir_version_of_an_opset_outside_the_range_is_refused(opset: int) -> None:
    with pytest.raises(ValueError, match=f"torchscan exports to opsets 8 to 25, but opset {opset}"):
        _opsets.ir_version_for(opset)


def _registries() -> dict[str, list[_opsets.OpKey]]:
    from torchscan.onnx._export._convert._registry import registry
    from torchscan.onnx._import import _registry

    return {"converter": list(registry), "import": list(_registry.keys())}


@pytest.mark.parametrize("which", ["converter", "import"])
def test_every_registered_operator_version_is_one_onnx_defines(which: str) -> None:
    """The converter's adapter for ``(domain, op, b)`` crosses the boundary where version ``b``
    of ``op`` starts, and ``to_torch``'s implementation for it follows the schema that starts
    there: ``onnx.defs`` has a schema of ``op`` whose since version is ``b``."""
    keys = _registries()[which]
    assert len(keys) > 50
    assert _opsets.unknown_versions(keys) == []


def test_an_unknown_version_is_found_with_what_is_wrong() -> None:
    assert _opsets.unknown_versions([("", "Add", 7), ("", "Add", 8), ("", "NoSuchOp", 1)]) == [
        (("", "Add", 8), "version in force is 7"),
        (("", "NoSuchOp", 1), "no schema"),
    ]


def test_the_registries_key_the_default_domain_alike() -> None:
    assert _opsets.op_key("ai.onnx", "Scan", 9) == _opsets.op_key("", "Scan", 9) == ("", "Scan", 9)
    assert _opsets.op_key("ai.onnx.ml", "Scaler", 1) == ("ai.onnx.ml", "Scaler", 1)
    assert _opsets.schema_since("ai.onnx", "Scan", 10) == 9
    assert _opsets.schema_since("", "Scan", 7) is None
