#!/usr/bin/env python3
"""Desktop side of the sensor example: train a gradient-boosted classifier on simulated machine-health
readings, convert it to ONNX (skl2onnx) and build it for the Pi with minirt.

    pip install -e '.[dev]'                 # scikit-learn, skl2onnx and the builder
    python3 make_sensor_model.py --target rpi4
    scp sensor_gbm.mrt samples/sensor_readings.csv pi@raspberrypi:minirt/examples/raspberry_pi/

Writes sensor_gbm.onnx and sensor_gbm.mrt beside this script (or under --out) and a CSV of held-out
readings with their true states (samples/sensor_readings.csv), which sensor_classify.py reads.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

import sensors  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Train, convert and build the sensor example's model.")
    p.add_argument("--target", default="rpi4", help="minirt target profile (default rpi4)")
    p.add_argument("--trees", type=int, default=200, help="boosting rounds (default 200)")
    p.add_argument("--out", default=str(HERE), help="folder for sensor_gbm.onnx / .mrt (default: beside this script)")
    p.add_argument("--samples", default=str(HERE / "samples" / "sensor_readings.csv"),
                   help="where to write the held-out readings (default samples/sensor_readings.csv)")
    args = p.parse_args(argv)
    try:
        from skl2onnx import to_onnx
        from sklearn.ensemble import GradientBoostingClassifier
    except ImportError as exc:
        print(f"make_sensor_model.py needs scikit-learn and skl2onnx ({exc}): pip install -e '.[dev]'",
              file=sys.stderr)
        return 2
    from minirt.builder import build

    x, y = sensors.simulate(4000, seed=1)
    model = GradientBoostingClassifier(n_estimators=args.trees, max_depth=3, learning_rate=0.1, random_state=0)
    model.fit(x, y)
    held_x, held_y = sensors.simulate(200, seed=2)
    print(f"trained {args.trees} trees; held-out accuracy {model.score(held_x, held_y):.3f}")
    # zipmap=False: probabilities as one float tensor [n, states] rather than a list of dicts
    onx = to_onnx(model, x[:1], options={id(model): {"zipmap": False}}, target_opset={"": 17, "ai.onnx.ml": 3})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    onnx_path, mrt_path = out / "sensor_gbm.onnx", out / "sensor_gbm.mrt"
    onnx_path.write_bytes(onx.SerializeToString())
    build(str(onnx_path), str(mrt_path), target=args.target)
    samples = Path(args.samples)
    samples.parent.mkdir(parents=True, exist_ok=True)
    sensors.write_csv(samples, held_x, held_y)
    print(f"wrote {onnx_path} ({onnx_path.stat().st_size:,} bytes), {mrt_path} ({mrt_path.stat().st_size:,} bytes) "
          f"for {args.target}, and {len(held_x)} readings to {samples}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
