"""The NNAPI lowering's value plumbing: :class:`Lowerer`, the NNAPI model under construction.

The rules (``targets/nnapi/rules.py``) emit into a :class:`Lowerer`: it maps
ONNX values to NNAPI operands (model inputs, constants, intermediates) in the
internal layout (rank-4 values NHWC; docs/nnapi.md), changes layouts
(``nchw`` / ``from_nchw`` / ``broadcast_operand``), lowers activations
(``activation``, ``fuse_code``) and checks every operation against the
target API level (``emit`` / ``need`` raise :class:`Unsupported`).
"""
from __future__ import annotations

import math

import numpy as np

from minirt.targets.nnapi import oplevels as C
from minirt.targets.nnapi.model import NNModel
from minirt.targets.nnapi.shapes import compact_dims, static_shapes
from minirt.targets.rules import Emitter

TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)
MAX_RANK = 4
# The ops whose rules take values of rank > 4 (stored as operands of rank <= 4: Lowerer.order).  Such a
# value never crosses a partition boundary: the runtime feeds and returns operands as they are, and
# node_support lowers the nodes joined by such values together (targets/nnapi/lower.py).
HIGH_RANK_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Split", "Slice"})


# Where a run-time int64 value may enter a partition: (op, input position) of the readers that take it as
# NNAPI's TENSOR_INT32 (NNAPI has no 64-bit integer tensors).  Both runtimes cast every feed to its operand's
# element type (minirt/providers/nnapi.py, tflite.py), so the int64 -> int32 cast happens at the partition
# boundary, wrapping as ONNX's Cast does: the values are indices or lengths, which fit in int32.
INT64_READERS = frozenset({("Gather", 1), ("Cast", 0), ("LSTM", 4), ("GRU", 4), ("RowLookup", 0)})


class Unsupported(Exception):
    """The node (or partition) has no NNAPI form at the target API level; ``str()`` is the reason."""


def fuse_code(act: str, params) -> int | None:
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


def known_shape(v, ctx, shapes: dict) -> tuple | None:
    """The static shape of ``v`` from NNAPI's shape inference (``shapes``: :func:`shapes_for`), the graph,
    or its constant value; None when none of them knows it (a size that depends on the data)."""
    s = shapes.get(id(v))
    if s is None:
        s = ctx.static_shape(v)
    if s is None:
        c = ctx.const(v)
        if c is not None:
            s = tuple(c.shape)
    return s


