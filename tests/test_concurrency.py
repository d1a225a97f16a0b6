"""One Session shared by many threads gives exactly the serial results.

A session is compiled once and ``run`` keeps all per-run state in a fresh
slot list, so concurrent runs must not see each other's values.  Each thread
feeds its own inputs (different batch sizes too) and the outputs must be
bitwise identical to running the same inputs one after another.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

import minirt
from tests.fuzz.seeds import attrs_model, conv_model, mlp_model

THREADS = 8
RUNS = 1000


def _build(model_fn):
    from minirt.builder import build_bytes

    return build_bytes(model_fn())


def _inputs(sess: minirt.Session, thread: int, runs: int) -> list[dict]:
    rng = np.random.default_rng(1000 + thread)
    feeds = []
    for _ in range(runs):
        feed = {}
        batch = int(rng.integers(1, 4))
        for arg in sess.get_inputs():
            shape = [d if isinstance(d, int) else batch for d in arg.shape]
            feed[arg.name] = rng.standard_normal(shape).astype(np.float32)
        feeds.append(feed)
    return feeds


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes() for x, y in zip(a, b)
    )


@pytest.mark.parametrize("model_fn,runs", [(mlp_model, RUNS), (attrs_model, RUNS), (conv_model, 250)],
                         ids=["mlp", "attrs", "conv"])
def test_shared_session_matches_serial_runs(model_fn, runs):
    sess = minirt.Session(_build(model_fn))
    feeds = [_inputs(sess, t, runs) for t in range(THREADS)]
    expected = [[sess.run(None, f) for f in thread_feeds] for thread_feeds in feeds]

    results: list = [None] * THREADS
    errors: list = []
    start = threading.Barrier(THREADS)

    def worker(t: int) -> None:
        try:
            start.wait()
            results[t] = [sess.run(None, f) for f in feeds[t]]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append((t, exc))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads), "a thread hung"
    assert not errors, errors
    for t in range(THREADS):
        bad = [i for i in range(runs) if not _same(results[t][i], expected[t][i])]
        assert not bad, f"thread {t}: {len(bad)} runs differ from the serial run, first at run {bad[0]}"


def test_outputs_are_not_shared_between_runs():
    """A caller mutating one run's output must not change another run's."""
    sess = minirt.Session(_build(attrs_model))
    x = np.ones((2, 6), np.float32)
    first = sess.run(None, {"x": x})
    for arr in first:
        if arr.flags.writeable:
            arr[...] = 0
    second = sess.run(None, {"x": x})
    again = minirt.Session(_build(attrs_model)).run(None, {"x": x})
    assert _same(second, again)
