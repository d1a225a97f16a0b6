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

import math

import numpy as np

from targets.nnapi import oplevels as C
from targets.nnapi.model import NNModel
from targets.nnapi.shapes import static_shapes

TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)
MAX_RANK = 4


class Unsupported(Exception):
    """The node (or partition) has no NNAPI form at the target API level; ``str()`` is the reason."""


def _attr(node, name, default=None):
    a = node.attributes.get(name)
    return default if a is None else a.value


def _is_onnx(node):
    return node.domain in ("", "ai.onnx")


def _fusable(act: str, params) -> int | None:
    """NNAPI fuse code for an activation, or None when it is not one of NONE/RELU/RELU1/RELU6."""
    if act in ("", None):
        return C.FUSED_NONE
    if act == "Relu":
        return C.FUSED_RELU
    if act == "Clip":
        lo, hi = (list(params) + [-math.inf, math.inf])[:2]
        if lo == 0 and hi == 6:
            return C.FUSED_RELU6
        if lo == -1 and hi == 1:
            return C.FUSED_RELU1
        if lo == 0 and (hi == math.inf or hi >= 3.0e38):
            return C.FUSED_RELU
    return None


def shapes_for(ctx) -> dict:
    """Static shapes of the context's main graph (cached on the context)."""
    cache = getattr(ctx, "_nnapi_shapes", None)
    if cache is None or cache[0] is not ctx.model:
        cache = (ctx.model, static_shapes(ctx.model.graph, ctx.const))
        try:
            ctx._nnapi_shapes = cache
        except AttributeError:
            pass
    return cache[1]


