"""Chain int8 layers in uint8 (pass ``quant_chain_int8``).

Rule: a QConv (or QConvTranspose) without ``output_scale`` or pool attributes
(the native pooled path writes float only), whose output is no graph output
and is read only as the input X of QConvs (or QConvTransposes) without X_up /
X_mul that all quantize it with the same static ``X_scale`` and uint8
``X_zero_point``, gets ``output_scale`` / ``output_zero_point`` = those (lists
of one per channel for a depthwise consumer's per-channel quantization), and
its output becomes uint8 (quantized in the conv's epilogue): the consumers skip
their quantize pass and no float tensor sits between the layers.  Identical
results.

``context.chain == "depthwise"``: only where the producer or a consumer is a
depthwise QConv, or the producer a QConvTranspose: the native int8 depthwise
kernel is fast on uint8 in and out, while between two GEMM convs the uint8
output stage cost about what the consumer's quantize pass saves (digits batch
1: 10 % slower chained, docs/decisions.md D20, D46, D55).  ``True``:
everywhere: where the uint8 store is the cheaper one (AVX-512 VNNI, whose
tile store requantizes by one multiply-add, D181; the quantizer's default there
through the target profile's ``int8_chain_everywhere``).  Static int8 only.

Refused (reported): a producer whose consumers quantize its output with
different scales (nothing to write uint8 in).
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from minirt.builder.quantize import qir
from minirt.builder.quantize.passes.base import QuantPass


def _uint8_friendly(node: ir.Node, graph: ir.Graph) -> bool:
    """A producer that gains from writing uint8: a depthwise QConv (its int8 kernel is fast on uint8
    in and out) or a QConvTranspose (its output has kH*kW times its input's pixels: uint8 writes a
    quarter of the bytes).  Into a QConvTranspose from a GEMM QConv the uint8 stage costs what it saves
    (PP-OCR det, docs/decisions.md D55), so as a consumer only a depthwise QConv counts."""
    return qir.is_depthwise_qconv(node, graph) or qir.is_minirt(node, "QConvTranspose")


def _consumer_quantization(uses, graph: ir.Graph) -> set | None:
    """The set of (scales, zero points) with which the readers quantize the value, or None when a reader
    is not a chained-form op reading it as a plain quantized X."""
    params = set()
    for user, idx in uses:
        if user.domain != qir.DOMAIN or user.op_type not in qir.CHAINED_OPS or idx != 0 or len(user.inputs) < 3:
            return None
        if any(v is not None for v in user.inputs[7:]):  # X_up / X_mul: X is not the quantized input
            return None
        xs, xz = qir.const(user.inputs[1], graph), qir.const(user.inputs[2], graph)
        if xs is None or xz is None or xs.size != xz.size or xz.dtype != np.uint8:
            return None
        params.add((tuple(float(v) for v in xs.reshape(-1)), tuple(int(v) for v in xz.reshape(-1))))
    return params


class ChainInt8(QuantPass):
    """QConv -> QConv(X_scale s, X_zp z)  =>  QConv(output_scale s, output_zero_point z, uint8 out) -> QConv."""

    name = "quant_chain_int8"

    def run(self, model: ir.Model) -> bool:
        graph = model.graph
        outputs = qir.output_ids(graph)
        depthwise_only = self.context.chain == "depthwise"
        if not self.context.chain:
            return False
        chained = 0
        for node in list(graph):
            if node.domain != qir.DOMAIN or node.op_type not in qir.CHAINED_OPS or "output_scale" in node.attributes:
                continue
            if "pool_kernel_shape" in node.attributes:  # the native pooled path writes float only
                continue
            y = node.outputs[0]
            uses = list(y.uses())
            if id(y) in outputs or not uses:
                continue
            params = _consumer_quantization(uses, graph)
            if not params:
                continue
            if len(params) != 1:
                self.refuse("QConv->QConv", node, f"its {len(uses)} readers quantize it with different scales")
                continue
            if depthwise_only and not (_uint8_friendly(node, graph)
                                       or any(qir.is_depthwise_qconv(user, graph) for user, _ in uses)):
                continue
            sc, zp = params.pop()
            if len(sc) == 1:
                node.attributes["output_scale"] = ir.AttrFloat32("output_scale", sc[0])
                node.attributes["output_zero_point"] = ir.AttrInt64("output_zero_point", zp[0])
            else:  # a depthwise consumer with per-channel input quantization
                node.attributes["output_scale"] = ir.AttrFloat32s("output_scale", list(sc))
                node.attributes["output_zero_point"] = ir.AttrInt64s("output_zero_point", list(zp))
            y.dtype = ir.DataType.UINT8
            chained += 1
        return chained > 0
