"""Fold BatchNormalization and per-channel affine ops into Conv/ConvTranspose/Gemm weights.

Rules (P is Conv, ConvTranspose or Gemm with constant weights; P's output has
exactly one reader; everything on the right is precomputed at build time):

    BatchNormalization(P(x, W, b), s, t, m, v)  -> P(x, W*k, (b - m)*k + t)     k = s / sqrt(v + eps)
    Mul(P(x, W, b), c)   (c per channel)        -> P(x, W*c, b*c)
    Div(P(x, W, b), c)   (c per channel)        -> P(x, W/c, b/c)
    Add(P(x, W, b), c)   (c per channel)        -> P(x, W, b + c)
    Sub(P(x, W, b), c)   (c per channel)        -> P(x, W, b - c)

"Per channel" means ``c`` broadcasts along P's output-channel axis only
(axis 1 of a Conv output, the last axis of a Gemm output), or is a scalar.
For Gemm, ``alpha`` and ``beta`` are folded in too (the result has alpha
unchanged, beta = 1).  The scaled weights are new initializers (the old ones
may be shared); the math runs in float64 and is rounded once to the weight
dtype.  Refused (and reported): training-mode BatchNormalization, non-
constant weights or statistics (e.g. a weight produced by a ConstantOfShape
above the fold cap), non-float weights, and producers whose output has other
readers.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.passes.manager import Pass

_PRODUCERS = ("Conv", "ConvTranspose", "Gemm")


def _channels(node: ir.Node, w: np.ndarray) -> int | None:
    if node.op_type == "Conv":
        return w.shape[0]
    if node.op_type == "ConvTranspose":
        return w.shape[1] * int(irh.attr(node, "group", 1))
    if node.op_type == "Gemm":
        return w.shape[0] if irh.attr(node, "transB", 0) else w.shape[1]
    return None


def _per_channel(node: ir.Node, c: np.ndarray, m: int, out_rank: int | None) -> np.ndarray | None:
    """``c`` as a length-``m`` vector when it only varies along the output-channel axis."""
    if c.size == 1:
        if out_rank is not None and c.ndim > out_rank:
            return None
        return np.full(m, c.reshape(-1)[0], dtype=np.float64)
    axis_from_end = 1 if node.op_type == "Gemm" else None
    if node.op_type == "Gemm":
        if c.ndim > 2 or c.shape[-1] != m or (c.ndim == 2 and c.shape[0] != 1):
            return None
        return c.reshape(-1).astype(np.float64)
    if out_rank is None:
        return None
    # Conv output (N, M, D1..Dn): c right-aligned must be (.., M, 1, .., 1)
    spatial = out_rank - 2
    if c.ndim < spatial + 1 or c.ndim > out_rank:
        return None
    shape = c.shape
    if shape[-(spatial + 1)] != m or any(d != 1 for d in shape[len(shape) - spatial:]) or any(
        d != 1 for d in shape[: len(shape) - spatial - 1]
    ):
        return None
    del axis_from_end
    return c.reshape(-1).astype(np.float64)


def _out_rank(node: ir.Node, w: np.ndarray) -> int | None:
    if node.op_type == "Gemm":
        return 2
    return w.ndim  # Conv/ConvTranspose output rank equals the weight rank


def _scaled(node: ir.Node, w: np.ndarray, k: np.ndarray) -> np.ndarray:
    w64 = w.astype(np.float64)
    if node.op_type == "Conv":
        return w64 * k.reshape((-1,) + (1,) * (w.ndim - 1))
    if node.op_type == "ConvTranspose":
        g = int(irh.attr(node, "group", 1))
        cin, mg = w.shape[0], w.shape[1]
        w5 = w64.reshape((g, cin // g, mg) + w.shape[2:])
        k5 = k.reshape((g, 1, mg) + (1,) * (w.ndim - 2))
        return (w5 * k5).reshape(w.shape)
    # Gemm
    if irh.attr(node, "transB", 0):
        return w64 * k[:, None]
    return w64 * k[None, :]


class FuseBatchNorm(Pass):
    """Fold BatchNormalization and per-channel Mul/Div/Add/Sub into the producing Conv/ConvTranspose/Gemm."""

    name = "fuse_batchnorm"

    def run(self, model: ir.Model) -> bool:
        changed = False
        graph = model.graph
        for node in irh.live_nodes(graph):
            if not irh.is_onnx(node, "BatchNormalization", "Mul", "Div", "Add", "Sub"):
                continue
            changed |= self._try(model, graph, node)
        return changed

    def _try(self, model: ir.Model, graph: ir.Graph, node: ir.Node) -> bool:
        op = node.op_type
        # Which input comes from the producer?
        if op == "BatchNormalization":
            candidates = [0]
        elif op in ("Mul", "Add"):
            candidates = [0, 1]
        else:
            candidates = [0]
        for side in candidates:
            y = node.inputs[side]
            if y is None or len(node.inputs) < 2:
                continue
            producer = y.producer()
            if producer is None or not irh.is_onnx(producer, *_PRODUCERS) or producer.graph is not graph:
                continue
            if op != "BatchNormalization" and not irh.is_const(node.inputs[1 - side]):
                continue
            pattern = f"{producer.op_type}+{op}"
            if irh.single_use(y) is not node:
                if op == "BatchNormalization":
                    self.refuse(pattern, node, f"{producer.op_type} output is also read elsewhere")
                continue
            w = irh.const_array(producer.inputs[1])
            if w is None:
                self.refuse(pattern, node, f"{producer.op_type} weight {producer.inputs[1].name!r} is not a constant")
                continue
            if w.dtype.kind != "f":
                self.refuse(pattern, node, f"weight dtype {w.dtype} is not floating point")
                continue
            b_val = producer.inputs[2] if len(producer.inputs) > 2 else None
            b = None
            if b_val is not None:
                b = irh.const_array(b_val)
                if b is None:
                    self.refuse(pattern, node, f"{producer.op_type} bias is not a constant")
                    continue
            if producer.op_type == "Gemm" and irh.attr(producer, "transA", 0) not in (0, 1):
                continue
            m = _channels(producer, w)
            if op == "BatchNormalization":
                k, shift, why = self._bn(node, m)
            else:
                c = irh.const_array(node.inputs[1 - side])
                vec = None if c is None or c.dtype.kind != "f" else _per_channel(producer, c, m, _out_rank(producer, w))
                if vec is None:
                    continue  # a broadcasting operand, not a per-channel affine: not this pattern
                if op == "Mul":
                    k, shift, why = vec, np.zeros(m), None
                elif op == "Div":
                    k, shift, why = 1.0 / vec, np.zeros(m), None
                elif op == "Add":
                    k, shift, why = np.ones(m), vec, None
                else:
                    k, shift, why = np.ones(m), -vec, None
            if why:
                self.refuse(pattern, node, why)
                continue
            self._rewrite(model, graph, producer, node, w, b, k, shift)
            return True
        return False

    def _bn(self, node: ir.Node, m: int):
        if irh.attr(node, "training_mode", 0):
            return None, None, "BatchNormalization is in training mode"
        if irh.attr(node, "spatial", 1) != 1:
            return None, None, "BatchNormalization with spatial=0"
        if any(v.uses() or v.is_graph_output() for v in node.outputs[1:]):
            return None, None, "BatchNormalization's running statistics outputs are read"
        params = [irh.const_array(v) for v in node.inputs[1:5]]
        if any(p is None for p in params):
            return None, None, "BatchNormalization scale/bias/mean/var are not all constants"
        s, t, mean, var = (p.astype(np.float64).reshape(-1) for p in params)
        if not all(p.size in (1, m) for p in (s, t, mean, var)):
            return None, None, f"BatchNormalization parameters do not have {m} channels"
        eps = float(irh.attr(node, "epsilon", 1e-5))
        k = s / np.sqrt(var + eps)
        return np.broadcast_to(k, (m,)), np.broadcast_to(t - mean * k, (m,)), None

    def _rewrite(self, model, graph, producer, node, w, b, k, shift) -> None:
        m = k.shape[0]
        new_w = _scaled(producer, w, k).astype(w.dtype)
        if producer.op_type == "Gemm":
            beta = float(irh.attr(producer, "beta", 1.0))
            if b is None:
                base = np.zeros(m)
            else:
                base = b.astype(np.float64) * beta
                if base.ndim == 2 and base.shape[0] != 1:
                    # a full (M, N) C: keep its shape
                    new_b = (base * k[None, :] + shift[None, :]).astype(w.dtype)
                    return self._emit(graph, producer, node, new_w, new_b, {"beta": 1.0})
                base = np.broadcast_to(base.reshape(-1), (m,)) if base.size in (1, m) else base
            new_b = (base * k + shift).astype(w.dtype)
            return self._emit(graph, producer, node, new_w, new_b, {"beta": 1.0})
        base = np.zeros(m) if b is None else b.astype(np.float64)
        new_b = (base * k + shift).astype(w.dtype)
        return self._emit(graph, producer, node, new_w, new_b, {})

    def _emit(self, graph, producer, node, new_w, new_b, attr_updates) -> None:
        wv = irh.new_initializer(graph, new_w, (producer.inputs[1].name or "w") + "_fused")
        bv = irh.new_initializer(graph, new_b, (producer.inputs[1].name or "w") + "_fused_bias")
        fused = ir.Node(
            producer.domain,
            producer.op_type,
            [producer.inputs[0], wv, bv],
            attributes=irh.copy_attrs(producer, drop=attr_updates) + [ir.AttrFloat32(k, v) for k, v in attr_updates.items()],
            version=producer.version,
            name=producer.name,
        )
        fused.outputs[0].type = node.outputs[0].type
        fused.outputs[0].shape = node.outputs[0].shape
        graph.insert_before(node, fused)
        irh.replace_value(node.outputs[0], fused.outputs[0])
        graph.remove([node, producer], safe=True)
