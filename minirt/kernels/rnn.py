"""Recurrent layers: RNN, GRU, LSTM (ONNX semantics, opset 7+ and layout from 14).

Shapes (layout 0): X [seq, batch, input]; W [dirs, G*hidden, input];
R [dirs, G*hidden, hidden]; B [dirs, 2*G*hidden]; initial states
[dirs, batch, hidden]; Y [seq, dirs, batch, hidden]; Y_h / Y_c
[dirs, batch, hidden].  layout 1 puts batch first: X [batch, seq, input],
Y [batch, seq, dirs, hidden], states [batch, dirs, hidden].

``sequence_lens`` shortens sequences per batch entry: steps past a sequence's
end leave its state unchanged and write zeros to Y; the reverse direction
starts from each sequence's own last element.

LSTM and GRU in float32 with the default activations run natively when the C kernels are loaded
(``minirt.native.rnn_call``: one GEMM for the input projection of every step, then one recurrent
product and one fused gate pass per step); other activations, other dtypes and RNN take the numpy
path, which adds the biases once (both folded into the input projection, except a GRU's h-gate
recurrent bias with ``linear_before_reset``), applies no masks without ``sequence_lens`` and uses a
sigmoid that cannot overflow.
"""
from __future__ import annotations

import numpy as np

from minirt import native as _native
from minirt.kernels.registry import kernel
from minirt.vocabulary import RNN_ACTIVATIONS


def _sigmoid(x):
    """1 / (1 + exp(-x)) as 0.5 tanh(x / 2) + 0.5: no exp to overflow (and fewer numpy calls per step
    than an exp of -|x| with a select); absolute error a few float32 ulps of 1."""
    y = np.tanh(x * 0.5)
    y *= 0.5
    y += 0.5
    return y


# lower-case name -> (function of (x, alpha, beta), default alpha, default beta); a default of None:
# the activation takes no such parameter.  Keys: the vocabulary's RNN_ACTIVATIONS, lower-cased (the
# attribute is matched case-insensitively); tests/test_vocabulary.py checks they agree.
_FUNCTIONS = {
    "relu": (lambda x, a, b: np.maximum(x, 0), None, None),
    "tanh": (lambda x, a, b: np.tanh(x), None, None),
    "sigmoid": (lambda x, a, b: _sigmoid(x), None, None),
    "affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: np.where(x >= 0, x, a * x), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: np.where(x > a, x, 0), 1.0, None),
    "scaledtanh": (lambda x, a, b: a * np.tanh(b * x), 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: np.clip(a * x + b, 0, 1), 0.2, 0.5),
    "elu": (lambda x, a, b: np.where(x >= 0, x, a * np.expm1(np.minimum(x, 0))), 1.0, None),
    "softsign": (lambda x, a, b: x / (1 + np.abs(x)), None, None),
    "softplus": (lambda x, a, b: np.logaddexp(0, x).astype(x.dtype, copy=False), None, None),
}
_ACTIVATIONS = {name.lower(): _FUNCTIONS[name.lower()] for name in sorted(RNN_ACTIVATIONS)}


def _activations(names, alphas, betas, defaults, n_dirs):
    """Resolve the activation list into callables, one group of len(defaults) per direction."""
    per_dir = len(defaults)
    names = list(names) if names else list(defaults) * n_dirs
    if len(names) == per_dir and n_dirs == 2:
        names = names * 2
    if len(names) != per_dir * n_dirs:
        raise ValueError(f"expected {per_dir * n_dirs} activations, got {len(names)}")
    alphas, betas = list(alphas or ()), list(betas or ())
    fns = []
    for name in names:
        key = name.lower()
        if key not in _ACTIVATIONS:
            raise ValueError(f"unsupported activation {name!r}")
        fn, da, db = _ACTIVATIONS[key]
        a = alphas.pop(0) if da is not None and alphas else da
        b = betas.pop(0) if db is not None and betas else db
        fns.append(lambda x, fn=fn, a=a, b=b: fn(x, a, b))
    return [fns[d * per_dir : (d + 1) * per_dir] for d in range(n_dirs)]


def _directions(direction: str) -> list[bool]:
    """List of 'reverse?' flags, one per direction."""
    if direction == "forward":
        return [False]
    if direction == "reverse":
        return [True]
    if direction == "bidirectional":
        return [False, True]
    raise ValueError(f"unknown direction {direction!r}")


def _layout(op: str, layout) -> int:
    """The ``layout`` attribute, 0 (sequence first) or 1 (batch first): any other value is refused, not
    read as a truth value (onnxruntime reads a nonzero one as 1 in one layer kind and as 0 in another)."""
    if layout not in (0, 1):
        raise ValueError(f"{op}: layout must be 0 (sequence first) or 1 (batch first), got {layout}")
    return int(layout)


