"""Quantization candidates: the layers of a graph the quantizer may rewrite, with the facts its rules read.

A *candidate* is a Conv / FusedConv / Gemm / FusedGemm / MatMul / FusedMatMul
whose weight is a constant float32 initializer (``kind`` "conv" / "matmul"),
a ConvTranspose with stride == kernel ("convt": int8 in static mode), or,
with ``weight_only``, another ConvTranspose or an LSTM / GRU / RNN whose
weights are constant float32, or a Gather of a constant float32 table's rows by
run-time indices (an embedding) ("weight-only": int8 storage, float compute).
:func:`find_candidates` also returns (node, reason) for the layers of those
op types it refused.  Which candidates are quantized is the quantizer's
choice (``builder/quantize/__init__.py``, rules read from the target
profile); the rewriting itself is the ``quant_layers`` pass.

By default a candidate that no other candidate follows (a *final* layer: a
classifier's last Gemm, a detector's heads) stays float: :func:`find_candidates`
marks those ``final``.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.quantize import qir
from minirt.builder.quantize.qir import Candidate

__all__ = ["Candidate", "find_candidates"]


def _tile_conv_transpose(node: ir.Node, model: ir.Model) -> bool:
    """Whether ``node`` is a 2-D ConvTranspose / FusedConvTranspose with a constant float32 weight
    and stride == kernel, one group, no padding, dilation 1, no output_padding / output_shape (every
    input pixel its own output tile): the form QConvTranspose computes in int8."""
    if qir.key(node) not in qir.CONV_TRANSPOSE_OPS or len(node.inputs) < 2 or node.inputs[0] is None:
        return False
    w = qir.scoped_const(node.inputs[1], node, model)
    if w is None or w.dtype != np.float32 or w.ndim != 4:
        return False
    k = [int(v) for v in w.shape[2:]]
    kernel = [int(v) for v in irh.attr(node, "kernel_shape", ()) or ()]
    strides = [int(v) for v in irh.attr(node, "strides", ()) or ()] or [1, 1]
    return ((not kernel or kernel == k) and strides == k and int(irh.attr(node, "group", 1)) == 1
            and not any(int(v) for v in irh.attr(node, "pads", ()) or ())
            and all(int(v) == 1 for v in irh.attr(node, "dilations", ()) or ())
            and not any(int(v) for v in irh.attr(node, "output_padding", ()) or ())
            and not irh.attr(node, "output_shape", ()) and irh.attr(node, "auto_pad", "NOTSET") in ("NOTSET", "VALID")
            and node.inputs[0].dtype in (None, ir.DataType.FLOAT))


def _body_owners(model: ir.Model) -> dict:
    """id(output value of an If / Loop / Scan body) -> the node that runs the body: where a value leaving
    a body goes on (into that node's outputs)."""
    return {id(v): node for graph in irh.graphs(model) for node in graph
            for body in irh.subgraphs(node) for v in body.outputs}


def _final_nodes(model: ir.Model, candidate_ids: set) -> set:
    """Candidates that no other candidate follows: the model's last layers (a classifier's Gemm, a
    detector's heads).  Not "a path to an output that meets no other candidate": in a residual
    network every block's output projection has such a path (the skip connections), and a BERT
    encoder kept 9 of its 25 layers float for that reason (D89).  A value leaving an If / Loop / Scan
    body follows on through every output of the node that runs the body (D95)."""
    memo: dict[int, bool] = {}
    owners = _body_owners(model)

    def feeds_a_candidate(value: ir.Value) -> bool:
        key = id(value)
        if key in memo:
            return memo[key]
        memo[key] = False  # (cycles cannot happen; a value being visited counts as not yet known)
        hit = False
        consumers = [use.node for use in value.uses()]
        if key in owners:
            consumers.append(owners[key])
        for consumer in consumers:
            if id(consumer) in candidate_ids or any(feeds_a_candidate(o) for o in consumer.outputs):
                hit = True
                break
        memo[key] = hit
        return hit

    return {node.name for graph in irh.graphs(model) for node in graph
            if id(node) in candidate_ids and not any(feeds_a_candidate(o) for o in node.outputs)}


def _plane(x: ir.Value) -> int:
    """Pixels per channel (product of the dimensions after the first two) of a conv input of static
    shape, else 0."""
    dims = list(x.shape) if x.shape is not None else []
    if len(dims) < 3 or not all(isinstance(d, int) and d > 0 for d in dims[2:]):
        return 0
    return int(np.prod(dims[2:]))


def find_candidates(model: ir.Model, weight_only: bool = True) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """Quantizable nodes of the model, those inside If / Loop / Scan bodies included (D95), and
    (node, reason) for the ones refused.  Node names are unique across the graphs
    (:func:`unique_node_names`): the rewrite finds a candidate by its name."""
    found: list[Candidate] = []
    refused: list[tuple[str, str]] = []
    ids = {}
    for graph in irh.graphs(model):
        for node in graph:
            c = _candidate(node, model, weight_only, refused)
            if c is not None:
                found.append(c)
                ids[id(node)] = None
    final = _final_nodes(model, set(ids))
    for c in found:
        c.final = c.name in final
    return found, refused


def unique_node_names(model: ir.Model) -> int:
    """Give every node of the model (subgraphs included) a name no other node has: an empty or repeated
    name (two If branches exported with the same node names) becomes ``<name or op type>_<k>``.
    Returns how many were renamed."""
    seen: set = set()
    renamed = 0
    for graph in irh.graphs(model):
        for node in graph:
            name = node.name
            if name and name not in seen:
                seen.add(name)
                continue
            base, k = name or node.op_type, 1
            while f"{base}_{k}" in seen:
                k += 1
            node.name = f"{base}_{k}"
            seen.add(node.name)
            renamed += 1
    return renamed


def _embedding(node: ir.Node, model: ir.Model) -> Candidate | None:
    """A Gather of rows of a constant float32 table (rank >= 2) by run-time indices: an embedding, stored
    int8 by row (weights-only); any other Gather is not a layer (no refusal: it moves activations)."""
    data, indices = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
    table = qir.scoped_const(data, node, model) if data is not None else None
    if table is None or table.dtype != np.float32 or table.ndim < 2 or indices is None:
        return None
    if int(irh.attr(node, "axis", 0)) != 0 or qir.scoped_const(indices, node, model) is not None:
        return None
    return Candidate(node.name, node.op_type, "weight-only", "", data.name, weight_elements=int(table.size))


def _candidate(node: ir.Node, model: ir.Model, weight_only: bool, refused: list) -> Candidate | None:
    """The candidate ``node`` is, or None (not a layer; or refused: (name, reason) added to ``refused``)."""
    key = qir.key(node)
    kind = None
    if key in qir.CONV_OPS:
        kind = "conv"
    elif key in qir.GEMM_OPS or key in qir.MATMUL_OPS:
        kind = "matmul"
    elif _tile_conv_transpose(node, model):
        kind = "convt"
    elif key in qir.WEIGHT_ONLY_OPS and weight_only:
        kind = "weight-only"
    if kind is None:
        return None
    if kind == "convt":
        w = node.inputs[1]
        return Candidate(node.name, node.op_type, "convt", node.inputs[0].name, w.name,
                         weight_elements=int(w.const_value.size))
    if kind == "weight-only" and key == ("", "Gather"):
        return _embedding(node, model)
    if kind == "weight-only":
        idx, _axis = qir.WEIGHT_ONLY_OPS[key]
        ws = [node.inputs[i] if i < len(node.inputs) else None for i in idx]
        arrs = [qir.scoped_const(w, node, model) for w in ws]
        if any(a is None or a.dtype != np.float32 for a in arrs):
            refused.append((node.name, f"{node.op_type}: weights are not constant float32"))
            return None
        return Candidate(node.name, node.op_type, kind, "", ",".join(w.name for w in ws),
                         weight_elements=sum(a.size for a in arrs))
    x, w = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
    warr = qir.scoped_const(w, node, model)
    if warr is None or warr.dtype != np.float32:
        refused.append((node.name, f"{node.op_type}: weight is not a constant float32 initializer"))
        return None
    if x is None or (x.dtype is not None and x.dtype != ir.DataType.FLOAT):
        refused.append((node.name, f"{node.op_type}: input is not float32"))
        return None
    if kind == "conv" and warr.ndim < 3:
        refused.append((node.name, "Conv: weight rank < 3"))
        return None
    if kind == "matmul":
        if warr.ndim != 2:
            refused.append((node.name, f"{node.op_type}: weight is not a 2-D matrix"))
            return None
        if key in qir.GEMM_OPS:
            if irh.attr(node, "transA", 0):
                refused.append((node.name, "Gemm with transA=1"))
                return None
            c = node.inputs[2] if len(node.inputs) > 2 else None
            if c is not None and float(irh.attr(node, "beta", 1.0)) != 1.0 and qir.scoped_const(c, node, model) is None:
                refused.append((node.name, "Gemm with beta != 1 and a non-constant C"))
                return None
    group = int(irh.attr(node, "group", 1))
    depthwise = kind == "conv" and warr.shape[1] == 1 and group == warr.shape[0] and group > 1
    if kind == "conv":
        reduction = int(np.prod(warr.shape[1:]))
    else:
        reduction = int(warr.shape[1] if key in qir.GEMM_OPS and irh.attr(node, "transB", 0) else warr.shape[0])
    return Candidate(node.name, node.op_type, kind, x.name, w.name, weight_elements=int(warr.size),
                     depthwise=depthwise, reduction=reduction,
                     window=int(np.prod(warr.shape[2:])) if kind == "conv" else 1,
                     plane=_plane(x) if kind == "conv" else 0,
                     strides=int(np.prod(irh.attr(node, "strides", None) or (1,))) if kind == "conv" else 1,
                     group_outputs=warr.shape[0] // group if kind == "conv" and group > 1 and not depthwise
                     else 0,
                     outputs=int(warr.shape[0]) if kind == "conv" else 0,
                     output=node.outputs[0].name if kind == "conv" else "",
                     activation=str(irh.attr(node, "activation", "")) if kind == "conv" else "",
                     residual=kind == "conv" and len(node.inputs) > 3 and node.inputs[3] is not None)
