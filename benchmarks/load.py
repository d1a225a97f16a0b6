"""Loading a huge graph (issue 22): session creation plus the first run, minirt against onnxruntime.

The graph is a chain of N elementwise nodes (Add, Mul, Relu, Sub over a 1x64 float tensor, 64
constants): nothing but per-node costs, the case where a loader or a planner that is quadratic in the
node count shows (the first round's memory planner took 46 s at 16,000 nodes).  The builder writes the
artifact at opt level 0 so that the chain keeps every node.  Each repetition loads both runtimes in
turn in this process; the figure is the median of ``--reps`` per-thread CPU times (``time.thread_time``),
which the shared machine's load does not distort.

    python -m benchmarks.load [--nodes 1000,4000,16000] [--reps 5] [--out benchmarks/results_load.md]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import minirt
from minirt import builder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, "benchmarks", ".cache", "load")
WIDTH = 64


def chain_model(n: int) -> onnx.ModelProto:
    """N nodes in one chain: Add, Mul, Relu, Sub in turn, each binary one with one of 64 constants."""
    nodes, prev = [], "x"
    for i in range(n):
        op = ("Add", "Mul", "Relu", "Sub")[i % 4]
        inputs = [prev] if op == "Relu" else [prev, f"c{i % 64}"]
        nodes.append(helper.make_node(op, inputs, [f"v{i}"], name=f"n{i}"))
        prev = f"v{i}"
    constants = [numpy_helper.from_array(np.full((1, WIDTH), 1.0 + k / 1000, np.float32), f"c{k}") for k in range(64)]
    graph = helper.make_graph(nodes, f"chain{n}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, WIDTH])], constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def artifacts(n: int) -> tuple[str, str]:
    """(ONNX path, .mrt path) of the N-node chain, made once into the benchmark cache."""
    os.makedirs(CACHE, exist_ok=True)
    onnx_path, mrt_path = os.path.join(CACHE, f"chain{n}.onnx"), os.path.join(CACHE, f"chain{n}.mrt")
    if not os.path.exists(onnx_path):
        onnx.save(chain_model(n), onnx_path)
    if not os.path.exists(mrt_path):
        builder.build(onnx_path, mrt_path, opt_level=0)
    return onnx_path, mrt_path


def load_and_run(make, feed: dict) -> tuple[float, float]:
    """(seconds to create the session, seconds of its first run), per-thread CPU time."""
    t0 = time.thread_time()
    session = make()
    t1 = time.thread_time()
    session.run(None, feed)
    return t1 - t0, time.thread_time() - t1


def measure(n: int, reps: int) -> dict:
    onnx_path, mrt_path = artifacts(n)
    feed = {"x": np.ones((1, WIDTH), np.float32)}
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3  # (not its warning per constant that the Relu nodes leave unused)
    mine, theirs = [], []
    for _ in range(reps):
        mine.append(load_and_run(lambda: minirt.Session(mrt_path, threads=1), feed))
        theirs.append(load_and_run(lambda: ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"]),
                                   feed))

    def median(rows: list, i: int | None = None) -> float:
        return statistics.median(sum(r) if i is None else r[i] for r in rows)

    return {"nodes": n, "minirt_session": median(mine, 0), "minirt_first_run": median(mine, 1),
            "minirt_total": median(mine), "ort_total": median(theirs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,4000,16000", help="chain lengths, comma-separated")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results_load.md"))
    args = parser.parse_args()
    lines = ["| nodes | minirt session | minirt first run | minirt total | onnxruntime total | ratio |",
             "|---|---|---|---|---|---|"]
    for n in (int(v) for v in args.nodes.split(",")):
        r = measure(n, args.reps)
        lines.append(f"| {n:,} | {r['minirt_session'] * 1e3:.0f} ms | {r['minirt_first_run'] * 1e3:.0f} ms | "
                     f"{r['minirt_total'] * 1e3:.0f} ms | {r['ort_total'] * 1e3:.0f} ms | "
                     f"{r['minirt_total'] / r['ort_total']:.2f}x |")
        print(lines[-1], flush=True)
    with open(args.out, "w") as f:
        f.write("# Loading a huge graph: session plus first run (median per-thread CPU time)\n\n"
                "`python -m benchmarks.load`: a chain of elementwise nodes, built at opt level 0; both runtimes "
                "at 1 thread, loaded in turn in one process.\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
