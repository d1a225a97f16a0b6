"""A numpy evaluator for the Core ML model specifications minirt writes for classical ML: the off-device reference.

minirt lowers tree ensembles and linear models (``ai.onnx.ml``) to Core ML's own classical model types
(``TreeEnsembleClassifier`` / ``TreeEnsembleRegressor`` / ``GLMClassifier`` / ``GLMRegressor`` of
Model.proto, not ML programs: targets/coreml/classical.py).  Core ML cannot run off Apple devices, so
the tests and ``minirt verify`` (off-device) read such a blob back (:func:`read_spec`), check it the way
Core ML's validators do (:func:`check_spec`) and compute what Core ML returns for it
(:func:`predict_rows`: one dict per sample, as ``MLModel.predict`` gives them).  It needs coremltools
for the protobuf classes only.

The semantics here are those of Core ML's documentation (TreeEnsemble.proto, GLMClassifier.proto,
GLMRegressor.proto, coremltools' ``tree_ensemble`` builder) and of coremltools' own converters and
tests (scikit-learn / XGBoost models compared with their Core ML predictions on a Mac):

* every number is a double: features are read as doubles, thresholds and leaf values are doubles;
* a tree is walked from its root (the node no other node of its tree points at) until a leaf; a
  branch node sends a NaN feature to the true child when ``missingValueTracksTrueChild`` is set, else
  to the false child; the leaves' ``evaluationInfo`` values are added to ``basePredictionValue``;
* post-evaluation transforms: ``Classification_SoftMax`` (softmax over the dimensions),
  ``Regression_Logistic`` (1 / (1 + e^-v) of each dimension);
* a classifier with one prediction dimension and two class labels gives P(second label) = v and
  P(first) = 1 - v (coremltools' binary GradientBoosting / RandomForest / XGBoost conversions); with one
  dimension per class, P(label k) = v_k.  The predicted label is the first label of highest probability
  (for two classes: the second label when v > 0.5);
* GLMClassifier with ``Logit``: OneVsRest gives sigmoid(w_k·x + b_k) per class, divided by their sum
  when there are more than two classes (coremltools compares this with scikit-learn's one-vs-rest
  ``predict_proba``); with two classes (one weight row) P(second) = sigmoid(w·x + b).  ReferenceClass is
  the multinomial logit with the first class as reference: P(first) ∝ 1, P(k) ∝ exp(w_k·x + b_k).
  ``Probit`` (binary only) is the normal CDF of w·x + b;
* GLMRegressor: w·x + b (one output), then its transform (Logit: sigmoid, Probit: normal CDF).

Not evaluated (minirt never writes them; :func:`check_spec` says so): other model types,
``Classification_SoftMaxWithZeroClassReference``, features other than one multi-array input.
"""
from __future__ import annotations

import logging
import math

import numpy as np

# (the blob format of a classical Core ML partition, the serialised Model protobuf: one definition)
from minirt.providers.coreml import SPEC_FORMAT  # noqa: F401
_MODEL_TYPES = ("treeEnsembleClassifier", "treeEnsembleRegressor", "glmClassifier", "glmRegressor")
_LEAF = 6  # TreeNode.LeafNode


class SpecError(ValueError):
    """The specification is not one Core ML would load, or not one this evaluator covers."""


def _proto():
    logging.getLogger("coremltools").setLevel(logging.ERROR)
    from coremltools.proto import Model_pb2

    return Model_pb2


def read_spec(blob: bytes):
    """The ``Model`` protobuf of a minirt classical Core ML blob, checked by :func:`check_spec`."""
    spec = _proto().Model()
    try:
        spec.ParseFromString(bytes(blob))
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise SpecError(f"the blob is not a Core ML model specification ({type(exc).__name__}: {exc})") from None
    check_spec(spec)
    return spec


# --------------------------------------------------------------------------- checking


