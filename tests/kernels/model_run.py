"""Run one ONNX model through minirt (builder -> Session) and through a reference engine."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

import minirt
from minirt.builder import build_bytes
from tests.kernels import reference as ref_mod


def minirt_run(model: onnx.ModelProto, feeds: dict) -> list:
    return minirt.Session(build_bytes(model)).run(None, feeds)


def reference_run(model: onnx.ModelProto, feeds: dict, engine: str = "onnxruntime") -> list:
    if engine == "onnx-reference":
        from onnx.reference import ReferenceEvaluator

        return list(ReferenceEvaluator(model).run(None, feeds))
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, feeds)


def single_node(op_type, inputs, attrs=None, n_outputs=1, opset=17, constant_inputs=()):
    """``reference.single_node_model`` with untyped outputs (inferred by both engines)."""
    model = ref_mod.single_node_model(op_type, inputs, attrs, n_outputs, opset, constant_inputs=constant_inputs)
    del model.graph.output[:]
    model.graph.output.extend(helper.make_empty_tensor_value_info(f"out{i}") for i in range(n_outputs))
    feeds = {f"in{i}": np.asarray(x) for i, x in enumerate(inputs) if x is not None and i not in constant_inputs}
    return model, feeds


def compare_node(op_type, inputs, attrs=None, n_outputs=1, opset=17, constant_inputs=(), rtol=1e-5, atol=1e-6,
                 engine="onnxruntime"):
    """Assert minirt and the reference engine agree on one node."""
    model, feeds = single_node(op_type, inputs, attrs, n_outputs, opset, constant_inputs)
    expected = reference_run(model, feeds, engine)
    # The builder runs the ONNX checker, which wants typed graph outputs: type
    # them from the reference's results.
    del model.graph.output[:]
    model.graph.output.extend(
        helper.make_tensor_value_info(f"out{i}", helper.np_dtype_to_tensor_dtype(np.asarray(e).dtype), np.shape(e))
        for i, e in enumerate(expected)
    )
    actual = minirt_run(model, feeds)
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        e = np.asarray(e)
        assert a.dtype == e.dtype, f"output {i}: dtype {a.dtype} != {e.dtype}"
        assert a.shape == e.shape, f"output {i}: shape {a.shape} != {e.shape}"
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=f"output {i}")
    return actual
