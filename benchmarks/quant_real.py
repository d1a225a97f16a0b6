"""int8 on the real-world set, side by side with onnxruntime's own quantization.

For each model of ``benchmarks/realworld.py`` chosen (by default the convolutional ones), from the
**same** calibration feeds:

* minirt: ``minirt build --quantize int8 --target host --calibration <feeds>`` (static int8, its
  default settings: per-channel weights, minmax ranges, the target's speed rules);
* onnxruntime: ``onnxruntime.quantization.quantize_static`` (QDQ, per-channel, uint8 activations,
  int8 weights, MinMax), the recipe onnxruntime documents for CNNs on x86.

and reports, per model: file sizes (float and int8, both runtimes), latency at 1 thread of the four
sessions interleaved in one process (median of the calling thread's CPU time: the host is shared),
and accuracy of each int8 model against its own runtime's float model on held-out feeds (cosine of
the first output, the worst of the feeds, and top-1 agreement for classifiers).

Calibration and held-out feeds are the benchmark feed plus draws of the same distribution (standard
normal images: these models have random weights, so output cosine against float is the accuracy
measure, not a task metric), except for the trained PP-OCR models, whose feeds are rendered text
(benchmarks/task_metrics.py's pages, fitted to the input shape as rapidocr normalises images): noise
is not what they see, and their int8 accuracy on noise says little (benchmarks/task_metrics.py has
their task metrics).

    python benchmarks/quant_real.py [--mode static|dynamic] [--models a,b] [--calib 8] [--runs 20] [--out DIR]

``--mode dynamic`` compares minirt's ``--quantize int8-dynamic`` with onnxruntime's ``quantize_dynamic``
(QInt8 weights) on the models people quantize that way (transformers, recurrent, magika).  Writes
``results_quant.md`` / ``.json`` (dynamic: ``results_quant_dynamic.*``) into ``benchmarks/`` unless
``--out``.  A benchmark, not
a test: the numbers depend on the machine and its load.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import realworld  # noqa: E402

DEFAULT_MODELS = ["mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0", "shufflenet_v2", "regnet_y_400mf",
                  "resnet18", "squeezenet", "ppocr_det", "ppocr_cls"]
# --mode dynamic: the models people quantize dynamically (MatMul / recurrent weights)
DYNAMIC_MODELS = ["bert_mini", "deit_tiny", "magika", "whisper_tiny_enc", "crnn", "kws_gru"]


def draws(feed: dict, n: int, seed: int) -> list[dict]:
    """n feeds like ``feed``: float inputs drawn from a normal of the feed's mean and spread, integer
    inputs from the feed's range."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        f = {}
        for k, v in feed.items():
            if np.issubdtype(v.dtype, np.floating):
                f[k] = (rng.standard_normal(v.shape) * (float(v.std()) or 1.0) + float(v.mean())).astype(v.dtype)
            else:
                f[k] = rng.integers(int(v.min()), int(v.max()) + 1, v.shape).astype(v.dtype)
        out.append(f)
    return out


def text_feeds(feed: dict, n: int, seed: int) -> list[dict]:
    """``n`` feeds shaped like the PP-OCR ``feed`` (input "x": N x 3 x H x W) made of rendered text: each
    image a page (or one line of it, for the 48-pixel-high line models) resized into H x W on white,
    normalised as rapidocr does ((v / 255 - 0.5) / 0.5)."""
    from PIL import Image

    from task_metrics import render_pages

    batch, _, h, w = feed["x"].shape
    with tempfile.TemporaryDirectory() as tmp:
        pages = render_pages(n * batch, seed=seed, folder=Path(tmp))
        images = []
        for path, _lines in pages:
            with Image.open(path) as img:
                img = img.convert("RGB")
                if h <= 64:  # a line model: the page's first line
                    img = img.crop((0, 0, img.width, min(img.height, int(img.height / max(1, len(_lines))) + 10)))
                scale = min(w / img.width, h / img.height)
                img = img.resize((max(1, int(img.width * scale)), max(1, int(img.height * scale))))
                canvas = Image.new("RGB", (w, h), "white")
                canvas.paste(img, (0, 0))
                images.append((np.asarray(canvas, np.float32).transpose(2, 0, 1) / 255.0 - 0.5) / 0.5)
    return [{"x": np.stack(images[i * batch:(i + 1) * batch]).astype(np.float32)} for i in range(n)]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    den = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / den) if den else float(np.array_equal(a, b))


