"""Constant folding, executed with minirt's own CPU kernels.

Rules:

* in models of IR version < 4, initializers that are also listed as graph
  inputs are constants: IR 3 required every initializer to be listed as an
  input, so the listing says nothing about intent to override.  They are
  dropped from the inputs (IR >= 4 models keep them overridable, unfolded);
* ``Constant`` nodes become initializers (their data is already in the model,
  so no size cap applies);
* a node whose inputs are all constants (initializers that are not graph
  inputs; absent optional inputs are fine) is run once with the kernel the
  runtime would use, ``minirt.kernels.lookup(domain, op_type, opset)``, and
  its outputs become initializers.  Folding therefore cannot disagree with
  execution;
* shape computations fold once shapes are known: ``Shape(x)`` and ``Size(x)``
  of a statically shaped ``x`` become constants, and so do
  ``Gather(Shape(x), i)`` and ``Slice(Shape(x), ...)`` when the dimensions
  they pick are static even if others (say the batch) are symbolic;
* never folded: nodes holding subgraphs, random generators, nodes without a
  kernel, string outputs, and nodes whose result would grow the model by
  more than ``OptimizeContext.fold_size_limit`` bytes (a ``ConstantOfShape``
  of 400 MB stays a node).  A refusal for size is reported.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.passes.manager import Pass
from minirt.dtypes import ONNX_TO_NUMPY
from minirt.kernels.registry import NodeContext, lookup
from minirt.vocabulary import RANDOM

_NEVER_FOLD = RANDOM | {"Constant"}  # a draw must stay a draw; a Constant is already folded


def _keeps_weights_narrow(node: ir.Node) -> bool:
    """DequantizeLinear of an integer initializer and Cast from float16 stay unfolded.

    Folding them would store the weights widened to float32: the artifact
    would lose the 2-4x size reduction that quantization (ours, or a QDQ model
    from onnxruntime's tool) is for.  # DQ(int8 W) -> keep, Cast(f16 W) -> keep
    """
    if node.domain not in ("", "ai.onnx") or not node.inputs or node.inputs[0] is None:
        return False
    src = node.inputs[0]
    if src.const_value is None or src.dtype is None:
        return False
    if node.op_type == "DequantizeLinear":
        return src.dtype not in (ir.DataType.FLOAT, ir.DataType.DOUBLE)
    if node.op_type == "Cast":
        return src.dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
    return False


def attribute_kwargs(node: ir.Node) -> dict:
    """Node attributes as the Python values a kernel receives (same as the runtime's plan)."""
    out = {}
    for name, a in node.attributes.items():
        t, v = a.type, a.value
        if t == ir.AttributeType.TENSOR:
            v = v.numpy()
        elif t == ir.AttributeType.TENSORS:
            v = tuple(x.numpy() for x in v)
        elif t in (ir.AttributeType.INTS,):
            v = tuple(int(x) for x in v)
        elif t in (ir.AttributeType.FLOATS,):
            v = tuple(float(x) for x in v)
        elif t == ir.AttributeType.STRINGS:
            v = tuple(x.decode() if isinstance(x, bytes) else x for x in v)
        elif t == ir.AttributeType.STRING:
            v = v.decode() if isinstance(v, bytes) else v
        elif t == ir.AttributeType.FLOAT:
            v = float(v)
        elif t == ir.AttributeType.INT:
            v = int(v)
        else:
            raise ValueError(f"attribute {name!r} of type {t.name} cannot be passed to a kernel")
        out[name] = v
    return out


def run_kernel(model: ir.Model, node: ir.Node, inputs: list) -> tuple:
    """Run ``node`` on numpy ``inputs`` with minirt's kernel; returns a tuple of outputs."""
    opset = irh.opset_of(model, node)
    entry = lookup(node.domain, node.op_type, opset)
    if entry is None:
        raise LookupError(f"no kernel for {node.domain or 'ai.onnx'}::{node.op_type} at opset {opset}")
    kwargs = attribute_kwargs(node)
    if entry.context:
        dtypes = tuple(ONNX_TO_NUMPY.get(int(v.dtype.value)) if v.dtype is not None else None for v in node.outputs)
        kwargs["ctx"] = NodeContext(node.name or node.op_type, node.op_type, len(node.outputs), dtypes, opset)
    result = entry.fn(*inputs, **kwargs)
    if not isinstance(result, (tuple, list)):
        result = (result,)
    return tuple(np.asarray(r) for r in result)


def _expected_bytes(node: ir.Node, inputs: list) -> int | None:
    """Size of the result, when it can be known without running the node."""
    total = 0
    for v in node.outputs:
        shape, dtype = irh.static_shape(v), irh.numpy_dtype(v)
        if shape is None or dtype is None or dtype == object:
            break
        total += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    else:
        return total
    if node.op_type == "ConstantOfShape" and inputs and inputs[0] is not None:
        return int(np.prod(inputs[0], dtype=np.int64)) * 8
    if node.op_type == "Expand" and len(inputs) == 2:
        try:
            return int(np.prod(np.broadcast_shapes(inputs[0].shape, tuple(int(d) for d in inputs[1])))) * inputs[0].itemsize
        except ValueError:
            return None
    if node.op_type == "Tile" and len(inputs) == 2:
        return int(inputs[0].size * np.prod(inputs[1], dtype=np.int64)) * inputs[0].itemsize
    return None


def _shape_dims(value: ir.Value) -> list | None:
    """Dimensions of ``value`` as ints where static and None where not."""
    if value is None or value.shape is None:
        return None
    return [d if isinstance(d, int) and d >= 0 else None for d in value.shape]


def _shape_op_dims(node: ir.Node) -> list | None:
    """What Shape(x) computes, with None for dims unknown at build time."""
    dims = _shape_dims(node.inputs[0])
    if dims is None:
        return None
    r = len(dims)
    start = irh.attr(node, "start", 0)
    end = irh.attr(node, "end", r)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    return dims[start:end]


def promote_initializer_inputs(model: ir.Model) -> bool:
    """IR < 4: initializers listed as graph inputs stop being inputs (they are constants)."""
    if model.ir_version is None or model.ir_version >= 4:
        return False
    changed = False
    for graph in irh.graphs(model):
        keep = [v for v in graph.inputs if not (v.name in graph.initializers and graph.initializers[v.name] is v)]
        if len(keep) != len(graph.inputs):
            graph.inputs[:] = keep
            changed = True
    return changed


class ConstantFolding(Pass):
    """Lift Constant nodes, evaluate all-constant nodes, fold static shape computations."""

    name = "constant_folding"

    def run(self, model: ir.Model) -> bool:
        self._model = model
        changed = promote_initializer_inputs(model)
        for graph in list(irh.graphs(model)):
            for node in irh.live_nodes(graph):
                if irh.is_onnx(node, "Constant"):
                    changed |= self._lift_constant(graph, node)
                elif irh.is_onnx(node, "Shape", "Size"):
                    changed |= self._fold_shape(graph, node)
                else:
                    changed |= self._fold(model, graph, node)
        return changed

    # ------------------------------------------------------------------ helpers
    def _replace_with_arrays(self, graph: ir.Graph, node: ir.Node, arrays) -> bool:
        outs = list(node.outputs)
        news = []  # unused (optional) outputs get no initializer
        for v, arr in zip(outs, arrays):
            if not (v.uses() or v.is_graph_output()):
                news.append(None)
                continue
            if arr.dtype == object or arr.dtype.kind not in "fiub":
                return False
            expected = irh.numpy_dtype(v)
            if expected is not None and arr.dtype != expected:
                arr = arr.astype(expected)
            news.append(arr)
        for v, arr in zip(outs, news):
            if arr is None:
                continue
            init = irh.new_initializer(graph, arr, (v.name or "folded") + "_const")
            if not irh.replace_value(v, init):
                return False
        for v in outs:
            if v.uses() or v.is_graph_output():
                return True  # partially replaced; DCE will not remove the node
        graph.remove(node, safe=True)
        return True

    def _lift_constant(self, graph: ir.Graph, node: ir.Node) -> bool:
        out = node.outputs[0]
        tensor = irh.const_tensor(out)
        if tensor is None:
            return False
        try:
            arr = tensor.numpy()
        except Exception:  # noqa: BLE001
            return False
        if arr.dtype.kind in "USO":
            return False  # string constants stay nodes; minirt writes them as object tensors either way
        return self._replace_with_arrays(graph, node, [np.asarray(arr)])

    def _fold_shape(self, graph: ir.Graph, node: ir.Node) -> bool:
        if node.op_type == "Size":
            dims = _shape_dims(node.inputs[0])
            if dims is None or None in dims:
                return self._fold(self._model, graph, node) if irh.is_const(node.inputs[0]) else False
            return self._replace_with_arrays(graph, node, [np.array(int(np.prod(dims)), dtype=np.int64)])
        dims = _shape_op_dims(node)
        if dims is None:
            return False
        if None not in dims:
            return self._replace_with_arrays(graph, node, [np.array(dims, dtype=np.int64)])
        # Partially static: fold the consumers that only pick static dims.
        changed = False
        for consumer in list(node.outputs[0].consumers()):
            picked = _pick(consumer, node.outputs[0], dims)
            if picked is not None:
                changed |= self._replace_with_arrays(graph, consumer, [picked])
        return changed

    def _fold(self, model: ir.Model, graph: ir.Graph, node: ir.Node) -> bool:
        if node.op_type in _NEVER_FOLD or irh.has_subgraph(node) or not node.inputs:
            return False
        if not any(v.uses() or v.is_graph_output() for v in node.outputs):
            return False  # dead: DCE's job
        if _keeps_weights_narrow(node):
            return False
        if any(v.type is not None and not isinstance(v.type, ir.TensorType) for v in node.outputs):
            return False  # sequences and optionals have no initializer form
        inputs = []
        for v in node.inputs:
            if v is None:
                inputs.append(None)
                continue
            arr = irh.const_array(v)
            if arr is None:
                return False
            inputs.append(arr)
        limit = self.context.fold_size_limit
        in_bytes = sum(a.nbytes for a in inputs if a is not None)
        expected = _expected_bytes(node, inputs)
        if expected is not None and expected - in_bytes > limit:
            self.refuse("fold", node, f"result of {expected} bytes would grow the model past the fold cap ({limit} bytes)")
            return False
        try:
            arrays = run_kernel(model, node, inputs)
        except Exception as exc:  # noqa: BLE001 - a kernel refusing to run is not a build error here
            self.refuse("fold", node, f"kernel failed: {type(exc).__name__}: {exc}")
            return False
        out_bytes = sum(a.nbytes for a in arrays)
        if out_bytes - in_bytes > limit:
            self.refuse("fold", node, f"result of {out_bytes} bytes would grow the model past the fold cap ({limit} bytes)")
            return False
        return self._replace_with_arrays(graph, node, arrays)


def _pick(consumer: ir.Node, shape_value: ir.Value, dims: list) -> np.ndarray | None:
    """The constant a Gather/Slice of a partially static shape computes, if static."""
    if consumer.domain not in ("", "ai.onnx") or consumer.inputs[0] is not shape_value:
        return None
    r = len(dims)
    if consumer.op_type == "Gather":
        if irh.attr(consumer, "axis", 0) != 0:
            return None
        idx = irh.const_array(consumer.inputs[1])
        if idx is None:
            return None
        flat = [int(i) + r if int(i) < 0 else int(i) for i in idx.reshape(-1)]
        if any(not 0 <= i < r for i in flat) or any(dims[i] is None for i in flat):
            return None
        return np.array([dims[i] for i in flat], dtype=np.int64).reshape(idx.shape)
    if consumer.op_type == "Slice" and len(consumer.inputs) >= 3:
        arrs = [irh.const_array(v) if v is not None else None for v in consumer.inputs[1:]]
        if arrs[0] is None or arrs[1] is None or any(a is None for a, v in zip(arrs[2:], consumer.inputs[3:]) if v is not None):
            return None
        axes = arrs[2] if len(arrs) > 2 and arrs[2] is not None else np.array([0])
        steps = arrs[3] if len(arrs) > 3 and arrs[3] is not None else np.array([1])
        if axes.reshape(-1).tolist() not in ([0], [-1]) or arrs[0].size != 1:
            return None
        s, e, st = int(arrs[0].reshape(-1)[0]), int(arrs[1].reshape(-1)[0]), int(steps.reshape(-1)[0])
        picked = list(range(r))[slice(*slice(s, e, st).indices(r))] if st != 0 else None
        if picked is None or any(dims[i] is None for i in picked):
            return None
        return np.array([dims[i] for i in picked], dtype=np.int64)
    return None
