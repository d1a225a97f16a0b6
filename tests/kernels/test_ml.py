"""ai.onnx.ml kernels (LabelEncoder, Binarizer, ArrayFeatureExtractor, TreeEnsemble) against onnxruntime."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from minirt.kernels import lookup
from tests.kernels import reference as ref_mod
from tests.kernels.test_elementwise import assert_same

ML = "ai.onnx.ml"
RNG = np.random.default_rng(3)


def ml_check(op, inputs, attrs, opset, rtol=None, atol=None):
    model = ref_mod.single_node_model(op, inputs, attrs, 1, opset, domain=ML)
    model.opset_import.append(helper.make_opsetid("", 19))
    del model.graph.output[:]
    model.graph.output.extend([helper.make_empty_tensor_value_info("out0")])
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    (expected,) = sess.run(None, {f"in{i}": x for i, x in enumerate(inputs)})
    entry = lookup(ML, op, opset)
    assert entry is not None
    actual = entry.fn(*inputs, **attrs)
    if expected.dtype.kind in "OU":
        assert actual.dtype == object and actual.shape == expected.shape
        assert actual.tolist() == expected.astype(object).tolist()
    else:
        assert_same(actual, expected, rtol, atol)


def S(*v):
    return np.array(list(v), dtype=object)


def test_binarizer():
    x = RNG.uniform(-2, 2, (3, 4)).astype(np.float32)
    ml_check("Binarizer", [x], {"threshold": 0.5}, 1)


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 5)])
def test_array_feature_extractor(shape):
    x = RNG.uniform(-2, 2, shape).astype(np.float32)
    ml_check("ArrayFeatureExtractor", [x, np.array([4, 0, 2], np.int64)], {}, 1)


@pytest.mark.parametrize("opset", [2, 4])
def test_label_encoder_lists(opset):
    x = S("a", "zz", "c", "b", "a")
    ml_check("LabelEncoder", [x], {"keys_strings": ["a", "b", "c"], "values_int64s": [7, 8, 9],
                                   "default_int64": -5}, opset)
    ml_check("LabelEncoder", [np.array([1, 5, 3, 2], np.int64)],
             {"keys_int64s": [1, 2, 3], "values_strings": ["one", "two", "three"]}, opset)
    # a NaN key matches NaN inputs from opset 4 on
    ml_check("LabelEncoder", [np.array([1.5, np.nan, 2.0, 3.0], np.float32)],
             {"keys_floats": [1.5, 2.0, float("nan")], "values_floats": [10.0, 20.0, 30.0]}, opset)


def test_label_encoder_tensors():
    x = np.array([3, 1, 4, 1, 5], np.int64)
    attrs = {"keys_tensor": numpy_helper.from_array(np.array([1, 3, 5], np.int64), "k"),
             "values_tensor": numpy_helper.from_array(np.array([10.5, 30.5, 50.5], np.float64), "v"),
             "default_tensor": numpy_helper.from_array(np.array([-1.0], np.float64), "d")}
    model_attrs = attrs
    kernel_attrs = {k: numpy_helper.to_array(v) for k, v in attrs.items()}
    model = ref_mod.single_node_model("LabelEncoder", [x], model_attrs, 1, 4, domain=ML)
    model.opset_import.append(helper.make_opsetid("", 19))
    del model.graph.output[:]
    model.graph.output.extend([helper.make_empty_tensor_value_info("out0")])
    (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"in0": x})
    actual = lookup(ML, "LabelEncoder", 4).fn(x, **kernel_attrs)
    assert_same(actual, expected)


def _random_forest(n_trees, depth, n_features, n_targets, modes):
    """Complete binary trees encoded the TreeEnsemble-5 way."""
    feat, mode, split, tid, fid, tleaf, fleaf, roots = [], [], [], [], [], [], [], []
    leaf_t, leaf_w = [], []
    for _ in range(n_trees):
        base = len(feat)
        roots.append(base)
        n_internal = 2 ** depth - 1
        leaf_base = len(leaf_w)
        for i in range(n_internal):
            feat.append(int(RNG.integers(n_features)))
            mode.append(int(RNG.choice(modes)))
            split.append(float(RNG.uniform(-1, 1)))
            for child, ids, leafs in ((2 * i + 1, tid, tleaf), (2 * i + 2, fid, fleaf)):
                if child < n_internal:
                    ids.append(base + child)
                    leafs.append(0)
                else:
                    ids.append(leaf_base + child - n_internal)
                    leafs.append(1)
        for _ in range(2 ** depth):
            leaf_t.append(int(RNG.integers(n_targets)))
            leaf_w.append(float(RNG.uniform(-2, 2)))
    return {
        "n_targets": n_targets, "tree_roots": roots, "nodes_featureids": feat,
        "nodes_modes": numpy_helper.from_array(np.array(mode, np.uint8), "m"),
        "nodes_splits": numpy_helper.from_array(np.array(split, np.float32), "s"),
        "nodes_truenodeids": tid, "nodes_falsenodeids": fid, "nodes_trueleafs": tleaf, "nodes_falseleafs": fleaf,
        "leaf_targetids": leaf_t, "leaf_weights": numpy_helper.from_array(np.array(leaf_w, np.float32), "w"),
    }


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
@pytest.mark.parametrize("post", [0, 1, 2, 3, 4])
def test_tree_ensemble(aggregate, post):
    if post == 4 and aggregate in (0, 1):
        pytest.skip("PROBIT needs scores in (0, 1)")
    attrs = _random_forest(4, 3, 3, 2, [0, 1, 2, 3, 4, 5])
    attrs.update(aggregate_function=aggregate, post_transform=post)
    if post == 4:  # PROBIT: keep the scores in (0, 1)
        w = numpy_helper.to_array(attrs["leaf_weights"])
        attrs["leaf_weights"] = numpy_helper.from_array((np.abs(w) % 0.9 + 0.05).astype(np.float32), "w")
    x = RNG.uniform(-1.2, 1.2, (20, 3)).astype(np.float32)
    x[3, 1] = np.nan
    # onnxruntime 1.32 reads post_transform with its internal enum order, where
    # 1 is LOGISTIC and 2 SOFTMAX; the ONNX spec (and minirt) has 1 SOFTMAX and
    # 2 LOGISTIC.  Ask onnxruntime for the same transformation by its number.
    ort_attrs = dict(attrs, post_transform={1: 2, 2: 1}.get(post, post))
    model = ref_mod.single_node_model("TreeEnsemble", [x], ort_attrs, 1, 5, domain=ML)
    model.opset_import.append(helper.make_opsetid("", 19))
    del model.graph.output[:]
    model.graph.output.extend([helper.make_empty_tensor_value_info("out0")])
    (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"in0": x})
    kattrs = {k: (numpy_helper.to_array(v) if hasattr(v, "dims") else v) for k, v in attrs.items()}
    actual = lookup(ML, "TreeEnsemble", 5).fn(x, **kattrs)
    # onnxruntime's PROBIT uses an erfinv approximation good to ~2e-4; minirt's is exact to float precision
    tol = 1e-3 if post == 4 else 1e-4
    assert_same(actual, expected, rtol=tol, atol=1e-5)
