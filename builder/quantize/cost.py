"""The int8 cost model: is a quantization worth it on the target device (issue 20, D87).

The builder rarely runs on the device, so "is int8 faster than float there" cannot come from timing
on the build machine (which also flips under load).  It comes from the target profile instead
(``targets/profiles.py``, the ``int8_*`` cost fields), applied to the layers the quantizer chose:

* a layer computed in int8 costs ``macs / int8_macs_per_float_mac`` (its multiply-adds at the int8
  rate, in float multiply-add time; divided again by ``int8_winograd_speedup`` for a 3x3 conv the device's
  int8 kernels run as Winograd F(2x2, 3x3), ``packed_weights.qconv_uses_winograd``: AVX2 without VNNI,
  D180) plus ``int8_convert_cost`` per activation element it quantizes
  (its input; twice that in int8-dynamic, which first scans the input for its range) and, as in
  float, ``element_cost`` per output element (the bias / activation epilogue);
* a layer left float (or weight-only int8: float compute) costs ``macs + element_cost * outputs``, its
  multiply-adds divided by ``float_winograd_speedup`` when it is a 3x3 conv the device runs as Winograd
  F(2x2, 3x3) (``packed_weights.conv_uses_winograd``; AVX2, D178);
* every other node costs ``element_cost`` per FLOP it does (``targets/flops.py``; data movement 0),
  the same in both models, except other products (attention's MatMul of two activations), which cost
  their multiply-adds.

The unit is the time of one float32 multiply-add in a GEMM; only the ratio of the two totals is
reported.  A symbolic batch (the first dimension of the model's inputs, named alike downstream)
counts as 1: every layer scales with it, so the ratio does not depend on it.  Layers whose shapes
are otherwise unknown (other dynamic dimensions) cost 0 in both models: when no layer has a known
size, there is no estimate (None), never an invented one.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import onnx_ir as ir

from minirt.builder.quantize.qir import Candidate

_PRODUCTS = frozenset({"MatMul", "FusedMatMul", "Gemm", "FusedGemm", "Conv", "FusedConv", "ConvTranspose",
                       "FusedConvTranspose"})


@dataclasses.dataclass
class Estimate:
    """The two models' estimated costs on one target (units: float32 GEMM multiply-adds)."""

    target: str
    mode: str
    float_cost: float
    quant_cost: float
    int8_layers: int  # layers computed in int8 that the estimate could size

    @property
    def ratio(self) -> float:
        return self.quant_cost / self.float_cost

    def as_dict(self) -> dict:
        return {"target": self.target, "mode": self.mode, "ratio": round(self.ratio, 4),
                "float_cost": self.float_cost, "quant_cost": self.quant_cost, "int8_layers": self.int8_layers,
                "basis": f"cost model of the {self.target} profile (int8_macs_per_float_mac, int8_convert_cost, "
                         "element_cost, float_winograd_speedup, int8_winograd_speedup), not a timing"}


def _with_unit_batch(model: ir.Model) -> ir.Model:
    """``model``, or a copy whose symbolic batch dimensions (the symbols the graph inputs' first
    dimensions carry, wherever they appear) are 1, so that the shapes that depend on nothing else
    become known."""
    symbols = {str(v.shape[0]) for v in model.graph.inputs
               if v.shape is not None and len(v.shape) and isinstance(v.shape[0], ir.SymbolicDim)
               and v.shape[0].value is not None}
    if not symbols:
        return model
    copy = model.clone()

    def unit(value: ir.Value) -> None:
        dims = list(value.shape) if value.shape is not None else []
        if any(isinstance(d, ir.SymbolicDim) and str(d) in symbols for d in dims):
            value.shape = ir.Shape([1 if isinstance(d, ir.SymbolicDim) and str(d) in symbols else d for d in dims])

    for v in copy.graph.inputs:
        unit(v)
    for node in copy.graph:
        for v in node.outputs:
            unit(v)
    return copy


