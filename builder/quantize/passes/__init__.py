"""The quantizer's graph rewrites, as passes run by the builder's pass manager.

They live here, beside the quantizer, rather than in ``builder/passes/``: they
rewrite minirt's quantized ops (QConv, QMatMul, ...) that only the quantizer
creates, after the optimizer has finished, and they read what the quantizer
decided (:class:`builder.quantize.qir.QuantContext`: the candidates chosen, the
calibrated ranges).  ``builder.passes`` stays the optimizer's pipeline, and
neither package imports the other's passes: the shared pieces are the pass
infrastructure (``builder.passes.manager``) and the leaf modules
``builder.ir_helpers`` and ``builder.quantize.qir``.

Pipelines (each repeated by the manager until a sweep changes nothing;
``quant_layers`` rewrites on its first run only)::

    fp16          fp16_bias_correction, fp16_weights
    int4          int4_weights
    int8-dynamic  quant_layers, quant_fold_affine, quant_fuse_max_pool, quant_fuse_flatten
    int8          int8_bias_correction, then the same + quant_fold_upsample_add,
                  quant_fold_upsample_concat, quant_fold_channel_mul, quant_chain_int8
                  (they need static input scales, the correction the calibration data)

Every name is accepted by ``--disable-pass`` and shows in the build report.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import onnx_ir as ir

from minirt.builder.passes.manager import OptimizationReport, PassManager
from minirt.builder import ir_helpers as irh
from minirt.builder.quantize import qir
from minirt.builder.quantize.passes.chain_int8 import ChainInt8
from minirt.builder.quantize.passes.fold_channel_mul import FoldChannelMul
from minirt.builder.quantize.passes.fold_scalar_affine import FoldScalarAffine
from minirt.builder.quantize.passes.fold_upsample_add import FoldUpsampleAdd
from minirt.builder.quantize.passes.fold_upsample_concat import FoldUpsampleConcat
from minirt.builder.quantize.passes.fp16_bias_correction import FP16BiasCorrection
from minirt.builder.quantize.passes.fp16_weights import FP16Weights
from minirt.builder.quantize.passes.fuse_flatten import FuseFlatten
from minirt.builder.quantize.passes.fuse_max_pool import FuseMaxPool
from minirt.builder.quantize.passes.int4_weights import Int4Weights
from minirt.builder.quantize.passes.int8_bias_correction import Int8BiasCorrection
from minirt.builder.quantize.passes.quantize_layers import QuantizeLayers

# The order is the order the rewrites always ran in: the folds after a QConv first (affine, then
# pool: a pooled QConv takes no post_scale), the folds before a QConv next, chaining last (it
# reads the consumers' final quantization and skips pooled producers).  fp16 and int8: the bias correction
# reads the float32 weights, so it runs before they are converted.
_FP16 = [FP16BiasCorrection, FP16Weights]
_DYNAMIC = [QuantizeLayers, FoldScalarAffine, FuseMaxPool, FuseFlatten]
_STATIC = [Int8BiasCorrection] + _DYNAMIC + [FoldUpsampleAdd, FoldUpsampleConcat, FoldChannelMul, ChainInt8]
_INT4 = [Int4Weights]
_PIPELINES = {"fp16": _FP16, "int4": _INT4, "int8-dynamic": _DYNAMIC, "int8": _STATIC}


def pipeline(mode: str) -> list:
    """Pass classes the quantizer runs for ``mode`` ("fp16", "int4", "int8-dynamic" or "int8"), in order."""
    try:
        return list(_PIPELINES[mode])
    except KeyError:
        raise ValueError(f"no quantizer pipeline for mode {mode!r}; modes: {list(_PIPELINES)}") from None


def pass_names() -> list[str]:
    """Every quantizer pass name ``--disable-pass`` accepts."""
    return [p.name for p in _FP16 + _INT4 + _STATIC]


@dataclasses.dataclass
class Rewrite:
    """What :func:`rewrite` did."""

    report: OptimizationReport  # its rows are the build report's quantizer rows
    skipped: list  # int8: (candidate, reason) for the selected candidates left float
    fp16: dict  # fp16: convert_to_fp16's counts plus "bias_corrected"; int4: the layers and weight bytes
    run_time_scales: list = dataclasses.field(default_factory=list)  # static int8: layers without calibrated input


def rewrite(model: ir.Model, mode: str, context: qir.QuantContext, disabled: Sequence[str] = (),
            max_iterations: int = 8) -> Rewrite:
    """Run the ``mode`` pipeline on ``model`` in place, minus the ``disabled`` pass names.

    In the int8 modes the initializers nothing reads any more (the float weights that were
    quantized) are dropped at the end.
    """
    classes = [p for p in pipeline(mode) if p.name not in set(disabled)]
    report = OptimizationReport(opt_level=0, pipeline=[p.name for p in classes],
                                disabled=[n for n in disabled if n in pass_names()], stage=f"quantizer ({mode})")
    passes = {cls.name: cls(context) for cls in classes}
    PassManager(list(passes.values()), max_iterations=max_iterations).run(model, report)
    if mode == "fp16":
        weights, bias = passes.get(FP16Weights.name), passes.get(FP16BiasCorrection.name)
        fp16 = dict(weights.stats) if weights is not None else {"initializers": 0}
        fp16["bias_corrected"] = (bias.corrected or 0) if bias is not None else 0
        return Rewrite(report, [], fp16)
    if mode == "int4":
        int4 = passes.get(Int4Weights.name)
        for graph in irh.graphs(model):
            qir.drop_unused_initializers(graph)
        counts = {"layers": int4.converted if int4 is not None else 0,
                  "float_bytes": int4.weight_bytes[0] if int4 is not None else 0,
                  "int4_bytes": int4.weight_bytes[1] if int4 is not None else 0}
        return Rewrite(report, [], counts)
    layers = passes.get(QuantizeLayers.name)
    if layers is None:  # quant_layers disabled: nothing was quantized
        skipped = [(c.name, "quant_layers is disabled (--disable-pass)") for c in context.selected]
    else:
        skipped = layers.skipped
    for graph in irh.graphs(model):  # (a body's own weights too: Constants folded inside an If branch)
        qir.drop_unused_initializers(graph)
    return Rewrite(report, skipped, {}, list(layers.run_time_scales) if layers is not None else [])


__all__ = ["ChainInt8", "FP16BiasCorrection", "FP16Weights", "FoldChannelMul", "Int4Weights", "FoldScalarAffine", "FoldUpsampleAdd", "FoldUpsampleConcat", "FuseFlatten",
           "FuseMaxPool", "QuantizeLayers", "Rewrite", "pass_names", "pipeline",
           "rewrite"]