def accuracy(run_float, run_int8, feeds: list[dict]) -> dict:
    """Worst cosine of the first output over the feeds, and top-1 agreement when it is (1, classes)."""
    cos, agree, classifier = [], 0, True
    for f in feeds:
        a, b = np.asarray(run_float(f)[0]), np.asarray(run_int8(f)[0])
        cos.append(cosine(a, b))
        classifier = classifier and a.ndim == 2 and a.shape[1] > 1
        agree += int(np.array_equal(a.argmax(-1), b.argmax(-1)))
    return {"cosine_min": min(cos), "cosine_mean": statistics.fmean(cos),
            "top1_agreement": agree / len(feeds) if classifier else None}


def ort_quantize(onnx_path: str, calib: list[dict], out: str) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(calib)

        def get_next(self):
            return next(self.it, None)

    quantize_static(onnx_path, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)


def ort_quantize_dynamic(onnx_path: str, out: str) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(onnx_path, out, weight_type=QuantType.QInt8)


def one_model(name: str, ncalib: int, runs: int, work: Path, mode: str = "static") -> dict:
    import onnxruntime as ort

    import minirt
    from minirt import builder

    onnx_path, feed, dynamic = realworld.obtain(name)
    values = realworld.MODELS[name].input_values
    shapes = {k: list(v.shape) for k, v in feed.items() if k not in values}
    if name.startswith("ppocr"):  # (trained on text: calibrated and judged on rendered text, not noise)
        calib, held_out = text_feeds(feed, ncalib, seed=11), text_feeds(feed, 4, seed=12)
    else:
        calib = [feed] + draws(feed, ncalib - 1, seed=1)
        held_out = draws(feed, 4, seed=2)
    cal_dir = work / f"{name}.calib"
    cal_dir.mkdir(exist_ok=True)
    for i, f in enumerate(calib):
        np.savez(cal_dir / f"{i}.npz", **f)
    float_mrt, int8_mrt = work / f"{name}.mrt", work / f"{name}.int8.mrt"
    builder.build(onnx_path, str(float_mrt), input_shapes=shapes, input_values=values, target="host")
    t0 = time.perf_counter()
    if mode == "static":
        report = builder.build(onnx_path, str(int8_mrt), input_shapes=shapes, input_values=values, target="host",
                               quantize="int8", calibration=str(cal_dir))
    else:  # weights int8, activations quantized per run
        report = builder.build(onnx_path, str(int8_mrt), input_shapes=shapes, input_values=values, target="host",
                               quantize="int8-dynamic")
    build_s = time.perf_counter() - t0
    quant = getattr(report, "quantization", None)
    ort_int8 = str(work / f"{name}.ort_int8.onnx")
    if mode == "static":
        ort_quantize(onnx_path, calib, ort_int8)
    else:
        ort_quantize_dynamic(onnx_path, ort_int8)

    so = minirt.SessionOptions()
    so.intra_op_num_threads = 1
    sessions = {"minirt float": minirt.InferenceSession(str(float_mrt), so),
                "minirt int8": minirt.InferenceSession(str(int8_mrt), so)}
    oo = ort.SessionOptions()
    oo.intra_op_num_threads = 1
    oo.log_severity_level = 3
    sessions["onnxruntime float"] = ort.InferenceSession(onnx_path, oo, providers=["CPUExecutionProvider"])
    sessions["onnxruntime int8"] = ort.InferenceSession(ort_int8, oo, providers=["CPUExecutionProvider"])
    runners = {k: (lambda s: lambda f: s.run(None, f))(s) for k, s in sessions.items()}
    for _ in range(3):
        for fn in runners.values():
            fn(feed)
    times: dict = {k: [] for k in runners}
    names = list(runners)
    for i in range(runs):
        for k in names if i % 2 == 0 else reversed(names):
            t = time.thread_time()
            runners[k](feed)
            times[k].append(time.thread_time() - t)
    lat = {k: statistics.median(v) for k, v in times.items()}
    return {
        "model": name,
        "build_int8_s": build_s,
        "quantized_layers": len(quant.get("quantized", [])) if isinstance(quant, dict) else None,
        "size": {"minirt float": float_mrt.stat().st_size, "minirt int8": int8_mrt.stat().st_size,
                 "onnxruntime float": os.path.getsize(onnx_path), "onnxruntime int8": os.path.getsize(ort_int8)},
        "latency_s": lat,
        "accuracy": {
            "minirt": accuracy(runners["minirt float"], runners["minirt int8"], held_out),
            "onnxruntime": accuracy(runners["onnxruntime float"], runners["onnxruntime int8"], held_out),
        },
    }


