"""Fold an ``If`` whose condition is a constant into the branch it always takes.

Rules:

* ``If(cond)`` with ``cond`` a one-element constant (an initializer that is
  not a graph input, or a Constant) -> the nodes of ``then_branch`` (cond
  true) or ``else_branch`` are moved, in order, into the graph holding the
  If, just before it; the If's outputs are replaced by the branch outputs;
* the branch's nodes keep reading outer-scope values directly (onnx-ir
  values are shared objects, so those references stay valid); branch
  initializers become initializers of the parent graph;
* names that would collide in the parent graph (node names, value names)
  are renamed to fresh ones;
* a branch output that cannot take the If output's place (it is a graph
  input or already a graph output of the parent, or the same value feeds two
  If outputs) is routed through an Identity so the model's interface keeps
  its names;
* works at every depth: an If nested in a branch is folded in its own graph,
  and a branch moved up may expose more constant conditions (the pass
  manager's fixed point handles the cascade).

Silero VAD's ``/model/decoder/If_1`` (a constant sample-rate switch holding
the LSTM) is the motivating case.
"""
from __future__ import annotations

import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.passes.manager import Pass


class FoldConstantIf(Pass):
    """Inline the taken branch of an If with a constant condition."""

    name = "fold_constant_if"

    def run(self, model: ir.Model) -> bool:
        changed = False
        for graph in list(irh.graphs(model)):
            for node in irh.live_nodes(graph):
                if not irh.is_onnx(node, "If") or not node.inputs:
                    continue
                cond = irh.const_array(node.inputs[0])
                if cond is None or cond.size != 1:
                    continue
                taken = bool(cond.reshape(-1)[0])
                branch = irh.attr(node, "then_branch" if taken else "else_branch")
                if branch is None or len(branch.outputs) != len(node.outputs):
                    self.refuse("fold_if", node, "branch outputs do not match the If outputs")
                    continue
                dropped = irh.attr(node, "else_branch" if taken else "then_branch")
                self._inline(graph, node, branch)
                if dropped is not None:
                    _detach(dropped)
                changed = True
        return changed

    def _inline(self, graph: ir.Graph, node: ir.Node, branch: ir.Graph) -> None:
        taken = set(irh._names(graph))
        # Detach the branch's outputs first: an initializer that is also a branch
        # output still belongs to the branch until it is no longer listed there.
        outs = list(branch.outputs)
        branch.outputs.clear()
        # Branch initializers move to the parent (renamed on collision).
        for name, init in list(branch.initializers.items()):
            branch.initializers.pop(name)
            if init.name in taken or init.name in graph.initializers:
                init.name = irh.unique_name(graph, init.name)
            graph.register_initializer(init)
            taken.add(init.name)
        nodes = list(branch)
        for n in nodes:
            branch.remove(n, safe=False)
        for n in nodes:
            if n.name and n.name in taken:
                n.name = irh.unique_name(graph, n.name)
            for v in n.outputs:
                if v.name and v.name in taken:
                    v.name = irh.unique_name(graph, v.name)
                if v.name:
                    taken.add(v.name)
        graph.meta.pop("_minirt_names", None)
        if nodes:
            graph.insert_before(node, nodes)
        used = set()
        for old, new in zip(node.outputs, outs):
            if id(new) in used or not irh.can_replace(old, new):
                ident = ir.Node("", "Identity", [new], name=irh.unique_name(graph, (node.name or "If") + "_out"))
                ident.outputs[0].type = old.type or new.type
                ident.outputs[0].shape = old.shape or new.shape
                graph.insert_before(node, ident)
                new = ident.outputs[0]
            used.add(id(new))
            if new.type is None:
                new.type = old.type
            if new.shape is None and old.shape is not None:
                new.shape = old.shape
            irh.replace_value(old, new)
        graph.remove(node, safe=True)


def _detach(branch: ir.Graph) -> None:
    """Let the nodes of a branch that is gone stop reading outer values: they would still be listed among
    those values' uses, and a value read by a dead branch looks read outside whatever reads it (a Core ML
    partition holding the whole of Silero VAD was taken for an island with extra outputs, and refused)."""
    for n in list(ir.traversal.RecursiveGraphIterator(branch)):
        for i, v in enumerate(n.inputs):
            if v is not None:
                n.replace_input_with(i, None)


__all__ = ["FoldConstantIf"]
