"""Recognise activations exported in decomposed form.

Rules (every intermediate value has exactly one reader; constants are
compared with a relative tolerance of 1e-3, matching exporters' rounding):

    Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6)     -> Activation[HardSwish](x)
    Mul(Mul(x, Clip(Add(x, 3), 0, 6)), 1/6)   -> Activation[HardSwish](x)
    Mul(x, Div(Clip(Add(x, 3), 0, 6), 6))     -> Activation[HardSwish](x)
    Mul(x, HardSigmoid(x, 1/6, 1/2))          -> Activation[HardSwish](x)
    Mul(x, Sigmoid(x))                        -> Activation[SiLU](x)
    x * 0.5 * (1 + Erf(x / sqrt(2)))          -> Activation[Gelu](x)      (any grouping of the two Muls;
                                                                           x * (1/sqrt 2) accepted too)
    x * 0.5 * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
                                              -> Activation[GeluTanh](x)  (the same tail; x^3 as Pow(x, 3)
                                                                           or any product of three x and
                                                                           constants: jax2tf's 0.044715 * x
                                                                           * x * x, torch's Pow)

A one-element constant of higher rank than x would broadcast x's shape up: no match then.

``Activation`` is the com.minirt op (docs/fused_ops.md); ``fuse_activation``
then folds it into a preceding Conv/Gemm/MatMul.  Models at opset >= 14/20
could use ONNX HardSwish/Gelu instead; one op for every opset keeps the
runtime's kernel table small.
"""
from __future__ import annotations

import math

import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.passes.manager import Pass


def _close(v: float | None, want: float) -> bool:
    return v is not None and math.isclose(v, want, rel_tol=1e-3, abs_tol=1e-6)


def _producer(v: ir.Value | None, *ops: str) -> ir.Node | None:
    if v is None:
        return None
    p = v.producer()
    return p if p is not None and irh.is_onnx(p, *ops) else None


def _only_reader(v: ir.Value) -> ir.Node | None:
    return irh.single_use(v)


def _input_beside(node: ir.Node, want: float) -> ir.Value | None:
    """The input of two-input ``node`` whose other input is a one-element constant close to ``want``."""
    for side in (0, 1):
        if _close(irh.scalar(node.inputs[1 - side]), want):
            return node.inputs[side]
    return None


def _constants_fit(nodes: list[ir.Node], x: ir.Value) -> bool:
    """Whether no constant input of ``nodes`` has more dimensions than ``x`` (a (1, 1, 1) one beside
    a rank-2 x makes the subgraph's result rank 3, the activation's rank 2)."""
    rank = len(x.shape) if x.shape is not None else 0
    for node in nodes:
        for v in node.inputs:
            arr = irh.const_array(v)
            if arr is not None and arr.ndim > rank:
                return False
    return True


def _clip_bounds(model: ir.Model, node: ir.Node):
    if irh.opset_of(model, node) < 11:
        return irh.attr(node, "min"), irh.attr(node, "max")
    lo = irh.scalar(node.inputs[1]) if len(node.inputs) > 1 else None
    hi = irh.scalar(node.inputs[2]) if len(node.inputs) > 2 else None
    return lo, hi


def _monomial(v: ir.Value, x: ir.Value, depth: int = 0):
    """``(power, coefficient, nodes)`` when ``v`` is ``coefficient * x ** power`` computed by Mul and Pow
    nodes (integer exponents) from x and one-element constants, each node's output read once; None
    otherwise.  ``nodes`` are those nodes (x's own producer is not one)."""
    if v is x:
        return 1, 1.0, []
    c = irh.scalar(v)
    if c is not None:
        return 0, c, []
    p = _producer(v, "Mul", "Pow")
    if p is None or depth > 8 or _only_reader(v) is None:
        return None
    if p.op_type == "Pow":
        e = irh.scalar(p.inputs[1])
        base = _monomial(p.inputs[0], x, depth + 1)
        if e is None or e != int(e) or not 1 <= e <= 8 or base is None:
            return None
        return base[0] * int(e), base[1] ** int(e), base[2] + [p]
    a, b = _monomial(p.inputs[0], x, depth + 1), _monomial(p.inputs[1], x, depth + 1)
    if a is None or b is None:
        return None
    return a[0] + b[0], a[1] * b[1], a[2] + b[2] + [p]


