"""Reference results for kernel tests: one ONNX node run by onnxruntime.

Kernel tests build a one-node ONNX model with the same inputs and attributes
they pass to the minirt kernel, run it through onnxruntime (or, where
onnxruntime lacks the op/dtype, the onnx package's reference evaluator) and
compare.  The reference never shares code with the kernel under test.

onnxruntime is not exact for u8 x s8 integer products on x86-64 CPUs without VNNI (AVX2, AVX-512F/BW): its
kernels add pairs of products with vpmaddubsw, which saturates at int16 (255*127 + 255*127 -> 32767).  Its
cure, the session config "session.x64quantprecision", is a level-2 graph rewrite of constant s8 weights, so it
does nothing in the unoptimized one-node sessions here: a test whose pair sums can pass the int16 range uses
``engine="onnx-reference"`` (tests/quantize/conftest.py has the optimized, exact onnxruntime session).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper


def single_node_model(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    attrs: dict | None = None,
    n_outputs: int = 1,
    opset: int = 17,
    domain: str = "",
    constant_inputs: Sequence[int] = (),
) -> onnx.ModelProto:
    """A model holding one ``op_type`` node; ``None`` inputs become absent optionals.

    Inputs whose positions are in ``constant_inputs`` are stored as
    initializers (some ops require constant shapes/axes).
    """
    attrs = attrs or {}
    in_names, graph_inputs, inits = [], [], []
    for i, x in enumerate(inputs):
        if x is None:
            in_names.append("")
            continue
        name = f"in{i}"
        in_names.append(name)
        x = np.asarray(x)
        if i in constant_inputs:
            inits.append(numpy_helper.from_array(x, name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape))
    out_names = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, in_names, out_names, domain=domain, **attrs)
    # Untyped outputs: onnxruntime infers them (an UNDEFINED elem type is refused).
    outputs = [helper.make_empty_tensor_value_info(n) for n in out_names]
    graph = helper.make_graph([node], f"single_{op_type}", graph_inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, opset)])
    model.ir_version = 8
    return model


def reference_outputs(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    attrs: dict | None = None,
    n_outputs: int = 1,
    opset: int = 17,
    constant_inputs: Sequence[int] = (),
    engine: str = "onnxruntime",
) -> list[np.ndarray]:
    """Run one node through ``engine`` ("onnxruntime" or "onnx-reference")."""
    model = single_node_model(op_type, inputs, attrs, n_outputs, opset, constant_inputs=constant_inputs)
    feeds = {
        f"in{i}": np.asarray(x)
        for i, x in enumerate(inputs)
        if x is not None and i not in constant_inputs
    }
    if engine == "onnxruntime":
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return sess.run(None, feeds)
    if engine == "onnx-reference":
        from onnx.reference import ReferenceEvaluator

        return list(ReferenceEvaluator(model).run(None, feeds))
    raise ValueError(f"unknown reference engine {engine!r}")
