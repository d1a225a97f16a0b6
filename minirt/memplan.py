"""Static memory plan for fixed shapes: one arena, offsets reused by lifetime.

A buffer is ``(first_step, last_step, nbytes)``: it is live from the step that
produces it through the last step that reads it (inclusive).  :func:`plan`
assigns each buffer an offset in one arena so that no two buffers that are
live at the same time overlap; :func:`verify` checks exactly that property
(independently of how the plan was made).  Placement is greedy best-fit in
order of decreasing size (ties: earlier start first): each buffer goes into
the smallest gap, between buffers already placed that overlap it in time,
that can hold it; otherwise at the lowest offset past them.  Offsets are
aligned to ``alignment`` bytes (64: a cache line / AVX-512 vector).

This module is pure Python with no numpy dependency so that it can be tested
on random lifetime sets and used both by the runtime and by the builder.
"""
from __future__ import annotations

from typing import Sequence

Buffer = tuple  # (first_step, last_step, nbytes)


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


# The placement index (see plan): level 0 cuts the steps into blocks of _BLOCK steps, each level above
# into blocks _FANOUT times as long.  A buffer is listed at the lowest level whose blocks are at least as
# long as its lifetime, so in at most two blocks.
_BLOCK = 16
_FANOUT = 8


def plan(buffers: Sequence[Buffer], alignment: int = 64) -> tuple[list[int], int]:
    """Offsets (one per buffer, in input order) and the arena size in bytes.

    Near-linear in the number of buffers and the pairs that live at the same time: placed buffers are
    indexed by time blocks at several scales (a buffer in the at most two blocks of the scale of its
    lifetime), so placing a buffer looks at the blocks its own lifetime touches at each scale and at the
    few buffers listed there, each once or twice, not at every placed buffer nor at a long-lived buffer
    once per short block it spans (SSDlite's 517 buffers, lifetimes up to 1,469 of 1,666 steps: 1.17M
    looks with one scale for 51K pairs that live together, 48 ms).  The placement is the same as
    comparing with every placed buffer would give.
    """
    n = len(buffers)
    order = sorted(range(n), key=lambda i: (-buffers[i][2], buffers[i][0], i))
    sizes = [_align(max(int(b[2]), 1), alignment) for b in buffers]  # (aligned once, not per pair)
    # (the fields in lists of their own, and each placed buffer's end: the pair loop below runs ~50K times
    # on SSDlite, and unpacking a tuple or adding there made this 1.65x slower, D166)
    firsts = [b[0] for b in buffers]
    lasts = [b[1] for b in buffers]
    offsets = [0] * n
    ends = [0] * n
    levels: list[dict[int, list[int]]] = []  # per scale: time block -> buffers placed so far listed there
    seen = [-1] * n  # seen[j] == i: buffer j already collected while placing buffer i
    arena = 0
    for i in order:
        first, last = firsts[i], lasts[i]
        size = sizes[i]
        # intervals [offset, end) of placed buffers live at the same time, by offset
        busy = []
        width = _BLOCK
        for blocks in levels:
            for blk in range(first // width, last // width + 1):
                listed = blocks.get(blk)
                if listed is None:
                    continue
                for j in listed:
                    if seen[j] != i:
                        seen[j] = i
                        if firsts[j] <= last and first <= lasts[j]:
                            busy.append((offsets[j], ends[j]))
            width *= _FANOUT
        busy.sort()
        best, best_gap, cursor = None, None, 0
        for lo, hi in busy:
            gap = lo - cursor
            if gap >= size and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            if hi > cursor:
                cursor = hi
        offset = best if best is not None else cursor
        offsets[i] = offset
        ends[i] = offset + size
        level, width = 0, _BLOCK
        while width < last - first + 1:
            level += 1
            width *= _FANOUT
        while len(levels) <= level:
            levels.append({})
        blocks = levels[level]
        for blk in range(first // width, last // width + 1):
            listed = blocks.get(blk)
            if listed is None:
                blocks[blk] = [i]
            else:
                listed.append(i)
        if offset + size > arena:
            arena = offset + size
    return offsets, arena


def verify(buffers: Sequence[Buffer], offsets: Sequence[int], arena: int | None = None) -> None:
    """Raise ``AssertionError`` if two buffers live at the same time overlap in memory (or leave the arena)."""
    if len(offsets) != len(buffers):
        raise AssertionError(f"{len(offsets)} offsets for {len(buffers)} buffers")
    for i, (b, off) in enumerate(zip(buffers, offsets)):
        if b[0] > b[1]:
            raise AssertionError(f"buffer {i} ends (step {b[1]}) before it starts (step {b[0]})")
        if off < 0 or (arena is not None and off + b[2] > arena):
            raise AssertionError(f"buffer {i} [{off}, {off + b[2]}) lies outside the arena of {arena} bytes")
    # sweep over time: buffers sorted by start; compare with every buffer still live (an empty buffer
    # overlaps nothing: left out)
    lasts = [b[1] for b in buffers]
    ends = [off + b[2] for b, off in zip(buffers, offsets)]
    order = sorted((i for i in range(len(buffers)) if buffers[i][2]), key=lambda i: buffers[i][0])
    live: list[int] = []
    for i in order:
        start = buffers[i][0]
        live = [j for j in live if lasts[j] >= start]
        lo, hi = offsets[i], ends[i]
        for j in live:
            if lo < ends[j] and offsets[j] < hi:
                raise AssertionError(
                    f"buffers {j} (steps {buffers[j][0]}-{buffers[j][1]}, bytes [{offsets[j]}, {ends[j]})) and {i} "
                    f"(steps {buffers[i][0]}-{buffers[i][1]}, bytes [{lo}, {hi})) are live together and overlap"
                )
        live.append(i)


def peak_live_bytes(buffers: Sequence[Buffer]) -> int:
    """The lower bound for any arena: the largest total size live at one step."""
    # sweep: a buffer adds its size at its first step and removes it after its last one
    delta: dict[int, int] = {}
    for first, last, nbytes in buffers:
        delta[first] = delta.get(first, 0) + nbytes
        delta[last + 1] = delta.get(last + 1, 0) - nbytes
    peak = live = 0
    for step in sorted(delta):
        live += delta[step]
        peak = max(peak, live)
    return peak
