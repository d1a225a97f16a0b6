"""Classical ML on Core ML: tree ensembles and linear models as Core ML's own model types (not ML programs).

Core ML's model specification has ``TreeEnsembleClassifier`` / ``TreeEnsembleRegressor`` and
``GLMClassifier`` / ``GLMRegressor`` model types (Model.proto), which MIL has no ops for.  A node of
:data:`CLASSICAL_OPS` is therefore lowered on its own, one node per partition (``CoreMLSpec.group_key``),
to one such model, stored as the serialised ``Model`` protobuf (blob format ``mlmodel-spec``, the
bytes of an .mlmodel file).  The lowering reads its own spec back and checks it as Core ML's validators
would (minirt/tools/coreml_spec_eval.py: :func:`check_spec`); that module's evaluator is the off-device
reference ``minirt verify`` and the tests run it on (against onnxruntime).

Taken: ``ai.onnx.ml`` TreeEnsembleClassifier / TreeEnsembleRegressor (opsets 1..3, any attribute form),
TreeEnsemble (opset 5), the builder's ``com.minirt::FlatTreeEnsemble`` (what the two become at opt
level >= 1: builder/passes/flatten_tree_ensembles.py), LinearClassifier and LinearRegressor.

The results must be onnxruntime's (D112), so a node is lowered only where Core ML's documented
semantics give the same outputs; otherwise it stays on the CPU with the reason (``refusal``):

* features: float32 or double ``X`` of [N, F] or [F] with F known (N may be symbolic: Core ML's
  classical models take one feature vector per prediction and the provider runs the rows); Core ML
  reads them as doubles, and float32 thresholds are exact in double, so every comparison is the one
  onnxruntime makes;
* trees: SUM / AVERAGE (MIN / MAX have no Core ML form), no BRANCH_MEMBER, every node the child of at
  most one parent (Core ML's validator), leaf weights and base values as doubles (AVERAGE divides the
  weights by the number of trees);
* classifiers, three or more classes: NONE -> NoTransform, SOFTMAX -> Classification_SoftMax; base
  values one per class or none; and every class must get a vote on every input (some tree gives it
  a weight in all its leaves) unless base values are given, since onnxruntime leaves a class without
  a vote out of the label's argmax and Core ML does not;
* classifiers, two classes: only onnxruntime's "binary case" with every weight for class 0, which is
  Core ML's one-dimension, two-label classifier (P(second label) = the score): all-positive weights
  (probabilities) -> NoTransform and label by score > 0.5; mixed-sign weights (margins) with LOGISTIC
  -> Regression_Logistic and label by margin > 0; at most one base value;
* regressors: one target (onnxruntime applies no LOGISTIC / SOFTMAX to a single score: NoTransform),
  or several targets without a post transform (a multi-array output);
* LinearClassifier: SOFTMAX -> GLMClassifier Logit (two classes: OneVsRest with the one row w1 - w0;
  more: ReferenceClass with rows w_k - w_0, the multinomial logit); LOGISTIC with two opposite rows
  (scikit-learn's binary LogisticRegression) -> OneVsRest with the second row.  Raw scores (NONE),
  un-normalised per-class LOGISTIC and one-row models have no GLM form;
* LinearRegressor: one target (GLMRegressor's output is a Double), NONE / LOGISTIC (ignored for one
  target, as onnxruntime does).

PROBIT is refused everywhere: onnxruntime's is an approximate inverse normal CDF of the score, Core
ML's Probit link the normal CDF.  SOFTMAX_ZERO is refused: Core ML's
Classification_SoftMaxWithZeroClassReference is not documented as the same function.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from minirt.builder import ir_helpers as irh
from minirt.kernels import _ml_scores as sc
from minirt.kernels import trees
from minirt.targets.providers import LoweringError

ML = "ai.onnx.ml"
MINIRT = irh.MINIRT_DOMAIN
TREE_OPS = {(ML, "TreeEnsembleClassifier"), (ML, "TreeEnsembleRegressor"), (ML, "TreeEnsemble"),
            (MINIRT, "FlatTreeEnsemble")}
LINEAR_OPS = {(ML, "LinearClassifier"), (ML, "LinearRegressor")}
CLASSICAL_OPS = TREE_OPS | LINEAR_OPS

SPEC_VERSION = 1  # (tree ensembles and GLMs with multi-array features: Core ML 1, iOS 11 / macOS 10.13)
INPUT_NAME = "in_0"
LABEL, PROBABILITIES, VALUE = "label", "probabilities", "value"  # the model's output feature names
_DOUBLE = 65600  # ArrayFeatureType.DOUBLE
_TREE_TRANSFORMS = {"none": 0, "softmax": 1, "logistic": 2}  # TreeEnsemblePostEvaluationTransform
# layout comparison code -> Core ML TreeNodeBehavior (BranchOnValueLessThanEqual = 0 ... NotEqual = 5);
# BRANCH_MEMBER has none (refused before), a leaf is LeafNode = 6
_BEHAVIOUR = {trees.LEQ: 0, trees.LT: 1, trees.GTE: 2, trees.GT: 3, trees.EQ: 4, trees.NEQ: 5}
_CORE_ML_LEAF = 6


# ops that follow a classifier in converted models and stay on the CPU, with why (the build report's reason)
CPU_ONLY = {
    (ML, "ZipMap"): ("ai.onnx.ml::ZipMap makes a sequence of maps (one dict per sample), which no Core ML "
                     "partition output carries; it stays on the CPU after the classifier, which Core ML runs"),
}


def op_key(node) -> tuple[str, str]:
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    return domain, node.op_type


def is_classical(node) -> bool:
    return op_key(node) in CLASSICAL_OPS


@dataclasses.dataclass
class Lowered:
    """One node's Core ML model: the spec and how its outputs become the node's."""

    spec: object  # coremltools.proto.Model_pb2.Model
    outputs: dict  # node output index -> {"feature", "kind", "dtype", ...} (partition_outputs' entries)
    width: int  # features per sample
    cost: float  # rough work per sample (comparisons or multiply-adds), for the partitioner


# --------------------------------------------------------------------------- support and lowering


def refusal(node, ctx) -> str | None:
    """Why ``node`` cannot be a Core ML classical model (None: it can); memoised on the context."""
    cache = ctx.__dict__.setdefault("_coreml_classical", {})
    key = id(node)
    if key not in cache:
        try:
            cache[key] = lower_node(node, ctx)
        except LoweringError as exc:
            cache[key] = str(exc)
    got = cache[key]
    return got if isinstance(got, str) else None


def lowered(node, ctx) -> Lowered:
    why = refusal(node, ctx)
    if why is not None:
        raise LoweringError(why)
    return ctx.__dict__["_coreml_classical"][id(node)]


def cost(node, ctx) -> float:
    """Estimated FLOP-equivalents of the node (its batch times the per-sample work), 0 when refused."""
    if refusal(node, ctx) is not None:
        return 0.0
    shape = ctx.shape(node.inputs[0]) or ()
    n = shape[0] if len(shape) == 2 and shape[0] is not None else 1
    return float(n * lowered(node, ctx).cost)


def lower_partition(partition, ctx) -> tuple[bytes, dict]:
    """The blob and options of a partition holding one classical node (``CoreMLSpec.group_key`` keeps
    such a node alone)."""
    import coremltools as ct

    from minirt.providers.coreml import SPEC_FORMAT
    from minirt.tools import coreml_spec_eval

    if len(partition.nodes) != 1 or not is_classical(partition.nodes[0]):
        raise LoweringError("a Core ML classical model (tree ensemble / GLM) is lowered from one node alone")
    node = partition.nodes[0]
    low = lowered(node, ctx)
    if len(partition.inputs) != 1 or partition.inputs[0] is not node.inputs[0]:
        raise LoweringError(f"{node.op_type}: the partition's one input must be the node's X")
    blob = low.spec.SerializeToString()
    # Read back: the bytes parse to the same model and pass the validators' checks.
    coreml_spec_eval.read_spec(blob)
    # coremltools takes it as a model (it saves the spec; skip_model_load: no compiling on Linux).
    ct.models.MLModel(low.spec, skip_model_load=True)
    outputs = []
    for v in partition.outputs:
        index = list(node.outputs).index(v)
        outputs.append(dict(low.outputs[index]))
    info = ctx.provider_info("coreml")
    options = {
        "format": SPEC_FORMAT,
        "model_type": low.spec.WhichOneof("Type"),
        "compute_units": info.get("compute_units", "all"),
        "input_names": [INPUT_NAME],
        "input_width": low.width,
        "outputs": outputs,
        "output_names": [o["feature"] for o in outputs],
        "onnx_inputs": [v.name for v in partition.inputs],
        "onnx_outputs": [v.name for v in partition.outputs],
        "source_op": node.op_type,
        "coremltools": ct.__version__,
    }
    return blob, options


def lower_node(node, ctx) -> Lowered:
    """The Core ML model of ``node``, or LoweringError with the reason Core ML cannot give
    onnxruntime's results for it."""
    key = op_key(node)
    if key not in CLASSICAL_OPS:
        raise LoweringError(f"{node.op_type} is not a tree ensemble or linear model")
    width, x_dtype = _features(node, ctx, _coefficient_width(node) if key in LINEAR_OPS else None)
    if key in TREE_OPS:
        return _lower_trees(node, width, x_dtype)
    if node.op_type == "LinearClassifier":
        return _lower_linear_classifier(node, width)
    return _lower_linear_regressor(node, width)