class Lowerer(Emitter):
    """The NNAPI model under construction for one partition: what the rules of ``targets.nnapi.rules`` emit into.

    Invariant: ``vals`` maps an ONNX value to the operand holding it in the
    internal layout (NHWC for rank 4); a value never gets a second operand.
    A value of rank > 4 (inside a partition only: NNAPI operands have rank 4
    at most) is held as ``np.transpose(value, self.order(value))`` with its
    unit axes dropped and its leading axes merged (``shapes.compact_dims``);
    its order is free, chosen by the rule that makes it so that the
    channel shuffles and the attention heads' reshapes move no data.
    """

    def __init__(self, ctx, level: int, shapes: dict):
        super().__init__(ctx)
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
        self.orders: dict = {}  # id(value of rank > 4) -> its stored order (identity when absent)
        self._reshaped_from: dict = {}  # operand made by a RESHAPE -> the operand it reshapes
        self._reshapes: dict = {}  # (operand, dims) -> the RESHAPE of it to those dims

    # --- values --------------------------------------------------------------
    def shape(self, v, any_rank: bool = False) -> tuple:
        """The static shape of ``v``; Unsupported when unknown, empty, or of rank > 4 (unless ``any_rank``:
        for the rules of HIGH_RANK_OPS, which store such a value in a rank-4 operand)."""
        s = known_shape(v, self.ctx, self.shapes)
        if s is None:
            raise Unsupported(f"value {v.name!r} has no static shape ({self.ctx.unknown_shape_hint()})")
        if len(s) > MAX_RANK and not any_rank:
            raise Unsupported(f"value {v.name!r} has rank {len(s)}; NNAPI tensors have rank 4 at most (a value "
                              f"of higher rank is taken only between {', '.join(sorted(HIGH_RANK_OPS))} "
                              "inside one partition)")
        if any(d == 0 for d in s):
            raise Unsupported(f"value {v.name!r} is empty (shape {list(s)})")
        return tuple(s)

    def order(self, v) -> tuple:
        """The ONNX axis of each stored axis of ``v``: NHWC for rank 4, the chosen order above rank 4
        (identity by default), ONNX's own order otherwise."""
        r = len(self.shape(v, any_rank=True))
        if r == 4:
            return TO_NHWC
        return tuple(self.orders.get(id(v), range(r)))

    def stored_dims(self, v, order=None) -> tuple:
        """The dims of the operand holding ``v`` when stored in ``order`` (default: its order)."""
        s = self.shape(v, any_rank=True)
        dims = tuple(s[a] for a in (self.order(v) if order is None else order))
        return compact_dims(dims) if len(s) > MAX_RANK else dims

    def bind_stored(self, v, operand: int, order) -> None:
        """Bind ``v`` to ``operand`` holding ``np.transpose(v, order)`` (an order is free above rank 4 only)."""
        s = self.shape(v, any_rank=True)
        order = tuple(int(a) for a in order)
        if len(s) <= MAX_RANK and order != (TO_NHWC if len(s) == 4 else tuple(range(len(s)))):
            raise ValueError(f"a rank-{len(s)} value stored in order {order}")
        if len(s) > MAX_RANK:
            self.orders[id(v)] = order
        self.bind(v, self.reshape(operand, self.stored_dims(v, order)))

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

    def int_input(self, v, what: str) -> int:
        """Operand (TENSOR_INT32) of ``v``, an int32 or int64 index / length tensor (a constant, a partition
        input (int64 ones are cast at the boundary: INT64_READERS) or a value a rule made int32)."""
        c = self.ctx.const(v)
        if c is not None:
            return self.inp(v)
        dt = self.ctx.dtype(v)
        if dt is None or np.dtype(dt) not in (np.int32, np.int64):
            raise Unsupported(f"{what} {v.name!r} is {dt}, not int32 / int64")
        if id(v) not in self.vals:
            return self.add_model_input(v, C.TENSOR_INT32)
        x = self.vals[id(v)]
        if self.m.operands[x].type != C.TENSOR_INT32:
            raise Unsupported(f"{what} {v.name!r} is not an int32 operand")
        return x

    def float_input(self, v) -> int:
        if self.tensor_type(v) != C.TENSOR_FLOAT32:
            raise Unsupported(f"input {v.name!r} is not float32")
        return self.inp(v)

    def add_model_input(self, v, type_=None, scale=0.0, zero_point=0) -> int:
        shape = self.shape(v, any_rank=True)
        if not shape:
            # an NNAPI tensor operand with no dimensions has an unknown rank, not rank 0
            raise Unsupported(f"value {v.name!r} is a rank-0 run-time tensor (NNAPI tensors have rank 1 to 4)")
        t = self.tensor_type(v) if type_ is None else type_
        if len(shape) > MAX_RANK:  # (shape() lets it through for the rules of HIGH_RANK_OPS only)
            raise Unsupported(f"value {v.name!r} of rank {len(shape)} would be an input of the NNAPI partition "
                              "(NNAPI tensors have rank 4 at most)")
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
            if a.ndim > MAX_RANK:  # stored in ONNX order (the identity order), as an operand of rank <= 4
                a = a.reshape(compact_dims(a.shape))
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

    def offers(self, code: int) -> bool:
        """Whether the target API level has operation ``code`` (for a choice between two lowerings)."""
        return C.MIN_API_LEVEL[code] <= self.level

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
        """Operand ``x`` with ``dims``: a RESHAPE of the operand that ``x`` itself was reshaped from, if
        any (a reshape of a reshape is one; the first is pruned when nothing else reads it)."""
        dims = tuple(int(d) for d in dims)
        if self.dims_of(x) == dims:
            return x
        x = self._reshaped_from.get(x, x)
        if self.dims_of(x) == dims:
            return x
        if (x, dims) in self._reshapes:  # the same view again (q, k and v of one qkv tensor)
            return self._reshapes[(x, dims)]
        out = self.tmp(dims, self.m.operands[x].type, scale=self.m.operands[x].scale,
                       zero_point=self.m.operands[x].zero_point)
        self.emit(C.RESHAPE, [x, self.m.const(np.array(dims, np.int32))], [out])
        self._reshaped_from[out] = x
        self._reshapes[(x, dims)] = out
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

    def to_nchw(self, x: int, shape) -> int:
        """Operand in ONNX order from operand ``x`` holding ONNX ``shape`` in the internal layout.

        The inverse of :meth:`from_nchw`, for an intermediate operand (:meth:`nchw` is its
        counterpart for an ONNX value)."""
        if len(shape) != 4:
            return x
        if self.trivial(shape):
            return self.reshape(x, shape)
        return self.transpose(x, TO_NCHW)

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

        code = fuse_code(act, params)
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
        if act == "Gelu":
            return self._gelu_erf(x, dst())
        if act == "GeluTanh":
            # 0.5x(1 + tanh(k(x + 0.044715x^3))) == x * sigmoid(2k(x + 0.044715x^3)), k = sqrt(2/pi)
            k2 = 2.0 * math.sqrt(2.0 / math.pi)
            u = self._chain(x, [(C.MUL, x), (C.MUL, 0.044715), (C.ADD, 1.0), (C.MUL, x), (C.MUL, k2)])
            g = self.tmp(dims)
            self.emit(C.LOGISTIC, [u], [g])
            o = dst()
            self.emit(C.MUL, [x, g, self.m.i32(C.FUSED_NONE)], [o])
            return o
        raise Unsupported(f"activation {act!r} has no NNAPI form here")

    # Abramowitz & Stegun 7.1.26: erfc(z) = (a1 t + ... + a5 t^5) exp(-z^2), t = 1 / (1 + p z), for z >= 0,
    # with an absolute error below 1.5e-7 (the coefficients are the published ones)
    _ERFC_P = 0.3275911
    _ERFC_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)

    def _chain(self, x: int, steps) -> int:
        """``x`` through ``steps`` of (ADD / SUB / MUL / DIV, operand or float constant) in turn."""
        dims = self.dims_of(x)
        y = x
        for code, b in steps:
            b = self.scalar_const(b, len(dims)) if isinstance(b, float) else b
            t = self.tmp(dims)
            self.emit(code, [y, b, self.m.i32(C.FUSED_NONE)], [t])
            y = t
        return y

    def _gelu_erf(self, x: int, out: int) -> int:
        """Gelu(x) = x * Phi(x) with erf: relu(x) - 0.5 |x| erfc(|x| / sqrt 2) (the same value for either
        sign, so no select is needed, and no cancellation for negative x), erfc by A&S 7.1.26 from NNAPI
        elementwise operations (API 29: ABS, EXP): an absolute error below 1e-6 for every x."""
        dims = self.dims_of(x)
        rank = len(dims)

        def op(code, ins):
            t = self.tmp(dims)
            self.emit(code, ins, [t])
            return t

        a = op(C.ABS, [x])
        t = op(C.DIV, [self.scalar_const(1.0, rank),
                       self._chain(a, [(C.MUL, self._ERFC_P / math.sqrt(2.0)), (C.ADD, 1.0)]),
                       self.m.i32(C.FUSED_NONE)])
        # 0.5 (a1 t + ... + a5 t^5) by Horner's rule, the 0.5 folded into the coefficients
        half = [0.5 * c for c in self._ERFC_A]
        steps = [(C.MUL, half[4])]
        for c in reversed(half[:4]):
            steps += [(C.ADD, c), (C.MUL, t)]
        poly = self._chain(t, steps)
        e = op(C.EXP, [self._chain(x, [(C.MUL, x), (C.MUL, -0.5)])])  # exp(-(x / sqrt 2)^2)
        w = self._chain(poly, [(C.MUL, e), (C.MUL, a)])
        r = op(C.RELU, [x])
        self.emit(C.SUB, [r, w, self.m.i32(C.FUSED_NONE)], [out])
        return out

    # --- per node ------------------------------------------------------------------
    def enter(self, node) -> None:
        """Before a node's rule: every output it names needs a static shape of rank <= 4."""
        for o in node.outputs:
            if o is not None and o.name:
                self.shape(o, any_rank=node.op_type in HIGH_RANK_OPS)

    def qparams(self, node):
        """(scale array, zero point array or None) of a QuantizeLinear / DequantizeLinear node."""
        scale = self.const_array(node.inputs[1], "the quantization scale").astype(np.float32)
        zp_v = node.inputs[2] if len(node.inputs) > 2 else None
        zp = None if zp_v is None else self.const_array(zp_v, "the zero point")
        return scale, zp