def _reverse_index(seq_len: int, lens: np.ndarray) -> np.ndarray:
    """idx[t, b]: the time step read at step t when running sequence b backwards."""
    t = np.arange(seq_len)[:, None]
    rev = lens[None, :] - 1 - t
    return np.where(rev >= 0, rev, t)  # past the end: any index, masked anyway


def _check_lens(op, sequence_lens, seq_len, batch):
    """``sequence_lens`` as int64, each in [0, seq_len] (None: all seq_len)."""
    if sequence_lens is None:
        return None
    lens = np.asarray(sequence_lens).astype(np.int64).reshape(-1)
    if lens.shape != (batch,) or (lens.size and (lens.min() < 0 or lens.max() > seq_len)):
        raise ValueError(f"{op}: sequence_lens {lens.tolist()} must hold {batch} values in [0, {seq_len}] "
                         f"(X has {seq_len} steps, batch {batch})")
    return lens


def _run(op, X, W, R, bias, sequence_lens, init_states, hidden_size, direction, layout, n_gates, step):
    """Shared driver. ``bias`` (dirs, G*hidden) or None: added once to the input projection.
    ``step(d, x_proj_t, states) -> new states`` (first state is H)."""
    X = np.asarray(X)
    dtype = X.dtype
    if layout:
        X = np.swapaxes(X, 0, 1)
        init_states = [None if s is None else np.swapaxes(s, 0, 1) for s in init_states]
    seq_len, batch = X.shape[0], X.shape[1]
    revs = _directions(direction)
    n_dirs = len(revs)
    hidden = int(hidden_size) if hidden_size else R.shape[-1]
    lens = _check_lens(op, sequence_lens, seq_len, batch)
    Y = np.zeros((seq_len, n_dirs, batch, hidden), dtype)
    finals = []
    for d, rev in enumerate(revs):
        states = [
            np.zeros((batch, hidden), dtype) if s is None else np.asarray(s[d], dtype) for s in init_states
        ]
        xproj = X @ W[d].T  # [seq, batch, G*hidden]
        if bias is not None:
            xproj += bias[d]
        if lens is None:  # every sequence is whole: no masks
            for t in range(seq_len):
                states = step(d, xproj[seq_len - 1 - t if rev else t], states)
                Y[seq_len - 1 - t if rev else t, d] = states[0]
            finals.append(states)
            continue
        if rev:
            idx = _reverse_index(seq_len, lens)
            xproj = xproj[idx, np.arange(batch)[None, :]]
        for t in range(seq_len):
            mask = (t < lens)[:, None]
            new = step(d, xproj[t], states)
            states = [np.where(mask, n, s) for n, s in zip(new, states)]
            y = np.where(mask, states[0], 0)
            if rev:
                # step t of a reversed sequence b is time lens[b] - 1 - t
                for b in range(batch):
                    if t < lens[b]:
                        Y[lens[b] - 1 - t, d, b] = y[b]
            else:
                Y[t, d] = y
        finals.append(states)
    outs = [Y] + [np.stack([f[k] for f in finals], axis=0).astype(dtype) for k in range(len(init_states))]
    if layout:
        outs = [np.transpose(Y, (2, 0, 1, 3))] + [np.swapaxes(o, 0, 1) for o in outs[1:]]
    return tuple(outs)


def _folded_bias(B, n_gates, hidden, keep_h_gate=False):
    """(dirs, G*hidden): the input and recurrent biases added, or None without B.  ``keep_h_gate``
    (GRU with linear_before_reset): the last gate's recurrent bias is left out (applied inside)."""
    if B is None:
        return None
    B = np.asarray(B)
    gh = n_gates * hidden
    rec = B[:, gh:].copy()
    if keep_h_gate:
        rec[:, (n_gates - 1) * hidden:] = 0
    return B[:, :gh] + rec


def _clip(x, clip):
    return x if clip is None else np.clip(x, -clip, clip)


# ----------------------------------------------------------------------------- native path

_F32 = np.dtype(np.float32)
_DEFAULTS = {"LSTM": ("sigmoid", "tanh", "tanh"), "GRU": ("sigmoid", "tanh")}


def _default_activations(op, names, n_dirs) -> bool:
    """Whether ``names`` (the attribute) are the op's defaults for every direction (Sigmoid and Tanh
    take no alpha / beta, so those lists do not matter then)."""
    if not names:
        return True
    names = [n.lower() for n in names]
    per_dir = list(_DEFAULTS[op])
    return names == per_dir * n_dirs or (n_dirs == 2 and names == per_dir)


class _NativeLayer:
    """A prepared native LSTM / GRU: the weights it was made for (identity), the input shape, and
    the ``mrt_rnn_shape`` structs built by ``native.rnn_prepare`` (which keep the folded biases and W
    packed for the input projection alive)."""

    __slots__ = ("key", "prep", "y_shape", "state_shape", "n_states", "__weakref__")


