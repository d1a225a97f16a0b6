"""Per Android API level: share of nodes and FLOPs lowered to NNAPI, TFLite-vs-onnxruntime error, CPU leftovers.

    .venv/bin/python -m tests.nnapi.measure_levels [--det-size 640]
"""
from __future__ import annotations

import argparse
import collections

import numpy as np


def main() -> None:
    import onnxruntime as ort

    import minirt
    from minirt import providers
    from tests.nnapi.helpers import REAL_MODELS, NNAPIOnTFLite, build_partitioned, random_feeds

    ap = argparse.ArgumentParser()
    ap.add_argument("--det-size", type=int, default=640)
    ap.add_argument("--levels", default="27,28,29,30,31,33,34")
    args = ap.parse_args()
    providers.register(NNAPIOnTFLite())
    models = dict(REAL_MODELS)
    models["ppocr_det"] = (models["ppocr_det"][0], {"x": (1, 3, args.det_size, args.det_size)})
    for name, (path_fn, shapes) in models.items():
        path = path_fn()
        feeds = random_feeds(shapes)
        ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
        for level in [int(x) for x in args.levels.split(",")]:
            art, plan, m = build_partitioned(path, f"android-api{level}", shapes)
            rep = plan.report()
            total = len(list(m.graph))
            lowered = sum(p["nodes"] for p in rep["partitions"])
            sess = minirt.Session(art, providers=["nnapi", "cpu"])
            got = sess.run(None, feeds)
            err = max(float(np.abs(r - g).max()) for r, g in zip(ref, got))
            ops = collections.Counter()
            for p in rep["partitions"]:
                ops["min_api"] = max(ops["min_api"], p["options"].get("min_api_level", 0))
            print(f"{name} API{level}: {len(rep['partitions'])} partition(s), nodes {lowered}/{total} "
                  f"({100 * lowered / total:.1f}%), FLOPs {100 * rep['accelerated_share']:.2f}% of "
                  f"{rep['total_flops'] / 1e6:.1f} MFLOPs, max|tflite-ort| {err:.3g}, programs need API "
                  f"{ops['min_api']}", flush=True)
            cpu = collections.Counter((c.get("op", "?"), c.get("reason", "")) for c in rep["cpu_nodes"])
            for (op, why), n in cpu.items():
                print(f"    cpu: {n} x {op}: {why}", flush=True)


if __name__ == "__main__":
    main()
