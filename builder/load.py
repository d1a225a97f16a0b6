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
from minirt.format import schema as S

# Value.meta key under which the builder keeps a map value's (value kind, value dtype code): onnx-ir has
# no map type, so map types are taken off the proto before the IR is built and put back by name here.
MAP_META = "minirt.map"

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
        from minirt.builder.contrib_schemas import ensure_registered

        ensure_registered()  # onnxruntime's default-domain contrib ops (SimplifiedLayerNormalization)
        try:
            onnx.checker.check_model(proto)
        except onnx.checker.ValidationError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            raise BuildError(f"{where}: the ONNX checker rejects the model: {first}") from None
    try:
        # check_type: a node whose inputs bound to one type parameter have different element types (a
        # float64 Conv weight on a float32 input) is refused here, as onnxruntime refuses it when loading,
        # rather than at the artifact's first run; every other inference failure is not fatal
        inferred = onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=False, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - inference failure is not fatal: kernels run without shapes
        text = str(exc).strip()
        if "has inconsistent type" in text:
            first = text.splitlines()[0]
            raise BuildError(f"{where}: the model's element types disagree ({first}); the inputs of a node that "
                             "share a type constraint (a Conv's X and W, an Add's A and B) must have one element "
                             "type: cast one of them in the model") from None
        try:
            inferred = onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
        except Exception:  # noqa: BLE001
            inferred = proto
    maps = _take_map_types(inferred, where)
    try:
        model_ir = ir.from_proto(inferred)
    except Exception as exc:  # noqa: BLE001
        raise BuildError(f"{where}: could not read the ONNX model into the IR: {type(exc).__name__}: {exc}") from None
    if maps:
        _put_map_types(model_ir, maps)
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


def _map_kind(tp: onnx.TypeProto, where: str) -> tuple | None:
    """(value kind, dtype code of the map's values) of a map or sequence-of-maps type, else None."""
    seq = tp.HasField("sequence_type") and tp.sequence_type.elem_type.HasField("map_type")
    if not (tp.HasField("map_type") or seq):
        return None
    mt = tp.sequence_type.elem_type.map_type if seq else tp.map_type
    if not mt.value_type.HasField("tensor_type"):
        raise BuildError(f"{where}: map values must be tensors, got {mt.value_type}")
    key = mt.key_type
    if key == onnx.TensorProto.STRING:
        kind = S.VALUE_SEQUENCE_MAP_STRING if seq else S.VALUE_MAP_STRING
    elif key in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
        kind = S.VALUE_SEQUENCE_MAP_INT64 if seq else S.VALUE_MAP_INT64
    else:
        raise BuildError(f"{where}: map keys of type {onnx.TensorProto.DataType.Name(key)} are not supported "
                         f"(int64 or string)")
    return kind, int(mt.value_type.tensor_type.elem_type)


def _take_map_types(proto: onnx.ModelProto, where: str) -> dict:
    """Remove the map types of the main graph's inputs, outputs and value infos (onnx-ir cannot hold
    them) and return them by value name: name -> (value kind, value dtype code)."""
    maps = {}
    g = proto.graph
    for vi in (*g.input, *g.output, *g.value_info):
        found = _map_kind(vi.type, f"{where}: value {vi.name!r}")
        if found is not None:
            maps[vi.name] = found
            vi.ClearField("type")
    return maps


def _put_map_types(model_ir: ir.Model, maps: dict) -> None:
    graph = model_ir.graph
    values = [*graph.inputs, *graph.outputs, *(o for n in graph for o in n.outputs)]
    for v in values:
        if v.name in maps:
            v.meta[MAP_META] = maps[v.name]
