"""The runtime test subset for the emulated Raspberry Pi (``make test-arm64``, ``make test-arm32``).

Pure Python (no numpy, no onnx): both sides import it.  The host builds
every case into a .mrt artifact plus an .npz of inputs and onnxruntime's
outputs (``tests/arm64/prepare.py``); inside the emulated Pi (Debian
bookworm arm64 or armhf) only minirt, numpy and pytest run them
(``tests/arm64/test_runtime_subset.py``).  The same subset serves both
architectures: ``prepare.py --arch`` picks the Pi target of the cases that
are built for "the Pi" (:data:`PI_TARGETS`).

Chosen for coverage per emulated second: the demo model for each Pi target,
small graphs that go through every native kernel (im2col/GEMM conv,
depthwise conv, bias+activation epilogues, max/average pooling) and the
numpy kernels whose results depend on the numpy version, two real models
(PP-OCR's text detector and direction classifier, from the
rapidocr-onnxruntime wheel) and int8 models end to end.  Emulation runs
code 25-50x slower, so the inputs stay small.

Tolerances (docs/packaging.md, "Tolerances"): float cases compare with
onnxruntime's float32 outputs on the host (x86-64) elementwise with
``(rtol, atol)``; int8 cases as described at :data:`QUANT_STEPS` and
:data:`X86_REL`.
"""
from __future__ import annotations

# name -> (rtol, atol) used to compare minirt with onnxruntime's outputs (numpy.testing.assert_allclose)
CASES = {
    "digits_generic": (1e-4, 1e-4),
    "digits_rpi3": (1e-4, 1e-4),
    "digits_rpi4": (1e-4, 1e-4),
    "digits_rpi5": (1e-4, 1e-4),
    "digits_rpi3-armhf": (1e-4, 1e-4),
    "conv_block": (1e-4, 1e-4),      # Conv+BN+Relu, depthwise Conv+Clip, 1x1 Conv + residual, pools, Gemm
    "conv_strided": (1e-4, 1e-4),    # stride 2, dilation, asymmetric pads, LeakyRelu/Sigmoid/HardSwish epilogues
    "mlp_norm": (1e-4, 1e-5),        # MatMul, LayerNormalization, Softmax, Gelu-like math, ReduceMean
    "attention": (1e-4, 1e-5),       # self-attention: one native ScaledDotProductAttention call (D153)
    "tensor_ops": (1e-5, 1e-6),      # Transpose, Reshape, Concat, Slice, Gather, Pad, Resize, TopK, ArgMax, Where
    "int_ops": (0, 0),               # QuantizeLinear/DequantizeLinear, integer Add/Mul/Clip, Cast, CumSum
    # Real models (float32, built for the Pi target of the architecture).  Their x86-64 bounds
    # (tests/test_real_models.py) are 2e-4 (det) and 2e-5 (cls) absolute, ~10x the differences seen
    # there; on ARM the float kernels contract multiply-adds (FMA) and sum in other orders: see
    # docs/packaging.md for the measured differences behind these.
    "ppocr_cls": (0, 2e-5),          # MobileNetV3 (hard-swish, SE blocks), softmax over 2 directions
    "ppocr_det": (0, 2e-4),          # DB probability map: a sigmoid after ~100 convolutions, 2 ConvTransposes
    # int8 end to end.  digits_int8_ort: quantized by onnxruntime.quantization (static, QOperator format:
    # QLinearConv / QGemm, per-channel int8 weights, uint8 activations), onnxruntime's outputs computed with
    # exact int8 sums; the atol is in units of the output's quantization step (QUANT_STEPS).
    # digits_int8_static / _dynamic: quantized by minirt's builder for the Pi target (the Pi targets'
    # modes); compared with onnxruntime's FLOAT outputs at the quantization error's bound (atol, measured
    # on x86-64 on logits up to 27.6: static 0.36 with its final Gemm in int8 since D149, 0.13 before;
    # dynamic 0.12) and with minirt's own x86-64 outputs of the same artifact (X86_REL).
    "digits_int8_ort": (0, 1.0),
    "digits_int8_static": (0, 0.6),
    "digits_int8_dynamic": (0, 0.3),
}

# Cases whose .npz also has the true labels ("label"): the accuracy must match onnxruntime's.
LABELLED = {"digits_generic", "digits_rpi3", "digits_rpi4", "digits_rpi5", "digits_rpi3-armhf",
            "digits_int8_ort", "digits_int8_static", "digits_int8_dynamic"}

# int8 cases whose atol counts quantization steps of the model's output (the scale of its last
# DequantizeLinear): prepare.py writes atol = steps * scale into the manifest.  An int8 model's
# requantizations round to the nearest step; a product that lands within float rounding of a half
# step may round the other way on another CPU (an FMA on ARM, separate multiply and add elsewhere), and
# one step of difference in a hidden layer moves the logits by about one output step.
QUANT_STEPS = {"digits_int8_ort": 2}

# case -> bound on max|minirt here - minirt on the x86-64 host| / max|minirt on the host| for the
# artifacts minirt quantized: the same integer sums, requantization and dynamic activation scales
# computed in another float order (the issue measured up to 2e-3 on arm64).
X86_REL = {"digits_int8_static": 5e-3, "digits_int8_dynamic": 5e-3}

# The Pi target of the cases built "for the Pi" (real models, int8), per emulated architecture:
# static int8 on the Pi 5 profile (its SDOT kernel where the CPU has it), dynamic int8 and float on the
# Pi 4's; on 32-bit ARM the armhf profile (targets/profiles.py).
PI_TARGETS = {
    "arm64": {"ppocr_cls": "rpi4", "ppocr_det": "rpi4", "digits_int8_ort": "rpi4",
              "digits_int8_static": "rpi5", "digits_int8_dynamic": "rpi4"},
    "arm32": {"ppocr_cls": "rpi3-armhf", "ppocr_det": "rpi3-armhf", "digits_int8_ort": "rpi3-armhf",
              "digits_int8_static": "rpi3-armhf", "digits_int8_dynamic": "rpi3-armhf"},
}

# What the device check packages with `minirt package` and installs on the device root (no compiler):
# a real model in float and the int8 model onnxruntime quantized, compared as the cases of the same name.
PACKAGED = ("ppocr_cls", "digits_int8_ort")

MANIFEST = "manifest.json"

# The language model of the subset (issue 24: "the int4 model runs under make test-arm64 with the same
# tokens as on x86"): tests/genai/make_decoders.py's tiny Llama, converted to int4 by onnxruntime-genai's
# builder (MatMulNBits block 32, GroupQueryAttention), built into a .mrt on the host; the Pi generates
# DECODER_TOKENS tokens greedily after the prompt and must choose the tokens minirt chose on x86-64 (and
# onnxruntime-genai there: tests/genai/test_parity.py).
DECODER = ("llama", "int4")
DECODER_PROMPT = (1, 17, 250, 31, 402, 77, 9, 120, 64, 5, 300, 41)  # (ids of the tiny vocabulary: < 512)
DECODER_TOKENS = 64
