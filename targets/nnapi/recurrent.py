"""NNAPI lowering of ONNX LSTM and GRU: the recurrence unrolled over the static sequence (docs/nnapi.md).

Why unrolled, not NNAPI's UNIDIRECTIONAL_SEQUENCE_LSTM: NNAPI has no sequence GRU at all, and its
sequence LSTM computes neither ONNX's ``sequence_lens`` (the tagger, a packed-sequence export) nor a
final cell state that TFLite gives back (Silero VAD's ``Y_c`` is its state output); its TFLite
counterpart keeps the states in variable tensors that persist between invocations, so a run would start
from the previous run's state unless every runtime reset them.  Unrolled, one form covers every case
with operations every NNAPI driver and TFLite interpreter has (FULLY_CONNECTED, LOGISTIC, TANH, MUL,
ADD, SUB, SPLIT, SELECT); the price is a model that grows with the sequence, bounded by
:data:`MAX_UNROLLED_STEPS`.  The real models run 1 (Silero VAD) to 100 (DeepSpeech2-style) steps.

Per direction: one FULLY_CONNECTED projects the input of every step at once (``[seq * batch, I]`` rows,
both biases folded where ONNX adds them outside a gate product), one SPLIT cuts it into the steps; per
step the recurrent FULLY_CONNECTED and the gates.  With ``sequence_lens`` a masked step keeps its carried
state (SELECT), which is ONNX's semantics in both directions: forward, the state freezes after step L-1;
reverse, the steps past L-1 come first and leave the initial state in place; Y is 0 past each sequence's
end and a sequence of length 0 has final states 0 (onnxruntime's behaviour).
"""
from __future__ import annotations

import numpy as np

from minirt.builder.ir_helpers import attr
from minirt.targets.nnapi import oplevels as C
from minirt.targets.nnapi.emitter import Unsupported
from minirt.targets.nnapi.rules import RULES
from minirt.targets.rules import input_at, str_attr

_DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}
_DEFAULT_ACTIVATIONS = {"LSTM": ("sigmoid", "tanh", "tanh"), "GRU": ("sigmoid", "tanh")}
_GATES = {"LSTM": 4, "GRU": 3}
# Time steps x directions one node may unroll to: a step is 12 (LSTM) / 11 (GRU) NNAPI operations, up to 4 more
# with sequence_lens and 6 more with peepholes, so one node makes at most ~11k operations; a 100-frame
# bidirectional speech model (200) fits, a 1500-frame encoder would not.
MAX_UNROLLED_STEPS = 512
# SPLIT, SELECT and GREATER (the step split and the masks) are NNAPI 1.2
_API_LEVEL = 29