def table(results: list[dict]) -> str:
    rows = ["| model | size int8/float minirt, ort | minirt int8 / minirt float | onnxruntime int8 / its float "
            "| **minirt int8 / onnxruntime int8** | minirt float / ort float | cosine vs float (worst of 4) minirt, ort "
            "| top-1 agreement minirt, ort |",
            "|---|---|---|---|---|---|---|---|"]
    ratios = []
    for r in results:
        if "error" in r:
            rows.append(f"| {r['model']} | error: {r['error']} |||||||")
            continue
        s, lat, acc = r["size"], r["latency_s"], r["accuracy"]
        mi, mf, oi, of = (lat["minirt int8"], lat["minirt float"], lat["onnxruntime int8"], lat["onnxruntime float"])
        ratios.append(mi / oi)
        top = [acc[k]["top1_agreement"] for k in ("minirt", "onnxruntime")]
        rows.append(
            f"| {r['model']} | {s['minirt int8'] / s['minirt float']:.2f}, "
            f"{s['onnxruntime int8'] / s['onnxruntime float']:.2f} "
            f"| {mi / mf:.2f} ({mi * 1e3:.2f} / {mf * 1e3:.2f} ms) | {oi / of:.2f} ({oi * 1e3:.2f} / {of * 1e3:.2f} ms) "
            f"| **{mi / oi:.2f}** | {mf / of:.2f} "
            f"| {acc['minirt']['cosine_min']:.4f}, {acc['onnxruntime']['cosine_min']:.4f} "
            f"| {'-' if top[0] is None else f'{top[0]:.2f}'}, {'-' if top[1] is None else f'{top[1]:.2f}'} |")
    if ratios:
        rows.append(f"\nGeometric mean of minirt int8 / onnxruntime int8: "
                    f"**{math.exp(statistics.fmean(math.log(x) for x in ratios)):.2f}x** over {len(ratios)} models.")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["static", "dynamic"], default="static",
                    help="static: int8 with calibration vs quantize_static; dynamic: int8-dynamic vs quantize_dynamic")
    ap.add_argument("--models", default=None, help="comma-separated names (default: the mode's set)")
    ap.add_argument("--calib", type=int, default=8, help="calibration feeds (the benchmark feed + draws)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out", default=str(HERE))
    realworld.add_native_kernels_flag(ap)
    args = ap.parse_args(argv)
    realworld.require_native_kernels(ap, args.allow_numpy_kernels)
    from minirt import native

    results = []
    with tempfile.TemporaryDirectory(prefix="minirt-quant-") as tmp:
        models = args.models or ",".join(DEFAULT_MODELS if args.mode == "static" else DYNAMIC_MODELS)
        for name in [m for m in models.split(",") if m]:
            if name not in realworld.MODELS:
                print(f"unknown model {name!r}; the set: {', '.join(realworld.MODELS)}", file=sys.stderr)
                return 2
            print(f"{name} ...", flush=True)
            try:
                results.append(one_model(name, args.calib, args.runs, Path(tmp), args.mode))
            except Exception as exc:  # noqa: BLE001 - one model's failure is a row of the table
                results.append({"model": name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"})
            print(json.dumps(results[-1], default=str)[:300], flush=True)
    env = {"machine": platform.machine(), "cpus": os.cpu_count(), "native": native.describe(),
           "date": time.strftime("%Y-%m-%d %H:%M")}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)  # (a new folder: the results go there, not into a traceback)
    stem = "results_quant" if args.mode == "static" else "results_quant_dynamic"
    (out / f"{stem}.json").write_text(json.dumps({"environment": env, "mode": args.mode, "results": results},
                                                 indent=1, default=str))
    how = (f"Same {args.calib} calibration feeds for both quantizers (minirt `--quantize int8`, onnxruntime "
           f"`quantize_static` QDQ per-channel u8/s8)" if args.mode == "static" else
           "No calibration: minirt `--quantize int8-dynamic`, onnxruntime `quantize_dynamic` (QInt8 weights)")
    md = (f"# int8 ({args.mode}): minirt vs onnxruntime's quantization, real-world set\n\nGenerated by "
          f"`python benchmarks/quant_real.py --mode {args.mode}` on {env['date']} ({env['native']}). Latency: "
          f"1 thread, the four sessions interleaved in one process, median of the calling thread's CPU time over "
          f"{args.runs} runs. {how}; accuracy on 4 held-out feeds against each runtime's own float model (random "
          f"weights: output cosine, not a task metric).\n\n" + table(results) + "\n")
    (out / f"{stem}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
