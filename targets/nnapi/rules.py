"""NNAPI lowering rules: ONNX (and com.minirt) ops -> NNAPI operations, one rule per op family.

The rules form the :class:`targets.rules.RuleSet` :data:`RULES`; each emits
into a :class:`targets.nnapi.emitter.Lowerer` (``low``: operands, layouts,
activations, API-level checks) and binds the node's outputs.  A rule refuses by
raising :class:`Unsupported` with the reason, possibly half-way through: the
support question is answered by a trial lowering of the node alone
(``targets.nnapi.lower.node_support``), so the conditions live where the
operation is emitted.  Conventions (layouts, fused activations): the
docstring of ``targets/nnapi/lower.py`` and docs/nnapi.md.
"""
from __future__ import annotations

import math

import numpy as np

from minirt.builder.ir_helpers import attr
from minirt.targets.nnapi import oplevels as C
from minirt.targets.nnapi.emitter import MAX_RANK, TO_NHWC, Unsupported, fuse_code
from minirt.targets.nnapi.shapes import free_order, move_plan, slice_bounds, split_sizes
from minirt.targets.rules import MINIRT, RuleSet, fused_activation, input_at, same_pads, str_attr

RULES = RuleSet("NNAPI", missing="{op} has no NNAPI lowering", error=Unsupported)


# --- convolution ---------------------------------------------------------------------
def _conv_pads(node, in_hw, kernel, strides, dilations):
    """(top, left, bottom, right) of a 2-D conv / pool node, auto_pad resolved."""
    auto_pad = str_attr(node, "auto_pad", "NOTSET")
    if auto_pad in ("NOTSET", "", None):
        pads = list(attr(node, "pads", [0, 0, 0, 0]))
        return pads[0], pads[1], pads[2], pads[3]
    if auto_pad == "VALID":
        return 0, 0, 0, 0
    begins, ends = same_pads(in_hw, kernel, strides, dilations, upper=auto_pad == "SAME_UPPER")
    return begins[0], begins[1], ends[0], ends[1]


def _conv1d_window(node, length: int, kernel: int):
    """(strides, dilations, (top, left, bottom, right)) of a 1-D conv node lifted to a 2-D grid of
    height 1: unit stride and dilation along H, no padding along H (a kernel of height 1 needs none)."""
    stride = list(attr(node, "strides", [1]))
    dil = list(attr(node, "dilations", [1]))
    auto_pad = str_attr(node, "auto_pad", "NOTSET")
    if auto_pad in ("NOTSET", "", None):
        begin, end = list(attr(node, "pads", [0, 0]))
    elif auto_pad == "VALID":
        begin, end = 0, 0
    else:
        begins, ends = same_pads((length,), (kernel,), stride, dil, upper=auto_pad == "SAME_UPPER")
        begin, end = begins[0], ends[0]
    return [1] + stride, [1] + dil, (0, begin, 0, end)


