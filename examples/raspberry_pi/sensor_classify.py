#!/usr/bin/env python3
"""Classify machine-health sensor readings on a Pi with a gradient-boosted model (minirt, numpy only).

    python3 sensor_classify.py samples/sensor_readings.csv     # a CSV with the sensors' columns
    python3 sensor_classify.py --simulate 50 --interval 0.1     # a simulated stream, one reading at a time
    python3 sensor_classify.py readings.csv --json              # one JSON line per reading

The model (sensor_gbm.mrt beside this script by default) is trained and built on a desktop by
make_sensor_model.py.  Each reading is classified as it arrives (batch 1, as a monitoring loop would);
with a ``state`` column in the CSV the accuracy is printed at the end.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

import sensors  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Classify machine-health sensor readings with minirt.")
    p.add_argument("csv", nargs="?", help="readings with the columns " + ", ".join(sensors.FEATURES))
    p.add_argument("--model", default=str(HERE / "sensor_gbm.mrt"), help="the .mrt (default sensor_gbm.mrt here)")
    p.add_argument("--simulate", type=int, metavar="N", help="classify N simulated readings instead of a CSV")
    p.add_argument("--interval", type=float, default=0.0, help="seconds between simulated readings (default 0)")
    p.add_argument("--json", action="store_true", help="one JSON object per reading")
    args = p.parse_args(argv)
    if (args.csv is None) == (args.simulate is None):
        p.error("give a CSV file or --simulate N (one of the two)")
    if not Path(args.model).is_file():
        print(f"no model at {args.model}: build it on a desktop with make_sensor_model.py and copy it here",
              file=sys.stderr)
        return 2
    import minirt

    if args.simulate is not None:
        x, truth = sensors.simulate(args.simulate, seed=int(time.time()) & 0xFFFF)
        truth = [sensors.STATES[int(t)] for t in truth]
    else:
        try:
            x, truth = sensors.read_csv(args.csv)
        except (OSError, ValueError) as exc:
            print(exc, file=sys.stderr)
            return 2
    sess = minirt.InferenceSession(args.model)
    name = sess.get_inputs()[0].name
    right, times = 0, []
    for i, row in enumerate(x):
        if args.simulate is not None and args.interval and i:
            time.sleep(args.interval)
        t0 = time.perf_counter()
        label, probs = sess.run(None, {name: row[None, :]})
        times.append(time.perf_counter() - t0)
        state = sensors.STATES[int(label[0])]
        right += truth is not None and truth[i] == state
        if args.json:
            print(json.dumps({"reading": i, "state": state, "probability": round(float(np.max(probs[0])), 4),
                              **({"true_state": truth[i]} if truth is not None else {})}))
        else:
            print(f"{i:5d}  {state:13s} p={float(np.max(probs[0])):.3f}" + (f"  (true: {truth[i]})" if truth else ""))
    if not args.json:
        ms = np.array(times) * 1e3
        print(f"{len(x)} readings, median {np.median(ms):.3f} ms per reading (p90 {np.percentile(ms, 90):.3f} ms)"
              + (f", accuracy {right / len(x):.3f}" if truth else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
