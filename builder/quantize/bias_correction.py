"""Weight rounding-error bias correction (fp16, and the int8 weights of static int8).

Storing a Conv / Gemm weight ``W`` as float16 (or int8) changes it by ``dW = fp16(W) - W``,
which shifts each output channel by ``dW · E[x patch]`` on average.  With the mean
input patch of each layer (measured on the float model over calibration data),
``-dW · E[x patch]`` is folded into the layer's (float32) bias, so the mean output
of every channel is what the float model computes on that data.

Convolutions (2-D, ``Conv`` / ``com.minirt::FusedConv``): the mean patch is the
mean over output positions of the im2col columns, ``[C_in, kh, kw]``, zero
padding included (exact for the spatial mean, borders too).  Gemm /
``com.minirt::FusedGemm``: the mean row of ``A``.  Other consumers are left alone.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.quantize import _run
from minirt.builder.quantize.weights import _fp16_exponent
from minirt.vocabulary import FUSED_FORMS, MINIRT_DOMAIN

# a standard op and its com.minirt fused form (minirt/vocabulary.py)
_CONV = {("", "Conv"), (MINIRT_DOMAIN, FUSED_FORMS["Conv"])}
_GEMM = {("", "Gemm"), (MINIRT_DOMAIN, FUSED_FORMS["Gemm"])}


def _consumers(model: ir.Model, names) -> list[tuple[str, ir.Node]]:
    """(weight name, node) for every Conv/Gemm that reads a weight of ``names`` as its input 1, in the
    order of the graph's initializers (``names`` is often a set: its order changes from process to
    process with Python's hash seed, and the new biases' order in the artifact would follow it)."""
    out = []
    for name, value in model.graph.initializers.items():
        if name not in names:
            continue
        for node, i in value.uses():
            key = (node.domain or "", node.op_type)
            if i != 1 or not node.inputs or node.inputs[0] is None:
                continue
            if key in _CONV and value.const_value is not None and len(value.shape) == 4 \
                    and irh.attr(node, "auto_pad", "NOTSET") == "NOTSET":
                out.append((name, node))
            elif key in _GEMM and len(value.shape) == 2 and not irh.attr(node, "transA", 0):
                out.append((name, node))
    return out


def _conv_patch_sum(x: np.ndarray, node: ir.Node, kshape) -> tuple[np.ndarray, int]:
    """Sum over batch and output positions of the im2col columns of ``x`` ([C, kh, kw]), and their count."""
    kh, kw = kshape
    s = list(irh.attr(node, "strides", (1, 1)))
    d = list(irh.attr(node, "dilations", (1, 1)))
    p = list(irh.attr(node, "pads", (0, 0, 0, 0)))
    n, c, h, w = x.shape
    xp = np.pad(x.astype(np.float64, copy=False), ((0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])))
    ho = (h + p[0] + p[2] - d[0] * (kh - 1) - 1) // s[0] + 1
    wo = (w + p[1] + p[3] - d[1] * (kw - 1) - 1) // s[1] + 1
    total = np.zeros((c, kh, kw))
    for i in range(kh):
        for j in range(kw):
            win = xp[:, :, i * d[0]: i * d[0] + s[0] * (ho - 1) + 1: s[0], j * d[1]: j * d[1] + s[1] * (wo - 1) + 1: s[1]]
            total[:, i, j] = win.sum(axis=(0, 2, 3))
    return total, n * ho * wo


def mean_inputs(model: ir.Model, names, feeds) -> dict:
    """``{layer output name: mean patch}`` for the Conv/Gemm consumers of ``names``, measured on ``feeds``."""
    consumers = _consumers(model, names)
    if not consumers or not feeds:
        return {}
    by_input: dict[str, list] = {}
    for wname, node in consumers:
        by_input.setdefault(node.inputs[0].name, []).append((wname, node))
    sums: dict = {}

    def visit(name, x):
        for wname, node in by_input.get(name, ()):
            if (node.domain or "", node.op_type) in _CONV:
                if x.ndim != 4:
                    continue
                shape = model.graph.initializers[wname].shape
                tot, cnt = _conv_patch_sum(x, node, (shape[2], shape[3]))
            else:
                a = x.reshape(-1, x.shape[-1]).astype(np.float64)
                tot, cnt = a.sum(axis=0), a.shape[0]
            prev = sums.get(node.outputs[0].name)
            sums[node.outputs[0].name] = (tot, cnt) if prev is None else (prev[0] + tot, prev[1] + cnt)

    _run.collect(model, list(by_input), feeds, visit)
    return {k: t / max(c, 1) for k, (t, c) in sums.items()}


def _fp16_roundtrip(w: np.ndarray) -> np.ndarray:
    """What :func:`convert_to_fp16` + DequantizeWeights give back for ``w``."""
    exp = _fp16_exponent(w)
    if exp == 0:
        return w.astype(np.float16).astype(np.float32)
    return (w * np.float32(2.0 ** exp)).astype(np.float16).astype(np.float32) * np.float32(2.0 ** -exp)


def correct_biases(model: ir.Model, names, means: dict, roundtrip=None, suffix: str = "fp16_bias") -> int:
    """Fold ``-dW · E[x patch]`` into the bias of each Conv/Gemm reading a weight of ``names``.

    ``roundtrip(w, node)``: the weight ``w`` of ``node`` as the layer will compute with it (default: its
    float16 round trip, whatever the node; then call before :func:`convert_to_fp16`, same ``names``), or
    None to leave the layer alone.  The new biases are named ``<node>_<suffix>``.  Returns the number of
    layers corrected.
    """
    graph = model.graph
    done = 0
    for wname, node in _consumers(model, names):
        mean = means.get(node.outputs[0].name)
        if mean is None:
            continue
        w = graph.initializers[wname].const_value.numpy().astype(np.float32)
        stored = _fp16_roundtrip(w) if roundtrip is None else roundtrip(w, node)
        if stored is None:
            continue
        dw = (stored - w).astype(np.float64)
        if (node.domain or "", node.op_type) in _CONV:
            group = int(irh.attr(node, "group", 1))
            o = w.shape[0]
            if mean.shape[0] != w.shape[1] * group or o % group:
                continue
            m = mean.reshape(group, w.shape[1], *mean.shape[1:])
            m = np.repeat(m, o // group, axis=0)  # [O, C/g, kh, kw]
            delta = (dw * m).sum(axis=(1, 2, 3))
            scale, bias_index = 1.0, 2
        else:
            trans_b = int(irh.attr(node, "transB", 0))
            b = dw.T if trans_b else dw  # [K, N]
            if mean.shape[0] != b.shape[0]:
                continue
            delta = mean @ b
            alpha, beta = float(irh.attr(node, "alpha", 1.0)), float(irh.attr(node, "beta", 1.0))
            if beta == 0.0:
                continue
            scale, bias_index = alpha / beta, 2
        n_out = delta.shape[0]
        old = node.inputs[bias_index] if len(node.inputs) > bias_index else None
        if old is None:
            bias = np.zeros(n_out, np.float32)
        else:
            if old.const_value is None or old.dtype != ir.DataType.FLOAT:
                continue
            bias = old.const_value.numpy().astype(np.float32)
            if bias.size != n_out and bias.size != 1:
                continue
            bias = np.broadcast_to(bias.reshape(-1), (n_out,)).astype(np.float32)
        new = (bias.astype(np.float64) - scale * delta).astype(np.float32)
        bname = f"{node.name or wname}_{suffix}"
        k = 0
        while bname in graph.initializers:
            k += 1
            bname = f"{node.name or wname}_{suffix}{k}"
        bv = ir.Value(name=bname, shape=ir.Shape(new.shape), type=ir.TensorType(ir.DataType.FLOAT),
                      const_value=ir.tensor(new, name=bname))
        graph.register_initializer(bv)
        if old is None and len(node.inputs) <= bias_index:
            node.resize_inputs(bias_index + 1)
        node.replace_input_with(bias_index, bv)
        if old is not None and not old.uses() and old.name in graph.initializers and old not in graph.outputs:
            graph.initializers.pop(old.name)
        done += 1
    return done
