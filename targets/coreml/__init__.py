"""Core ML provider spec: which nodes Core ML takes and how a partition becomes an ML Program.

Support = a lowering rule exists for the op (``targets/coreml/rules.py``, a
``targets.rules.RuleSet``) and its check passes, plus :meth:`CoreMLSpec.precheck`,
the generic conditions checked first: every tensor the
node reads at run time or produces is float32/float16 with a static shape of
rank 1..5 (Core ML ML Programs have fixed-shape inputs here; build with
``--input-shape`` to fix symbolic dimensions), and the target's Core ML is
recent enough for ML Programs (macOS 13 / iOS 16).  Integer and bool tensors
(int32, int64, bool) are taken by the ops of ``rules.INTEGER_OPS`` only (indices,
masks and their data movement); the program computes them as MIL int32 / bool,
so int64 values must fit in int32 (token ids, lengths and masks do), and at the
partition boundary they travel as int32 (``lower.build_program``).

Classical ML (``targets/coreml/classical.py``): tree ensembles and linear models of ``ai.onnx.ml``
(and the builder's FlatTreeEnsemble) are not MIL ops but Core ML model types of their own; such a node
is supported when its Core ML model gives onnxruntime's results (the module says when), is lowered
alone (``group_key``: one node, one partition, one ``mlmodel-spec`` blob), and is kept whatever its
FLOPs (``keep_partition``): the cost model's FLOPs do not describe tree walks, and Core ML runs these
models on its own CPU evaluator, so a partition only moves the model into Core ML.

Precision: the target profile's ``provider_info["coreml"]["compute_precision"]``
("fp16" on macOS/iOS: the Neural Engine computes in fp16), overridable with
the build option ``coreml_precision``.
"""
from __future__ import annotations

import importlib.util

import numpy as np

from minirt.targets.coreml import classical
from minirt.targets.coreml.rules import INTEGER_OPS, RULES
from minirt.targets.providers import LoweringError, PartitionIR, SupportContext
from minirt.targets.rules import RuleSpec, used_outputs

_FLOAT = (np.dtype(np.float32), np.dtype(np.float16))
# Carried as MIL int32 / bool by the ops of INTEGER_OPS (see the module docstring).
_INTEGER = (np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.bool_))
MAX_RANK = 5