class _Recurrence:
    """An LSTM / GRU node read and checked: the refusals are raised here, before anything is emitted."""

    def __init__(self, node, low):
        op = node.op_type
        self.op, self.node = op, node
        ins = list(node.inputs) + [None] * (8 - len(node.inputs))
        self.X, self.W, self.R, self.B, self.lens, self.h0 = ins[:6]
        self.c0, self.P = (ins[6], ins[7]) if op == "LSTM" else (None, None)
        self.direction = str_attr(node, "direction", "forward") or "forward"
        if self.direction not in _DIRECTIONS:
            raise Unsupported(f"{op} direction {self.direction!r} is unknown")
        self.nd = _DIRECTIONS[self.direction]
        if low.level < _API_LEVEL:
            raise Unsupported(f"{op} is unrolled with SPLIT / SELECT, which need Android API {_API_LEVEL} "
                              f"(target API {low.level})")
        if int(attr(node, "layout", 0) or 0):
            raise Unsupported(f"{op} layout=1 (batch-major): only the sequence-major layout is lowered")
        if attr(node, "clip", None) is not None:
            raise Unsupported(f"{op} clip (clipped gate pre-activations) is not lowered")
        acts = attr(node, "activations", None)
        if acts:
            acts = [a.decode() if isinstance(a, bytes) else str(a) for a in acts]
            default = list(_DEFAULT_ACTIVATIONS[op]) * self.nd
            if [a.lower() for a in acts] != default:
                names = "/".join(a.capitalize() for a in _DEFAULT_ACTIVATIONS[op])
                raise Unsupported(f"{op} activations {acts}: only the default {names} are lowered")
        if op == "LSTM" and int(attr(node, "input_forget", 0) or 0):
            raise Unsupported("LSTM input_forget=1 (coupled input and forget gates) is not lowered")
        weights = [(self.W, "W"), (self.R, "R"), (self.B, "B")] + ([(self.P, "P (peepholes)")] if op == "LSTM" else [])
        for v, what in weights:
            if v is not None and low.ctx.const(v) is None:
                raise Unsupported(f"{op} {what} is computed at run time (the unrolled form takes constant weights)")
        xs = low.shape(self.X)
        if len(xs) != 3:
            raise Unsupported(f"{op} input X of rank {len(xs)} (a [seq, batch, input] tensor is lowered)")
        if low.tensor_type(self.X) != C.TENSOR_FLOAT32:
            raise Unsupported(f"{op} input X is not float32")
        self.seq, self.batch, self.input_size = xs
        self.gates = _GATES[op]
        self.w = np.asarray(low.ctx.const(self.W), np.float32)
        self.r = np.asarray(low.ctx.const(self.R), np.float32)
        self.hidden = int(self.r.shape[-1])
        H, G = self.hidden, self.gates
        if self.w.shape != (self.nd, G * H, self.input_size) or self.r.shape != (self.nd, G * H, H):
            raise Unsupported(f"{op} W {list(self.w.shape)} / R {list(self.r.shape)} do not match {self.nd} "
                              f"direction(s), hidden size {H} and input size {self.input_size}")
        self.b = (np.zeros((self.nd, 2 * G * H), np.float32) if self.B is None
                  else np.asarray(low.ctx.const(self.B), np.float32).reshape(self.nd, 2 * G * H))
        self.p = None
        if self.P is not None:
            p = np.asarray(low.ctx.const(self.P), np.float32).reshape(self.nd, 3 * H)
            self.p = p if np.any(p) else None
        if self.seq * self.nd > MAX_UNROLLED_STEPS:
            raise Unsupported(f"{op} over {self.seq} steps x {self.nd} direction(s) would unroll past "
                              f"{MAX_UNROLLED_STEPS} steps (the NNAPI model grows with the sequence)")
        self.lbr = bool(int(attr(node, "linear_before_reset", 0) or 0)) if op == "GRU" else False
        # constant sequence_lens: the live steps are known now (None: every step of every sequence is live)
        self.const_lens = None
        if self.lens is not None:
            c = low.ctx.const(self.lens)
            if c is not None:
                lens = np.asarray(c).reshape(-1).astype(np.int64)
                if lens.shape != (self.batch,) or np.any(lens < 0) or np.any(lens > self.seq):
                    raise Unsupported(f"{op} sequence_lens {lens.tolist()} outside [0, {self.seq}] per batch row")
                if np.all(lens == self.seq):
                    self.lens = None
                else:
                    self.const_lens = lens
            elif low.shape(self.lens) != (self.batch,):
                raise Unsupported(f"{op} sequence_lens of shape {list(low.shape(self.lens))} (a [batch] tensor)")


def _op(low, code, ins, dims, type_=C.TENSOR_FLOAT32) -> int:
    out = low.tmp(dims, type_)
    low.emit(code, ins, [out])
    return out


def _arith(low, code, a: int, b: int) -> int:
    """ADD / SUB / MUL of two [batch, H] operands (the first's dims)."""
    return _op(low, code, [a, b, low.m.i32(C.FUSED_NONE)], low.dims_of(a))


class _Dense:
    """Constant FULLY_CONNECTED parameters, weights [N, K] and bias [N] (zeros when None), as operands made
    once: every step's recurrent product reads the same two operands (the model holds one copy of R)."""

    def __init__(self, low, weight: np.ndarray, bias: np.ndarray | None = None):
        self.n = weight.shape[0]
        self.w = low.m.const(np.ascontiguousarray(weight, np.float32))
        self.b = low.m.const(np.zeros(self.n, np.float32) if bias is None else np.ascontiguousarray(bias, np.float32))


def _fc(low, x: int, dense: _Dense) -> int:
    """x [rows, K] @ weight.T + bias: one FULLY_CONNECTED."""
    return _op(low, C.FULLY_CONNECTED, [x, dense.w, dense.b, low.m.i32(C.FUSED_NONE)], (low.dims_of(x)[0], dense.n))


def _split(low, x: int, axis: int, parts: int) -> list:
    """Equal parts of operand ``x`` along ``axis`` (one SPLIT; ``x`` itself for one part)."""
    if parts == 1:
        return [x]
    dims = list(low.dims_of(x))
    dims[axis] //= parts
    outs = [low.tmp(dims) for _ in range(parts)]
    low.emit(C.SPLIT, [x, low.m.i32(axis), low.m.i32(parts)], outs)
    return outs


def _projection(low, rnn: _Recurrence, x2: int, weight: np.ndarray, bias: np.ndarray) -> list:
    """The input projection of every step at once, cut into ``seq`` [batch, N] operands (step order)."""
    return _split(low, _fc(low, x2, _Dense(low, weight, bias)), 0, rnn.seq)


