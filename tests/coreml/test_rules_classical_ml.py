"""Classical ML on Core ML (targets/coreml/classical.py): tree ensembles and linear models lowered to Core
ML's own model types (TreeEnsembleClassifier / Regressor, GLMClassifier / Regressor), not ML programs.

Per real converted model (scikit-learn through skl2onnx, LightGBM / XGBoost through onnxmltools: the
cases of tests/ml/test_converted_models.py): the node is lowered in both forms that reach the
partitioner (the source op at opt level 0, the builder's FlatTreeEnsemble at the default level), the
spec is read back (protobuf, Core ML's structural checks, coremltools' MLModel with skip_model_load),
and minirt's spec evaluator (minirt/tools/coreml_spec_eval.py, the off-device reference) runs it on the
case's samples and on one sample against onnxruntime on the source model: labels identical, numbers
within 1e-5 relative (tests/ml/conftest.py's rule: 1e-5 of the output's scale for values near 0).
Then the whole path: ``minirt build --target macos`` (the partition, the report's CPU reasons), ``minirt
verify`` off-device, a thin artifact; and what Core ML cannot express, refused with its reason.
"""
from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

pytest.importorskip("coremltools")
ort = pytest.importorskip("onnxruntime")
logging.getLogger("coremltools").setLevel(logging.ERROR)

from minirt.builder.build import _normalise  # noqa: E402
from minirt.builder.load import load_model  # noqa: E402
from minirt.builder.passes import optimize  # noqa: E402
from minirt.targets.coreml import CoreMLSpec, classical  # noqa: E402
from minirt.targets.profiles import get_target  # noqa: E402
from minirt.targets.providers import PartitionIR, SupportContext  # noqa: E402
from minirt.tools import coreml_spec_eval as cse  # noqa: E402
from tests.ml.conftest import compare_outputs  # noqa: E402
from tests.ml.test_converted_models import CASES  # noqa: E402

# (case, Core ML model type): every tree ensemble and linear model of the converted set that lowers
LOWERED = {
    "DecisionTreeClassifier": "treeEnsembleClassifier",
    "DecisionTreeRegressor": "treeEnsembleRegressor",
    "RandomForestClassifier-binary-nozipmap": "treeEnsembleClassifier",
    "RandomForestClassifier-multi": "treeEnsembleClassifier",
    "RandomForestRegressor": "treeEnsembleRegressor",
    "ExtraTreesClassifier": "treeEnsembleClassifier",
    "ExtraTreesRegressor": "treeEnsembleRegressor",
    "GradientBoostingClassifier-binary": "treeEnsembleClassifier",
    "GradientBoostingClassifier-multi-nozipmap": "treeEnsembleClassifier",
    "GradientBoostingRegressor": "treeEnsembleRegressor",
    "HistGradientBoostingClassifier": "treeEnsembleClassifier",
    "HistGradientBoostingRegressor": "treeEnsembleRegressor",
    "LGBMClassifier-binary": "treeEnsembleClassifier",
    "LGBMClassifier-multi": "treeEnsembleClassifier",
    "LGBMRegressor": "treeEnsembleRegressor",
    "XGBClassifier-binary": "treeEnsembleClassifier",
    "XGBClassifier-multi": "treeEnsembleClassifier",
    "XGBRegressor": "treeEnsembleRegressor",
    "LogisticRegression-binary": "glmClassifier",
    "LogisticRegression-multi-nozipmap": "glmClassifier",
    "LinearRegression": "glmRegressor",
    "Ridge": "glmRegressor",
    "SGDRegressor": "glmRegressor",
    "LinearSVR": "glmRegressor",
}


def _classical_nodes(model_bytes, opt_level):
    model_ir, _ = load_model(model_bytes)
    _normalise(model_ir)
    if opt_level:
        optimize(model_ir, opt_level)
    ctx = SupportContext(model_ir, get_target("macos"), {})
    return [n for n in model_ir.graph if classical.is_classical(n)], ctx


