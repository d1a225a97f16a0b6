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


def artifact(op: str, x: np.ndarray, consts, attrs: dict, opset: int, n_out: int = 1) -> bytes:
    """``op(x, *consts)`` with ``attrs`` (ints or lists of ints) as .mrt bytes: input "x" (float32),
    initializers "c0", "c1", ..., outputs "y0", "y1", ..."""
    w = ArtifactWriter()
    w.opsets[""] = opset
    o = w.operator("", op, opset)
    _, g = w.graph("g")
    xv = g.value("x", 1, x.shape)
    g.inputs.append(xv)
    ins = [xv]
    for i, c in enumerate(consts):
        v = g.value(f"c{i}")
        g.initializers.append((v, w.tensor(c)))
        ins.append(v)
    outs = [g.value(f"y{i}") for i in range(n_out)]
    encoded = [(k, S.ATTR_INT, int(v)) if isinstance(v, int) else (k, S.ATTR_INTS, tuple(int(e) for e in v))
               for k, v in attrs.items()]
    g.add_node("n", o, ins, outs, encoded)
    g.outputs.extend(outs)
    return w.to_bytes()


def reference(op: str, x: np.ndarray, consts, attrs: dict, opset: int, out_types=(TP.FLOAT,)) -> list | None:
    """The same node's outputs (one per entry of ``out_types``) by :func:`reference_outputs`."""
    names = [f"c{i}" for i in range(len(consts))]
    outs = [f"y{i}" for i in range(len(out_types))]
    graph = h.make_graph([h.make_node(op, ["x", *names], outs, **attrs)], "g",
                         [h.make_tensor_value_info("x", TP.FLOAT, x.shape)],
                         [h.make_tensor_value_info(o, t, None) for o, t in zip(outs, out_types)],
                         [onnx.numpy_helper.from_array(c, n) for c, n in zip(consts, names)])
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
