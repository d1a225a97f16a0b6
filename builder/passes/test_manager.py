"""Tests for the pass manager and optimize(): levels, --disable-pass, the report, fixed point, random graphs."""
import json

import numpy as np
import onnx
import pytest
from onnx import helper as h

from minirt.builder.passes import optimize, pass_names, pipeline, testing as T

R = np.random.default_rng(6)


def _cnn():
    nodes = [h.make_node("Identity", ["x"], ["i"]),
             h.make_node("Conv", ["i", "w"], ["c"], pads=[1, 1, 1, 1]),
             h.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
             h.make_node("Relu", ["n"], ["r"]),
             h.make_node("Conv", ["r", "w"], ["c2"], pads=[1, 1, 1, 1]),
             h.make_node("Add", ["c2", "r"], ["a"]),
             h.make_node("Relu", ["a"], ["y"])]
    inits = [T.tensor("w", R.standard_normal((4, 4, 3, 3)).astype(np.float32) * 0.3)]
    inits += [T.tensor(k, R.uniform(0.5, 1.5, 4).astype(np.float32)) for k in "sbmv"]
    return T.make_model(nodes, [T.vinfo("x", ["n", 4, 6, 6])], [T.vinfo("y", ["n", 4, 6, 6])], inits)


FEEDS = {"x": R.standard_normal((2, 4, 6, 6)).astype(np.float32)}


def test_levels():
    assert pipeline(0) == []
    assert {p.name for p in pipeline(1)} < {p.name for p in pipeline(2)} <= {p.name for p in pipeline(3)}
    m, report, _ = T.run_both(_cnn(), FEEDS, opt_level=0)
    assert report.nodes_before == report.nodes_after == 7
    m, report, _ = T.run_both(_cnn(), FEEDS, opt_level=2)
    assert T.ops(m) == {"com.minirt::FusedConv": 2}
    with pytest.raises(ValueError):
        pipeline(4)


def test_disable_pass():
    m, report, _ = T.run_both(_cnn(), FEEDS, disabled=["fuse_activation"])
    assert "fuse_activation" not in report.pipeline and report.disabled == ["fuse_activation"]
    assert T.ops(m) == {"Conv": 2, "Relu": 2, "Add": 1}
    with pytest.raises(ValueError, match="known passes"):
        optimize(T.load(_cnn()), 2, disabled=["no_such_pass"])


def test_report_is_json_and_names_every_pass():
    _, report, _ = T.run_both(_cnn(), FEEDS)
    d = json.loads(json.dumps(report.as_dict()))
    assert d["nodes_before"] == 7 and d["nodes_after"] == 2 and d["converged"]
    assert [row["name"] for row in d["passes"]] == report.pipeline
    assert all({"nodes_before", "nodes_after", "seconds", "refused"} <= set(row) for row in d["passes"])
    assert "fuse_batchnorm" in str(report)
    assert set(pass_names()) >= set(report.pipeline)


def test_second_run_changes_nothing():
    m = T.load(_cnn())
    optimize(m, 3)
    before = [(n.domain, n.op_type) for n in m.graph]
    report = optimize(m, 3)
    assert report.iterations == 1 and all(row["changed_runs"] == 0 for row in report.as_dict()["passes"])
    assert [(n.domain, n.op_type) for n in m.graph] == before


def test_empty_graph_like_model():
    model = T.make_model([h.make_node("Identity", ["x"], ["y"])], [T.vinfo("x", [2])], [T.vinfo("y", [2])])
    m, report, _ = T.run_both(model, {"x": np.ones(2, np.float32)}, opt_level=3)
    assert report.nodes_after == 1  # input -> output Identity is the interface


# ---------------------------------------------------------------- randomized graphs
_UNARY = ["Relu", "Sigmoid", "Tanh", "Neg", "Identity", "Dropout"]
_BINARY = ["Add", "Mul", "Sub"]


