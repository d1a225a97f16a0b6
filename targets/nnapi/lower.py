"""ONNX (optimized onnx-ir) nodes -> an NNAPI model (:class:`targets.nnapi.model.NNModel`).

Conventions (docs/nnapi.md):

* every rank-4 value is held in NHWC inside the NNAPI model (NNAPI's and
  TFLite's layout); other ranks keep ONNX's order.  The runtime transposes
  rank-4 partition inputs NCHW -> NHWC before the call and rank-4 outputs back
  after it.  Layout-sensitive operators (Reshape, Transpose, Concat, Softmax,
  Pad, ReduceMean...) have their axes mapped, or get an explicit TRANSPOSE
  when the two orders differ in memory;
* a fused activation (Relu, Relu6 = Clip(0, 6), Relu1 = Clip(-1, 1)) becomes
  NNAPI's fuse code on the CONV_2D / DEPTHWISE_CONV_2D / TRANSPOSE_CONV_2D /
  FULLY_CONNECTED / ADD (other activations follow as their own operation);
  FusedConv's residual Z becomes an ADD carrying the fuse code;
  HardSigmoid after a convolution is folded into its weights (6*alpha, 6*beta)
  with a RELU6 fuse code and one MUL by 1/6; HardSwish is HARD_SWISH from API
  30 and ADD(relu6)+MUL+MUL before;
* every operation emitted is checked against the target API level
  (:mod:`targets.nnapi.oplevels`); an operator with no form at that level
  raises :class:`Unsupported` with the reason the build report prints.
"""

from __future__ import annotations

import numpy as np

from minirt.targets.nnapi import oplevels as C
from minirt.targets.nnapi.emitter import INT64_READERS, MAX_RANK, TO_NCHW, Lowerer, Unsupported, known_shape, shapes_for
from minirt.targets.nnapi.model import NNModel
from minirt.targets.nnapi.rules import RULES

__all__ = ["Lowerer", "RULES", "Unsupported", "lower_nodes", "node_support", "shapes_for"]


def lower_nodes(nodes, inputs, outputs, ctx, level: int) -> NNModel:
    """Lower ``nodes`` (topological) reading ``inputs`` and producing ``outputs`` into an NNModel."""
    low = Lowerer(ctx, level, shapes_for(ctx))
    m = low.m
    for v in inputs:
        if ctx.const(v) is not None:
            m.input_map.append(None)
            continue
        m.input_map.append(len(m.inputs))
        # quantized inputs get their parameters from their first DequantizeLinear consumer
        dt = ctx.dtype(v)
        if dt is not None and np.dtype(dt) in (np.uint8, np.int8):
            consumer = next((u for u, _ in v.uses() if u.op_type == "DequantizeLinear" and u in nodes), None)
            if consumer is None:
                raise Unsupported(f"quantized input {v.name!r} is not read by a DequantizeLinear")
            scale, zp = low.qparams(consumer)
            if scale.size != 1:
                raise Unsupported("per-axis quantized partition input")
            t = C.TENSOR_QUANT8_ASYMM if np.dtype(dt) == np.uint8 else C.TENSOR_QUANT8_ASYMM_SIGNED
            low.add_model_input(v, t, scale=float(scale.reshape(-1)[0]),
                                zero_point=0 if zp is None else int(np.asarray(zp).reshape(-1)[0]))
        elif dt is not None and np.dtype(dt) == np.int64:
            readers = [(u.op_type, k) for u, k in v.uses() if u in nodes]
            bad = [op for op, k in readers if (op, k) not in INT64_READERS]
            if bad or not readers:
                raise Unsupported(f"value {v.name!r} is int64; NNAPI has no 64-bit integers (int64 indices and "
                                  f"lengths are taken by {', '.join(sorted({op for op, _ in INT64_READERS}))} "
                                  f"only, not by {', '.join(sorted(set(bad))) or 'no reader'})")
            low.add_model_input(v, C.TENSOR_INT32)  # the runtime casts the feed (INT64_READERS)
        else:
            low.add_model_input(v)
    RULES.emit_all(nodes, low)
    input_operands = set(m.inputs)
    for v in outputs:
        if id(v) in low.lazy_flat:
            low.inp(v)
        if id(v) not in low.vals:
            raise Unsupported(f"partition output {v.name!r} was not produced")
        if len(low.shape(v, any_rank=True)) > MAX_RANK:
            raise Unsupported(f"value {v.name!r} of rank {len(low.shape(v, any_rank=True))} would be an output of "
                              "the NNAPI partition (NNAPI tensors have rank 4 at most)")
        idx = low.vals[id(v)]
        o = m.operands[idx]
        if idx in input_operands or o.value is not None or idx in m.outputs:
            copy = m.tensor(o.dims, o.type, scale=o.scale, zero_point=o.zero_point)
            low.emit(C.RESHAPE, [idx, m.const(np.array(o.dims, np.int32))], [copy])
            idx = copy
        m.outputs.append(idx)
        m.output_perm.append(list(TO_NCHW) if len(low.shape(v)) == 4 else None)
        m.output_names.append(v.name or "")
    m.prune()
    for o in m.operands:
        m.need(C.OPERAND_API_LEVEL[o.type])
    if m.min_api_level > level:
        raise Unsupported(f"the model needs Android API {m.min_api_level} (target API {level})")
    return m