# (id(W), id(R), id(B), id(P), attributes, X shape) -> _NativeLayer; only read-only weights (a model's
# constants: the same values while the array lives) are cached, the entry dies with W.
_layers: dict = {}


def _native_prepare(op, W, R, B, P, x_shape, dirs, reverse, hidden, layout, clip, lbr, input_forget):
    n_gates = 4 if op == "LSTM" else 3
    seq, batch = (x_shape[1], x_shape[0]) if layout else (x_shape[0], x_shape[1])
    w = np.ascontiguousarray(W, _F32)
    r = np.ascontiguousarray(R, _F32)
    bias = rbh = p = None
    if B is not None:
        bias = np.ascontiguousarray(_folded_bias(B, n_gates, hidden, keep_h_gate=op == "GRU" and lbr), _F32)
        if op == "GRU" and lbr:
            rbh = np.ascontiguousarray(np.asarray(B)[:, 5 * hidden:], _F32)
    if P is not None:
        p = np.ascontiguousarray(P, _F32)
    layer = _NativeLayer()
    layer.prep = _native.rnn_prepare(op, seq, batch, x_shape[2], hidden, dirs, reverse, layout, w, r, bias, rbh, p,
                                     0.0 if clip is None else float(clip), lbr, input_forget)
    layer.y_shape = (batch, seq, dirs, hidden) if layout else (seq, dirs, batch, hidden)
    layer.state_shape = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    layer.n_states = 2 if op == "LSTM" else 1
    return layer


def _native_layer(op, W, R, B, P, X, dirs, reverse, hidden, layout, clip, lbr, input_forget):
    key = (op, id(W), id(R), id(B), id(P), X.shape, dirs, reverse, hidden, layout, clip, lbr, input_forget)
    constant = all(a is None or not a.flags.writeable for a in (W, R, B, P))
    layer = _layers.get(key) if constant else None
    if layer is not None:
        return layer
    layer = _native_prepare(op, W, R, B, P, X.shape, dirs, reverse, hidden, layout, clip, lbr, input_forget)
    if constant:
        import weakref

        if len(_layers) > 256:
            _layers.clear()
        layer.key = key
        try:
            weakref.finalize(W, _layers.pop, key, None)
        except TypeError:
            return layer
        _layers[key] = layer
    return layer


def _native_run(op, X, W, R, B, sequence_lens, initial_h, initial_c, P, activations, clip, direction,
                hidden_size, layout, lbr=0, input_forget=0):
    """The layer through ``native.rnn_call``, or None when it does not apply (no native kernels, a
    dtype other than float32, activations other than the defaults, shapes the numpy path should
    judge).  Returns (Y, Y_h[, Y_c]); the states are views of one buffer the call wrote."""
    if not _native.available:
        return None
    arrays = [a for a in (X, W, R, B, initial_h, initial_c, P) if a is not None]
    if any(type(a) is not np.ndarray or a.dtype != _F32 for a in arrays):
        return None
    revs = _directions(direction)
    dirs, n_gates = len(revs), 4 if op == "LSTM" else 3
    if not _default_activations(op, activations, dirs) or X.ndim != 3:
        return None
    hidden = R.shape[-1] if R.ndim == 3 else -1
    if hidden_size and int(hidden_size) != hidden:
        return None
    seq, batch, inp = (X.shape[1], X.shape[0], X.shape[2]) if layout else X.shape
    state_shape = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    if (W.shape != (dirs, n_gates * hidden, inp) or R.shape != (dirs, n_gates * hidden, hidden)
            or (B is not None and B.shape != (dirs, 2 * n_gates * hidden))
            or (P is not None and P.shape != (dirs, 3 * hidden))
            or any(s is not None and s.shape != state_shape for s in (initial_h, initial_c))):
        return None
    lens = _check_lens(op, sequence_lens, seq, batch)
    layer = _native_layer(op, W, R, B, P, X, dirs, revs == [True], hidden, int(layout), clip, int(lbr),
                          int(input_forget))
    y = np.empty(layer.y_shape, _F32)
    state = np.empty((layer.n_states,) + layer.state_shape, _F32)
    lens32 = None
    if lens is not None:
        # the lengths as the kernel reads them (int32), made by a native call from the node's own
        # input, so that a program can replay it (the C kernel checks them again on every call)
        lens32 = np.empty(batch, np.int32)
        source = sequence_lens if (type(sequence_lens) is np.ndarray and sequence_lens.size == batch
                                   and sequence_lens.dtype.name in _native.CAST_CODES
                                   and sequence_lens.flags.c_contiguous) else lens
        _native.cast(source.reshape(batch), lens32)
    _native.rnn_call(layer.prep, np.ascontiguousarray(X), lens32,
                     None if initial_h is None else np.ascontiguousarray(initial_h),
                     None if initial_c is None else np.ascontiguousarray(initial_c), y, state)
    # the node's whole work is those native calls: its outputs (Y and the views of the states' buffer)
    # are declared together, and a program may replay it; unless the weights are not the model's
    # constants (graph inputs, computed): the prepared layer holds this run's packed copy of them
    outs = (y,) + tuple(state)
    constant = all(a is None or not a.flags.writeable for a in (W, R, B, P))
    return _native.final(outs) if constant else outs