# ai.onnx.ml ops whose output is float32 whatever their input (the ONNX ML operator schemas): their
# output's type is known even where the builder's shape inference has none for it
_FLOAT_PRODUCERS = {(ML, "Scaler"), (ML, "Normalizer"), (ML, "FeatureVectorizer")}


def _coefficient_width(node) -> int | None:
    """F as a linear model's coefficients fix it (rows x F values), or None."""
    coef = _attr(node, "coefficients")
    rows = len(_attr(node, "intercepts") or []) if node.op_type == "LinearClassifier" else int(_attr(node, "targets") or 1)
    if not coef or not rows or len(coef) % rows:
        return None
    return len(coef) // rows


def _features(node, ctx, width_hint: int | None = None) -> tuple[int, np.dtype]:
    """(F, X's dtype) after checking X: float32/double, [N, F] or [F], F known (``width_hint``: F as
    the node's parameters fix it, used where the builder does not know X's shape)."""
    op = node.op_type
    x = node.inputs[0] if node.inputs else None
    if x is None:
        raise LoweringError(f"{op}: no input X")
    if ctx.const(x) is not None:
        raise LoweringError(f"{op}: X is a constant (nothing to run at run time)")
    dt = ctx.dtype(x)
    producer = x.producer()
    if dt is None and producer is not None and op_key(producer) in _FLOAT_PRODUCERS:
        dt = np.dtype(np.float32)
    if dt is None:
        raise LoweringError(f"{op}: X's element type is not known here (the op making it has no type inference "
                            f"in the builder); Core ML's classical models are lowered for float or double features")
    if np.dtype(dt) not in (np.float32, np.float64):
        name = np.dtype(dt).name
        raise LoweringError(f"{op}: X is {name}; Core ML's classical models are lowered for float or double "
                            f"features (onnxruntime compares other types after a float32 conversion that Core "
                            f"ML's doubles would not repeat)")
    shape = ctx.shape(x)
    if shape is None and width_hint is not None:
        shape = (None, width_hint)  # (onnxruntime runs it only on [N, F] or [F] with this F)
    if shape is None or len(shape) not in (1, 2):
        raise LoweringError(f"{op}: X must be [N, F] or [F] with a known rank")
    width = shape[-1]
    if width is None:
        raise LoweringError(f"{op}: X's feature count is not known ({ctx.unknown_shape_hint()})")
    if width == 0:
        raise LoweringError(f"{op}: X has no features")
    return int(width), np.dtype(dt)


