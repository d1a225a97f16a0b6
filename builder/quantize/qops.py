"""Lowering to minirt's quantized ops (``com.minirt::QConv`` / ``QMatMul``).

A *candidate* is a Conv / FusedConv / Gemm / FusedGemm / MatMul / FusedMatMul
whose weight is a constant float32 initializer.  Quantizing it replaces the
node by one quantized node with the same float input and output:

    Conv, FusedConv          -> QConv(x, x_scale, x_zp, W int8, W_scale, B, Z)
    ConvTranspose, FusedConvTranspose with stride == kernel (static int8 only)
                             -> QConvTranspose(x, x_scale, x_zp, W int8, W_scale, B)
    Gemm, FusedGemm          -> QMatMul(a, a_scale, a_zp, B int8, B_scale, C, Z)  transB kept,
                                alpha folded into B_scale, beta into a constant C
    MatMul, FusedMatMul      -> QMatMul(a, a_scale, a_zp, B int8, B_scale, bias, Z)

Static int8 gives x_scale / x_zp from calibration (per channel for the
input of a depthwise convolution, whose channels never mix, so one outlier
channel does not crush the resolution of the others); int8-dynamic leaves
them out (the kernel quantizes x at run time).  No Quantize/Dequantize nodes sit
between layers, so the rest of the graph (pooling, resize, softmax,
layer norm, ...) stays in float, untouched.

*Weight-only* nodes (other ConvTransposes, LSTM/GRU/RNN weights, and convolutions
kept float because float is faster there: depthwise, small pointwise) get their
weight stored int8 behind a ``com.minirt::DequantizeWeights``: 4x smaller,
computed in float32; the runtime dequantizes each weight once (first run) and
reuses the float32 copy.

By default a candidate whose output reaches a graph output without passing
through another candidate (a *final* layer) stays float.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from builder.ir_helpers import copy_attrs
from builder.quantize.weights import activation_params, activation_params_per_channel, quantize_per_channel

DOMAIN = "com.minirt"
CONV_OPS = {("", "Conv"), (DOMAIN, "FusedConv")}
GEMM_OPS = {("", "Gemm"), (DOMAIN, "FusedGemm")}
MATMUL_OPS = {("", "MatMul"), (DOMAIN, "FusedMatMul")}
# op -> (weight input indices, per-channel axis of the weight)
WEIGHT_ONLY_OPS = {("", "ConvTranspose"): ((1,), 1), (DOMAIN, "FusedConvTranspose"): ((1,), 1), ("", "LSTM"): ((1, 2), 1),
                   ("", "GRU"): ((1, 2), 1), ("", "RNN"): ((1, 2), 1)}


CONV_TRANSPOSE_OPS = {("", "ConvTranspose"), (DOMAIN, "FusedConvTranspose")}


def _key(node: ir.Node) -> tuple[str, str]:
    return ("" if node.domain in ("", "ai.onnx") else node.domain, node.op_type)


def _const(value: ir.Value | None, graph: ir.Graph) -> np.ndarray | None:
    if value is None or value.const_value is None or value in graph.inputs:
        return None
    if value.name not in graph.initializers:
        return None
    return value.const_value.numpy()


def _attr(node: ir.Node, name: str, default=None):
    a = node.attributes.get(name)
    return default if a is None else a.value


def _tile_conv_transpose(node: ir.Node, graph: ir.Graph) -> bool:
    """Whether ``node`` is a 2-D ConvTranspose / FusedConvTranspose with a constant float32 weight
    and stride == kernel, one group, no padding, dilation 1, no output_padding / output_shape (every
    input pixel its own output tile): the form QConvTranspose computes in int8."""
    if _key(node) not in CONV_TRANSPOSE_OPS or len(node.inputs) < 2 or node.inputs[0] is None:
        return False
    w = _const(node.inputs[1], graph)
    if w is None or w.dtype != np.float32 or w.ndim != 4:
        return False
    k = [int(v) for v in w.shape[2:]]
    kernel = [int(v) for v in _attr(node, "kernel_shape", ()) or ()]
    strides = [int(v) for v in _attr(node, "strides", ()) or ()] or [1, 1]
    return ((not kernel or kernel == k) and strides == k and int(_attr(node, "group", 1)) == 1
            and not any(int(v) for v in _attr(node, "pads", ()) or ())
            and all(int(v) == 1 for v in _attr(node, "dilations", ()) or ())
            and not any(int(v) for v in _attr(node, "output_padding", ()) or ())
            and not _attr(node, "output_shape", ()) and _attr(node, "auto_pad", "NOTSET") in ("NOTSET", "VALID")
            and node.inputs[0].dtype in (None, ir.DataType.FLOAT))


@dataclasses.dataclass
class Candidate:
    name: str  # node name
    op_type: str
    # "conv", "matmul", "convt" (a ConvTranspose of _tile_conv_transpose's form: int8 in static mode,
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
    weight_only: bool = False  # a conv computed in float with int8-stored weights (set by the quantizer)


def _final_nodes(graph: ir.Graph, candidate_ids: set) -> set:
    """Candidates with a path to a graph output that meets no other candidate."""
    outputs = set(id(v) for v in graph.outputs)
    memo: dict[int, bool] = {}

    def reaches(value: ir.Value, depth=0) -> bool:
        key = id(value)
        if key in memo:
            return memo[key]
        memo[key] = False  # cycles cannot happen, but be safe
        hit = key in outputs
        if not hit:
            for use in value.uses():
                consumer = use.node
                if id(consumer) in candidate_ids:
                    continue
                if any(reaches(o, depth + 1) for o in consumer.outputs):
                    hit = True
                    break
        memo[key] = hit
        return hit

    final = set()
    for node in graph:
        if id(node) in candidate_ids and any(reaches(o) for o in node.outputs):
            final.add(node.name)
    return final


def _plane(x: ir.Value) -> int:
    """Pixels per channel (product of the dimensions after the first two) of a conv input of static
    shape, else 0."""
    dims = list(x.shape) if x.shape is not None else []
    if len(dims) < 3 or not all(isinstance(d, int) and d > 0 for d in dims[2:]):
        return 0
    return int(np.prod(dims[2:]))


def find_candidates(model: ir.Model, weight_only: bool = True) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """Quantizable nodes of the main graph, and (node, reason) for the ones refused."""
    graph = model.graph
    found: list[Candidate] = []
    refused: list[tuple[str, str]] = []
    ids = {}
    for node in graph:
        key = _key(node)
        kind = None
        if key in CONV_OPS:
            kind = "conv"
        elif key in GEMM_OPS or key in MATMUL_OPS:
            kind = "matmul"
        elif _tile_conv_transpose(node, graph):
            kind = "convt"
        elif key in WEIGHT_ONLY_OPS and weight_only:
            kind = "weight-only"
        if kind is None:
            continue
        if kind == "convt":
            w = node.inputs[1]
            found.append(Candidate(node.name, node.op_type, "convt", node.inputs[0].name, w.name,
                                   weight_elements=int(w.const_value.size)))
            ids[id(node)] = None
            continue
        if kind == "weight-only":
            idx, _axis = WEIGHT_ONLY_OPS[key]
            ws = [node.inputs[i] if i < len(node.inputs) else None for i in idx]
            arrs = [_const(w, graph) for w in ws]
            if any(a is None or a.dtype != np.float32 for a in arrs):
                refused.append((node.name, f"{node.op_type}: weights are not constant float32"))
                continue
            found.append(Candidate(node.name, node.op_type, kind, "", ",".join(w.name for w in ws),
                                   weight_elements=sum(a.size for a in arrs)))
            ids[id(node)] = None
            continue
        x, w = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
        warr = _const(w, graph)
        if warr is None or warr.dtype != np.float32:
            refused.append((node.name, f"{node.op_type}: weight is not a constant float32 initializer"))
            continue
        if x is None or (x.dtype is not None and x.dtype != ir.DataType.FLOAT):
            refused.append((node.name, f"{node.op_type}: input is not float32"))
            continue
        if kind == "conv" and warr.ndim < 3:
            refused.append((node.name, "Conv: weight rank < 3"))
            continue
        if kind == "matmul":
            if warr.ndim != 2:
                refused.append((node.name, f"{node.op_type}: weight is not a 2-D matrix"))
                continue
            if key in GEMM_OPS:
                if _attr(node, "transA", 0):
                    refused.append((node.name, "Gemm with transA=1"))
                    continue
                c = node.inputs[2] if len(node.inputs) > 2 else None
                if c is not None and float(_attr(node, "beta", 1.0)) != 1.0 and _const(c, graph) is None:
                    refused.append((node.name, "Gemm with beta != 1 and a non-constant C"))
                    continue
        group = int(_attr(node, "group", 1))
        depthwise = kind == "conv" and warr.shape[1] == 1 and group == warr.shape[0] and group > 1
        if kind == "conv":
            reduction = int(np.prod(warr.shape[1:]))
        else:
            reduction = int(warr.shape[1] if key in GEMM_OPS and _attr(node, "transB", 0) else warr.shape[0])
        found.append(Candidate(node.name, node.op_type, kind, x.name, w.name, weight_elements=int(warr.size),
                               depthwise=depthwise, reduction=reduction,
                               window=int(np.prod(warr.shape[2:])) if kind == "conv" else 1,
                               plane=_plane(x) if kind == "conv" else 0))
        ids[id(node)] = None
    final = _final_nodes(graph, set(ids))
    for c in found:
        c.final = c.name in final
    return found, refused


class _Builder:
    """Shared new initializers (one quantized copy per weight, one scale pair per activation)."""

    def __init__(self, model: ir.Model, reduce_range: bool, symmetric: bool, per_channel: bool = True):
        self.model = model
        self.per_channel = per_channel
        self.graph = model.graph
        self.reduce_range = reduce_range
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

    def weight(self, w: ir.Value, axis: int, alpha: float = 1.0) -> tuple[ir.Value, ir.Value]:
        key = ("w", w.name, axis, alpha)
        if key not in self.cache:
            arr = w.const_value.numpy()
            if self.per_channel:
                q, s = quantize_per_channel(arr, axis, self.reduce_range)
            else:  # one scale for the tensor, stored per channel so the kernels see one layout
                q, s1 = quantize_per_channel(arr.reshape(1, -1), 0, self.reduce_range)
                q, s = q.reshape(arr.shape), np.repeat(s1, arr.shape[axis])
            self.cache[key] = (self.init(q, f"{w.name}_int8"), self.init((s * np.float32(alpha)).astype(np.float32),
                                                                          f"{w.name}_scale"))
        return self.cache[key]

    def act(self, x: ir.Value, rng: tuple, per_channel: bool = False) -> tuple[ir.Value, ir.Value]:
        key = ("x", x.name, per_channel)
        if key not in self.cache:
            if per_channel:
                scale, zp = activation_params_per_channel(rng[0], rng[1], self.symmetric)
            else:
                scale, zp = activation_params(rng[0], rng[1], self.symmetric)
            self.cache[key] = (self.init(np.array(scale, np.float32), f"{x.name}_qscale"),
                               self.init(zp, f"{x.name}_qzp"))
        return self.cache[key]


def _qconvs_without(graph: ir.Graph, *attributes: str) -> list:
    """The graph's QConv nodes that carry none of ``attributes`` (a list taken now: the callers
    rewrite the graph as they go)."""
    return [n for n in graph if n.domain == DOMAIN and n.op_type == "QConv"
            and not any(a in n.attributes for a in attributes)]


def _absorb(graph: ir.Graph, y: ir.Value, consumer: ir.Node) -> None:
    """``y`` takes over the output of ``consumer`` (a node folded into y's producer): its name, shape
    and every use (graph outputs included); ``consumer`` is removed."""
    out = consumer.outputs[0]
    name = out.name
    y.shape = out.shape
    out.replace_all_uses_with(y, replace_graph_outputs=True)
    graph.remove(consumer, safe=True)
    out.name = f"{name}__replaced"
    y.name = name


def _replace(graph: ir.Graph, old: ir.Node, new: ir.Node) -> None:
    graph.insert_before(old, new)
    for o_old, o_new in zip(old.outputs, new.outputs):
        name = o_old.name
        o_new.dtype, o_new.shape = o_old.dtype, o_old.shape
        o_old.replace_all_uses_with(o_new, replace_graph_outputs=True)
        o_old.name = f"{name}__replaced"
        o_new.name = name
    graph.remove(old, safe=True)


def apply_int8(model: ir.Model, selected: list[Candidate], ranges: dict | None, reduce_range: bool = False,
               symmetric: bool = False, per_channel: bool = True, chain: bool | str = False,
               fuse_pool_flatten: bool = True, fold_affine: bool = True,
               fold_upsample: bool = True) -> list[tuple[str, str]]:
    """Quantize the ``selected`` candidates of ``model`` in place.

    ``ranges`` maps activation names to calibrated (lo, hi) (static int8), or
    is None (dynamic int8).  With ``fuse_pool_flatten`` a MaxPool reading only a QConv's
    output is folded into the QConv (:func:`fuse_max_pool`) and a Flatten feeding only a
    QMatMul into the QMatMul (:func:`fuse_flatten`).  With ``fold_affine`` the scalar ``Mul`` /
    ``Add`` after a QConv become its ``post_scale`` / ``post_shift``
    (:func:`fold_scalar_affine`).  With ``fold_upsample`` (static only) an ``Add`` of a nearest
    2x-style ``Resize`` that only a QConv reads becomes the QConv's ``X_up`` input
    (:func:`fold_upsample_add`), a channel ``Concat`` of such Resizes read only by a QConv a
    ``QuantizeUpsampleConcat`` writing its uint8 input (:func:`fold_upsample_concat`) and a ``Mul``
    by a per-channel scale read only by a QConv its ``X_mul`` (:func:`fold_channel_mul`); a QConv
    with ``X_up`` / ``X_mul`` is never a chained consumer.  With ``chain``
    (static only) a QConv whose output only feeds QConvs writes it as uint8 in
    their input quantization (:func:`chain_int8`; ``chain="depthwise"``: only where the
    producer or a consumer is a depthwise QConv).  Returns (node, reason) for
    candidates skipped here.
    """
    graph = model.graph
    b = _Builder(model, reduce_range, symmetric, per_channel)
    by_name = {n.name: n for n in graph}
    skipped = []
    used_domain = False
    for cand in selected:
        node = by_name.get(cand.name)
        if node is None:
            skipped.append((cand.name, "node not found"))
            continue
        if cand.kind == "weight-only" or cand.weight_only:
            _weight_only(b, node)
            used_domain = True
            continue
        x = node.inputs[0]
        if ranges is not None:
            rng = ranges.get(("channel", x.name)) if cand.depthwise else None
            per_channel = rng is not None
            if rng is None:
                rng = ranges.get(x.name)
            if rng is None:
                skipped.append((cand.name, f"no calibration range for its input {x.name!r}"))
                continue
            xs, xz = b.act(x, rng, per_channel)
        else:
            xs = xz = None
        key = _key(node)
        ins = list(node.inputs) + [None] * (4 - len(node.inputs))
        if cand.kind == "convt":
            if ranges is None:
                raise ValueError(f"{cand.name}: QConvTranspose needs a static input scale (int8 mode)")
            wq, ws = b.weight(node.inputs[1], 1)  # W is (C, M, kH, kW): one scale per output channel M
            new = ir.Node(DOMAIN, "QConvTranspose", [x, xs, xz, wq, ws, ins[2]], attributes=copy_attrs(node),
                          name=node.name, num_outputs=1)
        elif cand.kind == "conv":
            wq, ws = b.weight(node.inputs[1], 0)
            new = ir.Node(DOMAIN, "QConv", [x, xs, xz, wq, ws, ins[2], ins[3]], attributes=copy_attrs(node),
                          name=node.name, num_outputs=1)
        else:
            attrs = copy_attrs(node, drop=("alpha", "beta", "transA", "transB"))
            if key in GEMM_OPS:
                trans_b = int(_attr(node, "transB", 0))
                alpha = float(_attr(node, "alpha", 1.0))
                beta = float(_attr(node, "beta", 1.0))
                wq, ws = b.weight(node.inputs[1], 0 if trans_b else 1, alpha)
                c = ins[2]
                if c is not None and beta != 1.0:
                    c = b.init((c.const_value.numpy() * np.float32(beta)).astype(np.float32), f"{c.name}_beta")
                attrs.append(ir.AttrInt64("transB", trans_b))
            else:
                wq, ws = b.weight(node.inputs[1], 1)
                c = ins[2]
            new = ir.Node(DOMAIN, "QMatMul", [x, xs, xz, wq, ws, c, ins[3]], attributes=attrs, name=node.name,
                          num_outputs=1)
        _replace(graph, node, new)
        used_domain = True
    if used_domain:
        model.opset_imports.setdefault(DOMAIN, 1)
    if fold_affine:
        fold_scalar_affine(graph)
    if fuse_pool_flatten:
        fuse_max_pool(graph)
        fuse_flatten(graph)
    if fold_upsample and ranges is not None:
        fold_upsample_add(graph)
        fold_upsample_concat(graph)
        fold_channel_mul(graph)
    if chain and ranges is not None:
        chain_int8(graph, depthwise_only=chain == "depthwise")
    _drop_unused_initializers(graph)
    return skipped


def _plain_max_pool_2d(node: ir.Node) -> tuple[list[int], list[int]] | None:
    """(kernel_shape, strides) of a 2-D MaxPool with one output, no padding, dilation 1 and
    floor rounding (the form QConv's pool attributes express), else None."""
    if _key(node) != ("", "MaxPool") or len(node.outputs) != 1 or len(node.inputs) != 1:
        return None
    k = [int(v) for v in _attr(node, "kernel_shape", ()) or ()]
    s = [int(v) for v in _attr(node, "strides", ()) or ()] or [1] * len(k)
    pads = [int(v) for v in _attr(node, "pads", ()) or ()]
    dil = [int(v) for v in _attr(node, "dilations", ()) or ()]
    if len(k) != 2 or len(s) != 2 or min(k + s) < 1:
        return None
    if any(pads) or any(v != 1 for v in dil) or int(_attr(node, "ceil_mode", 0)):
        return None
    if _attr(node, "auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return None
    return k, s


def fuse_max_pool(graph: ir.Graph) -> int:
    """Fold ``QConv -> MaxPool`` into one QConv with ``pool_kernel_shape`` / ``pool_strides``
    when the QConv's output is used only by a plain 2-D MaxPool (:func:`_plain_max_pool_2d`)
    and is not a graph output.  Exact (the runtime max-pools the QConv's float result); it
    saves the pooling node and its dispatch, which on small models (digits: one 32x8x8
    MaxPool, ~10 us at batch 1) cost as much as a conv.  Returns the number of fused pools."""
    outputs = set(id(v) for v in graph.outputs)
    fused = 0
    for node in _qconvs_without(graph, "pool_kernel_shape", "output_scale", "post_scale"):
        y = node.outputs[0]
        uses = list(y.uses())
        if id(y) in outputs or len(uses) != 1:
            continue
        pool = uses[0][0]
        geometry = _plain_max_pool_2d(pool)
        if geometry is None:
            continue
        node.attributes["pool_kernel_shape"] = ir.AttrInt64s("pool_kernel_shape", geometry[0])
        node.attributes["pool_strides"] = ir.AttrInt64s("pool_strides", geometry[1])
        _absorb(graph, y, pool)
        fused += 1
    return fused


def _scalar_operand(node: ir.Node, x: ir.Value, graph: ir.Graph) -> float | None:
    """The constant float32 scalar (one element) that a binary ``node`` combines with ``x``, else None."""
    if len(node.inputs) != 2 or len(node.outputs) != 1:
        return None
    other = node.inputs[1] if node.inputs[0] is x else node.inputs[0]
    if other is x:
        return None
    c = _const(other, graph)
    if c is None or c.dtype != np.float32 or c.size != 1 or c.ndim > 1:
        return None  # a wider constant would broadcast the output to a larger shape
    return float(c.reshape(()))


def fold_scalar_affine(graph: ir.Graph) -> int:
    """Fold ``Mul(y, a)`` and then ``Add(., b)`` by constant float32 scalars (either one alone, too)
    after a QConv into its ``post_scale`` = a / ``post_shift`` = b, when each intermediate output
    has that one use and is no graph output.  PP-OCR's LCNet puts such a learnable affine map
    after every conv + activation; folded, the native int8 epilogues apply it and the map's
    float tensors (and their numpy passes) disappear, and the QConv can write uint8 for the next
    int8 layer (:func:`chain_int8`).  The only difference is float rounding (``a * y + b`` in the
    epilogue instead of two passes).  Returns the number of folded nodes."""
    outputs = set(id(v) for v in graph.outputs)
    folded = 0
    for node in _qconvs_without(graph, "post_scale", "pool_kernel_shape", "output_scale"):
        scale, shift = 1.0, 0.0
        y = node.outputs[0]
        for op in ("Mul", "Add"):
            uses = list(y.uses())
            if id(y) in outputs or len(uses) != 1:
                break
            user = uses[0][0]
            if _key(user) != ("", op):
                continue
            c = _scalar_operand(user, y, graph)
            if c is None:
                break
            if op == "Mul":
                scale = c
            else:
                shift = c
            _absorb(graph, y, user)
            folded += 1
        if (scale, shift) != (1.0, 0.0):
            node.attributes["post_scale"] = ir.AttrFloat32("post_scale", scale)
            node.attributes["post_shift"] = ir.AttrFloat32("post_shift", shift)
    return folded


def fuse_flatten(graph: ir.Graph) -> int:
    """Fold ``Flatten -> QMatMul`` into the QMatMul's ``flatten_axis`` attribute when the Flatten's
    output is only the QMatMul's input A (and no graph output).  Exact; one node less per run
    (digits at batch 1: ~2 us of ~45).  Returns the number of folded Flattens."""
    outputs = set(id(v) for v in graph.outputs)
    fused = 0
    for node in list(graph):
        if _key(node) != ("", "Flatten") or len(node.inputs) != 1:
            continue
        flat = node.outputs[0]
        uses = list(flat.uses())
        if id(flat) in outputs or len(uses) != 1:
            continue
        user, idx = uses[0]
        if user.domain != DOMAIN or user.op_type != "QMatMul" or idx != 0 or "flatten_axis" in user.attributes:
            continue
        user.attributes["flatten_axis"] = ir.AttrInt64("flatten_axis", int(_attr(node, "axis", 1)))
        user.replace_input_with(0, node.inputs[0])
        graph.remove(node, safe=True)
        fused += 1
    return fused


def _nearest_integer_upsample(node: ir.Node, graph: ir.Graph) -> int | None:
    """The factor f of a ``Resize`` that repeats each value of a 4-D input f x f times (nearest,
    asymmetric coordinates, floor rounding, constant scales (1, 1, f, f) for an integer f >= 1, no
    sizes / axes / antialiasing), else None."""
    if _key(node) != ("", "Resize") or len(node.outputs) != 1 or not node.inputs or node.inputs[0] is None:
        return None
    if (_attr(node, "mode", "nearest") != "nearest" or _attr(node, "coordinate_transformation_mode") != "asymmetric"
            or _attr(node, "nearest_mode") != "floor" or int(_attr(node, "antialias", 0))
            or _attr(node, "axes") is not None):
        return None
    ins = list(node.inputs)
    scales = ins[1] if len(ins) == 2 else ins[2] if len(ins) > 2 else None  # (opset 10: X, scales)
    if len(ins) > 3 and ins[3] is not None:
        return None  # sizes given
    sc = _const(scales, graph)
    if sc is None or sc.shape != (4,) or sc[0] != 1 or sc[1] != 1 or sc[2] != sc[3]:
        return None
    f = float(sc[2])
    return int(f) if f >= 1 and f == int(f) else None


def _per_channel_shape(v: ir.Value | None) -> bool:
    """Whether ``v`` is statically a 4-D (N, C, 1, 1) tensor (one value per image and channel, such
    as a squeeze-and-excitation scale)."""
    dims = list(v.shape) if v is not None and v.shape is not None else []
    return len(dims) == 4 and dims[2] == 1 and dims[3] == 1


def fold_upsample_add(graph: ir.Graph) -> int:
    """Fold ``QConv(Add(a, Resize(b)))``, the top-down path of a feature pyramid, into
    ``QConv(a, ..., X_up=b)`` with ``x_up_factor`` f (and ``a = Mul(x, s)`` with s of shape
    (N, C, 1, 1), read by that Add only, into ``X = x, X_mul = s``), when the Resize repeats each value f x f times
    (:func:`_nearest_integer_upsample`), its output is read by that Add only, the Add's by that QConv
    only (as X), neither is a graph output, and the QConv quantizes X statically with one uint8
    scale.  The runtime adds the upsampled values while it quantizes (one pass, no float sum or
    upsampled tensor written): identical results.  PP-OCR det: the Resize and Add before its last
    96 -> 24 3x3 conv, ~0.2 ms of int8's ~5.2 (docs/decisions.md D52).  Returns the number
    of folded pairs."""
    outputs = set(id(v) for v in graph.outputs)
    folded = 0
    for node in list(graph):
        if len(node.inputs) > 7 or _static_u8_input(node, graph) is None:
            continue
        add = _sole_producer(node, "Add", outputs)
        if add is None or len(add.inputs) != 2:
            continue
        for i in (0, 1):
            r = add.inputs[i].producer() if add.inputs[i] is not None else None
            f = _nearest_integer_upsample(r, graph) if r is not None else None
            if f is None or id(r.outputs[0]) in outputs or len(list(r.outputs[0].uses())) != 1:
                continue
            other = add.inputs[1 - i]
            if other is None or other.dtype not in (None, ir.DataType.FLOAT):
                continue
            x_mul = mul = None
            m = other.producer()
            if (m is not None and _key(m) == ("", "Mul") and len(m.inputs) == 2 and id(other) not in outputs
                    and len(list(other.uses())) == 1):
                scales = [v for v in m.inputs if _per_channel_shape(v)]
                if len(scales) == 1 and scales[0].dtype in (None, ir.DataType.FLOAT):
                    x_mul, mul = scales[0], m
                    other = m.inputs[1] if m.inputs[0] is x_mul else m.inputs[0]
            ins = list(node.inputs) + [None] * (7 - len(node.inputs))
            new = ir.Node(DOMAIN, "QConv", [other] + ins[1:] + [r.inputs[0]] + ([x_mul] if x_mul is not None else []),
                          attributes=list(node.attributes.values()) + [ir.AttrInt64("x_up_factor", f)],
                          name=node.name, num_outputs=1)
            _replace(graph, node, new)
            graph.remove(add, safe=True)
            graph.remove(r, safe=True)
            if mul is not None:
                graph.remove(mul, safe=True)
            folded += 1
            break
    return folded


def _sole_producer(node: ir.Node, op_type: str, outputs: set) -> ir.Node | None:
    """The standard ``op_type`` node making ``node``'s X when X is read by ``node`` alone and is no graph
    output (``outputs``: the ids of the graph's outputs), else None: what a fold into ``node`` may remove."""
    x = node.inputs[0]
    producer = x.producer()
    if producer is None or _key(producer) != ("", op_type) or id(x) in outputs or len(list(x.uses())) != 1:
        return None
    return producer


def _static_u8_input(node: ir.Node, graph: ir.Graph) -> tuple[float, int] | None:
    """(scale, zero point) of a QConv that quantizes its float X statically with one uint8 pair, else None."""
    if node.domain != DOMAIN or node.op_type != "QConv" or len(node.inputs) < 3 or node.inputs[0] is None:
        return None
    xs, xz = _const(node.inputs[1], graph), _const(node.inputs[2], graph)
    if xs is None or xz is None or xs.size != 1 or xz.dtype != np.uint8:
        return None
    if node.inputs[0].dtype not in (None, ir.DataType.FLOAT):
        return None
    return float(xs.reshape(())), int(xz.reshape(()))


def fold_upsample_concat(graph: ir.Graph) -> int:
    """Give a QConv whose X is a ``Concat`` over channels (axis 1) of 4-D tensors, some of them
    ``Resize`` outputs that repeat each value f x f times (:func:`_nearest_integer_upsample`) and/or
    ``Mul`` outputs by an (N, C, 1, 1) tensor (a squeeze-and-excitation scale), a
    ``com.minirt::QuantizeUpsampleConcat`` of the (X, M) pairs before them (factors f, 1 for no
    Resize; M absent for no Mul) in the QConv's static uint8 input quantization: the QConv then
    reads uint8 (its chained form).  Only when the Concat's output is read by that QConv alone and
    each folded Resize's / Mul's by the node after it alone, none a graph output.  Identical
    results; nothing multiplied, upsampled, concatenated or float is written (PP-OCR det's last
    conv: four Muls, three Resizes and the Concat).  Returns the number of folded Concats."""
    outputs = set(id(v) for v in graph.outputs)
    folded = 0
    for node in list(graph):
        quant = _static_u8_input(node, graph)
        if quant is None:
            continue
        x = node.inputs[0]
        cat = _sole_producer(node, "Concat", outputs)
        if cat is None or int(_attr(cat, "axis", 0)) != 1:
            continue
        if any(v is None or v.dtype not in (None, ir.DataType.FLOAT) for v in cat.inputs):
            continue
        sources, factors, removed = [], [], []
        for v in cat.inputs:
            r = v.producer()
            f = _nearest_integer_upsample(r, graph) if r is not None else None
            if f is not None and id(v) not in outputs and len(list(v.uses())) == 1:
                removed.append(r)
                v = r.inputs[0]
            else:
                f = 1
            src, m = v, None
            mul = v.producer()
            if (mul is not None and _key(mul) == ("", "Mul") and len(mul.inputs) == 2 and id(v) not in outputs
                    and len(list(v.uses())) == 1):
                scales = [u for u in mul.inputs if _per_channel_shape(u)]
                if len(scales) == 1 and scales[0].dtype in (None, ir.DataType.FLOAT):
                    m = scales[0]
                    src = mul.inputs[1] if mul.inputs[0] is m else mul.inputs[0]
                    removed.append(mul)
            sources += [src, m]
            factors.append(f)
        if not removed:
            continue
        q = ir.Node(DOMAIN, "QuantizeUpsampleConcat", sources,
                    attributes=[ir.AttrInt64s("factors", factors), ir.AttrFloat32("scale", quant[0]),
                                ir.AttrInt64("zero_point", quant[1])],
                    name=f"{cat.name}_quantized", num_outputs=1)
        graph.insert_before(cat, q)
        xq = q.outputs[0]
        xq.name = f"{x.name}_u8"
        xq.dtype, xq.shape = ir.DataType.UINT8, x.shape
        node.replace_input_with(0, xq)
        graph.remove(cat, safe=True)
        for r in removed:  # (each Resize before the Mul it reads)
            graph.remove(r, safe=True)
        folded += 1
    return folded


def fold_channel_mul(graph: ir.Graph) -> int:
    """Fold ``QConv(Mul(x, s))`` with s statically (N, C, 1, 1) (a squeeze-and-excitation scale), the
    Mul's output read by that QConv alone (as X) and no graph output, into ``QConv(x, ..., X_mul=s)``
    when the QConv quantizes X statically with one uint8 scale: the runtime multiplies while it
    quantizes, identical results, one float pass and one node less (PP-OCR det's backbone SE blocks).
    Returns the number of folded Muls."""
    outputs = set(id(v) for v in graph.outputs)
    folded = 0
    for node in list(graph):
        if len(node.inputs) > 7 or _static_u8_input(node, graph) is None:
            continue
        mul = _sole_producer(node, "Mul", outputs)
        if mul is None or len(mul.inputs) != 2:
            continue
        scales = [v for v in mul.inputs if _per_channel_shape(v)]
        if len(scales) != 1 or scales[0].dtype not in (None, ir.DataType.FLOAT) or mul.inputs[0] is mul.inputs[1]:
            continue
        s_in = scales[0]
        x_in = mul.inputs[1] if mul.inputs[0] is s_in else mul.inputs[0]
        if x_in is None or x_in.dtype not in (None, ir.DataType.FLOAT):
            continue
        ins = list(node.inputs) + [None] * (7 - len(node.inputs))
        new = ir.Node(DOMAIN, "QConv", [x_in] + ins[1:] + [None, s_in], attributes=list(node.attributes.values()),
                      name=node.name, num_outputs=1)
        _replace(graph, node, new)
        graph.remove(mul, safe=True)
        folded += 1
    return folded


def _is_depthwise_qconv(node: ir.Node, graph: ir.Graph) -> bool:
    """A QConv with group == C == M (one input channel per group, constant weight)."""
    if node.domain != DOMAIN or node.op_type != "QConv" or len(node.inputs) < 4:
        return False
    w = _const(node.inputs[3], graph)
    return w is not None and w.ndim == 4 and w.shape[1] == 1 and int(_attr(node, "group", 1)) == w.shape[0] > 1


# Ops with QConv's chained form: inputs (X, X_scale, X_zero_point, ...), X may be uint8, and the
# output_scale / output_zero_point attributes make the output uint8.
CHAINED_OPS = ("QConv", "QConvTranspose")


def _uint8_friendly(node: ir.Node, graph: ir.Graph) -> bool:
    """A producer that gains from writing uint8: a depthwise QConv (its int8 kernel is fast on uint8
    in and out) or a QConvTranspose (its output has kH*kW times its input's pixels: uint8 writes a
    quarter of the bytes).  Into a QConvTranspose from a GEMM QConv the uint8 stage costs what it saves
    (PP-OCR det, docs/decisions.md D55), so as a consumer only a depthwise QConv counts."""
    return _is_depthwise_qconv(node, graph) or (node.domain == DOMAIN and node.op_type == "QConvTranspose")


def chain_int8(graph: ir.Graph, depthwise_only: bool = False) -> int:
    """Chain int8 layers: a QConv (or QConvTranspose) whose output is not a graph output and is used only as the
    input X of QConvs (or QConvTransposes) that all quantize it with the same static ``X_scale`` and uint8
    ``X_zero_point`` gets ``output_scale`` / ``output_zero_point`` = those (lists of one per
    channel for a depthwise consumer's per-channel quantization), and its output becomes uint8
    (``quantize_u8`` of the float result, done in the conv's epilogue), so the consumers skip
    their quantize pass and no float tensor sits between the layers.  The results are identical
    to the unchained graph.  With ``depthwise_only`` only where the producer or a consumer is a
    depthwise QConv: the native int8 depthwise kernel is fast on uint8 in and out, while between
    two GEMM convs the uint8 output stage costs about what the consumer's quantize pass saves
    (digits batch 1: 10 % slower chained, docs/decisions.md D46); a QConvTranspose producer counts as
    depthwise there (:func:`_uint8_friendly`).  Returns the number of
    chained QConvs."""
    outputs = set(id(v) for v in graph.outputs)
    chained = 0
    for node in list(graph):
        if node.domain != DOMAIN or node.op_type not in CHAINED_OPS or "output_scale" in node.attributes:
            continue
        if "pool_kernel_shape" in node.attributes:  # the native pooled path writes float only
            continue
        y = node.outputs[0]
        uses = list(y.uses())
        if id(y) in outputs or not uses:
            continue
        params = set()
        for user, idx in uses:
            if user.domain != DOMAIN or user.op_type not in CHAINED_OPS or idx != 0 or len(user.inputs) < 3:
                params = None
                break
            if any(v is not None for v in user.inputs[7:]):  # X_up / X_mul: X is not the quantized input
                params = None
                break
            xs, xz = _const(user.inputs[1], graph), _const(user.inputs[2], graph)
            if xs is None or xz is None or xs.size != xz.size or xz.dtype != np.uint8:
                params = None
                break
            params.add((tuple(float(v) for v in xs.reshape(-1)), tuple(int(v) for v in xz.reshape(-1))))
        if not params or len(params) != 1:
            continue
        if depthwise_only and not (_uint8_friendly(node, graph)
                                   or any(_is_depthwise_qconv(user, graph) for user, _ in uses)):
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
    return chained


def _dequantized(b: _Builder, w: ir.Value, axis: int) -> ir.Value:
    """``com.minirt::DequantizeWeights(W int8, W_scale)``: the float32 weight, materialized once by the runtime."""
    key = ("dq", w.name, axis)
    if key not in b.cache:
        wq, ws = b.weight(w, axis)
        dq = ir.Node(DOMAIN, "DequantizeWeights", [wq, ws], attributes=[ir.AttrInt64("axis", axis)],
                     name=f"{w.name}_dequantize", num_outputs=1)
        out = dq.outputs[0]
        out.name = f"{w.name}_dq"
        out.dtype, out.shape = ir.DataType.FLOAT, ir.Shape(wq.shape)
        b.graph.insert_before(next(iter(b.graph)), dq)
        b.cache[key] = out
    return b.cache[key]


def _weight_only(b: _Builder, node: ir.Node) -> None:
    idx, axis = WEIGHT_ONLY_OPS.get(_key(node), ((1,), 0))  # a Conv / FusedConv kept float: weight 1, axis 0
    for i in idx:
        node.replace_input_with(i, _dequantized(b, node.inputs[i], axis))


def _drop_unused_initializers(graph: ir.Graph) -> None:
    graph_inputs = set(id(v) for v in graph.inputs)
    graph_outputs = set(id(v) for v in graph.outputs)
    for name, v in list(graph.initializers.items()):
        if not v.uses() and id(v) not in graph_inputs and id(v) not in graph_outputs:
            graph.initializers.pop(name)