def _initial_states(low, rnn: _Recurrence, value) -> list:
    """Per direction, the initial state [batch, H] of an ONNX state [nd, batch, H] (zeros when absent)."""
    shape = (rnn.batch, rnn.hidden)
    if value is None:
        return [low.m.const(np.zeros(shape, np.float32))] * rnn.nd
    c = low.ctx.const(value)
    if c is not None:
        a = np.asarray(c, np.float32).reshape(rnn.nd, *shape)
        return [low.m.const(np.ascontiguousarray(a[d])) for d in range(rnn.nd)]
    if low.shape(value) != (rnn.nd,) + shape:
        raise Unsupported(f"{rnn.op} initial state {value.name!r} of shape {list(low.shape(value))}, not "
                          f"{[rnn.nd, *shape]}")
    s = low.float_input(value)
    return [low.reshape(part, shape) for part in _split(low, s, 0, rnn.nd)]


def _masks(low, rnn: _Recurrence) -> list | None:
    """Per time step t, the TENSOR_BOOL8 [batch, H] mask "t < sequence_lens[b]" (a constant, or GREATER of
    the run-time lengths); None for a step where every sequence is live, None overall without lengths."""
    if rnn.lens is None:
        return None
    shape = (rnn.batch, rnn.hidden)
    if rnn.const_lens is not None:
        masks = []
        for t in range(rnn.seq):
            live = np.broadcast_to((t < rnn.const_lens)[:, None], shape)
            masks.append(None if live.all() else low.m.const(np.ascontiguousarray(live), C.TENSOR_BOOL8))
        return masks
    lens = low.reshape(low.int_input(rnn.lens, f"{rnn.op} sequence_lens"), (rnn.batch, 1))
    # lens [batch, 1] > t [1, H] broadcasts to [batch, H]: NNAPI's SELECT takes equal shapes only
    return [_op(low, C.GREATER, [lens, low.m.const(np.full((1, rnn.hidden), t, np.int32))], shape, C.TENSOR_BOOL8)
            for t in range(rnn.seq)]


def _select(low, mask, a: int, b: int) -> int:
    """``a`` where ``mask`` is true, else ``b`` (``a`` when the mask is None: every sequence live)."""
    if mask is None:
        return a
    return _op(low, C.SELECT, [mask, a, b], low.dims_of(a))


def _lstm_step(low, rnn: _Recurrence, xp_t: int, h: int, c: int, r: _Dense, peep) -> tuple:
    """One LSTM step, ONNX gate blocks [i, o, f, c] and default activations:
    i = σ(.. + Pi c), f = σ(.. + Pf c), c' = f c + i tanh(..), o = σ(.. + Po c'), h' = o tanh(c')."""
    pre = _arith(low, C.ADD, xp_t, _fc(low, h, r))
    i, o, f, g = _split(low, pre, 1, 4)
    if peep is not None:  # peepholes (Pi, Po, Pf), on the previous (i, f) and the new (o) cell state
        pi, po, pf = peep
        i = _arith(low, C.ADD, i, _arith(low, C.MUL, c, pi))
        f = _arith(low, C.ADD, f, _arith(low, C.MUL, c, pf))
    dims = low.dims_of(i)
    i, f, g = _op(low, C.LOGISTIC, [i], dims), _op(low, C.LOGISTIC, [f], dims), _op(low, C.TANH, [g], dims)
    c_new = _arith(low, C.ADD, _arith(low, C.MUL, f, c), _arith(low, C.MUL, i, g))
    if peep is not None:
        o = _arith(low, C.ADD, o, _arith(low, C.MUL, c_new, po))
    o = _op(low, C.LOGISTIC, [o], dims)
    return _arith(low, C.MUL, o, _op(low, C.TANH, [c_new], dims)), c_new


def _gru_step(low, rnn: _Recurrence, xzr_t: int, xn_t: int, h: int, r_zr: _Dense, r_n: _Dense) -> int:
    """One GRU step, ONNX gate blocks [z, r, h] and default activations:
    z, r = σ(Wzr x + Wbzr + Rzr h + Rbzr) (both biases in the input projection);
    linear_before_reset=1: n = tanh(Wn x + Wbn + r (Rn h + Rbn)); =0: n = tanh(Wn x + Wbn + Rn (r h) + Rbn);
    h' = (1 - z) n + z h, written n + z (h - n).  ``r_n`` carries Rbn as its bias."""
    zr = _op(low, C.LOGISTIC, [_arith(low, C.ADD, xzr_t, _fc(low, h, r_zr))], low.dims_of(xzr_t))
    z, r = _split(low, zr, 1, 2)
    if rnn.lbr:
        pre = _arith(low, C.ADD, xn_t, _arith(low, C.MUL, r, _fc(low, h, r_n)))
    else:
        pre = _arith(low, C.ADD, xn_t, _fc(low, _arith(low, C.MUL, r, h), r_n))
    n = _op(low, C.TANH, [pre], low.dims_of(pre))
    return _arith(low, C.ADD, n, _arith(low, C.MUL, z, _arith(low, C.SUB, h, n)))