# A cluster of nodes joined by values of rank > 4 larger than this is not tried (none seen in real models
# has more than 8: ShuffleNet's shuffle is 3, a ViT's qkv split 6)
MAX_CLUSTER = 32


def high_rank_cluster(node, ctx) -> list | None:
    """The nodes that must share a partition with ``node`` because values of rank > 4 join them (in graph
    order), or None when ``node`` reads and makes no such value.

    NNAPI operands have rank 4 at most and the runtime feeds and returns operands as they are, so a value
    of rank > 4 (a channel shuffle's, a ViT's qkv) lives inside one partition: its producer and all its
    readers are lowered together, and each of them is supported only when all of them are.
    """
    shapes = shapes_for(ctx)

    def high(v) -> bool:
        if v is None or not v.name or ctx.const(v) is not None:
            return False
        s = shapes.get(id(v)) or ctx.static_shape(v)
        return s is not None and len(s) > MAX_RANK

    members, todo = {id(node): node}, [node]
    while todo:
        n = todo.pop()
        joined = [v.producer() for v in n.inputs if high(v)]
        joined += [u for o in n.outputs if high(o) for u, _ in o.uses()]
        for m in joined:
            if m is not None and id(m) not in members:
                members[id(m)] = m
                todo.append(m)
        if len(members) > MAX_CLUSTER:
            break
    if len(members) == 1 and not any(high(v) for v in list(node.inputs) + list(node.outputs)):
        return None
    return [n for n in ctx.model.graph if id(n) in members]


def _unknown_shape(node, ctx) -> str | None:
    """The refusal for the first run-time input or used output of ``node`` whose shape neither the graph
    nor NNAPI's shape inference knows, else None.  Every NNAPI operand has static dims here, so this is
    the real cause whatever else the trial lowering would meet first: with fixed input shapes, a size
    that depends on the data (a detector's NonZero / TopK chain) says so rather than, say, that its
    int64 indices have no NNAPI type."""
    shapes = shapes_for(ctx)
    used = [o for o in node.outputs if o is not None and o.name and (o.uses() or o.is_graph_output())]
    for v in list(node.inputs) + used:
        if v is not None and v.name and known_shape(v, ctx, shapes) is None:
            return f"value {v.name!r} has no static shape ({ctx.unknown_shape_hint()})"
    return None


def node_support(node, ctx, level: int) -> tuple[bool, str]:
    """Whether ``node`` lowers on its own at API ``level`` (the reason when not); a node joined to others
    by values of rank > 4 lowers together with them (:func:`high_rank_cluster`)."""
    why = _unknown_shape(node, ctx)
    if why is not None:
        return False, why
    try:
        cluster = high_rank_cluster(node, ctx)
        if cluster is not None:
            return _cluster_support(node, cluster, ctx, level)
        inputs, seen = [], set()
        for v in node.inputs:
            if v is not None and id(v) not in seen:
                seen.add(id(v))
                inputs.append(v)
        outputs = [o for o in node.outputs if o is not None and o.name and (o.uses() or o.is_graph_output())]
        if node.op_type in ("Flatten", "Reshape") and level < C.MIN_API_LEVEL[C.TRANSPOSE] and outputs and all(
                u.op_type in ("Gemm", "FusedGemm") and not o.is_graph_output() for o in outputs for u, _ in o.uses()):
            # lowered together with its Gemm consumers, the flatten needs no TRANSPOSE (weights are permuted);
            # a partition that separates them fails to lower and stays on the CPU
            outputs = [None]
        if not outputs:
            outputs = [o for o in node.outputs[:1] if o is not None]
        outputs = [o for o in outputs if o is not None]
        lower_nodes([node], inputs, outputs, ctx, level)
    except Unsupported as exc:
        return False, str(exc)
    except Exception as exc:  # noqa: BLE001 - a lowering bug refuses the node, it does not stop the build
        return False, f"NNAPI lowering failed: {type(exc).__name__}: {exc}"
    return True, ""


def _cluster_support(node, cluster: list, ctx, level: int) -> tuple[bool, str]:
    if len(cluster) > MAX_CLUSTER:
        return False, f"more than {MAX_CLUSTER} nodes joined by values of rank > 4 (NNAPI tensors have rank 4 at most)"
    if any(n.graph is not node.graph for n in cluster):
        return False, "a value of rank > 4 is read inside a subgraph (NNAPI tensors have rank 4 at most)"
    inside = {id(n) for n in cluster}
    inputs, seen = [], set()
    for n in cluster:
        for v in n.inputs:
            if v is not None and v.name and id(v) not in seen and (v.producer() is None or id(v.producer()) not in inside):
                seen.add(id(v))
                inputs.append(v)
    outputs = [o for n in cluster for o in n.outputs if o is not None and o.name and (
        o.is_graph_output() or any(id(u) not in inside for u, _ in o.uses()))]
    try:
        lower_nodes(cluster, inputs, outputs, ctx, level)
    except Unsupported as exc:
        others = ", ".join(sorted({n.op_type for n in cluster if n is not node})) or "none"
        return False, f"{exc} (lowered with the nodes that share its values of rank > 4: {others})"
    return True, ""