class Lowerer:
    def __init__(self, ctx, level: int, shapes: dict):
        self.ctx = ctx
        self.level = int(level)
        self.shapes = shapes
        self.m = NNModel()
        self.vals: dict = {}  # id(value) -> operand index (internal layout)
        self.model_inputs: dict = {}  # id(value) -> model input position
        self._consts: dict = {}
        self._nchw_cache: dict = {}
        # id(value) -> 4-D source value: a flatten of an NHWC tensor kept in NHWC order (H, W, C) until a
        # consumer needs ONNX's (C, H, W) order; a FULLY_CONNECTED consumer permutes its weights instead
        self.lazy_flat: dict = {}

    # --- values --------------------------------------------------------------
    def shape(self, v) -> tuple:
        s = self.shapes.get(id(v))
        if s is None:
            s = self.ctx.static_shape(v)
        if s is None:
            c = self.ctx.const(v)
            if c is not None:
                s = tuple(c.shape)
        if s is None:
            raise Unsupported(f"value {v.name!r} has no static shape (build with --input-shape to fix it)")
        if len(s) > MAX_RANK:
            raise Unsupported(f"value {v.name!r} has rank {len(s)}; NNAPI tensors have rank 4 at most")
        if any(d == 0 for d in s):
            raise Unsupported(f"value {v.name!r} is empty (shape {list(s)})")
        return tuple(s)

    @staticmethod
    def idims(shape) -> tuple:
        return tuple(shape[i] for i in TO_NHWC) if len(shape) == 4 else tuple(shape)

    @staticmethod
    def trivial(shape) -> bool:
        """NCHW and NHWC hold the same bytes in the same order (C == 1 or H*W == 1)."""
        return len(shape) != 4 or shape[1] == 1 or shape[2] * shape[3] == 1

    def tensor_type(self, v) -> int:
        if v.type is not None and type(v.type).__name__ != "TensorType":
            raise Unsupported(f"value {v.name!r} is a {type(v.type).__name__}, not a tensor")
        dt = self.ctx.dtype(v)
        if dt is None:
            raise Unsupported(f"value {v.name!r} has no known element type")
        dt = np.dtype(dt)
        if dt == np.float32:
            return C.TENSOR_FLOAT32
        if dt == np.int32:
            return C.TENSOR_INT32
        raise Unsupported(f"value {v.name!r} is {dt}; this NNAPI lowering takes float32 tensors (and quantized "
                          "uint8/int8 through QuantizeLinear/DequantizeLinear)")

    def float_input(self, v) -> int:
        if self.tensor_type(v) != C.TENSOR_FLOAT32:
            raise Unsupported(f"input {v.name!r} is not float32")
        return self.inp(v)

    def add_model_input(self, v, type_=None, scale=0.0, zero_point=0) -> int:
        shape = self.shape(v)
        t = self.tensor_type(v) if type_ is None else type_
        idx = self.m.tensor(self.idims(shape), t, scale=scale, zero_point=zero_point, name=v.name or "")
        self.vals[id(v)] = idx
        self.model_inputs[id(v)] = len(self.m.inputs)
        self.m.inputs.append(idx)
        self.m.input_perm.append(list(TO_NHWC) if len(shape) == 4 else None)
        self.m.input_names.append(v.name or "")
        return idx

    def inp(self, v) -> int:
        """Operand of value ``v`` in the internal layout (creating a constant / model input)."""
        if id(v) in self.vals:
            return self.vals[id(v)]
        if id(v) in self.lazy_flat:
            src = self.lazy_flat.pop(id(v))
            idx = self.reshape(self.nchw(src), self.shape(v))
            self.vals[id(v)] = idx
            return idx
        c = self.ctx.const(v)
        if c is not None:
            shape = self.shape(v)
            a = np.asarray(c)
            if a.dtype == np.float64:
                a = a.astype(np.float32)
            if a.dtype == np.int64:
                a = a.astype(np.int32)
            if a.dtype not in (np.float32, np.int32):
                raise Unsupported(f"constant {v.name!r} is {a.dtype}")
            if a.ndim == 0:
                a = a.reshape(1)
            if a.ndim == 4:
                a = a.transpose(TO_NHWC)
            idx = self.m.const(a, name=v.name or "")
            self.vals[id(v)] = idx
            del shape
            return idx
        return self.add_model_input(v)

    def const_array(self, v, what: str) -> np.ndarray:
        c = None if v is None else self.ctx.const(v)
        if c is None:
            raise Unsupported(f"{what} is not a constant")
        return np.asarray(c)

    def bind(self, v, operand: int) -> None:
        self.vals[id(v)] = operand

    def out_tensor(self, v, type_=C.TENSOR_FLOAT32, **kw) -> int:
        return self.m.tensor(self.idims(self.shape(v)), type_, name=v.name or "", **kw)

    def tmp(self, dims, type_=C.TENSOR_FLOAT32, **kw) -> int:
        if len(dims) > MAX_RANK:
            raise Unsupported(f"an intermediate tensor would have rank {len(dims)} (> 4)")
        return self.m.tensor(tuple(int(d) for d in dims), type_, **kw)

    def dims_of(self, operand: int) -> tuple:
        return self.m.operands[operand].dims

    def emit(self, code: int, inputs, outputs) -> None:
        need = C.MIN_API_LEVEL[code]
        if need > self.level:
            raise Unsupported(f"{C.OPERATION_NAMES[code]} needs Android API {need} (target API {self.level})")
        self.m.op(code, inputs, outputs)

    def need(self, feature: str, what: str) -> None:
        lv = C.FEATURE_API_LEVEL[feature]
        if lv > self.level:
            raise Unsupported(f"{what} needs Android API {lv} (target API {self.level})")
        self.m.need(lv)

    def scalar_const(self, value: float, rank: int) -> int:
        key = (float(value), rank)
        if key not in self._consts:
            self._consts[key] = self.m.const(np.full((1,) * max(rank, 1), value, np.float32))
        return self._consts[key]

    # --- layout helpers ---------------------------------------------------------
    def reshape(self, x: int, dims) -> int:
        dims = tuple(int(d) for d in dims)
        if self.dims_of(x) == dims:
            return x
        out = self.tmp(dims, self.m.operands[x].type, scale=self.m.operands[x].scale,
                       zero_point=self.m.operands[x].zero_point)
        self.emit(C.RESHAPE, [x, self.m.const(np.array(dims, np.int32))], [out])
        return out

    def transpose(self, x: int, perm) -> int:
        perm = [int(p) for p in perm]
        if perm == list(range(len(perm))):
            return x
        d = self.dims_of(x)
        out = self.tmp([d[p] for p in perm], self.m.operands[x].type, scale=self.m.operands[x].scale,
                       zero_point=self.m.operands[x].zero_point)
        self.emit(C.TRANSPOSE, [x, self.m.const(np.array(perm, np.int32))], [out])
        return out

    def nchw(self, v) -> int:
        """Operand holding ``v`` in ONNX's axis order."""
        x = self.inp(v)
        shape = self.shape(v)
        if len(shape) != 4:
            return x
        if id(v) in self._nchw_cache:
            return self._nchw_cache[id(v)]
        if self.trivial(shape):
            r = self.reshape(x, shape)
        else:
            r = self.transpose(x, TO_NCHW)
        self._nchw_cache[id(v)] = r
        return r

    def from_nchw(self, x: int, shape) -> int:
        """Operand in the internal layout from operand ``x`` holding ONNX order ``shape``."""
        if len(shape) != 4:
            return x
        if self.trivial(shape):
            return self.reshape(x, self.idims(shape))
        return self.transpose(x, TO_NHWC)

    @staticmethod
    def axis_map(axis: int, rank: int) -> int:
        """Internal position of ONNX axis ``axis`` (normalized) of a rank-``rank`` value."""
        return TO_NHWC.index(axis) if rank == 4 else axis

    def broadcast_operand(self, v, out_rank: int) -> int:
        """Operand of ``v`` usable with numpy broadcasting against a rank ``out_rank`` internal tensor."""
        shape = self.shape(v)
        if len(shape) == out_rank:
            return self.inp(v)
        full = (1,) * (out_rank - len(shape)) + tuple(shape)
        c = self.ctx.const(v)
        if c is not None:
            a = np.asarray(c, dtype=np.float32).reshape(full)
            if out_rank == 4:
                a = a.transpose(TO_NHWC)
            return self.m.const(np.ascontiguousarray(a))
        x = self.inp(v)
        if out_rank == 4:
            if self.trivial(full):
                return self.reshape(x, self.idims(full))
            return self.transpose(self.reshape(x, full), TO_NHWC)
        return self.reshape(x, full)

    # --- activations -------------------------------------------------------------
    def activation(self, x: int, act: str, params, out: int | None = None) -> int:
        """Apply ONNX-named activation ``act`` to operand ``x``; returns the result operand."""
        dims = self.dims_of(x)
        rank = len(dims)

        def dst():
            return out if out is not None else self.tmp(dims)

        code = _fusable(act, params)
        if act in ("", None):
            if out is None:
                return x
            self.emit(C.RESHAPE, [x, self.m.const(np.array(dims, np.int32))], [out])
            return out
        if code is not None:
            o = dst()
            self.emit({C.FUSED_RELU: C.RELU, C.FUSED_RELU1: C.RELU1, C.FUSED_RELU6: C.RELU6}[code], [x], [o])
            return o
        if act == "Clip":
            lo, hi = (list(params) + [-math.inf, math.inf])[:2]
            y = x
            if lo > -math.inf:
                t = dst() if hi == math.inf else self.tmp(dims)
                self.emit(C.MAXIMUM, [y, self.scalar_const(lo, rank)], [t])
                y = t
            if hi < math.inf:
                t = dst()
                self.emit(C.MINIMUM, [y, self.scalar_const(hi, rank)], [t])
                y = t
            return y
        if act == "Sigmoid":
            o = dst()
            self.emit(C.LOGISTIC, [x], [o])
            return o
        if act == "Tanh":
            o = dst()
            self.emit(C.TANH, [x], [o])
            return o
        if act == "HardSwish":
            if self.level >= C.MIN_API_LEVEL[C.HARD_SWISH]:
                o = dst()
                self.emit(C.HARD_SWISH, [x], [o])
                return o
            # x * relu6(x + 3) / 6
            t = self.tmp(dims)
            self.emit(C.ADD, [x, self.scalar_const(3.0, rank), self.m.i32(C.FUSED_RELU6)], [t])
            u = self.tmp(dims)
            self.emit(C.MUL, [x, t, self.m.i32(C.FUSED_NONE)], [u])
            o = dst()
            self.emit(C.MUL, [u, self.scalar_const(1.0 / 6.0, rank), self.m.i32(C.FUSED_NONE)], [o])
            return o
        if act == "HardSigmoid":
            alpha, beta = (list(params) + [0.2, 0.5])[:2]
            # relu6(6*alpha*x + 6*beta) / 6
            t = self.tmp(dims)
            self.emit(C.MUL, [x, self.scalar_const(6.0 * alpha, rank), self.m.i32(C.FUSED_NONE)], [t])
            u = self.tmp(dims)
            self.emit(C.ADD, [t, self.scalar_const(6.0 * beta, rank), self.m.i32(C.FUSED_RELU6)], [u])
            o = dst()
            self.emit(C.MUL, [u, self.scalar_const(1.0 / 6.0, rank), self.m.i32(C.FUSED_NONE)], [o])
            return o
        if act == "LeakyRelu":
            alpha = (list(params) + [0.01])[0]
            o = dst()
            self.emit(C.PRELU, [x, self.scalar_const(alpha, rank)], [o])
            return o
        if act == "SiLU":
            s = self.tmp(dims)
            self.emit(C.LOGISTIC, [x], [s])
            o = dst()
            self.emit(C.MUL, [x, s, self.m.i32(C.FUSED_NONE)], [o])
            return o
        raise Unsupported(f"activation {act!r} has no NNAPI form here")

    # --- nodes ---------------------------------------------------------------------
    def node(self, node) -> None:
        op = node.op_type
        if _is_onnx(node):
            fn = getattr(self, f"op_{op}", None)
        elif node.domain == "com.minirt":
            fn = getattr(self, f"minirt_{op}", None)
        else:
            fn = None
        if fn is None:
            dom = "" if _is_onnx(node) else f"{node.domain}::"
            raise Unsupported(f"{dom}{op} has no NNAPI lowering")
        for o in node.outputs:
            if o is not None and o.name:
                self.shape(o)  # static output shape required
        fn(node)

    # convolution ------------------------------------------------------------------
    def _conv_pads(self, node, in_hw, kernel, strides, dilations):
        auto_pad = _attr(node, "auto_pad", "NOTSET")
        if isinstance(auto_pad, bytes):
            auto_pad = auto_pad.decode()
        if auto_pad in ("NOTSET", "", None):
            pads = list(_attr(node, "pads", [0, 0, 0, 0]))
            return pads[0], pads[1], pads[2], pads[3]
        if auto_pad == "VALID":
            return 0, 0, 0, 0
        pb, pe = [], []
        for i in range(2):
            out = -(-in_hw[i] // strides[i])
            eff = (kernel[i] - 1) * dilations[i] + 1
            total = max((out - 1) * strides[i] + eff - in_hw[i], 0)
            small = total // 2
            if auto_pad == "SAME_UPPER":
                pb.append(small), pe.append(total - small)
            else:
                pb.append(total - small), pe.append(small)
        return pb[0], pb[1], pe[0], pe[1]

    def _conv(self, node, act="", params=(), z=None) -> None:
        X, W = node.inputs[0], node.inputs[1]
        B = node.inputs[2] if len(node.inputs) > 2 else None
        xs = self.shape(X)
        if len(xs) != 4:
            raise Unsupported(f"{node.op_type} on a rank-{len(xs)} input (NNAPI has 2-D convolution only)")
        w = self.const_array(W, "the convolution weight").astype(np.float32)
        if w.ndim != 4:
            raise Unsupported("convolution weight is not 4-D")
        group = int(_attr(node, "group", 1))
        m_out, cin_g, kh, kw = w.shape
        strides = list(_attr(node, "strides", [1, 1]))
        dil = list(_attr(node, "dilations", [1, 1]))
        top, left, bottom, right = self._conv_pads(node, xs[2:], (kh, kw), strides, dil)
        bias = np.zeros(m_out, np.float32) if B is None else self.const_array(B, "the convolution bias").astype(
            np.float32).reshape(-1)
        fuse = C.FUSED_NONE
        post_scale = None
        if z is None:
            f = _fusable(act, params)
            if f is not None:
                fuse, act = f, ""
            elif act == "HardSigmoid":
                alpha, beta = (list(params) + [0.2, 0.5])[:2]
                w = w * np.float32(6.0 * alpha)
                bias = bias * np.float32(6.0 * alpha) + np.float32(6.0 * beta)
                fuse, act, post_scale = C.FUSED_RELU6, "", 1.0 / 6.0
        x = self.float_input(X)
        if group == 1:
            filt = w.transpose(0, 2, 3, 1)
            code = C.CONV_2D
        elif group == xs[1] and cin_g == 1:
            filt = w.transpose(1, 2, 3, 0)
            code = C.DEPTHWISE_CONV_2D
        else:
            raise Unsupported(f"grouped convolution (group={group}, {cin_g} channels per group) has no NNAPI form "
                              "that TFLite can check")
        Y = node.outputs[0]
        out_dims = self.idims(self.shape(Y))
        last = act in ("", None) and z is None and post_scale is None
        y = self.out_tensor(Y) if last else self.tmp(out_dims)
        ins = [x, self.m.const(np.ascontiguousarray(filt)), self.m.const(bias)]
        ins += [self.m.i32(left), self.m.i32(right), self.m.i32(top), self.m.i32(bottom),
                self.m.i32(strides[1]), self.m.i32(strides[0])]
        if code == C.DEPTHWISE_CONV_2D:
            ins.append(self.m.i32(m_out // xs[1]))
        ins.append(self.m.i32(fuse))
        if dil != [1, 1]:
            self.need("conv_dilation", "a dilated convolution")
            ins += [self.m.boolean(False), self.m.i32(dil[1]), self.m.i32(dil[0])]
        self.emit(code, ins, [y])
        if post_scale is not None:
            o = self.out_tensor(Y) if act in ("", None) else self.tmp(out_dims)
            self.emit(C.MUL, [y, self.scalar_const(post_scale, 4), self.m.i32(C.FUSED_NONE)], [o])
            y = o
        self._finish(Y, y, act, params, z)

    def _finish(self, Y, y: int, act, params, z=None) -> None:
        """y (+ z) then the activation, into Y's operand."""
        rank = len(self.shape(Y))
        if z is not None:
            f = _fusable(act, params)
            zz = self.broadcast_operand(z, rank)
            if f is not None:
                o = self.out_tensor(Y)
                self.emit(C.ADD, [y, zz, self.m.i32(f)], [o])
                self.bind(Y, o)
                return
            t = self.tmp(self.dims_of(y))
            self.emit(C.ADD, [y, zz, self.m.i32(C.FUSED_NONE)], [t])
            y = t
        if act in ("", None):
            self.bind(Y, y)
            return
        self.bind(Y, self.activation(y, act, params, self.out_tensor(Y)))

    def op_Conv(self, node):
        self._conv(node)

    def minirt_FusedConv(self, node):
        z = node.inputs[3] if len(node.inputs) > 3 else None
        self._conv(node, _attr(node, "activation", ""), list(_attr(node, "activation_params", []) or []), z)

    def op_ConvTranspose(self, node):
        self._conv_transpose(node)

    def minirt_FusedConvTranspose(self, node):
        self._conv_transpose(node, _attr(node, "activation", ""), list(_attr(node, "activation_params", []) or []))

    def _conv_transpose(self, node, act="", params=()):
        X, W = node.inputs[0], node.inputs[1]
        B = node.inputs[2] if len(node.inputs) > 2 else None
        xs = self.shape(X)
        if len(xs) != 4:
            raise Unsupported("ConvTranspose on a non-4-D input")
        if int(_attr(node, "group", 1)) != 1:
            raise Unsupported("grouped ConvTranspose")
        if list(_attr(node, "dilations", [1, 1])) != [1, 1]:
            raise Unsupported("dilated ConvTranspose")
        if any(_attr(node, "output_padding", [0, 0]) or []):
            raise Unsupported("ConvTranspose with output_padding")
        if _attr(node, "auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET", "VALID", b"VALID"):
            raise Unsupported("ConvTranspose with SAME auto_pad")
        if any(_attr(node, "pads", [0, 0, 0, 0]) or []):
            raise Unsupported("ConvTranspose with padding (only VALID maps onto TFLite's TRANSPOSE_CONV)")
        w = self.const_array(W, "the ConvTranspose weight").astype(np.float32)  # [Cin, Cout, kh, kw]
        strides = list(_attr(node, "strides", [1, 1]))
        Y = node.outputs[0]
        ys = self.shape(Y)
        if ys[2] != (xs[2] - 1) * strides[0] + w.shape[2] or ys[3] != (xs[3] - 1) * strides[1] + w.shape[3]:
            raise Unsupported("ConvTranspose output shape is not the VALID one")
        bias = np.zeros(w.shape[1], np.float32) if B is None else self.const_array(B, "the bias").astype(np.float32)
        filt = np.ascontiguousarray(w.transpose(1, 2, 3, 0))  # [Cout, kh, kw, Cin]
        fuse = _fusable(act, params)  # Relu/Relu6/Relu1 ride on the op; others follow it
        direct = fuse is not None
        y = self.out_tensor(Y) if direct else self.tmp(self.idims(ys))
        ins = [self.float_input(X), self.m.const(filt), self.m.const(bias.reshape(-1)),
               self.m.i32(0), self.m.i32(0), self.m.i32(0), self.m.i32(0),
               self.m.i32(strides[1]), self.m.i32(strides[0]), self.m.i32(fuse if direct else C.FUSED_NONE),
               self.m.boolean(False)]
        self.emit(C.TRANSPOSE_CONV_2D, ins, [y])
        if direct:
            self.bind(Y, y)
        else:
            self._finish(Y, y, act, params)

    # fully connected -------------------------------------------------------------
    def _fc(self, Y, a_op: int, a_shape, w: np.ndarray, bias: np.ndarray, act, params, z):
        """FULLY_CONNECTED of a rank-2 operand with weights [N, K]."""
        ys = self.shape(Y)
        fuse = C.FUSED_NONE
        f = _fusable(act, params)
        if z is None and f is not None:
            fuse, act = f, ""
        direct = z is None and act in ("", None) and len(ys) == 2
        out2 = (a_shape[0], w.shape[0])
        y = self.out_tensor(Y) if direct else self.tmp(out2)
        self.emit(C.FULLY_CONNECTED, [a_op, self.m.const(np.ascontiguousarray(w, np.float32)),
                                      self.m.const(np.ascontiguousarray(bias, np.float32)), self.m.i32(fuse)], [y])
        if len(ys) != 2:
            y = self.from_nchw(self.reshape(y, ys), ys)
        if direct:
            self.bind(Y, y)
        else:
            self._finish(Y, y, act, params, z)

    def _gemm(self, node, act="", params=(), z=None):
        A, Bv = node.inputs[0], node.inputs[1]
        Cv = node.inputs[2] if len(node.inputs) > 2 else None
        if int(_attr(node, "transA", 0)):
            raise Unsupported("Gemm with transA=1")
        b = self.const_array(Bv, "Gemm's B").astype(np.float32)
        alpha, beta = float(_attr(node, "alpha", 1.0)), float(_attr(node, "beta", 1.0))
        w = b if int(_attr(node, "transB", 0)) else b.T
        w = w * np.float32(alpha)
        n = w.shape[0]
        if Cv is None:
            bias = np.zeros(n, np.float32)
        else:
            c = self.const_array(Cv, "Gemm's C").astype(np.float32) * np.float32(beta)
            if c.size == 1:
                bias = np.full(n, c.reshape(-1)[0], np.float32)
            elif c.shape[-1] == n and c.size == n:
                bias = c.reshape(n)
            else:
                raise Unsupported("Gemm's C does not broadcast along rows (NNAPI's bias is one row)")
        a_shape = self.shape(A)
        if id(A) in self.lazy_flat:  # flatten of NHWC data: permute the weight columns to (H, W, C) order
            src = self.lazy_flat[id(A)]
            n_, c_, h_, w_ = self.shape(src)
            w = np.ascontiguousarray(w.reshape(n, c_, h_, w_).transpose(0, 2, 3, 1).reshape(n, -1))
            a_op = self.reshape(self.inp(src), a_shape)
        else:
            a_op = self.float_input(A)
        self._fc(node.outputs[0], a_op, a_shape, w, bias, act, params, z)

    def op_Gemm(self, node):
        self._gemm(node)

    def minirt_FusedGemm(self, node):
        z = node.inputs[3] if len(node.inputs) > 3 else None
        self._gemm(node, _attr(node, "activation", ""), list(_attr(node, "activation_params", []) or []), z)

    def _matmul(self, node, act="", params=(), bias_v=None, z=None):
        A, Bv = node.inputs[0], node.inputs[1]
        a_shape, b_shape = self.shape(A), self.shape(Bv)
        Y = node.outputs[0]
        bconst = self.ctx.const(Bv)
        if bconst is not None and len(b_shape) == 2 and len(a_shape) >= 2:
            w = np.asarray(bconst, np.float32).T
            bias = np.zeros(w.shape[0], np.float32)
            if bias_v is not None:
                bias = self.const_array(bias_v, "FusedMatMul's bias").astype(np.float32)
                if bias.size == 1:
                    bias = np.full(w.shape[0], bias.reshape(-1)[0], np.float32)
                elif bias.size != w.shape[0]:
                    raise Unsupported("MatMul bias is not one row")
                bias = bias.reshape(-1)
            a = self.nchw(A) if len(a_shape) == 4 else self.float_input(A)
            rows = int(np.prod(a_shape[:-1]))
            a2 = self.reshape(a, (rows, a_shape[-1]))
            self._fc(Y, a2, (rows, a_shape[-1]), w, bias, act, params, z)
            return
        if bias_v is not None:
            raise Unsupported("batched FusedMatMul with a bias")
        if len(a_shape) < 2 or len(b_shape) < 2 or len(a_shape) != len(b_shape):
            raise Unsupported("MatMul with broadcast batch dimensions")
        if a_shape[:-2] != b_shape[:-2]:
            raise Unsupported("MatMul with broadcast batch dimensions")
        ys = self.shape(Y)
        a = self.nchw(A) if len(a_shape) == 4 else self.float_input(A)
        b = self.nchw(Bv) if len(b_shape) == 4 else self.float_input(Bv)
        y = self.tmp(ys)
        self.emit(C.BATCH_MATMUL, [a, b, self.m.boolean(False), self.m.boolean(False)], [y])
        y = self.from_nchw(y, ys)
        self._finish(Y, y, act, params, z)

    def op_MatMul(self, node):
        self._matmul(node)

    def minirt_FusedMatMul(self, node):
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        z = node.inputs[3] if len(node.inputs) > 3 else None
        self._matmul(node, _attr(node, "activation", ""), list(_attr(node, "activation_params", []) or []), bias, z)

    # pooling ---------------------------------------------------------------------------
    def _pool(self, node, code):
        X = node.inputs[0]
        xs = self.shape(X)
        if len(xs) != 4:
            raise Unsupported(f"{node.op_type} on a rank-{len(xs)} input (NNAPI pools 2-D)")
        if len(node.outputs) > 1 and node.outputs[1] is not None and node.outputs[1].name:
            raise Unsupported("MaxPool with an Indices output")
        kernel = list(_attr(node, "kernel_shape"))
        strides = list(_attr(node, "strides", [1, 1]))
        if list(_attr(node, "dilations", [1, 1]) or [1, 1]) != [1, 1]:
            raise Unsupported("dilated pooling")
        top, left, bottom, right = self._conv_pads(node, xs[2:], kernel, strides, [1, 1])
        Y = node.outputs[0]
        ys = self.shape(Y)
        # ceil_mode (and any rounding) : grow the end padding until the floor formula gives ONNX's size
        pads_end = [bottom, right]
        for i, (b, k, s) in enumerate(zip((top, left), kernel, strides)):
            while (xs[2 + i] + b + pads_end[i] - k) // s + 1 < ys[2 + i]:
                pads_end[i] += 1
        bottom, right = pads_end
        if code == C.AVERAGE_POOL_2D and any((top, left, bottom, right)):
            if int(_attr(node, "count_include_pad", 0)):
                raise Unsupported("AveragePool with count_include_pad=1 and padding (NNAPI excludes padding)")
            if not _same_padding(xs[2:], kernel, strides, (top, left, bottom, right)):
                raise Unsupported("AveragePool padding that is not TFLite's SAME (cannot be checked on TFLite)")
        y = self.out_tensor(Y)
        ins = [self.float_input(X), self.m.i32(left), self.m.i32(right), self.m.i32(top), self.m.i32(bottom),
               self.m.i32(strides[1]), self.m.i32(strides[0]), self.m.i32(kernel[1]), self.m.i32(kernel[0]),
               self.m.i32(C.FUSED_NONE)]
        self.emit(code, ins, [y])
        self.bind(Y, y)

    def op_MaxPool(self, node):
        self._pool(node, C.MAX_POOL_2D)

    def op_AveragePool(self, node):
        self._pool(node, C.AVERAGE_POOL_2D)

    def _global_pool(self, node, code):
        X = node.inputs[0]
        xs = self.shape(X)
        if len(xs) != 4:
            raise Unsupported(f"{node.op_type} on a rank-{len(xs)} input")
        Y = node.outputs[0]
        y = self.out_tensor(Y)
        ins = [self.float_input(X)] + [self.m.i32(0)] * 4 + [self.m.i32(1), self.m.i32(1), self.m.i32(xs[3]),
                                                             self.m.i32(xs[2]), self.m.i32(C.FUSED_NONE)]
        self.emit(code, ins, [y])
        self.bind(Y, y)

    def op_GlobalAveragePool(self, node):
        self._global_pool(node, C.AVERAGE_POOL_2D)

    def op_GlobalMaxPool(self, node):
        self._global_pool(node, C.MAX_POOL_2D)

    def op_ReduceMean(self, node):
        X, Y = node.inputs[0], node.outputs[0]
        xs = self.shape(X)
        axes = _attr(node, "axes")
        if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
            axes = self.const_array(node.inputs[1], "ReduceMean's axes").reshape(-1).tolist()
        if axes is None or len(axes) == 0:
            if int(_attr(node, "noop_with_empty_axes", 0)):
                raise Unsupported("ReduceMean with noop_with_empty_axes")
            axes = list(range(len(xs)))
        keep = int(_attr(node, "keepdims", 1))
        axes = sorted(a % len(xs) for a in axes)
        if not keep and len(xs) == 4:
            x = self.nchw(X)
            iax = axes
        else:
            x = self.float_input(X)
            iax = sorted(self.axis_map(a, len(xs)) for a in axes)
        ys = self.shape(Y)
        y = self.out_tensor(Y) if (keep or len(ys) != 4) else self.tmp(ys)
        self.emit(C.MEAN, [x, self.m.const(np.array(iax, np.int32)), self.m.i32(keep)], [y])
        if not keep and len(ys) == 4:
            y = self.from_nchw(y, ys)
        self.bind(Y, y)

    # elementwise -------------------------------------------------------------------------
    def _binary(self, node, code):
        A, B = node.inputs[0], node.inputs[1]
        Y = node.outputs[0]
        r = len(self.shape(Y))
        for v in (A, B):
            if self.tensor_type(v) != C.TENSOR_FLOAT32:
                raise Unsupported(f"{node.op_type} on {self.ctx.dtype(v)} (NNAPI lowering: float32)")
        if code == C.SUB and self.level < C.MIN_API_LEVEL[C.SUB] and self.ctx.const(B) is not None:
            code, b = C.ADD, self._neg_const(B, r, lambda c: -c)
        elif code == C.DIV and self.level < C.MIN_API_LEVEL[C.DIV] and self.ctx.const(B) is not None:
            code, b = C.MUL, self._neg_const(B, r, lambda c: 1.0 / c)
        else:
            b = self.broadcast_operand(B, r)
        a = self.broadcast_operand(A, r)
        y = self.out_tensor(Y)
        ins = [a, b] + ([self.m.i32(C.FUSED_NONE)] if code in (C.ADD, C.SUB, C.MUL, C.DIV) else [])
        self.emit(code, ins, [y])
        self.bind(Y, y)

    def _neg_const(self, v, rank, fn):
        a = np.asarray(self.ctx.const(v), np.float32)
        a = fn(a).astype(np.float32).reshape((1,) * (rank - a.ndim) + a.shape)
        if rank == 4:
            a = a.transpose(TO_NHWC)
        return self.m.const(np.ascontiguousarray(a))

    def op_Add(self, node):
        self._binary(node, C.ADD)

    def op_Sub(self, node):
        self._binary(node, C.SUB)

    def op_Mul(self, node):
        self._binary(node, C.MUL)

    def op_Div(self, node):
        self._binary(node, C.DIV)

    def op_Max(self, node):
        if len(node.inputs) != 2:
            raise Unsupported("Max of more than two inputs")
        self._binary(node, C.MAXIMUM)

    def op_Min(self, node):
        if len(node.inputs) != 2:
            raise Unsupported("Min of more than two inputs")
        self._binary(node, C.MINIMUM)

    def op_PRelu(self, node):
        X, S, Y = node.inputs[0], node.inputs[1], node.outputs[0]
        r = len(self.shape(Y))
        y = self.out_tensor(Y)
        self.emit(C.PRELU, [self.float_input(X), self.broadcast_operand(S, r)], [y])
        self.bind(Y, y)

    def _unary(self, node, code):
        X, Y = node.inputs[0], node.outputs[0]
        y = self.out_tensor(Y)
        self.emit(code, [self.float_input(X)], [y])
        self.bind(Y, y)

    def op_Relu(self, node):
        self._unary(node, C.RELU)

    def op_Sigmoid(self, node):
        self._unary(node, C.LOGISTIC)

    def op_Tanh(self, node):
        self._unary(node, C.TANH)

    def op_Abs(self, node):
        self._unary(node, C.ABS)

    def op_Exp(self, node):
        self._unary(node, C.EXP)

    def op_Log(self, node):
        self._unary(node, C.LOG)

    def op_Neg(self, node):
        self._unary(node, C.NEG)

    def op_Sqrt(self, node):
        self._unary(node, C.SQRT)

    def op_Floor(self, node):
        self._unary(node, C.FLOOR)

    def _act_node(self, node, act, params):
        X, Y = node.inputs[0], node.outputs[0]
        self.bind(Y, self.activation(self.float_input(X), act, params, self.out_tensor(Y)))

    def op_HardSwish(self, node):
        self._act_node(node, "HardSwish", [])

    def op_HardSigmoid(self, node):
        self._act_node(node, "HardSigmoid", [float(_attr(node, "alpha", 0.2)), float(_attr(node, "beta", 0.5))])

    def op_LeakyRelu(self, node):
        self._act_node(node, "LeakyRelu", [float(_attr(node, "alpha", 0.01))])

    def op_Clip(self, node):
        lo, hi = _attr(node, "min", -math.inf), _attr(node, "max", math.inf)
        if len(node.inputs) > 1 and node.inputs[1] is not None:
            lo = float(self.const_array(node.inputs[1], "Clip's min").reshape(-1)[0])
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            hi = float(self.const_array(node.inputs[2], "Clip's max").reshape(-1)[0])
        self._act_node(node, "Clip", [lo, hi])

    def minirt_Activation(self, node):
        self._act_node(node, _attr(node, "activation", ""), list(_attr(node, "activation_params", []) or []))

    def op_Elu(self, node):
        raise Unsupported("Elu (TFLite's ELU has no alpha; NNAPI's needs API 30)")

    def op_Identity(self, node):
        X, Y = node.inputs[0], node.outputs[0]
        self.tensor_type(X)
        self.bind(Y, self.inp(X))

    def op_Dropout(self, node):
        if len(node.outputs) > 1 and node.outputs[1] is not None and node.outputs[1].name:
            raise Unsupported("Dropout with a mask output")
        for v in node.inputs[1:]:
            if v is not None and self.ctx.const(v) is None:
                raise Unsupported("Dropout with a run-time ratio / training_mode")
        if len(node.inputs) > 2 and node.inputs[2] is not None and bool(np.asarray(self.ctx.const(node.inputs[2]))):
            raise Unsupported("Dropout in training mode")
        self.op_Identity(node)

    def op_BatchNormalization(self, node):
        if len([o for o in node.outputs if o is not None and o.name]) > 1 or int(_attr(node, "training_mode", 0)):
            raise Unsupported("BatchNormalization in training mode")
        X, Y = node.inputs[0], node.outputs[0]
        xs = self.shape(X)
        g, b, mean, var = (self.const_array(v, "BatchNormalization's parameters").astype(np.float64)
                           for v in node.inputs[1:5])
        eps = float(_attr(node, "epsilon", 1e-5))
        scale = g / np.sqrt(var + eps)
        shift = b - mean * scale
        if len(xs) == 4:
            shape = (scale.size,)
        else:
            shape = (scale.size,) + (1,) * (len(xs) - 2)
        t = self.tmp(self.idims(xs))
        x = self.float_input(X)
        self.emit(C.MUL, [x, self.m.const(scale.astype(np.float32).reshape(shape)), self.m.i32(0)], [t])
        y = self.out_tensor(Y)
        self.emit(C.ADD, [t, self.m.const(shift.astype(np.float32).reshape(shape)), self.m.i32(0)], [y])
        self.bind(Y, y)

    # softmax -------------------------------------------------------------------------------
    def op_Softmax(self, node):
        X, Y = node.inputs[0], node.outputs[0]
        xs = self.shape(X)
        r = len(xs)
        opset = self.ctx.opset(node)
        axis = int(_attr(node, "axis", -1 if opset >= 13 else 1)) % r
        if opset < 13 and int(np.prod(xs[axis + 1:], dtype=np.int64)) != 1 and axis != r - 1:
            raise Unsupported(f"Softmax (opset {opset}) over the flattened axes {axis}..{r - 1}")
        if opset < 13 and axis != r - 1:
            # softmax over [axis:] where the trailing dims are 1 == softmax over axis alone
            pass
        iaxis = self.axis_map(axis, r)
        if iaxis != r - 1:
            raise Unsupported("Softmax over an axis other than the last (channels for 4-D)")
        if r not in (2, 4):
            self.need("rank_1_3_softmax", f"Softmax on a rank-{r} tensor")
        y = self.out_tensor(Y)
        self.emit(C.SOFTMAX, [self.float_input(X), self.m.f32(1.0)], [y])
        self.bind(Y, y)

    # shape manipulation ----------------------------------------------------------------------
    def _reshape_to(self, X, Y) -> None:
        xs, ys = self.shape(X), self.shape(Y)
        if self.tensor_type(X) != C.TENSOR_FLOAT32:
            raise Unsupported("reshape of a non-float32 tensor")
        if len(xs) == 4 and not self.trivial(xs) and ys == (xs[0], xs[1] * xs[2] * xs[3]) and id(X) in self.vals:
            self.lazy_flat[id(Y)] = X
            return
        x = self.nchw(X) if len(xs) == 4 else self.inp(X)
        if len(ys) == 4:
            if self.trivial(ys):
                y = self.reshape(x, self.idims(ys))
            else:
                y = self.transpose(self.reshape(x, ys), TO_NHWC)
        else:
            y = self.reshape(x, ys)
        self.bind(Y, y)

    def op_Reshape(self, node):
        self._reshape_to(node.inputs[0], node.outputs[0])

    def op_Flatten(self, node):
        self._reshape_to(node.inputs[0], node.outputs[0])

    def op_Squeeze(self, node):
        self._reshape_to(node.inputs[0], node.outputs[0])

    def op_Unsqueeze(self, node):
        self._reshape_to(node.inputs[0], node.outputs[0])

    def op_Transpose(self, node):
        X, Y = node.inputs[0], node.outputs[0]
        xs = self.shape(X)
        r = len(xs)
        perm = list(_attr(node, "perm", list(range(r))[::-1]))
        p_in = TO_NHWC if r == 4 else tuple(range(r))
        p_out = TO_NHWC if r == 4 else tuple(range(r))
        inv_in = [p_in.index(i) for i in range(r)]
        q = [inv_in[perm[p_out[k]]] for k in range(r)]
        self.bind(Y, self.transpose(self.float_input(X), q))

    def op_Concat(self, node):
        Y = node.outputs[0]
        ys = self.shape(Y)
        axis = int(_attr(node, "axis")) % len(ys)
        ins = [v for v in node.inputs if v is not None and int(np.prod(self.shape(v))) > 0]
        ops = [self.float_input(v) for v in ins]
        y = self.out_tensor(Y)
        self.emit(C.CONCATENATION, ops + [self.m.i32(self.axis_map(axis, len(ys)))], [y])
        self.bind(Y, y)

    def op_Pad(self, node):
        X, Y = node.inputs[0], node.outputs[0]
        xs = self.shape(X)
        r = len(xs)
        mode = _attr(node, "mode", "constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if self.ctx.opset(node) < 11:
            pads = list(_attr(node, "pads"))
            value = float(_attr(node, "value", 0.0))
        else:
            pads = self.const_array(node.inputs[1], "Pad's pads").reshape(-1).tolist()
            value = 0.0
            if len(node.inputs) > 2 and node.inputs[2] is not None:
                value = float(self.const_array(node.inputs[2], "Pad's value").reshape(-1)[0])
            if len(node.inputs) > 3 and node.inputs[3] is not None:
                axes = [a % r for a in self.const_array(node.inputs[3], "Pad's axes").reshape(-1).tolist()]
                full = [0] * (2 * r)
                for i, a in enumerate(axes):
                    full[a], full[a + r] = pads[i], pads[i + len(axes)]
                pads = full
        if any(p < 0 for p in pads):
            raise Unsupported("Pad with negative pads (cropping)")
        order = TO_NHWC if r == 4 else tuple(range(r))
        paddings = np.array([[pads[a], pads[a + r]] for a in order], np.int32)
        y = self.out_tensor(Y)
        x = self.float_input(X)
        if mode == "constant":
            if value == 0.0:
                self.emit(C.PAD, [x, self.m.const(paddings)], [y])
            else:
                self.emit(C.PAD_V2, [x, self.m.const(paddings), self.m.f32(value)], [y])
        elif mode == "reflect":
            self.emit(C.MIRROR_PAD, [x, self.m.const(paddings), self.m.i32(0)], [y])
        else:
            raise Unsupported(f"Pad mode {mode!r}")
        self.bind(Y, y)

    def op_Resize(self, node):
        X, Y = node.inputs[0], node.outputs[0]
        xs, ys = self.shape(X), self.shape(Y)
        if len(xs) != 4 or xs[:2] != ys[:2]:
            raise Unsupported("Resize other than of the two spatial axes of a 4-D tensor")
        mode = _attr(node, "mode", "nearest")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        ctm = _attr(node, "coordinate_transformation_mode", "half_pixel")
        ctm = ctm.decode() if isinstance(ctm, bytes) else ctm
        nmode = _attr(node, "nearest_mode", "round_prefer_floor")
        nmode = nmode.decode() if isinstance(nmode, bytes) else nmode
        if self.ctx.opset(node) < 11:
            ctm = "asymmetric"
            nmode = "floor"
        if int(_attr(node, "antialias", 0)):
            raise Unsupported("Resize with antialias")
        for v in node.inputs[1:]:
            if v is not None and v.name and self.ctx.const(v) is None:
                raise Unsupported("Resize with run-time roi / scales / sizes")
        scales_v = node.inputs[2] if self.ctx.opset(node) >= 11 and len(node.inputs) > 2 else (
            node.inputs[1] if len(node.inputs) > 1 else None)
        if scales_v is not None and scales_v.name and self.ctx.const(scales_v) is not None:
            sc = np.asarray(self.ctx.const(scales_v), np.float64).reshape(-1)
            if sc.size == 4 and any(abs(sc[i] - ys[i] / xs[i]) > 1e-6 * max(1.0, sc[i]) for i in (2, 3)):
                raise Unsupported("Resize whose scales differ from output/input size (NNAPI and TFLite map "
                                  "coordinates with the size ratio)")
        if ctm == "align_corners" and (ys[2] == 1 or ys[3] == 1):
            raise Unsupported("align_corners Resize to a size of 1")
        if _attr(node, "axes") is not None:
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
        y = self.out_tensor(Y)
        ins = [self.float_input(X), self.m.i32(ys[3]), self.m.i32(ys[2])]
        if align or half:
            self.need("resize_corner_modes", "Resize with align_corners / half_pixel coordinates")
            ins += [self.m.boolean(False), self.m.boolean(align), self.m.boolean(half)]
        elif code == C.RESIZE_NEAREST_NEIGHBOR:
            ins.append(self.m.boolean(False))
        self.emit(code, ins, [y])
        self.bind(Y, y)

    def op_Upsample(self, node):
        raise Unsupported("Upsample (deprecated): export with Resize")

    def op_DepthToSpace(self, node):
        mode = _attr(node, "mode", "DCR")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if mode != "DCR":
            raise Unsupported("DepthToSpace in CRD mode (NNAPI's is DCR)")
        X, Y = node.inputs[0], node.outputs[0]
        y = self.out_tensor(Y)
        self.emit(C.DEPTH_TO_SPACE, [self.float_input(X), self.m.i32(int(_attr(node, "blocksize")))], [y])
        self.bind(Y, y)

    def op_SpaceToDepth(self, node):
        mode = _attr(node, "mode", "DCR")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if mode != "DCR":
            raise Unsupported("SpaceToDepth in CRD mode (NNAPI's is DCR)")
        X, Y = node.inputs[0], node.outputs[0]
        y = self.out_tensor(Y)
        self.emit(C.SPACE_TO_DEPTH, [self.float_input(X), self.m.i32(int(_attr(node, "blocksize")))], [y])
        self.bind(Y, y)

    # quantization -------------------------------------------------------------------------------
    def _qparams(self, node):
        scale = self.const_array(node.inputs[1], "the quantization scale").astype(np.float32)
        zp_v = node.inputs[2] if len(node.inputs) > 2 else None
        zp = None if zp_v is None else self.const_array(zp_v, "the zero point")
        return scale, zp

    def op_QuantizeLinear(self, node):
        X, Y = node.inputs[0], node.outputs[0]
        scale, zp = self._qparams(node)
        if scale.size != 1:
            raise Unsupported("per-axis QuantizeLinear (NNAPI quantizes per tensor)")
        ydt = np.dtype(self.ctx.dtype(Y))
        if ydt == np.uint8:
            t = C.TENSOR_QUANT8_ASYMM
        elif ydt == np.int8:
            t = C.TENSOR_QUANT8_ASYMM_SIGNED
            if self.level < 30:
                raise Unsupported("int8 (signed) quantization needs Android API 30")
        else:
            raise Unsupported(f"QuantizeLinear to {ydt}")
        z = 0 if zp is None else int(zp.reshape(-1)[0])
        y = self.out_tensor(Y, t, scale=float(scale.reshape(-1)[0]), zero_point=z)
        self.emit(C.QUANTIZE, [self.float_input(X)], [y])
        self.m.need(C.OPERAND_API_LEVEL[t])
        self.bind(Y, y)

    def op_DequantizeLinear(self, node):
        X, Y = node.inputs[0], node.outputs[0]
        scale, zp = self._qparams(node)
        xdt = np.dtype(self.ctx.dtype(X))
        xs = self.shape(X)
        z = 0 if zp is None else int(np.asarray(zp).reshape(-1)[0])
        c = self.ctx.const(X)
        if scale.size != 1:
            if c is None or xdt != np.int8 or (zp is not None and np.any(zp != 0)):
                raise Unsupported("per-axis DequantizeLinear other than of a constant symmetric int8 tensor")
            axis = int(_attr(node, "axis", 1)) % len(xs)
            a = np.asarray(c, np.int8)
            if len(xs) == 4:
                a = a.transpose(TO_NHWC)
            x = self.m.const(np.ascontiguousarray(a), C.TENSOR_QUANT8_SYMM_PER_CHANNEL,
                             channel_dim=self.axis_map(axis, len(xs)), channel_scales=scale.reshape(-1).tolist())
            if self.level < 29:
                raise Unsupported("per-channel quantized constants need Android API 29")
            self.m.need(29)
        else:
            s = float(scale.reshape(-1)[0])
            if xdt == np.uint8:
                t = C.TENSOR_QUANT8_ASYMM
            elif xdt == np.int8:
                t = C.TENSOR_QUANT8_ASYMM_SIGNED
                if self.level < 30:
                    raise Unsupported("int8 (signed) quantization needs Android API 30")
                self.m.need(30)
            else:
                raise Unsupported(f"DequantizeLinear of {xdt}")
            if id(X) in self.vals:
                o = self.m.operands[self.vals[id(X)]]
                if o.type != t or abs(o.scale - s) > 1e-12 * max(1.0, s) or o.zero_point != z:
                    raise Unsupported("DequantizeLinear parameters differ from the tensor's quantization")
                x = self.vals[id(X)]
            elif c is not None:
                a = np.asarray(c)
                if a.ndim == 4:
                    a = a.transpose(TO_NHWC)
                x = self.m.const(np.ascontiguousarray(a.reshape(self.idims(xs))), t, scale=s, zero_point=z)
            else:
                x = self.add_model_input(X, t, scale=s, zero_point=z)
        y = self.out_tensor(Y)
        self.emit(C.DEQUANTIZE, [x], [y])
        self.bind(Y, y)


def _same_padding(in_hw, kernel, strides, pads) -> bool:
    """Whether explicit pads (top, left, bottom, right) equal TFLite's SAME padding."""
    top, left, bottom, right = pads
    for i, (b, e) in enumerate(((top, bottom), (left, right))):
        out = -(-in_hw[i] // strides[i])
        total = max((out - 1) * strides[i] + kernel[i] - in_hw[i], 0)
        if (b, e) != (total // 2, total - total // 2):
            return False
    return True


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
            scale, zp = low._qparams(consumer)
            if scale.size != 1:
                raise Unsupported("per-axis quantized partition input")
            t = C.TENSOR_QUANT8_ASYMM if np.dtype(dt) == np.uint8 else C.TENSOR_QUANT8_ASYMM_SIGNED
            low.add_model_input(v, t, scale=float(scale.reshape(-1)[0]),
                                zero_point=0 if zp is None else int(np.asarray(zp).reshape(-1)[0]))
        else:
            low.add_model_input(v)
    for node in nodes:
        low.node(node)
    input_operands = set(m.inputs)
    for v in outputs:
        if id(v) in low.lazy_flat:
            low.inp(v)
        if id(v) not in low.vals:
            raise Unsupported(f"partition output {v.name!r} was not produced")
        idx = low.vals[id(v)]
        o = m.operands[idx]
        if idx in input_operands or o.value is not None or idx in m.outputs:
            copy = m.tensor(o.dims, o.type, scale=o.scale, zero_point=o.zero_point)
            low.emit(C.RESHAPE, [idx, m.const(np.array(o.dims, np.int32))], [copy])
            idx = copy
        m.outputs.append(idx)
        m.output_perm.append(list(TO_NCHW) if len(low.shape(v)) == 4 else None)
        m.output_names.append(v.name or "")
    for o in m.operands:
        m.need(C.OPERAND_API_LEVEL[o.type])
    if m.min_api_level > level:
        raise Unsupported(f"the model needs Android API {m.min_api_level} (target API {level})")
    return m


def node_support(node, ctx, level: int) -> tuple[bool, str]:
    """Whether ``node`` lowers on its own at API ``level`` (the reason when not)."""
    try:
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