def _onnxruntime_values(model_bytes, names, feeds):
    """The source model's values ``names`` under onnxruntime (one thread, no graph optimisation)."""
    proto = onnx.load_from_string(model_bytes)
    known = {o.name for o in proto.graph.output}
    proto.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names if n not in known)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(names, feeds)


def lower_one(node, ctx):
    """(PartitionIR, blob, options) of ``node`` alone, through CoreMLSpec as the partitioner calls it."""
    spec = CoreMLSpec()
    ok, why = spec.supports(node, ctx)
    assert ok, why
    part = PartitionIR.from_nodes("coreml", [node])
    blob, options = spec.lower(part, ctx)
    return part, blob, options


def check_load_back(blob, options, part, model_type):
    import coremltools as ct

    spec = cse.read_spec(blob)  # (parses, and passes the validators' structural checks)
    assert spec.WhichOneof("Type") == model_type
    assert spec.SerializeToString() == bytes(blob)  # deterministic: the bytes are the spec
    ct.models.MLModel(spec, skip_model_load=True)
    desc = spec.description
    assert [i.name for i in desc.input] == options["input_names"] == ["in_0"]
    assert list(desc.input[0].type.multiArrayType.shape) == [options["input_width"]]
    assert set(options["output_names"]) <= {o.name for o in desc.output}
    assert options["format"] == cse.SPEC_FORMAT and options["onnx_inputs"] == [v.name for v in part.inputs]
    return spec


@pytest.mark.parametrize("opt_level", [2, 0], ids=["FlatTreeEnsemble-or-linear", "source-op"])
@pytest.mark.parametrize("name", sorted(LOWERED))
def test_converted_model_lowers_and_matches_onnxruntime(name, opt_level):
    model, feeds = CASES[name]()
    nodes, ctx = _classical_nodes(model, opt_level)
    assert len(nodes) == 1
    node = nodes[0]
    if opt_level and LOWERED[name].startswith("tree"):
        assert node.op_type == "FlatTreeEnsemble"  # (what reaches the partitioner at the default level)
    part, blob, options = lower_one(node, ctx)
    check_load_back(blob, options, part, LOWERED[name])
    # the node's outputs are the source node's (same name) outputs, by position
    source = {n.name: n for n in onnx.load_from_string(model).graph.node}[node.name]
    wanted = [source.output[list(node.outputs).index(v)] for v in part.outputs]
    run = cse.compile_reference(blob, part, None, options)
    x = feeds[part.inputs[0].name]
    expected = _onnxruntime_values(model, wanted, feeds)
    compare_outputs(expected, list(run(x)))
    one = {k: v[:1] for k, v in feeds.items()}
    compare_outputs(_onnxruntime_values(model, wanted, one), list(run(x[:1])), scale_of=expected)


def test_pipeline_classifier_after_a_scaler_lowers():
    """A LogisticRegression behind a StandardScaler: X's type and shape are not inferred after the Scaler,
    but the Scaler's output is float and the coefficients fix F."""
    model, _ = CASES["Pipeline-StandardScaler-LogisticRegression"]()
    nodes, ctx = _classical_nodes(model, 2)
    part, blob, options = lower_one(nodes[0], ctx)
    assert check_load_back(blob, options, part, "glmClassifier").glmClassifier.classEncoding == 0  # ReferenceClass


# --------------------------------------------------------------------------- the whole path


