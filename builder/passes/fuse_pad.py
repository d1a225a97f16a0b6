"""Fold an explicit zero Pad into the following Conv or AveragePool.

Rules (the Pad output has exactly one reader; mode ``constant`` with value
0 (or absent); pads are build-time constants, non-negative, and zero on the
batch and channel axes; the reader has ``auto_pad`` NOTSET):

    Conv(Pad(x, p), w, b)             -> Conv(x, w, b, pads = pads + p)
    FusedConv(Pad(x, p), ...)         -> FusedConv(x, ..., pads = pads + p)
    AveragePool(Pad(x, p))            -> AveragePool(x, pads = pads + p, count_include_pad=1)
                                         (only if it already counts padding or has no pads of its own)

Refused (and reported): MaxPool (it pads with -inf, not 0), reflect/edge
modes, non-zero pad values, negative pads, Pad with an ``axes`` input.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.passes.manager import Pass


def _pad_amounts(model: ir.Model, pad: ir.Node):
    """(pads as a list, or None; refusal reason or None)."""
    mode = irh.attr(pad, "mode", "constant")
    if isinstance(mode, bytes):
        mode = mode.decode()
    if mode != "constant":
        return None, f"Pad mode {mode!r} is not zero padding"
    if irh.opset_of(model, pad) < 11:
        pads = irh.attr(pad, "pads")
        value = float(irh.attr(pad, "value", 0.0))
    else:
        pads = irh.const_array(pad.inputs[1]) if len(pad.inputs) > 1 and pad.inputs[1] is not None else None
        if pads is None:
            return None, "Pad amounts are not build-time constants"
        v = pad.inputs[2] if len(pad.inputs) > 2 else None
        value = 0.0 if v is None else irh.scalar(v)
        if len(pad.inputs) > 3 and pad.inputs[3] is not None:
            return None, "Pad with an axes input"
    if value is None or value != 0.0:
        return None, f"Pad value {value} is not 0"
    pads = [int(p) for p in np.asarray(pads).reshape(-1)]
    if any(p < 0 for p in pads):
        return None, "negative pads (cropping)"
    r = len(pads) // 2
    if pads[0] or pads[1] or pads[r] or pads[r + 1]:
        return None, "Pad pads the batch or channel axis"
    return pads, None


class FusePad(Pass):
    """Fold zero Pad nodes into the padding of the Conv/AveragePool that reads them."""

    name = "fuse_pad"

    def run(self, model: ir.Model) -> bool:
        changed = False
        graph = model.graph
        for pad in list(graph):
            if pad.graph is not graph or not irh.is_onnx(pad, "Pad"):
                continue
            reader = irh.single_use(pad.outputs[0])
            if reader is None or reader.inputs[0] is not pad.outputs[0]:
                continue
            is_conv = irh.is_onnx(reader, "Conv") or (reader.domain == irh.MINIRT_DOMAIN and reader.op_type == "FusedConv")
            is_avg = irh.is_onnx(reader, "AveragePool")
            if irh.is_onnx(reader, "MaxPool"):
                self.refuse("Pad+MaxPool", reader, "MaxPool pads with -inf, the Pad with 0")
                continue
            if not (is_conv or is_avg):
                continue
            pattern = f"Pad+{reader.op_type}"
            amounts, why = _pad_amounts(model, pad)
            if why:
                self.refuse(pattern, pad, why)
                continue
            auto_pad = irh.attr(reader, "auto_pad", "NOTSET")
            if (auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad) != "NOTSET":
                self.refuse(pattern, reader, f"{reader.op_type} uses auto_pad={auto_pad}")
                continue
            r = len(amounts) // 2
            nd = r - 2
            own = list(irh.attr(reader, "pads", None) or [0] * (2 * nd))
            if len(own) != 2 * nd:
                continue
            if is_avg and any(own) and not irh.attr(reader, "count_include_pad", 0):
                self.refuse(pattern, reader, "AveragePool excludes its own padding from the count")
                continue
            new_pads = [own[i] + amounts[2 + i] for i in range(nd)] + [own[nd + i] + amounts[r + 2 + i] for i in range(nd)]
            reader.attributes["pads"] = ir.AttrInt64s("pads", new_pads)
            if is_avg:
                reader.attributes["count_include_pad"] = ir.AttrInt64("count_include_pad", 1)
            reader.replace_input_with(0, pad.inputs[0])
            graph.remove(pad, safe=True)
            changed = True
        return changed
