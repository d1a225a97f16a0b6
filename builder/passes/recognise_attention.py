"""Recognise scaled dot-product attention exported in decomposed form.

Rules (``a``, ``b``, ``c`` are one-element float constants; every value
between the first MatMul and the last is read only inside the pattern)::

    MatMul(Q [* a], KT [* b]) [* c | / c] [+ Mask] -> Softmax(last axis) -> MatMul(., V)

        -> com.minirt::ScaledDotProductAttention(Q, K, V[, Mask], scale=a*b*c (or a*b/c), transpose_k)

``KT = Transpose(K)`` swapping the last two axes (identity elsewhere) gives
``transpose_k=1`` with K the Transpose's input; any other KT (for example the
Reshape/Transpose/Reshape chain of torch's dynamo export) is passed as is with
``transpose_k=0``.  The Softmax must normalise over the last axis: ``axis=-1``
or ``axis == rank - 1`` (the rank is taken from shapes or, when shapes are
unknown, from the producers: Transpose perms, Squeeze/Unsqueeze axes,
elementwise ops).  Before opset 13 Softmax flattens the axes from ``axis`` on,
which is the same thing only for the last axis.  The mask is added with
broadcasting exactly as the Add did.  The kernel is docs/fused_ops.md's
ScaledDotProductAttention; the scale is applied once to the scores instead
of to Q and K separately (a rounding-level difference).

Not recognised (left alone, no refusal: nothing matched structurally): a
Softmax over another axis, a non-constant or multi-element scale, scores or
probabilities read elsewhere (e.g. attention weights returned as an output).
"""
from __future__ import annotations

import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.passes.manager import Pass

# Ops whose result has the broadcast rank of their inputs: a subset of the vocabulary's ELEMENTWISE
# plus Softmax and Identity (tests/test_vocabulary.py checks the subset relation).
_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Relu", "Sigmoid", "Tanh", "Neg", "Softmax", "Identity", "Cast",
                          "Erf", "Where", "Pow", "Sqrt", "Exp", "Clip"})


def _rank(v: ir.Value | None, depth: int = 16) -> int | None:
    """The rank of ``v`` from its shape or, failing that, from its producer."""
    if v is None:
        return None
    r = irh.rank(v)
    if r is not None or depth == 0:
        return r
    if irh.is_const(v):
        arr = irh.const_array(v)
        return None if arr is None else arr.ndim
    p = v.producer()
    if p is None or p.domain not in ("", "ai.onnx"):
        return None
    op = p.op_type
    if op == "Transpose":
        perm = irh.attr(p, "perm")
        return len(perm) if perm is not None else _rank(p.inputs[0], depth - 1)
    if op in ("Squeeze", "Unsqueeze"):
        axes = irh.attr(p, "axes")
        if axes is None and len(p.inputs) > 1 and p.inputs[1] is not None:
            arr = irh.const_array(p.inputs[1])
            axes = None if arr is None else arr.reshape(-1).tolist()
        if axes is None:
            return None
        r = _rank(p.inputs[0], depth - 1)
        if r is None:
            return None
        return r - len(axes) if op == "Squeeze" else r + len(axes)
    if op == "Slice":
        return _rank(p.inputs[0], depth - 1)
    if op == "MatMul":
        ra, rb = _rank(p.inputs[0], depth - 1), _rank(p.inputs[1], depth - 1)
        if ra is None or rb is None or ra < 2 or rb < 2:
            return None
        return max(ra, rb)
    if op in _ELEMENTWISE:
        ranks = [_rank(i, depth - 1) for i in p.inputs if i is not None]
        if op == "Clip":
            ranks = ranks[:1]
        return None if not ranks or None in ranks else max(ranks)
    return None


def _single_reader(v: ir.Value) -> ir.Node | None:
    if v.is_graph_output():
        return None
    readers = {id(n): n for n, _ in v.uses()}
    return next(iter(readers.values())) if len(readers) == 1 else None


def _scalar_const(v: ir.Value | None) -> float | None:
    arr = irh.const_array(v)
    if arr is None or arr.size != 1 or arr.dtype.kind != "f":
        return None
    return float(arr.reshape(-1)[0])


def _strip_scale(v: ir.Value, consumer: ir.Node):
    """(value, factor, node) when ``v`` = Mul(w, c) read only by ``consumer``; else (v, 1.0, None)."""
    p = v.producer()
    if p is None or not irh.is_onnx(p, "Mul") or _single_reader(v) is not consumer or len(p.inputs) != 2:
        return v, 1.0, None
    for side in (0, 1):
        c = _scalar_const(p.inputs[1 - side])
        arr = irh.const_array(p.inputs[1 - side])
        if c is not None and arr.ndim <= 1 and not irh.is_const(p.inputs[side]):
            return p.inputs[side], c, p
    return v, 1.0, None