def test_build_verify_and_report(tmp_path):
    """``minirt build --target macos``: the classifier is one Core ML partition, ZipMap stays on the CPU
    with its reason; ``minirt verify`` runs the partition on the spec evaluator off-device (also thin)."""
    import minirt
    from minirt.builder import build
    from minirt.tools.verify import failed, verify
    from tests.ml.conftest import run_onnxruntime

    model, feeds = CASES["GradientBoostingClassifier-binary"]()
    for thin in (False, True):
        path = tmp_path / f"gbc{'-thin' if thin else ''}.mrt"
        build(model, str(path), target="macos", cpu_fallback=not thin)
        rep = verify(str(path))
        assert not failed(rep), rep
        (row,) = rep["partitions"]
        assert row["provider"] == "coreml" and row["results"][0]["status"] == "ok", row
        assert "spec evaluator" in row["results"][0]["runs_on"]
    from minirt.format import reader

    art = reader.load(str(tmp_path / "gbc.mrt"))
    (part,) = art.partitions
    assert part.provider == "coreml" and part.options["format"] == cse.SPEC_FORMAT
    meta = art.metadata["build.partitions"]
    meta = meta if isinstance(meta, dict) else __import__("json").loads(meta)
    reasons = {c["op"]: c["reason"] for c in meta["cpu_nodes"]}
    assert list(reasons) == ["ZipMap"] and "sequence of maps" in reasons["ZipMap"]
    # off the Mac the session runs the partition's CPU version: onnxruntime's results
    compare_outputs(run_onnxruntime(model, feeds), minirt.InferenceSession(str(tmp_path / "gbc.mrt")).run(None, feeds))


def test_refused_model_stays_on_cpu_with_reason(tmp_path):
    from minirt.builder import build
    from minirt.format import reader

    model, _ = CASES["LinearSVC"]()
    build(model, str(tmp_path / "svc.mrt"), target="macos")
    art = reader.load(str(tmp_path / "svc.mrt"))
    assert not art.partitions
    meta = art.metadata["build.partitions"]
    meta = meta if isinstance(meta, dict) else __import__("json").loads(meta)
    (cpu,) = [c for c in meta["cpu_nodes"] if c["op"] == "LinearClassifier"]
    assert "raw scores" in cpu["reason"] and "link function" in cpu["reason"]


def test_verify_catches_a_wrong_spec(tmp_path):
    """A partition whose spec disagrees with its golden outputs is a MISMATCH (one threshold moved)."""
    from coremltools.proto import Model_pb2

    from minirt.builder import build
    from minirt.format import reader
    from minirt.tools import verify as verify_mod

    model, _ = CASES["DecisionTreeRegressor"]()
    path = tmp_path / "tree.mrt"
    build(model, str(path), target="macos")
    art = reader.load(str(path))
    (part,) = art.partitions
    spec = Model_pb2.Model()
    spec.ParseFromString(bytes(art.provider_blob(part.blob)))
    for nd in spec.treeEnsembleRegressor.treeEnsemble.nodes:
        if nd.nodeBehavior != 6:
            nd.branchFeatureValue = 1e9  # (every sample goes left at the root)
            break
    run = cse.compile_reference(spec.SerializeToString(), part, art, dict(part.options))
    golden_in = [art.tensor(t) for t in part.golden_inputs]
    golden_out = [art.tensor(t) for t in part.golden_outputs]
    good = verify_mod._compare("ref", cse.compile_reference(art.provider_blob(part.blob), part, art,
                                                            dict(part.options))(*golden_in), golden_out, 1e-5)
    assert good["status"] == "ok", good
    # the golden input is one sample: compare on enough samples that one lands right of the root
    x = np.random.default_rng(0).normal(size=(64, golden_in[0].shape[-1])).astype(np.float32)
    ref = cse.compile_reference(art.provider_blob(part.blob), part, art, dict(part.options))(x)
    assert not np.allclose(run(x)[0], ref[0])


# --------------------------------------------------------------------------- refusals


ML = "ai.onnx.ml"


def _ml_model(node, x_shape=(None, 3), x_type=TensorProto.FLOAT, outputs=(("Y", TensorProto.FLOAT),)):
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", x_type, list(x_shape))],
                              [helper.make_tensor_value_info(n, t, [None] * (1 if n == "label" else 2))
                               for n, t in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 3)])


def _tree_regressor(**over):
    attrs = dict(nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
                 nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.5, 0.0, 0.0],
                 nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0], target_treeids=[0, 0],
                 target_nodeids=[1, 2], target_ids=[0, 0], target_weights=[1.0, 2.0], n_targets=1)
    attrs.update(over)
    return helper.make_node("TreeEnsembleRegressor", ["X"], ["Y"], domain=ML, **attrs)


