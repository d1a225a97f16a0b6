"""Traditional-ML kernels of the ``ai.onnx.ml`` domain: LabelEncoder, Binarizer,
ArrayFeatureExtractor and TreeEnsemble.

TreeEnsemble walks all samples through a tree at once: one vectorised step
per tree level moves every sample's current node to its true or false child,
so the Python loop runs ``trees x depth`` times, never per sample.
LabelEncoder maps numeric keys with a sorted search and string keys through a
dict.
"""
from __future__ import annotations

import math

import numpy as np

from minirt.kernels.registry import kernel

ML = "ai.onnx.ml"


def _text(v) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


# --------------------------------------------------------------------------- Binarizer / ArrayFeatureExtractor


@kernel("Binarizer", since=1, domain=ML)
def binarizer(x, /, *, threshold=0.0):
    x = np.asarray(x)
    return (x > x.dtype.type(threshold)).astype(x.dtype)


@kernel("ArrayFeatureExtractor", since=1, domain=ML)
def array_feature_extractor(x, indices, /):
    x = np.asarray(x)
    idx = np.asarray(indices).astype(np.int64).reshape(-1)
    last = x.shape[-1] if x.ndim else 0
    if idx.size and (idx.min() < 0 or idx.max() >= last):
        raise ValueError(f"ArrayFeatureExtractor: indices must be in [0, {last}), got {idx.tolist()}")
    y = np.take(x, idx, axis=-1)
    # a 1-D input gives a [1, k] row (onnxruntime's shape rule)
    return y.reshape(1, -1) if x.ndim == 1 else y


# --------------------------------------------------------------------------- LabelEncoder


def _pick(op: str, named: dict):
    given = {k: v for k, v in named.items() if v is not None}
    if len(given) != 1:
        raise ValueError(f"{op}: exactly one of {sorted(named)} must be set, got {sorted(given) or 'none'}")
    return next(iter(given.items()))


def _label_encode(x, keys, values, default, out_dtype, nan_matches=True):
    x = np.asarray(x)
    if len(keys) != len(values):
        raise ValueError(f"LabelEncoder: {len(keys)} keys but {len(values)} values")
    out_dtype = np.dtype(out_dtype)
    if x.dtype == object or x.dtype.kind in "US" or np.asarray(keys).dtype == object:
        table = {}
        for k, v in zip(keys, values):
            table[_text(k)] = v  # a repeated key: the last one wins
        flat = [table.get(_text(v), default) for v in x.reshape(-1)]
        if out_dtype == object:
            y = np.empty(len(flat), dtype=object)
            y[:] = flat
            return y.reshape(x.shape)
        return np.array(flat, dtype=out_dtype).reshape(x.shape)
    k = np.asarray(keys, dtype=np.float64 if x.dtype.kind == "f" else x.dtype)
    vals = np.asarray(values, dtype=object if out_dtype == object else out_dtype)
    # keep the last occurrence of every key, then binary-search
    _, last = np.unique(k[::-1], return_index=True)
    order = (len(k) - 1 - last)
    k, vals = k[order], vals[order]
    xs = x.astype(k.dtype, copy=False)
    pos = np.clip(np.searchsorted(k, xs), 0, max(len(k) - 1, 0))
    hit = (k[pos] == xs) if len(k) else np.zeros(x.shape, dtype=bool)
    if nan_matches and x.dtype.kind == "f" and len(k) and np.isnan(k).any():  # a NaN key matches every NaN
        nan_val = vals[np.flatnonzero(np.isnan(k))[-1]]
        y = np.where(hit, vals[pos] if len(k) else default, default)
        y = np.where(np.isnan(xs), nan_val, y)
    else:
        y = np.where(hit, vals[pos] if len(k) else default, default)
    return np.asarray(y).astype(out_dtype)


@kernel("LabelEncoder", since=1, domain=ML)
def label_encoder_1(x, /, *, classes_strings=None, default_int64=-1, default_string="_Unused"):
    classes = [_text(s) for s in (classes_strings or ())]
    x = np.asarray(x)
    if x.dtype == object or x.dtype.kind in "US":
        return _label_encode(x, classes, list(range(len(classes))), int(default_int64), np.int64)
    return _label_encode(x, list(range(len(classes))), classes, _text(default_string), object)


@kernel("LabelEncoder", since=2, domain=ML)
def label_encoder_2(x, /, *, default_float=-0.0, default_int64=-1, default_string="_Unused", keys_floats=None,
                    keys_int64s=None, keys_strings=None, values_floats=None, values_int64s=None,
                    values_strings=None):
    # Opset 2 predates the rule that a NaN key matches NaN inputs: NaN matches nothing.
    return _label_encoder(
        x, default_float, default_int64, default_string, None, keys_floats, keys_int64s, keys_strings, None,
        values_floats, values_int64s, values_strings, None, nan_matches=False)


