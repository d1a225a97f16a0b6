"""The native thread pool oversubscribed: more threads than CPUs.

Runs in a child process pinned to one CPU (affinity is per process and inherited by the pool's
workers, which start on the first parallel job), so the test process keeps its own CPUs.  How fast
it is there is a benchmark's question (docs/decisions.md D34); this checks that every run finishes
with the one-thread result while the worker and the caller share the CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from minirt import builder
from minirt import native

pytestmark = [
    pytest.mark.skipif(not native.available, reason="native kernels not available"),
    pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)"),
]

PINNED_CHILD = textwrap.dedent(
    """
    import json, os, sys
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import numpy as np
    import minirt
    from minirt import native
    x = {"x": np.random.default_rng(1).standard_normal((1, 16, 48, 48)).astype(np.float32)}
    (expected,) = minirt.Session(sys.argv[1], threads=1).run(None, x)
    sess = minirt.Session(sys.argv[1], threads=2)
    same = True
    for _ in range(int(sys.argv[2])):
        (y,) = sess.run(None, x)
        same = same and np.array_equal(y, expected)
    print(json.dumps({"cpus": len(os.sched_getaffinity(0)), "same": bool(same)}))
    """
)


@pytest.fixture(scope="module")
def conv_stack(tmp_path_factory):
    """Three 3x3 convs, 16 -> 32 -> 32 -> 32 channels on 48 x 48: each one parallel job of ~0.1-0.3 ms."""
    rng = np.random.default_rng(0)
    inits, nodes, c, prev = [], [], 16, "x"
    for i in range(3):
        w = nh.from_array((rng.standard_normal((32, c, 3, 3)) * 0.1).astype(np.float32), f"w{i}")
        inits.append(w)
        out = "y" if i == 2 else f"c{i}"
        nodes.append(h.make_node("Conv", [prev, f"w{i}"], [out], pads=[1, 1, 1, 1]))
        c, prev = 32, out
    model = h.make_model(
        h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 16, 48, 48])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 32, 48, 48])], inits),
        opset_imports=[h.make_opsetid("", 17)],
    )
    path = tmp_path_factory.mktemp("pool") / "convs.mrt"
    builder.build(model, path)
    return str(path)


def test_two_threads_on_one_cpu_give_the_one_thread_result(conv_stack):
    """Pinned to one CPU with threads=2, the worker runs only when the caller gives the CPU up (the
    pool's spin-waits yield): jobs the worker joins late, or never, still complete, and the results
    are bit-identical to one thread's."""
    env = {k: v for k, v in os.environ.items() if k not in ("MINIRT_DISABLE_NATIVE", "MINIRT_NATIVE_ISA")}
    proc = subprocess.run([sys.executable, "-c", PINNED_CHILD, conv_stack, "60"], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["cpus"] == 1
    assert r["same"], "threads=2 on one CPU changed the result"


STARTS_CHILD = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import minirt
    from minirt.native import blas
    tasks = lambda: len(os.listdir("/proc/self/task"))
    # (numpy's OpenBLAS workers first stopped, as a session stops them (D136): only ours are counted)
    blas.set_threads(1)
    blas.stop_idle_threads()
    before = tasks()
    minirt.Session(sys.argv[1], threads=1)
    one = tasks()
    minirt.Session(sys.argv[1], threads=3)
    three = tasks()
    minirt.Session(sys.argv[1], threads=2)
    print(json.dumps({"before": before, "one": one, "three": three, "again": tasks()}))
    """
)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc (Linux)")
def test_a_session_starts_its_workers_when_it_is_created(conv_stack):
    """D129: a session of N threads starts the pool's N - 1 workers when it is created (not during its
    first run's layers); one of 1 thread starts none, and a later session reuses the workers."""
    env = {k: v for k, v in os.environ.items() if k not in ("MINIRT_DISABLE_NATIVE", "MINIRT_NATIVE_ISA")}
    env["MINIRT_WARM_UP"] = "0"  # (no warm-up run: only the start itself may create the workers)
    proc = subprocess.run([sys.executable, "-c", STARTS_CHILD, conv_stack], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["one"] == r["before"]
    assert r["three"] == r["before"] + 2
    assert r["again"] == r["three"]


AFFINITY_CHILD = textwrap.dedent(
    """
    import json, os, sys
    import minirt
    here = os.sched_getaffinity(0)
    minirt.Session(sys.argv[1], threads=2)
    main = os.getpid()
    workers = {}
    for t in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{t}/status") as f:
            line = next(l for l in f if l.startswith("Cpus_allowed_list"))
        workers[t] = line.split(":")[1].strip()
    print(json.dumps({"process": sorted(here), "main": workers.pop(str(main)), "others": sorted(workers.values())}))
    """
)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 if hasattr(os, "sched_getaffinity") else True,
                    reason="pinning needs 2 CPUs")
@pytest.mark.parametrize("pin", ["1", "0"])
def test_workers_are_pinned_one_cpu_each_unless_told_not_to(conv_stack, pin):
    """D131: a worker runs on one CPU (the caller stays free to move); MINIRT_PIN_THREADS=0 leaves every
    thread the process's CPUs."""
    env = {k: v for k, v in os.environ.items() if k not in ("MINIRT_DISABLE_NATIVE", "MINIRT_NATIVE_ISA")}
    env["MINIRT_PIN_THREADS"] = pin
    proc = subprocess.run([sys.executable, "-c", AFFINITY_CHILD, conv_stack], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not r["main"].isdigit()  # the caller keeps the process's CPUs (2 or more here)
    singles = [w for w in r["others"] if w.isdigit()]
    if pin == "1":
        assert len(singles) == 1 and int(singles[0]) in r["process"]  # the one worker, on one allowed CPU
    else:
        assert not singles  # (numpy's BLAS thread and the worker keep the process's CPUs)


# The start of a child process whose pool has one worker, and worker_ns(): (time the pool's workers spent
# on a CPU, per the scheduler; how many there are).
WORKER_CHILD_HEAD = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np
    from minirt import native
    native.set_threads(2)
    native.start_threads(2)

    def worker_ns():
        total = found = 0
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    if not f.read().startswith("minirt-worker"):
                        continue
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
                found += 1
            except (OSError, ValueError):
                pass
        return total, found
    """
)

SLEEPING_CHILD = WORKER_CHILD_HEAD + textwrap.dedent(
    """
    small = np.ones((128, 128), np.float32)
    big = np.ones((512, 512), np.float32)
    ys, yb = np.empty_like(small), np.empty_like(big)
    time.sleep(0.3)  # (a worker spins for ~0.1 ms after its last job, then sleeps)
    t0, found = worker_ns()
    for _ in range(300):
        native.sgemm(small, small, ys)  # (~4 units of MRT_MIN_WORK_PER_THREAD: 2 parts, a small job)
    t1, _ = worker_ns()
    for _ in range(20):
        native.sgemm(big, big, yb)
    t2, _ = worker_ns()
    print(json.dumps({"found": found, "small_ns": t1 - t0, "big_ns": t2 - t1,
                      "same": bool(np.array_equal(ys, small @ small) and np.array_equal(yb, big @ big))}))
    """
)


COLD_GEMV_CHILD = WORKER_CHILD_HEAD + textwrap.dedent(
    """
    k = int(sys.argv[1])
    rng = np.random.default_rng(0)
    b = rng.standard_normal((k, 1000)).astype(np.float32)
    b.flags.writeable = False  # (a model's constant: packed once)
    packed = native.sgemm_pack_b(b, 0, 1000, k, 1000, b)
    a = rng.standard_normal((1, k)).astype(np.float32)
    c = np.empty((1, 1000), np.float32)
    spent = 0
    for _ in range(8):
        time.sleep(0.05)  # (the worker goes to sleep between the products, as after a pooling layer)
        t0 = worker_ns()[0]
        native.sgemm_pb(a, 1, 1000, k, packed, c)
        spent += worker_ns()[0] - t0
    print(json.dumps({"worker_ns": spent, "right": bool(np.allclose(c, a @ b, rtol=1e-4, atol=1e-3))}))
    """
)


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads /proc/self/task (Linux)")
def test_a_one_row_product_of_a_b_larger_than_l2_wakes_the_worker():
    """A classifier at batch 1 whose B is over 2 MiB streams it from memory: worth waking a sleeping worker
    (D152; MobileNetV2's 1280 x 1000, 5 MB); a 1 MB one stays under the wake threshold (D142)."""
    def run(k: int) -> dict:
        proc = subprocess.run([sys.executable, "-c", COLD_GEMV_CHILD, str(k)], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        out = json.loads(proc.stdout)
        assert out["right"]
        return out

    # Woken, the worker still needs its core: when another process holds it, the caller may have claimed
    # every chunk before the worker ran (its CPU time then stays near 0 though it was woken).  So up to three
    # tries for the big product; a pool that never wakes the worker for it fails all three.
    for _attempt in range(3):
        big = run(1280)
        if big["worker_ns"] > 200_000:  # (woken for each of the 8 products)
            break
    assert big["worker_ns"] > 200_000, big
    small = run(256)  # (a busy machine only lowers the worker's time: no retry needed)
    assert small["worker_ns"] < big["worker_ns"] / 4, (small, big)


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads /proc/self/task (Linux)")
def test_small_jobs_leave_sleeping_workers_asleep():
    """A small job runs on the caller alone while the workers sleep (D142): 300 of them wake no worker,
    where each used to (a futex wake-up, then the worker's spin), and a big job still gets the worker."""
    proc = subprocess.run([sys.executable, "-c", SLEEPING_CHILD], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout)
    if not r["found"] or not os.path.exists(f"/proc/self/task/{os.getpid()}/schedstat"):
        pytest.skip("no named pool worker or no schedstat in /proc")
    assert r["same"]
    assert r["small_ns"] < 2_000_000, r  # (woken 300 times, it ran tens of milliseconds)
    assert r["big_ns"] > r["small_ns"], r
