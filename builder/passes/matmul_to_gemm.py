"""MatMul + Add -> Gemm.

Rule:

    Add(MatMul(a, b), c) -> Gemm(a, b, c)

when ``a`` and ``b`` are known to be 2-D, the MatMul output has no other
reader, and ``c`` is a constant that Gemm's unidirectional broadcast accepts
without changing the result's shape: a scalar, ``(N,)``, ``(1, N)`` or
``(M, N)`` (N, M static).  Gemm then runs one BLAS call with the bias added
in place, and can take a following BatchNormalization/activation fusion.
Anything else (batched MatMul, a computed bias) is left for
``fuse_activation``, which folds the Add into a FusedMatMul as a residual.
"""
from __future__ import annotations

import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.passes.manager import Pass


class MatMulAddToGemm(Pass):
    """Turn a 2-D MatMul followed by a constant bias Add into Gemm."""

    name = "matmul_to_gemm"

    def run(self, model: ir.Model) -> bool:
        changed = False
        graph = model.graph
        for node in irh.live_nodes(graph):
            if not irh.is_onnx(node, "MatMul"):
                continue
            y = node.outputs[0]
            user = irh.single_use(y)
            if user is None or not irh.is_onnx(user, "Add"):
                continue
            a, b = node.inputs
            c = user.inputs[1] if user.inputs[0] is y else user.inputs[0]
            carr = irh.const_array(c)
            if carr is None:
                continue
            if irh.rank(a) != 2 or irh.rank(b) != 2:
                self.refuse("MatMul+Add", user, "MatMul operands are not known to be 2-D")
                continue
            bshape, ashape = b.shape, a.shape
            n = bshape[1] if isinstance(bshape[1], int) else None
            m = ashape[0] if isinstance(ashape[0], int) else None
            ok = carr.ndim == 0 or carr.size == 1 and carr.ndim <= 2
            ok = ok or (n is not None and carr.shape in ((n,), (1, n)))
            ok = ok or (n is not None and m is not None and carr.shape == (m, n))
            if not ok:
                self.refuse("MatMul+Add", user, f"bias shape {carr.shape} is not a Gemm bias for a {m}x{n} result")
                continue
            if irh.opset_of(model, node) < 7:
                continue
            if a.dtype is not None and a.dtype not in (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16):
                continue
            gemm = ir.Node("", "Gemm", [a, b, c], name=node.name)
            out = user.outputs[0]
            gemm.outputs[0].type = out.type
            gemm.outputs[0].shape = out.shape
            graph.insert_before(user, gemm)
            irh.replace_value(out, gemm.outputs[0])
            graph.remove([user, node], safe=True)
            changed = True
        return changed
