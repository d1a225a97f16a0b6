"""Recurrent layers: RNN, GRU, LSTM (ONNX semantics, opset 7+ and layout from 14).

Shapes (layout 0): X [seq, batch, input]; W [dirs, G*hidden, input];
R [dirs, G*hidden, hidden]; B [dirs, 2*G*hidden]; initial states
[dirs, batch, hidden]; Y [seq, dirs, batch, hidden]; Y_h / Y_c
[dirs, batch, hidden].  layout 1 puts batch first: X [batch, seq, input],
Y [batch, seq, dirs, hidden], states [batch, dirs, hidden].

``sequence_lens`` shortens sequences per batch entry: steps past a sequence's
end leave its state unchanged and write zeros to Y; the reverse direction
starts from each sequence's own last element.
"""
from __future__ import annotations

import numpy as np

from minirt.kernels.registry import kernel
from minirt.vocabulary import RNN_ACTIVATIONS

# lower-case name -> (function of (x, alpha, beta), default alpha, default beta); a default of None:
# the activation takes no such parameter.  Keys: the vocabulary's RNN_ACTIVATIONS, lower-cased (the
# attribute is matched case-insensitively); tests/test_vocabulary.py checks they agree.
_FUNCTIONS = {
    "relu": (lambda x, a, b: np.maximum(x, 0), None, None),
    "tanh": (lambda x, a, b: np.tanh(x), None, None),
    "sigmoid": (lambda x, a, b: 1.0 / (1.0 + np.exp(-x)), None, None),
    "affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: np.where(x >= 0, x, a * x), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: np.where(x > a, x, 0), 1.0, None),
    "scaledtanh": (lambda x, a, b: a * np.tanh(b * x), 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: np.clip(a * x + b, 0, 1), 0.2, 0.5),
    "elu": (lambda x, a, b: np.where(x >= 0, x, a * (np.exp(x) - 1)), 1.0, None),
    "softsign": (lambda x, a, b: x / (1 + np.abs(x)), None, None),
    "softplus": (lambda x, a, b: np.log1p(np.exp(x)), None, None),
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


def _reverse_index(seq_len: int, lens: np.ndarray) -> np.ndarray:
    """idx[t, b]: the time step read at step t when running sequence b backwards."""
    t = np.arange(seq_len)[:, None]
    rev = lens[None, :] - 1 - t
    return np.where(rev >= 0, rev, t)  # past the end: any index, masked anyway


def _run(X, W, R, B, sequence_lens, init_states, hidden_size, direction, layout, n_gates, step):
    """Shared driver. ``step(d, x_proj_t, states, mask_t) -> new states`` (first state is H)."""
    X = np.asarray(X)
    dtype = X.dtype
    if layout:
        X = np.swapaxes(X, 0, 1)
        init_states = [None if s is None else np.swapaxes(s, 0, 1) for s in init_states]
    seq_len, batch = X.shape[0], X.shape[1]
    revs = _directions(direction)
    n_dirs = len(revs)
    hidden = int(hidden_size) if hidden_size else R.shape[-1]
    lens = (np.full(batch, seq_len, np.int64) if sequence_lens is None else np.asarray(sequence_lens).astype(np.int64))
    Y = np.zeros((seq_len, n_dirs, batch, hidden), dtype)
    finals = []
    for d, rev in enumerate(revs):
        states = [
            np.zeros((batch, hidden), dtype) if s is None else np.asarray(s[d], dtype) for s in init_states
        ]
        xproj = X @ W[d].T  # [seq, batch, G*hidden]
        if B is not None:
            xproj = xproj + B[d][: n_gates * hidden]
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


def _clip(x, clip):
    return x if clip is None else np.clip(x, -clip, clip)


def _rec_bias(B, d, n_gates, hidden):
    return 0 if B is None else B[d][n_gates * hidden :]


@kernel("RNN", since=7)
def rnn(X, W, R, B=None, sequence_lens=None, initial_h=None, activation_alpha=(), activation_beta=(),
        activations=(), clip=None, direction="forward", hidden_size=0, layout=0):
    n_dirs = len(_directions(direction))
    acts = _activations(activations, activation_alpha, activation_beta, ["Tanh"], n_dirs)
    hidden = int(hidden_size) if hidden_size else R.shape[-1]

    def step(d, xp, states):
        (h,) = states
        pre = xp + h @ R[d].T + _rec_bias(B, d, 1, hidden)
        return [acts[d][0](_clip(pre, clip)).astype(h.dtype)]

    return _run(X, W, R, B, sequence_lens, [initial_h], hidden_size, direction, layout, 1, step)


@kernel("GRU", since=7)
def gru(X, W, R, B=None, sequence_lens=None, initial_h=None, activation_alpha=(), activation_beta=(),
        activations=(), clip=None, direction="forward", hidden_size=0, layout=0, linear_before_reset=0):
    n_dirs = len(_directions(direction))
    acts = _activations(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh"], n_dirs)
    H = int(hidden_size) if hidden_size else R.shape[-1]

    def step(d, xp, states):
        (h,) = states
        f, g = acts[d]
        rb = _rec_bias(B, d, 3, H)
        rz, rr, rh = (R[d][:H], R[d][H : 2 * H], R[d][2 * H :])
        if B is None:
            rbz = rbr = rbh = 0
        else:
            rbz, rbr, rbh = rb[:H], rb[H : 2 * H], rb[2 * H :]
        z = f(_clip(xp[:, :H] + h @ rz.T + rbz, clip))
        r = f(_clip(xp[:, H : 2 * H] + h @ rr.T + rbr, clip))
        if linear_before_reset:
            hh = g(_clip(xp[:, 2 * H :] + r * (h @ rh.T + rbh), clip))
        else:
            hh = g(_clip(xp[:, 2 * H :] + (r * h) @ rh.T + rbh, clip))
        return [((1 - z) * hh + z * h).astype(h.dtype)]

    return _run(X, W, R, B, sequence_lens, [initial_h], hidden_size, direction, layout, 3, step)


@kernel("LSTM", since=7)
def lstm(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, activation_alpha=(),
         activation_beta=(), activations=(), clip=None, direction="forward", hidden_size=0, input_forget=0,
         layout=0):
    n_dirs = len(_directions(direction))
    acts = _activations(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh", "Tanh"], n_dirs)
    H = int(hidden_size) if hidden_size else R.shape[-1]

    def step(d, xp, states):
        h, c = states
        f, g, hf = acts[d]
        gates = xp + h @ R[d].T + _rec_bias(B, d, 4, H)
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

    return _run(X, W, R, B, sequence_lens, [initial_h, initial_c], hidden_size, direction, layout, 4, step)
