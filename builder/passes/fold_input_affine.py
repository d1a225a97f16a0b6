"""Fold a scalar affine map into the pointwise Conv / Gemm layers that read it.

Rule (s and t are constant scalars; every reader R of the map's result is a
Conv or FusedConv with a 1x1 kernel and no padding, or a Gemm / FusedGemm,
reading it as its data input only, with a constant weight)::

    R(Add(Mul(x, s), t), W, B)  ->  R(x, s*W, B + t * sum(W))

and likewise ``Mul`` alone (t = 0) or ``Add`` alone (s = 1).  ``sum(W)`` is,
per output channel, the sum of the weights that output reads: for a Conv the
sum over its input channels (of its group) and kernel taps, for a Gemm the sum
over the reduction axis, scaled by ``alpha`` (the Gemm then has ``beta = 1``).

Why: PP-OCR's LCNet (and other exported PaddlePaddle models) put a "learnable
affine block" ``s * act(conv(x)) + t`` after every conv + activation, as a
separate Mul and Add over the whole feature map.  The activation stops it from
folding into the conv that produces it (``fuse_batchnorm``), but a pointwise
layer that reads it is linear in its input, so the map folds into that layer's
weights exactly: two full passes over a tensor per block disappear.

Exactness: in real arithmetic the result is identical.  The 1x1 / no-padding
condition is what makes it so: a padded window would read zeros where the
unfolded layer reads ``t``.  The new weights are computed in float64 and
rounded once to the weight dtype, so the only difference is float rounding.

Refused (and reported when the structure matched): a reader that is not such
a layer (the whole map stays), non-constant or non-float weights, and scalars
whose rank would broadcast the data to a larger rank.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.passes.manager import Pass

# (domain, op_type) of the layers a map folds into; domain "" is ONNX
_CONV_READERS = {("", "Conv"), (irh.MINIRT_DOMAIN, "FusedConv")}
_GEMM_READERS = {("", "Gemm"), (irh.MINIRT_DOMAIN, "FusedGemm")}


def _kind(node: ir.Node) -> tuple[str, str]:
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    return domain, node.op_type


def _scalar_operand(node: ir.Node, data: ir.Value) -> float | None:
    """The constant float scalar that ``node`` (a two-input Mul / Add) combines with ``data``, or None
    when the other operand is not one, or has a rank that would broadcast ``data`` to a larger rank."""
    other = irh.other_input(node, data)
    arr = irh.const_array(other)
    if arr is None or arr.size != 1 or arr.dtype.kind != "f":
        return None
    data_rank = irh.rank(data)
    if arr.ndim > (data_rank if data_rank is not None else 1):
        return None
    return float(arr.reshape(-1)[0])


class FoldInputAffine(Pass):
    """Fold ``Mul`` / ``Add`` by constant scalars into the 1x1 Conv or Gemm layers that read the result."""

    name = "fold_input_affine"

    def run(self, model: ir.Model) -> bool:
        changed = False
        graph = model.graph
        for node in irh.live_nodes(graph):
            if node.graph is not graph or not irh.is_onnx(node, "Mul", "Add") or len(node.inputs) != 2:
                continue
            changed |= self._try(graph, node)
        return changed

    def _try(self, graph: ir.Graph, head: ir.Node) -> bool:
        """Fold the map starting at ``head`` (a Mul, with the Add after it when there is one; or an Add)."""
        for data in head.inputs:
            scale_or_shift = _scalar_operand(head, data)
            if scale_or_shift is None or data.dtype != ir.DataType.FLOAT:
                continue
            if head.op_type == "Add":
                return self._fold(graph, [head], data, 1.0, scale_or_shift)
            chain, scale, shift = [head], scale_or_shift, 0.0
            add = irh.single_use(head.outputs[0])
            if add is not None and irh.is_onnx(add, "Add") and len(add.inputs) == 2:
                t = _scalar_operand(add, head.outputs[0])
                if t is not None:
                    chain, shift = [head, add], t
            if self._fold(graph, chain, data, scale, shift):
                return True
            return len(chain) == 2 and self._fold(graph, [head], data, scale, 0.0)
        return False

    def _fold(self, graph: ir.Graph, chain: list, data: ir.Value, scale: float, shift: float) -> bool:
        """Rewrite every reader of ``chain[-1]``'s output to read ``data`` (the map's input) with folded
        weights, then drop the chain; or change nothing when some reader cannot take the map."""
        result = chain[-1].outputs[0]
        if result.is_graph_output() or any(n.outputs[0].is_graph_output() for n in chain[:-1]):
            return False
        readers = [node for node, _ in result.uses()]
        if not readers:
            return False
        pattern = "+".join(n.op_type for n in chain) + "->pointwise"
        plans = []
        for reader in readers:
            plan = self._plan(reader, result, scale, shift)
            if isinstance(plan, str):
                if _kind(reader) in _CONV_READERS | _GEMM_READERS:
                    self.refuse(pattern, reader, plan)
                return False
            plans.append((reader, plan))
        for reader, (weight, bias, attr_updates) in plans:
            self._emit(graph, reader, data, weight, bias, attr_updates)
        irh.remove_nodes(graph, list(reversed(chain)))
        return True

    def _plan(self, reader: ir.Node, result: ir.Value, scale: float, shift: float):
        """(new weight, new bias, attribute updates) for ``reader`` reading ``scale * x + shift``
        instead of ``result``, or the reason it cannot."""
        kind = _kind(reader)
        if kind not in _CONV_READERS | _GEMM_READERS:
            return f"{reader.op_type} is not a pointwise Conv or Gemm"
        if reader.inputs[0] is not result or any(v is result for v in reader.inputs[1:]):
            return "the map is not only the layer's data input"
        w = irh.const_array(reader.inputs[1]) if len(reader.inputs) > 1 else None
        if w is None or w.dtype.kind != "f":
            return "the weight is not a float constant"
        b_value = reader.inputs[2] if len(reader.inputs) > 2 else None
        b = None if b_value is None else irh.const_array(b_value)
        if b_value is not None and b is None:
            return "the bias is not a constant"
        w64 = w.astype(np.float64)
        if kind in _CONV_READERS:
            if w.ndim < 3 or any(k != 1 for k in w.shape[2:]):
                return f"kernel {list(w.shape[2:])} is not 1x1 (a padded window would read zeros, not the shift)"
            if any(int(p) != 0 for p in (irh.attr(reader, "pads", None) or ())):
                return "the conv pads its input"
            per_output = w64.reshape(w.shape[0], -1).sum(axis=1)  # over the group's input channels and taps
            base = np.zeros(w.shape[0]) if b is None else b.astype(np.float64).reshape(-1)
            return (w64 * scale).astype(w.dtype), (base + shift * per_output).astype(w.dtype), {}
        alpha = float(irh.attr(reader, "alpha", 1.0))
        beta = float(irh.attr(reader, "beta", 1.0))
        if w.ndim != 2:
            return "the Gemm weight is not a matrix"
        per_column = w64.sum(axis=1) if irh.attr(reader, "transB", 0) else w64.sum(axis=0)
        base = np.zeros(per_column.shape) if b is None else beta * b.astype(np.float64)
        return (w64 * scale).astype(w.dtype), (base + alpha * shift * per_column).astype(w.dtype), {"beta": 1.0}

    def _emit(self, graph, reader, data, weight, bias, attr_updates) -> None:
        hint = reader.inputs[1].name or "w"
        wv = irh.new_initializer(graph, weight, hint + "_affine")
        bv = irh.new_initializer(graph, bias, hint + "_affine_bias")
        inputs = [data, wv, bv] + list(reader.inputs[3:])
        folded = ir.Node(
            reader.domain,
            reader.op_type,
            inputs,
            attributes=irh.copy_attrs(reader, drop=attr_updates)
            + [ir.AttrFloat32(k, v) for k, v in attr_updates.items()],
            version=reader.version,
            name=reader.name,
            num_outputs=len(reader.outputs),
        )
        for new, old in zip(folded.outputs, reader.outputs):
            irh.copy_type(new, old)
        graph.insert_before(reader, folded)
        for new, old in zip(folded.outputs, reader.outputs):
            irh.replace_value(old, new)
        graph.remove([reader], safe=True)
