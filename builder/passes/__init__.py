"""The builder's graph optimizer.

One entry point, :func:`optimize`, runs the pipeline chosen by the opt level
on an onnx-ir model in place and returns an :class:`OptimizationReport`.
Each pass lives in its own module with a docstring of its rules and a test
beside it (``test_<name>.py``)::

    level 0   nothing
    level 1   shape_specialisation, constant_folding, fold_constant_if, cleanup, initializer_dedup, cse,
              flatten_tree_ensembles, dce
    level 2   level 1 + variadic_to_binary, recognise_activations, recognise_one_hot_matmul, fuse_batchnorm, fold_input_affine,
              factor_residual_scale, matmul_to_gemm, fuse_pad, fuse_activation
    level 3   level 2 + recognise_layernorm, recognise_attention

    Targets run by the CPU alone (``cpu_only``) get recognise_attention at level 2 too: the native
    attention call keeps the scores in cache (D153); an accelerator target keeps the decomposed
    products and softmax, which its lowering rules take.

The quantizer's rewrites (``quant_layers``, ``quant_fold_affine``, ..., ``fp16_weights``) are passes
too, run by the same manager after this pipeline: see ``builder/quantize/passes``.

Fused ops belong to minirt's own domain ``com.minirt`` (docs/fused_ops.md,
kernels in minirt/kernels/fused.py).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import onnx_ir as ir
from onnx_ir.passes import common as ir_passes

from minirt.builder.passes.cleanup import Cleanup
from minirt.builder.passes.constant_folding import ConstantFolding
from minirt.builder.passes.cse import CommonSubexpressionElimination
from minirt.builder.passes.factor_residual_scale import FactorResidualScale
from minirt.builder.passes.dce import DeadCodeElimination
from minirt.builder.passes.flatten_tree_ensembles import FlattenTreeEnsembles
from minirt.builder.passes.fold_input_affine import FoldInputAffine
from minirt.builder.passes.fuse_activation import FuseActivation
from minirt.builder.passes.fold_constant_if import FoldConstantIf
from minirt.builder.passes.fuse_batchnorm import FuseBatchNorm
from minirt.builder.passes.initializer_dedup import InitializerDeduplication
from minirt.builder.passes.manager import OptimizationReport, OptimizeContext, Pass, PassManager, format_report
from minirt.builder.passes.fuse_pad import FusePad
from minirt.builder.passes.matmul_to_gemm import MatMulAddToGemm
from minirt.builder.passes.recognise_attention import RecogniseAttention
from minirt.builder.passes.recognise_layernorm import RecogniseLayerNorm
from minirt.builder.passes.recognise_activations import RecogniseActivations
from minirt.builder.passes.recognise_one_hot_matmul import RecogniseOneHotMatMul
from minirt.builder.passes.shape_specialisation import ShapeSpecialisation
from minirt.builder.passes.variadic_to_binary import VariadicToBinary

_LEVEL1 = [ShapeSpecialisation, ConstantFolding, FoldConstantIf, Cleanup, InitializerDeduplication, CommonSubexpressionElimination,
           FlattenTreeEnsembles, DeadCodeElimination]
_LEVEL2 = [VariadicToBinary, RecogniseActivations, RecogniseOneHotMatMul, FuseBatchNorm, FoldInputAffine, FactorResidualScale,
           MatMulAddToGemm, FusePad, FuseActivation]
_LEVEL3 = [RecogniseLayerNorm, RecogniseAttention]
_LEVEL2_CPU = [RecogniseAttention]  # (level 2 for a target the CPU runs alone)


def pipeline(opt_level: int, cpu_only: bool = False) -> list:
    """Pass classes run at ``opt_level``, in order (the manager repeats the list to a fixed point);
    ``cpu_only``: the target has no accelerator provider (see the module docstring)."""
    if opt_level not in (0, 1, 2, 3):
        raise ValueError(f"opt_level must be 0, 1, 2 or 3, got {opt_level!r}")
    if opt_level == 0:
        return []
    passes = list(_LEVEL1[:-1])
    if opt_level >= 3:
        passes += _LEVEL3
    elif opt_level == 2 and cpu_only:
        passes += _LEVEL2_CPU
    if opt_level >= 2:
        passes += _LEVEL2
    return passes + [_LEVEL1[-1]]  # dce last in every sweep


def pass_names() -> list[str]:
    """Every pass name ``--disable-pass`` accepts."""
    return [p.name for p in _LEVEL1 + _LEVEL2 + _LEVEL3]


def optimize(
    model: ir.Model,
    opt_level: int = 2,
    disabled: Sequence[str] = (),
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    fold_size_limit: int = 1 << 20,
    max_iterations: int = 8,
    cpu_only: bool = False,
) -> OptimizationReport:
    """Optimize ``model`` in place; returns the report (``as_dict()`` for metadata).  ``cpu_only``: the
    target has no accelerator provider (:func:`pipeline`)."""
    names = pass_names()
    unknown = sorted(set(disabled) - set(names))
    if unknown:
        raise ValueError(f"unknown pass name(s) {unknown} for --disable-pass; known passes: {names}")
    classes = [p for p in pipeline(opt_level, cpu_only) if p.name not in set(disabled)]
    context = OptimizeContext(
        input_shapes={k: tuple(v) for k, v in (input_shapes or {}).items()},
        fold_size_limit=fold_size_limit,
        opt_level=opt_level,
    )
    report = OptimizationReport(opt_level=opt_level, pipeline=[p.name for p in classes], disabled=list(disabled))
    passes = [cls(context) for cls in classes]
    PassManager(passes, max_iterations=max_iterations).run(model, report)
    if passes:
        # New values may be unnamed and new nodes are inserted next to the
        # node they replace; keep the invariants lowering relies on.
        ir_passes.NameFixPass()(model)
        ir_passes.TopologicalSortPass()(model)
    return report


__all__ = ["OptimizationReport", "OptimizeContext", "Pass", "PassManager", "format_report", "optimize", "pass_names",
           "pipeline"]