def check_spec(spec) -> None:
    """Raise :class:`SpecError` unless ``spec`` is a classical model Core ML's validators accept and that
    this evaluator covers: the interface (one multi-array input; a classifier's Int64 / String label and
    dictionary probabilities; a regressor's Double or multi-array value) and the parameters (tree
    structure, dimensions, base values, GLM weight rows per class encoding)."""
    kind = spec.WhichOneof("Type")
    if kind not in _MODEL_TYPES:
        raise SpecError(f"model type {kind!r} is not one of the classical types minirt writes ({', '.join(_MODEL_TYPES)})")
    desc = spec.description
    if len(desc.input) != 1 or desc.input[0].type.WhichOneof("Type") != "multiArrayType":
        raise SpecError("the model must take one multi-array input (the feature vector)")
    if len(desc.input[0].type.multiArrayType.shape) != 1:
        raise SpecError("the feature multi-array must be one-dimensional")
    outputs = {o.name: o.type for o in desc.output}
    if desc.predictedFeatureName not in outputs:
        raise SpecError(f"predictedFeatureName {desc.predictedFeatureName!r} is not an output")
    model = getattr(spec, kind)
    width = int(desc.input[0].type.multiArrayType.shape[0])
    if kind.endswith("Classifier"):
        labels = _labels(model)
        if not labels:
            raise SpecError("a classifier must list its class labels")
        want = "int64Type" if isinstance(labels[0], int) else "stringType"
        if outputs[desc.predictedFeatureName].WhichOneof("Type") != want:
            raise SpecError(f"the predicted label output must be {want} for these class labels")
        if desc.predictedProbabilitiesName:
            prob = outputs.get(desc.predictedProbabilitiesName)
            if prob is None or prob.WhichOneof("Type") != "dictionaryType":
                raise SpecError("the class probabilities output must be a dictionary")
    else:
        if outputs[desc.predictedFeatureName].WhichOneof("Type") not in ("doubleType", "multiArrayType"):
            raise SpecError("a regressor's output must be a Double or a multi-array")
    if kind.startswith("treeEnsemble"):
        _check_trees(model, kind, width)
    else:
        _check_glm(model, kind, width)


def _labels(model) -> list:
    which = model.WhichOneof("ClassLabels")
    if which == "int64ClassLabels":
        return [int(v) for v in model.int64ClassLabels.vector]
    if which == "stringClassLabels":
        return list(model.stringClassLabels.vector)
    return []


def _check_trees(model, kind: str, width: int) -> None:
    params = model.treeEnsemble
    dims = int(params.numPredictionDimensions)
    if dims == 0:
        raise SpecError("numPredictionDimensions is 0")
    if len(params.basePredictionValue) != dims:
        raise SpecError(f"basePredictionValue has {len(params.basePredictionValue)} values for {dims} dimensions")
    transform = int(model.postEvaluationTransform)
    if transform not in (0, 1, 2):
        raise SpecError("post-evaluation transform Classification_SoftMaxWithZeroClassReference is not evaluated here")
    if kind == "treeEnsembleClassifier":
        n_labels = len(_labels(model))
        if not (dims == n_labels or (dims == 1 and n_labels == 2)):
            raise SpecError(f"{dims} prediction dimensions for {n_labels} class labels (one per class, or one for two)")
    _tree_arrays(params, width)  # (builds and checks the structure)


def _check_glm(model, kind: str, width: int) -> None:
    rows = [list(w.value) for w in model.weights]
    if not rows or len(rows) != len(model.offset):
        raise SpecError("the GLM needs one offset per weight row, and at least one row")
    if any(len(r) != width for r in rows):
        raise SpecError(f"every weight row must have one weight per feature ({width})")
    if kind == "glmRegressor":
        if len(rows) != 1:
            raise SpecError("a GLMRegressor with a Double output has one weight row")
        return
    k = len(_labels(model))
    encoding = int(model.classEncoding)
    if encoding == 0 and len(rows) != k - 1:  # ReferenceClass
        raise SpecError(f"ReferenceClass encoding needs {k - 1} weight rows for {k} classes, got {len(rows)}")
    if encoding == 1 and len(rows) != (1 if k == 2 else k):  # OneVsRest
        raise SpecError(f"OneVsRest encoding needs {1 if k == 2 else k} weight rows for {k} classes, got {len(rows)}")
    if int(model.postEvaluationTransform) == 1 and k > 2:
        raise SpecError("the Probit transform is for two classes only")


