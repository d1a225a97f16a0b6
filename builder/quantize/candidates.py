"""Quantization candidates: the layers of a graph the quantizer may rewrite, with the facts its rules read.

A *candidate* is a Conv / FusedConv / Gemm / FusedGemm / MatMul / FusedMatMul
whose weight is a constant float32 initializer (``kind`` "conv" / "matmul"),
a ConvTranspose with stride == kernel ("convt": int8 in static mode), or,
with ``weight_only``, another ConvTranspose or an LSTM / GRU / RNN whose
weights are constant float32 ("weight-only": int8 storage, float compute).
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


def _tile_conv_transpose(node: ir.Node, graph: ir.Graph) -> bool:
    """Whether ``node`` is a 2-D ConvTranspose / FusedConvTranspose with a constant float32 weight
    and stride == kernel, one group, no padding, dilation 1, no output_padding / output_shape (every
    input pixel its own output tile): the form QConvTranspose computes in int8."""
    if qir.key(node) not in qir.CONV_TRANSPOSE_OPS or len(node.inputs) < 2 or node.inputs[0] is None:
        return False
    w = qir.const(node.inputs[1], graph)
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


def _final_nodes(graph: ir.Graph, candidate_ids: set) -> set:
    """Candidates that no other candidate follows: the model's last layers (a classifier's Gemm, a
    detector's heads).  Not "a path to an output that meets no other candidate": in a residual
    network every block's output projection has such a path (the skip connections), and a BERT
    encoder kept 9 of its 25 layers float for that reason (D89)."""
    memo: dict[int, bool] = {}

    def feeds_a_candidate(value: ir.Value) -> bool:
        key = id(value)
        if key in memo:
            return memo[key]
        memo[key] = False  # (cycles cannot happen; a value being visited counts as not yet known)
        hit = False
        for use in value.uses():
            consumer = use.node
            if id(consumer) in candidate_ids or any(feeds_a_candidate(o) for o in consumer.outputs):
                hit = True
                break
        memo[key] = hit
        return hit

    return {node.name for node in graph
            if id(node) in candidate_ids and not any(feeds_a_candidate(o) for o in node.outputs)}


def _plane(x: ir.Value) -> int:
    """Pixels per channel (product of the dimensions after the first two) of a conv input of static
    shape, else 0."""
    dims = list(x.shape) if x.shape is not None else []
    if len(dims) < 3 or not all(isinstance(d, int) and d > 0 for d in dims[2:]):
        return 0
    return int(np.prod(dims[2:]))


def find_candidates(model: ir.Model, weight_only: bool = True) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """Quantizable nodes of the main graph, and (node, reason) for the ones refused."""
    graph = model.graph
    found: list[Candidate] = []
    refused: list[tuple[str, str]] = []
    ids = {}
    for node in graph:
        key = qir.key(node)
        kind = None
        if key in qir.CONV_OPS:
            kind = "conv"
        elif key in qir.GEMM_OPS or key in qir.MATMUL_OPS:
            kind = "matmul"
        elif _tile_conv_transpose(node, graph):
            kind = "convt"
        elif key in qir.WEIGHT_ONLY_OPS and weight_only:
            kind = "weight-only"
        if kind is None:
            continue
        if kind == "convt":
            w = node.inputs[1]
            found.append(Candidate(node.name, node.op_type, "convt", node.inputs[0].name, w.name,
                                   weight_elements=int(w.const_value.size)))
            ids[id(node)] = None
            continue
        if kind == "weight-only":
            idx, _axis = qir.WEIGHT_ONLY_OPS[key]
            ws = [node.inputs[i] if i < len(node.inputs) else None for i in idx]
            arrs = [qir.const(w, graph) for w in ws]
            if any(a is None or a.dtype != np.float32 for a in arrs):
                refused.append((node.name, f"{node.op_type}: weights are not constant float32"))
                continue
            found.append(Candidate(node.name, node.op_type, kind, "", ",".join(w.name for w in ws),
                                   weight_elements=sum(a.size for a in arrs)))
            ids[id(node)] = None
            continue
        x, w = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
        warr = qir.const(w, graph)
        if warr is None or warr.dtype != np.float32:
            refused.append((node.name, f"{node.op_type}: weight is not a constant float32 initializer"))
            continue
        if x is None or (x.dtype is not None and x.dtype != ir.DataType.FLOAT):
            refused.append((node.name, f"{node.op_type}: input is not float32"))
            continue
        if kind == "conv" and warr.ndim < 3:
            refused.append((node.name, "Conv: weight rank < 3"))
            continue
        if kind == "matmul":
            if warr.ndim != 2:
                refused.append((node.name, f"{node.op_type}: weight is not a 2-D matrix"))
                continue
            if key in qir.GEMM_OPS:
                if irh.attr(node, "transA", 0):
                    refused.append((node.name, "Gemm with transA=1"))
                    continue
                c = node.inputs[2] if len(node.inputs) > 2 else None
                if c is not None and float(irh.attr(node, "beta", 1.0)) != 1.0 and qir.const(c, graph) is None:
                    refused.append((node.name, "Gemm with beta != 1 and a non-constant C"))
                    continue
        group = int(irh.attr(node, "group", 1))
        depthwise = kind == "conv" and warr.shape[1] == 1 and group == warr.shape[0] and group > 1
        if kind == "conv":
            reduction = int(np.prod(warr.shape[1:]))
        else:
            reduction = int(warr.shape[1] if key in qir.GEMM_OPS and irh.attr(node, "transB", 0) else warr.shape[0])
        found.append(Candidate(node.name, node.op_type, kind, x.name, w.name, weight_elements=int(warr.size),
                               depthwise=depthwise, reduction=reduction,
                               window=int(np.prod(warr.shape[2:])) if kind == "conv" else 1,
                               plane=_plane(x) if kind == "conv" else 0,
                               group_outputs=warr.shape[0] // group if kind == "conv" and group > 1 and not depthwise
                               else 0))
        ids[id(node)] = None
    final = _final_nodes(graph, set(ids))
    for c in found:
        c.final = c.name in final
    return found, refused