class RecogniseAttention(Pass):
    """Replace MatMul -> scale -> [mask] -> Softmax -> MatMul by one ScaledDotProductAttention."""

    name = "recognise_attention"

    def run(self, model: ir.Model) -> bool:
        changed = False
        graph = model.graph
        for node in irh.live_nodes(graph):
            if irh.is_onnx(node, "Softmax"):
                match = self._match(model, node)
                if match is not None:
                    self._emit(model, graph, *match)
                    changed = True
        return changed

    def _match(self, model, softmax):
        opset = irh.opset_of(model, softmax)
        axis = int(irh.attr(softmax, "axis", -1 if opset >= 13 else 1))
        s = softmax.inputs[0]
        if axis != -1:
            r = _rank(s)
            if r is None or axis != r - 1:
                return None
        p = softmax.outputs[0]
        mm2 = _single_reader(p)
        if mm2 is None or not irh.is_onnx(mm2, "MatMul") or mm2.inputs[0] is not p:
            return None
        v = mm2.inputs[1]
        nodes = [softmax, mm2]
        scale = 1.0
        mask = None
        cur, consumer = s, softmax
        prod = cur.producer()
        if prod is not None and irh.is_onnx(prod, "Add") and _single_reader(cur) is consumer:
            found = False
            for side in (0, 1):
                t = prod.inputs[side]
                tp = t.producer() if t is not None else None
                if tp is not None and irh.is_onnx(tp, "MatMul", "Mul", "Div") and _single_reader(t) is prod:
                    if tp.op_type == "MatMul" or _scalar_const(tp.inputs[1]) is not None or (
                            tp.op_type == "Mul" and _scalar_const(tp.inputs[0]) is not None):
                        mask = prod.inputs[1 - side]
                        cur, consumer = t, prod
                        nodes.append(prod)
                        found = True
                        break
            if not found:
                return None
        prod = cur.producer()
        if prod is not None and irh.is_onnx(prod, "Mul", "Div") and _single_reader(cur) is consumer:
            if prod.op_type == "Div":
                c = _scalar_const(prod.inputs[1])
                if c is None or c == 0.0 or irh.const_array(prod.inputs[1]).ndim > 1:
                    return None
                scale /= c
                cur = prod.inputs[0]
            else:
                w, c, _ = _strip_scale(cur, consumer)
                if c == 1.0 and w is cur:
                    return None
                scale *= c
                cur = w
            nodes.append(prod)
            consumer = prod
        mm1 = cur.producer()
        if mm1 is None or not irh.is_onnx(mm1, "MatMul") or _single_reader(cur) is not consumer:
            return None
        nodes.append(mm1)
        q, a, qn = _strip_scale(mm1.inputs[0], mm1)
        kt, b, kn = _strip_scale(mm1.inputs[1], mm1)
        scale *= a * b
        nodes += [n for n in (qn, kn) if n is not None]
        k, transpose_k = kt, 0
        tp = kt.producer()
        if tp is not None and irh.is_onnx(tp, "Transpose") and _single_reader(kt) is (kn or mm1):
            perm = irh.attr(tp, "perm")
            if perm is not None and len(perm) >= 2 and list(perm) == list(range(len(perm) - 2)) + [len(perm) - 1, len(perm) - 2]:
                k, transpose_k = tp.inputs[0], 1
                nodes.append(tp)
        for x in (q, k, v):
            if x is None or (x.dtype is not None and x.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE)):
                return None
        return q, k, v, mask, scale, transpose_k, mm2, nodes

    def _emit(self, model, graph, q, k, v, mask, scale, transpose_k, root, nodes) -> None:
        irh.ensure_minirt_opset(model)
        inputs = [q, k, v] + ([mask] if mask is not None else [])
        new = ir.Node(irh.MINIRT_DOMAIN, "ScaledDotProductAttention", inputs,
                      attributes=[ir.AttrFloat32("scale", float(scale)), ir.AttrInt64("transpose_k", transpose_k)],
                      name=root.name)
        out = root.outputs[0]
        new.outputs[0].type = out.type
        new.outputs[0].shape = out.shape
        graph.insert_before(root, new)
        irh.replace_value(out, new.outputs[0])
        graph.remove(nodes, safe=True)
