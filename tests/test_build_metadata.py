"""What the builder records in an artifact's metadata about its optimizer run."""
from pathlib import Path

import minirt
from minirt.builder.build import build

DIGITS = Path(__file__).resolve().parent.parent / "examples" / "digits" / "digits_cnn.onnx"


def test_optimizer_metadata_keeps_only_the_passes_that_did_something():
    report = build(str(DIGITS), None)
    kept = minirt.Session(report.data).metadata["build.optimizer"]
    full = report.optimizer
    assert kept["pipeline"] == full["pipeline"] and kept["nodes_before"] == full["nodes_before"]
    assert kept["nodes_after"] == full["nodes_after"]
    effective = [row["name"] for row in full["passes"] if row["changed_runs"] or row["refused"]]
    assert [row["name"] for row in kept["passes"]] == effective
    assert {"fuse_batchnorm", "fuse_activation"} <= set(effective) and len(effective) < len(full["pipeline"])
