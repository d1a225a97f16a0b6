"""Kernels of the ``ai.onnx.ml`` domain (classical machine learning), as onnxruntime implements them.

One kernel per operator: the linear and SVM models, the three tree-ensemble ops, the feature
transforms (Scaler, Normalizer, Imputer, Binarizer, OneHotEncoder, LabelEncoder, CategoryMapper,
ArrayFeatureExtractor, FeatureVectorizer) and the map ops (DictVectorizer, CastMap, ZipMap).

Numerics follow onnxruntime, not the ONNX text, wherever the two differ, because converted models
are judged against onnxruntime: inputs of classifiers/regressors become float32 before any
arithmetic, scores and their post transforms are float32 (minirt/kernels/_ml_scores.py), trees add
votes in their threshold type (minirt/kernels/trees.py), and the binary special cases of the
classifiers are reproduced.

Value kinds: a map is a Python ``dict`` (int or str keys), a sequence of maps a ``list`` of them,
string tensors numpy object arrays of ``str``.  LabelEncoder maps numeric keys with a sorted search
and string keys through a dict.
"""
from __future__ import annotations


import numpy as np

from minirt.kernels import _ml_scores as sc
from minirt.kernels import trees
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


# --------------------------------------------------------------------------- tree ensembles
# One layout and one traversal for the three tree ops (minirt/kernels/trees.py); each op only builds
# its layout (once per node: kept in the node's memo) and finishes the scores its own way.


def _aggregate_code(op: str, value) -> int:
    text = value.decode() if isinstance(value, bytes) else str(value)
    if text not in trees._AGGREGATES:
        raise ValueError(f"{op}: aggregate_function must be one of {sorted(trees._AGGREGATES)}, got {text!r}")
    return trees._AGGREGATES[text]


def _class_labels(op: str, ints, strings) -> list:
    if strings:
        if ints:
            raise ValueError(f"{op}: set classlabels_strings or classlabels_int64s, not both")
        return [_text(s) for s in strings]
    if ints is None or len(ints) == 0:
        raise ValueError(f"{op}: classlabels_int64s or classlabels_strings is required")
    return [int(v) for v in ints]


@kernel("TreeEnsembleClassifier", since=1, domain=ML, context=True)
def tree_ensemble_classifier_1(x, /, *, base_values=None, class_ids=None, class_nodeids=None, class_treeids=None,
                               class_weights=None, classlabels_int64s=None, classlabels_strings=None,
                               nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                               nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_nodeids=None,
                               nodes_treeids=None, nodes_truenodeids=None, nodes_values=None,
                               post_transform="NONE", ctx=None):
    return tree_ensemble_classifier_3(
        x, base_values=base_values, class_ids=class_ids, class_nodeids=class_nodeids, class_treeids=class_treeids,
        class_weights=class_weights, classlabels_int64s=classlabels_int64s, classlabels_strings=classlabels_strings,
        nodes_falsenodeids=nodes_falsenodeids, nodes_featureids=nodes_featureids,
        nodes_missing_value_tracks_true=nodes_missing_value_tracks_true, nodes_modes=nodes_modes,
        nodes_nodeids=nodes_nodeids, nodes_treeids=nodes_treeids, nodes_truenodeids=nodes_truenodeids,
        nodes_values=nodes_values, post_transform=post_transform, ctx=ctx)


@kernel("TreeEnsembleClassifier", since=3, domain=ML, context=True)
def tree_ensemble_classifier_3(x, /, *, base_values=None, base_values_as_tensor=None, class_ids=None,
                               class_nodeids=None, class_treeids=None, class_weights=None,
                               class_weights_as_tensor=None, classlabels_int64s=None, classlabels_strings=None,
                               nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                               nodes_hitrates_as_tensor=None, nodes_missing_value_tracks_true=None,
                               nodes_modes=None, nodes_nodeids=None, nodes_treeids=None, nodes_truenodeids=None,
                               nodes_values=None, nodes_values_as_tensor=None, post_transform="NONE", ctx=None):
    """Labels [N] (int64 or string) and class scores [N, n_classes] (float32) of a tree ensemble.

    The trees add their leaf weights per class in the threshold type (float32, or double when the
    thresholds/weights come as double tensors) in tree order; ``base_values`` are added and the
    label and scores follow onnxruntime's rules, including its two-class special cases
    (trees.finish_classifier).  Hit rates are statistics only and do not change the result."""
    op = "TreeEnsembleClassifier"
    labels = _class_labels(op, classlabels_int64s, classlabels_strings)
    layout = trees.memo_layout(ctx, lambda: trees.layout_from_classic(
        op, nodes_treeids=nodes_treeids, nodes_nodeids=nodes_nodeids, nodes_featureids=nodes_featureids,
        nodes_modes=nodes_modes, nodes_values=nodes_values, nodes_values_as_tensor=nodes_values_as_tensor,
        nodes_truenodeids=nodes_truenodeids, nodes_falsenodeids=nodes_falsenodeids,
        nodes_missing_value_tracks_true=nodes_missing_value_tracks_true, w_treeids=class_treeids,
        w_nodeids=class_nodeids, w_ids=class_ids, w_weights=class_weights,
        w_weights_as_tensor=class_weights_as_tensor, n_targets=len(labels)))
    base = trees._floats(base_values, base_values_as_tensor, "base_values", op)
    return trees.finish_classifier(layout, sc.as_float_rows(op, x, dtype=None), base,
                                   sc.post_transform_code(op, post_transform), labels)


