#!/usr/bin/env python3
"""Train minirt's default demo model: a small CNN on scikit-learn's 8x8 digits.

The data set (1,797 grayscale 8x8 images of handwritten digits, 10 classes)
ships inside scikit-learn, so training needs no network access.

Outputs (written to --out-dir, default: this script's folder):
  digits_cnn.onnx   the trained model, ONNX opset 17, self-contained.
                    input  "image"  float32 [batch, 1, 8, 8], pixels in [0, 1]
                    output "logits" float32 [batch, 10]
  calibration.npz   128 training images ("image" float32 [128, 1, 8, 8]) for int8 calibration
  heldout.npz       the held-out split: "image" float32 [N, 1, 8, 8],
                    "label" int64 [N]
  model_card.json   provenance and accuracy (torch and onnxruntime)

This script runs in its own training environment, not minirt's; see README.md
in this folder for the exact commands (torch is pinned to a CPU build).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import sklearn
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

SEED = 0
CALIBRATION_IMAGES = 128
HELDOUT_FRACTION = 0.2
OPSET = 17
BATCH_SIZE = 64
LEARNING_RATE = 1e-3
DEFAULT_EPOCHS = 35

HERE = Path(__file__).resolve().parent


def seed_everything(seed: int) -> None:
    """Make the run reproducible: same seed, same weights, same accuracy."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    # One thread keeps floating-point reduction order fixed between machines;
    # the model is tiny, so this costs little.
    torch.set_num_threads(1)


def load_split(seed: int):
    """Load the digits, scale pixels to [0, 1], split stratified 80/20."""
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None, :, :]  # N,1,8,8
    labels = digits.target.astype(np.int64)
    return train_test_split(
        images,
        labels,
        test_size=HELDOUT_FRACTION,
        stratify=labels,
        random_state=seed,
    )


def build_model() -> nn.Module:
    """Conv-BN-ReLU x2, max-pool to 4x4, one more conv, then a 2-layer head."""
    return nn.Sequential(
        nn.Conv2d(1, 16, kernel_size=3, padding=1),   # 16 x 8 x 8
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, kernel_size=3, padding=1),  # 32 x 8 x 8
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),                              # 32 x 4 x 4
        nn.Conv2d(32, 32, kernel_size=3, padding=1),  # 32 x 4 x 4
        nn.ReLU(),
        nn.Flatten(),                                 # 512
        nn.Linear(32 * 4 * 4, 64),
        nn.ReLU(),
        nn.Dropout(0.2),
        nn.Linear(64, 10),
    )


def train(model: nn.Module, x: np.ndarray, y: np.ndarray, epochs: int, seed: int) -> None:
    """Plain Adam + cross-entropy, mini-batches shuffled by a seeded generator."""
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for epoch in range(1, epochs + 1):
        order = torch.randperm(len(xt), generator=gen)
        total = 0.0
        for start in range(0, len(xt), BATCH_SIZE):
            idx = order[start:start + BATCH_SIZE]
            optimizer.zero_grad()
            loss = loss_fn(model(xt[idx]), yt[idx])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(idx)
        if epoch == 1 or epoch % 5 == 0 or epoch == epochs:
            print(f"epoch {epoch:3d}  train loss {total / len(xt):.4f}")


@torch.no_grad()
def torch_accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    model.eval()
    pred = model(torch.from_numpy(x)).argmax(dim=1).numpy()
    return float((pred == y).mean())


def export_onnx(model: nn.Module, path: Path) -> None:
    """Export in eval mode with a dynamic batch dimension.

    Uses the TorchScript-based exporter (dynamo=False): it writes one
    self-contained file and, with constant folding off, keeps BatchNormalization
    as separate nodes so that minirt's optimizer has something to fuse.
    """
    model.eval()
    example = torch.zeros(1, 1, 8, 8)
    torch.onnx.export(
        model,
        (example,),
        str(path),
        input_names=["image"],
        output_names=["logits"],
        dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=OPSET,
        do_constant_folding=False,
        training=torch.onnx.TrainingMode.EVAL,
        dynamo=False,
    )
    # Re-save with every tensor inline, so no side file can ever be needed.
    proto = onnx.load(str(path))
    onnx.save_model(proto, str(path), save_as_external_data=False)


