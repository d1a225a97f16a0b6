#!/usr/bin/env python3
"""Regenerate samples/: one held-out digit of each class as a 64x64 PNG.

Each picture is an image from examples/digits/heldout.npz (never seen in
training) that the model classifies correctly with a clear margin, upscaled
8x with square pixels and drawn as dark ink on white paper, the way a photo
of a handwritten digit looks.  classify.py inverts it back and averages
8x8 blocks, which recovers the original 8x8 input up to rounding.

    python3 make_samples.py            # needs onnxruntime to pick confident images
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import piutil  # noqa: E402

HELDOUT = piutil.HERE.parent / "digits" / "heldout.npz"


def render(image8: np.ndarray, scale: int = 8) -> np.ndarray:
    """[1, 8, 8] values in [0, 1] (ink bright) -> uint8 (8*scale, 8*scale), dark ink on white."""
    ink = np.kron(image8.reshape(8, 8), np.ones((scale, scale), dtype=np.float32))
    return np.rint(255.0 * (1.0 - ink)).astype(np.uint8)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", default=str(piutil.SAMPLES_DIR))
    args = p.parse_args(argv)
    import onnxruntime as ort

    data = np.load(HELDOUT)
    images, labels = data["image"], data["label"]
    sess = ort.InferenceSession(str(piutil.DIGITS_ONNX), providers=["CPUExecutionProvider"])
    (logits,) = sess.run(None, {"image": images})
    probs = piutil.softmax(logits.astype(np.float64))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for digit in range(10):
        idx = np.nonzero((labels == digit) & (probs.argmax(1) == digit))[0]
        best = idx[np.argmax(probs[idx, digit])]
        (out / f"digit_{digit}.png").write_bytes(piutil.encode_png(render(images[best])))
        print(f"digit_{digit}.png: heldout[{best}], p={probs[best, digit]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
