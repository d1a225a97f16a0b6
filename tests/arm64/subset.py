"""The runtime test subset for the emulated Raspberry Pi (``make test-arm64``).

Pure Python (no numpy, no onnx): both sides import it.  The host builds
every case into a .mrt artifact plus an .npz of inputs and onnxruntime's
outputs (``tests/arm64/prepare.py``); inside the arm64 chroot only minirt,
numpy and pytest run them (``tests/arm64/test_runtime_subset.py``).

Chosen for coverage per emulated second: the demo model for each Pi target,
and small graphs that go through every native kernel (im2col/GEMM conv,
depthwise conv, bias+activation epilogues, max/average pooling) and the
numpy kernels whose results depend on the numpy version.  Emulation runs
code 25-50x slower, so the inputs stay small.
"""
from __future__ import annotations

# name -> (rtol, atol) used to compare minirt with onnxruntime's outputs
CASES = {
    "digits_generic": (1e-4, 1e-4),
    "digits_rpi3": (1e-4, 1e-4),
    "digits_rpi4": (1e-4, 1e-4),
    "digits_rpi5": (1e-4, 1e-4),
    "conv_block": (1e-4, 1e-4),      # Conv+BN+Relu, depthwise Conv+Clip, 1x1 Conv + residual, pools, Gemm
    "conv_strided": (1e-4, 1e-4),    # stride 2, dilation, asymmetric pads, LeakyRelu/Sigmoid/HardSwish epilogues
    "mlp_norm": (1e-4, 1e-5),        # MatMul, LayerNormalization, Softmax, Gelu-like math, ReduceMean
    "tensor_ops": (1e-5, 1e-6),      # Transpose, Reshape, Concat, Slice, Gather, Pad, Resize, TopK, ArgMax, Where
    "int_ops": (0, 0),               # QuantizeLinear/DequantizeLinear, integer Add/Mul/Clip, Cast, CumSum
}

# Cases whose .npz also has the true labels ("label"): the accuracy must match onnxruntime's.
LABELLED = {"digits_generic", "digits_rpi3", "digits_rpi4", "digits_rpi5"}

MANIFEST = "manifest.json"
