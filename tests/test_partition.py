"""builder/partition.py: assignment, schedulable growth, cost model, layout, golden outputs."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from minirt import builder
import minirt
from minirt.builder.build import _apply_input_shapes, _normalise
from minirt.builder.load import load_model
from minirt.builder.lower import lower_model
from minirt.builder.partition import apply_plan, plan_partitions
from minirt.builder.passes import optimize
from minirt.builder.writer import ArtifactWriter
from minirt.targets.profiles import TargetProfile, get_target
from minirt.targets.providers import ProviderSpec, register_spec, unregister_spec

F = TensorProto.FLOAT


class ReluAddSpec(ProviderSpec):
    """Takes Relu and Add only; lowering returns a dummy program."""

    name = "fake"
    min_flops = 0
    dispatch_cost = 0
    copy_cost_per_element = 0

    def supports(self, node, ctx):
        return (node.op_type in ("Relu", "Add")), f"{node.op_type} is not supported by fake"

    def lower(self, partition, ctx):
        return b"prog", {"n": len(partition.nodes)}


@pytest.fixture
def fake():
    spec = ReluAddSpec()
    register_spec(spec)
    yield spec
    unregister_spec("fake")


PROFILE = TargetProfile("fake-target", "test", ("fake", "cpu"), (), "any")


def _ir(nodes, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 4])],
                          [helper.make_tensor_value_info("y", F, [1, 4])], initializer=list(inits))
    m, _ = load_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    _normalise(m)
    return m


def test_no_path_leaves_and_reenters_a_partition(fake):
    # a=Relu(x); b=Neg(a) [cpu]; y=Add(a, b): {Relu, Add} would need b in between -> two partitions
    m = _ir([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])])
    plan = plan_partitions(m, PROFILE, {"golden": False})
    assert [len(p.ir.nodes) for p in plan.partitions] == [1, 1]
    assert "Neg is not supported by fake" in plan.cpu_nodes[list(m.graph)[1].name]


def test_independent_branches_merge_and_layout_is_contiguous(fake):
    # r1=Relu(x); n=Neg(x) [cpu]; r2=Relu(r1); y=Add(r2, n)
    m = _ir([helper.make_node("Relu", ["x"], ["r1"]), helper.make_node("Neg", ["x"], ["n"]),
             helper.make_node("Relu", ["r1"], ["r2"]), helper.make_node("Add", ["r2", "n"], ["y"])])
    plan = plan_partitions(m, PROFILE, {})
    (p,) = plan.partitions
    assert [n.op_type for n in p.ir.nodes] == ["Relu", "Relu", "Add"]
    assert [n.op_type for n in m.graph] == ["Neg", "Relu", "Relu", "Add"]  # reordered, topological
    w = ArtifactWriter()
    lower_model(m, w)
    apply_plan(plan, w)
    art = minirt.Session(w.to_bytes(), providers=["cpu"]).artifact
    (rec,) = art.partitions
    assert (rec.first_node, rec.node_count, rec.options) == (1, 3, {"n": 3})
    assert len(rec.golden_inputs) == 2 and len(rec.golden_outputs) == 1
    x = art.tensor(rec.golden_inputs[0])
    np.testing.assert_allclose(art.tensor(rec.golden_outputs[0]), np.maximum(x, 0) - x)
    assert art.metadata["build.partitions"]["partitions"][0]["flops_share"] >= 0


def test_cost_model_keeps_small_islands_on_cpu(fake):
    fake.min_flops = 1e9
    m = _ir([helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("Neg", ["r"], ["y"])])
    plan = plan_partitions(m, PROFILE, {})
    assert plan.partitions == []
    assert "island too small" in plan.cpu_nodes[list(m.graph)[1].name]


def test_missing_backend_is_reported():
    profile = TargetProfile("t", "test", ("nosuch", "cpu"), (), "any")
    m = _ir([helper.make_node("Relu", ["x"], ["y"])])
    plan = plan_partitions(m, profile, {})
    assert plan.partitions == [] and "not offered" in plan.notes[0]


def _macos_artifact(path, shapes):
    m, _ = load_model(path)
    _apply_input_shapes(m, shapes)
    _normalise(m)
    optimize(m, 2, input_shapes=shapes)
    plan = plan_partitions(m, get_target("macos"), {"input_shapes": shapes})
    w = ArtifactWriter()
    lower_model(m, w)
    apply_plan(plan, w)
    return plan, w.to_bytes()


def test_demo_model_for_macos_falls_back_bit_identical():
    pytest.importorskip("coremltools")
    from minirt.cli import DIGITS_DIR

    path = str(DIGITS_DIR / "digits_cnn.onnx")
    shapes = {"image": (1, 1, 8, 8)}
    plan, data = _macos_artifact(path, shapes)
    assert plan.provider_share("coreml") >= 0.9
    cpu_only = builder.build_bytes(path, target="generic", input_shapes=shapes)
    x = np.random.default_rng(1).random((1, 1, 8, 8), dtype=np.float32)
    a = minirt.Session(data, providers=["cpu"]).run(None, {"image": x})
    b = minirt.Session(cpu_only).run(None, {"image": x})
    for u, v in zip(a, b):
        assert np.array_equal(u, v)


def test_build_for_macos_partitions_and_runs_identically_on_the_cpu(tmp_path):
    """builder.build(target="macos"): a Core ML partition, golden outputs, and a CPU fallback bit-identical
    to the CPU-only build (this machine has no Core ML, so the partition's CPU version runs)."""
    import numpy as np

    from minirt import builder
    import minirt
    from pathlib import Path

    pytest.importorskip("coremltools")
    onnx_path = Path(__file__).resolve().parents[1] / "examples" / "digits" / "digits_cnn.onnx"
    mac = builder.build(onnx_path, tmp_path / "mac.mrt", target="macos", input_shapes=["image=1x1x8x8"])
    cpu = builder.build(onnx_path, tmp_path / "cpu.mrt", input_shapes=["image=1x1x8x8"])
    assert mac.partitions["partitions"] and mac.partitions["partitions"][0]["provider"] == "coreml"
    s_mac, s_cpu = minirt.Session(tmp_path / "mac.mrt"), minirt.Session(tmp_path / "cpu.mrt")
    assert s_mac.get_providers() == ["CPUExecutionProvider"]  # (Core ML: in its list, not available here)
    (part,) = s_mac.get_partitions()
    assert part["runs_on"] == "cpu" and "not available" in part["reason"]
    assert s_mac.artifact.partitions[0].golden_outputs
    x = np.random.default_rng(0).random((1, 1, 8, 8), dtype=np.float32)
    np.testing.assert_array_equal(s_mac.run(None, {"image": x})[0], s_cpu.run(None, {"image": x})[0])


# --- honest reports (issue 27): shares in nodes and estimated FLOPs; unknown costs said so, never 0


def test_report_counts_nodes_and_names_nodes_of_unknown_cost(fake):
    # r=Relu(x) [fake]; n=Neg(r) [cpu]; e=Einsum(n) [cpu, no FLOPs rule]; y=Add(r, e) [fake]
    m = _ir([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["n"]),
             helper.make_node("Einsum", ["n"], ["e"], equation="ij->ij"), helper.make_node("Add", ["r", "e"], ["y"])])
    plan = plan_partitions(m, PROFILE, {"golden": False})
    report = plan.report()
    assert (report["nodes"], report["accelerated_nodes"]) == (4, 2)
    einsum = list(m.graph)[2].name
    assert report["unknown_cost_nodes"] == [{"node": einsum, "op": "Einsum", "runs_on": "cpu"}]
    from minirt.tools.reports import format_partition_report

    text = "\n".join(format_partition_report(report))
    assert "2 of 4 nodes (50.0%)" in text
    assert "FLOPs unknown for 1 node(s)" in text and "1 of them on the CPU: Einsum x1" in text