def _tree_arrays(params, width: int) -> dict:
    """The nodes as arrays indexed by position in ``params.nodes``, the root of each tree and the leaves'
    value table, after Core ML's structural checks: (tree, node) ids unique, children declared in their
    tree, every node the child of at most one parent and not of itself, exactly one root per tree,
    every leaf with at least one evaluation value, indices within the dimensions."""
    nodes = params.nodes
    n = len(nodes)
    dims = int(params.numPredictionDimensions)
    pos = {}
    for i, nd in enumerate(nodes):
        key = (int(nd.treeId), int(nd.nodeId))
        if key in pos:
            raise SpecError(f"tree {key[0]} declares node {key[1]} twice")
        pos[key] = i
    leaf = np.array([nd.nodeBehavior == _LEAF for nd in nodes], dtype=bool)
    behavior = np.array([int(nd.nodeBehavior) for nd in nodes], dtype=np.int64)
    feature = np.zeros(n, dtype=np.int64)
    value = np.zeros(n, dtype=np.float64)
    true_next = np.arange(n, dtype=np.int64)  # a leaf points at itself: a walk that got there stays
    false_next = np.arange(n, dtype=np.int64)
    missing_true = np.zeros(n, dtype=bool)
    parents = np.zeros(n, dtype=np.int64)
    values = np.zeros((n, dims), dtype=np.float64)
    for i, nd in enumerate(nodes):
        if leaf[i]:
            if not nd.evaluationInfo:
                raise SpecError(f"leaf {nd.nodeId} of tree {nd.treeId} has no evaluation value")
            seen = set()
            for e in nd.evaluationInfo:
                k = int(e.evaluationIndex)
                if k >= dims or k in seen:
                    raise SpecError(f"leaf {nd.nodeId} of tree {nd.treeId}: evaluation index {k} is out of range or repeated")
                seen.add(k)
                values[i, k] = float(e.evaluationValue)
            continue
        if not 0 <= behavior[i] <= 5:
            raise SpecError(f"node {nd.nodeId} of tree {nd.treeId} has an unknown behaviour {behavior[i]}")
        feature[i] = int(nd.branchFeatureIndex)
        if feature[i] >= width:
            raise SpecError(f"node {nd.nodeId} of tree {nd.treeId} tests feature {feature[i]} of {width}")
        value[i] = float(nd.branchFeatureValue)
        missing_true[i] = bool(nd.missingValueTracksTrueChild)
        for child_id, out in ((nd.trueChildNodeId, true_next), (nd.falseChildNodeId, false_next)):
            j = pos.get((int(nd.treeId), int(child_id)))
            if j is None:
                raise SpecError(f"node {nd.nodeId} of tree {nd.treeId} names child {child_id}, which is not declared")
            if j == i:
                raise SpecError(f"node {nd.nodeId} of tree {nd.treeId} is its own child")
            out[i] = j
            parents[j] += 1
    if (parents > 1).any():
        i = int(np.flatnonzero(parents > 1)[0])
        raise SpecError(f"node {nodes[i].nodeId} of tree {nodes[i].treeId} is the child of two nodes")
    roots = {}
    for i in np.flatnonzero(parents == 0):
        t = int(nodes[i].treeId)
        if t in roots:
            raise SpecError(f"tree {t} has more than one root")
        roots[t] = int(i)
    # every node hangs from its tree's root (no cycle, nothing detached), and walks end at leaves
    reached = np.zeros(n, dtype=bool)
    stack = list(roots.values())
    while stack:
        i = stack.pop()
        if reached[i]:
            raise SpecError("the trees have a cycle")
        reached[i] = True
        if not leaf[i]:
            stack.extend((int(true_next[i]), int(false_next[i])))
    if not reached.all():
        raise SpecError("a node is not reachable from its tree's root")
    order = [roots[t] for t in sorted(roots)]
    return {"leaf": leaf, "behavior": behavior, "feature": feature, "value": value, "true_next": true_next,
            "false_next": false_next, "missing_true": missing_true, "values": values,
            "roots": np.asarray(order, dtype=np.int64)}


# --------------------------------------------------------------------------- evaluation