class RecogniseActivations(Pass):
    """Replace decomposed HardSwish, SiLU and Gelu (erf or tanh) subgraphs by one com.minirt Activation."""

    name = "recognise_activations"

    def run(self, model: ir.Model) -> bool:
        changed = False
        graph = model.graph
        for node in irh.live_nodes(graph):
            match = None
            if irh.is_onnx(node, "Clip"):
                match = self._hard_swish_clip(model, node)
            elif irh.is_onnx(node, "HardSigmoid", "Sigmoid"):
                match = self._gate(node)
            elif irh.is_onnx(node, "Erf"):
                match = self._gelu(node)
            elif irh.is_onnx(node, "Tanh"):
                match = self._gelu_tanh(node)
            if match is not None and not _constants_fit(match[3], match[0]):
                match = None
            if match is not None:
                x, act, root, nodes = match
                self._emit(model, graph, x, act, root, nodes)
                changed = True
        return changed

    # x * gate(x)
    def _gate(self, node):
        x = node.inputs[0]
        if node.op_type == "HardSigmoid":
            if not (_close(irh.attr(node, "alpha", 0.2), 1 / 6) and _close(irh.attr(node, "beta", 0.5), 0.5)):
                return None
            act = "HardSwish"
        else:
            act = "SiLU"
        mul = _only_reader(node.outputs[0])
        if mul is None or not irh.is_onnx(mul, "Mul") or irh.other_input(mul, node.outputs[0]) is not x:
            return None
        return x, act, mul, [node, mul]

    def _hard_swish_clip(self, model, clip):
        lo, hi = _clip_bounds(model, clip)
        if not (_close(lo, 0.0) and _close(hi, 6.0)):
            return None
        add = _producer(clip.inputs[0], "Add")
        if add is None or _only_reader(add.outputs[0]) is not clip:
            return None
        x = _input_beside(add, 3.0)
        if x is None:
            return None
        r = _only_reader(clip.outputs[0])
        if r is None:
            return None
        if irh.is_onnx(r, "Mul") and irh.other_input(r, clip.outputs[0]) is x:
            # x * clip, then / 6 or * 1/6
            post = _only_reader(r.outputs[0])
            if post is None:
                return None
            c = irh.other_input(post, r.outputs[0])
            if irh.is_onnx(post, "Div") and post.inputs[0] is r.outputs[0] and _close(irh.scalar(c), 6.0):
                return x, "HardSwish", post, [add, clip, r, post]
            if irh.is_onnx(post, "Mul") and _close(irh.scalar(c), 1 / 6):
                return x, "HardSwish", post, [add, clip, r, post]
            return None
        if (irh.is_onnx(r, "Div") and r.inputs[0] is clip.outputs[0] and _close(irh.scalar(r.inputs[1]), 6.0)) or (
            irh.is_onnx(r, "Mul") and _close(irh.scalar(irh.other_input(r, clip.outputs[0])), 1 / 6)
        ):
            mul = _only_reader(r.outputs[0])
            if mul is not None and irh.is_onnx(mul, "Mul") and irh.other_input(mul, r.outputs[0]) is x:
                return x, "HardSwish", mul, [add, clip, r, mul]
        return None

    def _gelu(self, erf):
        pre = _producer(erf.inputs[0], "Div", "Mul")
        if pre is None or _only_reader(pre.outputs[0]) is not erf:
            return None
        c = irh.scalar(pre.inputs[1])
        if pre.op_type == "Div":
            if not _close(c, math.sqrt(2)):
                return None
            x = pre.inputs[0]
        else:
            x = _input_beside(pre, 1 / math.sqrt(2))
            if x is None:
                return None
        tail = self._gelu_tail(x, erf)
        if tail is None:
            return None
        root, nodes = tail
        return x, "Gelu", root, [pre, erf] + nodes

    def _gelu_tanh(self, tanh):
        pre = _producer(tanh.inputs[0], "Mul")  # sqrt(2/pi) * inner
        if pre is None or _only_reader(pre.outputs[0]) is not tanh:
            return None
        inner = _input_beside(pre, math.sqrt(2 / math.pi))
        add = _producer(inner, "Add")  # x + 0.044715 x^3
        if add is None or _only_reader(inner) is not pre:
            return None
        for side in (0, 1):
            x, cube = add.inputs[side], add.inputs[1 - side]
            if cube is x or _only_reader(cube) is not add:
                continue
            term = _monomial(cube, x)
            if term is None or term[0] != 3 or not _close(term[1], 0.044715):
                continue
            tail = self._gelu_tail(x, tanh)
            if tail is None:
                return None
            root, nodes = tail
            return x, "GeluTanh", root, term[2] + [add, pre, tanh] + nodes
        return None

    @staticmethod
    def _gelu_tail(x, fn):
        """``(root, nodes)`` when ``fn``'s output t goes on as x * 0.5 * (1 + t), in any grouping of the
        two Muls; ``root`` computes the result."""
        add = _only_reader(fn.outputs[0])
        if add is None or not irh.is_onnx(add, "Add") or not _close(irh.scalar(irh.other_input(add, fn.outputs[0])), 1.0):
            return None
        m1 = _only_reader(add.outputs[0])
        if m1 is None or not irh.is_onnx(m1, "Mul"):
            return None
        o = irh.other_input(m1, add.outputs[0])
        nodes = [add, m1]
        if o is x:  # (x * t) * 0.5
            m2 = _only_reader(m1.outputs[0])
            if m2 is not None and irh.is_onnx(m2, "Mul") and _close(irh.scalar(irh.other_input(m2, m1.outputs[0])), 0.5):
                return m2, nodes + [m2]
            return None
        if _close(irh.scalar(o), 0.5):  # (t * 0.5) * x
            m2 = _only_reader(m1.outputs[0])
            if m2 is not None and irh.is_onnx(m2, "Mul") and irh.other_input(m2, m1.outputs[0]) is x:
                return m2, nodes + [m2]
            return None
        half = _producer(o, "Mul")  # (x * 0.5) * t
        if half is not None and _only_reader(o) is m1:
            hx = irh.other_input(half, x)
            if hx is not None and _close(irh.scalar(hx), 0.5):
                return m1, nodes + [half]
        return None

    def _emit(self, model, graph, x, act, root, nodes) -> None:
        irh.ensure_minirt_opset(model)
        new = ir.Node(irh.MINIRT_DOMAIN, "Activation", [x], attributes=[ir.AttrString("activation", act)],
                      name=root.name)
        out = root.outputs[0]
        new.outputs[0].type = out.type
        new.outputs[0].shape = out.shape
        graph.insert_before(root, new)
        irh.replace_value(out, new.outputs[0])
        graph.remove(nodes, safe=True)
