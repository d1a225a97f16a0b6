"""Lower the builder's IR (onnx-ir) into the format's records (builder/writer.py).

Rules this module guarantees, which the runtime's verifier relies on:

* nodes are written in topological order (the IR is sorted before lowering);
* every graph's values are declared once; absent optional inputs and unused
  optional outputs are written as index -1;
* a subgraph is written after the graph that holds it (its index is larger),
  and lists as *captures* every value it, or any graph nested in it, reads
  from an enclosing scope, so the runtime resolves them by name one level up;
* initializers become tensors in the tensor-data section, 64-byte aligned.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from minirt.builder.errors import UnsupportedModel
from minirt.builder.load import MAP_META
from minirt.builder.writer import ArtifactWriter, GraphRecord
from minirt.dtypes import onnx_code
from minirt.format import schema as S

_ATTR_KIND = {
    ir.AttributeType.FLOAT: S.ATTR_FLOAT,
    ir.AttributeType.INT: S.ATTR_INT,
    ir.AttributeType.STRING: S.ATTR_STRING,
    ir.AttributeType.TENSOR: S.ATTR_TENSOR,
    ir.AttributeType.GRAPH: S.ATTR_GRAPH,
    ir.AttributeType.FLOATS: S.ATTR_FLOATS,
    ir.AttributeType.INTS: S.ATTR_INTS,
    ir.AttributeType.STRINGS: S.ATTR_STRINGS,
    ir.AttributeType.TENSORS: S.ATTR_TENSORS,
    ir.AttributeType.GRAPHS: S.ATTR_GRAPHS,
}


def _map_of(value: ir.Value) -> tuple | None:
    """(value kind, value dtype) of a map value (builder/load.py keeps it in the value's meta)."""
    return value.meta.get(MAP_META)


def _dtype_code(value: ir.Value) -> int:
    found = _map_of(value)
    if found is not None:
        return found[1]
    dtype = value.dtype
    return int(dtype.value) if dtype is not None else S.DTYPE_UNDEFINED


def _shape(value: ir.Value) -> tuple | None:
    shape = value.shape
    if shape is None:
        return None
    dims = []
    for d in shape:
        if isinstance(d, int):
            dims.append(d if d >= 0 else None)  # some exporters write -1 for "dynamic"
        else:
            sym = getattr(d, "value", None)
            dims.append(sym if isinstance(sym, str) and sym and sym != "?" else None)
    return tuple(dims)


def _value_kind(value: ir.Value) -> int:
    found = _map_of(value)
    if found is not None:
        return found[0]
    t = value.type
    if isinstance(t, ir.SequenceType):
        return S.VALUE_SEQUENCE
    if isinstance(t, ir.OptionalType):
        return S.VALUE_OPTIONAL_SEQUENCE if isinstance(t.elem_type, ir.SequenceType) else S.VALUE_OPTIONAL
    return S.VALUE_TENSOR


def _declare(rec: GraphRecord, value: ir.Value) -> int:
    """Index of ``value`` in ``rec``, recording its dtype, shape and kind."""
    return rec.value(value.name, _dtype_code(value), _shape(value), _value_kind(value))


def _tensor_array(tensor, where: str) -> np.ndarray:
    try:
        arr = tensor.numpy()
    except Exception as exc:  # noqa: BLE001 - external data or exotic dtypes
        raise UnsupportedModel(f"{where}: cannot read tensor data ({type(exc).__name__}: {exc})") from None
    if arr.dtype.kind in "US":
        arr = arr.astype(object)
    if arr.dtype != object:
        try:
            onnx_code(arr.dtype)
        except ValueError:
            raise UnsupportedModel(f"{where}: tensor element type {tensor.dtype} is not supported by minirt") from None
    return arr


def free_value_names(graph: ir.Graph) -> set[str]:
    """Names ``graph`` (or any graph nested in it) reads but does not define."""
    defined = {v.name for v in graph.inputs} | set(graph.initializers)
    used: set[str] = set()
    for node in graph:
        for v in node.inputs:
            if v is not None:
                used.add(v.name)
        for attr in node.attributes.values():
            for sub in _subgraphs(attr):
                used |= free_value_names(sub)
        defined.update(v.name for v in node.outputs)
    used.update(v.name for v in graph.outputs)
    return used - defined


def _subgraphs(attr) -> list:
    if attr.type == ir.AttributeType.GRAPH:
        return [attr.value]
    if attr.type == ir.AttributeType.GRAPHS:
        return list(attr.value)
    return []


def artifact_bytes(model: ir.Model) -> bytes:
    """``model`` lowered and encoded as-is (no metadata, no passes): for builder-internal runs."""
    writer = ArtifactWriter()
    lower_model(model, writer)
    return writer.to_bytes()


def lower_model(model: ir.Model, writer: ArtifactWriter) -> None:
    """Write ``model``'s main graph (index 0) and every subgraph into ``writer``."""
    writer.opsets.update({("" if d == "ai.onnx" else d): v for d, v in model.opset_imports.items()})
    _lower_graph(model.graph, writer, model.opset_imports, captures=())


def _lower_graph(graph: ir.Graph, writer: ArtifactWriter, opsets: dict, captures) -> int:
    index, rec = writer.graph(graph.name or f"graph{len(writer.graphs)}")
    for v in graph.inputs:
        rec.inputs.append(_declare(rec, v))
    for name, v in graph.initializers.items():
        if v.const_value is None:
            raise UnsupportedModel(f"graph {graph.name!r}: initializer {name!r} has no data")
        arr = _tensor_array(v.const_value, f"initializer {name!r}")
        rec.initializers.append((rec.value(name, _dtype_code(v), tuple(arr.shape)), writer.tensor(arr)))
    for name in sorted(captures):
        rec.captures.append(rec.value(name))
    for node in graph:
        _lower_node(node, rec, writer, opsets)
    for v in graph.outputs:
        rec.outputs.append(_declare(rec, v))
    return index


def _lower_node(node: ir.Node, rec: GraphRecord, writer: ArtifactWriter, opsets: dict) -> None:
    domain = "" if node.domain == "ai.onnx" else node.domain
    opset = node.version if node.version is not None else opsets.get(domain, opsets.get("ai.onnx", 1))
    op_index = writer.operator(domain, node.op_type, int(opset))
    where = f"node {node.name!r} ({node.op_type})"
    inputs = [-1 if v is None else _declare(rec, v) for v in node.inputs]
    # Trailing absent optional inputs carry no information.
    while inputs and inputs[-1] == -1:
        inputs.pop()
    outputs = [_declare(rec, v) if v.name else -1 for v in node.outputs]
    attributes = []
    for name, attr in node.attributes.items():
        if attr.type in (ir.AttributeType.TYPE_PROTO, ir.AttributeType.TYPE_PROTOS):
            # Pure type annotations (Optional's `type`): the runtime takes
            # types from the values themselves, so nothing is lost.
            continue
        kind = _ATTR_KIND.get(attr.type)
        if kind is None or getattr(attr, "is_ref", lambda: False)():
            raise UnsupportedModel(f"{where}: attribute {name!r} of type {attr.type.name} is not supported")
        value = attr.value
        if kind == S.ATTR_STRING:
            value = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        elif kind == S.ATTR_STRINGS:
            value = tuple(s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in value)
        elif kind == S.ATTR_TENSOR:
            value = writer.tensor(_tensor_array(value, f"{where} attribute {name!r}"))
        elif kind == S.ATTR_TENSORS:
            value = tuple(writer.tensor(_tensor_array(t, f"{where} attribute {name!r}")) for t in value)
        elif kind == S.ATTR_GRAPH:
            value = _lower_graph(value, writer, opsets, free_value_names(value))
        elif kind == S.ATTR_GRAPHS:
            value = tuple(_lower_graph(g, writer, opsets, free_value_names(g)) for g in value)
        elif kind == S.ATTR_FLOATS:
            value = tuple(float(x) for x in value)
        elif kind == S.ATTR_INTS:
            value = tuple(int(x) for x in value)
        attributes.append((name, kind, value))
    rec.add_node(node.name or f"{node.op_type}_{len(rec.nodes)}", op_index, inputs, outputs, attributes)