@kernel("TreeEnsembleRegressor", since=1, domain=ML, context=True)
def tree_ensemble_regressor_1(x, /, *, aggregate_function="SUM", base_values=None, n_targets=None,
                              nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                              nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_nodeids=None,
                              nodes_treeids=None, nodes_truenodeids=None, nodes_values=None, post_transform="NONE",
                              target_ids=None, target_nodeids=None, target_treeids=None, target_weights=None,
                              ctx=None):
    return tree_ensemble_regressor_3(
        x, aggregate_function=aggregate_function, base_values=base_values, n_targets=n_targets,
        nodes_falsenodeids=nodes_falsenodeids, nodes_featureids=nodes_featureids,
        nodes_missing_value_tracks_true=nodes_missing_value_tracks_true, nodes_modes=nodes_modes,
        nodes_nodeids=nodes_nodeids, nodes_treeids=nodes_treeids, nodes_truenodeids=nodes_truenodeids,
        nodes_values=nodes_values, post_transform=post_transform, target_ids=target_ids,
        target_nodeids=target_nodeids, target_treeids=target_treeids, target_weights=target_weights, ctx=ctx)


@kernel("TreeEnsembleRegressor", since=3, domain=ML, context=True)
def tree_ensemble_regressor_3(x, /, *, aggregate_function="SUM", base_values=None, base_values_as_tensor=None,
                              n_targets=None, nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                              nodes_hitrates_as_tensor=None, nodes_missing_value_tracks_true=None, nodes_modes=None,
                              nodes_nodeids=None, nodes_treeids=None, nodes_truenodeids=None, nodes_values=None,
                              nodes_values_as_tensor=None, post_transform="NONE", target_ids=None,
                              target_nodeids=None, target_treeids=None, target_weights=None,
                              target_weights_as_tensor=None, ctx=None):
    """Y [N, n_targets] (float32): the trees' leaf weights aggregated per target (SUM, AVERAGE, MIN, MAX)
    in the threshold type, plus ``base_values`` (only when there is one per target, or a single one
    for a single target), then ``post_transform`` (for a single target only PROBIT applies, as in
    onnxruntime)."""
    op = "TreeEnsembleRegressor"
    if n_targets is None:
        raise ValueError(f"{op}: n_targets is required")
    layout = trees.memo_layout(ctx, lambda: trees.layout_from_classic(
        op, nodes_treeids=nodes_treeids, nodes_nodeids=nodes_nodeids, nodes_featureids=nodes_featureids,
        nodes_modes=nodes_modes, nodes_values=nodes_values, nodes_values_as_tensor=nodes_values_as_tensor,
        nodes_truenodeids=nodes_truenodeids, nodes_falsenodeids=nodes_falsenodeids,
        nodes_missing_value_tracks_true=nodes_missing_value_tracks_true, w_treeids=target_treeids,
        w_nodeids=target_nodeids, w_ids=target_ids, w_weights=target_weights,
        w_weights_as_tensor=target_weights_as_tensor, n_targets=int(n_targets)))
    base = trees._floats(base_values, base_values_as_tensor, "base_values", op)
    return trees.finish_regressor(layout, sc.as_float_rows(op, x, dtype=None), _aggregate_code(op, aggregate_function),
                                  base, sc.post_transform_code(op, post_transform))


