"""Time per native call of a replayed program, at each thread count: which calls scale and which do not.

    python benchmarks/program_calls.py mobilenet_v2            # a model of the real-world set
    python benchmarks/program_calls.py model.mrt feed.npz --threads 1,2 --runs 300

A node-by-node profile (``Session.run_profiled``) misstates small layers at 2 threads: between two
Python nodes the pool's worker falls asleep, and a small job then runs on the caller alone (kernels.c,
MRT_WAKE_MIN_WORK).  Here every run is the session's own replay, its calls timed one by one by
``mrt_program_run_timed`` (the calling thread's wall time per call, added over the runs).  Each thread
count runs in a process of its own (threads of one process would share the pool).  Prints, per call,
its node, op and mean time at each thread count, the ratio of the first count's time to each other's,
and the totals.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import json, sys
import numpy as np
import minirt
from minirt.native import program

path, feed_path, threads, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with np.load(feed_path) as f:
    feed = {k: f[k] for k in f.files}
sess = minirt.Session(path, threads=threads)
for _ in range(5):
    sess.run(None, feed)
programs = {}
untimed = program.Program.run

def timed(self, env, ns=None):
    return untimed(self, env, ns=programs.setdefault(id(self), (self, np.zeros(self.n)))[1])

program.Program.run = timed
for _ in range(runs):
    sess.run(None, feed)
if len(programs) != 1:
    sys.exit(f"{path}: {len(programs)} programs replayed (one expected: fixed input shapes, {sess.native_program_status()})")
((prog, ns),) = programs.values()
steps = sess._plan.steps
calls = [{"node": steps[s].node.name, "op": steps[s].op.op_type, "us": float(t) / runs / 1e3}
         for s, t in zip(prog.step_of_call, ns)]
print(json.dumps(calls))
"""


def per_call(path: str, feed: str, threads: int, runs: int) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", CHILD, path, feed, str(threads), str(runs)],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a .mrt file, or a model of the real-world set (benchmarks/realworld.py)")
    ap.add_argument("feed", nargs="?", help="an .npz of the inputs (with a .mrt file)")
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated (default 1,2)")
    ap.add_argument("--runs", type=int, default=200, help="timed runs per thread count (default 200)")
    args = ap.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    if args.model.endswith(".mrt"):
        if not args.feed:
            sys.exit("a .mrt file needs its feed (.npz)")
        path, feed = args.model, args.feed
    else:
        sys.path.insert(0, os.path.dirname(HERE))
        from benchmarks import run as bench

        prep = bench.prepare(args.model, "real")
        path, feed = prep["mrt"], prep["feed_path"]
    tables = {t: per_call(path, feed, t, args.runs) for t in counts}
    first = tables[counts[0]]
    head = "".join(f" {t}T us" for t in counts) + "".join(f" {counts[0]}T/{t}T" for t in counts[1:])
    print(f"{'#':>3} {'op':18s} {'node':50s}{head}")
    for i, call in enumerate(first):
        times = [tables[t][i]["us"] for t in counts]
        ratios = "".join(f" {times[0] / x:6.2f}" if x > 0 else "      -" for x in times[1:])
        print(f"{i:3d} {call['op'][:18]:18s} {call['node'][-50:]:50s}" + "".join(f" {x:6.1f}" for x in times) + ratios)
    totals = [sum(c["us"] for c in tables[t]) for t in counts]
    print(f"{'':3} {'total':18s} {'':50s}" + "".join(f" {x:6.0f}" for x in totals)
          + "".join(f" {totals[0] / x:6.2f}" for x in totals[1:]))


if __name__ == "__main__":
    main()