def test_flops_estimates_say_unknown_rather_than_zero():
    from minirt.targets.flops import estimate, node_flops

    def one(node, x_shape, y_shape, inits=()):
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, x_shape)],
                              [helper.make_tensor_value_info("y", F, y_shape)], initializer=list(inits))
        m, _ = load_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
        return next(iter(m.graph))

    w = numpy_helper.from_array(np.ones((8, 4, 3, 3), np.float32), "w")
    conv = one(helper.make_node("Conv", ["x", "w"], ["y"]), [1, 4, 10, 10], [1, 8, 8, 8], [w])
    assert estimate(conv) == node_flops(conv) == 2 * 8 * 8 * 8 * 4 * 9
    unknown_shape = one(helper.make_node("Conv", ["x", "w"], ["y"]), ["n", 4, "h", "w"], ["n", 8, "oh", "ow"], [w])
    assert estimate(unknown_shape) is None and node_flops(unknown_shape) == 0.0
    moves = one(helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0]), ["a", "b"], ["b", "a"])
    assert estimate(moves) == 0.0  # (data movement: known to be no arithmetic, whatever the shapes)
    no_rule = one(helper.make_node("Einsum", ["x"], ["y"], equation="ij->ji"), [2, 3], [3, 2])
    assert estimate(no_rule) is None
    lrn = one(helper.make_node("LRN", ["x"], ["y"], size=5), [1, 6, 4, 4], [1, 6, 4, 4])
    assert estimate(lrn) == 96 * (2 * 5 + 6)  # (GoogLeNet's: a window of 5 channels per element)


def test_a_shape_refusal_names_the_real_cause():
    from minirt.targets.providers import SupportContext

    m = _ir([helper.make_node("Relu", ["x"], ["y"])])
    assert "--input-shape" in SupportContext(m, PROFILE, {}).unknown_shape_hint()
    fixed = SupportContext(m, PROFILE, {"input_shapes": {"x": (1, 4)}}).unknown_shape_hint()
    assert "--input-shape" not in fixed and "depends on the input's values" in fixed


def test_nnapi_names_a_data_dependent_size_before_the_element_type():
    """A detector's per-class chain with fixed input shapes: NonZero's count depends on the scores, so
    its int64 Transpose / GatherND are refused for that size (the real cause), not for being int64."""
    from minirt.targets.nnapi import NNAPISpec
    from minirt.targets.providers import SupportContext

    nodes = [helper.make_node("Greater", ["x", "t"], ["keep"]), helper.make_node("NonZero", ["keep"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["idx"], perm=[1, 0]),
             helper.make_node("GatherND", ["x", "idx"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 50])],
                          [helper.make_tensor_value_info("y", F, ["n"])],
                          [numpy_helper.from_array(np.array(0.5, np.float32), "t")])
    m, _ = load_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    ctx = SupportContext(m, get_target("android-api34"), {"input_shapes": {"x": (1, 50)}})
    reasons = {n.op_type: NNAPISpec().supports(n, ctx)[1] for n in m.graph}
    for op in ("NonZero", "Transpose", "GatherND"):
        assert "has no static shape" in reasons[op] and "depends on the input's values" in reasons[op], reasons