@kernel("LabelEncoder", since=4, domain=ML)
def label_encoder_4(x, /, *, default_float=-0.0, default_int64=-1, default_string="_Unused", default_tensor=None,
                    keys_floats=None, keys_int64s=None, keys_strings=None, keys_tensor=None, values_floats=None,
                    values_int64s=None, values_strings=None, values_tensor=None):
    return _label_encoder(
        x, default_float, default_int64, default_string, default_tensor, keys_floats, keys_int64s, keys_strings,
        keys_tensor, values_floats, values_int64s, values_strings, values_tensor, nan_matches=True)


def _label_encoder(x, default_float, default_int64, default_string, default_tensor, keys_floats, keys_int64s,
                   keys_strings, keys_tensor, values_floats, values_int64s, values_strings, values_tensor,
                   nan_matches):
    kname, keys = _pick("LabelEncoder", {"keys_floats": keys_floats, "keys_int64s": keys_int64s,
                                         "keys_strings": keys_strings, "keys_tensor": keys_tensor})
    vname, values = _pick("LabelEncoder", {"values_floats": values_floats, "values_int64s": values_int64s,
                                           "values_strings": values_strings, "values_tensor": values_tensor})
    if kname == "keys_strings":
        keys = [_text(s) for s in keys]
    elif kname == "keys_tensor":
        keys = np.asarray(keys).reshape(-1)
        keys = [_text(s) for s in keys] if keys.dtype == object else keys
    if vname == "values_tensor":
        values = np.asarray(values).reshape(-1)
        out_dtype = values.dtype
        values = [_text(s) for s in values] if out_dtype == object else values
    elif vname == "values_strings":
        values, out_dtype = [_text(s) for s in values], np.dtype(object)
    elif vname == "values_int64s":
        out_dtype = np.dtype(np.int64)
    else:
        out_dtype = np.dtype(np.float32)
    if default_tensor is not None:
        d = np.asarray(default_tensor).reshape(-1)
        default = _text(d[0]) if d.dtype == object else d[0]
    elif out_dtype == object:
        default = _text(default_string)
    elif out_dtype.kind in "iu":
        default = int(default_int64)
    else:
        default = float(default_float)
    return _label_encode(x, keys, values, default, out_dtype, nan_matches)


# --------------------------------------------------------------------------- TreeEnsemble

_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER = range(7)


def _erfinv(y: np.ndarray) -> np.ndarray:
    """Inverse error function: a rational first guess refined by Newton steps on math.erf."""
    y = np.asarray(y, dtype=np.float64)
    inner = np.abs(y) < 1
    yi = np.where(inner, y, 0.0)
    a = 0.147
    ln = np.log1p(-yi * yi)
    t = 2 / (np.pi * a) + ln / 2
    x = np.sign(yi) * np.sqrt(np.sqrt(t * t - ln / a) - t)
    erf = np.vectorize(math.erf, otypes=[np.float64])
    for _ in range(3):
        x = x - (erf(x) - yi) / (2 / math.sqrt(math.pi) * np.exp(-x * x))
    edge = np.where(np.abs(y) == 1, np.sign(y) * np.inf, np.nan)  # erfinv(+-1) = +-inf; |y| > 1 undefined
    return np.where(inner, x, edge)


