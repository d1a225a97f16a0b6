"""Tests for fold_constant_if: an If with a constant condition becomes its taken branch."""
import numpy as np
import onnx
from onnx import helper as h

from minirt.builder.passes import optimize, testing as T
from minirt.builder.passes.fold_constant_if import FoldConstantIf

X = {"x": np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32)}
OUT = onnx.TensorProto.FLOAT


def _branch(name, nodes, out, inits=()):
    return h.make_graph(nodes, name, [], [h.make_tensor_value_info(out, OUT, None)], initializer=list(inits))


def _model(cond_value, then_nodes=None, else_nodes=None, extra=(), cond_from_input=False):
    # The then branch reads the outer value "r" and has its own initializer; the else branch returns "r".
    then_g = then_nodes or _branch("then", [h.make_node("Mul", ["r", "c3"], ["m3"], name="n_m3"),
                                            h.make_node("Neg", ["m3"], ["t_out"])], "t_out",
                                   [T.tensor("c3", np.float32(3))])
    else_g = else_nodes or _branch("else", [h.make_node("Identity", ["r"], ["r_id"])], "r_id")  # cleanup leaves "r"
    cond = [h.make_node("Identity", ["cond_in"], ["cond"])] if cond_from_input else []
    nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("Sigmoid", ["r"], ["dup"], name="n_dup")] + cond + [
        h.make_node("If", ["cond"], ["o"], then_branch=then_g, else_branch=else_g),
        h.make_node("Add", ["o", "dup"], ["y"])] + list(extra)
    inits = [T.tensor("c", np.float32(-1))] + ([] if cond_from_input else [T.tensor("cond", np.array(cond_value))])
    inputs = [T.vinfo("x", [2, 3])] + ([T.vinfo("cond_in", [], onnx.TensorProto.BOOL)] if cond_from_input else [])
    return T.make_model(nodes, inputs, [T.vinfo("y", [2, 3])], inits, opset=15)


def test_then_branch_inlined():
    m, report, _ = T.run_both(_model(True), X, opt_level=1)
    assert "If" not in T.ops(m) and T.ops(m)["Neg"] == 1
    assert report.converged


def test_name_collisions_renamed():
    # Valid ONNX is SSA across subgraphs, but passes name new values per graph (constant folding in a
    # branch names "<x>_const" against the branch's names only): collide on purpose after loading.
    ref = T.run(T.load(_model(True)), X)
    m = T.load(_model(True))
    branch = next(n for n in m.graph if n.op_type == "If").attributes["then_branch"].value
    mul = next(iter(branch))
    mul.name, mul.outputs[0].name = "n_dup", "dup"
    init = branch.initializers.pop("c3")
    init.name = "c"
    branch.register_initializer(init)
    assert FoldConstantIf()(m).modified
    names = [v.name for n in m.graph for v in n.outputs] + list(m.graph.initializers)
    assert len(names) == len(set(names))
    assert len({n.name for n in m.graph}) == len(list(m.graph))
    np.testing.assert_array_equal(T.run(m, X)[0], ref[0])


def test_else_branch_returning_outer_value():
    m, _, _ = T.run_both(_model(False), X, opt_level=1)
    assert T.ops(m) == {"Relu": 1, "Sigmoid": 1, "Add": 1}


def test_nested_if_folds_in_cascade():
    inner = h.make_node("If", ["cond"], ["inner_out"], then_branch=_branch("it", [h.make_node("Neg", ["r"], ["ni"])], "ni"),
                        else_branch=_branch("ie", [h.make_node("Abs", ["r"], ["ai"])], "ai"))
    outer_then = _branch("then", [inner, h.make_node("Exp", ["inner_out"], ["e"])], "e")
    m, _, _ = T.run_both(_model(True, then_nodes=outer_then), X, opt_level=1)
    assert "If" not in T.ops(m) and T.ops(m)["Neg"] == 1 and "Abs" not in T.ops(m)


def test_branch_output_that_is_a_graph_input():
    then_g = _branch("then", [h.make_node("Identity", ["x"], ["x_id"])], "x_id")  # If(...) -> x, and the If output is the graph output
    model = T.make_model([h.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=_branch("e", [h.make_node("Neg", ["x"], ["n"])], "n"))],
                         [T.vinfo("x", [2, 3])], [T.vinfo("y", [2, 3])], [T.tensor("cond", np.array(True))], opset=15)
    m, _, _ = T.run_both(model, X, opt_level=1)
    assert T.ops(m) == {"Identity": 1}
    assert [v.name for v in m.graph.outputs] == ["y"]


def test_non_constant_condition_kept():
    model = _model(True, cond_from_input=True)
    assert not FoldConstantIf()(T.load(model)).modified
    feeds = dict(X, cond_in=np.array(False))
    T.run_both(model, feeds, opt_level=1)


def test_empty_graph_and_twice():
    model = T.make_model([h.make_node("Identity", ["x"], ["y"])], [T.vinfo("x", [2])], [T.vinfo("y", [2])])
    assert not FoldConstantIf()(T.load(model)).modified
    m = T.load(_model(True))
    optimize(m, 1)
    assert not FoldConstantIf()(m).modified


def test_branch_output_that_is_a_branch_initializer():
    """The taken branch returns its own initializer directly (as onnx's expanded functions do)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from minirt.builder.passes.testing import ops, run_both

    then = helper.make_graph([], "then", [], [helper.make_tensor_value_info("c", TensorProto.INT64, [1])],
                             initializer=[numpy_helper.from_array(np.array([7], np.int64), "c")])
    other = helper.make_graph([], "else", [], [helper.make_tensor_value_info("d", TensorProto.INT64, [1])],
                              initializer=[numpy_helper.from_array(np.array([9], np.int64), "d")])
    cond = helper.make_tensor("cond", TensorProto.BOOL, [], [True])
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["k"], then_branch=then, else_branch=other),
         helper.make_node("Add", ["x", "k"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [1])], initializer=[cond],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    optimized, _, got = run_both(model, {"x": np.array([1], np.int64)}, opt_level=1)
    np.testing.assert_array_equal(got[0], [8])
    assert "If" not in ops(optimized)


def test_the_dropped_branch_no_longer_reads_outer_values():
    """The untaken branch's nodes stop being uses of the outer values they read: only live nodes remain
    (a value read by a dead branch looked read outside a partition holding every live reader)."""
    m, _, _ = T.run_both(_model(True), X, opt_level=1)
    r = next(o for n in m.graph for o in n.outputs if o.name == "r")
    live = {id(n) for n in m.graph}
    assert r.uses() and all(id(user) in live for user, _ in r.uses())