def _attr(node, name: str):
    """An attribute as numpy / Python values (tensors as arrays, strings decoded), or None."""
    a = node.attributes.get(name)
    if a is None:
        return None
    v = a.value
    if hasattr(v, "numpy"):
        return np.asarray(v.numpy())
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, (list, tuple)) or (hasattr(v, "__iter__") and not isinstance(v, str)):
        return [s.decode() if isinstance(s, bytes) else s for s in v]
    return v


def _post(node, value) -> int:
    return sc.post_transform_code(node.op_type, value if value is not None else "NONE")


# --------------------------------------------------------------------------- tree ensembles


def _layout(node, x_dtype) -> tuple[trees.TreeLayout, dict]:
    """(the flat layout, what finishes the scores: kind, post_transform, aggregate_function,
    base_values, class labels) of a tree node in any of its forms."""
    if node.op_type != "FlatTreeEnsemble":
        from minirt.builder.passes.flatten_tree_ensembles import layout_of

        try:
            return layout_of(node, x_dtype)
        except (ValueError, TypeError, KeyError) as exc:
            raise LoweringError(f"{node.op_type}: its trees do not build ({exc})") from None
    g = lambda name: _attr(node, name)  # noqa: E731
    members = ()
    if g("membership_values") is not None:
        mv = np.asarray(g("membership_values"), dtype=np.float64).reshape(-1)
        members = tuple(m[~np.isnan(m)] for m in np.split(mv, np.flatnonzero(np.isnan(mv))))
    weight_value = np.asarray(g("weight_value")).reshape(-1)
    # (left out by the builder when implied: leaf i has weight i; every weight is for target 0)
    weight_leaf = g("weight_leaf") if g("weight_leaf") is not None else np.arange(len(weight_value))
    weight_target = g("weight_target") if g("weight_target") is not None else np.zeros(len(weight_value), np.int32)
    try:
        layout = trees.layout_from_tensors(g("feature"), g("threshold"), g("true_next"), g("false_next"), g("mode"),
                                           g("roots"), weight_leaf, weight_target, weight_value,
                                           int(g("n_targets") or 1), members)
    except (ValueError, TypeError) as exc:
        raise LoweringError(f"FlatTreeEnsemble: its layout does not build ({exc})") from None
    extra = {"kind": g("kind") or "regressor", "post_transform": int(g("post_transform") or 0),
             "aggregate_function": int(g("aggregate_function") if g("aggregate_function") is not None else trees.SUM)}
    if g("base_values") is not None:
        extra["base_values"] = np.asarray(g("base_values")).reshape(-1)
    if g("classlabels_strings"):
        extra["classlabels_strings"] = list(g("classlabels_strings"))
    elif g("classlabels_int64s") is not None:
        extra["classlabels_int64s"] = [int(v) for v in g("classlabels_int64s")]
    return layout, extra


