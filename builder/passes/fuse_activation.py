"""Fuse Conv/Gemm/MatMul with a following residual Add and activation, ConvTranspose with an activation.

Rules (P is Conv, Gemm or MatMul, or an already fused com.minirt
FusedConv/FusedGemm/FusedMatMul; P's output has exactly one reader):

    Add(P(...), z)         (P has no residual, no activation)  -> FusedP(..., z)
    Sum(P(...), z)         (two inputs; same)                  -> FusedP(..., z)
    act(P(...))            (P has no activation)               -> FusedP(..., activation=act)
    act(ConvTranspose(...))                                    -> FusedConvTranspose(..., activation=act)

(FusedConvTranspose has no residual input: its fast stride == kernel path
applies the activation in the GEMM epilogue, which is what pays; an Add after
a ConvTranspose stays an Add.)

so ``Relu(Add(Conv(x, w, b), z))`` becomes one ``FusedConv(x, w, b, z,
activation="Relu")`` computing ``act(conv(x, w, b) + z)`` (docs/fused_ops.md).
Activations: Relu, LeakyRelu, Clip (Relu6; constant bounds only), Sigmoid,
Tanh, HardSigmoid, HardSwish, Gelu, and com.minirt Activation (SiLU,
HardSwish, Gelu recognised from their decomposed forms by
``recognise_activations``).  An activation whose parameters are not build-time
constants (a Clip with a computed bound) is refused and reported, as is an
activation after a producer whose output has other readers.

Per-channel constant Adds after a Conv are the bias (``fuse_batchnorm``
folds those first); any other Add is a residual, whose broadcasting the
fused kernel reproduces exactly.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.passes.manager import Pass
from minirt.vocabulary import FUSABLE_ACTIVATION_OPS, FUSED_FORMS

_FUSED = dict(FUSED_FORMS)  # standard op -> its com.minirt fused form
_NO_RESIDUAL = {"ConvTranspose"}  # fused kinds without a residual input
_KIND = {v: k for k, v in _FUSED.items()}
_FLT_MAX = 3.4028234663852886e38
# The FUSABLE_ACTIVATION_OPS that are their activation with no parameter (the others read theirs
# from attributes or inputs below); tests/test_vocabulary.py checks activation_of takes each of
# FUSABLE_ACTIVATION_OPS and nothing else.
_SIMPLE = {"Relu": "Relu", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "HardSwish": "HardSwish"}


def _base(node: ir.Node):
    """(kind, core inputs, z, activation) of a fusable producer, else None."""
    if irh.is_onnx(node, *_FUSED):
        core = list(node.inputs[:3]) + [None] * (3 - min(len(node.inputs), 3))
        return node.op_type, core, None, ""
    if node.domain == irh.MINIRT_DOMAIN and node.op_type in _KIND:
        core = list(node.inputs[:3]) + [None] * (3 - min(len(node.inputs), 3))
        z = node.inputs[3] if len(node.inputs) > 3 else None
        return _KIND[node.op_type], core, z, irh.attr(node, "activation", "")
    return None


def activation_of(model: ir.Model, node: ir.Node):
    """(name, params) when ``node`` is a fusable activation; (None, reason) when it is one we refuse; None otherwise."""
    if node.domain == irh.MINIRT_DOMAIN and node.op_type == "Activation":
        return irh.attr(node, "activation", ""), tuple(irh.attr(node, "activation_params", ()) or ())
    if node.domain not in ("", "ai.onnx") or node.op_type not in FUSABLE_ACTIVATION_OPS:
        return None
    op = node.op_type
    if op in _SIMPLE:
        return _SIMPLE[op], ()
    if op == "LeakyRelu":
        return "LeakyRelu", (float(irh.attr(node, "alpha", 0.01)),)
    if op == "HardSigmoid":
        return "HardSigmoid", (float(irh.attr(node, "alpha", 0.2)), float(irh.attr(node, "beta", 0.5)))
    if op == "Gelu":
        return ("GeluTanh" if irh.attr(node, "approximate", "none") == "tanh" else "Gelu"), ()
    if op == "Clip":
        if irh.opset_of(model, node) < 11:
            return "Clip", (float(irh.attr(node, "min", -_FLT_MAX)), float(irh.attr(node, "max", _FLT_MAX)))
        bounds = []
        for i, default in ((1, -_FLT_MAX), (2, _FLT_MAX)):
            v = node.inputs[i] if len(node.inputs) > i else None
            if v is None:
                bounds.append(default)
                continue
            s = irh.scalar(v)
            if s is None:
                return None, "Clip bounds are not build-time constants"
            bounds.append(s)
        return "Clip", tuple(bounds)
    return None


class FuseActivation(Pass):
    """Fold residual Adds and activations into Conv/Gemm/MatMul as com.minirt fused ops."""

    name = "fuse_activation"

    def run(self, model: ir.Model) -> bool:
        changed = False
        graph = model.graph
        for node in irh.live_nodes(graph):
            base = _base(node)
            if base is None:
                continue
            changed |= self._try(model, graph, node, base)
        return changed

    def _try(self, model, graph, node, base) -> bool:
        kind, core, z, act = base
        y = node.outputs[0]
        if len(node.outputs) != 1 or y.is_graph_output():
            return False
        uses = list(y.uses())
        if len(uses) != 1:
            if not act:
                for user, _ in uses:
                    a = activation_of(model, user)
                    if a is not None and a[0] is not None:
                        self.refuse(f"{kind}+{a[0]}", user, f"{kind} output has {len(uses)} readers")
                        break
            return False
        user, index = uses[0]
        # Residual add
        if ((irh.is_onnx(user, "Add") or (irh.is_onnx(user, "Sum") and len(user.inputs) == 2)) and z is None and not act
                and kind not in _NO_RESIDUAL):
            other = user.inputs[1 - index]
            if other is None:
                return False
            self._emit(model, graph, node, user, kind, core, other, "", ())
            return True
        if act:
            return False
        a = activation_of(model, user)
        if a is None:
            return False
        name, params = a
        if name is None:
            self.refuse(f"{kind}+{user.op_type}", user, params)
            return False
        self._emit(model, graph, node, user, kind, core, z, name, params)
        return True

    def _emit(self, model, graph, node, user, kind, core, z, act, params) -> None:
        irh.ensure_minirt_opset(model)
        drop = ("activation", "activation_params")
        attrs = irh.copy_attrs(node, drop=drop) + [ir.AttrString("activation", act)]
        if params:
            attrs.append(ir.AttrFloat32s("activation_params", [float(np.float32(p)) for p in params]))
        inputs = list(core)
        if z is not None:
            inputs.append(z)
        while inputs and inputs[-1] is None:
            inputs.pop()
        fused = ir.Node(irh.MINIRT_DOMAIN, _FUSED[kind], inputs, attributes=attrs, name=node.name)
        out = user.outputs[0]
        fused.outputs[0].type = out.type
        fused.outputs[0].shape = out.shape
        graph.insert_before(user, fused)
        irh.replace_value(out, fused.outputs[0])
        graph.remove([user, node], safe=True)
