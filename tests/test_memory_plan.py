"""The static memory plan (minirt.memplan): placement and its independent verifier."""
from __future__ import annotations

import random

import pytest

from minirt import memplan


def _random_buffers(rng: random.Random, n: int, steps: int) -> list:
    out = []
    for _ in range(n):
        a = rng.randrange(steps)
        b = rng.randrange(a, min(steps, a + rng.randrange(1, 8)))
        out.append((a, b, rng.choice([1, 4, 64, 100, 4096, rng.randrange(1, 1 << 20)])))
    return out


@pytest.mark.parametrize("seed", range(200))
def test_random_plans_verify_and_are_tight(seed):
    rng = random.Random(seed)
    bufs = _random_buffers(rng, rng.randrange(1, 60), rng.randrange(1, 40))
    offsets, arena = memplan.plan(bufs)
    memplan.verify(bufs, offsets, arena)
    assert all(o % 64 == 0 for o in offsets)
    lower = memplan.peak_live_bytes(bufs)
    assert lower <= arena <= sum(-(-max(b[2], 1) // 64) * 64 for b in bufs)


def test_reuse_across_lifetimes():
    # a chain: each buffer dies when the next but one is made, so two slots suffice
    bufs = [(i, i + 1, 1000) for i in range(10)]
    offsets, arena = memplan.plan(bufs)
    memplan.verify(bufs, offsets, arena)
    assert arena == 2 * 1024


@pytest.mark.parametrize("seed", range(50))
def test_verifier_catches_overlaps(seed):
    rng = random.Random(1000 + seed)
    bufs = _random_buffers(rng, rng.randrange(2, 40), 20)
    offsets, arena = memplan.plan(bufs)
    # move one buffer onto another one that is live at the same time
    pairs = [(i, j) for i in range(len(bufs)) for j in range(len(bufs))
             if i != j and memplan._overlap_in_time(bufs[i], bufs[j])]
    if not pairs:
        pytest.skip("no buffers live together in this draw")
    i, j = rng.choice(pairs)
    bad = list(offsets)
    bad[i] = offsets[j]
    with pytest.raises(AssertionError, match="overlap"):
        memplan.verify(bufs, bad)


def test_verifier_checks_arena_bounds():
    with pytest.raises(AssertionError, match="outside"):
        memplan.verify([(0, 1, 100)], [10], arena=64)