class CoreMLSpec(RuleSpec):
    name = "coreml"
    rules = RULES
    # A Core ML call costs roughly 0.1-0.3 ms of dispatch; at ~1 TFLOP/s that is
    # worth a few hundred MFLOPs on the ANE, but the CPU baseline (numpy) is far
    # slower, so a conservative figure keeps only clearly profitable islands off the CPU.
    dispatch_cost = 2.0e6
    min_flops = 2.0e6
    copy_cost_per_element = 4.0

    def builder_available(self, ctx: SupportContext) -> tuple[bool, str]:
        if importlib.util.find_spec("coremltools") is None:
            return False, "coremltools is not installed (pip install 'minirt[coreml]')"
        info = ctx.provider_info("coreml")
        if info and int(info.get("spec_version", 7)) < 7:
            return False, f"target {ctx.profile.name} has Core ML spec {info.get('spec_version')}; ML Programs need 7 (macOS 13 / iOS 16)"
        return True, ""

    def refusal(self, node, ctx: SupportContext) -> str | None:
        if classical.is_classical(node):
            return classical.refusal(node, ctx)  # (its own checks: not an ML program's tensors)
        if classical.op_key(node) in classical.CPU_ONLY:
            return classical.CPU_ONLY[classical.op_key(node)]
        return super().refusal(node, ctx)

    def group_key(self, node, ctx: SupportContext):
        """Partitions only group nodes of one key (builder/partition.py): a classical node is a Core ML
        model of its own, never part of an ML program nor of another classical node's model."""
        return ("classical", id(node)) if classical.is_classical(node) else None

    def node_cost(self, node, ctx: SupportContext) -> float:
        if classical.is_classical(node):
            return classical.cost(node, ctx)
        return super().node_cost(node, ctx)

    def keep_partition(self, partition: PartitionIR, flops: float, boundary: float, ctx: SupportContext):
        if any(classical.is_classical(n) for n in partition.nodes):
            return True, ""  # (see the module docstring: no FLOPs threshold for a classical model)
        return super().keep_partition(partition, flops, boundary, ctx)

    def precheck(self, node, ctx: SupportContext) -> str | None:
        """Every run-time tensor the node reads or produces: float, static shape, rank 1..5."""
        for i, v in enumerate(node.inputs):
            if v is None or ctx.const(v) is not None:
                continue
            if i == 4 and node.op_type in ("LSTM", "GRU") and node.domain in ("", "ai.onnx"):
                continue  # (int sequence_lens: the rule's check says why a run-time one is refused)
            why = _tensor_refusal(v, ctx, "input", node)
            if why:
                return f"{node.op_type}: {why}"
        for v in used_outputs(node):
            why = _tensor_refusal(v, ctx, "output", node)
            if why:
                return f"{node.op_type}: {why}"
        return None

    def lower(self, partition: PartitionIR, ctx: SupportContext) -> tuple[bytes, dict]:
        from minirt.targets.coreml.lower import BLOB_FORMAT, build_program, convert, import_coremltools, package_bytes

        ct = import_coremltools()
        if any(classical.is_classical(n) for n in partition.nodes):
            return classical.lower_partition(partition, ctx)
        info = ctx.provider_info("coreml")
        precision = ctx.options.get("coreml_precision") or info.get("compute_precision", "fp16")
        if precision not in ("fp16", "fp32"):
            raise LoweringError(f"Core ML compute precision must be fp16 or fp32, got {precision!r}")
        deployment = info.get("deployment_target", "macOS13")
        opset = getattr(ct.target, deployment)
        prog = build_program(partition, ctx, opset)
        mlmodel = convert(prog, precision, deployment)
        blob = package_bytes(mlmodel)
        options = {
            "format": BLOB_FORMAT,
            "compute_precision": precision,
            "compute_units": info.get("compute_units", "all"),
            "deployment_target": deployment,
            "input_names": [f"in_{i}" for i in range(len(partition.inputs))],
            "output_names": [f"out_{i}" for i in range(len(partition.outputs))],
            "onnx_inputs": [v.name for v in partition.inputs],
            "onnx_outputs": [v.name for v in partition.outputs],
            "coremltools": ct.__version__,
        }
        return blob, options


def _tensor_refusal(v, ctx: SupportContext, what: str, node) -> str | None:
    dt = ctx.dtype(v)
    if dt is None:
        return f"{what} {v.name!r} has an unknown element type"
    if np.dtype(dt) not in _FLOAT:
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        if np.dtype(dt) not in _INTEGER:
            return (f"{what} {v.name!r} is {np.dtype(dt).name}; Core ML partitions compute on float, int32/int64 "
                    f"and bool tensors")
        if (domain, node.op_type) not in INTEGER_OPS:
            return (f"{what} {v.name!r} is {np.dtype(dt).name}; Core ML lowers integer and bool tensors in "
                    f"{', '.join(sorted(op for _, op in INTEGER_OPS))} only")
    shape = ctx.shape(v)
    if shape is None:
        return f"{what} {v.name!r} has an unknown rank"
    if any(d is None for d in shape):
        return f"{what} {v.name!r} has a dynamic shape {_fmt(v)} ({ctx.unknown_shape_hint()})"
    if len(shape) > MAX_RANK:
        return f"{what} {v.name!r} has rank {len(shape)} > {MAX_RANK}, beyond Core ML's limit"
    if len(shape) == 0:
        return f"{what} {v.name!r} is a scalar (rank 0); Core ML partitions take tensors"
    return None


def _fmt(v) -> str:
    out = []
    for d in v.shape:
        if isinstance(d, int) and d >= 0:
            out.append(str(d))
        else:
            out.append(str(getattr(d, "value", None) or "?"))
    return "[" + ",".join(out) + "]"