# ----------------------------------------------------------------------------- kernels


@kernel("RNN", since=7)
def rnn(X, W, R, B=None, sequence_lens=None, initial_h=None, activation_alpha=(), activation_beta=(),
        activations=(), clip=None, direction="forward", hidden_size=0, layout=0):
    layout = _layout("RNN", layout)
    n_dirs = len(_directions(direction))
    acts = _activations(activations, activation_alpha, activation_beta, ["Tanh"], n_dirs)
    hidden = int(hidden_size) if hidden_size else R.shape[-1]

    def step(d, xp, states):
        (h,) = states
        pre = xp + h @ R[d].T
        return [acts[d][0](_clip(pre, clip)).astype(h.dtype)]

    return _run("RNN", X, W, R, _folded_bias(B, 1, hidden), sequence_lens, [initial_h], hidden_size, direction,
                layout, 1, step)


@kernel("GRU", since=7)
def gru(X, W, R, B=None, sequence_lens=None, initial_h=None, activation_alpha=(), activation_beta=(),
        activations=(), clip=None, direction="forward", hidden_size=0, layout=0, linear_before_reset=0):
    layout = _layout("GRU", layout)
    done = _native_run("GRU", X, W, R, B, sequence_lens, initial_h, None, None, activations, clip, direction,
                       hidden_size, layout, lbr=linear_before_reset)
    if done is not None:
        return done
    n_dirs = len(_directions(direction))
    acts = _activations(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh"], n_dirs)
    H = int(hidden_size) if hidden_size else R.shape[-1]
    # the h gate's recurrent bias: folded into the projection unless linear_before_reset
    rbh = None if B is None or not linear_before_reset else np.asarray(B)[:, 5 * H:]

    def step(d, xp, states):
        (h,) = states
        f, g = acts[d]
        Rd = R[d]
        zr = xp[:, : 2 * H] + h @ Rd[: 2 * H].T
        z = f(_clip(zr[:, :H], clip))
        r = f(_clip(zr[:, H:], clip))
        if linear_before_reset:
            lin = h @ Rd[2 * H :].T
            if rbh is not None:
                lin = lin + rbh[d]
            hh = g(_clip(xp[:, 2 * H :] + r * lin, clip))
        else:
            hh = g(_clip(xp[:, 2 * H :] + (r * h) @ Rd[2 * H :].T, clip))
        return [((1 - z) * hh + z * h).astype(h.dtype)]

    return _run("GRU", X, W, R, _folded_bias(B, 3, H, keep_h_gate=bool(linear_before_reset)), sequence_lens,
                [initial_h], hidden_size, direction, layout, 3, step)


@kernel("LSTM", since=7)
def lstm(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, activation_alpha=(),
         activation_beta=(), activations=(), clip=None, direction="forward", hidden_size=0, input_forget=0,
         layout=0):
    layout = _layout("LSTM", layout)
    done = _native_run("LSTM", X, W, R, B, sequence_lens, initial_h, initial_c, P, activations, clip, direction,
                       hidden_size, layout, input_forget=input_forget)
    if done is not None:
        return done
    n_dirs = len(_directions(direction))
    acts = _activations(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh", "Tanh"], n_dirs)
    H = int(hidden_size) if hidden_size else R.shape[-1]

    def step(d, xp, states):
        h, c = states
        f, g, hf = acts[d]
        gates = xp + h @ R[d].T
        gi, go, gf, gc = gates[:, :H], gates[:, H : 2 * H], gates[:, 2 * H : 3 * H], gates[:, 3 * H :]
        if P is not None:
            pi, po, pf = P[d][:H], P[d][H : 2 * H], P[d][2 * H :]
        else:
            pi = po = pf = 0
        i = f(_clip(gi + pi * c, clip))
        fg = 1 - i if input_forget else f(_clip(gf + pf * c, clip))
        cc = g(_clip(gc, clip))
        c_new = fg * c + i * cc
        o = f(_clip(go + po * c_new, clip))
        h_new = o * hf(c_new)
        return [h_new.astype(h.dtype), c_new.astype(c.dtype)]

    return _run("LSTM", X, W, R, _folded_bias(B, 4, H), sequence_lens, [initial_h, initial_c], hidden_size,
                direction, layout, 4, step)
