"""4-bit block-wise weights: float MatMul layers become ``com.microsoft::MatMulNBits`` (pass ``int4_weights``).

Rule (int4 mode, the decoder case: a user's float export made int4, as onnxruntime-genai's model
builder does): a layer whose right operand is a constant float32 2-D weight W [K, N] of at least
``context.int4_min_elements`` values,

* ``MatMul(a, W)``,
* ``com.minirt::FusedMatMul(a, W[, bias[, z]])`` (the optimizer's MatMul + Add (+ activation)),
* ``Gemm(a, W, [c])`` with alpha = beta = 1, transA = 0 (W^T when transB = 1), c 1-D of N,

becomes ``MatMulNBits(a, B, scales[, zero_points], bias)`` (bits 4, ``context.int4_block_size``,
accuracy_level ``context.int4_accuracy_level``: 4 is int8 products over the blocks, minirt's native
kernel and onnxruntime's CPU default), followed by ``Add(z)`` and the ``com.minirt::Activation`` a
FusedMatMul had.  Per output column n and block of block_size values along K:

* symmetric (default): scale = max|w| / 7, q = clip(round(w / scale), -8, 7) + 8 (no zero points:
  MatMulNBits' default 8);
* asymmetric: lo = min(w, 0), hi = max(w, 0), scale = (hi - lo) / 15, zp = clip(round(-lo / scale), 0, 15),
  q = clip(round(w / scale) + zp, 0, 15), zero points stored packed (two per byte, low nibble first).

A block of zeros gets scale 1 (q = zp: exact).  B is [N, k_blocks, block_size / 2], two values per
byte with the first in the low nibble; K not a multiple of the block pads the last block with zeros.

Refused (reported): a weight below the size threshold or not 2-D float32 (stays float).
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.quantize import qir
from minirt.builder.quantize.passes.base import QuantPass

MS_DOMAIN = "com.microsoft"


def quantize_blocks(w: np.ndarray, block_size: int, symmetric: bool) -> tuple:
    """(B uint8 [N, k_blocks, block_size / 2], scales float32 [N, k_blocks], zero points uint8
    [N, ceil(k_blocks / 2)] or None) of the float weight ``w`` [K, N]."""
    K, N = w.shape
    kb = -(-K // block_size)
    blocks = np.zeros((N, kb * block_size), np.float32)
    blocks[:, :K] = w.T
    blocks = blocks.reshape(N, kb, block_size)
    if symmetric:
        amax = np.abs(blocks).max(axis=-1)
        scales = np.where(amax > 0, amax / 7.0, 1.0).astype(np.float32)
        q = np.clip(np.rint(blocks / scales[..., None]), -8, 7).astype(np.int16) + 8
        zp = None
    else:
        lo = np.minimum(blocks.min(axis=-1), 0.0)
        hi = np.maximum(blocks.max(axis=-1), 0.0)
        scales = np.where(hi > lo, (hi - lo) / 15.0, 1.0).astype(np.float32)
        z = np.clip(np.rint(-lo / scales), 0, 15).astype(np.int16)
        q = np.clip(np.rint(blocks / scales[..., None]) + z[..., None], 0, 15).astype(np.int16)
        zp = _pack_nibbles(np.pad(z, ((0, 0), (0, kb % 2))).astype(np.uint8))
    packed = _pack_nibbles(q.astype(np.uint8).reshape(N, kb, block_size))
    return packed, scales, zp


def _pack_nibbles(values: np.ndarray) -> np.ndarray:
    """Pairs of 4-bit values along the last axis into bytes, the first of each pair in the low nibble."""
    return (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)


class Int4Weights(QuantPass):
    """MatMul / FusedMatMul / Gemm with a constant float weight  =>  MatMulNBits (+ Add z, + Activation)."""

    name = "int4_weights"
    converted: int = 0  # layers rewritten (the report's count)
    weight_bytes: tuple = (0, 0)  # (float32 bytes replaced, 4-bit bytes written)

    def run(self, model: ir.Model) -> bool:
        changed = False
        for graph in irh.graphs(model):
            for node in list(graph):
                if self._rewrite(model, graph, node):
                    changed = True
        return changed

    def _weight(self, node: ir.Node, graph: ir.Graph) -> tuple | None:
        """(W [K, N] float32, bias value or None, z value or None, activation attrs) of a candidate."""
        k = qir.key(node)
        if k == ("", "MatMul") and len(node.inputs) == 2:
            w = qir.const(node.inputs[1], graph)
            return (w, None, None, None) if w is not None else None
        if k == (qir.DOMAIN, "FusedMatMul"):
            w = qir.const(node.inputs[1], graph)
            ins = list(node.inputs) + [None] * (4 - len(node.inputs))
            act = (irh.attr(node, "activation", ""), list(irh.attr(node, "activation_params", []) or []))
            return (w, ins[2], ins[3], act) if w is not None else None
        if k == ("", "Gemm") and len(node.inputs) >= 2:
            if irh.attr(node, "transA", 0) or irh.attr(node, "alpha", 1.0) != 1.0 or irh.attr(node, "beta", 1.0) != 1.0:
                return None
            w = qir.const(node.inputs[1], graph)
            if w is None or w.ndim != 2:
                return None
            if irh.attr(node, "transB", 0):
                w = w.T
            c = node.inputs[2] if len(node.inputs) > 2 else None
            if c is not None and irh.rank(c) != 1:
                return None
            return w, c, None, None
        return None

    def _rewrite(self, model: ir.Model, graph: ir.Graph, node: ir.Node) -> bool:
        found = self._weight(node, graph)
        if found is None:
            return False
        w, bias, z, act = found
        if w.dtype != np.float32 or w.ndim != 2:
            return False
        if bias is None and z is not None and irh.static_shape(z) == (w.shape[1],) and \
                irh.numpy_dtype(z) == np.float32:
            bias, z = z, None  # (a 1-D addend the optimizer kept as the residual: MatMulNBits' bias)
        if w.size < self.context.int4_min_elements:
            self.refuse("int4 weight", node.name or node.op_type,
                        f"{w.size} values, below the int4 threshold of {self.context.int4_min_elements}: kept float")
            return False
        if bias is not None and (irh.numpy_dtype(bias) not in (None, np.float32) or
                                 (irh.static_shape(bias) not in (None, (w.shape[1],)))):
            return False  # (a bias MatMulNBits cannot take: [N] float32 only)
        K, N = w.shape
        bs = self.context.int4_block_size
        packed, scales, zp = quantize_blocks(w, bs, self.context.int4_symmetric)
        hint = node.name or "matmul"
        b_v = irh.new_initializer(graph, packed, f"{hint}.weight_Q4")
        s_v = irh.new_initializer(graph, scales, f"{hint}.weight_scales")
        inputs = [node.inputs[0], b_v, s_v]
        if zp is not None or bias is not None:
            inputs.append(irh.new_initializer(graph, zp, f"{hint}.weight_zp") if zp is not None else None)
        if bias is not None:
            inputs += [None, bias]  # (g_idx absent, then bias)
        attrs = [ir.AttrInt64("K", K), ir.AttrInt64("N", N), ir.AttrInt64("bits", 4),
                 ir.AttrInt64("block_size", bs), ir.AttrInt64("accuracy_level", self.context.int4_accuracy_level)]
        new = ir.Node(MS_DOMAIN, "MatMulNBits", inputs, attributes=attrs, name=node.name, num_outputs=1)
        tail = []
        if z is not None:
            tail.append(ir.Node("", "Add", [new.outputs[0], z], num_outputs=1))
        if act is not None and act[0]:
            src = (tail[-1] if tail else new).outputs[0]
            keep = [n for n in node.attributes if n not in ("activation", "activation_params")]
            tail.append(ir.Node(qir.DOMAIN, "Activation", [src], attributes=irh.copy_attrs(node, drop=keep),
                                num_outputs=1))
        if tail:
            graph.insert_before(node, new)
            for t in tail[:-1]:
                graph.insert_before(node, t)
            last = tail[-1]
            qir.replace_node(graph, node, last)
        else:
            qir.replace_node(graph, node, new)
        model.opset_imports.setdefault(MS_DOMAIN, 1)
        if tail:
            irh.ensure_minirt_opset(model)
        self.converted += 1
        self.weight_bytes = (self.weight_bytes[0] + w.nbytes,
                             self.weight_bytes[1] + packed.nbytes + scales.nbytes + (zp.nbytes if zp is not None else 0))
        return True
