"""int8 / fp16 builds vs the float build: size, accuracy, latency, per-op profile.

Builds the digits demo model and PP-OCRv4 det (from the installed
rapidocr_onnxruntime package) as float, int8 and fp16 artifacts, then, in one
process with 1 thread, times the float and quantized sessions interleaved
(median of ``--runs``) and sums ``Session.run_profiled`` per op type.

    python benchmarks/quant.py [--models digits,det] [--runs 40] [--profile]

A benchmark, not a test: the numbers depend on the machine and its load.
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import minirt  # noqa: E402
from minirt.builder.build import build  # noqa: E402

DIGITS = HERE.parent / "examples" / "digits"


def det_path() -> str | None:
    try:
        import rapidocr_onnxruntime as r
    except ImportError:
        return None
    p = os.path.join(os.path.dirname(r.__file__), "models", "ch_PP-OCRv4_det_infer.onnx")
    return p if os.path.exists(p) else None


def text_images(n: int, h: int = 320, w: int = 320, seed: int = 0) -> list[np.ndarray]:
    """Synthetic 'text lines' (dark strokes on a light page), normalised as PP-OCR does ((x - 0.5) / 0.5)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        img = np.full((h, w, 3), 0.9, np.float32) + rng.normal(0, 0.03, (h, w, 3)).astype(np.float32)
        for _line in range(rng.integers(3, 7)):
            y0, x0 = int(rng.integers(0, h - 24)), int(rng.integers(0, w // 3))
            lh = int(rng.integers(10, 22))
            x = x0
            while x < w - 10 and x < x0 + rng.integers(w // 3, w):
                cw = int(rng.integers(4, 12))
                glyph = rng.random((lh, cw)) < 0.35
                img[y0:y0 + lh, x:x + cw][glyph] = rng.uniform(0.0, 0.3)
                x += cw + int(rng.integers(1, 5))
        out.append(((np.clip(img, 0, 1) - 0.5) / 0.5).transpose(2, 0, 1)[None].astype(np.float32).copy())
    return out


def interleaved(sessions: dict, feed: dict, runs: int, warmup: int = 3) -> dict:
    times = {k: [] for k in sessions}
    for _ in range(warmup):
        for s in sessions.values():
            s.run(None, feed)
    keys = list(sessions)
    for i in range(runs):
        for k in (keys if i % 2 == 0 else keys[::-1]):
            t0 = time.perf_counter()
            sessions[k].run(None, feed)
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def profile(sess, feed, repeats=15) -> dict:
    acc: dict = collections.defaultdict(list)
    for _ in range(repeats):
        _, prof = sess.run_profiled(feed)
        per = collections.Counter()
        for _name, op, s in prof["nodes"]:
            per[op] += s
        per["(total)"] = prof["total_s"]
        for k, v in per.items():
            acc[k].append(v)
    return {k: statistics.median(v) for k, v in acc.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="digits,det")
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    for model in args.models.split(","):
        if model == "digits":
            src = str(DIGITS / "digits_cnn.onnx")
            with np.load(DIGITS / "heldout.npz") as d:
                images, labels = d["image"], d["label"]
            calib = str(DIGITS / "calibration.npz")
            evals = [{"image": images, "label": labels}]
            feeds = {"batch 1": {"image": images[:1]}, f"batch {len(images)}": {"image": images}}
        else:
            src = det_path()
            if src is None:
                print("det: rapidocr_onnxruntime not installed")
                continue
            imgs = text_images(6)
            calib = [{"x": x} for x in imgs[:4]]
            evals = [{"x": x} for x in imgs[4:]]
            feeds = {"1x3x320x320": {"x": imgs[4]}}
        t0 = time.perf_counter()
        art = {"float": build(src, None)}
        art["int8"] = build(src, None, quantize="int8", calibration=calib, eval_data=evals)
        # fp16 with the calibration feeds too, as a user with data builds it: the default fp16 budget is
        # fitted on every feed at hand (2 eval images alone overfit it, docs/decisions.md D23)
        art["fp16"] = build(src, None, quantize="fp16", calibration=calib, eval_data=evals)
        print(f"== {model}: built in {time.perf_counter() - t0:.1f} s")
        fb = art["float"].artifact_bytes
        for k in ("int8", "fp16"):
            q = art[k].quantization
            acc = {n: {m: round(v, 5) for m, v in r.items() if m in ("max_abs", "cosine", "float_accuracy",
                                                                       "quant_accuracy")}
                   for n, r in q["accuracy"].items()}
            kept = collections.Counter(r["reason"].split(":")[0] for r in q["kept_float"])
            print(f"  {k}: {art[k].artifact_bytes / fb:.3f}x size ({art[k].artifact_bytes} B vs {fb} B), {acc}")
            print(f"    kept float: {dict(kept)}")
        sess = {}
        for k in art:
            t0 = time.perf_counter()
            sess[k] = minirt.Session(art[k].data, threads=args.threads)
            t_load = time.perf_counter() - t0
            feed = next(iter(feeds.values()))
            t0 = time.perf_counter()
            sess[k].run(None, feed)
            print(f"  {k}: load {t_load * 1e3:.1f} ms, first run {(time.perf_counter() - t0) * 1e3:.1f} ms")
        if model == "det":  # out of sample: images the builds never saw
            fresh = text_images(3, seed=1)
            for k in ("int8", "fp16"):
                errs = [float(np.abs(sess[k].run(None, {"x": x})[0] - sess["float"].run(None, {"x": x})[0]).max())
                        for x in fresh]
                print(f"  {k}: max abs error vs float on 3 unseen images: {max(errs):.4f}")
        for label, feed in feeds.items():
            lat = interleaved(sess, feed, args.runs)
            print(f"  latency {label} ({args.runs} runs, {args.threads} thread(s), median): "
                  + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in lat.items())
                  + f"; int8/float {lat['int8'] / lat['float']:.3f}x, fp16/float {lat['fp16'] / lat['float']:.3f}x")
            if args.profile:
                pf, pq = profile(sess["float"], feed), profile(sess["int8"], feed)
                print(f"    {'op':24s} {'float ms':>9s} {'int8 ms':>9s}")
                for op in sorted(set(pf) | set(pq), key=lambda o: -(pf.get(o, 0) + pq.get(o, 0))):
                    print(f"    {op:24s} {pf.get(op, 0) * 1e3:9.3f} {pq.get(op, 0) * 1e3:9.3f}")


if __name__ == "__main__":
    main()
