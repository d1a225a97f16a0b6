"""``minirt build --no-cpu-fallback`` (issue 27): an accelerator artifact without the partitions' CPU
versions: smaller, verified off-device like any other, refused at load (with the reason) where the
provider cannot run it."""
from __future__ import annotations

import json

import pytest

import minirt
from minirt import cli
from minirt.kernels.delegated import delegated_partition
from tests.test_cli import DIGITS_ONNX


def _build(tmp_path, capsys, name, *extra):
    out = tmp_path / name
    capsys.readouterr()
    code = cli.main(["build", str(DIGITS_ONNX), "-o", str(out), "--target", "android-api34",
                     "--input-shape", "image=1x1x8x8", "--json", *extra])
    return code, out, (json.loads(capsys.readouterr().out) if code == 0 else None)


def test_a_thin_artifact_keeps_programs_and_goldens_but_not_the_cpu_version(tmp_path, capsys):
    code, full, report = _build(tmp_path, capsys, "full.mrt")
    assert code == 0
    code, thin, thin_report = _build(tmp_path, capsys, "thin.mrt", "--no-cpu-fallback")
    assert code == 0
    assert thin.stat().st_size < full.stat().st_size
    parts = thin_report["partitions"]
    assert parts["nodes"] == report["partitions"]["nodes"]
    assert parts["accelerated_nodes"] == report["partitions"]["accelerated_nodes"]
    assert all(not p["cpu_version"] for p in parts["partitions"])
    assert any("no CPU fallback" in n for n in parts["notes"])
    with pytest.raises(minirt.UnsupportedOperator, match="built without its CPU version .* nnapi"):
        minirt.Session(str(thin))
    if pytest.importorskip("ai_edge_litert"):
        capsys.readouterr()
        assert cli.main(["verify", str(thin)]) == 0
        assert "-> ok" in capsys.readouterr().out


def test_no_cpu_fallback_needs_an_accelerator_target(tmp_path, capsys):
    out = tmp_path / "x.mrt"
    code = cli.main(["build", str(DIGITS_ONNX), "-o", str(out), "--target", "generic", "--no-cpu-fallback"])
    assert code == 2 and "no accelerator provider" in capsys.readouterr().err and not out.exists()


def test_the_stand_in_kernel_refuses_to_compute():
    with pytest.raises(minirt.UnsupportedOperator, match="partition 3 \\(coreml, 12 nodes\\) was built without"):
        delegated_partition(None, provider="coreml", partition=3, nodes=12)


def test_a_partition_reading_an_earlier_partitions_output_gets_its_stand_ins_value():
    """Two partitions, the second reading the first's output across a CPU node: after the first is replaced
    by its stand-in, the second's stand-in reads the first stand-in's value (same name), and the artifact
    is written and loads with both partitions."""
    from onnx import helper

    from minirt.builder.lower import lower_model
    from minirt.builder.partition import apply_plan, drop_cpu_versions, plan_partitions
    from minirt.builder.writer import ArtifactWriter
    from minirt.format import reader
    from minirt.targets.providers import register_spec, unregister_spec
    from tests.test_partition import PROFILE, ReluAddSpec, _ir

    register_spec(ReluAddSpec())
    try:
        m = _ir([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
                 helper.make_node("Add", ["a", "b"], ["y"])])
        plan = plan_partitions(m, PROFILE, {"golden": False})
        assert len(plan.partitions) == 2
        drop_cpu_versions(m, plan)
        assert [n.op_type for n in m.graph] == ["DelegatedPartition", "Neg", "DelegatedPartition"]
        assert [v.name for v in plan.partitions[1].ir.inputs] == ["a", "b"]
        w = ArtifactWriter()
        lower_model(m, w)
        apply_plan(plan, w)
        art = reader.load(w.to_bytes())
        assert [p.node_count for p in art.partitions] == [1, 1]
        graph = art.graphs[0]
        assert [graph.values[v].name for v in art.partitions[1].inputs] == ["a", "b"]
    finally:
        unregister_spec("fake")
