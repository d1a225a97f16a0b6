"""Duplicate-initializer sharing.

Rule: initializers of one graph with the same dtype, shape and bytes are the
same constant; every reader of a later one reads the first one instead, and
the duplicate is removed.  Initializers that are graph inputs (overridable at
run time) or graph outputs are left alone.
"""
from __future__ import annotations

import hashlib

import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.passes.manager import Pass


def _key(value: ir.Value):
    t = value.const_value
    try:
        data = t.tobytes()
    except Exception:  # noqa: BLE001 - unreadable data is never merged
        return None
    return (str(t.dtype), tuple(t.shape), len(data), hashlib.sha256(data).digest())


class InitializerDeduplication(Pass):
    """Share initializers that hold identical data."""

    name = "initializer_dedup"

    def run(self, model: ir.Model) -> bool:
        changed = False
        for graph in list(irh.graphs(model)):
            inputs = set(map(id, graph.inputs))
            seen: dict = {}
            for name, value in list(graph.initializers.items()):
                if id(value) in inputs or value.is_graph_output() or value.const_value is None:
                    continue
                key = _key(value)
                if key is None:
                    continue
                first = seen.setdefault(key, value)
                if first is value:
                    continue
                value.replace_all_uses_with(first)
                graph.initializers.pop(name)
                changed = True
        return changed
