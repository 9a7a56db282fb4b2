"""Reading an ONNX model from a path, bytes or an ``onnx.ModelProto`` (``torchscan check`` and
``torchscan.onnx.to_torch`` alike), with errors that say what is wrong with the file: protobuf
parses much that is not ONNX, and says only "Error parsing message" of a file cut short, so the
top-level fields are first read with a parser of the protobuf wire format, which tells the two
apart and says where a truncated file ends; a model that parses but that no tool can read (a
string that is not UTF-8, no opset_import) is refused too (:func:`check_readable`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import onnx
import onnx.checker
import onnx.external_data_helper
from google.protobuf.message import DecodeError

from torchscan._errors import TorchscanTypeError, TorchscanValueError

_MODEL_FIELDS = {
    1: ("ir_version", 0),
    2: ("producer_name", 2),
    3: ("producer_version", 2),
    4: ("domain", 2),
    5: ("model_version", 0),
    6: ("doc_string", 2),
    7: ("graph", 2),
    8: ("opset_import", 2),
    14: ("metadata_props", 2),
    20: ("training_info", 2),
    25: ("functions", 2),
    26: ("configuration", 2),
}
"""The top-level fields of ``onnx.ModelProto``: number -> (name, protobuf wire type)."""


def load_model(model: Any) -> tuple[onnx.ModelProto, str]:
    """Read ``model`` (path, bytes or ModelProto): the proto, and a label for messages.

    Raises:
      FileNotFoundError: no file at the path.
      ValueError: a folder, an empty file, a file that is not an ONNX model or is truncated.
      TypeError: none of the accepted types.
    """
    if isinstance(model, onnx.ModelProto):
        return model, "<ModelProto>"
    if isinstance(model, (bytes, bytearray, memoryview)):
        return _parse(bytes(model), "<bytes>"), "<bytes>"
    if not isinstance(model, (str, os.PathLike)):
        raise TorchscanTypeError(
            f"model is a path, bytes or an onnx.ModelProto, not {type(model).__name__}"
        )
    path = Path(model)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    if path.is_dir():
        raise TorchscanValueError(f"{path}: is a folder, not an ONNX model file")
    proto = _parse(path.read_bytes(), str(path))
    try:  # weights saved next to the model; nothing to do for a model without any
        onnx.external_data_helper.load_external_data_for_model(proto, str(path.parent))
    except (OSError, ValueError, onnx.checker.ValidationError) as error:
        raise TorchscanValueError(f"{path}: cannot read its external data: {error}") from None
    return proto, str(path)


def _parse(data: bytes, label: str) -> onnx.ModelProto:
    if not data:
        raise TorchscanValueError(f"{label}: is empty, not an ONNX model")
    problem = _wire_problem(data)
    if problem:
        raise TorchscanValueError(f"{label}: {problem}")
    try:
        proto = onnx.ModelProto.FromString(data)
    except DecodeError as error:
        raise TorchscanValueError(f"{label}: is not a valid ONNX model ({error})") from None
    if not proto.HasField("graph"):
        raise TorchscanValueError(f"{label}: is not an ONNX model (it has no graph)")
    return proto


def check_readable(model: onnx.ModelProto, label: str) -> None:
    """Refuse a model that parsed but that no tool can read: one with a string that is not
    UTF-8, which protobuf leaves as bytes, or one with no opset_import at all (a model cut short
    right after its graph field parses so)."""
    where = _bad_string(model, "")
    if where is not None:
        path, value = where
        raise TorchscanValueError(
            f"{label}: is corrupt: its string {path} is not valid UTF-8 ({value[:40]!r})"
        )
    if not model.opset_import:
        raise TorchscanValueError(
            f"{label}: has no opset_import, which every ONNX model needs to say the versions of "
            f"its operators (a file cut short right after its graph field reads like this)"
        )


def _bad_string(message: Any, path: str) -> tuple[str, bytes] | None:
    """The first string field under ``message`` that protobuf could not decode as UTF-8 (and
    so gives as bytes), with its path as in ``graph.node[3].output[0]``, or None."""
    from google.protobuf.descriptor import FieldDescriptor

    for field in message.DESCRIPTOR.fields:
        if field.type not in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE):
            continue  # bytes fields (raw_data) are not read, let alone copied
        name = f"{path}.{field.name}" if path else field.name
        repeated = getattr(field, "is_repeated", None)  # protobuf 6.31+; label before it
        if repeated is None:
            repeated = field.label == FieldDescriptor.LABEL_REPEATED
        if repeated:
            values = [(f"{name}[{i}]", v) for i, v in enumerate(getattr(message, field.name))]
        elif field.type == FieldDescriptor.TYPE_MESSAGE and not message.HasField(field.name):
            continue
        else:
            values = [(name, getattr(message, field.name))]
        for where, value in values:
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                found = _bad_string(value, where)
                if found is not None:
                    return found
            elif not isinstance(value, str):
                return where, value
    return None


def _wire_problem(data: bytes) -> str | None:
    """Why ``data`` is not, at its top level, a whole ``ModelProto``, or None.

    Protobuf parses much that is not ONNX, and says only "Error parsing message" of a file cut
    short; reading the top-level fields tells the two apart, and says where a truncated file
    ends.
    """
    pos = 0
    while pos < len(data):
        start = pos
        tag, pos = _varint(data, pos)
        number, wire = (tag >> 3, tag & 7) if tag is not None else (None, None)
        name, expected_wire = (
            _MODEL_FIELDS.get(number, (None, None)) if number is not None else (None, None)
        )
        if name is None or wire != expected_wire:
            return f"is not an ONNX model (byte {start} does not start a field of ModelProto)"
        value, pos = _varint(data, pos)
        if value is None:
            return f"is truncated: it ends inside the {name} field, at byte {len(data)}"
        if wire == 2:
            if pos + value > len(data):
                return (
                    f"is truncated: its {name} field declares {value} bytes, but the file ends "
                    f"{len(data) - pos} bytes into it"
                )
            pos += value
    return None


def _varint(data: bytes, pos: int) -> tuple[int | None, int]:
    value = shift = 0
    while pos < len(data) and shift < 70:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    return None, pos


__all__ = ["check_readable", "load_model"]