def _tree_structure(layout: trees.TreeLayout, op: str) -> list[np.ndarray]:
    """Per tree (layout order), the indices of its nodes; refuses what Core ML's validator refuses: a
    node with two parents (shared subtrees, a branch whose two children are one node)."""
    kind = layout.mode & 15
    branch = kind != trees.LEAF
    parents = np.zeros(len(layout.feature), dtype=np.int64)
    np.add.at(parents, layout.true_next[branch], 1)
    np.add.at(parents, layout.false_next[branch], 1)
    if (parents[layout.roots] > 0).any() or (parents > 1).any():
        raise LoweringError(f"{op}: a tree node is reached from two parents (a shared subtree); Core ML's trees "
                            f"give every node one parent")
    out = []
    for root in layout.roots.tolist():
        members, frontier = [root], [root]
        while frontier:
            nxt = []
            for i in frontier:
                if branch[i]:
                    nxt.extend((int(layout.true_next[i]), int(layout.false_next[i])))
            members.extend(nxt)
            frontier = nxt
        out.append(np.asarray(members, dtype=np.int64))
    return out


def _always_voted(layout: trees.TreeLayout, tree_nodes: list, has: np.ndarray, k: int) -> bool:
    """Whether every input gets a weight for target ``k``: some tree has one in each of its leaves."""
    leaf = (layout.mode & 15) == trees.LEAF
    for nodes in tree_nodes:
        rows = layout.feature[nodes[leaf[nodes]]]
        if rows.size and has[rows, k].all():
            return True
    return False


