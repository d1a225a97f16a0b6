"""Common subexpression elimination.

Rule: two nodes of the same graph with the same (domain, op_type, version),
the very same input values, equal attributes and the same number of outputs
compute the same thing; the later one's outputs are replaced by the earlier
one's and the later node is dropped.

Not merged: nodes holding subgraphs, random generators (two draws are not
one), and pairs where both outputs are graph outputs (the model's interface
names two values).  Run it after initializer deduplication so that equal
constants are already the same value.
"""
from __future__ import annotations

import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.passes.manager import Pass
from minirt.vocabulary import RANDOM

_NONDETERMINISTIC = RANDOM  # two draws are two different values


def _tensor_key(t) -> tuple:
    arr = t.numpy()
    # String tensors are object arrays, which have no byte image: key on their values.
    data = tuple(arr.reshape(-1).tolist()) if arr.dtype == object else arr.tobytes()
    return (str(t.dtype), tuple(t.shape), data)


def _attr_key(a: ir.Attr):
    t, v = a.type, a.value
    if t == ir.AttributeType.TENSOR:
        return (a.name, int(t), _tensor_key(v))
    if t == ir.AttributeType.TENSORS:
        return (a.name, int(t), tuple(_tensor_key(x) for x in v))
    if isinstance(v, list):
        v = tuple(v)
    return (a.name, int(t), v)


def node_key(node: ir.Node):
    """A hashable key equal for nodes that compute the same outputs, or None."""
    if node.op_type in _NONDETERMINISTIC or irh.has_subgraph(node):
        return None
    try:
        attrs = tuple(sorted(_attr_key(a) for a in node.attributes.values()))
        hash(attrs)
    except TypeError:
        return None
    return (
        node.domain,
        node.op_type,
        node.overload,
        node.version,
        tuple(id(v) if v is not None else None for v in node.inputs),
        len(node.outputs),
        attrs,
    )


class CommonSubexpressionElimination(Pass):
    """Merge nodes that compute the same outputs from the same inputs."""

    name = "cse"

    def run(self, model: ir.Model) -> bool:
        changed = False
        for graph in list(irh.graphs(model)):
            seen: dict = {}
            for node in list(graph):
                key = node_key(node)
                if key is None:
                    continue
                first = seen.get(key)
                if first is None:
                    seen[key] = node
                    continue
                pairs = list(zip(node.outputs, first.outputs))
                if not all(irh.can_replace(old, new) for old, new in pairs):
                    continue
                if sum(old.is_graph_output() for old, _ in pairs) and any(new.is_graph_output() for _, new in pairs):
                    continue
                for old, new in pairs:
                    irh.replace_value(old, new)
                graph.remove(node, safe=True)
                changed = True
        return changed
