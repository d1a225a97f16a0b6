"""Dead code elimination.

Rules (every graph, subgraphs included):

* a node none of whose outputs is read by a node or is a graph output is
  removed (ONNX operators are side-effect free); removing a node that holds
  subgraphs also drops the subgraphs' reads of outer values, so producers
  that only fed the subgraph die in the same run;
* an initializer nobody reads, that is neither a graph input nor a graph
  output, is removed.

Graph inputs are never removed: they are the model's interface.
"""
from __future__ import annotations

import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.passes.manager import Pass


def _detach_subgraphs(node: ir.Node) -> None:
    for a in node.attributes.values():
        subs = [a.value] if a.type == ir.AttributeType.GRAPH else list(a.value) if a.type == ir.AttributeType.GRAPHS else []
        for g in subs:
            for inner in list(g.all_nodes()):
                for i in range(len(inner.inputs)):
                    if inner.inputs[i] is not None:
                        inner.replace_input_with(i, None)


def _is_dead(node: ir.Node) -> bool:
    return all(not v.uses() and not v.is_graph_output() for v in node.outputs)


def eliminate_dead_code(graph: ir.Graph) -> bool:
    changed = False
    # Reverse topological order: a consumer dies before its producer is looked at.
    for node in reversed(list(graph)):
        if _is_dead(node):
            if irh.has_subgraph(node):
                _detach_subgraphs(node)
            graph.remove(node, safe=True)
            changed = True
    inputs = set(map(id, graph.inputs))
    for name, value in list(graph.initializers.items()):
        if not value.uses() and not value.is_graph_output() and id(value) not in inputs:
            graph.initializers.pop(name)
            changed = True
    return changed


class DeadCodeElimination(Pass):
    """Remove nodes and initializers that no output depends on."""

    name = "dce"

    def run(self, model: ir.Model) -> bool:
        changed = False
        for graph in list(irh.graphs(model)):
            changed |= eliminate_dead_code(graph)
        return changed
