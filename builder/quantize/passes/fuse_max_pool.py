"""Fold ``QConv -> MaxPool`` into the QConv's pool attributes (pass ``quant_fuse_max_pool``).

Rule: a QConv without ``pool_kernel_shape`` / ``output_scale`` / ``post_scale``
whose output is no graph output and is read only by a plain 2-D MaxPool (one
output, no padding, dilation 1, floor rounding, auto_pad NOTSET or VALID)
gets ``pool_kernel_shape`` / ``pool_strides`` and takes over the MaxPool's
output.  Exact (the runtime max-pools the QConv's float result); it saves the
pooling node and its dispatch, which on small models (digits: one 32x8x8
MaxPool, ~10 us at batch 1) cost as much as a conv (docs/decisions.md D25).

Refused (reported): a MaxPool after such a QConv with padding, dilation,
ceil_mode, auto_pad SAME_*, a second output (indices) or not 2-D.
"""
from __future__ import annotations

import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.quantize import qir
from minirt.builder.quantize.passes.base import QuantPass


def _plain_max_pool_2d(node: ir.Node) -> tuple[tuple[list[int], list[int]] | None, str]:
    """((kernel_shape, strides), "") of a MaxPool in the form QConv's pool attributes express,
    else (None, the reason)."""
    if len(node.outputs) != 1 or len(node.inputs) != 1:
        return None, "MaxPool with an indices output"
    k = [int(v) for v in irh.attr(node, "kernel_shape", ()) or ()]
    s = [int(v) for v in irh.attr(node, "strides", ()) or ()] or [1] * len(k)
    pads = [int(v) for v in irh.attr(node, "pads", ()) or ()]
    dil = [int(v) for v in irh.attr(node, "dilations", ()) or ()]
    if len(k) != 2 or len(s) != 2 or min(k + s) < 1:
        return None, f"not a 2-D pool (kernel_shape {k}, strides {s})"
    if any(pads) or any(v != 1 for v in dil) or int(irh.attr(node, "ceil_mode", 0)):
        return None, f"pads {pads}, dilations {dil} or ceil_mode: the fused pool has none"
    auto_pad = irh.attr(node, "auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "VALID"):
        return None, f"auto_pad {auto_pad}"
    return (k, s), ""


class FuseMaxPool(QuantPass):
    """QConv -> MaxPool  =>  QConv(pool_kernel_shape, pool_strides)."""

    name = "quant_fuse_max_pool"

    def run(self, model: ir.Model) -> bool:
        graph = model.graph
        outputs = qir.output_ids(graph)
        fused = 0
        for node in qir.qconvs_without(graph, "pool_kernel_shape", "output_scale", "post_scale"):
            y = node.outputs[0]
            uses = list(y.uses())
            if id(y) in outputs or len(uses) != 1:
                continue
            pool = uses[0][0]
            if qir.key(pool) != ("", "MaxPool"):
                continue
            geometry, why = _plain_max_pool_2d(pool)
            if geometry is None:
                self.refuse("QConv+MaxPool", pool, why)
                continue
            node.attributes["pool_kernel_shape"] = ir.AttrInt64s("pool_kernel_shape", geometry[0])
            node.attributes["pool_strides"] = ir.AttrInt64s("pool_strides", geometry[1])
            qir.absorb(graph, y, pool)
            fused += 1
        return fused > 0
