"""docs/operators.md is generated from the kernel registry and must be current."""
from __future__ import annotations

from pathlib import Path

from minirt.builder.coverage import render_operator_table
from minirt.kernels.registry import registered

DOC = Path(__file__).resolve().parents[1] / "docs" / "operators.md"


def test_operators_doc_is_current():
    assert DOC.read_text() == render_operator_table(), (
        "docs/operators.md is stale: run `python -m minirt.builder.coverage > docs/operators.md`"
    )


def test_every_registered_op_is_listed():
    text = DOC.read_text()
    for entry in registered():
        if not entry.fn.__module__.startswith("minirt.kernels."):
            continue  # registered by a test
        assert f"| {entry.op_type} |" in text, entry.op_type
