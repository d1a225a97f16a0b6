"""The session's arena: one static memory plan per input signature (docs/decisions.md D17).

A :class:`ArenaPlan` is built from one recorded run of a compiled plan
(``minirt.session._Plan``: its steps, their reads and outputs, and each
value's last reader); it places every buffer with :func:`minirt.memplan.plan`
and checks the placement with :func:`minirt.memplan.verify`.  The session
hands each ``accepts_out`` kernel a view into a checked-out arena.
"""
from __future__ import annotations

import functools
import threading
import numpy as np

from minirt import memplan


class Arena:
    """One checked-out arena: per step, its view (or None) and the call the run makes.

    ``calls[i]`` is the step's kernel with ``out=outs[i]`` already bound (made
    once per arena, so a planned run pays nothing per node for the plan), or
    the plain call for steps without a buffer.  ``span``: the (first, past-the-end)
    address of its memory.  ``program``: the native program recorded on it
    (``minirt.native.program``), the reason there is none (a string), or None
    before a run recorded one."""

    __slots__ = ("outs", "calls", "span", "program")

    def __init__(self, outs: tuple, calls: tuple, span: tuple):
        self.outs, self.calls, self.span = outs, calls, span
        self.program = None


def check_out(plan, i: int, step, args: list, out: np.ndarray, env: list) -> None:
    """Assert that step ``i``'s arena buffer overlaps no input and no other live value (tests)."""
    outputs = plan.graph.outputs
    for v, x in enumerate(env):
        if plan.last_use.get(v, -1) < i and v not in outputs:
            continue  # never read again (an unused result the plan no longer keeps)
        if isinstance(x, np.ndarray) and x is not out and np.may_share_memory(x, out):
            raise AssertionError(
                f"memory plan: the arena buffer of node {step.node.name!r} overlaps live value "
                f"{v} {x.dtype}{list(x.shape)}"
            )
    for x in args:
        if isinstance(x, np.ndarray) and np.may_share_memory(x, out):
            raise AssertionError(f"memory plan: the arena buffer of node {step.node.name!r} overlaps an input")


class ArenaPlan:
    """The static memory plan of a main graph for one input signature (D17).

    Built from one recorded run (or, for the first run of fixed input shapes,
    from the shapes the graph declares: ``Session._declared_memory_plan``):
    every ``accepts_out`` step whose result is a
    non-empty array and not a graph output gets a buffer in one arena, live
    from that step through the last read of any value that may alias it
    (conservatively: the outputs of every other step may alias everything it
    reads, subgraph captures included; graph outputs that may alias a buffer
    keep it live to the end and are copied on return).  Placement is
    :func:`memplan.plan`, checked by :func:`memplan.verify` when built.
    Arenas are checked out per run from a free list (atomic pop / append), so
    concurrent runs never share one.
    """

    __slots__ = ("results", "buffers", "offsets", "size", "placed", "copy_outputs", "steps", "_lock", "_free",
                 "arenas")

    def __init__(self, plan, record: list):
        self.results = record  # per step, (shape, dtype) of its result or None: what the plan was made from
        steps = plan.steps
        n = len(steps)
        outputs = set(plan.graph.outputs)
        roots: dict[int, frozenset] = {}  # slot -> buffers it may reference
        buffers: list[list] = []  # [first step, last step, nbytes]
        placed: list[tuple] = []  # (step, shape, dtype), one per buffer
        empty: frozenset = frozenset()
        for u, step in enumerate(steps):
            rec = record[u]
            v0 = step.outs[0]
            if step.accepts_out and rec is not None and v0 >= 0 and v0 not in outputs:
                shape, dtype = rec
                nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                if nbytes > 0:
                    # an accepts_out kernel returns out or a fresh array, never a view of an input
                    roots[v0] = frozenset((len(buffers),))
                    buffers.append([u, u, nbytes])
                    placed.append((u, tuple(shape), dtype))
                    continue
                if step.accepts_out:
                    continue
            inherited = empty
            for v in step.reads:
                r = roots.get(v)
                if r:
                    inherited = inherited | r
            if inherited:
                for v in step.outs:
                    if v >= 0:
                        roots[v] = inherited
        last_use = plan.last_use
        copy_outputs = set()
        for v, r in roots.items():
            if v in outputs:
                last = n
                copy_outputs.add(v)
            else:
                last = last_use.get(v, -1)
            for b in r:
                if last > buffers[b][1]:
                    buffers[b][1] = last
        self.buffers = [tuple(b) for b in buffers]
        self.offsets, self.size = memplan.plan(self.buffers)
        memplan.verify(self.buffers, self.offsets, self.size)  # cheap, and only when a plan is made
        self.placed = tuple(placed)
        self.copy_outputs = frozenset(copy_outputs)
        self.steps = steps
        self._lock = threading.Lock()
        self._free: list = []
        self.arenas = 0  # arenas allocated so far (one per concurrent run at most)

    def _new_arena(self) -> Arena:
        raw = np.empty(self.size + 64, dtype=np.uint8)
        base = (-raw.ctypes.data) % 64
        outs = [None] * len(self.steps)
        calls = [step.call for step in self.steps]
        for (u, shape, dtype), off, (_, _, nbytes) in zip(self.placed, self.offsets, self.buffers):
            lo = base + off
            outs[u] = raw[lo:lo + nbytes].view(dtype).reshape(shape)
            calls[u] = functools.partial(self.steps[u].call, out=outs[u])
        lo = raw.ctypes.data + base
        return Arena(tuple(outs), tuple(calls), (lo, lo + self.size))

    def checkout(self) -> Arena:
        try:
            return self._free.pop()  # (list.pop and list.append are atomic: no lock on the hot path)
        except IndexError:
            pass
        with self._lock:
            self.arenas += 1
        return self._new_arena()

    def checkin(self, arena: Arena) -> None:
        self._free.append(arena)

    def program_summary(self) -> str | None:
        """The native program of an idle arena: ``"N native calls"``, why it has none, or None when
        no run recorded one yet (or every arena is in use)."""
        arenas = list(self._free)
        program = arenas[-1].program if arenas else None
        if program is None or isinstance(program, str):
            return program
        return f"{program.n} native calls"