def _random_model(seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    c = 4
    values = ["x"]
    nodes, inits = [], []
    for i in range(int(rng.integers(4, 12))):
        kind = rng.choice(["conv", "bn", "unary", "binary", "const", "transpose2", "act", "layernorm", "attention", "if"])
        src = values[int(rng.integers(len(values)))]
        out = f"v{i}"
        if kind == "conv":
            inits.append(T.tensor(f"w{i}", (rng.standard_normal((c, c, 3, 3)) * 0.2).astype(np.float32)))
            nodes.append(h.make_node("Conv", [src, f"w{i}"], [out], pads=[1, 1, 1, 1]))
        elif kind == "bn":
            for k in "sbmv":
                inits.append(T.tensor(f"bn{k}{i}", rng.uniform(0.5, 1.5, c).astype(np.float32)))
            nodes.append(h.make_node("BatchNormalization", [src] + [f"bn{k}{i}" for k in "sbmv"], [out]))
        elif kind == "unary":
            nodes.append(h.make_node(str(rng.choice(_UNARY)), [src], [out]))
        elif kind == "act":
            nodes.append(h.make_node("Clip", [src, "lo", "hi"], [out]))
        elif kind == "binary":
            other = values[int(rng.integers(len(values)))]
            nodes.append(h.make_node(str(rng.choice(_BINARY)), [src, other], [out]))
        elif kind == "const":
            inits.append(T.tensor(f"k{i}", rng.standard_normal((1, c, 1, 1)).astype(np.float32)))
            nodes.append(h.make_node(str(rng.choice(_BINARY)), [src, f"k{i}"], [out]))
        elif kind == "layernorm":  # decomposed, over the last axis (recognise_layernorm)
            inits += [T.tensor(f"g{i}", rng.uniform(0.5, 1.5, 5).astype(np.float32)),
                      T.tensor(f"b{i}", rng.standard_normal(5).astype(np.float32))]
            nodes += [h.make_node("ReduceMean", [src], [out + "m"], axes=[-1]),
                      h.make_node("Sub", [src, out + "m"], [out + "c"]),
                      h.make_node("Mul", [out + "c", out + "c"], [out + "s"]),
                      h.make_node("ReduceMean", [out + "s"], [out + "v"], axes=[-1]),
                      h.make_node("Add", [out + "v", "eps"], [out + "e"]),
                      h.make_node("Sqrt", [out + "e"], [out + "d"]),
                      h.make_node("Div", [out + "c", out + "d"], [out + "n"]),
                      h.make_node("Mul", [out + "n", f"g{i}"], [out + "g"]),
                      h.make_node("Add", [out + "g", f"b{i}"], [out])]
        elif kind == "attention":  # self-attention of src on its last two axes (recognise_attention)
            nodes += [h.make_node("Transpose", [src], [out + "t"], perm=[0, 1, 3, 2]),
                      h.make_node("MatMul", [src, out + "t"], [out + "q"]),
                      h.make_node("Div", [out + "q", "sqrt5"], [out + "s"]),
                      h.make_node("Softmax", [out + "s"], [out + "p"], axis=-1),
                      h.make_node("MatMul", [out + "p", src], [out])]
        elif kind == "if":  # constant condition (fold_constant_if)
            taken = bool(rng.integers(2))
            branch = [h.make_graph([h.make_node(op, [src], [f"{out}_{op}"])], f"{out}_{op}", [],
                                   [h.make_tensor_value_info(f"{out}_{op}", onnx.TensorProto.FLOAT, None)])
                      for op in ("Tanh", "Sigmoid")]
            inits.append(T.tensor(f"cond{i}", np.array(taken)))
            nodes.append(h.make_node("If", [f"cond{i}"], [out], then_branch=branch[0], else_branch=branch[1]))
        else:
            nodes.append(h.make_node("Transpose", [src], [out + "t"], perm=[0, 2, 3, 1]))
            nodes.append(h.make_node("Transpose", [out + "t"], [out], perm=[0, 3, 1, 2]))
        values.append(out)
    inits += [T.tensor("lo", np.float32(-1)), T.tensor("hi", np.float32(1)), T.tensor("eps", np.float32(1e-5)),
              T.tensor("sqrt5", np.float32(np.sqrt(5)))]
    outputs = [values[-1]] + ([values[len(values) // 2]] if len(values) > 3 and values[len(values) // 2] != "x" else [])
    return T.make_model(nodes, [T.vinfo("x", [1, c, 5, 5])], [T.vinfo(o, [1, c, 5, 5]) for o in dict.fromkeys(outputs)], inits)


@pytest.mark.parametrize("seed", range(40))
def test_random_graphs(seed):
    model = _random_model(seed)
    feeds = {"x": np.random.default_rng(seed).standard_normal((1, 4, 5, 5)).astype(np.float32)}
    m, report, _ = T.run_both(model, feeds, opt_level=3, rtol=1e-3, atol=1e-4)
    assert report.nodes_after <= report.nodes_before
    again = optimize(m, 3)
    assert again.nodes_after == report.nodes_after and all(r["changed_runs"] == 0 for r in again.as_dict()["passes"])
