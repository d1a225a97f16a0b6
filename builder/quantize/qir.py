"""Quantized-IR helpers shared by the quantizer's candidate search and its rewrite passes.

A leaf module: it imports only ``builder.ir_helpers``, onnx-ir, numpy and the
quantization arithmetic of ``builder.quantize.weights`` (itself a leaf), so
``builder.quantize``, ``builder.quantize.candidates`` and every pass under
``builder.quantize.passes`` can import it without an import circle.

What lives here: the op tables of the quantizable layers, :class:`Candidate`
(a layer the quantizer may rewrite), :class:`QuantContext` (what the rewrite
passes are told: the chosen candidates and the calibrated ranges),
:class:`Builder` (new initializers, one quantized copy per weight and one
scale pair per activation), and the small graph edits the folds share
(:func:`replace_node`, :func:`absorb`, :func:`sole_producer`, ...).

Invariants the passes rely on: a replaced node's outputs keep their names
(graph outputs included), new nodes are inserted before the node they replace
(the graph stays topologically sorted), and the old value is renamed
``<name>__replaced`` so a name is never held twice.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import numpy as np
import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.quantize.weights import (activation_params, activation_params_per_channel, limit_conv_pair_sums,
                                             limit_pair_sums, quantize_pair_limited, quantize_per_channel)
from minirt.vocabulary import FUSED_FORMS

DOMAIN = irh.MINIRT_DOMAIN
# (domain, op_type) of each quantizable layer: the ONNX op and its fused form (minirt/vocabulary.py).
CONV_OPS = {("", "Conv"), (DOMAIN, FUSED_FORMS["Conv"])}
GEMM_OPS = {("", "Gemm"), (DOMAIN, FUSED_FORMS["Gemm"])}
MATMUL_OPS = {("", "MatMul"), (DOMAIN, FUSED_FORMS["MatMul"])}
CONV_TRANSPOSE_OPS = {("", "ConvTranspose"), (DOMAIN, FUSED_FORMS["ConvTranspose"])}
# op -> (weight input indices, per-channel axis of the weight)
# (Gather: an embedding table, the constant float32 data a run-time index picks rows of: int8 by row)
WEIGHT_ONLY_OPS = {("", "ConvTranspose"): ((1,), 1), (DOMAIN, FUSED_FORMS["ConvTranspose"]): ((1,), 1), ("", "LSTM"): ((1, 2), 1),
                   ("", "GRU"): ((1, 2), 1), ("", "RNN"): ((1, 2), 1), ("", "Gather"): ((0,), 0)}


def weight_only_inputs(node: ir.Node) -> tuple[tuple[int, ...], int]:
    """(weight input indices, per-channel axis) of a layer that computes in float with int8-stored
    weights: WEIGHT_ONLY_OPS, a Gemm's W by output column (axis 0 when transB, else 1), a MatMul's
    by its last axis, a Conv's by output channel (axis 0)."""
    k = key(node)
    if k in WEIGHT_ONLY_OPS:
        return WEIGHT_ONLY_OPS[k]
    if k in GEMM_OPS:
        return (1,), 0 if int(irh.attr(node, "transB", 0)) else 1
    if k in MATMUL_OPS:
        w = node.inputs[1]
        return (1,), (len(w.shape) - 1 if w is not None and w.shape is not None else 1)
    return (1,), 0


# Ops with QConv's chained form: inputs (X, X_scale, X_zero_point, ...), X may be uint8, and the
# output_scale / output_zero_point attributes make the output uint8.
CHAINED_OPS = ("QConv", "QConvTranspose")


