"""Export the small transformer encoder used by tests/test_real_models.py.

Two ``nn.TransformerEncoderLayer`` blocks (d_model 128, 4 heads, feed-forward
256, batch first, post-norm, ReLU) behind a learned positional embedding, in
eval mode with seeded weights, exported to ONNX opset 17 with dynamic batch
and sequence axes.  The positional table is sliced by the input's sequence
length, so the exported graph computes shapes at run time
(Shape -> Gather -> Slice / Reshape), which is what the dynamic-shape tests need.

Run once, in a throwaway environment (CI does not install torch)::

    python -m venv /tmp/torchenv
    /tmp/torchenv/bin/pip install torch==2.13.0 onnx numpy
    /tmp/torchenv/bin/python examples/transformer/export_encoder.py

It writes ``encoder.onnx`` next to this script, checks it with the ONNX
checker and compares a run of torch with the exported graph's reference
evaluator (``onnx.reference``) at two shapes.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "encoder.onnx")

D_MODEL, N_HEAD, D_FF, N_LAYERS, MAX_LEN = 128, 4, 256, 2, 64
SEED = 0


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pos = nn.Parameter(0.02 * torch.randn(MAX_LEN, D_MODEL))
        layer = nn.TransformerEncoderLayer(
            d_model=D_MODEL, nhead=N_HEAD, dim_feedforward=D_FF, dropout=0.1, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers=N_LAYERS, enable_nested_tensor=False)
        # TransformerEncoder deep-copies ``layer``, so every layer starts with
        # the same weights: give each its own, and LayerNorms that are not the
        # identity, as a trained model would have.
        for block in self.encoder.layers:
            block.self_attn._reset_parameters()
            block.linear1.reset_parameters()
            block.linear2.reset_parameters()
            for norm in (block.norm1, block.norm2):
                nn.init.normal_(norm.weight, 1.0, 0.1)
                nn.init.normal_(norm.bias, 0.0, 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [batch, seq, d_model], seq <= MAX_LEN
        return self.encoder(x + self.pos[: x.shape[1]])


def main() -> None:
    torch.manual_seed(SEED)
    model = Encoder().eval()
    example = torch.randn(2, 16, D_MODEL)
    dynamic = {"x": {0: "batch", 1: "seq"}}
    try:
        # The dynamo exporter (needs onnxscript) keeps every shape symbolic.
        program = torch.onnx.export(
            model, (example,), input_names=["x"], output_names=["y"], opset_version=17,
            dynamic_shapes={"x": {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq", max=MAX_LEN)}},
            dynamo=True, external_data=False,
        )
        program.save(OUT, external_data=False)
    except Exception as exc:  # noqa: BLE001 - fall back to the TorchScript exporter
        print(f"dynamo export failed ({type(exc).__name__}: {exc}); using the TorchScript exporter")
        # Grad stays enabled: under no_grad, eval-mode TransformerEncoderLayer
        # takes its fused fast path (aten::_transformer_encoder_layer_fwd),
        # which the TorchScript exporter cannot translate.
        torch.onnx.export(
            model, (example,), OUT, input_names=["x"], output_names=["y"],
            dynamic_axes={**dynamic, "y": {0: "batch", 1: "seq"}},
            opset_version=17, do_constant_folding=True, dynamo=False,
        )
    proto = onnx.load(OUT)
    onnx.checker.check_model(proto, full_check=True)

    from onnx.reference import ReferenceEvaluator

    ref = ReferenceEvaluator(proto)
    rng = np.random.default_rng(SEED)
    for shape in ((1, 16, D_MODEL), (3, 40, D_MODEL)):
        x = rng.standard_normal(shape).astype(np.float32)
        with torch.no_grad():
            want = model(torch.from_numpy(x)).numpy()
        (got,) = ref.run(None, {"x": x})
        print(f"{shape}: max |torch - onnx.reference| = {np.abs(got - want).max():.2e}")
    ops: dict[str, int] = {}
    for node in proto.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    print(f"wrote {OUT}: {os.path.getsize(OUT) / 1024:.0f} KiB, {len(proto.graph.node)} nodes, "
          f"torch {torch.__version__}, onnx {onnx.__version__}")
    print("ops:", dict(sorted(ops.items())))


if __name__ == "__main__":
    main()
