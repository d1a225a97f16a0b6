"""Build-time check that each layer's input agrees with its constant weights.

A model whose input shape is symbolic (``N x C x H x W``) takes whatever ``--input-shape`` says; a
wrong channel count or feature size used to build without a word and fail at the first run (the
kernel's error) or, with ``--quantize``, during calibration.  After the optimizer has inferred the
static shapes, every Conv / ConvTranspose / Gemm / MatMul (and their fused forms) whose input shape
and weight are both known is checked here, and a mismatch is a BuildError that names the node, the
input and its shape, the weight and its shape, and what the weight expects.

Only these weight-bearing layers are checked: they are where a wrong input size meets a fixed size,
and their rule is simple.  Other mismatches still surface at run time with the kernel's message.
"""
from __future__ import annotations

import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.vocabulary import FUSED_FORMS

_CONV = {"Conv", FUSED_FORMS["Conv"]}
_CONV_TRANSPOSE = {"ConvTranspose", FUSED_FORMS["ConvTranspose"]}
_GEMM = {"Gemm", FUSED_FORMS["Gemm"]}
_MATMUL = {"MatMul", FUSED_FORMS["MatMul"]}
_DOMAINS = ("", "ai.onnx", irh.MINIRT_DOMAIN)


def _dims(value: ir.Value | None) -> tuple | None:
    """The value's dimensions, None for each one not known as a number (symbolic); None without a shape."""
    if value is None or value.shape is None:
        return None
    return tuple(d if isinstance(d, int) and d >= 0 else None for d in value.shape)


def _shown(dims: tuple) -> list:
    return ["?" if d is None else d for d in dims]


def mismatch(node: ir.Node) -> str | None:
    """Why ``node``'s input does not fit its constant weight, or None (fits, or not known)."""
    if node.domain not in _DOMAINS or len(node.inputs) < 2:
        return None
    x, w = node.inputs[0], node.inputs[1]
    xs, ws = _dims(x), irh.static_shape(w) if irh.is_const(w) else None
    if xs is None or ws is None or not xs or not ws:
        return None
    op = node.op_type
    if op in _CONV and len(xs) >= 3 and len(ws) >= 3:
        group = int(irh.attr(node, "group", 1))
        if xs[1] is not None and xs[1] != ws[1] * group:
            return (f"input {x.name!r} has {xs[1]} channels (shape {_shown(xs)}), but the weight {w.name!r} "
                    f"{list(ws)} with group={group} takes {ws[1] * group}")
    elif op in _CONV_TRANSPOSE and len(xs) >= 3 and len(ws) >= 3:
        if xs[1] is not None and xs[1] != ws[0]:
            return (f"input {x.name!r} has {xs[1]} channels (shape {_shown(xs)}), but the weight {w.name!r} "
                    f"{list(ws)} takes {ws[0]}")
    elif op in _GEMM and len(xs) == 2 and len(ws) == 2:
        k = xs[0] if int(irh.attr(node, "transA", 0)) else xs[1]
        wk = ws[1] if int(irh.attr(node, "transB", 0)) else ws[0]
        if k is not None and k != wk:
            return (f"input {x.name!r} (shape {_shown(xs)}) has {k} features, but the weight {w.name!r} "
                    f"{list(ws)} takes {wk}")
    elif op in _MATMUL and len(ws) >= 2:
        if xs[-1] is not None and xs[-1] != ws[-2]:
            return (f"input {x.name!r} (shape {_shown(xs)}) has {xs[-1]} features in its last dimension, "
                    f"but the weight {w.name!r} {list(ws)} takes {ws[-2]}")
    return None


def check_weight_shapes(model: ir.Model, input_shapes: dict | None) -> None:
    """Raise ValueError at the first layer (graph order, bodies included) whose input contradicts its
    weight; the message says whether ``--input-shape`` was given (the usual cause)."""
    for graph in irh.graphs(model):
        for node in graph:
            why = mismatch(node)
            if why:
                hint = (f"; check --input-shape ({', '.join(f'{k}={list(v)}' for k, v in input_shapes.items())})"
                        if input_shapes else "; the model's declared shapes contradict its weights")
                raise ValueError(f"node {node.name!r} ({node.op_type}): {why}{hint}")
