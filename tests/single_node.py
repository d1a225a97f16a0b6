"""One-node models for the property tests (tests/test_attribute_extremes.py,
tests/test_window_geometry_limits.py): the same node as a minirt artifact, written straight through the
writer (no builder: nothing is checked or folded on the way), and as an ONNX model for the references."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx.reference import ReferenceEvaluator

from minirt.builder.writer import ArtifactWriter
from minirt.format import schema as S


def _encoded(name: str, value) -> tuple:
    """(name, kind, value) of an attribute given as an int, a float, a str, or a list of ints or floats."""
    if isinstance(value, (bool, int, np.integer)):
        return name, S.ATTR_INT, int(value)
    if isinstance(value, (float, np.floating)):
        return name, S.ATTR_FLOAT, float(value)
    if isinstance(value, str):
        return name, S.ATTR_STRING, value.encode()
    if all(isinstance(e, (int, np.integer)) for e in value):
        return name, S.ATTR_INTS, tuple(int(e) for e in value)
    return name, S.ATTR_FLOATS, tuple(float(e) for e in value)


def artifact(op: str, x: np.ndarray, consts, attrs: dict, opset: int, n_out: int = 1) -> bytes:
    """``op(x, *consts)`` with ``attrs`` (ints, floats, strings, lists of ints or of floats) as .mrt
    bytes: input "x" (of x's dtype and shape), initializers "c0", "c1", ... (a None const is an absent
    optional input), outputs "y0", "y1", ..."""
    w = ArtifactWriter()
    w.opsets[""] = opset
    o = w.operator("", op, opset)
    _, g = w.graph("g")
    xv = g.value("x", h.np_dtype_to_tensor_dtype(x.dtype), x.shape)
    g.inputs.append(xv)
    ins = [xv]
    for i, c in enumerate(consts):
        if c is None:
            ins.append(-1)
            continue
        v = g.value(f"c{i}")
        g.initializers.append((v, w.tensor(c)))
        ins.append(v)
    outs = [g.value(f"y{i}") for i in range(n_out)]
    g.add_node("n", o, ins, outs, [_encoded(k, v) for k, v in attrs.items()])
    g.outputs.extend(outs)
    return w.to_bytes()


def reference(op: str, x: np.ndarray, consts, attrs: dict, opset: int, out_types=(TP.FLOAT,)) -> list | None:
    """The same node's outputs (one per entry of ``out_types``) by :func:`reference_outputs`."""
    names = ["" if c is None else f"c{i}" for i, c in enumerate(consts)]
    outs = [f"y{i}" for i in range(len(out_types))]
    graph = h.make_graph([h.make_node(op, ["x", *names], outs, **attrs)], "g",
                         [h.make_tensor_value_info("x", h.np_dtype_to_tensor_dtype(x.dtype), x.shape)],
                         [h.make_tensor_value_info(o, t, None) for o, t in zip(outs, out_types)],
                         [onnx.numpy_helper.from_array(c, n) for c, n in zip(consts, names) if c is not None])
    return reference_outputs(h.make_model(graph, opset_imports=[h.make_opsetid("", opset)]), {"x": x})


def reference_outputs(model: onnx.ModelProto, feed: dict) -> list | None:
    """The model's outputs by onnxruntime, or by onnx's reference evaluator when onnxruntime refuses the model
    (the evaluator differs from onnxruntime on some ops, LRN for one); None when both refuse it."""
    import onnxruntime as ort

    try:
        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    except Exception:  # noqa: BLE001 - onnxruntime refuses it: ask the evaluator
        pass
    try:
        return ReferenceEvaluator(model).run(None, feed)
    except Exception:  # noqa: BLE001 - both refuse it
        return None
