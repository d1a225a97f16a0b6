"""ai.onnx.ml operators that the converted models of test_converted_models.py do not all reach, one node
each (attribute forms, double thresholds, string labels, maps), built and run by minirt against
onnxruntime; and bad inputs, which must fail with an error naming what, where and what was expected."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import minirt
from minirt.builder import build_bytes
from tests.ml.conftest import compare_outputs, run_minirt, run_onnxruntime

ML = "ai.onnx.ml"
RNG = np.random.default_rng(7)


def _model(node, inputs, outputs) -> bytes:
    graph = h.make_graph([node], "g", inputs, outputs)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(ML, 3)],
                        ir_version=9).SerializeToString()


def _check(node, inputs, outputs, feeds):
    model = _model(node, inputs, outputs)
    compare_outputs(run_onnxruntime(model, feeds), run_minirt(model, feeds)[0])


def _tensor(name, dtype, shape=(None, None)):
    return h.make_tensor_value_info(name, dtype, list(shape))


def _map(name, key, value, seq=False):
    t = h.make_map_type_proto(key, h.make_tensor_type_proto(value, None))
    return h.make_value_info(name, h.make_sequence_type_proto(t) if seq else t)


X = RNG.normal(size=(20, 4)).astype(np.float32)


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
def test_normalizer(norm):
    _check(h.make_node("Normalizer", ["x"], ["y"], domain=ML, norm=norm), [_tensor("x", T.FLOAT, [None, 4])],
           [_tensor("y", T.FLOAT)], {"x": X})


def test_scaler_and_imputer():
    _check(h.make_node("Scaler", ["x"], ["y"], domain=ML, offset=[0.5, -1, 0, 2], scale=[2.0, 0.5, 1, 3]),
           [_tensor("x", T.FLOAT, [None, 4])], [_tensor("y", T.FLOAT)], {"x": X})
    holes = X.copy()
    holes[::3, 2] = np.nan
    _check(h.make_node("Imputer", ["x"], ["y"], domain=ML, imputed_value_floats=[1.0, 2.0, 3.0, 4.0],
                       replaced_value_float=float("nan")),
           [_tensor("x", T.FLOAT, [None, 4])], [_tensor("y", T.FLOAT)], {"x": holes})
    ints = RNG.integers(-2, 3, size=(6, 3)).astype(np.int64)
    _check(h.make_node("Imputer", ["x"], ["y"], domain=ML, imputed_value_int64s=[9], replaced_value_int64=0),
           [_tensor("x", T.INT64, [None, 3])], [_tensor("y", T.INT64)], {"x": ints})


def test_category_mapper_both_ways():
    cats = dict(cats_strings=["cat", "dog", "cow"], cats_int64s=[1, 2, 3])
    _check(h.make_node("CategoryMapper", ["x"], ["y"], domain=ML, default_int64=-7, **cats),
           [_tensor("x", T.STRING, [None])], [_tensor("y", T.INT64, [None])],
           {"x": np.array(["dog", "emu", "cat"], dtype=object)})
    _check(h.make_node("CategoryMapper", ["x"], ["y"], domain=ML, default_string="?", **cats),
           [_tensor("x", T.INT64, [None])], [_tensor("y", T.STRING, [None])], {"x": np.array([3, 9, 1], np.int64)})


def test_feature_vectorizer():
    _check(h.make_node("FeatureVectorizer", ["a", "b"], ["y"], domain=ML, inputdimensions=[2, 3]),
           [_tensor("a", T.FLOAT, [None, 2]), _tensor("b", T.FLOAT, [None, 3])], [_tensor("y", T.FLOAT)],
           {"a": X[:5, :2], "b": X[:5, 1:]})


def test_zipmap_string_labels_and_cast_map():
    _check(h.make_node("ZipMap", ["x"], ["z"], domain=ML, classlabels_strings=["a", "b", "c", "d"]),
           [_tensor("x", T.FLOAT, [None, 4])], [_map("z", T.STRING, T.FLOAT, seq=True)], {"x": X[:3]})
    for attrs in ({"cast_to": "TO_FLOAT"}, {"cast_to": "TO_INT64", "map_form": "SPARSE", "max_map": 6}):
        _check(h.make_node("CastMap", ["m"], ["y"], domain=ML, **attrs), [_map("m", T.INT64, T.FLOAT)],
               [_tensor("y", T.FLOAT if attrs["cast_to"] == "TO_FLOAT" else T.INT64)], {"m": {4: 2.5, 1: 7.0, 0: -1.0}})


def test_dict_vectorizer_int_keys():
    _check(h.make_node("DictVectorizer", ["m"], ["y"], domain=ML, int64_vocabulary=[5, 1, 3]),
           [_map("m", T.INT64, T.FLOAT)], [_tensor("y", T.FLOAT)], {"m": {1: 0.5, 3: -2.0, 8: 1.0}})


def test_linear_classifier_string_labels_and_regressor_targets():
    coef = RNG.normal(size=12).astype(np.float32).tolist()
    for post in ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO"):
        _check(h.make_node("LinearClassifier", ["x"], ["label", "scores"], domain=ML, coefficients=coef,
                           intercepts=[0.1, -0.2, 0.3], classlabels_strings=["lo", "mid", "hi"], post_transform=post),
               [_tensor("x", T.FLOAT, [None, 4])], [_tensor("label", T.STRING, [None]), _tensor("scores", T.FLOAT)],
               {"x": X})
    _check(h.make_node("LinearRegressor", ["x"], ["y"], domain=ML, coefficients=coef[:8], intercepts=[1.0, 2.0],
                       targets=2), [_tensor("x", T.FLOAT, [None, 4])], [_tensor("y", T.FLOAT)], {"x": X})


def test_svm_regressor_linear_one_class():
    _check(h.make_node("SVMRegressor", ["x"], ["y"], domain=ML, coefficients=[0.5, -1, 0.25, 2], rho=[0.1],
                       kernel_type="LINEAR", kernel_params=[0.0, 0.0, 0.0], one_class=1, n_supports=0),
           [_tensor("x", T.FLOAT, [None, 4])], [_tensor("y", T.FLOAT)], {"x": X})


def _forest(n_trees=6, depth=3, features=4, seed=0):
    """Random complete trees: (nodes_* lists, leaves as (tree, node))."""
    rng = np.random.default_rng(seed)
    cols = {k: [] for k in ("treeids", "nodeids", "featureids", "modes", "values", "truenodeids", "falsenodeids",
                            "missing")}
    leaves = []
    for t in range(n_trees):
        n_nodes = 2 ** (depth + 1) - 1
        for i in range(n_nodes):
            leaf = i >= 2 ** depth - 1
            cols["treeids"].append(t)
            cols["nodeids"].append(i)
            cols["featureids"].append(0 if leaf else int(rng.integers(features)))
            cols["modes"].append("LEAF" if leaf else str(rng.choice(["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE"])))
            cols["values"].append(0.0 if leaf else float(rng.normal()))
            cols["truenodeids"].append(0 if leaf else 2 * i + 1)
            cols["falsenodeids"].append(0 if leaf else 2 * i + 2)
            cols["missing"].append(int(rng.integers(2)) if not leaf else 0)
            if leaf:
                leaves.append((t, i))
    return cols, leaves


@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE", "MIN", "MAX"])
def test_tree_regressor_double_tensors_and_aggregates(aggregate):
    cols, leaves = _forest()
    w = RNG.normal(size=2 * len(leaves))
    node = h.make_node(
        "TreeEnsembleRegressor", ["x"], ["y"], domain=ML, n_targets=2, aggregate_function=aggregate,
        nodes_treeids=cols["treeids"], nodes_nodeids=cols["nodeids"], nodes_featureids=cols["featureids"],
        nodes_modes=cols["modes"], nodes_truenodeids=cols["truenodeids"], nodes_falsenodeids=cols["falsenodeids"],
        nodes_missing_value_tracks_true=cols["missing"],
        nodes_values_as_tensor=numpy_helper.from_array(np.array(cols["values"], np.float64), "v"),
        target_treeids=[t for t, _ in leaves for _ in (0, 1)], target_nodeids=[i for _, i in leaves for _ in (0, 1)],
        target_ids=[k for _ in leaves for k in (0, 1)],
        target_weights_as_tensor=numpy_helper.from_array(w, "w"),
        base_values_as_tensor=numpy_helper.from_array(np.array([0.5, -0.5]), "b"))
    x = X.astype(np.float64)
    x[::4, 1] = np.nan
    _check(node, [_tensor("x", T.DOUBLE, [None, 4])], [_tensor("y", T.FLOAT)], {"x": x})


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX"])
@pytest.mark.parametrize("classes", [2, 3])
def test_tree_classifier_base_values_and_string_labels(post, classes):
    cols, leaves = _forest(seed=classes)
    ids = [k for _ in leaves for k in range(classes)]
    node = h.make_node(
        "TreeEnsembleClassifier", ["x"], ["label", "scores"], domain=ML,
        nodes_treeids=cols["treeids"], nodes_nodeids=cols["nodeids"], nodes_featureids=cols["featureids"],
        nodes_modes=cols["modes"], nodes_values=cols["values"], nodes_truenodeids=cols["truenodeids"],
        nodes_falsenodeids=cols["falsenodeids"],
        class_treeids=[t for t, _ in leaves for _ in range(classes)],
        class_nodeids=[i for _, i in leaves for _ in range(classes)], class_ids=ids,
        class_weights=RNG.uniform(0, 1, size=len(ids)).astype(np.float32).tolist(),
        base_values=[0.1 * k for k in range(classes)], classlabels_strings=[f"c{k}" for k in range(classes)],
        post_transform=post)
    _check(node, [_tensor("x", T.FLOAT, [None, 4])], [_tensor("label", T.STRING, [None]), _tensor("scores", T.FLOAT)],
           {"x": X})


# --------------------------------------------------------------------------- bad input


def _session(node, inputs, outputs):
    return minirt.InferenceSession(build_bytes(_model(node, inputs, outputs)))


def test_map_input_errors_name_input_key_and_type():
    sess = _session(h.make_node("DictVectorizer", ["m"], ["y"], domain=ML, string_vocabulary=["a", "b"]),
                    [_map("m", T.STRING, T.FLOAT)], [_tensor("y", T.FLOAT)])
    assert sess.get_inputs()[0].type == "map(string,tensor(float))"
    with pytest.raises(minirt.InvalidArgument, match=r"input 'm': key 3 is int; map\(string,tensor\(float\)\) needs str keys"):
        sess.run(None, {"m": {3: 1.0}})
    with pytest.raises(minirt.InvalidArgument, match=r"input 'm': value 'x' of key 'a' is str; .* needs numbers"):
        sess.run(None, {"m": {"a": "x"}})
    with pytest.raises(minirt.InvalidArgument, match=r"input 'm': expected a dict \(map\(string,tensor\(float\)\)\), got ndarray"):
        sess.run(None, {"m": np.zeros(3, np.float32)})


def test_unknown_category_is_named():
    sess = _session(h.make_node("OneHotEncoder", ["x"], ["y"], domain=ML, cats_int64s=[1, 2, 3], zeros=0),
                    [_tensor("x", T.INT64, [None])], [_tensor("y", T.FLOAT, [None, 3])])
    with pytest.raises(minirt.Error, match=r"OneHotEncoder.*value 7 is not one of the 3 categories"):
        sess.run(None, {"x": np.array([1, 7], np.int64)})


def test_wrong_feature_count_is_named():
    cols, leaves = _forest(features=4)
    node = h.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain=ML, n_targets=1,
                       nodes_treeids=cols["treeids"], nodes_nodeids=cols["nodeids"],
                       nodes_featureids=[3] * len(cols["treeids"]), nodes_modes=cols["modes"],
                       nodes_values=cols["values"], nodes_truenodeids=cols["truenodeids"],
                       nodes_falsenodeids=cols["falsenodeids"], target_treeids=[t for t, _ in leaves],
                       target_nodeids=[i for _, i in leaves], target_ids=[0] * len(leaves),
                       target_weights=[1.0] * len(leaves))
    sess = _session(node, [_tensor("x", T.FLOAT, [None, None])], [_tensor("y", T.FLOAT)])
    with pytest.raises(minirt.Error, match=r"FlatTreeEnsemble.*test feature 3, but X has 2 features"):
        sess.run(None, {"x": np.zeros((2, 2), np.float32)})