def _conv(low, node, act="", params=(), z=None) -> None:
    X, W = node.inputs[0], node.inputs[1]
    B = node.inputs[2] if len(node.inputs) > 2 else None
    xs = low.shape(X)
    w = low.const_array(W, "the convolution weight").astype(np.float32)
    # A 1-D convolution (N, C, L) is the 2-D one over (N, C, 1, L): the input is reshaped (and laid out
    # NHWC) in front of the CONV_2D and its output brought back to (N, M, L') behind it.
    one_d = len(xs) == 3 and w.ndim == 3
    if one_d:
        xs = (xs[0], xs[1], 1, xs[2])
        w = w[:, :, None, :]
    elif len(xs) != 4:
        raise Unsupported(f"{node.op_type} on a rank-{len(xs)} input (NNAPI has 2-D convolution only)")
    if w.ndim != 4:
        raise Unsupported("convolution weight is not 4-D")
    group = int(attr(node, "group", 1))
    m_out, cin_g, kh, kw = w.shape
    if one_d:
        strides, dil, (top, left, bottom, right) = _conv1d_window(node, xs[3], kw)
    else:
        strides = list(attr(node, "strides", [1, 1]))
        dil = list(attr(node, "dilations", [1, 1]))
        top, left, bottom, right = _conv_pads(node, xs[2:], (kh, kw), strides, dil)
    bias = np.zeros(m_out, np.float32) if B is None else low.const_array(B, "the convolution bias").astype(
        np.float32).reshape(-1)
    fuse = C.FUSED_NONE
    post_scale = None
    if z is None:
        f = fuse_code(act, params)
        if f is not None:
            fuse, act = f, ""
        elif act == "HardSigmoid":
            alpha, beta = (list(params) + [0.2, 0.5])[:2]
            w = w * np.float32(6.0 * alpha)
            bias = bias * np.float32(6.0 * alpha) + np.float32(6.0 * beta)
            fuse, act, post_scale = C.FUSED_RELU6, "", 1.0 / 6.0
    if one_d:
        x = low.from_nchw(low.reshape(low.float_input(X), xs), xs)
    else:
        x = low.float_input(X)
    if group == 1:
        filt = w.transpose(0, 2, 3, 1)
        code = C.CONV_2D
    elif group == xs[1] and cin_g == 1:
        filt = w.transpose(1, 2, 3, 0)
        code = C.DEPTHWISE_CONV_2D
    else:
        # GROUPED_CONV_2D (API 29): the filter is [out, kh, kw, in / group] as CONV_2D's, group g's outputs
        # (out / group of them, in order) reading its in / group input channels
        if dil != [1, 1]:
            raise Unsupported(f"dilated grouped convolution (group={group}): NNAPI's GROUPED_CONV_2D has no dilation")
        if m_out % group or cin_g * group != xs[1]:
            raise Unsupported(f"grouped convolution: {m_out} outputs, {xs[1]} inputs do not split in {group} groups")
        filt = w.transpose(0, 2, 3, 1)
        code = C.GROUPED_CONV_2D
    Y = node.outputs[0]
    ys = low.shape(Y)
    ys4 = (ys[0], ys[1], 1, ys[2]) if one_d else ys
    out_dims = low.idims(ys4)
    last = act in ("", None) and z is None and post_scale is None and not one_d
    y = low.out_tensor(Y) if last else low.tmp(out_dims)
    ins = [x, low.m.const(np.ascontiguousarray(filt)), low.m.const(bias)]
    ins += [low.m.i32(left), low.m.i32(right), low.m.i32(top), low.m.i32(bottom),
            low.m.i32(strides[1]), low.m.i32(strides[0])]
    if code == C.DEPTHWISE_CONV_2D:
        ins.append(low.m.i32(m_out // xs[1]))
    if code == C.GROUPED_CONV_2D:
        ins.append(low.m.i32(group))
    ins.append(low.m.i32(fuse))
    if code == C.GROUPED_CONV_2D:
        ins.append(low.m.boolean(False))  # the layout operand (NHWC) is not optional here
    elif dil != [1, 1]:
        low.need("conv_dilation", "a dilated convolution")
        ins += [low.m.boolean(False), low.m.i32(dil[1]), low.m.i32(dil[0])]
    low.emit(code, ins, [y])
    if one_d:
        y = low.reshape(low.to_nchw(y, ys4), ys)
    if post_scale is not None:
        o = low.out_tensor(Y) if act in ("", None) else low.tmp(low.dims_of(y))
        low.emit(C.MUL, [y, low.scalar_const(post_scale, len(ys)), low.m.i32(C.FUSED_NONE)], [o])
        y = o
    _finish(low, Y, y, act, params, z)


def _finish(low, Y, y: int, act, params, z=None) -> None:
    """y (+ z) then the activation, into Y's operand."""
    rank = len(low.shape(Y))
    if z is not None:
        f = fuse_code(act, params)
        zz = low.broadcast_operand(z, rank)
        if f is not None:
            o = low.out_tensor(Y)
            low.emit(C.ADD, [y, zz, low.m.i32(f)], [o])
            low.bind(Y, o)
            return
        t = low.tmp(low.dims_of(y))
        low.emit(C.ADD, [y, zz, low.m.i32(C.FUSED_NONE)], [t])
        y = t
    if act in ("", None):
        low.bind(Y, y)
        return
    low.bind(Y, low.activation(y, act, params, low.out_tensor(Y)))


@RULES.rule("Conv")
@RULES.rule("FusedConv", domain=MINIRT)
def lower_conv(node, low):
    # plain Conv has neither activation attributes nor a 4th input: ("", []) and None
    _conv(low, node, *fused_activation(node), input_at(node, 3))


@RULES.rule("ConvTranspose")
@RULES.rule("FusedConvTranspose", domain=MINIRT)
def lower_conv_transpose(node, low):
    _conv_transpose(low, node, *fused_activation(node))


def _conv_transpose(low, node, act="", params=()):
    X, W = node.inputs[0], node.inputs[1]
    B = node.inputs[2] if len(node.inputs) > 2 else None
    xs = low.shape(X)
    if len(xs) != 4:
        raise Unsupported("ConvTranspose on a non-4-D input")
    if int(attr(node, "group", 1)) != 1:
        raise Unsupported("grouped ConvTranspose")
    if list(attr(node, "dilations", [1, 1])) != [1, 1]:
        raise Unsupported("dilated ConvTranspose")
    if any(attr(node, "output_padding", [0, 0]) or []):
        raise Unsupported("ConvTranspose with output_padding")
    if attr(node, "auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET", "VALID", b"VALID"):
        raise Unsupported("ConvTranspose with SAME auto_pad")
    if any(attr(node, "pads", [0, 0, 0, 0]) or []):
        raise Unsupported("ConvTranspose with padding (only VALID maps onto TFLite's TRANSPOSE_CONV)")
    w = low.const_array(W, "the ConvTranspose weight").astype(np.float32)  # [Cin, Cout, kh, kw]
    strides = list(attr(node, "strides", [1, 1]))
    Y = node.outputs[0]
    ys = low.shape(Y)
    if ys[2] != (xs[2] - 1) * strides[0] + w.shape[2] or ys[3] != (xs[3] - 1) * strides[1] + w.shape[3]:
        raise Unsupported("ConvTranspose output shape is not the VALID one")
    bias = np.zeros(w.shape[1], np.float32) if B is None else low.const_array(B, "the bias").astype(np.float32)
    filt = np.ascontiguousarray(w.transpose(1, 2, 3, 0))  # [Cout, kh, kw, Cin]
    fuse = fuse_code(act, params)  # Relu/Relu6/Relu1 ride on the op; others follow it
    direct = fuse is not None
    y = low.out_tensor(Y) if direct else low.tmp(low.idims(ys))
    ins = [low.float_input(X), low.m.const(filt), low.m.const(bias.reshape(-1)),
           low.m.i32(0), low.m.i32(0), low.m.i32(0), low.m.i32(0),
           low.m.i32(strides[1]), low.m.i32(strides[0]), low.m.i32(fuse if direct else C.FUSED_NONE),
           low.m.boolean(False)]
    low.emit(C.TRANSPOSE_CONV_2D, ins, [y])
    if direct:
        low.bind(Y, y)
    else:
        _finish(low, Y, y, act, params)


# --- fully connected -------------------------------------------------------------
def _fc(low, Y, a_op: int, a_shape, w: np.ndarray, bias: np.ndarray, act, params, z):
    """FULLY_CONNECTED of a rank-2 operand with weights [N, K]."""
    ys = low.shape(Y)
    fuse = C.FUSED_NONE
    f = fuse_code(act, params)
    if z is None and f is not None:
        fuse, act = f, ""
    direct = z is None and act in ("", None) and len(ys) == 2
    out2 = (a_shape[0], w.shape[0])
    y = low.out_tensor(Y) if direct else low.tmp(out2)
    low.emit(C.FULLY_CONNECTED, [a_op, low.m.const(np.ascontiguousarray(w, np.float32)),
                                  low.m.const(np.ascontiguousarray(bias, np.float32)), low.m.i32(fuse)], [y])
    if len(ys) != 2:
        y = low.from_nchw(low.reshape(y, ys), ys)
    if direct:
        low.bind(Y, y)
    else:
        _finish(low, Y, y, act, params, z)


def _gemm(low, node, act="", params=(), z=None):
    A, Bv = node.inputs[0], node.inputs[1]
    Cv = node.inputs[2] if len(node.inputs) > 2 else None
    trans_a = bool(int(attr(node, "transA", 0)))
    if low.ctx.const(Bv) is None:
        _gemm_runtime_b(low, node, trans_a, act, params, z)
        return
    b = low.const_array(Bv, "Gemm's B").astype(np.float32)
    alpha, beta = float(attr(node, "alpha", 1.0)), float(attr(node, "beta", 1.0))
    w = b if int(attr(node, "transB", 0)) else b.T
    w = w * np.float32(alpha)
    n = w.shape[0]
    if Cv is None:
        bias = np.zeros(n, np.float32)
    else:
        c = low.const_array(Cv, "Gemm's C").astype(np.float32) * np.float32(beta)
        if c.size == 1:
            bias = np.full(n, c.reshape(-1)[0], np.float32)
        elif c.shape[-1] == n and c.size == n:
            bias = c.reshape(n)
        else:
            raise Unsupported("Gemm's C does not broadcast along rows (NNAPI's bias is one row)")
    a_shape = low.shape(A)
    if trans_a:
        # FULLY_CONNECTED multiplies the rows of its input: A^T's rows come from a TRANSPOSE (API 28)
        a_op = low.transpose(low.float_input(A), (1, 0))
        a_shape = (a_shape[1], a_shape[0])
    elif id(A) in low.lazy_flat:  # flatten of NHWC data: permute the weight columns to (H, W, C) order
        src = low.lazy_flat[id(A)]
        n_, c_, h_, w_ = low.shape(src)
        w = np.ascontiguousarray(w.reshape(n, c_, h_, w_).transpose(0, 2, 3, 1).reshape(n, -1))
        a_op = low.reshape(low.inp(src), a_shape)
    else:
        a_op = low.float_input(A)
    _fc(low, node.outputs[0], a_op, a_shape, w, bias, act, params, z)


def _gemm_runtime_b(low, node, trans_a: bool, act, params, z):
    """Gemm whose B is computed at run time: BATCH_MATMUL of the two rank-2 operands (API 33), its
    adj_x / adj_y flags carrying transA / transB, then alpha (MUL) and beta * C (ADD)."""
    A, Bv, Y = node.inputs[0], node.inputs[1], node.outputs[0]
    Cv = input_at(node, 2)
    alpha, beta = float(attr(node, "alpha", 1.0)), float(attr(node, "beta", 1.0))
    ys = low.shape(Y)
    y = low.tmp(ys)
    low.emit(C.BATCH_MATMUL, [low.float_input(A), low.float_input(Bv), low.m.boolean(trans_a),
                              low.m.boolean(bool(int(attr(node, "transB", 0))))], [y])
    if alpha != 1.0:
        scaled = low.tmp(ys)
        low.emit(C.MUL, [y, low.scalar_const(alpha, 2), low.m.i32(C.FUSED_NONE)], [scaled])
        y = scaled
    if Cv is not None and beta != 0.0:
        c = low.ctx.const(Cv)
        if c is not None:
            cc = np.asarray(c, np.float32) * np.float32(beta)
            c_op = low.m.const(np.ascontiguousarray(cc.reshape((1,) * (2 - cc.ndim) + cc.shape)))
        elif beta == 1.0:
            c_op = low.broadcast_operand(Cv, 2)
        else:
            raise Unsupported("Gemm with a run-time C and beta != 1")
        biased = low.tmp(ys)
        low.emit(C.ADD, [y, c_op, low.m.i32(C.FUSED_NONE)], [biased])
        y = biased
    _finish(low, Y, y, act, params, z)


@RULES.rule("Gemm")
@RULES.rule("FusedGemm", domain=MINIRT)
def lower_gemm(node, low):
    _gemm(low, node, *fused_activation(node), input_at(node, 3))


def _matmul(low, node, act="", params=(), bias_v=None, z=None):
    A, Bv = node.inputs[0], node.inputs[1]
    a_shape, b_shape = low.shape(A), low.shape(Bv)
    Y = node.outputs[0]
    bconst = low.ctx.const(Bv)
    if len(a_shape) < 2 or len(b_shape) < 2:
        raise Unsupported("MatMul of a vector (rank-1 operand)")
    zc = None if z is None else low.ctx.const(z)
    if bias_v is None and zc is not None and np.asarray(zc).ndim <= 1 and np.asarray(zc).size in (1, b_shape[-1]):
        # a constant Z of one row is a bias: both are added before the activation (docs/fused_ops.md)
        bias_v, z = z, None
    # B without batch (rank 2, or leading dims of 1): one matrix that every row of A meets
    b_one_matrix = all(d == 1 for d in b_shape[:-2])
    if bconst is not None and b_one_matrix:
        w = np.asarray(bconst, np.float32).reshape(b_shape[-2:]).T
        bias = np.zeros(w.shape[0], np.float32)
        if bias_v is not None:
            bias = low.const_array(bias_v, "FusedMatMul's bias").astype(np.float32)
            if bias.size == 1:
                bias = np.full(w.shape[0], bias.reshape(-1)[0], np.float32)
            elif bias.size != w.shape[0]:
                raise Unsupported("MatMul bias is not one row")
            bias = bias.reshape(-1)
        a = low.nchw(A) if len(a_shape) == 4 else low.float_input(A)
        rows = int(np.prod(a_shape[:-1]))
        a2 = low.reshape(a, (rows, a_shape[-1]))
        _fc(low, Y, a2, (rows, a_shape[-1]), w, bias, act, params, z)
        return
    ys = low.shape(Y)
    a = low.nchw(A) if len(a_shape) == 4 else low.float_input(A)
    b = low.nchw(Bv) if len(b_shape) == 4 else low.float_input(Bv)
    if b_one_matrix and len(b_shape) <= len(a_shape):
        # NNAPI's BATCH_MATMUL does not broadcast: A's batch folds into its rows instead, a rank-2 product
        rows = int(np.prod(a_shape[:-1]))
        y2 = low.tmp((rows, b_shape[-1]))
        low.emit(C.BATCH_MATMUL, [low.reshape(a, (rows, a_shape[-1])), low.reshape(b, b_shape[-2:]),
                                  low.m.boolean(False), low.m.boolean(False)], [y2])
        y = low.reshape(y2, ys)
    elif len(a_shape) == len(b_shape) and a_shape[:-2] == b_shape[:-2]:
        y = low.tmp(ys)
        low.emit(C.BATCH_MATMUL, [a, b, low.m.boolean(False), low.m.boolean(False)], [y])
    else:
        raise Unsupported("MatMul with broadcast batch dimensions (NNAPI's BATCH_MATMUL takes equal batches)")
    y = low.from_nchw(y, ys)
    if bias_v is not None:
        biased = low.tmp(low.dims_of(y))
        low.emit(C.ADD, [y, low.broadcast_operand(bias_v, len(ys)), low.m.i32(C.FUSED_NONE)], [biased])
        y = biased
    _finish(low, Y, y, act, params, z)


@RULES.rule("MatMul")
@RULES.rule("FusedMatMul", domain=MINIRT)
def lower_matmul(node, low):
    _matmul(low, node, *fused_activation(node), input_at(node, 2), input_at(node, 3))


# --- pooling ---------------------------------------------------------------------------
def _pool(low, node, code):
    X = node.inputs[0]
    xs = low.shape(X)
    if len(xs) != 4:
        raise Unsupported(f"{node.op_type} on a rank-{len(xs)} input (NNAPI pools 2-D)")
    if len(node.outputs) > 1 and node.outputs[1] is not None and node.outputs[1].name:
        raise Unsupported("MaxPool with an Indices output")
    kernel = list(attr(node, "kernel_shape"))
    strides = list(attr(node, "strides", [1, 1]))
    if list(attr(node, "dilations", [1, 1]) or [1, 1]) != [1, 1]:
        raise Unsupported("dilated pooling")
    top, left, bottom, right = _conv_pads(node, xs[2:], kernel, strides, [1, 1])
    Y = node.outputs[0]
    ys = low.shape(Y)
    # ceil_mode (and any rounding) : grow the end padding until the floor formula gives ONNX's size
    pads_end = [bottom, right]
    for i, (b, k, s) in enumerate(zip((top, left), kernel, strides)):
        while (xs[2 + i] + b + pads_end[i] - k) // s + 1 < ys[2 + i]:
            pads_end[i] += 1
    grown = pads_end != [bottom, right]
    bottom, right = pads_end
    x = low.float_input(X)
    include_pad = code == C.AVERAGE_POOL_2D and int(attr(node, "count_include_pad", 0))
    if include_pad and grown:
        raise Unsupported("AveragePool counting its padding with ceil_mode (ONNX counts only up to the pads)")
    if code == C.AVERAGE_POOL_2D and any((top, left, bottom, right)) and (
            include_pad or not _same_padding(xs[2:], kernel, strides, (top, left, bottom, right))):
        _average_pool_padded(low, node, x, xs, ys, kernel, strides, (top, left, bottom, right))
        return
    y = low.out_tensor(Y)
    low.emit(code, _pool_inputs(low, x, (top, left, bottom, right), strides, kernel), [y])
    low.bind(Y, y)


def _pool_inputs(low, x: int, pads, strides, kernel) -> list:
    """The operands of an explicit-padding AVERAGE_POOL_2D / MAX_POOL_2D: input, pads (left, right,
    top, bottom), strides and filter (width, height), no fused activation."""
    top, left, bottom, right = pads
    return [x, low.m.i32(left), low.m.i32(right), low.m.i32(top), low.m.i32(bottom), low.m.i32(strides[1]),
            low.m.i32(strides[0]), low.m.i32(kernel[1]), low.m.i32(kernel[0]), low.m.i32(C.FUSED_NONE)]


def _average_pool_padded(low, node, x, xs, ys, kernel, strides, pads) -> None:
    """AveragePool whose padding NNAPI's pool cannot say (padding counted, or not TFLite's SAME): the
    zero-padded input (PAD) pooled without padding, which averages over whole windows (ONNX's
    count_include_pad=1), times the constant map window size / elements inside (count_include_pad=0).
    Every operation is TFLite's too, so the translation checks it."""
    top, left, bottom, right = pads
    padded_dims = [xs[0], xs[2] + top + bottom, xs[3] + left + right, xs[1]]
    padded = low.tmp(padded_dims)
    low.emit(C.PAD, [x, low.m.const(np.array([[0, 0], [top, bottom], [left, right], [0, 0]], np.int32))], [padded])
    Y = node.outputs[0]
    y = low.out_tensor(Y)
    whole = y if int(attr(node, "count_include_pad", 0)) else low.tmp(low.dims_of(y))
    low.emit(C.AVERAGE_POOL_2D, _pool_inputs(low, padded, (0, 0, 0, 0), strides, kernel), [whole])
    if whole != y:
        counts = [np.minimum(np.arange(n) * s - b + k, size) - np.maximum(np.arange(n) * s - b, 0)
                  for n, s, b, k, size in zip(ys[2:], strides, (top, left), kernel, xs[2:])]
        scale = (kernel[0] * kernel[1]) / np.outer(counts[0], counts[1]).astype(np.float64)
        low.emit(C.MUL, [whole, low.m.const(scale.astype(np.float32).reshape(1, ys[2], ys[3], 1)), low.m.i32(0)],
                 [y])
    low.bind(Y, y)


@RULES.rule("MaxPool", "AveragePool")
def lower_pool(node, low):
    _pool(low, node, C.MAX_POOL_2D if node.op_type == "MaxPool" else C.AVERAGE_POOL_2D)


def _global_pool(low, node, code):
    X = node.inputs[0]
    xs = low.shape(X)
    if len(xs) == 3:
        # (N, C, L): a reduction of the last axis, dims kept (MEAN: API 28, REDUCE_MAX: API 29)
        Y = node.outputs[0]
        y = low.out_tensor(Y)
        reduce_code = C.MEAN if code == C.AVERAGE_POOL_2D else C.REDUCE_MAX
        keep_op = low.m.i32(1) if reduce_code == C.MEAN else low.m.boolean(True)
        low.emit(reduce_code, [low.float_input(X), low.m.const(np.array([2], np.int32)), keep_op], [y])
        low.bind(Y, y)
        return
    if len(xs) != 4:
        raise Unsupported(f"{node.op_type} on a rank-{len(xs)} input")
    Y = node.outputs[0]
    y = low.out_tensor(Y)
    ins = [low.float_input(X)] + [low.m.i32(0)] * 4 + [low.m.i32(1), low.m.i32(1), low.m.i32(xs[3]),
                                                         low.m.i32(xs[2]), low.m.i32(C.FUSED_NONE)]
    low.emit(code, ins, [y])
    low.bind(Y, y)


@RULES.rule("GlobalAveragePool", "GlobalMaxPool")
def lower_global_pool(node, low):
    _global_pool(low, node, C.AVERAGE_POOL_2D if node.op_type == "GlobalAveragePool" else C.MAX_POOL_2D)


_REDUCE = {"ReduceMean": C.MEAN, "ReduceSum": C.REDUCE_SUM, "ReduceMax": C.REDUCE_MAX}


@RULES.rule(*_REDUCE)
def lower_reduce(node, low):
    """MEAN (API 28), REDUCE_SUM / REDUCE_MAX (API 29) over the node's axes (attribute, or input 1 from
    opset 13 / 18).  MEAN's keep_dims operand is an INT32, the REDUCE_* ones' a BOOL."""
    X, Y = node.inputs[0], node.outputs[0]
    xs = low.shape(X)
    axes = attr(node, "axes")
    if axes is None and input_at(node, 1) is not None and node.inputs[1].name:
        axes = low.const_array(node.inputs[1], f"{node.op_type}'s axes").reshape(-1).tolist()
    if axes is None or len(axes) == 0:
        if int(attr(node, "noop_with_empty_axes", 0)):
            lower_identity(node, low)  # no axes and noop_with_empty_axes: the input itself
            return
        axes = list(range(len(xs)))
    keep = int(attr(node, "keepdims", 1))
    axes = sorted(a % len(xs) for a in axes)
    if not keep and len(xs) == 4:
        x = low.nchw(X)
        iax = axes
    else:
        x = low.float_input(X)
        iax = sorted(low.axis_map(a, len(xs)) for a in axes)
    ys = low.shape(Y)
    if not ys:
        raise Unsupported(f"{node.op_type} to a rank-0 tensor (NNAPI tensors have rank 1 to 4)")
    code = _REDUCE[node.op_type]
    y = low.out_tensor(Y) if (keep or len(ys) != 4) else low.tmp(ys)
    keep_op = low.m.i32(keep) if code == C.MEAN else low.m.boolean(bool(keep))
    low.emit(code, [x, low.m.const(np.array(iax, np.int32)), keep_op], [y])
    if not keep and len(ys) == 4:
        y = low.from_nchw(y, ys)
    low.bind(Y, y)


# --- elementwise -------------------------------------------------------------------------
def _binary(low, node, code):
    A, B = node.inputs[0], node.inputs[1]
    Y = node.outputs[0]
    r = len(low.shape(Y))
    for v in (A, B):
        if low.tensor_type(v) != C.TENSOR_FLOAT32:
            raise Unsupported(f"{node.op_type} on {low.ctx.dtype(v)} (NNAPI lowering: float32)")
    if code == C.SUB and low.level < C.MIN_API_LEVEL[C.SUB] and low.ctx.const(B) is not None:
        code, b = C.ADD, _neg_const(low, B, r, lambda c: -c)
    elif code == C.DIV and low.level < C.MIN_API_LEVEL[C.DIV] and low.ctx.const(B) is not None:
        code, b = C.MUL, _neg_const(low, B, r, lambda c: 1.0 / c)
    else:
        b = low.broadcast_operand(B, r)
    a = low.broadcast_operand(A, r)
    y = low.out_tensor(Y)
    ins = [a, b] + ([low.m.i32(C.FUSED_NONE)] if code in (C.ADD, C.SUB, C.MUL, C.DIV) else [])
    low.emit(code, ins, [y])
    low.bind(Y, y)


def _neg_const(low, v, rank, fn):
    a = np.asarray(low.ctx.const(v), np.float32)
    a = fn(a).astype(np.float32).reshape((1,) * (rank - a.ndim) + a.shape)
    if rank == 4:
        a = a.transpose(TO_NHWC)
    return low.m.const(np.ascontiguousarray(a))


_BINARY = {"Add": C.ADD, "Sub": C.SUB, "Mul": C.MUL, "Div": C.DIV, "Max": C.MAXIMUM, "Min": C.MINIMUM}


@RULES.rule(*_BINARY)
def lower_binary(node, low):
    if node.op_type in ("Max", "Min") and len(node.inputs) != 2:  # variadic in ONNX
        raise Unsupported(f"{node.op_type} of more than two inputs")
    _binary(low, node, _BINARY[node.op_type])


@RULES.rule("PRelu")
def lower_prelu(node, low):
    X, S, Y = node.inputs[0], node.inputs[1], node.outputs[0]
    r = len(low.shape(Y))
    y = low.out_tensor(Y)
    low.emit(C.PRELU, [low.float_input(X), low.broadcast_operand(S, r)], [y])
    low.bind(Y, y)


def _unary(low, node, code):
    X, Y = node.inputs[0], node.outputs[0]
    y = low.out_tensor(Y)
    low.emit(code, [low.float_input(X)], [y])
    low.bind(Y, y)


_UNARY = {"Relu": C.RELU, "Sigmoid": C.LOGISTIC, "Tanh": C.TANH, "Abs": C.ABS, "Exp": C.EXP, "Log": C.LOG,
          "Neg": C.NEG, "Sqrt": C.SQRT, "Floor": C.FLOOR}


@RULES.rule(*_UNARY)
def lower_unary(node, low):
    _unary(low, node, _UNARY[node.op_type])


@RULES.rule("Reciprocal")
def lower_reciprocal(node, low):
    X, Y = node.inputs[0], node.outputs[0]
    r = len(low.shape(Y))
    y = low.out_tensor(Y)
    low.emit(C.DIV, [low.scalar_const(1.0, r), low.float_input(X), low.m.i32(C.FUSED_NONE)], [y])  # 1 / x
    low.bind(Y, y)


@RULES.rule("Pow")
def lower_pow(node, low):
    """x ** e: a constant scalar e of a common form is exact elementwise arithmetic (x^2 MUL, x^3 two MULs,
    x^0.5 SQRT, x^-0.5 RSQRT, x^-1 DIV, x^1 the input); any other exponent is POW (API 29), whose
    result for a negative base is NaN as ONNX's (and C's) is for a non-integer exponent."""
    X, E, Y = node.inputs[0], node.inputs[1], node.outputs[0]
    r = len(low.shape(Y))
    e = low.ctx.const(E)
    if e is None and low.tensor_type(E) != C.TENSOR_FLOAT32:
        raise Unsupported("Pow with a run-time integer exponent")
    x = low.float_input(X)
    y = low.out_tensor(Y)
    if e is not None and np.asarray(e).size == 1 and len(low.shape(X)) == r:
        k = float(np.asarray(e).reshape(-1)[0])
        none = low.m.i32(C.FUSED_NONE)
        if k == 1.0:
            low.emit(C.RESHAPE, [x, low.m.const(np.array(low.dims_of(x), np.int32))], [y])
        elif k == 2.0:
            low.emit(C.MUL, [x, x, none], [y])
        elif k == 3.0:
            sq = low.tmp(low.dims_of(x))
            low.emit(C.MUL, [x, x, none], [sq])
            low.emit(C.MUL, [sq, x, none], [y])
        elif k == 0.5:
            low.emit(C.SQRT, [x], [y])
        elif k == -0.5:
            low.emit(C.RSQRT, [x], [y])
        elif k == -1.0:
            low.emit(C.DIV, [low.scalar_const(1.0, r), x, none], [y])
        else:
            low.emit(C.POW, [x, low.scalar_const(k, r)], [y])
        low.bind(Y, y)
        return
    low.emit(C.POW, [low.broadcast_operand(X, r), low.broadcast_operand(E, r)], [y])
    low.bind(Y, y)


def _act_node(low, node, act, params):
    X, Y = node.inputs[0], node.outputs[0]
    low.bind(Y, low.activation(low.float_input(X), act, params, low.out_tensor(Y)))


@RULES.rule("HardSwish")
def lower_hard_swish(node, low):
    _act_node(low, node, "HardSwish", [])


@RULES.rule("HardSigmoid")
def lower_hard_sigmoid(node, low):
    _act_node(low, node, "HardSigmoid", [float(attr(node, "alpha", 0.2)), float(attr(node, "beta", 0.5))])


@RULES.rule("LeakyRelu")
def lower_leaky_relu(node, low):
    _act_node(low, node, "LeakyRelu", [float(attr(node, "alpha", 0.01))])


@RULES.rule("Gelu")
def lower_gelu(node, low):
    approximate = str_attr(node, "approximate", "none")
    if approximate not in ("none", "tanh"):
        raise Unsupported(f"Gelu with approximate={approximate!r}")
    _act_node(low, node, "GeluTanh" if approximate == "tanh" else "Gelu", [])


@RULES.rule("Clip")
def lower_clip(node, low):
    lo, hi = attr(node, "min", -math.inf), attr(node, "max", math.inf)
    if input_at(node, 1) is not None:
        lo = float(low.const_array(node.inputs[1], "Clip's min").reshape(-1)[0])
    if input_at(node, 2) is not None:
        hi = float(low.const_array(node.inputs[2], "Clip's max").reshape(-1)[0])
    _act_node(low, node, "Clip", [lo, hi])


@RULES.rule("Activation", domain=MINIRT)
def lower_activation(node, low):
    _act_node(low, node, *fused_activation(node))


@RULES.rule("Elu")
def lower_elu(node, low):
    raise Unsupported("Elu (TFLite's ELU has no alpha; NNAPI's needs API 30)")


@RULES.rule("ConstantOfShape")
def lower_constant_of_shape(node, low):
    # A constant to the model (SupportContext.const fills it): a constant operand, which readers that
    # take constants (conv / fully-connected weights) do not even use (the model prunes it then).
    Y = node.outputs[0]
    low.const_array(Y, "ConstantOfShape's result (a run-time shape)")
    low.bind(Y, low.inp(Y))


@RULES.rule("Identity")
def lower_identity(node, low):
    X, Y = node.inputs[0], node.outputs[0]
    low.tensor_type(X)
    low.bind(Y, low.inp(X))


@RULES.rule("Dropout")
def lower_dropout(node, low):
    if len(node.outputs) > 1 and node.outputs[1] is not None and node.outputs[1].name:
        raise Unsupported("Dropout with a mask output")
    for v in node.inputs[1:]:
        if v is not None and low.ctx.const(v) is None:
            raise Unsupported("Dropout with a run-time ratio / training_mode")
    if len(node.inputs) > 2 and node.inputs[2] is not None and bool(np.asarray(low.ctx.const(node.inputs[2]))):
        raise Unsupported("Dropout in training mode")
    lower_identity(node, low)


@RULES.rule("BatchNormalization")
def lower_batch_normalization(node, low):
    if len([o for o in node.outputs if o is not None and o.name]) > 1 or int(attr(node, "training_mode", 0)):
        raise Unsupported("BatchNormalization in training mode")
    X, Y = node.inputs[0], node.outputs[0]
    xs = low.shape(X)
    g, b, mean, var = (low.const_array(v, "BatchNormalization's parameters").astype(np.float64)
                       for v in node.inputs[1:5])
    eps = float(attr(node, "epsilon", 1e-5))
    scale = g / np.sqrt(var + eps)
    shift = b - mean * scale
    if len(xs) == 4:
        shape = (scale.size,)
    else:
        shape = (scale.size,) + (1,) * (len(xs) - 2)
    t = low.tmp(low.idims(xs))
    x = low.float_input(X)
    low.emit(C.MUL, [x, low.m.const(scale.astype(np.float32).reshape(shape)), low.m.i32(0)], [t])
    y = low.out_tensor(Y)
    low.emit(C.ADD, [t, low.m.const(shift.astype(np.float32).reshape(shape)), low.m.i32(0)], [y])
    low.bind(Y, y)


@RULES.rule("LRN")
def lower_lrn(node, low):
    # ONNX: y = x / (bias + alpha / size * sum of x^2 over channels [c - (size-1)/2, c + (size-1)/2])^beta;
    # NNAPI (along the depth, NHWC's last axis): y = x / (bias + alpha' * sum over [d - r, d + r])^beta,
    # so r = (size - 1) / 2 and alpha' = alpha / size.  An even size has a lopsided window: not lowered.
    X, Y = node.inputs[0], node.outputs[0]
    if len(low.shape(X)) != 4:
        raise Unsupported(f"LRN on a rank-{len(low.shape(X))} input (NNAPI normalizes rank-4 NHWC depth)")
    size = int(attr(node, "size"))
    if size % 2 == 0:
        raise Unsupported(f"LRN of even size {size} (its channel window is not centred)")
    alpha, beta, bias = (float(attr(node, k, d)) for k, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    y = low.out_tensor(Y)
    low.emit(C.LOCAL_RESPONSE_NORMALIZATION, [low.float_input(X), low.m.i32((size - 1) // 2), low.m.f32(bias),
                                              low.m.f32(alpha / size), low.m.f32(beta)], [y])
    low.bind(Y, y)


def _axis_attribute(node, rank: int, default: int) -> int:
    """The node's ``axis`` attribute made non-negative, or Unsupported when it is outside [-rank, rank)."""
    axis = int(attr(node, "axis", default))
    if not -rank <= axis < rank:
        raise Unsupported(f"{node.op_type} axis {axis} of a rank-{rank} tensor")
    return axis % rank


@RULES.rule("LayerNormalization")
@RULES.rule("LayerNormalization", domain=MINIRT)
def lower_layer_normalization(node, low):
    """(x - mean) * rsqrt(var + eps) * scale + bias over the axes from ``axis`` on.

    NNAPI has no layer norm: MEAN (API 28) with kept dims, SUB, MUL, MEAN, ADD, RSQRT (API 29),
    MUL, then the scale (MUL) and bias (ADD), both broadcast from the trailing axes.  The
    variance is the mean of the squared centred values (two passes, as onnxruntime computes it),
    not E[x^2] - E[x]^2, which cancels in float32.
    """
    if any(o is not None and o.name and (o.uses() or o.is_graph_output()) for o in node.outputs[1:]):
        raise Unsupported("LayerNormalization's Mean / InvStdDev outputs")
    X = node.inputs[0]
    r = len(low.shape(X))
    axis = _axis_attribute(node, r, -1)
    scale, bias = input_at(node, 1), input_at(node, 2)
    affine = [(C.MUL, low.broadcast_operand(scale, r))] if scale is not None and scale.name else []
    if bias is not None and bias.name:
        affine.append((C.ADD, low.broadcast_operand(bias, r)))
    _normalize(low, X, node.outputs[0], range(axis, r), float(attr(node, "epsilon", 1e-5)), affine)


@RULES.rule("InstanceNormalization")
def lower_instance_normalization(node, low):
    """LayerNormalization's two-pass form over the spatial axes (2..) of each sample and channel, then
    the per-channel scale and bias (constants laid out along the channel axis)."""
    X = node.inputs[0]
    xs = low.shape(X)
    r = len(xs)
    if r < 3:
        raise Unsupported(f"InstanceNormalization of a rank-{r} tensor")
    affine = []
    for code, v in ((C.MUL, node.inputs[1]), (C.ADD, node.inputs[2])):
        a = low.const_array(v, "InstanceNormalization's scale / bias").astype(np.float32).reshape((1, xs[1]) + (1,) * (r - 2))
        affine.append((code, low.m.const(np.ascontiguousarray(a.transpose(TO_NHWC) if r == 4 else a))))
    _normalize(low, X, node.outputs[0], range(2, r), float(attr(node, "epsilon", 1e-5)), affine)


def _normalize(low, X, Y, axes, eps: float, affine) -> None:
    """Y = (X - mean) * rsqrt(var + eps) then ``affine`` ((MUL / ADD, operand) in turn), the mean and
    variance over ONNX axes ``axes`` (kept as unit dims): MEAN (API 28), SUB, MUL, MEAN, ADD, RSQRT (API 29),
    MUL.  The variance is the mean of the squared centred values (two passes, as onnxruntime computes
    it), not E[x^2] - E[x]^2, which cancels in float32."""
    r = len(low.shape(X))
    x = low.float_input(X)
    dims = low.dims_of(x)
    iaxes = sorted(low.axis_map(a, r) for a in axes)  # rank 4: the NHWC positions of those axes
    reduced = tuple(1 if j in iaxes else d for j, d in enumerate(dims))
    axes_op = low.m.const(np.array(iaxes, np.int32))
    none = low.m.i32(C.FUSED_NONE)

    def op(code, ins, out_dims):
        out = low.tmp(out_dims)
        low.emit(code, ins, [out])
        return out

    mean = op(C.MEAN, [x, axes_op, low.m.i32(1)], reduced)
    centred = op(C.SUB, [x, mean, none], dims)
    var = op(C.MEAN, [op(C.MUL, [centred, centred, none], dims), axes_op, low.m.i32(1)], reduced)
    inv_std = op(C.RSQRT, [op(C.ADD, [var, low.scalar_const(eps, r), none], reduced)], reduced)
    steps = [(C.MUL, inv_std)] + list(affine)
    y = centred
    for n, (code, operand) in enumerate(steps):
        out = low.out_tensor(Y) if n == len(steps) - 1 else low.tmp(dims)
        low.emit(code, [y, operand, none], [out])
        y = out
    low.bind(Y, y)


# --- softmax -------------------------------------------------------------------------------
@RULES.rule("Softmax")
def lower_softmax(node, low):
    X, Y = node.inputs[0], node.outputs[0]
    xs = low.shape(X)
    r = len(xs)
    opset = low.ctx.opset(node)
    axis = int(attr(node, "axis", -1 if opset >= 13 else 1)) % r
    if opset < 13 and int(np.prod(xs[axis + 1:], dtype=np.int64)) != 1 and axis != r - 1:
        raise Unsupported(f"Softmax (opset {opset}) over the flattened axes {axis}..{r - 1}")
    if opset < 13 and axis != r - 1:
        # softmax over [axis:] where the trailing dims are 1 == softmax over axis alone
        pass
    iaxis = low.axis_map(axis, r)
    if r not in (2, 4):
        low.need("rank_1_3_softmax", f"Softmax on a rank-{r} tensor")
    x = low.float_input(X)
    y = low.out_tensor(Y)
    if iaxis == r - 1:
        low.emit(C.SOFTMAX, [x, low.m.f32(1.0)], [y])
    elif low.level >= C.FEATURE_API_LEVEL["softmax_axis"]:
        # another axis (ONNX's last of a rank-4 tensor is W, NHWC's axis 2: attention scores): API 29's
        # axis operand softmaxes along it in place
        low.need("softmax_axis", "Softmax over an axis other than the last")
        low.emit(C.SOFTMAX, [x, low.m.f32(1.0), low.m.i32(iaxis)], [y])
    else:
        # API 27-28 softmax along the last axis only: move the axis last and back (TRANSPOSE: API 28)
        perm = [j for j in range(r) if j != iaxis] + [iaxis]
        moved = low.transpose(x, perm)
        s = low.tmp(low.dims_of(moved))
        low.emit(C.SOFTMAX, [moved, low.m.f32(1.0)], [s])
        low.emit(C.TRANSPOSE, [s, low.m.const(np.array([perm.index(j) for j in range(r)], np.int32))], [y])
    low.bind(Y, y)


@RULES.rule("LogSoftmax")
def lower_log_softmax(node, low):
    """LOG_SOFTMAX (API 29) along the node's axis (opset < 13: the flattened trailing axes, taken when
    they are one axis); its axis operand takes any axis, the TFLite translation moves it last."""
    X, Y = node.inputs[0], node.outputs[0]
    xs = low.shape(X)
    r = len(xs)
    opset = low.ctx.opset(node)
    axis = int(attr(node, "axis", -1 if opset >= 13 else 1)) % r
    if opset < 13 and axis != r - 1 and int(np.prod(xs[axis + 1:], dtype=np.int64)) != 1:
        raise Unsupported(f"LogSoftmax (opset {opset}) over the flattened axes {axis}..{r - 1}")
    y = low.out_tensor(Y)
    low.emit(C.LOG_SOFTMAX, [low.float_input(X), low.m.f32(1.0), low.m.i32(low.axis_map(axis, r))], [y])
    low.bind(Y, y)


# --- shape manipulation ----------------------------------------------------------------------
def _move(low, x: int, in_shape, in_order, out_shape, out_order, out_dims, perm=None) -> int | None:
    """Operand ``x`` (a value of ``in_shape`` stored in ``in_order``) reshaped (or, with ``perm``,
    transposed) to ``out_shape`` stored in ``out_order``, as an operand of ``out_dims``: at most one
    TRANSPOSE, on the merged atoms (``shapes.move_plan``).  None when the shapes share no atoms, or when
    the TRANSPOSE would have rank > 4 (NNAPI's and TFLite's limit)."""
    plan = move_plan(in_shape, in_order, out_shape, out_order, perm)
    if plan is None:
        return None
    dims, q = plan
    if q == sorted(q):  # the elements stay in order: a reshape
        return low.reshape(x, out_dims)
    if len(q) > MAX_RANK:
        return None
    return low.reshape(low.transpose(low.reshape(x, dims), q), out_dims)


def _stored_order(rank: int, free=None) -> tuple:
    """The stored order of a result of rank ``rank``: NHWC for rank 4, ``free`` (or the identity) above
    rank 4, the identity below."""
    if rank == 4:
        return TO_NHWC
    if rank > MAX_RANK and free is not None:
        return tuple(free)
    return tuple(range(rank))


def _reshape_to(low, X, Y) -> None:
    """Y = X reshaped (Reshape, Flatten, Squeeze, Unsqueeze): one RESHAPE when the elements keep their
    stored order, else one TRANSPOSE of merged axes between RESHAPEs (``_move``); a result of rank > 4
    takes the stored order that moves nothing when one does (a channel shuffle's split of the NHWC channel
    axis stays where NHWC put it)."""
    xs, ys = low.shape(X, any_rank=True), low.shape(Y, any_rank=True)
    if low.tensor_type(X) != C.TENSOR_FLOAT32:
        raise Unsupported("reshape of a non-float32 tensor")
    if len(xs) == 4 and not low.trivial(xs) and ys == (xs[0], xs[1] * xs[2] * xs[3]) and id(X) in low.vals:
        low.lazy_flat[id(Y)] = X
        return
    x, x_order = low.inp(X), low.order(X)
    out_order = _stored_order(len(ys), free_order(xs, x_order, ys))
    y = _move(low, x, xs, x_order, ys, out_order, low.stored_dims(Y, out_order))
    if y is None:
        # no common refinement of the shapes (or a rank-5 transpose): through ONNX's order
        flat = _move(low, x, xs, x_order, xs, tuple(range(len(xs))), (int(np.prod(xs)),), perm=tuple(range(len(xs))))
        y = None if flat is None else _move(low, flat, ys, tuple(range(len(ys))), ys, out_order,
                                            low.stored_dims(Y, out_order))
    if y is None:
        raise Unsupported(f"{list(xs)} -> {list(ys)} reshape would need a transpose of rank > 4")
    low.bind_stored(Y, y, out_order)


@RULES.rule("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def lower_reshape(node, low):
    _reshape_to(low, node.inputs[0], node.outputs[0])


@RULES.rule("Transpose")
def lower_transpose(node, low):
    """A result of rank > 4 is X's stored operand itself in a relabelled order (no operation); a result of
    rank <= 4 is one TRANSPOSE of merged axes from X's stored order to its own (``_move``)."""
    X, Y = node.inputs[0], node.outputs[0]
    xs = low.shape(X, any_rank=True)
    r = len(xs)
    perm = [int(p) for p in attr(node, "perm", list(range(r))[::-1])]
    if sorted(perm) != list(range(r)):
        raise Unsupported(f"Transpose perm {perm} of a rank-{r} tensor")
    x, x_order = low.float_input(X), low.order(X)
    ys = low.shape(Y, any_rank=True)
    # Y stored as X is when Y's axis perm.index(b) sits where X's axis b sits (free above rank 4)
    out_order = _stored_order(r, [perm.index(b) for b in x_order])
    y = _move(low, x, xs, x_order, ys, out_order, low.stored_dims(Y, out_order), perm=perm)
    if y is None:
        raise Unsupported(f"Transpose {perm} of a {list(xs)} tensor needs a transpose of rank > 4 "
                          "(after its unit axes are dropped and its unmoved runs of axes merged)")
    low.bind_stored(Y, y, out_order)


@RULES.rule("Concat")
def lower_concat(node, low):
    Y = node.outputs[0]
    ys = low.shape(Y)
    axis = int(attr(node, "axis")) % len(ys)
    ins = [v for v in node.inputs if v is not None and int(np.prod(low.shape(v))) > 0]
    ops = [low.float_input(v) for v in ins]
    y = low.out_tensor(Y)
    low.emit(C.CONCATENATION, ops + [low.m.i32(low.axis_map(axis, len(ys)))], [y])
    low.bind(Y, y)


def _slice(low, x: int, begins, ends, steps, out: int) -> None:
    """``x[begin:end:step]`` along every axis of operand ``x`` (internal layout) into operand ``out``.

    The bounds are normalised (:func:`targets.nnapi.shapes.slice_bounds`): begins in [0, dim), ends
    in [-1, dim], a non-empty result.  SLICE (API 29) when every step is 1, else STRIDED_SLICE
    (API 28), whose ends are indices; an end of -1 (a negative step that runs through index 0)
    would count from the back there, so it becomes the axis' end_mask bit ("as far as the axis goes").
    """
    m = low.m
    if all(st == 1 for st in steps) and low.offers(C.SLICE):
        sizes = [e - b for b, e in zip(begins, ends)]
        low.emit(C.SLICE, [x, m.const(np.array(begins, np.int32)), m.const(np.array(sizes, np.int32))], [out])
        return
    end_mask = sum(1 << i for i, e in enumerate(ends) if e < 0)
    ends = [max(e, 0) for e in ends]
    low.emit(C.STRIDED_SLICE, [x, m.const(np.array(begins, np.int32)), m.const(np.array(ends, np.int32)),
                               m.const(np.array(steps, np.int32)), m.i32(0), m.i32(end_mask), m.i32(0)], [out])


def _internal_order(rank: int) -> tuple:
    """ONNX axis of each internal axis: NHWC for rank 4, ONNX's own order otherwise."""
    return TO_NHWC if rank == 4 else tuple(range(rank))


@RULES.rule("Slice")
def lower_slice(node, low):
    X, Y = node.inputs[0], node.outputs[0]
    xs = low.shape(X, any_rank=True)
    bounds = slice_bounds(node, xs, low.ctx.const)
    if bounds is None:
        raise Unsupported("Slice with run-time (or invalid) starts / ends / axes / steps")
    begins, ends, steps, out_shape = bounds
    if out_shape != low.shape(Y, any_rank=True):
        raise Unsupported(f"Slice output shape {list(low.shape(Y, any_rank=True))} is not the {list(out_shape)} "
                          "of its bounds")
    x = low.float_input(X)
    if out_shape == xs and all(st == 1 for st in steps):  # the whole tensor: no operation
        low.bind(Y, x)
        if len(xs) > MAX_RANK:
            low.orders[id(Y)] = low.order(X)
        return
    if len(xs) > MAX_RANK:
        # rank > 4 (a qkv tensor's q, k, v): one sliced axis, the stored operand viewed as (before, axis,
        # after) in X's stored order; Y keeps that order
        cut = [a for a in range(len(xs)) if (begins[a], ends[a], steps[a]) != (0, xs[a], 1)]
        if len(cut) != 1:
            raise Unsupported(f"Slice of a rank-{len(xs)} tensor along {len(cut)} axes (one is taken)")
        a = cut[0]
        order = low.order(X)
        stored = [xs[b] for b in order]
        p = order.index(a)
        view = low.reshape(x, (int(np.prod(stored[:p])), xs[a], int(np.prod(stored[p + 1:]))))
        part = low.tmp((low.dims_of(view)[0], out_shape[a], low.dims_of(view)[2]))
        _slice(low, view, [0, begins[a], 0], [low.dims_of(view)[0], ends[a], low.dims_of(view)[2]],
               [1, steps[a], 1], part)
        low.bind_stored(Y, part, order)
        return
    order = _internal_order(len(xs))  # the bounds follow the layout, so a rank-4 slice needs no transpose
    y = low.out_tensor(Y)
    _slice(low, x, [begins[a] for a in order], [ends[a] for a in order], [steps[a] for a in order], y)
    low.bind(Y, y)


@RULES.rule("Split")
def lower_split(node, low):
    X = node.inputs[0]
    xs = low.shape(X, any_rank=True)
    r = len(xs)
    axis = _axis_attribute(node, r, 0)
    sizes = split_sizes(node, xs[axis], low.ctx.const)
    if sizes is None:
        raise Unsupported("Split with run-time split sizes")
    if len(sizes) != len(node.outputs) or sum(sizes) != xs[axis] or min(sizes) <= 0:
        raise Unsupported(f"Split sizes {sizes} do not cut an axis of {xs[axis]} into {len(node.outputs)} parts")
    named = [o is not None and bool(o.name) for o in node.outputs]
    for o, n, has_name in zip(node.outputs, sizes, named):
        if has_name and low.shape(o, any_rank=True)[axis] != n:
            raise Unsupported(f"Split output {o.name!r} has shape {list(low.shape(o, any_rank=True))}, "
                              f"not size {n} on axis {axis}")
    x = low.float_input(X)
    if r > MAX_RANK:
        # the stored operand viewed as (before, axis, after) in X's stored order: each part keeps that order
        order = low.order(X)
        stored = [xs[a] for a in order]
        p = order.index(axis)
        x = low.reshape(x, (int(np.prod(stored[:p])), xs[axis], int(np.prod(stored[p + 1:]))))
        parts = _split_parts(low, x, 1, sizes, named, node.outputs)
        for o, y in zip(node.outputs, parts):
            if y is not None:
                low.bind_stored(o, y, order)
        return
    iaxis = low.axis_map(axis, r)
    for o, y in zip(node.outputs, _split_parts(low, x, iaxis, sizes, named, node.outputs, low.out_tensor)):
        if y is not None:
            low.bind(o, y)


def _split_parts(low, x: int, iaxis: int, sizes, named, outputs, out_tensor=None) -> list:
    """The parts of operand ``x`` cut along its axis ``iaxis`` into ``sizes``: one operand per output
    (None for an output nobody reads); ``out_tensor(value)`` makes a named output's operand (default:
    a scratch one)."""
    dims = low.dims_of(x)
    r = len(dims)

    def part_dims(n):
        return dims[:iaxis] + (n,) + dims[iaxis + 1:]

    def dst(o, n):
        return out_tensor(o) if out_tensor is not None else low.tmp(part_dims(n))

    if len(set(sizes)) == 1 and low.offers(C.SPLIT):
        # equal parts: one SPLIT (API 29), which writes every part (unnamed ones into scratch operands)
        outs = [dst(o, n) if has_name else low.tmp(part_dims(n)) for o, n, has_name in zip(outputs, sizes, named)]
        low.emit(C.SPLIT, [x, low.m.i32(iaxis), low.m.i32(len(sizes))], outs)
        return [y if has_name else None for y, has_name in zip(outs, named)]
    # unequal parts (or API 28, which has no SPLIT): one slice per part that something reads
    parts, offset = [], 0
    for o, n in zip(outputs, sizes):
        y = None
        if o is not None and o.name and (o.uses() or o.is_graph_output()):
            begins, ends = [0] * r, list(dims)
            begins[iaxis], ends[iaxis] = offset, offset + n
            y = dst(o, n)
            _slice(low, x, begins, ends, [1] * r, y)
        parts.append(y)
        offset += n
    return parts


@RULES.rule("Gather")
def lower_gather(node, low):
    X, I, Y = node.inputs[0], node.inputs[1], node.outputs[0]
    xs = low.shape(X)
    r = len(xs)
    axis = _axis_attribute(node, r, 0)
    if low.ctx.const(I) is None:
        _gather_runtime(low, node, axis)
        return
    idx = low.const_array(I, "Gather's indices").astype(np.int64)
    d = xs[axis]
    if idx.size == 0 or idx.min() < -d or idx.max() >= d:
        raise Unsupported(f"Gather indices outside [-{d}, {d})")
    # NNAPI's indices must lie in [0, dim): ONNX's negative ones count from the back
    flat = np.where(idx < 0, idx + d, idx).astype(np.int32).reshape(-1)
    ys = low.shape(Y)
    if idx.ndim == 1:
        # the output keeps the input's rank and axis order: gather along the internal axis directly
        y = low.out_tensor(Y)
        low.emit(C.GATHER, [low.float_input(X), low.m.i32(low.axis_map(axis, r)), low.m.const(flat)], [y])
        low.bind(Y, y)
        return
    # scalar or multi-dimensional indices change the rank: gather the flattened indices in ONNX order
    # (the output's elements in order, since the index dims replace one axis in place), then reshape
    x = low.nchw(X) if r == 4 else low.float_input(X)
    g = low.tmp(xs[:axis] + (flat.size,) + xs[axis + 1:])
    low.emit(C.GATHER, [x, low.m.i32(axis), low.m.const(flat)], [g])
    low.bind(Y, low.from_nchw(low.reshape(g, ys), ys))


def _gather_runtime(low, node, axis: int) -> None:
    """Gather with indices computed at run time (an embedding lookup): GATHER (API 29) with int32 indices
    (int64 ones are cast at the partition boundary: emitter.INT64_READERS).  NNAPI's indices must lie in
    [0, dim), ONNX's may count from the back: select(i < 0, i + dim, i) first (int32 ADD: API 30)."""
    X, I, Y = node.inputs[0], node.inputs[1], node.outputs[0]
    xs, ys = low.shape(X), low.shape(Y)
    if low.level < C.FEATURE_API_LEVEL["int32_arithmetic"]:
        raise Unsupported(f"Gather with run-time indices needs Android API {C.FEATURE_API_LEVEL['int32_arithmetic']} "
                          f"(int32 arithmetic wraps negative indices; target API {low.level})")
    low.m.need(C.FEATURE_API_LEVEL["int32_arithmetic"])
    idx = low.int_input(I, "Gather's indices")
    idims = low.dims_of(idx)
    one = (1,) * len(idims)
    negative = low.tmp(idims, C.TENSOR_BOOL8)
    low.emit(C.LESS, [idx, low.m.const(np.zeros(one, np.int32))], [negative])
    shifted = low.tmp(idims, C.TENSOR_INT32)
    low.emit(C.ADD, [idx, low.m.const(np.full(one, xs[axis], np.int32)), low.m.i32(C.FUSED_NONE)], [shifted])
    wrapped = low.tmp(idims, C.TENSOR_INT32)
    low.emit(C.SELECT, [negative, shifted, idx], [wrapped])
    if len(idims) == 1:  # the output keeps the input's rank (and layout): gather along the internal axis
        y = low.out_tensor(Y)
        low.emit(C.GATHER, [low.float_input(X), low.m.i32(low.axis_map(axis, len(xs))), wrapped], [y])
        low.bind(Y, y)
        return
    # the index dims replace one axis in ONNX order (output rank <= 4: the rank check of Y's shape)
    x = low.nchw(X) if len(xs) == 4 else low.float_input(X)
    g = low.tmp(ys)
    low.emit(C.GATHER, [x, low.m.i32(axis), wrapped], [g])
    low.bind(Y, low.from_nchw(g, ys))


@RULES.rule("RowLookup", domain=MINIRT)
def lower_row_lookup(node, low):
    """com.minirt::RowLookup (docs/fused_ops.md, D141): an id in [0, K) picks its row of the table, any other id
    row K: select(id < 0, K, select(id < K, id, K)) (API 29 LESS and SELECT), the ids' last axis of 1 dropped,
    then GATHER along the table's rows.  int64 ids are cast at the partition boundary (INT64_READERS)."""
    I, T, Y = node.inputs[0], node.inputs[1], node.outputs[0]
    table = low.const_array(T, "RowLookup's table")
    ids_shape, ys = low.shape(I), low.shape(Y)
    if table.ndim != 2 or not 2 <= len(ids_shape) <= 3 or ids_shape[-1] != 1:
        raise Unsupported(f"RowLookup of ids {tuple(ids_shape)} in a table {table.shape}: this lowering takes ids "
                          "of rank 2 or 3 ending in 1 and a 2-D table")
    k = table.shape[0] - 1
    idx = low.int_input(I, "RowLookup's ids")
    dims = low.dims_of(idx)
    one = (1,) * len(dims)
    last = low.m.const(np.full(dims, k, np.int32))
    below, negative = low.tmp(dims, C.TENSOR_BOOL8), low.tmp(dims, C.TENSOR_BOOL8)
    low.emit(C.LESS, [idx, low.m.const(np.full(one, k, np.int32))], [below])
    capped, row = low.tmp(dims, C.TENSOR_INT32), low.tmp(dims, C.TENSOR_INT32)
    low.emit(C.SELECT, [below, idx, last], [capped])
    low.emit(C.LESS, [idx, low.m.const(np.zeros(one, np.int32))], [negative])
    low.emit(C.SELECT, [negative, last, capped], [row])
    g = low.tmp(ys)
    low.emit(C.GATHER, [low.inp(T), low.m.i32(0), low.reshape(row, dims[:-1])], [g])
    low.bind(Y, low.from_nchw(g, ys))


@RULES.rule("Cast")
def lower_cast(node, low):
    """Cast to the type a value already has in the NNAPI model: int32 / int64 -> int32 (int64 values enter a
    partition as int32, cast at the boundary with ONNX's wrap-around: emitter.INT64_READERS) and float32 ->
    float32.  Other casts stay on the CPU."""
    X, Y = node.inputs[0], node.outputs[0]
    to = int(attr(node, "to"))
    xdt = np.dtype(low.ctx.dtype(X)) if low.ctx.dtype(X) is not None else None
    if to == 6 and xdt in (np.dtype(np.int32), np.dtype(np.int64)):  # TensorProto.INT32
        low.bind(Y, low.int_input(X, "Cast's input"))
        return
    if to == 1 and xdt == np.dtype(np.float32):  # TensorProto.FLOAT
        low.bind(Y, low.float_input(X))
        return
    raise Unsupported(f"Cast from {xdt} to ONNX type {to} (NNAPI lowering: int64/int32 -> int32 and float32 -> "
                      "float32 only)")


@RULES.rule("Pad")
def lower_pad(node, low):
    X, Y = node.inputs[0], node.outputs[0]
    xs = low.shape(X)
    r = len(xs)
    mode = str_attr(node, "mode", "constant")
    if low.ctx.opset(node) < 11:
        pads = list(attr(node, "pads"))
        value = float(attr(node, "value", 0.0))
    else:
        pads = low.const_array(node.inputs[1], "Pad's pads").reshape(-1).tolist()
        value = 0.0
        if len(node.inputs) > 2 and node.inputs[2] is not None and node.inputs[2].name:
            value = float(low.const_array(node.inputs[2], "Pad's value").reshape(-1)[0])
        if len(node.inputs) > 3 and node.inputs[3] is not None and node.inputs[3].name:
            axes = [a % r for a in low.const_array(node.inputs[3], "Pad's axes").reshape(-1).tolist()]
            full = [0] * (2 * r)
            for i, a in enumerate(axes):
                full[a], full[a + r] = pads[i], pads[i + len(axes)]
            pads = full
    if any(p < 0 for p in pads):
        raise Unsupported("Pad with negative pads (cropping)")
    x = low.float_input(X)
    if not any(pads):
        low.bind(Y, x)
        return
    order = _internal_order(r)
    paddings = np.array([[pads[a], pads[a + r]] for a in order], np.int32)
    if mode == "reflect" and any(max(pads[a], pads[a + r]) >= xs[a] for a in range(r)):
        # ONNX and NNAPI reflect without repeating the border: a pad is at most dim - 1
        raise Unsupported("reflect Pad wider than its axis minus one")
    if mode == "wrap" and any(max(pads[a], pads[a + r]) > xs[a] for a in range(r)):
        raise Unsupported("wrap Pad wider than its axis")
    y = low.out_tensor(Y)
    if mode == "constant":
        if value == 0.0:
            low.emit(C.PAD, [x, low.m.const(paddings)], [y])
        else:
            low.emit(C.PAD_V2, [x, low.m.const(paddings), low.m.f32(value)], [y])
    elif mode == "reflect" and low.offers(C.MIRROR_PAD):
        low.emit(C.MIRROR_PAD, [x, low.m.const(paddings), low.m.i32(0)], [y])  # mode 0: REFLECT
    elif mode in ("reflect", "edge", "wrap"):
        _pad_by_gather(low, x, paddings, mode, y)
    else:
        raise Unsupported(f"Pad mode {mode!r}")
    low.bind(Y, y)


def _pad_by_gather(low, x: int, paddings: np.ndarray, mode: str, out: int) -> None:
    """Reflect / edge / wrap padding as one GATHER (API 29) per padded axis, into operand ``out``.

    NNAPI has no edge or wrap mode, and MIRROR_PAD needs API 34; every one of these paddings
    reads each output element from one input position along the axis, so a GATHER with constant
    indices is exact: position i of the padded axis reads ``np.pad(arange(dim), pads, mode)[i]``.
    """
    axes = [j for j, (b, e) in enumerate(paddings.tolist()) if b or e]
    cur = x
    for n, j in enumerate(axes):
        dims = low.dims_of(cur)
        index = np.pad(np.arange(dims[j]), tuple(int(p) for p in paddings[j]), mode=mode).astype(np.int32)
        nxt = out if n == len(axes) - 1 else low.tmp(dims[:j] + (index.size,) + dims[j + 1:])
        low.emit(C.GATHER, [cur, low.m.i32(j), low.m.const(index)], [nxt])
        cur = nxt


@RULES.rule("Resize")
def lower_resize(node, low):
    X, Y = node.inputs[0], node.outputs[0]
    xs, ys = low.shape(X), low.shape(Y)
    if len(xs) != 4 or xs[:2] != ys[:2]:
        raise Unsupported("Resize other than of the two spatial axes of a 4-D tensor")
    mode = str_attr(node, "mode", "nearest")
    ctm = str_attr(node, "coordinate_transformation_mode", "half_pixel")
    nmode = str_attr(node, "nearest_mode", "round_prefer_floor")
    if low.ctx.opset(node) < 11:
        ctm = "asymmetric"
        nmode = "floor"
    if int(attr(node, "antialias", 0)):
        raise Unsupported("Resize with antialias")
    for v in node.inputs[1:]:
        if v is not None and v.name and low.ctx.const(v) is None:
            raise Unsupported("Resize with run-time roi / scales / sizes")
    scales_v = node.inputs[2] if low.ctx.opset(node) >= 11 and len(node.inputs) > 2 else (
        node.inputs[1] if len(node.inputs) > 1 else None)
    if scales_v is not None and scales_v.name and low.ctx.const(scales_v) is not None:
        sc = np.asarray(low.ctx.const(scales_v), np.float64).reshape(-1)
        if sc.size == 4 and any(abs(sc[i] - ys[i] / xs[i]) > 1e-6 * max(1.0, sc[i]) for i in (2, 3)):
            raise Unsupported("Resize whose scales differ from output/input size (NNAPI and TFLite map "
                              "coordinates with the size ratio)")
    if ctm == "align_corners" and (ys[2] == 1 or ys[3] == 1):
        raise Unsupported("align_corners Resize to a size of 1")
    if attr(node, "axes") is not None:
        raise Unsupported("Resize with axes")
    if mode == "linear":
        flags = {"asymmetric": (False, False), "align_corners": (True, False), "half_pixel": (False, True)}
        if ctm == "pytorch_half_pixel" and ys[2] > 1 and ys[3] > 1:
            ctm = "half_pixel"
        if ctm not in flags:
            raise Unsupported(f"linear Resize with coordinate_transformation_mode {ctm!r}")
        code = C.RESIZE_BILINEAR
    elif mode == "nearest":
        flags = {("asymmetric", "floor"): (False, False), ("half_pixel", "round_prefer_ceil"): (False, True),
                 ("tf_half_pixel_for_nn", "floor"): (False, True),
                 ("align_corners", "round_prefer_ceil"): (True, False)}
        if (ctm, nmode) not in flags:
            raise Unsupported(f"nearest Resize with {ctm!r}/{nmode!r}")
        flags = {ctm: flags[(ctm, nmode)]}
        code = C.RESIZE_NEAREST_NEIGHBOR
    else:
        raise Unsupported(f"Resize mode {mode!r}")
    align, half = flags[ctm]
    y = low.out_tensor(Y)
    ins = [low.float_input(X), low.m.i32(ys[3]), low.m.i32(ys[2])]
    if align or half:
        low.need("resize_corner_modes", "Resize with align_corners / half_pixel coordinates")
        ins += [low.m.boolean(False), low.m.boolean(align), low.m.boolean(half)]
    elif code == C.RESIZE_NEAREST_NEIGHBOR:
        ins.append(low.m.boolean(False))
    low.emit(code, ins, [y])
    low.bind(Y, y)


@RULES.rule("Upsample")
def lower_upsample(node, low):
    raise Unsupported("Upsample (deprecated): export with Resize")


@RULES.rule("DepthToSpace")
@RULES.rule("SpaceToDepth")
def lower_depth_space(node, low):
    if str_attr(node, "mode", "DCR") != "DCR":
        raise Unsupported(f"{node.op_type} in CRD mode (NNAPI's is DCR)")
    X, Y = node.inputs[0], node.outputs[0]
    y = low.out_tensor(Y)
    code = C.DEPTH_TO_SPACE if node.op_type == "DepthToSpace" else C.SPACE_TO_DEPTH
    low.emit(code, [low.float_input(X), low.m.i32(int(attr(node, "blocksize")))], [y])
    low.bind(Y, y)


# --- quantization -------------------------------------------------------------------------------
@RULES.rule("QuantizeLinear")
def lower_quantize_linear(node, low):
    X, Y = node.inputs[0], node.outputs[0]
    scale, zp = low.qparams(node)
    if scale.size != 1:
        raise Unsupported("per-axis QuantizeLinear (NNAPI quantizes per tensor)")
    ydt = np.dtype(low.ctx.dtype(Y))
    if ydt == np.uint8:
        t = C.TENSOR_QUANT8_ASYMM
    elif ydt == np.int8:
        t = C.TENSOR_QUANT8_ASYMM_SIGNED
        if low.level < 30:
            raise Unsupported("int8 (signed) quantization needs Android API 30")
    else:
        raise Unsupported(f"QuantizeLinear to {ydt}")
    z = 0 if zp is None else int(zp.reshape(-1)[0])
    y = low.out_tensor(Y, t, scale=float(scale.reshape(-1)[0]), zero_point=z)
    low.emit(C.QUANTIZE, [low.float_input(X)], [y])
    low.m.need(C.OPERAND_API_LEVEL[t])
    low.bind(Y, y)


@RULES.rule("DequantizeLinear")
def lower_dequantize_linear(node, low):
    X, Y = node.inputs[0], node.outputs[0]
    scale, zp = low.qparams(node)
    xdt = np.dtype(low.ctx.dtype(X))
    xs = low.shape(X)
    z = 0 if zp is None else int(np.asarray(zp).reshape(-1)[0])
    c = low.ctx.const(X)
    if scale.size != 1:
        if c is None or xdt != np.int8 or (zp is not None and np.any(zp != 0)):
            raise Unsupported("per-axis DequantizeLinear other than of a constant symmetric int8 tensor")
        axis = int(attr(node, "axis", 1)) % len(xs)
        a = np.asarray(c, np.int8)
        if len(xs) == 4:
            a = a.transpose(TO_NHWC)
        x = low.m.const(np.ascontiguousarray(a), C.TENSOR_QUANT8_SYMM_PER_CHANNEL,
                         channel_dim=low.axis_map(axis, len(xs)), channel_scales=scale.reshape(-1).tolist())
        if low.level < 29:
            raise Unsupported("per-channel quantized constants need Android API 29")
        low.m.need(29)
    else:
        s = float(scale.reshape(-1)[0])
        if xdt == np.uint8:
            t = C.TENSOR_QUANT8_ASYMM
        elif xdt == np.int8:
            t = C.TENSOR_QUANT8_ASYMM_SIGNED
            if low.level < 30:
                raise Unsupported("int8 (signed) quantization needs Android API 30")
            low.m.need(30)
        else:
            raise Unsupported(f"DequantizeLinear of {xdt}")
        if id(X) in low.vals:
            o = low.m.operands[low.vals[id(X)]]
            if o.type != t or abs(o.scale - s) > 1e-12 * max(1.0, s) or o.zero_point != z:
                raise Unsupported("DequantizeLinear parameters differ from the tensor's quantization")
            x = low.vals[id(X)]
        elif c is not None:
            a = np.asarray(c)
            if a.ndim == 4:
                a = a.transpose(TO_NHWC)
            x = low.m.const(np.ascontiguousarray(a.reshape(low.idims(xs))), t, scale=s, zero_point=z)
        else:
            x = low.add_model_input(X, t, scale=s, zero_point=z)
    y = low.out_tensor(Y)
    low.emit(C.DEQUANTIZE, [x], [y])
    low.bind(Y, y)


def _same_padding(in_hw, kernel, strides, pads) -> bool:
    """Whether explicit pads (top, left, bottom, right) equal TFLite's SAME padding."""
    top, left, bottom, right = pads
    for i, (b, e) in enumerate(((top, bottom), (left, right))):
        out = -(-in_hw[i] // strides[i])
        total = max((out - 1) * strides[i] + kernel[i] - in_hw[i], 0)
        if (b, e) != (total // 2, total - total // 2):
            return False
    return True


# LSTM / GRU (the unrolled recurrence) live in their own module; importing it registers their rules in RULES
from minirt.targets.nnapi import recurrent as _recurrent  # noqa: E402,F401
