"""minirt.genai against onnxruntime-genai on the same model folders: greedy generation token for token.

* fp32 (onnxruntime-genai's builder, every architecture): 256 new tokens identical.
* int4 (MatMulNBits, accuracy_level 4): the first 64 new tokens identical, and the logits each token
  was chosen from within INT4_ATOL of onnxruntime-genai's.  int4 matmuls quantize the activations to
  int8 per block (onnxruntime's CompInt8, which minirt's kernel reproduces); an activation a float
  ulp apart can round to the next int8 step, moving a logit by ~1e-2.  When two candidates are closer
  than that (a near-tie), the greedy choice may differ: the test then checks that the tie is within
  the tolerance at the step where the sequences part, and compares no further (the sequences
  differ from there on by construction).  Seen: phi3 (seed 0), token 31 of 64.
* torch exports (plain ONNX ops, the cache fed back by Concat): 256 tokens identical.
"""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from tests.genai import make_decoders as md
from tests.genai.conftest import generate, lib_of

FP32_TOKENS = 256
INT4_TOKENS = 64
INT4_ATOL = 0.1  # logits of these models span about +-10; int8 steps of activations move them ~1e-2
TORCH_TOKENS = 256

# minirt's native float32 Mul/Add of a size-1 operand of higher rank against a longer vector returns
# the vector's shape: Mul(x float[1,1,1], c float[8]) gives [8], not [1,1,8] (minirt/kernels/
# elementwise.py _native_binary picks the larger operand as the result's shape without checking its
# rank).  The rotary embedding of transformers' torch exports can hit it on a decode step (one
# position id): a session of the single node Mul(x float[a,b,1], constant float[8]) fed x of shape
# [1,1,1] returns [8].  Whether a run takes that native path depends on the session's state (seen
# failing, then passing on a later build), hence strict=False; a test below runs the same models with
# the native kernels off.


def _first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


@pytest.mark.parametrize("arch", md.ARCHS)
def test_greedy_fp32_identical_to_onnxruntime_genai(models, prompt, arch):
    ours, _, gen = generate(lib_of("minirt"), models(arch, "fp32"), prompt, FP32_TOKENS)
    theirs, _, _ = generate(lib_of("ort"), models(arch, "fp32", "ort"), prompt, FP32_TOKENS)
    assert len(ours) == FP32_TOKENS
    first = _first_difference(ours, theirs)
    assert first is None, f"{arch} fp32: token {first} differs: minirt {ours[first:first + 5]}, " \
                          f"onnxruntime-genai {theirs[first:first + 5]}"
    assert list(gen.get_sequence(0)) == list(prompt) + ours


@pytest.mark.parametrize("arch", md.ARCHS)
def test_greedy_int4_identical_to_onnxruntime_genai(models, prompt, arch):
    ours, lo, _ = generate(lib_of("minirt"), models(arch, "int4"), prompt, INT4_TOKENS, logits=True)
    theirs, lt, _ = generate(lib_of("ort"), models(arch, "int4", "ort"), prompt, INT4_TOKENS, logits=True)
    first = _first_difference(ours, theirs)
    upto = INT4_TOKENS if first is None else first + 1  # the logits are comparable up to the first difference
    err = max(float(np.abs(a - b).max()) for a, b in zip(lo[:upto], lt[:upto]))
    assert err <= INT4_ATOL, f"{arch} int4: logits differ by {err} (tolerance {INT4_ATOL})"
    if first is not None:  # a near-tie that int4 rounding explains, or a real difference
        ref = lt[first]
        a, b = ref[ours[first]], ref[theirs[first]]
        assert abs(a - b) <= 2 * INT4_ATOL, (
            f"{arch} int4: token {first} differs ({ours[first]} vs {theirs[first]}) and is no near-tie: "
            f"onnxruntime-genai's logits {b} vs {a}")
        # (seen on phi3 with seed 0: token 31 of 64, logits 2.2289 vs 2.2313 where the logits agree within
        # 0.033: int4 rounding decides the tie.  Documented in docs/genai.md.)


def _torch_parity(models, prompt, arch):
    ours, _, _ = generate(lib_of("minirt"), models(arch, "torch"), prompt, TORCH_TOKENS)
    theirs, _, _ = generate(lib_of("ort"), models(arch, "torch", "ort"), prompt, TORCH_TOKENS)
    first = _first_difference(ours, theirs)
    assert first is None, f"{arch} torch export: token {first} differs"


TORCH_ARCHS = ("llama", "qwen2", "phi3", "gemma")  # (Gemma 2's HF cache keeps sliding layers' last window only)


@pytest.mark.parametrize("arch", TORCH_ARCHS)
def test_greedy_torch_export_identical_to_onnxruntime_genai(models, prompt, arch):
    _torch_parity(models, prompt, arch)


@pytest.mark.parametrize("arch", TORCH_ARCHS)
def test_greedy_torch_export_without_native_kernels(models, prompt, arch, monkeypatch):
    """The same comparison with minirt's numpy kernels only."""
    from minirt import native

    monkeypatch.setattr(native, "available", False)
    _torch_parity(models, prompt, arch)


@pytest.mark.parametrize("kernels", ["native", "numpy"])
def test_gemma2_windowed_kv_cache(models, prompt, kernels, monkeypatch):
    # the builder's default for Gemma 2's sliding-window layers: GroupQueryAttention sliding_window_cache=1, a
    # cache of the window only (64 positions here), which the prompt and 96 new tokens wrap around
    model = models("gemma2", "fp32-windowed")
    window = model.config.decoder["sliding_window"]["window_size"]
    assert len(prompt) + 96 > window
    if kernels == "numpy":
        monkeypatch.setattr(native, "available", False)
    ours, _, gen = generate(lib_of("minirt"), model, prompt, 96)
    theirs, _, _ = generate(lib_of("ort"), models("gemma2", "fp32-windowed", "ort"), prompt, 96)
    assert ours == theirs
    windowed = [i for i, (k, _) in enumerate(gen.kv_cache) if k.shape[2] == window]
    assert windowed == model.config.decoder["sliding_window"]["layers"]