def _conv_geometry(node: ir.Node) -> tuple | None:
    """(c, m, group, kh, kw, sh, sw, dh, dw, pt, pl, output plane) of a conv node from its weight's static
    shape, its attributes and its (unit-batch) output size; None for another node or unknown shapes."""
    from minirt.targets.flops import numel

    if node.op_type not in ("Conv", "FusedConv") or len(node.inputs) < 2 or node.inputs[1] is None:
        return None
    shape = node.inputs[1].shape
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) for d in shape):
        return None
    m, cg, kh, kw = (int(d) for d in shape)

    def ints(name: str, default: tuple) -> tuple:
        a = node.attributes.get(name)
        return tuple(a.value) if a is not None else default

    group = node.attributes.get("group")
    group = int(group.value) if group is not None else 1
    (sh, sw), (dh, dw) = ints("strides", (1, 1))[:2], ints("dilations", (1, 1))[:2]
    pt, pl = ints("pads", (0, 0, 0, 0))[:2]  # (an auto_pad SAME gives 3x3 convs 1: inside the rules either way)
    plane = numel(node.outputs[0]) // m if m else 0
    return cg * group, m, group, kh, kw, sh, sw, dh, dw, pt, pl, plane


def _runs_winograd(node: ir.Node) -> bool:
    """Whether a float conv node is one the native kernels run as Winograd F(2x2, 3x3) on a device that has
    that path (the geometry rule ``packed_weights.conv_uses_winograd``, at AVX2's panel width)."""
    from minirt.format.packed_weights import conv_uses_winograd

    g = _conv_geometry(node)
    return g is not None and conv_uses_winograd(*g[:9], g[11], 1, 16)


def _runs_int8_winograd(node: ir.Node) -> bool:
    """Whether a conv node computed in int8 is one the int8 kernels run as Winograd F(2x2, 3x3) on a device
    that has that route (``packed_weights.qconv_uses_winograd``)."""
    from minirt.format.packed_weights import qconv_uses_winograd

    g = _conv_geometry(node)
    return g is not None and qconv_uses_winograd(*g[:11])


def estimate(model: ir.Model, mode: str, chosen: Sequence[Candidate], profile) -> Estimate | None:
    """The cost of ``model`` (float, before the rewrite) with the ``chosen`` candidates computed in
    int8 (``mode`` "int8" or "int8-dynamic"; weight-only ones compute float) against all float, on
    ``profile``; None when no int8 layer has a known size."""
    # (imported here: targets.flops imports the builder, which imports the quantizer and this module)
    from minirt.targets.flops import node_flops, numel

    speedup = float(profile.int8_macs_per_float_mac)
    winograd = float(getattr(profile, "float_winograd_speedup", 1.0))
    int8_winograd = float(getattr(profile, "int8_winograd_speedup", 1.0))
    convert = float(profile.int8_convert_cost) * (2.0 if mode == "int8-dynamic" else 1.0)
    element = float(profile.element_cost)
    int8 = {c.name: c for c in chosen if not c.computes_float and c.kind in ("conv", "matmul", "convt")}
    if not int8:
        return None
    model = _with_unit_batch(model)  # (the candidates are found by name in the copy)
    float_cost = quant_cost = 0.0
    sized = 0
    for node in model.graph:
        c = int8.get(node.name)
        if c is not None:
            outs = numel(node.outputs[0])
            # (multiply-adds: one reduction per output element; a tile ConvTranspose's from its FLOPs)
            macs = outs * c.reduction if c.kind != "convt" else node_flops(node) / 2
            if macs <= 0:
                continue
            sized += 1
            float_cost += macs / (winograd if winograd != 1.0 and _runs_winograd(node) else 1.0) + element * outs
            rate = speedup * (int8_winograd if int8_winograd != 1.0 and _runs_int8_winograd(node) else 1.0)
            quant_cost += macs / rate + convert * numel(node.inputs[0]) + element * outs
            continue
        flops = node_flops(node)
        cost = flops / 2 if node.op_type in _PRODUCTS else element * flops
        if winograd != 1.0 and _runs_winograd(node):
            cost /= winograd
        float_cost += cost
        quant_cost += cost
    if sized == 0 or float_cost <= 0:
        return None
    return Estimate(profile.name, mode, float_cost, quant_cost, sized)
