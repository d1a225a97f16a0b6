"""Load an ONNX model into the builder's IR (onnx-ir), with shape inference.

Accepts a path (external data is read from beside the file), a
``onnx.ModelProto`` or serialized bytes.  Runs the ONNX checker and ONNX shape
inference (with data propagation, so shape-computing chains get known
shapes), then converts to ``onnx_ir.Model``.  docs/decisions.md records why
the IR is onnx-ir rather than our own.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any

import onnx
import onnx_ir as ir

from minirt.builder.errors import BuildError

# Protobuf refuses to serialize more than 2 GiB; above this, shape inference
# must run on the file rather than in memory.
_PROTO_LIMIT = 2**31 - 1


@dataclasses.dataclass
class SourceInfo:
    """Where the model came from, recorded in the artifact's metadata."""

    path: str | None
    sha256: str
    size: int
    producer_name: str
    producer_version: str
    ir_version: int
    opsets: dict
    graph_name: str
    doc_string: str
    model_version: int
    metadata_props: dict


def _read_proto(model: Any) -> tuple[onnx.ModelProto, str | None, bytes | None]:
    if isinstance(model, onnx.ModelProto):
        return model, None, None
    if isinstance(model, (bytes, bytearray, memoryview)):
        data = bytes(model)
        try:
            return onnx.load_model_from_string(data), None, data
        except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError and others
            raise BuildError(f"the given bytes are not a valid ONNX model: {exc}") from None
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.exists(path):
            raise BuildError(f"{path}: no such file")
        if os.path.isdir(path):
            raise BuildError(f"{path}: is a directory, expected an .onnx file")
        with open(path, "rb") as f:
            data = f.read()
        try:
            proto = onnx.load_model_from_string(data)
        except Exception as exc:  # noqa: BLE001
            raise BuildError(f"{path}: not a valid ONNX model ({type(exc).__name__}: {exc})") from None
        try:
            onnx.external_data_helper.load_external_data_for_model(proto, os.path.dirname(os.path.abspath(path)))
        except (OSError, ValueError, onnx.checker.ValidationError) as exc:
            raise BuildError(f"{path}: external data is missing or unreadable: {exc}") from None
        return proto, path, data
    raise BuildError(f"cannot load a model from {type(model).__name__}; pass a path, bytes or onnx.ModelProto")


def load_model(model: Any, check: bool = True) -> tuple[ir.Model, SourceInfo]:
    """Load ``model`` (path, bytes or ModelProto), infer shapes and convert to onnx-ir."""
    proto, path, data = _read_proto(model)
    where = path or "model"
    if data is None:
        data = proto.SerializeToString() if proto.ByteSize() < _PROTO_LIMIT else b""
    if not proto.graph.node and not proto.graph.output:
        raise BuildError(f"{where}: the ONNX graph is empty (no nodes and no outputs)")
    if check:
        try:
            onnx.checker.check_model(proto)
        except onnx.checker.ValidationError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            raise BuildError(f"{where}: the ONNX checker rejects the model: {first}") from None
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - inference failure is not fatal: kernels run without shapes
        inferred = proto
        _ = exc
    try:
        model_ir = ir.from_proto(inferred)
    except Exception as exc:  # noqa: BLE001
        raise BuildError(f"{where}: could not read the ONNX model into the IR: {type(exc).__name__}: {exc}") from None
    info = SourceInfo(
        path=path,
        sha256=hashlib.sha256(data).hexdigest() if data else "",
        size=len(data) if data else proto.ByteSize(),
        producer_name=proto.producer_name,
        producer_version=proto.producer_version,
        ir_version=proto.ir_version,
        opsets={(o.domain if o.domain != "ai.onnx" else ""): o.version for o in proto.opset_import},
        graph_name=proto.graph.name,
        doc_string=proto.doc_string,
        model_version=proto.model_version,
        metadata_props={p.key: p.value for p in proto.metadata_props},
    )
    return model_ir, info
