"""NNAPI model description -> TFLite flatbuffer, operation for operation, by the rules of :data:`RULES`.

NNAPI's operations mirror TFLite's builtin operators, so each NNAPI
operation becomes one TFLite operator (plus a PAD / PADV2 in front of a
convolution or max pool whose explicit padding is not TFLite's SAME or
VALID).  Scalar NNAPI operands (strides, fuse codes, axis...) become the
operator's builtin options; tensor operands become tensors, constants with
their data in a buffer.  The translation is what checks the NNAPI lowering
on real kernels here: run by the TFLite interpreter, it must reproduce
onnxruntime's results.

Schema facts used (tensorflow/lite/schema/schema.fbs, file identifier TFL3):
table field slots, the BuiltinOperator and BuiltinOptions numbering, and
TensorType.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from minirt.targets.nnapi import oplevels as C
from minirt.targets.rules import Emitter, RuleSet
from minirt.targets.tflite.flatbuf import String, Table, Vector, finish, float_vector, int_vector


class TranslationError(Exception):
    """An NNAPI operation that has no TFLite equivalent in this translator."""


class Operation(NamedTuple):
    """One NNAPI operation of the model, as the rules see it: the "node" of this lowering."""

    code: int
    inputs: list  # operand indices
    outputs: list

    @property
    def op_type(self) -> str:
        return C.OPERATION_NAMES.get(self.code, str(self.code))


# The translation's rule set: NNAPI operations (one domain, keyed by operation name) -> TFLite
# operators.  A rule is ``(op: Operation, tr: _Translator)``; it refuses by raising TranslationError.
RULES = RuleSet("TFLite", missing="NNAPI operation {op} has no TFLite translation", error=TranslationError,
                key=lambda op: ("", op.op_type))


def _names(codes) -> tuple:
    return tuple(C.OPERATION_NAMES[c] for c in codes)


# TFLite BuiltinOperator codes
T_ADD, T_AVERAGE_POOL_2D, T_CONCATENATION, T_CONV_2D, T_DEPTHWISE_CONV_2D, T_DEPTH_TO_SPACE, T_DEQUANTIZE = 0, 1, 2, 3, 4, 5, 6
T_FLOOR, T_FULLY_CONNECTED, T_LOGISTIC, T_MAX_POOL_2D, T_MUL, T_RELU, T_RELU_N1_TO_1, T_RELU6 = 8, 9, 14, 17, 18, 19, 20, 21
T_RESHAPE, T_RESIZE_BILINEAR, T_SOFTMAX, T_SPACE_TO_DEPTH, T_TANH, T_PAD, T_TRANSPOSE, T_MEAN = 22, 23, 25, 26, 28, 34, 39, 40
T_SUB, T_DIV, T_EXP, T_PRELU, T_MAXIMUM, T_MINIMUM, T_NEG, T_PADV2 = 41, 42, 47, 54, 55, 57, 59, 60
T_TRANSPOSE_CONV, T_LOG, T_SQRT, T_RSQRT, T_RESIZE_NEAREST_NEIGHBOR, T_MIRROR_PAD, T_ABS = 67, 73, 75, 76, 97, 100, 101
T_QUANTIZE, T_HARD_SWISH, T_BATCH_MATMUL = 114, 117, 126
T_LOG_SOFTMAX, T_SUM, T_POW, T_REDUCE_MAX = 50, 74, 78, 82
T_GATHER, T_STRIDED_SLICE, T_SPLIT, T_SLICE = 36, 45, 49, 65
T_LESS, T_GREATER, T_SELECT = 58, 61, 64
T_LOCAL_RESPONSE_NORMALIZATION = 13

# BuiltinOptions union members (type ids)
O_CONV2D, O_DEPTHWISE, O_POOL2D, O_FC, O_SOFTMAX, O_CONCAT, O_ADD = 1, 2, 5, 8, 9, 10, 11
O_RESIZE_BILINEAR, O_RESHAPE, O_SPACE_TO_DEPTH, O_MUL, O_PAD, O_TRANSPOSE, O_REDUCER, O_SUB, O_DIV = 15, 17, 19, 21, 22, 26, 27, 28, 29
O_PADV2, O_TRANSPOSE_CONV, O_RESIZE_NEAREST, O_MIRROR_PAD, O_DEPTH_TO_SPACE, O_BATCH_MATMUL = 43, 49, 74, 77, 94, 101
O_GATHER, O_STRIDED_SLICE, O_SPLIT, O_SLICE = 23, 32, 35, 48
O_LOG_SOFTMAX, O_POW = 36, 56
O_LOCAL_RESPONSE_NORMALIZATION = 13

# TensorType
TT = {C.TENSOR_FLOAT32: 0, C.TENSOR_FLOAT16: 1, C.TENSOR_INT32: 2, C.TENSOR_QUANT8_ASYMM: 3, C.TENSOR_BOOL8: 6,
      C.TENSOR_QUANT8_ASYMM_SIGNED: 9, C.TENSOR_QUANT8_SYMM_PER_CHANNEL: 9, C.TENSOR_QUANT8_SYMM: 9}
SAME, VALID = 0, 1

_SIMPLE = {C.LOGISTIC: T_LOGISTIC, C.TANH: T_TANH, C.RELU: T_RELU, C.RELU1: T_RELU_N1_TO_1, C.RELU6: T_RELU6,
           C.HARD_SWISH: T_HARD_SWISH, C.QUANTIZE: T_QUANTIZE, C.DEQUANTIZE: T_DEQUANTIZE, C.ABS: T_ABS,
           C.EXP: T_EXP, C.LOG: T_LOG, C.NEG: T_NEG, C.SQRT: T_SQRT, C.RSQRT: T_RSQRT, C.FLOOR: T_FLOOR,
           C.PRELU: T_PRELU, C.MAXIMUM: T_MAXIMUM, C.MINIMUM: T_MINIMUM,
           # comparisons (broadcasting) and SELECT (condition, true value, false value; equal shapes): the
           # operand order of NNAPI's, no options
           C.LESS: T_LESS, C.GREATER: T_GREATER, C.SELECT: T_SELECT}
_BINARY = {C.ADD: (T_ADD, O_ADD), C.SUB: (T_SUB, O_SUB), C.MUL: (T_MUL, O_MUL), C.DIV: (T_DIV, O_DIV)}


def _padding(in_hw, kernel, strides, dil, pads, out_hw):
    """'SAME' / 'VALID' when explicit NNAPI pads (l, r, t, b) equal TFLite's, else None."""
    left, right, top, bottom = pads
    same = valid = True
    for i, (b, e) in enumerate(((top, bottom), (left, right))):
        eff = (kernel[i] - 1) * dil[i] + 1
        o_same = -(-in_hw[i] // strides[i])
        total = max((o_same - 1) * strides[i] + eff - in_hw[i], 0)
        if not ((b, e) == (total // 2, total - total // 2) and out_hw[i] == o_same):
            same = False
        if not (b == 0 and e == 0 and out_hw[i] == (in_hw[i] - eff) // strides[i] + 1):
            valid = False
    if valid:
        return VALID
    if same:
        return SAME
    return None


class _Translator(Emitter):
    """The TFLite model under construction (tensors, buffers, opcodes, operators) from NNModel ``model``."""

    def __init__(self, model):
        super().__init__(model)
        self.m = model
        self.buffers = [Table()]  # buffer 0: the empty buffer
        self.tensors = []
        self.tensor_of: dict = {}
        self.opcodes: list = []
        self.opcode_index: dict = {}
        self.operators = []

    # tensors ----------------------------------------------------------------------------
    def tensor(self, idx: int) -> int:
        if idx in self.tensor_of:
            return self.tensor_of[idx]
        o = self.m.operands[idx]
        if o.type in C.SCALAR_TYPES:
            raise TranslationError(f"scalar operand {idx} used as a tensor")
        if o.type not in TT:
            raise TranslationError(f"operand type {C.OPERAND_TYPE_NAMES.get(o.type, o.type)} has no TFLite type")
        t = self._new_tensor(o.dims, TT[o.type], o.value if isinstance(o.value, np.ndarray) else None,
                             o.name or f"t{idx}", o)
        self.tensor_of[idx] = t
        return t

    def _new_tensor(self, dims, ttype, data=None, name="", quant=None) -> int:
        buf = 0
        if data is not None:
            self.buffers.append(Table().ref(0, Vector("bytes", np.ascontiguousarray(data).tobytes(), align=16)))
            buf = len(self.buffers) - 1
        t = Table().ref(0, int_vector(dims)).scalar(1, "i8", ttype).scalar(2, "u32", buf).ref(3, String(name))
        if quant is not None and (quant.scale or quant.channel_scales):
            q = Table()
            if quant.channel_scales is not None:
                q.ref(2, float_vector(quant.channel_scales)).ref(3, int_vector([0] * len(quant.channel_scales), "i64"))
                q.scalar(6, "i32", int(quant.channel_dim))
            else:
                q.ref(2, float_vector([quant.scale])).ref(3, int_vector([quant.zero_point], "i64"))
            t.ref(4, q)
        self.tensors.append(t)
        return len(self.tensors) - 1

    def const_tensor(self, array, name="") -> int:
        a = np.ascontiguousarray(array)
        tt = {np.dtype(np.float32): 0, np.dtype(np.int32): 2}[a.dtype]
        return self._new_tensor(a.shape, tt, a, name)

    def scalar(self, idx: int):
        v = self.m.operands[idx].value
        if v is None or isinstance(v, np.ndarray):
            raise TranslationError(f"operand {idx} should be a constant scalar")
        return v

    # operators --------------------------------------------------------------------------
    def emit(self, code: int, inputs, outputs, opt_type: int = 0, options: Table | None = None) -> None:
        if code not in self.opcode_index:
            self.opcode_index[code] = len(self.opcodes)
            self.opcodes.append(Table().scalar(0, "i8", min(code, 127)).scalar(2, "i32", 1, default=None)
                                .scalar(3, "i32", code))
        op = Table().scalar(0, "u32", self.opcode_index[code]).ref(1, int_vector(inputs)).ref(2, int_vector(outputs))
        if options is not None:
            op.scalar(3, "u8", opt_type).ref(4, options)
        self.operators.append(op)

    def pad_input(self, x: int, pads_nhwc, value: float) -> int:
        """A PAD/PADV2 of tensor x (TFLite tensor index) with paddings [[0,0],[t,b],[l,r],[0,0]]."""
        dims = self._dims(x)
        out_dims = [d + a + b for d, (a, b) in zip(dims, pads_nhwc)]
        y = self._new_tensor(out_dims, 0, None, f"pad{len(self.tensors)}")
        p = self.const_tensor(np.array(pads_nhwc, np.int32))
        if value == 0.0:
            self.emit(T_PAD, [x, p], [y], O_PAD, Table())
        else:
            v = self.const_tensor(np.array([value], np.float32))
            self.emit(T_PADV2, [x, p, v], [y], O_PADV2, Table())
        return y

    def _dims(self, t: int) -> list:
        return list(self._shapes[t])

    def translate(self) -> bytes:
        m = self.m
        self._shapes = {}
        orig_new = self._new_tensor

        def tracking(dims, *a, **k):
            i = orig_new(dims, *a, **k)
            self._shapes[i] = list(dims)
            return i

        self._new_tensor = tracking
        RULES.emit_all([Operation(code, list(ins), list(outs)) for code, ins, outs in m.operations], self)
        inputs = [self.tensor(i) for i in m.inputs]
        outputs = [self.tensor(o) for o in m.outputs]
        sub = (Table().ref(0, Vector("ref", self.tensors)).ref(1, int_vector(inputs)).ref(2, int_vector(outputs))
               .ref(3, Vector("ref", self.operators)).ref(4, String("main")))
        model = (Table().scalar(0, "u32", 3).ref(1, Vector("ref", self.opcodes)).ref(2, Vector("ref", [sub]))
                 .ref(3, String("minirt NNAPI translation")).ref(4, Vector("ref", self.buffers)))
        return finish(model, b"TFL3")


# --- the rules: one per NNAPI operation family ----------------------------------------


@RULES.rule(*_names(_BINARY))
def _binary(op, tr) -> None:
    code, ins, outs = op
    T = tr.tensor
    tcode, otype = _BINARY[code]
    tr.emit(tcode, [T(ins[0]), T(ins[1])], [T(outs[0])], otype,
            Table().scalar(0, "i8", tr.scalar(ins[2])))


@RULES.rule(*_names(_SIMPLE))
def _simple(op, tr) -> None:
    code, ins, outs = op
    T = tr.tensor
    tr.emit(_SIMPLE[code], [T(i) for i in ins], [T(outs[0])])


@RULES.rule(*_names((C.CONV_2D, C.DEPTHWISE_CONV_2D)))
def _conv(op, tr) -> None:
    code, ins, outs = op
    T = tr.tensor
    o = tr.m.operands
    x = T(ins[0])
    left, right, top, bottom, sw, sh = (tr.scalar(i) for i in ins[3:9])
    k = 9
    mult = None
    if code == C.DEPTHWISE_CONV_2D:
        mult = tr.scalar(ins[9])
        k = 10
    fuse = tr.scalar(ins[k])
    dw = dh = 1
    if len(ins) > k + 1:
        if tr.scalar(ins[k + 1]):
            raise TranslationError("NCHW layout flag")
        dw, dh = tr.scalar(ins[k + 2]), tr.scalar(ins[k + 3])
    fd = o[ins[1]].dims
    in_dims, out_dims = o[ins[0]].dims, o[outs[0]].dims
    pad = _padding(in_dims[1:3], fd[1:3], (sh, sw), (dh, dw), (left, right, top, bottom), out_dims[1:3])
    if pad is None:
        x = tr.pad_input(x, [[0, 0], [top, bottom], [left, right], [0, 0]], 0.0)
        pad = VALID
    opts = Table().scalar(0, "i8", pad).scalar(1, "i32", sw).scalar(2, "i32", sh)
    if code == C.CONV_2D:
        opts.scalar(3, "i8", fuse).scalar(4, "i32", dw, 1).scalar(5, "i32", dh, 1)
        tr.emit(T_CONV_2D, [x, T(ins[1]), T(ins[2])], [T(outs[0])], O_CONV2D, opts)
    else:
        opts.scalar(3, "i32", mult).scalar(4, "i8", fuse).scalar(5, "i32", dw, 1).scalar(6, "i32", dh, 1)
        tr.emit(T_DEPTHWISE_CONV_2D, [x, T(ins[1]), T(ins[2])], [T(outs[0])], O_DEPTHWISE, opts)


@RULES.rule(*_names((C.GROUPED_CONV_2D,)))
def _grouped_conv(op, tr) -> None:
    """TFLite has no grouped convolution operator that every interpreter runs: a SPLIT of the (padded)
    input's channels into the groups, one CONV_2D per group with its slice of the filter [out, kh, kw,
    in / group] and bias (output channels group-major, as NNAPI's), and a CONCATENATION of the results."""
    _, ins, outs = op
    T = tr.tensor
    o = tr.m.operands
    left, right, top, bottom, sw, sh, groups, fuse = (tr.scalar(i) for i in ins[3:11])
    if len(ins) > 11 and tr.scalar(ins[11]):
        raise TranslationError("NCHW layout flag")
    filt, bias = o[ins[1]].value, o[ins[2]].value
    if not isinstance(filt, np.ndarray) or not isinstance(bias, np.ndarray):
        raise TranslationError("GROUPED_CONV_2D with a run-time filter or bias")
    in_dims, out_dims = list(o[ins[0]].dims), list(o[outs[0]].dims)
    x = T(ins[0])
    pad = _padding(in_dims[1:3], filt.shape[1:3], (sh, sw), (1, 1), (left, right, top, bottom), out_dims[1:3])
    if pad is None:
        x = tr.pad_input(x, [[0, 0], [top, bottom], [left, right], [0, 0]], 0.0)
        pad = VALID
    x_dims = tr._dims(x)
    cin, cout = x_dims[3] // groups, out_dims[3] // groups
    parts = [tr._new_tensor(x_dims[:3] + [cin], TT[C.TENSOR_FLOAT32], None, f"group_in{len(tr.tensors)}")
             for _ in range(groups)]
    tr.emit(T_SPLIT, [tr.const_tensor(np.array(3, np.int32)), x], parts, O_SPLIT, Table().scalar(0, "i32", groups))
    results = []
    for g, part in enumerate(parts):
        y = tr._new_tensor(out_dims[:3] + [cout], TT[C.TENSOR_FLOAT32], None, f"group_out{len(tr.tensors)}")
        opts = (Table().scalar(0, "i8", pad).scalar(1, "i32", sw).scalar(2, "i32", sh).scalar(3, "i8", fuse))
        tr.emit(T_CONV_2D, [part, tr.const_tensor(filt[g * cout:(g + 1) * cout]),
                            tr.const_tensor(bias[g * cout:(g + 1) * cout])], [y], O_CONV2D, opts)
        results.append(y)
    tr.emit(T_CONCATENATION, results, [T(outs[0])], O_CONCAT, Table().scalar(0, "i32", 3))


@RULES.rule(*_names((C.AVERAGE_POOL_2D, C.MAX_POOL_2D)))
def _pool(op, tr) -> None:
    code, ins, outs = op
    T = tr.tensor
    o = tr.m.operands
    x = T(ins[0])
    left, right, top, bottom, sw, sh, fw, fh, fuse = (tr.scalar(i) for i in ins[1:10])
    in_dims, out_dims = o[ins[0]].dims, o[outs[0]].dims
    pad = _padding(in_dims[1:3], (fh, fw), (sh, sw), (1, 1), (left, right, top, bottom), out_dims[1:3])
    if pad is None:
        if code == C.AVERAGE_POOL_2D:
            raise TranslationError("average pool with padding that is not SAME")
        x = tr.pad_input(x, [[0, 0], [top, bottom], [left, right], [0, 0]], -3.4028234663852886e38)
        pad = VALID
    opts = (Table().scalar(0, "i8", pad).scalar(1, "i32", sw).scalar(2, "i32", sh).scalar(3, "i32", fw)
            .scalar(4, "i32", fh).scalar(5, "i8", fuse))
    tr.emit(T_AVERAGE_POOL_2D if code == C.AVERAGE_POOL_2D else T_MAX_POOL_2D, [x], [T(outs[0])],
            O_POOL2D, opts)


@RULES.rule(*_names((C.LOCAL_RESPONSE_NORMALIZATION,)))
def _local_response_normalization(op, tr) -> None:
    _, ins, outs = op
    T = tr.tensor
    if len(ins) > 5:
        raise TranslationError("LOCAL_RESPONSE_NORMALIZATION along an axis operand")
    radius, bias, alpha, beta = (tr.scalar(i) for i in ins[1:5])
    opts = Table().scalar(0, "i32", radius).scalar(1, "f32", bias).scalar(2, "f32", alpha).scalar(3, "f32", beta)
    tr.emit(T_LOCAL_RESPONSE_NORMALIZATION, [T(ins[0])], [T(outs[0])], O_LOCAL_RESPONSE_NORMALIZATION, opts)


@RULES.rule(*_names((C.FULLY_CONNECTED,)))
def _fully_connected(op, tr) -> None:
    _, ins, outs = op
    T = tr.tensor
    tr.emit(T_FULLY_CONNECTED, [T(ins[0]), T(ins[1]), T(ins[2])], [T(outs[0])], O_FC,
            Table().scalar(0, "i8", tr.scalar(ins[3])))


@RULES.rule(*_names((C.CONCATENATION,)))
def _concatenation(op, tr) -> None:
    _, ins, outs = op
    T = tr.tensor
    tr.emit(T_CONCATENATION, [T(i) for i in ins[:-1]], [T(outs[0])], O_CONCAT,
            Table().scalar(0, "i32", tr.scalar(ins[-1])))


@RULES.rule(*_names((C.RESHAPE,)))
def _reshape(op, tr) -> None:
    _, ins, outs = op
    T = tr.tensor
    o = tr.m.operands
    shape = [int(s) for s in o[outs[0]].dims]
    tr.emit(T_RESHAPE, [T(ins[0]), T(ins[1])], [T(outs[0])], O_RESHAPE, Table().ref(0, int_vector(shape)))


@RULES.rule(*_names((C.TRANSPOSE,)))
def _transpose(op, tr) -> None:
    _, ins, outs = op
    T = tr.tensor
    tr.emit(T_TRANSPOSE, [T(ins[0]), T(ins[1])], [T(outs[0])], O_TRANSPOSE, Table())


@RULES.rule(*_names((C.SOFTMAX, C.LOG_SOFTMAX)))
def _softmax(op, tr) -> None:
    code, ins, outs = op
    T = tr.tensor
    dims = list(tr.m.operands[ins[0]].dims)
    rank = len(dims)
    axis = tr.scalar(ins[2]) % rank if len(ins) > 2 else rank - 1
    if code == C.SOFTMAX:
        tcode, otype, opts = T_SOFTMAX, O_SOFTMAX, Table().scalar(0, "f32", tr.scalar(ins[1]))
    else:
        # TFLite's LOG_SOFTMAX has no beta: NNAPI's beta of 1 (what the lowering emits) is the only one
        if tr.scalar(ins[1]) != 1.0:
            raise TranslationError(f"LOG_SOFTMAX with beta {tr.scalar(ins[1])}")
        tcode, otype, opts = T_LOG_SOFTMAX, O_LOG_SOFTMAX, Table()
    if axis == rank - 1:
        tr.emit(tcode, [T(ins[0])], [T(outs[0])], otype, opts)
        return
    # TFLite's (LOG_)SOFTMAX runs along the last axis: NNAPI's axis operand becomes a TRANSPOSE there and back
    perm = [j for j in range(rank) if j != axis] + [axis]
    moved_dims = [dims[p] for p in perm]
    moved = tr._new_tensor(moved_dims, TT[C.TENSOR_FLOAT32], None, f"softmax_in{len(tr.tensors)}")
    tr.emit(T_TRANSPOSE, [T(ins[0]), tr.const_tensor(np.array(perm, np.int32))], [moved], O_TRANSPOSE, Table())
    soft = tr._new_tensor(moved_dims, TT[C.TENSOR_FLOAT32], None, f"softmax_out{len(tr.tensors)}")
    tr.emit(tcode, [moved], [soft], otype, opts)
    back = [perm.index(j) for j in range(rank)]
    tr.emit(T_TRANSPOSE, [soft, tr.const_tensor(np.array(back, np.int32))], [T(outs[0])], O_TRANSPOSE, Table())


_REDUCERS = {C.MEAN: T_MEAN, C.REDUCE_SUM: T_SUM, C.REDUCE_MAX: T_REDUCE_MAX}


@RULES.rule(*_names(_REDUCERS))
def _reduce(op, tr) -> None:
    # NNAPI's keep_dims is an INT32 for MEAN and a BOOL for REDUCE_*: both are ReducerOptions.keep_dims
    code, ins, outs = op
    T = tr.tensor
    tr.emit(_REDUCERS[code], [T(ins[0]), T(ins[1])], [T(outs[0])], O_REDUCER,
            Table().scalar(0, "bool", int(bool(tr.scalar(ins[2])))))


@RULES.rule(*_names((C.POW,)))
def _pow(op, tr) -> None:
    _, ins, outs = op
    T = tr.tensor
    tr.emit(T_POW, [T(ins[0]), T(ins[1])], [T(outs[0])], O_POW, Table())


@RULES.rule(*_names((C.PAD,)))
def _pad(op, tr) -> None:
    _, ins, outs = op
    T = tr.tensor
    tr.emit(T_PAD, [T(ins[0]), T(ins[1])], [T(outs[0])], O_PAD, Table())


@RULES.rule(*_names((C.PAD_V2,)))
def _pad_v2(op, tr) -> None:
    _, ins, outs = op
    T = tr.tensor
    v = tr.const_tensor(np.array([tr.scalar(ins[2])], np.float32))
    tr.emit(T_PADV2, [T(ins[0]), T(ins[1]), v], [T(outs[0])], O_PADV2, Table())


@RULES.rule(*_names((C.MIRROR_PAD,)))
def _mirror_pad(op, tr) -> None:
    _, ins, outs = op
    T = tr.tensor
    tr.emit(T_MIRROR_PAD, [T(ins[0]), T(ins[1])], [T(outs[0])], O_MIRROR_PAD,
            Table().scalar(0, "i8", tr.scalar(ins[2])))


@RULES.rule(*_names((C.RESIZE_BILINEAR, C.RESIZE_NEAREST_NEIGHBOR)))
def _resize(op, tr) -> None:
    code, ins, outs = op
    T = tr.tensor
    w, h = tr.scalar(ins[1]), tr.scalar(ins[2])
    if len(ins) > 3 and tr.scalar(ins[3]):
        raise TranslationError("NCHW layout flag")
    align = bool(tr.scalar(ins[4])) if len(ins) > 4 else False
    half = bool(tr.scalar(ins[5])) if len(ins) > 5 else False
    size = tr.const_tensor(np.array([h, w], np.int32))
    if code == C.RESIZE_BILINEAR:
        opts = Table().scalar(2, "bool", int(align)).scalar(3, "bool", int(half))
        tr.emit(T_RESIZE_BILINEAR, [T(ins[0]), size], [T(outs[0])], O_RESIZE_BILINEAR, opts)
    else:
        opts = Table().scalar(0, "bool", int(align)).scalar(1, "bool", int(half))
        tr.emit(T_RESIZE_NEAREST_NEIGHBOR, [T(ins[0]), size], [T(outs[0])], O_RESIZE_NEAREST, opts)


@RULES.rule(*_names((C.TRANSPOSE_CONV_2D,)))
def _transpose_conv(op, tr) -> None:
    _, ins, outs = op
    T = tr.tensor
    o = tr.m.operands
    left, right, top, bottom, sw, sh, fuse = (tr.scalar(i) for i in ins[3:10])
    if any((left, right, top, bottom)):
        raise TranslationError("transposed convolution with padding")
    out_shape = tr.const_tensor(np.array(o[outs[0]].dims, np.int32))
    opts = Table().scalar(0, "i8", VALID).scalar(1, "i32", sw).scalar(2, "i32", sh).scalar(3, "i8", fuse)
    tr.emit(T_TRANSPOSE_CONV, [out_shape, T(ins[1]), T(ins[0]), T(ins[2])], [T(outs[0])],
            O_TRANSPOSE_CONV, opts)


@RULES.rule(*_names((C.BATCH_MATMUL,)))
def _batch_matmul(op, tr) -> None:
    _, ins, outs = op
    T = tr.tensor
    opts = Table().scalar(0, "bool", int(bool(tr.scalar(ins[2])))).scalar(1, "bool", int(bool(tr.scalar(ins[3]))))
    tr.emit(T_BATCH_MATMUL, [T(ins[0]), T(ins[1])], [T(outs[0])], O_BATCH_MATMUL, opts)


@RULES.rule(*_names((C.DEPTH_TO_SPACE, C.SPACE_TO_DEPTH)))
def _depth_space(op, tr) -> None:
    code, ins, outs = op
    T = tr.tensor
    opts = Table().scalar(0, "i32", tr.scalar(ins[1]))
    if code == C.DEPTH_TO_SPACE:
        tr.emit(T_DEPTH_TO_SPACE, [T(ins[0])], [T(outs[0])], O_DEPTH_TO_SPACE, opts)
    else:
        tr.emit(T_SPACE_TO_DEPTH, [T(ins[0])], [T(outs[0])], O_SPACE_TO_DEPTH, opts)


@RULES.rule(*_names((C.SPLIT,)))
def _split(op, tr) -> None:
    _, ins, outs = op
    T = tr.tensor
    # TFLite's SPLIT reads the axis from a 0-D int32 tensor in front of the data, NNAPI's from a scalar
    axis = tr.const_tensor(np.array(tr.scalar(ins[1]), np.int32))
    tr.emit(T_SPLIT, [axis, T(ins[0])], [T(o) for o in outs], O_SPLIT,
            Table().scalar(0, "i32", tr.scalar(ins[2])))


@RULES.rule(*_names((C.SLICE,)))
def _slice(op, tr) -> None:
    _, ins, outs = op
    T = tr.tensor
    tr.emit(T_SLICE, [T(ins[0]), T(ins[1]), T(ins[2])], [T(outs[0])], O_SLICE, Table())


@RULES.rule(*_names((C.STRIDED_SLICE,)))
def _strided_slice(op, tr) -> None:
    _, ins, outs = op
    T = tr.tensor
    begin_mask, end_mask, shrink_mask = (tr.scalar(i) for i in ins[4:7])
    opts = (Table().scalar(0, "i32", begin_mask).scalar(1, "i32", end_mask)
            .scalar(4, "i32", shrink_mask))
    tr.emit(T_STRIDED_SLICE, [T(i) for i in ins[:4]], [T(outs[0])], O_STRIDED_SLICE, opts)


@RULES.rule(*_names((C.GATHER,)))
def _gather(op, tr) -> None:
    _, ins, outs = op
    T = tr.tensor
    tr.emit(T_GATHER, [T(ins[0]), T(ins[2])], [T(outs[0])], O_GATHER, Table().scalar(0, "i32", tr.scalar(ins[1])))


def to_tflite(model) -> bytes:
    """The TFLite flatbuffer equivalent to NNModel ``model``."""
    return _Translator(model).translate()
