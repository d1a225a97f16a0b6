"""Every kernel of the detection/sampling/pooling/ML/string/... families registers at
an opset where its operator's schema changes and accepts every schema attribute."""
from __future__ import annotations

import onnx
import pytest

from minirt.kernels import registered

_MODULES = tuple(f"minirt.kernels.{m}" for m in (
    "audio", "deformconv", "detection", "flexattention", "image", "ml", "optimizers", "pooling", "randomness",
    "sampling", "stateful", "strings",
))


def _entries():
    return [e for e in registered() if e.fn.__module__ in _MODULES]


def test_families_register_kernels():
    assert {e.fn.__module__ for e in _entries()} == set(_MODULES)


@pytest.mark.parametrize("entry", _entries(), ids=lambda e: f"{e.domain or 'ai.onnx'}-{e.op_type}-{e.since}")
def test_entry_matches_schema(entry):
    schema = onnx.defs.get_schema(entry.op_type, entry.since, entry.domain)
    assert schema.since_version == entry.since, f"{entry.op_type}: no schema introduced at {entry.since}"
    if entry.attributes is not None:
        missing = set(schema.attributes) - entry.attributes
        assert not missing, f"{entry.op_type}-{entry.since} does not accept {sorted(missing)}"
        extra = entry.attributes - set(schema.attributes)
        assert not extra, f"{entry.op_type}-{entry.since} takes non-attributes as keywords: {sorted(extra)}"