def _sigmoid(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.where(v >= 0, 1.0 / (1.0 + np.exp(-np.abs(v))), np.exp(-np.abs(v)) / (1.0 + np.exp(-np.abs(v))))


def _softmax(v: np.ndarray) -> np.ndarray:
    e = np.exp(v - v.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _normal_cdf(v: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.vectorize(math.erf, otypes=[np.float64])(v / math.sqrt(2.0)))


def _tree_scores(params, x: np.ndarray) -> np.ndarray:
    """[N, dims]: the base prediction plus every tree's leaf values, in double, trees in id order."""
    a = _tree_arrays(params, x.shape[1])
    n = len(x)
    scores = np.tile(np.asarray(params.basePredictionValue, dtype=np.float64), (n, 1))
    rows = np.arange(n)
    for root in a["roots"]:  # (tree by tree: the sum's order, ids ascending)
        node = np.full(n, root, dtype=np.int64)
        while True:
            branch = ~a["leaf"][node]
            if not branch.any():
                break
            v = x[rows, a["feature"][node]]
            t = a["value"][node]
            b = a["behavior"][node]
            with np.errstate(invalid="ignore"):
                go = np.select([b == 0, b == 1, b == 2, b == 3, b == 4, b == 5],
                               [v <= t, v < t, v >= t, v > t, v == t, v != t], False)
            nan = np.isnan(v)
            go = np.where(nan, a["missing_true"][node], go)
            node = np.where(branch, np.where(go, a["true_next"][node], a["false_next"][node]), node)
        scores += a["values"][node]
    return scores


def _transform_trees(model, scores: np.ndarray) -> np.ndarray:
    t = int(model.postEvaluationTransform)
    if t == 1:
        return _softmax(scores)
    if t == 2:
        return _sigmoid(scores)
    return scores


def _glm_scores(model, x: np.ndarray) -> np.ndarray:
    w = np.asarray([list(r.value) for r in model.weights], dtype=np.float64)
    b = np.asarray(model.offset, dtype=np.float64)
    return x @ w.T + b


def _class_probabilities(spec, x: np.ndarray) -> np.ndarray:
    """[N, K]: P(label k) in the order of the class labels."""
    kind = spec.WhichOneof("Type")
    model = getattr(spec, kind)
    k = len(_labels(model))
    if kind == "treeEnsembleClassifier":
        p = _transform_trees(model, _tree_scores(model.treeEnsemble, x))
        if p.shape[1] == 1:  # one dimension, two classes: P(second label)
            return np.concatenate([1.0 - p, p], axis=1)
        return p
    z = _glm_scores(model, x)
    link = _normal_cdf if int(model.postEvaluationTransform) == 1 else _sigmoid
    if int(model.classEncoding) == 0:  # ReferenceClass: multinomial logit, first class at score 0
        if int(model.postEvaluationTransform) == 1:
            raise SpecError("ReferenceClass with Probit is not evaluated here")
        return _softmax(np.concatenate([np.zeros((len(x), 1)), z], axis=1))
    if k == 2:
        p = link(z[:, :1])
        return np.concatenate([1.0 - p, p], axis=1)
    p = link(z)
    return p / p.sum(axis=1, keepdims=True)


def predict_rows(spec, x) -> list[dict]:
    """What Core ML's ``predict`` returns for each row of ``x`` ([N, F], or [F] for one sample): dicts
    of output feature name -> value (a label: int or str; probabilities: {label: float}; a regressor's
    value: float, or a float64 array for a multi-array output)."""
    x = np.asarray(x, dtype=np.float64)
    x = x.reshape(1, -1) if x.ndim == 1 else x
    desc = spec.description
    width = int(desc.input[0].type.multiArrayType.shape[0])
    if x.ndim != 2 or x.shape[1] != width:
        raise SpecError(f"the model takes {width} features per sample, got an input of shape {list(x.shape)}")
    kind = spec.WhichOneof("Type")
    model = getattr(spec, kind)
    out_name = desc.predictedFeatureName
    if kind.endswith("Classifier"):
        labels = _labels(model)
        p = _class_probabilities(spec, x)
        if len(labels) == 2:
            picks = (p[:, 1] > 0.5).astype(np.int64)  # (a tie at 0.5 keeps the first label, as argmax)
        else:
            picks = np.argmax(p, axis=1)
        rows = []
        for i in range(len(x)):
            row = {out_name: labels[int(picks[i])]}
            if desc.predictedProbabilitiesName:
                row[desc.predictedProbabilitiesName] = {lab: float(p[i, j]) for j, lab in enumerate(labels)}
            rows.append(row)
        return rows
    if kind == "treeEnsembleRegressor":
        y = _transform_trees(model, _tree_scores(model.treeEnsemble, x))
    else:
        y = _glm_scores(model, x)
        t = int(model.postEvaluationTransform)
        y = _sigmoid(y) if t == 1 else _normal_cdf(y) if t == 2 else y
    scalar = {o.name: o.type.WhichOneof("Type") for o in desc.output}[out_name] == "doubleType"
    return [{out_name: float(y[i, 0]) if scalar else y[i].copy()} for i in range(len(x))]


def compile_reference(blob, partition, artifact, options):
    """``minirt verify``'s off-device reference for a classical Core ML partition: the spec read back
    from the blob, evaluated here, its per-sample results put together as the provider does on a Mac
    (minirt/providers/coreml.py: :func:`partition_outputs`)."""
    from minirt.providers.coreml import partition_outputs

    spec = read_spec(blob)

    def run(*arrays):
        (x,) = arrays
        return partition_outputs(predict_rows(spec, x), np.asarray(x), options)

    return run