@dataclasses.dataclass
class Candidate:
    name: str  # node name
    op_type: str
    # "conv", "matmul", "convt" (a ConvTranspose of stride == kernel: int8 in static mode,
    # weight-only otherwise) or "weight-only"
    kind: str
    input: str  # the activation input quantized (empty for weight-only)
    weight: str
    final: bool = False
    weight_elements: int = 0
    depthwise: bool = False  # group == C == M: its input may be quantized per channel
    reduction: int = 0  # multiply-adds per output value (Conv: C/group*KH*KW; MatMul/Gemm: K)
    window: int = 1  # Conv: KH*KW (1 for a pointwise conv, which needs no im2col in float either)
    plane: int = 0  # Conv: input pixels per channel (H*W) when the input shape is static, else 0
    strides: int = 1  # Conv: the product of its strides (the output plane is about plane / strides)
    group_outputs: int = 0  # a grouped Conv (1 < group, not depthwise): output channels per group, else 0
    outputs: int = 0  # Conv: output channels (M), else 0
    weight_only: bool = False  # a conv computed in float with int8-stored weights (set by the quantizer)
    output: str = ""  # Conv: the output name (the speed rules find a depthwise conv's neighbours by it)
    activation: str = ""  # Conv: the fused activation (FusedConv's "activation" attribute; "" for none)
    residual: bool = False  # Conv: a fused residual input (FusedConv's fourth input)

    @property
    def computes_float(self) -> bool:
        """Whether the layer keeps float compute (its weight is only stored int8)."""
        return self.kind == "weight-only" or self.weight_only


@dataclasses.dataclass
class QuantContext:
    """What the quantizer's rewrite passes read (the pass manager hands it to each pass).

    ``ranges`` maps activation names to calibrated (lo, hi), and ``("channel", name)`` to per-channel
    arrays (static int8), or is None (int8-dynamic: the folds that need a static input scale have
    nothing to match).  ``chain``: True, False or "depthwise" (only into and out of depthwise QConvs).
    """

    selected: Sequence[Candidate] = ()
    ranges: dict | None = None
    reduce_range: bool = False
    # the int8 GEMM layers' weights keep |w0| + |w1| <= 128 for the pairs it multiplies side by side (D172)
    pair_limited: bool = False
    # static int8: {layer output name: mean input patch} on the float model over the calibration data
    # (pass int8_bias_correction)
    int8_means: dict = dataclasses.field(default_factory=dict)
    # quantize_weight's results by (weight name, its arguments), shared by the rewrites of one build (the
    # budget's fitting rewrites clones of one model) and by the passes that round a weight as quant_layers does
    weight_cache: dict = dataclasses.field(default_factory=dict)
    symmetric: bool = False
    per_channel: bool = True
    chain: bool | str = "depthwise"
    # fp16: the initializers to convert (None: every one large enough), the float model's mean layer
    # inputs for the bias correction ({}: none), and the size below which a tensor stays float32
    fp16_only: set | None = None
    fp16_means: dict = dataclasses.field(default_factory=dict)
    fp16_min_elements: int = 1024
    # int4: the block size along K, symmetric (zero point 8) or asymmetric weights, the size below which a
    # weight stays float, MatMulNBits' accuracy_level (4: int8 products, the native kernel's)
    int4_block_size: int = 32
    int4_symmetric: bool = True
    int4_min_elements: int = 4096
    int4_accuracy_level: int = 4
    # Pass fields read by the optimizer's passes; the quantizer's ignore them.
    input_shapes: dict = dataclasses.field(default_factory=dict)
    opt_level: int = 2


def weight_layout(node: ir.Node, kind: str, depthwise: bool = False) -> tuple[int, Callable | None]:
    """(the output-channel axis of the weight (input 1) of ``node``, a candidate of ``kind``; how the int8
    GEMM pairs the weight's values: a limit_pair_sums-like function of the int8 array for
    :func:`quantize_weight`, or None where no GEMM multiplies it, a depthwise conv)."""
    if kind == "convt":  # W (C, M, kH, kW): one scale per output channel M; the GEMM's rows run along C
        return 1, functools.partial(limit_pair_sums, axis=0)
    if kind == "conv":
        group = int(irh.attr(node, "group", 1))
        return 0, None if depthwise else functools.partial(limit_conv_pair_sums, group=group)
    if key(node) in GEMM_OPS and int(irh.attr(node, "transB", 0)):  # B (N, K)
        return 0, functools.partial(limit_pair_sums, axis=1)
    return 1, functools.partial(limit_pair_sums, axis=0)  # B (K, N)


