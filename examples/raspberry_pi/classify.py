#!/usr/bin/env python3
"""Classify handwritten digits with minirt: image files, folders, or a camera.

    python3 classify.py samples/                  # every image in a folder
    python3 classify.py photo.png other.pgm       # single files
    python3 classify.py --camera --frames 10      # Pi camera (picamera2), else OpenCV, else a still image

The model is the digits demo (examples/digits) built to .mrt; by default
``digits.mrt`` beside this script (see README.md for building it on a
desktop with ``--target rpi4`` / ``rpi5``).  Only numpy and minirt are
needed: PNG, PGM and PPM files are decoded without Pillow or OpenCV.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import piutil  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Classify handwritten digit images (files, folders or a camera) with minirt.",
        epilog="Images: PNG/PGM/PPM always; JPEG and others when Pillow or OpenCV is installed.",
    )
    p.add_argument("paths", nargs="*", help="image files or folders (default: the samples/ folder)")
    p.add_argument("--model", help="the .mrt artifact (default: digits.mrt beside this script)")
    p.add_argument("--camera", action="store_true", help="classify frames from a camera instead of files")
    p.add_argument("--camera-backend", choices=("auto", "picamera2", "opencv", "still"), default="auto",
                   help="auto: picamera2 when present, else OpenCV, else a still image (default auto)")
    p.add_argument("--still", help="the image the 'still' camera backend repeats (default samples/digit_7.png)")
    p.add_argument("--frames", type=int, default=5, help="camera frames to classify (default 5)")
    p.add_argument("--interval", type=float, default=0.0, help="seconds between camera frames (default 0)")
    p.add_argument("--invert", choices=("auto", "yes", "no"), default="auto",
                   help="dark ink on light paper needs inverting; auto decides from the image border")
    p.add_argument("--crop", action="store_true", help="zoom onto the digit first (default on for --camera)")
    p.add_argument("--top", type=int, default=1, help="show the K most likely digits (default 1)")
    p.add_argument("--threads", type=int, default=None, help="threads for the runtime (default: all cores)")
    p.add_argument("--json", action="store_true", help="one JSON object per image on stdout")
    return p


class Classifier:
    def __init__(self, model_path: Path, threads: int | None = None):
        import minirt

        self.session = minirt.Session(str(model_path), threads=threads)
        self.input_name = self.session.get_inputs()[0].name

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, float]:
        t0 = time.perf_counter()
        (logits,) = self.session.run(None, {self.input_name: x})
        return piutil.softmax(logits[0].astype(np.float64)), time.perf_counter() - t0


def report(name: str, probs: np.ndarray, seconds: float, top: int, as_json: bool) -> dict:
    order = np.argsort(-probs, kind="stable")[: max(1, top)]
    row = {
        "source": name,
        "digit": int(order[0]),
        "confidence": round(float(probs[order[0]]), 4),
        "top": [[int(i), round(float(probs[i]), 4)] for i in order],
        "ms": round(seconds * 1000.0, 3),
    }
    if as_json:
        print(json.dumps(row), flush=True)
    else:
        alts = "  ".join(f"{d}:{p:.2f}" for d, p in row["top"][1:])
        print(f"{name}: {row['digit']} ({row['confidence']:.1%}) {alts}  [{row['ms']:.2f} ms]".rstrip(), flush=True)
    return row


# --------------------------------------------------------------------------- camera sources


def open_camera(backend: str, still: Path):
    """(name, grab) where grab() returns one uint8 frame; falls back along picamera2 -> OpenCV -> still."""
    errors = []
    if backend in ("auto", "picamera2"):
        try:
            from picamera2 import Picamera2  # type: ignore[import-not-found]

            cam = Picamera2()
            cam.configure(cam.create_still_configuration(main={"size": (640, 480), "format": "RGB888"}))
            cam.start()
            return "picamera2", cam.capture_array
        except Exception as exc:  # noqa: BLE001 - missing module or no camera attached
            errors.append(f"picamera2: {exc}")
    if backend in ("auto", "opencv"):
        try:
            import cv2  # type: ignore[import-not-found]

            cap = cv2.VideoCapture(0)
            ok = cap.isOpened() and cap.read()[0]
            if not ok:
                cap.release()
                raise RuntimeError("no camera at index 0")

            def grab():
                ok, frame = cap.read()
                if not ok:
                    raise RuntimeError("camera read failed")
                return frame[:, :, ::-1]  # BGR -> RGB

            return "opencv", grab
        except Exception as exc:  # noqa: BLE001
            errors.append(f"opencv: {exc}")
    if backend in ("auto", "still"):
        img = piutil.read_image(still)
        return f"still:{still.name}", lambda: img
    raise RuntimeError("no camera available (" + "; ".join(errors) + ")")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        model = piutil.resolve_model(args.model)
        clf = Classifier(model, args.threads)
    except FileNotFoundError as exc:
        print(f"classify.py: error: {exc}", file=sys.stderr)
        return 2
    rows = []
    if args.camera:
        still = Path(args.still) if args.still else piutil.SAMPLES_DIR / "digit_7.png"
        try:
            name, grab = open_camera(args.camera_backend, still)
        except (RuntimeError, OSError, piutil.ImageError) as exc:
            print(f"classify.py: error: {exc}", file=sys.stderr)
            return 2
        if not args.json:
            print(f"camera: {name}", file=sys.stderr)
        for i in range(args.frames):
            frame = grab()
            # A real camera sees a small digit on a large page: zoom onto the ink.
            crop = args.crop or not name.startswith("still:")
            x = piutil.preprocess_digit(frame, invert=args.invert, crop=crop)
            probs, secs = clf(x)
            rows.append(report(f"{name}#{i}", probs, secs, args.top, args.json))
            if args.interval and i + 1 < args.frames:
                time.sleep(args.interval)
        return 0
    try:
        files = piutil.list_images(args.paths or [str(piutil.SAMPLES_DIR)])
    except FileNotFoundError as exc:
        print(f"classify.py: error: {exc}", file=sys.stderr)
        return 2
    if not files:
        print("classify.py: error: no image files found", file=sys.stderr)
        return 2
    failed = 0
    for f in files:
        try:
            img = piutil.read_image(f)
        except (OSError, piutil.ImageError) as exc:
            print(f"{f}: skipped ({exc})", file=sys.stderr)
            failed += 1
            continue
        probs, secs = clf(piutil.preprocess_digit(img, invert=args.invert, crop=args.crop))
        rows.append(report(str(f), probs, secs, args.top, args.json))
    if not args.json and rows:
        mean_ms = sum(r["ms"] for r in rows) / len(rows)
        print(f"{len(rows)} image(s), mean inference {mean_ms:.2f} ms", file=sys.stderr)
    return 1 if failed and not rows else 0


if __name__ == "__main__":
    sys.exit(main())
