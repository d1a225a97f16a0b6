"""Data for the sweep example's OCR model: PP-OCR's text direction classifier (upright or upside down).

``make(n, seed)`` draws ``n`` text-line crops deterministically (OpenCV's Hershey fonts, which come
with rapidocr-onnxruntime, the package that ships the PP-OCR models): a few words in a random font,
size and ink on a paper tone, blurred, with reduced contrast and sensor noise; every second crop is
turned upside down (label 1, the classifier's "180" class; 0 is upright).  The crops are stored as
rapidocr feeds the classifier before normalisation: uint8, height 48, the text resized to height 48
keeping its aspect ratio and padded to width 192 (``width`` holds the text's width in pixels).

``preprocess(arrays, input_shapes)`` is the sweep's preprocess function (``preprocess =
"ocr_data:preprocess"``): rapidocr's resize to the input width the candidate fixes (``x`` =
1x3x48xW; 192 when none is fixed) and its normalisation ``(x / 255 - 0.5) / 0.5``, NCHW float32.

``python ocr_data.py`` writes ``data/ocr_cls_eval.npz`` (240 crops) and ``data/ocr_cls_calib.npz``
(32 other crops, another seed) beside this file.
"""
from __future__ import annotations

import os
import sys

import numpy as np

WORDS = ("minirt", "edge", "runtime", "ONNX", "model", "text", "2024", "parity", "Session", "kernel", "Raspberry",
         "device", "sweep", "Ray", "int8", "float", "latency", "accuracy")
HEIGHT, WIDTH = 48, 192


def _crop(rng: np.random.Generator) -> np.ndarray:
    import cv2

    fonts = (cv2.FONT_HERSHEY_SIMPLEX, cv2.FONT_HERSHEY_DUPLEX, cv2.FONT_HERSHEY_COMPLEX, cv2.FONT_HERSHEY_TRIPLEX)
    line = " ".join(rng.choice(WORDS, size=int(rng.integers(1, 4))))
    font = int(rng.choice(fonts))
    scale, thick = float(rng.uniform(0.8, 1.3)), int(rng.integers(1, 3))
    (tw, th), base = cv2.getTextSize(line, font, scale, thick)
    pad = 6
    img = np.full((th + base + 2 * pad, tw + 2 * pad, 3), int(rng.integers(200, 250)), np.uint8)
    ink = tuple(int(c) for c in rng.integers(0, 70, 3))
    cv2.putText(img, line, (pad, pad + th), font, scale, ink, thick, cv2.LINE_AA)
    k = int(rng.choice([1, 3, 5]))
    if k > 1:
        img = cv2.GaussianBlur(img, (k, k), 0)
    low = int(rng.integers(60, 150))  # contrast: the paper / ink range squeezed towards grey
    out = img.astype(np.float32) * (255 - low) / 255 + low * 0.5
    out += rng.normal(0, float(rng.uniform(10, 45)), out.shape)
    return np.clip(out, 0, 255).astype(np.uint8)


def make(n: int, seed: int) -> dict[str, np.ndarray]:
    """``{"image": uint8 [n, 48, 192, 3], "width": int32 [n], "label": int64 [n]}``, deterministic in ``seed``."""
    import cv2

    rng = np.random.default_rng(seed)
    images = np.zeros((n, HEIGHT, WIDTH, 3), np.uint8)
    widths = np.zeros(n, np.int32)
    labels = np.arange(n, dtype=np.int64) % 2
    for i in range(n):
        crop = _crop(rng)
        if labels[i]:
            crop = np.ascontiguousarray(crop[::-1, ::-1])
        h, w = crop.shape[:2]
        new_w = min(WIDTH, int(np.ceil(HEIGHT * w / h)))
        images[i, :, :new_w] = cv2.resize(crop, (new_w, HEIGHT))
        widths[i] = new_w
    return {"image": images, "width": widths, "label": labels}


def _resize_width(img: np.ndarray, new_w: int) -> np.ndarray:
    """Linear interpolation along the width (the height is 48 already), pixel centres aligned as cv2's."""
    w = img.shape[1]
    if new_w == w:
        return img.astype(np.float32)
    x = (np.arange(new_w) + 0.5) * w / new_w - 0.5
    x0 = np.clip(np.floor(x).astype(int), 0, w - 1)
    x1 = np.clip(x0 + 1, 0, w - 1)
    f = np.clip(x - x0, 0, 1)[None, :, None]
    return img[:, x0].astype(np.float32) * (1 - f) + img[:, x1].astype(np.float32) * f


def preprocess(arrays: dict, input_shapes: dict) -> dict:
    """rapidocr's classifier input at the candidate's width: ``{"x": float32 [n, 3, 48, W], "label"}``."""
    width = int(input_shapes.get("x", (1, 3, HEIGHT, WIDTH))[3])
    images, widths = arrays["image"], arrays["width"]
    x = np.zeros((len(images), 3, HEIGHT, width), np.float32)
    for i, (img, w) in enumerate(zip(images, widths)):
        text = img[:, :int(w)]
        new_w = min(width, int(w))
        resized = (_resize_width(text, new_w) / 255.0 - 0.5) / 0.5
        x[i, :, :, :new_w] = resized.transpose(2, 0, 1)
    return {"x": x, "label": arrays["label"]}


def main(argv: list[str]) -> int:
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
    os.makedirs(folder, exist_ok=True)
    for name, n, seed in (("ocr_cls_eval.npz", 240, 1), ("ocr_cls_calib.npz", 32, 2)):
        path = os.path.join(folder, name)
        np.savez_compressed(path, **make(n, seed))
        print(f"wrote {path} ({n} crops)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
