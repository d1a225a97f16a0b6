"""minirt build --quantize int4 of a float decoder export (torch.onnx.export of a Llama made locally): its
MatMul weights become MatMulNBits blocks (block size and symmetry as asked), the artifact shrinks, and the
report gives the logits' cosine and next-token agreement against the float model on the eval data."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from minirt.format import reader


def _eval_feeds(folder: str, out_dir) -> str:
    """Four prompts of 12 tokens (no past) as the decoder's inputs, one .npz each."""
    import onnx

    model = onnx.load(os.path.join(folder, "model.onnx"), load_external_data=False)
    rng = np.random.default_rng(7)
    for i in range(4):
        feed = {"input_ids": rng.integers(3, 200, (1, 12)).astype(np.int64),
                "attention_mask": np.ones((1, 12), np.int64), "position_ids": np.arange(12, dtype=np.int64)[None]}
        for inp in model.graph.input:
            if inp.name.startswith("past_key_values"):
                dims = [d.dim_value for d in inp.type.tensor_type.shape.dim]
                feed[inp.name] = np.zeros((1, dims[1], 0, dims[3]), np.float32)
        np.savez(out_dir / f"prompt{i}.npz", **feed)
    return str(out_dir)


@pytest.mark.parametrize("block_size,symmetric", [(32, True), (64, False)])
def test_int4_build_of_a_float_decoder(decoders, tmp_path, block_size, symmetric):
    from minirt.builder import build

    folder = decoders[("llama", "torch")]
    evals = tmp_path / "evals"
    evals.mkdir()
    report = build(os.path.join(folder, "model.onnx"), str(tmp_path / "int4.mrt"), quantize="int4",
                   block_size=block_size, symmetric_weights=symmetric, eval_data=_eval_feeds(folder, evals))
    q = report.quantization
    assert q["int4"]["layers"] >= 5 and q["int4"]["block_size"] == block_size and q["int4"]["symmetric"] is symmetric
    assert q["quant_bytes"] < 0.6 * q["float_bytes"]
    logits = q["accuracy"]["logits"]
    assert logits["cosine"] > 0.9 and 0.0 <= logits["next_token_agreement"] <= 1.0
    assert "next_token_agreement" not in q["accuracy"]["present.0.key"]  # (a cache is not a distribution)
    art = reader.load(str(tmp_path / "int4.mrt"))
    assert ("com.microsoft", "MatMulNBits") in {(o.domain, o.op_type) for o in art.operators}
    nodes = [n for g in art.graphs for n in g.nodes if art.operators[n.op_index].op_type == "MatMulNBits"]
    zps = {len(n.inputs) > 3 and n.inputs[3] >= 0 for n in nodes}
    assert zps == {not symmetric}  # (asymmetric: every layer has zero points)
    text = str(report)
    assert "next-token agreement" in text and f"block {block_size}" in text


def test_int4_cli_errors(tmp_path):
    onnx_path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "digits", "digits_cnn.onnx")
    proc = subprocess.run([sys.executable, "-m", "minirt", "build", onnx_path, "-o", str(tmp_path / "x.mrt"),
                           "--quantize", "int4", "--block-size", "24"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--block-size must be a power of two" in proc.stderr and "Traceback" not in proc.stderr
    # the digits CNN has no MatMul large enough: a clear refusal, not a float artifact under an int4 name
    proc = subprocess.run([sys.executable, "-m", "minirt", "build", onnx_path, "-o", str(tmp_path / "x.mrt"),
                           "--quantize", "int4", "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "nothing was quantized" in proc.stderr
    assert not (tmp_path / "x.mrt").exists()