def onnx_accuracy(path: Path, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (logits,) = session.run(["logits"], {"image": x})
    return float((logits.argmax(axis=1) == y).mean()), logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=HERE,
                        help="where to write the outputs (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS,
                        help="training epochs (default: %(default)s)")
    args = parser.parse_args()
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)

    seed_everything(SEED)
    x_train, x_held, y_train, y_held = load_split(SEED)
    print(f"train {len(x_train)}  held-out {len(x_held)}")

    model = build_model()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters {n_params}")
    train(model, x_train, y_train, args.epochs, SEED)

    acc_torch = torch_accuracy(model, x_held, y_held)
    print(f"held-out accuracy (torch)       {acc_torch:.4f}")

    onnx_path = out_dir / "digits_cnn.onnx"
    export_onnx(model, onnx_path)
    onnx.checker.check_model(onnx.load(str(onnx_path)), full_check=True)

    acc_ort, ort_logits = onnx_accuracy(onnx_path, x_held, y_held)
    with torch.no_grad():
        torch_logits = model(torch.from_numpy(x_held)).numpy()
    max_diff = float(np.abs(ort_logits - torch_logits).max())
    print(f"held-out accuracy (onnxruntime) {acc_ort:.4f}")
    print(f"max |logit difference| torch vs onnxruntime {max_diff:.2e}")
    if acc_ort != acc_torch:
        raise SystemExit("onnxruntime accuracy differs from torch accuracy")

    np.savez_compressed(out_dir / "heldout.npz", image=x_held, label=y_held)
    # 128 training images (never the held-out ones) for int8 calibration.
    calib = np.sort(np.random.default_rng(0).choice(len(x_train), CALIBRATION_IMAGES, replace=False))
    np.savez_compressed(out_dir / "calibration.npz", image=x_train[calib])

    graph_ops = sorted({node.op_type for node in onnx.load(str(onnx_path)).graph.node})
    card = {
        "model": "digits_cnn",
        "task": "10-class classification of 8x8 handwritten digits",
        "dataset": "sklearn.datasets.load_digits (UCI optical recognition of handwritten digits, 1797 images)",
        "preprocessing": "pixel / 16.0 -> float32 in [0, 1], shape [N, 1, 8, 8]",
        "split": {
            "method": "sklearn.model_selection.train_test_split, stratified by label",
            "heldout_fraction": HELDOUT_FRACTION,
            "train_size": int(len(x_train)),
            "heldout_size": int(len(x_held)),
        },
        "seed": SEED,
        "epochs": args.epochs,
        "optimizer": {"name": "Adam", "lr": LEARNING_RATE, "batch_size": BATCH_SIZE},
        "heldout_accuracy": {"torch": acc_torch, "onnxruntime": acc_ort},
        "max_abs_logit_diff_torch_vs_onnxruntime": max_diff,
        "num_parameters": int(n_params),
        "onnx": {
            "file": onnx_path.name,
            "opset": OPSET,
            "input": {"name": "image", "shape": ["batch", 1, 8, 8], "dtype": "float32"},
            "output": {"name": "logits", "shape": ["batch", 10], "dtype": "float32"},
            "op_types": graph_ops,
        },
        "versions": {
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": ort.__version__,
            "scikit-learn": sklearn.__version__,
            "numpy": np.__version__,
        },
    }
    (out_dir / "model_card.json").write_text(json.dumps(card, indent=2) + "\n")
    print(f"ONNX op types: {', '.join(graph_ops)}")
    print(f"wrote {onnx_path}, {out_dir / 'heldout.npz'}, {out_dir / 'model_card.json'}")


if __name__ == "__main__":
    main()