def _post_transform(scores: np.ndarray, post_transform: int) -> np.ndarray:
    if post_transform == 0:
        return scores
    if post_transform == 1:  # SOFTMAX
        e = np.exp(scores - scores.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    if post_transform == 2:  # LOGISTIC
        return 1 / (1 + np.exp(-scores))
    if post_transform == 3:  # SOFTMAX_ZERO: zeros stay zero, the rest share the softmax
        nz = scores != 0
        m = np.where(nz, scores, -np.inf).max(axis=1, keepdims=True)
        e = np.where(nz, np.exp(scores - np.where(np.isfinite(m), m, 0)), 0)
        total = e.sum(axis=1, keepdims=True)
        return np.where(total > 0, e / np.where(total > 0, total, 1), 0)
    if post_transform == 4:  # PROBIT
        return math.sqrt(2) * _erfinv(2 * scores - 1)
    raise ValueError(f"TreeEnsemble: post_transform must be in 0..4, got {post_transform}")


def _ints(v) -> np.ndarray:
    return np.asarray(v if v is not None else (), dtype=np.int64).reshape(-1)


@kernel("TreeEnsemble", since=5, domain=ML)
def tree_ensemble(x, /, *, aggregate_function=1, leaf_targetids=None, leaf_weights=None, membership_values=None,
                  n_targets=None, nodes_falseleafs=None, nodes_falsenodeids=None, nodes_featureids=None,
                  nodes_hitrates=None, nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_splits=None,
                  nodes_trueleafs=None, nodes_truenodeids=None, post_transform=0, tree_roots=None):
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"TreeEnsemble: X must be [N, F], got shape {x.shape}")
    if n_targets is None or tree_roots is None or leaf_weights is None:
        raise ValueError("TreeEnsemble: n_targets, tree_roots and leaf_weights are required")
    xf = x.astype(np.float64)
    n = x.shape[0]
    feat, modes = _ints(nodes_featureids), _ints(nodes_modes)
    splits = np.asarray(nodes_splits if nodes_splits is not None else np.zeros(len(feat)), np.float64).reshape(-1)
    t_ids, f_ids = _ints(nodes_truenodeids), _ints(nodes_falsenodeids)
    t_leaf, f_leaf = _ints(nodes_trueleafs).astype(bool), _ints(nodes_falseleafs).astype(bool)
    missing_true = _ints(nodes_missing_value_tracks_true).astype(bool)
    if missing_true.size == 0:
        missing_true = np.zeros(len(feat), dtype=bool)
    lengths = {len(a) for a in (feat, modes, splits, t_ids, f_ids, t_leaf, f_leaf, missing_true)}
    if len(lengths) != 1:
        raise ValueError("TreeEnsemble: the nodes_* attributes must all have the same length")
    if feat.size and (feat.min() < 0 or feat.max() >= x.shape[1]):
        raise ValueError(f"TreeEnsemble: nodes_featureids out of range for {x.shape[1]} features")
    # BRANCH_MEMBER sets: NaN-delimited, in the order the member nodes appear
    member_sets: dict[int, np.ndarray] = {}
    if (modes == _MEMBER).any():
        mv = np.asarray(membership_values, dtype=np.float64).reshape(-1)
        cuts = np.flatnonzero(np.isnan(mv))
        groups = np.split(mv, cuts)
        groups = [g[~np.isnan(g)] for g in groups]
        for i, node in enumerate(np.flatnonzero(modes == _MEMBER)):
            member_sets[int(node)] = groups[i] if i < len(groups) else np.zeros(0)
    weights = np.asarray(leaf_weights, dtype=np.float64).reshape(-1)
    targets = _ints(leaf_targetids)
    n_t = int(n_targets)
    agg = int(aggregate_function)
    if agg == 2:
        acc = np.full((n, n_t), np.inf)
    elif agg == 3:
        acc = np.full((n, n_t), -np.inf)
    else:
        acc = np.zeros((n, n_t))
    rows = np.arange(n)
    for root in _ints(tree_roots):
        node = np.full(n, int(root), dtype=np.int64)
        done = np.zeros(n, dtype=bool)
        leaf = np.zeros(n, dtype=np.int64)
        for _ in range(len(feat) + 1):
            if done.all():
                break
            active = np.flatnonzero(~done)
            nd = node[active]
            v = xf[active, feat[nd]]
            s = splits[nd]
            md = modes[nd]
            go = np.select(
                [md == _LEQ, md == _LT, md == _GTE, md == _GT, md == _EQ, md == _NEQ],
                [v <= s, v < s, v >= s, v > s, v == s, v != s], default=False)
            for j in np.flatnonzero(md == _MEMBER):
                go[j] = bool(np.isin(v[j], member_sets[int(nd[j])]))
            # NaN compares as IEEE does (false, except for NEQ) unless the node sends missing values true
            go = go | (np.isnan(v) & missing_true[nd])
            nxt = np.where(go, t_ids[nd], f_ids[nd])
            is_leaf = np.where(go, t_leaf[nd], f_leaf[nd])
            leaf[active[is_leaf]] = nxt[is_leaf]
            done[active[is_leaf]] = True
            node[active[~is_leaf]] = nxt[~is_leaf]
        else:
            raise ValueError("TreeEnsemble: a tree does not terminate (cycle in nodes_*)")
        tgt, w = targets[leaf], weights[leaf]
        if agg in (0, 1):
            np.add.at(acc, (rows, tgt), w)
        elif agg == 2:
            np.minimum.at(acc, (rows, tgt), w)
        elif agg == 3:
            np.maximum.at(acc, (rows, tgt), w)
        else:
            raise ValueError(f"TreeEnsemble: aggregate_function must be in 0..3, got {agg}")
    if agg == 0:
        acc /= max(len(_ints(tree_roots)), 1)
    elif agg in (2, 3):
        acc = np.where(np.isfinite(acc), acc, 0.0)  # targets no leaf contributed to
    return _post_transform(acc, int(post_transform)).astype(x.dtype)
