"""Recognise a one-hot encoding times a matrix and make it a row lookup.

Rule (jax's ``one_hot`` before a Dense layer, as jax2tf exports it: magika's byte embedding)::

    e = Equal(ids, classes)     ids int32 / int64 of shape (..., 1); classes a constant (1, ..., 1, K)
                                holding 0, 1, ..., K - 1 (either input order)
    h = Cast(e, to=float type)
    y = MatMul(h, W)            W a constant (K, D) of that float type, every value finite
    [then elementwise nodes on y whose other inputs are constants varying only along D]

        -> y' = com.minirt::RowLookup(ids, table)      table = [W; 0] (K + 1 rows), then each absorbed
                                                       elementwise node applied to the table

``RowLookup`` (docs/fused_ops.md) copies row ``ids[..., 0]`` of the table, or row K for an id that is
none of the classes: the one-hot row of such an id is all zeros, so the product is 0 there, and
whatever followed it (a bias Add, an activation) is folded into row K as into every other.  Each row of
the product is exactly a row of W (a sum of one product by 1 and of products by 0), so the lookup is
exact; a W with an infinity or NaN would make 0 * inf = NaN in the other rows' sums, and is refused.

The elementwise nodes absorbed after the MatMul (each the only reader of the value before it) are the
arithmetic ops (Add, Sub, Mul, Div), the activation and unary math ops of the vocabulary and
``com.minirt::Activation``, with every other input a constant whose shape, leading 1s dropped, is ()
or (1,) or (D,): applied to the table they compute what they would on each looked-up row.  They are
applied at build time by the runtime's own kernels (constant_folding.run_kernel).

Why: the product costs K multiply-adds per output value over a one-hot matrix of K floats per id
(magika: 2048 ids x 257 classes x 64, Equal + Cast + MatMul + bias + Gelu, ~1 ms of a ~7 ms run), the
lookup one row copy per id (D141).

Refused, with the reason in the report, once Equal -> Cast -> MatMul matched: classes that are not
0..K-1, ids without a last axis of 1 or of another type, a non-constant or non-finite W.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.passes.constant_folding import run_kernel
from minirt.builder.passes.manager import Pass
from minirt.vocabulary import ACTIVATION_OPS, ARITHMETIC, UNARY_MATH

_ID_TYPES = (ir.DataType.INT32, ir.DataType.INT64)
_FLOAT_TYPES = (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16)
_ELEMENTWISE = ARITHMETIC | ACTIVATION_OPS | UNARY_MATH


class _Refuse(Exception):
    pass


def _classes_input(equal: ir.Node) -> tuple[ir.Value, np.ndarray] | None:
    """(ids, classes array) of an Equal with one constant input, else None."""
    a, b = (list(equal.inputs) + [None, None])[:2]
    for ids, classes in ((a, b), (b, a)):
        arr = irh.const_array(classes)
        if arr is not None and not irh.is_const(ids):
            return ids, arr
    return None


def _per_column(arr: np.ndarray, d: int) -> np.ndarray | None:
    """``arr`` without its leading 1s when what is left is () or (1,) or (d,), else None."""
    shape = list(arr.shape)
    while shape and shape[0] == 1 and len(shape) > 1:
        shape.pop(0)
    if shape in ([], [1], [d]):
        return arr.reshape(shape)
    return None


class RecogniseOneHotMatMul(Pass):
    """MatMul(Cast(Equal(ids, arange(K))), W) [+ elementwise] -> com.minirt::RowLookup(ids, table)."""

    name = "recognise_one_hot_matmul"

    def run(self, model: ir.Model) -> bool:
        changed = False
        for graph in irh.graphs(model):
            for node in irh.live_nodes(graph):
                if irh.is_onnx(node, "Equal"):
                    changed |= self._try(model, graph, node)
        return changed

    def _try(self, model: ir.Model, graph: ir.Graph, equal: ir.Node) -> bool:
        cast = irh.single_use(equal.outputs[0])
        if cast is None or not irh.is_onnx(cast, "Cast"):
            return False
        matmul = irh.single_use(cast.outputs[0])
        if matmul is None or not irh.is_onnx(matmul, "MatMul") or matmul.inputs[0] is not cast.outputs[0]:
            return False
        found = _classes_input(equal)
        if found is None:
            return False
        ids, classes = found
        try:
            table = self._table(ids, classes, cast, matmul)
        except _Refuse as why:
            self.refuse("one-hot MatMul", matmul, str(why))
            return False
        # the elementwise nodes after the product, folded into the table while each is the only reader
        out, absorbed = matmul.outputs[0], []
        while True:
            user = irh.single_use(out)
            folded = None if user is None else self._fold(model, user, out, table)
            if folded is None:
                break
            table, out = folded, user.outputs[0]
            absorbed.append(user)
        irh.ensure_minirt_opset(model)
        lookup = ir.Node(irh.MINIRT_DOMAIN, "RowLookup", [ids, irh.new_initializer(graph, table, "one_hot_table")],
                         name=matmul.name)
        lookup.outputs[0].type = out.type
        lookup.outputs[0].shape = out.shape
        graph.insert_before(matmul, lookup)
        if not irh.replace_value(out, lookup.outputs[0]):
            graph.remove(lookup, safe=True)
            return False
        graph.remove(list(reversed(absorbed)) + [matmul, cast, equal], safe=True)
        return True

    @staticmethod
    def _table(ids: ir.Value, classes: np.ndarray, cast: ir.Node, matmul: ir.Node) -> np.ndarray:
        """[W; 0]: the lookup's table before any folded node; _Refuse when the pattern does not hold."""
        if ids.dtype not in _ID_TYPES:
            raise _Refuse(f"ids are {ids.dtype}, not int32 / int64")
        r = irh.rank(ids)
        if r is None or r < 1 or ids.shape[-1] != 1:
            raise _Refuse(f"ids of shape {ids.shape} have no last axis of size 1")
        k = classes.shape[-1] if classes.ndim else 1
        if classes.ndim < 1 or classes.ndim > r or any(s != 1 for s in classes.shape[:-1]):
            raise _Refuse(f"classes of shape {list(classes.shape)} are not (1, ..., 1, K) of rank <= {r}")
        if not np.array_equal(classes.reshape(-1), np.arange(k)):
            raise _Refuse("classes are not 0, 1, ..., K - 1")
        to = irh.attr(cast, "to")
        if to is None or ir.DataType(to) not in _FLOAT_TYPES:
            raise _Refuse("the one-hot is not cast to a float type")
        w = irh.const_array(matmul.inputs[1])
        if w is None or w.ndim != 2 or w.shape[0] != k:
            raise _Refuse(f"W is not a constant of shape ({k}, D)")
        if w.dtype != irh.numpy_dtype(cast.outputs[0]):
            raise _Refuse(f"W is {w.dtype}, the one-hot {irh.numpy_dtype(cast.outputs[0])}")
        if not np.isfinite(w).all():
            raise _Refuse("W holds an infinity or NaN (0 * inf is NaN in the product)")
        return np.concatenate([w, np.zeros((1, w.shape[1]), w.dtype)])

    @staticmethod
    def _fold(model: ir.Model, node: ir.Node, value: ir.Value, table: np.ndarray) -> np.ndarray | None:
        """``node`` (reading ``value``) applied to the table, or None when it cannot be folded."""
        elementwise = (irh.is_onnx(node, *_ELEMENTWISE)
                       or (node.domain == irh.MINIRT_DOMAIN and node.op_type == "Activation"))
        if not elementwise or len(node.outputs) != 1:
            return None
        inputs = []
        for v in node.inputs:
            if v is value:
                inputs.append(table)
                continue
            if v is None:
                inputs.append(None)
                continue
            arr = irh.const_array(v)
            if arr is None:
                return None
            arr = _per_column(arr, table.shape[1])
            if arr is None:
                return None
            inputs.append(arr)
        if sum(1 for v in node.inputs if v is value) != 1:
            return None
        try:
            (result,) = run_kernel(model, node, inputs)
        except Exception:  # noqa: BLE001 - a kernel refusing these inputs: the node stays
            return None
        if result.shape != table.shape or result.dtype != table.dtype:
            return None
        return np.ascontiguousarray(result)
