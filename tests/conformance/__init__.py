"""ONNX backend conformance: minirt run against the onnx package's node test cases."""