@kernel("TreeEnsemble", since=5, domain=ML, context=True)
def tree_ensemble(x, /, *, aggregate_function=1, leaf_targetids=None, leaf_weights=None, membership_values=None,
                  n_targets=None, nodes_falseleafs=None, nodes_falsenodeids=None, nodes_featureids=None,
                  nodes_hitrates=None, nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_splits=None,
                  nodes_trueleafs=None, nodes_truenodeids=None, post_transform=0, tree_roots=None, ctx=None):
    """Y [N, n_targets] in X's float type: leaves in their own arrays, splits and weights tensors of
    X's type; BRANCH_MEMBER tests membership in a NaN-separated set of values."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"TreeEnsemble: X must be [N, F], got shape {list(x.shape)}")
    if x.dtype.kind != "f":
        raise ValueError(f"TreeEnsemble: X must be float, double or float16, got {x.dtype}")
    dtype = np.float64 if x.dtype == np.float64 else np.float32
    layout = trees.memo_layout(ctx, lambda: trees.layout_from_v5(
        leaf_targetids=leaf_targetids, leaf_weights=leaf_weights, membership_values=membership_values,
        n_targets=n_targets, nodes_falseleafs=nodes_falseleafs, nodes_falsenodeids=nodes_falsenodeids,
        nodes_featureids=nodes_featureids, nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
        nodes_modes=nodes_modes, nodes_splits=nodes_splits, nodes_trueleafs=nodes_trueleafs,
        nodes_truenodeids=nodes_truenodeids, tree_roots=tree_roots, dtype=dtype))
    agg = int(aggregate_function)
    if not 0 <= agg <= 3:
        raise ValueError(f"TreeEnsemble: aggregate_function must be in 0..3, got {agg}")
    y = trees.finish_v5(layout, x.astype(dtype, copy=False), agg, sc.post_transform_code("TreeEnsemble", post_transform))
    return y.astype(x.dtype)


# --------------------------------------------------------------------------- linear models


def _coefficient_rows(op: str, coefficients, n_rows: int, n_features: int) -> np.ndarray:
    coef = np.asarray(coefficients if coefficients is not None else (), dtype=np.float32).reshape(-1)
    if coef.size != n_rows * n_features:
        raise ValueError(f"{op}: {coef.size} coefficients do not make {n_rows} rows of the {n_features} features "
                         f"of X; expected {n_rows * n_features}")
    return coef.reshape(n_rows, n_features)


@kernel("LinearClassifier", since=1, domain=ML)
def linear_classifier(x, /, *, classlabels_ints=None, classlabels_strings=None, coefficients=None, intercepts=None,
                      multi_class=0, post_transform="NONE"):
    """Labels [N] and scores [N, K]: scores = X·coefficientsᵀ + intercepts in float32 (X converted to
    float32 first, as onnxruntime does), label = the first class of highest score.  With one row of
    coefficients and two labels (a binary model) the label is labels[1] when the score is > 0, and the
    scores become [1 - s, s] (onnxruntime applies no LOGISTIC/SOFTMAX then: the converters put the
    probability into the coefficients' model themselves).  ``multi_class`` does not change the result."""
    op = "LinearClassifier"
    xf = sc.as_float_rows(op, x)
    b = np.asarray(intercepts if intercepts is not None else (), dtype=np.float32).reshape(-1)
    k = len(b)
    if k == 0:
        raise ValueError(f"{op}: intercepts is required (one per class)")
    w = _coefficient_rows(op, coefficients, k, xf.shape[1])
    scores = (xf @ w.T + b).astype(np.float32)
    strings = bool(classlabels_strings)
    labels = [_text(s) for s in classlabels_strings] if strings else [int(v) for v in (classlabels_ints or ())]
    post = sc.post_transform_code(op, post_transform)
    if k == 1:
        positive = scores[:, 0] > 0
        if len(labels) == 2:
            picked = sc.labels_array(labels, positive.astype(np.int64))
        else:  # no usable label list: onnxruntime's "1"/"0" (or 1/0)
            picked = sc.labels_array(["0", "1"] if strings else [0, 1], positive.astype(np.int64))
        second = sc.COMPLEMENT if len(labels) == 2 else sc.KEEP_ONE
        return picked, sc.finalize_scores(scores, post, second)
    if len(labels) < k:
        raise ValueError(f"{op}: {k} classes (intercepts) but {len(labels)} class labels")
    return sc.labels_array(labels, np.argmax(scores, axis=1)), sc.finalize_scores(scores, post)


@kernel("LinearRegressor", since=1, domain=ML)
def linear_regressor(x, /, *, coefficients=None, intercepts=None, post_transform="NONE", targets=1):
    """Y [N, targets] = X·coefficientsᵀ + intercepts in float32, then ``post_transform`` (a single
    target only takes PROBIT, as in onnxruntime).  No intercepts means zero."""
    op = "LinearRegressor"
    xf = sc.as_float_rows(op, x)
    t = int(targets)
    w = _coefficient_rows(op, coefficients, t, xf.shape[1])
    y = xf @ w.T
    if intercepts is not None and len(intercepts):
        b = np.asarray(intercepts, dtype=np.float32).reshape(-1)
        if b.size != t:
            raise ValueError(f"{op}: {b.size} intercepts for {t} targets")
        y = y + b
    return sc.finalize_scores(y.astype(np.float32), sc.post_transform_code(op, post_transform))


# --------------------------------------------------------------------------- support vector machines

_SVM_KERNELS = ("LINEAR", "POLY", "RBF", "SIGMOID")


def _svm_kernel(op: str, kernel_type, kernel_params) -> tuple:
    name = _text(kernel_type)
    if name not in _SVM_KERNELS:
        raise ValueError(f"{op}: kernel_type must be one of {list(_SVM_KERNELS)}, got {name!r}")
    params = list(kernel_params or ())
    gamma, coef0, degree = (params + [0.0, 0.0, 0.0])[:3] if params else (0.0, 0.0, 0.0)
    return name, np.float32(gamma), np.float32(coef0), np.float32(degree)


def _svm_gram(xf: np.ndarray, vectors: np.ndarray, kernel: tuple, linear_bias=np.float32(0)) -> np.ndarray:
    """[N, V] kernel values of every sample with every vector, in float32 (onnxruntime's formulas:
    RBF exp(-gamma·|x - v|²); POLY (gamma·x·v + coef0)^degree; SIGMOID tanh(gamma·x·v + coef0);
    LINEAR x·v + ``linear_bias``)."""
    name, gamma, coef0, degree = kernel
    if name == "RBF":
        out = np.empty((xf.shape[0], vectors.shape[0]), dtype=np.float32)
        step = max(1, 2_000_000 // max(vectors.size, 1))  # bound the [rows, V, F] difference block
        for start in range(0, xf.shape[0], step):
            d = xf[start:start + step, None, :] - vectors[None, :, :]
            out[start:start + step] = np.exp(-gamma * np.einsum("nvf,nvf->nv", d, d, dtype=np.float32))
        return out
    dot = xf @ vectors.T
    if name == "LINEAR":
        return (dot + linear_bias).astype(np.float32)
    z = gamma * dot + coef0
    if name == "POLY":
        return (z ** degree if degree not in (2, 3) else z * z if degree == 2 else z * z * z).astype(np.float32)
    return np.tanh(z).astype(np.float32)


def _pairwise_probabilities(pair_scores: np.ndarray, prob_a, prob_b, k: int) -> np.ndarray:
    """Class probabilities [N, K] from the K(K-1)/2 one-against-one decision values: Platt's sigmoid
    per pair, clipped to [1e-7, 1 - 1e-7], then the coupling iteration of Wu, Lin and Weng (libsvm's
    multiclass_probability) run the way onnxruntime runs it: float32, at most 100 sweeps, stopping
    per sample once max|Qp - pQp| < 0.005 / K."""
    f32 = np.float32
    n = pair_scores.shape[0]
    a = np.asarray(prob_a, dtype=f32)
    b = np.asarray(prob_b, dtype=f32)
    p_pair = f32(1) - sc.logistic(pair_scores * a + b)  # sigmoid_probability
    p_pair = np.minimum(np.maximum(p_pair, f32(1e-7)), f32(1) - f32(1e-7))
    r = np.zeros((n, k, k), dtype=f32)
    idx = 0
    for i in range(k - 1):
        for j in range(i + 1, k):
            r[:, i, j] = p_pair[:, idx]
            r[:, j, i] = f32(1) - p_pair[:, idx]
            idx += 1
    q = np.zeros((n, k, k), dtype=f32)
    for i in range(k):
        for j in range(k):
            if j != i:
                q[:, i, i] += r[:, j, i] * r[:, j, i]
        for j in range(k):
            if j < i:
                q[:, i, j] = q[:, j, i]
            elif j > i:
                q[:, i, j] = -r[:, j, i] * r[:, i, j]
    p = np.full((n, k), f32(1) / f32(k), dtype=f32)
    eps = f32(0.005) / f32(k)
    active = np.ones(n, dtype=bool)
    for _ in range(100):
        qp = np.einsum("nij,nj->ni", q, p, dtype=f32)
        pqp = (p * qp).sum(axis=1, dtype=f32)
        err = np.abs(qp - pqp[:, None]).max(axis=1)
        active &= ~(err < eps)
        if not active.any():
            break
        rows = np.flatnonzero(active)
        pa, qpa, pqpa, qa = p[rows], qp[rows], pqp[rows], q[rows]
        for t in range(k):
            diff = (-qpa[:, t] + pqpa) / qa[:, t, t]
            pa[:, t] += diff
            pqpa = (pqpa + diff * (diff * qa[:, t, t] + f32(2) * qpa[:, t])) / (f32(1) + diff) / (f32(1) + diff)
            qpa = (qpa + diff[:, None] * qa[:, t, :]) / (f32(1) + diff[:, None])
            pa = pa / (f32(1) + diff[:, None])
        p[rows] = pa
    return p


@kernel("SVMClassifier", since=1, domain=ML)
def svm_classifier(x, /, *, classlabels_ints=None, classlabels_strings=None, coefficients=None, kernel_params=None,
                   kernel_type="LINEAR", post_transform="NONE", prob_a=None, prob_b=None, rho=None,
                   support_vectors=None, vectors_per_class=None):
    """Labels [N] and scores of a support vector classifier, in float32 as onnxruntime computes them.

    With support vectors (libsvm's SVC): one decision value per pair of classes (i, j), i < j,
    summed in double; each pair votes for i when its value is > 0, the label is the first class with
    most votes.  Scores are the K(K-1)/2 decision values (two classes: [-v, v], or [1 - v, v]
    under a post transform), or with ``prob_a``/``prob_b`` the K pairwise-coupled probabilities.
    Without support vectors (liblinear): scores = X·coefficientsᵀ + rho[0], label = argmax."""
    op = "SVMClassifier"
    xf = sc.as_float_rows(op, x)
    strings = bool(classlabels_strings)
    labels = [_text(s) for s in classlabels_strings] if strings else [int(v) for v in (classlabels_ints or ())]
    if not labels:
        raise ValueError(f"{op}: classlabels_ints or classlabels_strings is required")
    k = len(labels)
    post = sc.post_transform_code(op, post_transform)
    kern = _svm_kernel(op, kernel_type, kernel_params)
    rho_arr = np.asarray(rho if rho is not None else (), dtype=np.float32).reshape(-1)
    coef = np.asarray(coefficients if coefficients is not None else (), dtype=np.float32).reshape(-1)
    per_class = [int(v) for v in (vectors_per_class or ())]
    n_vectors = sum(per_class)
    have_proba = bool(prob_a) and len(prob_a) > 0
    if have_proba and (prob_b is None or len(prob_b) != len(prob_a)):
        raise ValueError(f"{op}: prob_a and prob_b must have the same length")
    if n_vectors == 0:  # liblinear: one coefficient row per class
        w = _coefficient_rows(op, coef, k, xf.shape[1])
        scores = _svm_gram(xf, w, ("LINEAR", 0, 0, 0), rho_arr[0] if rho_arr.size else np.float32(0))
        best = np.argmax(scores, axis=1)
        max_weight = scores[np.arange(len(best)), best]
        if k == 2:
            all_positive = bool((coef >= 0).all())
            second = (all_positive & (max_weight >= 0.5)) | (~all_positive & (max_weight > 0))
            best = np.where(second, 1, best)
        return sc.labels_array(labels, best), sc.finalize_scores(scores, post)
    if len(per_class) != k:
        raise ValueError(f"{op}: vectors_per_class has {len(per_class)} entries for {k} classes")
    sv = np.asarray(support_vectors if support_vectors is not None else (), dtype=np.float32).reshape(-1)
    if sv.size != n_vectors * xf.shape[1]:
        raise ValueError(f"{op}: {sv.size} support vector values are not {n_vectors} vectors of the "
                         f"{xf.shape[1]} features of X")
    n_pairs = k * (k - 1) // 2
    if coef.size != (k - 1) * n_vectors or rho_arr.size < n_pairs:
        raise ValueError(f"{op}: expected {(k - 1) * n_vectors} coefficients and {n_pairs} rho values, got "
                         f"{coef.size} and {rho_arr.size}")
    gram = _svm_gram(xf, sv.reshape(n_vectors, -1), kern)  # [N, V]
    dual = coef.reshape(k - 1, n_vectors)
    starts = np.concatenate([[0], np.cumsum(per_class)])
    pair_scores = np.empty((xf.shape[0], n_pairs), dtype=np.float32)
    votes = np.zeros((xf.shape[0], k), dtype=np.int64)
    idx = 0
    for i in range(k - 1):
        si = slice(starts[i], starts[i + 1])
        for j in range(i + 1, k):
            sj = slice(starts[j], starts[j + 1])
            # (float32 products, summed in double as onnxruntime does)
            total = ((dual[j - 1, si] * gram[:, si]).astype(np.float64).sum(axis=1)
                     + (dual[i, sj] * gram[:, sj]).astype(np.float64).sum(axis=1) + np.float64(rho_arr[idx]))
            pair_scores[:, idx] = total.astype(np.float32)
            votes[:, i] += total > 0
            votes[:, j] += ~(total > 0)
            idx += 1
    best = np.argmax(votes, axis=1)
    picked = sc.labels_array(labels, best)
    if have_proba:
        return picked, sc.finalize_scores(_pairwise_probabilities(pair_scores, prob_a, prob_b, k), post)
    if n_pairs == 1:
        second = sc.MIRROR_POS if post == sc.NONE else sc.COMPLEMENT
        return picked, sc.finalize_scores(pair_scores, post, second)
    return picked, sc.finalize_scores(pair_scores, post)


@kernel("SVMRegressor", since=1, domain=ML)
def svm_regressor(x, /, *, coefficients=None, kernel_params=None, kernel_type="LINEAR", n_supports=0, one_class=0,
                  post_transform="NONE", rho=None, support_vectors=None):
    """Y [N, 1]: Σ coefficients · kernel(x, support vector) + rho[0] (without support vectors:
    X·coefficients + rho[0]); ``one_class`` maps the value to +1 / -1.  onnxruntime ignores
    ``post_transform`` here, and so does minirt."""
    op = "SVMRegressor"
    xf = sc.as_float_rows(op, x)
    coef = np.asarray(coefficients if coefficients is not None else (), dtype=np.float32).reshape(-1)
    rho0 = np.float32(rho[0]) if rho else np.float32(0)
    nsv = int(n_supports)
    if nsv > 0:
        sv = np.asarray(support_vectors if support_vectors is not None else (), dtype=np.float32).reshape(-1)
        if sv.size != nsv * xf.shape[1] or coef.size != nsv:
            raise ValueError(f"{op}: {nsv} support vectors need {nsv * xf.shape[1]} support_vectors values and {nsv} "
                             f"coefficients, got {sv.size} and {coef.size}")
        gram = _svm_gram(xf, sv.reshape(nsv, -1), _svm_kernel(op, kernel_type, kernel_params))
        y = gram @ coef + rho0
    else:
        w = _coefficient_rows(op, coef, 1, xf.shape[1])
        y = (xf @ w.T)[:, 0] + rho0
    y = y.astype(np.float32)
    if int(one_class):
        y = np.where(y > 0, np.float32(1), np.float32(-1))
    return y.reshape(-1, 1)


# --------------------------------------------------------------------------- feature transforms


@kernel("Scaler", since=1, domain=ML)
def scaler(x, /, *, offset=None, scale=None):
    """Y = (X - offset) · scale in float32, offset and scale either one value or one per column (last axis)."""
    op = "Scaler"
    x = np.asarray(x)
    if x.dtype.kind not in "fiu":
        raise ValueError(f"{op}: X must be numeric, got {x.dtype}")
    xf = x.astype(np.float32)
    cols = xf.shape[-1] if xf.ndim else 1

    def param(v, name, neutral):
        a = np.asarray(v if v is not None and len(v) else [neutral], dtype=np.float32).reshape(-1)
        if a.size not in (1, cols):
            raise ValueError(f"{op}: {name} has {a.size} values; expected 1 or one per column ({cols})")
        return a

    return ((xf - param(offset, "offset", 0.0)) * param(scale, "scale", 1.0)).astype(np.float32)


@kernel("Normalizer", since=1, domain=ML)
def normalizer(x, /, *, norm="MAX"):
    """Each row (last axis) divided by its MAX (largest value), L1 (Σ|x|) or L2 (√Σx²) norm, in float32."""
    op = "Normalizer"
    x = np.asarray(x)
    if x.dtype.kind not in "fiu":
        raise ValueError(f"{op}: X must be numeric, got {x.dtype}")
    if x.ndim not in (1, 2):
        raise ValueError(f"{op}: X must be [N, C] or [C], got shape {list(x.shape)}")
    xf = x.astype(np.float32)
    kind = _text(norm)
    with np.errstate(divide="ignore", invalid="ignore"):
        if kind == "MAX":
            d = xf.max(axis=-1, keepdims=True)
        elif kind == "L1":
            d = np.abs(xf).sum(axis=-1, keepdims=True)
        elif kind == "L2":
            d = np.sqrt((xf * xf).sum(axis=-1, keepdims=True))
        else:
            raise ValueError(f"{op}: norm must be MAX, L1 or L2, got {kind!r}")
        return (xf / d).astype(np.float32)


@kernel("Imputer", since=1, domain=ML)
def imputer(x, /, *, imputed_value_floats=None, imputed_value_int64s=None, replaced_value_float=0.0,
            replaced_value_int64=0):
    """Y = X with every occurrence of the replaced value (NaN when it is NaN) set to the imputed value
    of its column (one value for all columns, or one per column of the last axis)."""
    op = "Imputer"
    x = np.asarray(x)
    if x.dtype.kind == "f":
        values = np.asarray(imputed_value_floats if imputed_value_floats else (), dtype=x.dtype)
        target = np.float32(replaced_value_float)
        hit = np.isnan(x) if np.isnan(target) else x == target
    elif x.dtype.kind in "iu":
        values = np.asarray(imputed_value_int64s if imputed_value_int64s else (), dtype=x.dtype)
        hit = x == int(replaced_value_int64)
    else:
        raise ValueError(f"{op}: X must be float, double, int32 or int64, got {x.dtype}")
    cols = x.shape[-1] if x.ndim else 1
    if values.size not in (1, cols):
        raise ValueError(f"{op}: {values.size} imputed values; expected 1 or one per column ({cols})")
    return np.where(hit, values.reshape(-1) if values.size == cols else values[0], x).astype(x.dtype)


@kernel("OneHotEncoder", since=1, domain=ML)
def one_hot_encoder(x, /, *, cats_int64s=None, cats_strings=None, zeros=1):
    """Y = X's shape + [n_categories], float32: 1 at the position of each value's category.  A value
    that is not a category gives a row of zeros (``zeros`` = 1) or an error naming it (``zeros`` = 0)."""
    op = "OneHotEncoder"
    x = np.asarray(x)
    if cats_strings:
        cats = [_text(c) for c in cats_strings]
        flat = [_text(v) for v in x.reshape(-1)] if x.dtype == object or x.dtype.kind in "US" else None
        if flat is None:
            raise ValueError(f"{op}: the categories are strings but X is {x.dtype}")
    elif cats_int64s:
        cats = [int(c) for c in cats_int64s]
        if x.dtype.kind not in "fiu":
            raise ValueError(f"{op}: the categories are integers but X is {x.dtype}")
        flat = [int(v) for v in x.reshape(-1)]
    else:
        raise ValueError(f"{op}: cats_int64s or cats_strings is required")
    position = {c: i for i, c in enumerate(cats)}
    y = np.zeros((len(flat), len(cats)), dtype=np.float32)
    for row, v in enumerate(flat):
        i = position.get(v)
        if i is not None:
            y[row, i] = 1
        elif not int(zeros):
            raise ValueError(f"{op}: value {v!r} is not one of the {len(cats)} categories and zeros=0 forbids "
                             f"unknown values")
    return y.reshape(*x.shape, len(cats))


@kernel("CategoryMapper", since=1, domain=ML)
def category_mapper(x, /, *, cats_int64s=None, cats_strings=None, default_int64=-1, default_string="_Unused"):
    """Strings to int64 through the pairs (cats_strings[i], cats_int64s[i]), or int64 to strings the other
    way; a value without a pair takes the default of the output type."""
    op = "CategoryMapper"
    strings = [_text(s) for s in (cats_strings or ())]
    ints = [int(v) for v in (cats_int64s or ())]
    if len(strings) != len(ints):
        raise ValueError(f"{op}: cats_strings ({len(strings)}) and cats_int64s ({len(ints)}) must pair up")
    x = np.asarray(x)
    if x.dtype == object or x.dtype.kind in "US":
        table = dict(zip(strings, ints))
        out = [table.get(_text(v), int(default_int64)) for v in x.reshape(-1)]
        return np.asarray(out, dtype=np.int64).reshape(x.shape)
    if x.dtype.kind not in "iu":
        raise ValueError(f"{op}: X must be string or int64, got {x.dtype}")
    table = dict(zip(ints, strings))
    y = np.empty(x.size, dtype=object)
    y[:] = [table.get(int(v), _text(default_string)) for v in x.reshape(-1)]
    return y.reshape(x.shape)


# --------------------------------------------------------------------------- maps and vectors


def _require_map(op: str, m) -> dict:
    if not isinstance(m, dict):
        raise ValueError(f"{op}: the input must be a map (a Python dict), got {type(m).__name__}")
    return m


def _map_value_dtype(values: list, declared):
    """The output dtype of a map's values: declared by the node when known, else read off the values."""
    if declared is not None:
        return np.dtype(declared)
    if values and all(isinstance(v, str) for v in values):
        return np.dtype(object)
    if values and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        return np.dtype(np.int64)
    return np.dtype(np.float32)


@kernel("DictVectorizer", since=1, domain=ML, context=True)
def dict_vectorizer(x, /, *, int64_vocabulary=None, string_vocabulary=None, ctx=None):
    """A map to a [1, V] row over the vocabulary: the map's value for each vocabulary key, 0 (or "" for
    string values) where the map lacks the key; keys outside the vocabulary are ignored."""
    op = "DictVectorizer"
    m = _require_map(op, x)
    if string_vocabulary:
        vocab = [_text(s) for s in string_vocabulary]
        bad = [k for k in m if not isinstance(k, str)]
    elif int64_vocabulary:
        vocab = [int(v) for v in int64_vocabulary]
        bad = [k for k in m if isinstance(k, (str, bytes)) or isinstance(k, bool)]
    else:
        raise ValueError(f"{op}: int64_vocabulary or string_vocabulary is required")
    if bad:
        kind = "string" if string_vocabulary else "int64"
        raise ValueError(f"{op}: the vocabulary has {kind} keys, but the map has key {bad[0]!r} "
                         f"({type(bad[0]).__name__})")
    declared = ctx.output_dtypes[0] if ctx is not None and ctx.output_dtypes else None
    dtype = _map_value_dtype(list(m.values()), declared)
    y = np.zeros((1, len(vocab)), dtype=dtype)
    if dtype == object:
        y[:] = ""
    for i, key in enumerate(vocab):
        if key in m:
            y[0, i] = m[key]
    return y


@kernel("CastMap", since=1, domain=ML)
def cast_map(x, /, *, cast_to="TO_FLOAT", map_form="DENSE", max_map=1):
    """A map of int64 keys to a [1, n] tensor of its values cast to float32, int64 or string: DENSE lists
    the values in ascending key order; SPARSE puts value k at column k of ``max_map`` columns (keys
    outside [0, max_map) are ignored), missing columns 0 (or "0" for strings)."""
    op = "CastMap"
    m = _require_map(op, x)
    bad = [k for k in m if not isinstance(k, (int, np.integer)) or isinstance(k, bool)]
    if bad:
        raise ValueError(f"{op}: map keys must be int64, got {bad[0]!r} ({type(bad[0]).__name__})")
    target = _text(cast_to)
    dtypes = {"TO_FLOAT": np.float32, "TO_INT64": np.int64, "TO_STRING": object}
    if target not in dtypes:
        raise ValueError(f"{op}: cast_to must be one of {list(dtypes)}, got {target!r}")
    form = _text(map_form)
    keys = sorted(int(k) for k in m)

    def cast(v):
        if target == "TO_STRING":
            return v if isinstance(v, str) else _format_float(v)
        if isinstance(v, str):
            try:
                return float(v) if target == "TO_FLOAT" else int(float(v))
            except ValueError:
                raise ValueError(f"{op}: value {v!r} cannot be cast {target}") from None
        return v

    if form == "DENSE":
        values = [cast(m[k]) for k in keys]
    elif form == "SPARSE":
        size = int(max_map)
        if size <= 0:
            raise ValueError(f"{op}: max_map must be > 0 for SPARSE, got {size}")
        values = ["0" if target == "TO_STRING" else 0] * size
        for k in keys:
            if 0 <= k < size:
                values[k] = cast(m[k])
    else:
        raise ValueError(f"{op}: map_form must be DENSE or SPARSE, got {form!r}")
    y = np.empty((1, len(values)), dtype=dtypes[target])
    y[0, :] = values
    return y


def _format_float(v) -> str:
    return str(v) if not isinstance(v, (float, np.floating)) else f"{float(v):g}"


@kernel("FeatureVectorizer", since=1, domain=ML)
def feature_vectorizer(*inputs, inputdimensions=None):
    """The inputs side by side along the last axis, in float32: input i contributes inputdimensions[i]
    columns (its first ones; zeros if it has fewer)."""
    op = "FeatureVectorizer"
    dims = [int(d) for d in (inputdimensions or ())]
    if len(dims) != len(inputs):
        raise ValueError(f"{op}: {len(inputs)} inputs but {len(dims)} inputdimensions")
    if not inputs:
        raise ValueError(f"{op}: at least one input is required")
    arrays = [np.asarray(a) for a in inputs]
    n = arrays[0].shape[0] if arrays[0].ndim > 1 else 1
    y = np.zeros((n, sum(dims)), dtype=np.float32)
    col = 0
    for i, (a, d) in enumerate(zip(arrays, dims)):
        if a.dtype.kind not in "fiub":
            raise ValueError(f"{op}: input {i} must be numeric, got {a.dtype}")
        rows = a.reshape(n, -1) if a.ndim > 1 else a.reshape(1, -1)
        if rows.shape[0] != n:
            raise ValueError(f"{op}: input {i} has {rows.shape[0]} rows, input 0 has {n}")
        take = min(d, rows.shape[1])
        y[:, col:col + take] = rows[:, :take]
        col += d
    return y


@kernel("ZipMap", since=1, domain=ML)
def zip_map(x, /, *, classlabels_int64s=None, classlabels_strings=None):
    """Each row of X [N, K] as a dict {label: score}: a list of N dicts of Python int/str keys and
    float values, what onnxruntime returns for seq(map(...))."""
    op = "ZipMap"
    x = np.asarray(x)
    if x.ndim not in (1, 2):
        raise ValueError(f"{op}: X must be [N, K] or [K], got shape {list(x.shape)}")
    rows = x.reshape(1, -1) if x.ndim == 1 else x
    if classlabels_strings:
        labels = [_text(s) for s in classlabels_strings]
    elif classlabels_int64s:
        labels = [int(v) for v in classlabels_int64s]
    else:
        raise ValueError(f"{op}: classlabels_int64s or classlabels_strings is required")
    if rows.shape[1] != len(labels):
        raise ValueError(f"{op}: X has {rows.shape[1]} columns but there are {len(labels)} class labels")
    return ([dict(zip(labels, row)) for row in rows.astype(np.float32).tolist()],)