def quantize_weight(arr: np.ndarray, axis: int, per_channel: bool = True, reduce_range: bool = False,
                    pairs: Callable | None = None, cache: dict | None = None,
                    name: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(int8 weight, float32 scales per index of ``axis``): per channel (or one scale for the tensor,
    repeated per channel so the kernels see one layout); with ``pairs`` (per channel only) pair-limited for
    the int8 GEMM that pairs the values so (weight_layout, quantize_pair_limited), else 7-bit when
    ``reduce_range``.  With ``cache`` and ``name`` (the weight's, unique in the model), a result is made
    once per weight and arguments (the pair-limited search is the costly one)."""
    key = (name, axis, per_channel, reduce_range, pairs is not None)
    if cache is not None and name is not None and key in cache:
        return cache[key]
    if pairs is not None and per_channel:
        out = quantize_pair_limited(arr, axis, pairs)
    elif per_channel:
        out = quantize_per_channel(arr, axis, reduce_range)
    else:
        q, s1 = quantize_per_channel(arr.reshape(1, -1), 0, reduce_range)
        out = q.reshape(arr.shape), np.repeat(s1, arr.shape[axis])
    if cache is not None and name is not None:
        cache[key] = out
    return out


def key(node: ir.Node) -> tuple[str, str]:
    """(domain, op_type) with the ONNX domain spelled ""."""
    return ("" if node.domain in ("", "ai.onnx") else node.domain, node.op_type)


def const(value: ir.Value | None, graph: ir.Graph) -> np.ndarray | None:
    """The array of ``value`` when it is an initializer of ``graph`` that is not a graph input, else None."""
    if value is None or value.const_value is None or value in graph.inputs:
        return None
    if value.name not in graph.initializers:
        return None
    return value.const_value.numpy()


def scoped_const(value: ir.Value | None, node: ir.Node, model: ir.Model) -> np.ndarray | None:
    """:func:`const` for an input of ``node`` wherever the node is: an initializer of its own graph, or,
    for a node inside an If / Loop / Scan body, one of the main graph's that the body reads as a
    capture (the same value object: a body's own value of the same name is not it)."""
    arr = const(value, node.graph) if node.graph is not None else None
    if arr is None and value is not None and node.graph is not model.graph \
            and model.graph.initializers.get(value.name) is value:
        arr = const(value, model.graph)
    return arr


def is_minirt(node: ir.Node | None, op_type: str) -> bool:
    return node is not None and node.domain == DOMAIN and node.op_type == op_type


class Builder:
    """Shared new initializers (one quantized copy per weight, one scale pair per activation)."""

    def __init__(self, model: ir.Model, reduce_range: bool, symmetric: bool, per_channel: bool = True,
                 pair_limited: bool = False, weight_cache: dict | None = None):
        self.model = model
        self.per_channel = per_channel
        self.graph = model.graph
        self.reduce_range = reduce_range
        self.pair_limited = pair_limited
        self.weight_cache = weight_cache  # (quantize_weight's, shared across rewrites)
        self.symmetric = symmetric
        self.cache: dict = {}

    def init(self, array: np.ndarray, name: str) -> ir.Value:
        base, i = name, 0
        while name in self.graph.initializers:
            i += 1
            name = f"{base}_{i}"
        arr = np.asarray(array)
        v = ir.Value(name=name, shape=ir.Shape(arr.shape), type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)),
                     const_value=ir.tensor(arr, name=name))
        self.graph.register_initializer(v)
        return v

    def weight(self, w: ir.Value, axis: int, alpha: float = 1.0, *,
               pairs: Callable | None = None) -> tuple[ir.Value, ir.Value]:
        """(int8 weight, scales per index of ``axis``) of ``w``, as :func:`quantize_weight` makes them."""
        k = ("w", w.name, axis, alpha, pairs is not None and self.pair_limited)
        if k not in self.cache:
            q, s = quantize_weight(w.const_value.numpy(), axis, self.per_channel, self.reduce_range,
                                   pairs if self.pair_limited else None, self.weight_cache, w.name)
            self.cache[k] = (self.init(q, f"{w.name}_int8"), self.init((s * np.float32(alpha)).astype(np.float32),
                                                                        f"{w.name}_scale"))
        return self.cache[k]

    def act(self, x: ir.Value, rng: tuple, per_channel: bool = False) -> tuple[ir.Value, ir.Value]:
        k = ("x", x.name, per_channel)
        if k not in self.cache:
            if per_channel:
                scale, zp = activation_params_per_channel(rng[0], rng[1], self.symmetric)
            else:
                scale, zp = activation_params(rng[0], rng[1], self.symmetric)
            self.cache[k] = (self.init(np.array(scale, np.float32), f"{x.name}_qscale"),
                             self.init(zp, f"{x.name}_qzp"))
        return self.cache[k]

    def dequantized(self, w: ir.Value, axis: int) -> ir.Value:
        """``com.minirt::DequantizeWeights(W int8, W_scale)``: the float32 weight, materialized once by the
        runtime; one node per (weight, axis), inserted first in the graph."""
        k = ("dq", w.name, axis)
        if k not in self.cache:
            wq, ws = self.weight(w, axis)
            dq = ir.Node(DOMAIN, "DequantizeWeights", [wq, ws], attributes=[ir.AttrInt64("axis", axis)],
                         name=f"{w.name}_dequantize", num_outputs=1)
            out = dq.outputs[0]
            out.name = f"{w.name}_dq"
            out.dtype, out.shape = ir.DataType.FLOAT, ir.Shape(wq.shape)
            self.graph.insert_before(next(iter(self.graph)), dq)
            self.cache[k] = out
        return self.cache[k]


def qconvs_without(graph: ir.Graph, *attributes: str) -> list:
    """The graph's QConv nodes that carry none of ``attributes`` (a list taken now: the callers
    rewrite the graph as they go)."""
    return [n for n in graph if is_minirt(n, "QConv") and not any(a in n.attributes for a in attributes)]


def output_ids(graph: ir.Graph) -> set:
    return set(id(v) for v in graph.outputs)


def absorb(graph: ir.Graph, y: ir.Value, consumer: ir.Node) -> None:
    """``y`` takes over the output of ``consumer`` (a node folded into y's producer): its name, shape
    and every use (graph outputs included); ``consumer`` is removed."""
    out = consumer.outputs[0]
    name = out.name
    y.shape = out.shape
    out.replace_all_uses_with(y, replace_graph_outputs=True)
    graph.remove(consumer, safe=True)
    out.name = f"{name}__replaced"
    y.name = name


def replace_node(graph: ir.Graph, old: ir.Node, new: ir.Node) -> None:
    """Put ``new`` where ``old`` is: its outputs take the old outputs' names, types and uses."""
    graph.insert_before(old, new)
    for o_old, o_new in zip(old.outputs, new.outputs):
        name = o_old.name
        o_new.dtype, o_new.shape = o_old.dtype, o_old.shape
        o_old.replace_all_uses_with(o_new, replace_graph_outputs=True)
        o_old.name = f"{name}__replaced"
        o_new.name = name
    graph.remove(old, safe=True)


def sole_producer(node: ir.Node, op_type: str, outputs: set) -> ir.Node | None:
    """The standard ``op_type`` node making ``node``'s X when X is read by ``node`` alone and is no graph
    output (``outputs``: the ids of the graph's outputs), else None: what a fold into ``node`` may remove."""
    x = node.inputs[0]
    producer = x.producer()
    if producer is None or key(producer) != ("", op_type) or id(x) in outputs or len(list(x.uses())) != 1:
        return None
    return producer


def static_u8_input(node: ir.Node, graph: ir.Graph) -> tuple[float, int] | None:
    """(scale, zero point) of a QConv that quantizes its float X statically with one uint8 pair, else None."""
    if not is_minirt(node, "QConv") or len(node.inputs) < 3 or node.inputs[0] is None:
        return None
    xs, xz = const(node.inputs[1], graph), const(node.inputs[2], graph)
    if xs is None or xz is None or xs.size != 1 or xz.dtype != np.uint8:
        return None
    if node.inputs[0].dtype not in (None, ir.DataType.FLOAT):
        return None
    return float(xs.reshape(())), int(xz.reshape(()))


def binary_folds_into_static_qconvs(graph: ir.Graph, op_type: str, outputs: set):
    """(QConv, producer) for every QConv with a free input slot (at most 7 inputs) that quantizes its
    float X statically (:func:`static_u8_input`) from a two-input ``op_type`` node it alone reads
    (:func:`sole_producer`): the candidates of the folds into a QConv's input (Mul, Add).  Iterates
    over a snapshot of the graph, so the caller may rewrite as it goes."""
    for node in list(graph):
        if len(node.inputs) > 7 or static_u8_input(node, graph) is None:
            continue
        producer = sole_producer(node, op_type, outputs)
        if producer is not None and len(producer.inputs) == 2:
            yield node, producer


def per_channel_shape(v: ir.Value | None) -> bool:
    """Whether ``v`` is statically a 4-D (N, C, 1, 1) tensor (one value per image and channel, such
    as a squeeze-and-excitation scale)."""
    dims = list(v.shape) if v is not None and v.shape is not None else []
    return len(dims) == 4 and dims[2] == 1 and dims[3] == 1


def channel_mul_parts(value: ir.Value, outputs: set) -> tuple[ir.Node, ir.Value, ir.Value] | None:
    """(Mul, x, s) when ``value`` is ``Mul(x, s)`` with s statically (N, C, 1, 1) float, the Mul's output
    read once and no graph output, else None: a per-channel scale a QConv's quantize pass can apply."""
    m = value.producer()
    if (m is None or key(m) != ("", "Mul") or len(m.inputs) != 2 or id(value) in outputs
            or len(list(value.uses())) != 1):
        return None
    scales = [v for v in m.inputs if per_channel_shape(v)]
    if len(scales) != 1 or scales[0].dtype not in (None, ir.DataType.FLOAT):
        return None
    s = scales[0]
    return m, (m.inputs[1] if m.inputs[0] is s else m.inputs[0]), s


def nearest_integer_upsample(node: ir.Node, graph: ir.Graph) -> int | None:
    """The factor f of a ``Resize`` that repeats each value of a 4-D input f x f times (nearest,
    asymmetric coordinates, floor rounding, constant scales (1, 1, f, f) for an integer f >= 1, no
    sizes / axes / antialiasing), else None."""
    if key(node) != ("", "Resize") or len(node.outputs) != 1 or not node.inputs or node.inputs[0] is None:
        return None
    attr = irh.attr
    if (attr(node, "mode", "nearest") != "nearest" or attr(node, "coordinate_transformation_mode") != "asymmetric"
            or attr(node, "nearest_mode") != "floor" or int(attr(node, "antialias", 0))
            or attr(node, "axes") is not None):
        return None
    ins = list(node.inputs)
    scales = ins[1] if len(ins) == 2 else ins[2] if len(ins) > 2 else None  # (opset 10: X, scales)
    if len(ins) > 3 and ins[3] is not None:
        return None  # sizes given
    sc = const(scales, graph)
    if sc is None or sc.shape != (4,) or sc[0] != 1 or sc[1] != 1 or sc[2] != sc[3]:
        return None
    f = float(sc[2])
    return int(f) if f >= 1 and f == int(f) else None


def is_depthwise_qconv(node: ir.Node, graph: ir.Graph) -> bool:
    """A QConv with group == C == M (one input channel per group, constant weight)."""
    if not is_minirt(node, "QConv") or len(node.inputs) < 4:
        return False
    w = const(node.inputs[3], graph)
    return w is not None and w.ndim == 4 and w.shape[1] == 1 and int(irh.attr(node, "group", 1)) == w.shape[0] > 1


def drop_unused_initializers(graph: ir.Graph) -> None:
    """Remove initializers nothing reads any more (the float weights the quantized copies replaced)."""
    graph_inputs = set(id(v) for v in graph.inputs)
    graph_outputs = output_ids(graph)
    for name, v in list(graph.initializers.items()):
        if not v.uses() and id(v) not in graph_inputs and id(v) not in graph_outputs:
            graph.initializers.pop(name)