def _tree_classifier(class_ids, weights, labels=(0, 1), **over):
    attrs = dict(nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
                 nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.5, 0.0, 0.0],
                 nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
                 class_treeids=[0] * len(class_ids), class_nodeids=[1 + i % 2 for i in range(len(class_ids))],
                 class_ids=list(class_ids), class_weights=[float(w) for w in weights],
                 classlabels_int64s=list(labels))
    attrs.update(over)
    return helper.make_node("TreeEnsembleClassifier", ["X"], ["label", "probabilities"], domain=ML, **attrs)


_CLASSIFIER_OUT = (("label", TensorProto.INT64), ("probabilities", TensorProto.FLOAT))


def _linear_classifier(k, post, **over):
    attrs = dict(coefficients=list(np.linspace(-1, 1, 3 * k)), intercepts=list(np.linspace(0.1, 0.3, k)),
                 classlabels_ints=list(range(max(k, 2))), post_transform=post)
    attrs.update(over)
    return helper.make_node("LinearClassifier", ["X"], ["label", "probabilities"], domain=ML, **attrs)


REFUSED = {
    "MIN aggregate": (_ml_model(_tree_regressor(aggregate_function="MIN")), "aggregate_function MIN"),
    "MAX aggregate": (_ml_model(_tree_regressor(aggregate_function="MAX")), "aggregate_function MAX"),
    "regressor PROBIT": (_ml_model(_tree_regressor(post_transform="PROBIT")), "PROBIT"),
    "two targets with SOFTMAX": (_ml_model(_tree_regressor(n_targets=2, target_ids=[0, 1],
                                                           post_transform="SOFTMAX")), "post transform on 2 targets"),
    "BRANCH_MEMBER (TreeEnsemble v5)": (
        helper.make_model(helper.make_graph(
            [helper.make_node("TreeEnsemble", ["X"], ["Y"], domain=ML, nodes_featureids=[0], nodes_modes=
                              helper.make_tensor("m", TensorProto.UINT8, [1], [6]), nodes_splits=helper.make_tensor(
                                  "s", TensorProto.FLOAT, [1], [0.0]), membership_values=helper.make_tensor(
                                  "mv", TensorProto.FLOAT, [2], [1.0, 2.0]), nodes_truenodeids=[0],
                              nodes_trueleafs=[1], nodes_falsenodeids=[1], nodes_falseleafs=[1], leaf_targetids=[0, 0],
                              leaf_weights=helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0]), tree_roots=[0],
                              n_targets=1, aggregate_function=1, post_transform=0)],
            "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])]),
            opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(ML, 5)]), "BRANCH_MEMBER"),
    "two classes, weights for class 1": (_ml_model(_tree_classifier([1, 1], [0.2, 0.9]), outputs=_CLASSIFIER_OUT),
                                         "weights for class 1"),
    "two classes, margin without LOGISTIC": (_ml_model(_tree_classifier([0, 0], [-0.5, 0.7]), outputs=_CLASSIFIER_OUT),
                                             "[-s, s]"),
    "three classes, LOGISTIC": (_ml_model(_tree_classifier([0, 1, 2, 0, 1, 2], [1, 2, 3, 4, 5, 6], labels=(0, 1, 2),
                                                           post_transform="LOGISTIC",
                                                           class_nodeids=[1, 1, 1, 2, 2, 2]),
                                          outputs=_CLASSIFIER_OUT), "LOGISTIC on 3 class scores"),
    "three classes, a class without a vote": (_ml_model(_tree_classifier([0, 1, 0, 1], [1, 2, 3, 4], labels=(0, 1, 2),
                                                                         class_nodeids=[1, 1, 2, 2]),
                                                        outputs=_CLASSIFIER_OUT), "class 2 can go without a vote"),
    "SOFTMAX_ZERO": (_ml_model(_tree_classifier([0, 1, 2, 0, 1, 2], [1, 2, 3, 4, 5, 6], labels=(0, 1, 2),
                                                post_transform="SOFTMAX_ZERO", class_nodeids=[1, 1, 1, 2, 2, 2]),
                               outputs=_CLASSIFIER_OUT), "SOFTMAX_ZERO"),
    "linear, raw scores": (_ml_model(_linear_classifier(3, "NONE"), outputs=_CLASSIFIER_OUT), "raw scores"),
    "linear, one row": (_ml_model(_linear_classifier(1, "LOGISTIC"), outputs=_CLASSIFIER_OUT), "one row"),
    "linear, per-class LOGISTIC": (_ml_model(_linear_classifier(3, "LOGISTIC"), outputs=_CLASSIFIER_OUT),
                                   "divides them by their sum"),
    "linear, PROBIT": (_ml_model(_linear_classifier(2, "PROBIT"), outputs=_CLASSIFIER_OUT), "PROBIT"),
    "linear regressor, two targets": (_ml_model(helper.make_node(
        "LinearRegressor", ["X"], ["Y"], domain=ML, coefficients=[1.0] * 6, intercepts=[0.0, 1.0], targets=2)),
        "2 targets"),
    "int64 features": (_ml_model(_tree_regressor(), x_type=TensorProto.INT64), "X is int64"),
    "unknown feature count": (_ml_model(_tree_regressor(), x_shape=(None, "F")), "feature count is not known"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refusals_say_why(case):
    model, reason = REFUSED[case]
    model_ir, _ = load_model(model.SerializeToString())
    _normalise(model_ir)
    ctx = SupportContext(model_ir, get_target("macos"), {})
    (node,) = [n for n in model_ir.graph if classical.is_classical(n)]
    ok, why = CoreMLSpec().supports(node, ctx)
    assert not ok and reason in why, why


def test_accepted_synthetic_forms_match_onnxruntime():
    """Forms the converted set lacks: a regressor with AVERAGE and base values, two targets without a
    transform (a multi-array output), double thresholds, a two-class LinearClassifier with SOFTMAX,
    and missing values (NaN) taking the tracked branch."""
    x = np.array([[0.2, 1.0, -1.0], [0.7, 0.0, 2.0], [np.nan, 3.0, 0.0], [0.5, 0.5, 0.5]], dtype=np.float32)
    cases = [
        (_ml_model(_tree_regressor(aggregate_function="AVERAGE", base_values=[0.25])), ["Y"]),
        (_ml_model(_tree_regressor(n_targets=2, target_ids=[0, 1], target_weights=[1.5, -2.0])), ["Y"]),
        (_ml_model(_tree_regressor(nodes_values=None, nodes_values_as_tensor=helper.make_tensor(
            "v", TensorProto.DOUBLE, [3], [0.5000001, 0.0, 0.0]), target_weights=None,
            target_weights_as_tensor=helper.make_tensor("tw", TensorProto.DOUBLE, [2], [1.0, 2.0]),
            nodes_missing_value_tracks_true=[1, 0, 0]), x_type=TensorProto.DOUBLE),
         ["Y"]),  # (onnxruntime takes double thresholds with double features only)
        (_ml_model(_linear_classifier(2, "SOFTMAX"), outputs=_CLASSIFIER_OUT), ["label", "probabilities"]),
        (_ml_model(_tree_classifier([0, 0], [0.25, 0.75]), outputs=_CLASSIFIER_OUT), ["label", "probabilities"]),
    ]
    for model, outs in cases:
        data = model.SerializeToString()
        nodes, ctx = _classical_nodes(data, 0)
        part, blob, options = lower_one(nodes[0], ctx)
        cse.read_spec(blob)
        xs = x.astype(np.float64) if model.graph.input[0].type.tensor_type.elem_type == TensorProto.DOUBLE else x
        got = cse.compile_reference(blob, part, None, options)(xs)
        compare_outputs(_onnxruntime_values(data, outs, {"X": xs}), list(got))