def _lower_trees(node, width: int, x_dtype) -> Lowered:
    from coremltools.proto import Model_pb2

    op = node.op_type
    layout, extra = _layout(node, x_dtype)
    kind = extra["kind"]
    if layout.members:
        raise LoweringError(f"{op}: BRANCH_MEMBER (set membership) nodes have no Core ML tree node behaviour")
    aggregate = int(extra.get("aggregate_function", trees.SUM))
    if kind != "classifier" and aggregate not in (trees.SUM, trees.AVERAGE):
        name = {trees.MIN: "MIN", trees.MAX: "MAX"}.get(aggregate, str(aggregate))
        raise LoweringError(f"{op}: aggregate_function {name}; Core ML's tree ensembles add the leaf values (SUM, "
                            f"or AVERAGE as SUM of scaled weights) only")
    branch = (layout.mode & 15) != trees.LEAF
    if branch.any() and int(layout.feature[branch].max()) >= width:
        raise LoweringError(f"{op}: a tree tests feature {int(layout.feature[branch].max())}, but X has {width}")
    tree_nodes = _tree_structure(layout, op)
    values, has = layout.dense_leaf_values()
    values = values.astype(np.float64)
    if kind != "classifier" and aggregate == trees.AVERAGE and layout.n_trees:
        values = values / float(layout.n_trees)  # (onnxruntime divides the sum; the same to double rounding)
    post = int(extra.get("post_transform", 0))
    base = extra.get("base_values")
    base = None if base is None else np.asarray(base, dtype=np.float64).reshape(-1)
    k = layout.n_targets
    spec = Model_pb2.Model()
    spec.specificationVersion = SPEC_VERSION
    outputs: dict = {}
    if kind == "classifier":
        labels = extra.get("classlabels_strings") or extra.get("classlabels_int64s") or []
        if len(labels) != k:
            raise LoweringError(f"{op}: {len(labels)} class labels for {k} classes")
        model = spec.treeEnsembleClassifier
        dims_of_target, base_vec, transform = _classifier_plan(op, layout, tree_nodes, has, k, post, base)
        _class_labels(model, labels)
        _classifier_interface(spec, width, labels)
        outputs = _classifier_outputs(labels)
    else:
        if base is not None and kind == "regressor" and len(base) == k:
            base_vec = base  # (onnxruntime adds base values only when there is one per target)
        else:
            base_vec = np.zeros(k)
        if post == sc.PROBIT:
            raise LoweringError(f"{op}: post_transform PROBIT (onnxruntime's approximate inverse normal CDF) has "
                                f"no Core ML transform")
        if k == 1:
            transform = "none"  # (a single score is not transformed by LOGISTIC / SOFTMAX in onnxruntime)
        elif post == sc.NONE:
            transform = "none"
        else:
            raise LoweringError(f"{op}: a post transform on {k} targets; Core ML documents its regressor transforms "
                                f"for one prediction value only")
        dims_of_target = {t: t for t in range(k)}
        model = spec.treeEnsembleRegressor
        _regressor_interface(spec, width, k)
        out_dtype = x_dtype.name if kind == "ensemble5" else "float32"
        outputs = {0: {"feature": VALUE, "kind": "values", "width": k, "dtype": out_dtype}}
    model.postEvaluationTransform = _TREE_TRANSFORMS[transform]
    params = model.treeEnsemble
    dims = len(base_vec)
    params.numPredictionDimensions = dims
    params.basePredictionValue.extend(float(b) for b in base_vec)
    _tree_nodes(params, layout, tree_nodes, values, has, dims_of_target)
    return Lowered(spec, outputs, width, float(layout.n_trees * max(layout.depth, 1)))


