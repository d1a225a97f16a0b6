"""onnx schemas for the contrib ops onnxruntime registers in the *default* domain.

onnxruntime defines ``SimplifiedLayerNormalization`` (RMS norm) in the ``ai.onnx`` domain at opset 1,
and onnxruntime-genai's model builder writes it there; onnx itself has no such op, so the ONNX
checker (builder/load.py) would reject every such model ("No Op registered ...").  ``ensure_registered``
adds the schema to onnx's registry once per process (inputs, outputs, attributes and type constraints as
onnxruntime declares them; no shape inference function: the kernel runs without inferred shapes).
com.microsoft ops need nothing of the kind: the checker does not check that domain's nodes.
"""
from __future__ import annotations

_done = False


def ensure_registered() -> None:
    global _done
    if _done:
        return
    _done = True
    import onnx.defs as d
    from onnx import helper as h

    try:
        d.get_schema("SimplifiedLayerNormalization", 1, "")
        return  # onnx (or another caller) already has it
    except d.SchemaError:
        pass
    P = d.OpSchema.FormalParameter
    A = d.OpSchema.Attribute
    floats = ["tensor(float)", "tensor(float16)", "tensor(double)", "tensor(bfloat16)"]
    schema = d.OpSchema(
        "SimplifiedLayerNormalization", "", 1,
        doc="RMS normalization (onnxruntime contrib op in the default domain): "
            "Y = X / sqrt(mean(X^2 over [axis, rank)) + epsilon) * scale.",
        inputs=[P("X", "T", ""), P("scale", "V", "")],
        outputs=[P("Y", "V", ""), P("inv_std_var", "U", "", param_option=d.OpSchema.FormalParameterOption.Optional)],
        type_constraints=[("T", floats, ""), ("U", ["tensor(float)", "tensor(double)"], ""), ("V", floats, "")],
        attributes=[A("axis", h.make_attribute("axis", -1), ""), A("epsilon", h.make_attribute("epsilon", 1e-5), ""),
                    A("stash_type", h.make_attribute("stash_type", 1), "")],
    )
    d.register_schema(schema)