def _lower_recurrence(node, low) -> None:
    rnn = _Recurrence(node, low)
    H, G, seq, batch = rnn.hidden, rnn.gates, rnn.seq, rnn.batch
    outs = list(node.outputs) + [None] * 3
    Y, Y_h, Y_c = outs[0], outs[1], outs[2] if rnn.op == "LSTM" else None
    x2 = low.reshape(low.float_input(rnn.X), (seq * batch, rnn.input_size))  # X rows in (t, b) order
    masks = _masks(low, rnn)
    zeros = low.m.const(np.zeros((batch, H), np.float32)) if masks is not None else None
    h0s = _initial_states(low, rnn, rnn.h0)
    c0s = _initial_states(low, rnn, rnn.c0) if rnn.op == "LSTM" else None
    ys = [[None] * rnn.nd for _ in range(seq)]
    finals_h, finals_c = [], []
    for d in range(rnn.nd):
        w, r, wb, rb = rnn.w[d], rnn.r[d], rnn.b[d, :G * H], rnn.b[d, G * H:]
        h = h0s[d]
        # constants shared by every step of the direction (made once: the model holds one copy)
        if rnn.op == "LSTM":
            xp = _projection(low, rnn, x2, w, wb + rb)
            r_dense = _Dense(low, r)
            peep = None if rnn.p is None else [
                low.m.const(np.ascontiguousarray(rnn.p[d, k * H:(k + 1) * H].reshape(1, H))) for k in range(3)]
            c = c0s[d]
        else:
            zr = slice(0, 2 * H)
            xzr = _projection(low, rnn, x2, w[zr], wb[zr] + rb[zr])
            xn = _projection(low, rnn, x2, w[2 * H:], wb[2 * H:])
            r_zr, r_n = _Dense(low, r[zr]), _Dense(low, r[2 * H:], rb[2 * H:])
        reverse = rnn.direction == "reverse" or d == 1
        for t in (range(seq - 1, -1, -1) if reverse else range(seq)):
            mask = None if masks is None else masks[t]
            if rnn.op == "LSTM":
                h_new, c_new = _lstm_step(low, rnn, xp[t], h, c, r_dense, peep)
                c = _select(low, mask, c_new, c)
            else:
                h_new = _gru_step(low, rnn, xzr[t], xn[t], h, r_zr, r_n)
            h = _select(low, mask, h_new, h)
            ys[t][d] = _select(low, mask, h, zeros)  # ONNX's Y is 0 past a sequence's end
        if masks is not None and masks[0] is not None:
            # a sequence of length 0 ends with states 0 (onnxruntime; ONNX leaves it unsaid): step 0 is live
            # exactly when the length is > 0
            h = _select(low, masks[0], h, zeros)
            if rnn.op == "LSTM":
                c = _select(low, masks[0], c, zeros)
        finals_h.append(h)
        if rnn.op == "LSTM":
            finals_c.append(c)
    # Y [seq, nd, batch, H]: the steps' states in (t, d) order are its rows; held NHWC inside (rank 4)
    if Y is not None and Y.name:
        ys_shape = (seq, rnn.nd, batch, H)
        if low.shape(Y) != ys_shape:
            raise Unsupported(f"{rnn.op} output Y of shape {list(low.shape(Y))}, not {list(ys_shape)}")
        flat = [y for row in ys for y in row]
        cat = flat[0] if len(flat) == 1 else _op(low, C.CONCATENATION, flat + [low.m.i32(0)],
                                                (seq * rnn.nd * batch, H))
        low.bind(Y, low.from_nchw(low.reshape(cat, ys_shape), ys_shape))
    for out, finals in ((Y_h, finals_h), (Y_c, finals_c)):
        if out is None or not out.name:
            continue
        cat = finals[0] if rnn.nd == 1 else _op(low, C.CONCATENATION, finals + [low.m.i32(0)], (rnn.nd * batch, H))
        low.bind(out, low.reshape(cat, (rnn.nd, batch, H)))


@RULES.rule("LSTM")
def lower_lstm(node, low):
    """LSTM unrolled (module docstring): default activations, optional peepholes, constant or run-time
    initial states and sequence_lens; Y, Y_h and Y_c."""
    _lower_recurrence(node, low)


@RULES.rule("GRU")
def lower_gru(node, low):
    """GRU unrolled (module docstring), both linear_before_reset forms: NNAPI has no GRU operation."""
    _lower_recurrence(node, low)