def _classifier_plan(op, layout, tree_nodes, has, k, post, base):
    """(class index -> prediction dimension, base prediction values, transform) giving onnxruntime's
    TreeEnsembleClassifier results (minirt/kernels/trees.py: finish_classifier), or LoweringError."""
    if post == sc.PROBIT:
        raise LoweringError(f"{op}: post_transform PROBIT (onnxruntime's approximate inverse normal CDF) has no "
                            f"Core ML transform")
    if post == sc.SOFTMAX_ZERO:
        raise LoweringError(f"{op}: post_transform SOFTMAX_ZERO (zero scores left out of the softmax) is not Core "
                            f"ML's Classification_SoftMaxWithZeroClassReference")
    if k >= 3:
        if post not in (sc.NONE, sc.SOFTMAX):
            raise LoweringError(f"{op}: post_transform LOGISTIC on {k} class scores; Core ML documents "
                                f"Regression_Logistic for one score")
        if base is not None and len(base) not in (0, k):
            raise LoweringError(f"{op}: {len(base)} base_values for {k} classes")
        if base is None or len(base) == 0:
            silent = [c for c in range(k) if not _always_voted(layout, tree_nodes, has, c)]
            if silent:
                raise LoweringError(f"{op}: class {silent[0]} can go without a vote; onnxruntime then leaves it out "
                                    f"of the label's argmax, Core ML does not")
            base = np.zeros(k)
        return {c: c for c in range(k)}, base, ("softmax" if post == sc.SOFTMAX else "none")
    if k != 2:
        raise LoweringError(f"{op}: a classifier of {k} class(es)")
    # Two classes: onnxruntime's "binary case" (every weight for one class) with class 0, whose score s
    # becomes the two columns; Core ML's one-dimension classifier gives [1 - v, v] of the transformed v.
    classes = np.unique(layout.weight_target)
    if len(classes) != 1 or int(classes[0]) != 0:
        raise LoweringError(f"{op}: a two-class ensemble with weights for class 1; onnxruntime labels it by the sign "
                            f"of the class-1 score and writes its columns apart, which Core ML's classifier cannot "
                            f"express")
    if base is not None and len(base) > 1:
        raise LoweringError(f"{op}: two base_values in a two-class ensemble (onnxruntime keeps base_values[1] and "
                            f"mirrors the scores)")
    b0 = float(base[0]) if base is not None and len(base) == 1 else 0.0
    if b0 != 0.0 and not _always_voted(layout, tree_nodes, has, 0):
        raise LoweringError(f"{op}: an input can reach no weighted leaf; onnxruntime then labels by 0, not by the "
                            f"base value Core ML would use")
    if bool((layout.weight_value >= 0).all()):
        # probabilities: [1 - s, s] untransformed whatever post_transform says (PROBIT aside), label s > 0.5
        return {0: 0}, np.array([b0]), "none"
    if post != sc.LOGISTIC:
        raise LoweringError(f"{op}: a two-class margin without LOGISTIC; onnxruntime returns [-s, s], which a Core ML "
                            f"classifier's probabilities cannot be")
    return {0: 0}, np.array([b0]), "logistic"  # [sigmoid(-s), sigmoid(s)], label s > 0


def _tree_nodes(params, layout, tree_nodes, values, has, dims_of_target) -> None:
    """The TreeNode messages: tree id = the tree's position, node id = the node's layout index (unique),
    leaves with one evaluation value per target they weigh (at least one: Core ML requires it)."""
    kinds = (layout.mode & 15).astype(np.int64)
    missing = (layout.mode & trees.MISSING_TRUE) != 0
    thresholds = layout.threshold.astype(np.float64)  # (float32 -> double is exact)
    for t, nodes in enumerate(tree_nodes):
        for i in nodes.tolist():
            nd = params.nodes.add()
            nd.treeId = t
            nd.nodeId = i
            if kinds[i] == trees.LEAF:
                nd.nodeBehavior = _CORE_ML_LEAF
                row = int(layout.feature[i])
                targets = np.flatnonzero(has[row])
                if targets.size == 0:
                    ev = nd.evaluationInfo.add()  # (adds 0: the sum is unchanged)
                    ev.evaluationIndex = 0
                    ev.evaluationValue = 0.0
                for target in targets.tolist():
                    ev = nd.evaluationInfo.add()
                    ev.evaluationIndex = dims_of_target[target]
                    ev.evaluationValue = float(values[row, target])
                continue
            nd.nodeBehavior = _BEHAVIOUR[int(kinds[i])]
            nd.branchFeatureIndex = int(layout.feature[i])
            nd.branchFeatureValue = float(thresholds[i])
            nd.trueChildNodeId = int(layout.true_next[i])
            nd.falseChildNodeId = int(layout.false_next[i])
            nd.missingValueTracksTrueChild = bool(missing[i])


# --------------------------------------------------------------------------- linear models


def _lower_linear_classifier(node, width: int) -> Lowered:
    from coremltools.proto import Model_pb2

    op = node.op_type
    b = np.asarray(_attr(node, "intercepts") or [], dtype=np.float32).reshape(-1)
    k = len(b)
    coef = np.asarray(_attr(node, "coefficients") or [], dtype=np.float32).reshape(-1)
    if k == 0 or coef.size != k * width:
        raise LoweringError(f"{op}: {coef.size} coefficients and {k} intercepts do not make rows of {width} features")
    w = coef.reshape(k, width).astype(np.float64)
    b = b.astype(np.float64)
    strings = _attr(node, "classlabels_strings")
    labels = list(strings) if strings else [int(v) for v in (_attr(node, "classlabels_ints") or [])]
    post = _post(node, _attr(node, "post_transform"))
    if k == 1:
        raise LoweringError(f"{op}: one row of coefficients; onnxruntime returns [1 - s, s] of the raw score, and Core "
                            f"ML's GLMClassifier always applies its link function")
    if len(labels) != k:
        raise LoweringError(f"{op}: {len(labels)} class labels for {k} rows of coefficients")
    if post == sc.NONE:
        raise LoweringError(f"{op}: raw scores (post_transform NONE); Core ML's GLMClassifier always applies its link "
                            f"function (Logit / Probit)")
    if post == sc.PROBIT:
        raise LoweringError(f"{op}: post_transform PROBIT (onnxruntime's approximate inverse normal CDF) is not Core "
                            f"ML's Probit link (the normal CDF)")
    if post == sc.SOFTMAX_ZERO:
        raise LoweringError(f"{op}: post_transform SOFTMAX_ZERO has no GLMClassifier form")
    spec = Model_pb2.Model()
    spec.specificationVersion = SPEC_VERSION
    model = spec.glmClassifier
    model.postEvaluationTransform = 0  # Logit
    if post == sc.LOGISTIC:
        # per-class sigmoids: a Core ML form only for two opposite rows, where [sigmoid(-z), sigmoid(z)]
        # is OneVsRest's [1 - sigmoid(z), sigmoid(z)] and the argmax is z > 0
        if k != 2 or not (np.array_equal(w[0], -w[1]) and b[0] == -b[1]):
            raise LoweringError(f"{op}: per-class LOGISTIC scores; Core ML's OneVsRest divides them by their sum (it "
                                f"matches two opposite rows only)")
        rows, offsets, encoding = w[1:], b[1:], 1
    elif k == 2:
        # softmax of two scores = [1 - sigmoid(z1 - z0), sigmoid(z1 - z0)] (OneVsRest, two classes)
        rows, offsets, encoding = w[1:] - w[:1], b[1:] - b[:1], 1
    else:
        # softmax(z) = softmax(z - z0): the multinomial logit with class 0 as the reference
        rows, offsets, encoding = w[1:] - w[:1], b[1:] - b[:1], 0
    model.classEncoding = encoding  # 0 ReferenceClass, 1 OneVsRest
    for r in rows:
        model.weights.add().value.extend(float(v) for v in r)
    model.offset.extend(float(v) for v in offsets)
    _class_labels(model, labels)
    _classifier_interface(spec, width, labels)
    return Lowered(spec, _classifier_outputs(labels), width, float(2 * k * width))


def _lower_linear_regressor(node, width: int) -> Lowered:
    from coremltools.proto import Model_pb2

    op = node.op_type
    t = int(_attr(node, "targets") or 1)
    if t != 1:
        raise LoweringError(f"{op}: {t} targets; Core ML's GLMRegressor gives one Double")
    coef = np.asarray(_attr(node, "coefficients") or [], dtype=np.float32).reshape(-1)
    if coef.size != width:
        raise LoweringError(f"{op}: {coef.size} coefficients for {width} features")
    b = np.asarray(_attr(node, "intercepts") or [0.0], dtype=np.float32).reshape(-1)
    if b.size != 1:
        raise LoweringError(f"{op}: {b.size} intercepts for one target")
    post = _post(node, _attr(node, "post_transform"))
    if post == sc.PROBIT:
        raise LoweringError(f"{op}: post_transform PROBIT (onnxruntime's approximate inverse normal CDF) is not Core "
                            f"ML's Probit link (the normal CDF)")
    spec = Model_pb2.Model()
    spec.specificationVersion = SPEC_VERSION
    model = spec.glmRegressor
    model.weights.add().value.extend(float(v) for v in coef)
    model.offset.append(float(b[0]))
    model.postEvaluationTransform = 0  # NoTransform (onnxruntime transforms no single score but by PROBIT)
    _regressor_interface(spec, width, 1)
    return Lowered(spec, {0: {"feature": VALUE, "kind": "values", "width": 1, "dtype": "float32"}}, width,
                   float(2 * width))


# --------------------------------------------------------------------------- interface


def _class_labels(model, labels: list) -> None:
    if labels and isinstance(labels[0], str):
        model.stringClassLabels.vector.extend(labels)
    else:
        model.int64ClassLabels.vector.extend(int(v) for v in labels)


def _feature_input(spec, width: int) -> None:
    inp = spec.description.input.add()
    inp.name = INPUT_NAME
    inp.type.multiArrayType.shape.append(width)
    inp.type.multiArrayType.dataType = _DOUBLE


def _classifier_interface(spec, width: int, labels: list) -> None:
    _feature_input(spec, width)
    strings = bool(labels) and isinstance(labels[0], str)
    label = spec.description.output.add()
    label.name = LABEL
    (label.type.stringType if strings else label.type.int64Type).SetInParent()
    prob = spec.description.output.add()
    prob.name = PROBABILITIES
    (prob.type.dictionaryType.stringKeyType if strings else prob.type.dictionaryType.int64KeyType).SetInParent()
    spec.description.predictedFeatureName = LABEL
    spec.description.predictedProbabilitiesName = PROBABILITIES


def _classifier_outputs(labels: list) -> dict:
    strings = bool(labels) and isinstance(labels[0], str)
    return {0: {"feature": LABEL, "kind": "label", "dtype": "str" if strings else "int64"},
            1: {"feature": PROBABILITIES, "kind": "probabilities", "labels": list(labels), "dtype": "float32"}}


def _regressor_interface(spec, width: int, k: int) -> None:
    _feature_input(spec, width)
    out = spec.description.output.add()
    out.name = VALUE
    if k == 1:
        out.type.doubleType.SetInParent()
    else:
        out.type.multiArrayType.shape.append(k)
        out.type.multiArrayType.dataType = _DOUBLE
    spec.description.predictedFeatureName = VALUE
