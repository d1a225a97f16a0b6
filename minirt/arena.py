"""The session's arena: one static memory plan per input signature (docs/decisions.md D17).

A :class:`ArenaPlan` is built from one recorded run of a compiled plan
(``minirt.plan.Plan``: its steps, their reads and outputs, and each
value's last reader); it places every buffer with :func:`minirt.memplan.plan`
and checks the placement with :func:`minirt.memplan.verify`.  The session
hands each ``accepts_out`` kernel a view into a checked-out arena.
"""
from __future__ import annotations

import functools
import math
import _thread

import numpy as np

from minirt import memplan, pages
from minirt.errors import ResourceError


class Arena:
    """One checked-out arena: per step, its view (or None) and the call the run makes.

    ``calls[i]`` is the step's kernel with ``out=outs[i]`` already bound (made
    once per arena, so a planned run pays nothing per node for the plan), or
    the plain call for steps without a buffer.  ``span``: the (first, past-the-end)
    address of its memory.  ``program``: the native program recorded on it
    (``minirt.native.program``), the reason there is none (a string), or None
    before a run recorded one.  ``bound_programs``: the same for IOBinding runs, per
    set of caller's output buffers (``program.bound_key``; the last BOUND_PROGRAMS
    of them: a generator's KV cache per live generator, D123)."""

    __slots__ = ("outs", "calls", "span", "program", "bound_programs")
    BOUND_PROGRAMS = 4

    def __init__(self, outs: tuple, calls: tuple, span: tuple):
        self.outs, self.calls, self.span = outs, calls, span
        self.program = None
        self.bound_programs: dict = {}

    def keep_bound_program(self, bound: tuple, program) -> None:
        """Keep ``program`` (or the reason there is none) for the output buffers ``bound``, dropping the
        oldest kept one beyond BOUND_PROGRAMS (its buffers with it)."""
        programs = self.bound_programs
        programs.pop(bound, None)
        programs[bound] = program
        while len(programs) > self.BOUND_PROGRAMS:
            del programs[next(iter(programs))]


def _arena_memory(nbytes: int) -> np.ndarray:
    """``nbytes`` of uninitialised memory: numpy's allocator (which advises huge pages from 4 MB on) up to
    ``pages.PLAIN_PAGES_FROM_BYTES``, a private anonymous mapping without the advice from there on
    (minirt.pages: D85, D134)."""
    try:
        if nbytes < pages.PLAIN_PAGES_FROM_BYTES:
            return np.empty(nbytes, dtype=np.uint8)
        return np.frombuffer(pages.anonymous(nbytes), dtype=np.uint8)  # (the array keeps the mapping alive)
    except (MemoryError, OSError) as exc:  # (found by fuzzing: a process under an address-space limit)
        raise ResourceError(f"the memory plan's arena of {nbytes:,} bytes could not be allocated ({exc})") from None


def check_out(plan, i: int, step, args: list, out: np.ndarray, env: list) -> None:
    """Assert that step ``i``'s arena buffer overlaps no input and no other live value (tests)."""
    outputs = plan.graph.outputs
    for v, x in enumerate(env):
        if plan.last_use.get(v, -1) < i and v not in outputs:
            continue  # never read again (an unused result the plan no longer keeps)
        if isinstance(x, np.ndarray) and x is not out and np.may_share_memory(x, out) and not _placed_input(
                step, args, x, out):
            raise AssertionError(
                f"memory plan: the arena buffer of node {step.node.name!r} overlaps live value "
                f"{v} {x.dtype}{list(x.shape)}"
            )
    for x in args:
        if isinstance(x, np.ndarray) and np.may_share_memory(x, out) and not _placed_input(step, args, x, out):
            raise AssertionError(f"memory plan: the arena buffer of node {step.node.name!r} overlaps an input")


def _placed_input(step, args: list, x: np.ndarray, out: np.ndarray) -> bool:
    """Whether ``x`` is an input of ``step`` that its buffer ``out`` holds by design: of a Concat, one of its
    arguments, a C-contiguous piece of the C-contiguous ``out`` (Concat in place); of an op of
    _IN_PLACE_OPS, its first argument, exactly ``out``'s memory (result in place)."""
    lo, hi = out.ctypes.data, out.ctypes.data + out.nbytes
    if step.op.op_type in _IN_PLACE_OPS:
        return bool(args) and x is args[0] and x.ctypes.data == lo and x.nbytes == out.nbytes
    return (step.op.op_type == "Concat" and any(x is a for a in args) and x.flags.c_contiguous
            and out.flags.c_contiguous and lo <= x.ctypes.data and x.ctypes.data + x.nbytes <= hi)


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

    Results in place (:func:`_in_place_buffers`): the result of an op of
    :data:`_IN_PLACE_OPS` goes over its first input's buffer when that input
    is an earlier step's own buffer that dies at this step (nothing read
    later may alias it) and has the result's shape and dtype; its kernel
    then reads and writes the same memory.

    Concat in place: an input of a Concat whose pieces are contiguous in its
    result (every axis before the concat axis of size 1) that is some step's
    own arena buffer is placed inside the Concat's buffer, at its piece
    (:func:`_concat_inner_buffers`): its producer writes its result where the
    Concat would have copied it, and the Concat copies only the other inputs.
    The Concat's buffer then lives from the first such producer on.
    """

    __slots__ = ("results", "buffers", "offsets", "size", "placed", "inner", "copy_outputs", "steps", "_lock",
                 "_free", "arenas")

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
            # (an object dtype, strings, is never placed: numpy cannot view raw memory as references)
            if step.accepts_out and rec is not None and v0 >= 0 and v0 not in outputs and not rec[1].hasobject:
                shape, dtype = rec
                nbytes = math.prod(shape) * dtype.itemsize  # (math.prod: ~10x np.prod's speed on a tuple)
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
        # buffers placed inside a Concat's buffer: b -> (host buffer, byte offset); each host then
        # spans the lifetimes of its inner buffers, which memplan does not place on their own
        inner = _concat_inner_buffers(steps, placed, roots)
        # ... and results written over their input (_IN_PLACE_OPS), where the input dies at that step
        inner.update(_in_place_buffers(steps, placed, roots, buffers, set(inner) | {h for h, _ in inner.values()}))
        for b, (host, _) in inner.items():
            buffers[host][0] = min(buffers[host][0], buffers[b][0])
            buffers[host][1] = max(buffers[host][1], buffers[b][1])
        own = [b for b in range(len(buffers)) if b not in inner]
        self.buffers = [tuple(buffers[b]) for b in own]
        own_offsets, self.size = memplan.plan(self.buffers)
        memplan.verify(self.buffers, own_offsets, self.size)  # cheap, and only when a plan is made
        offsets = [0] * len(buffers)
        for b, off in zip(own, own_offsets):
            offsets[b] = off
        for b, (host, off) in inner.items():
            offsets[b] = offsets[host] + off
        self.offsets = offsets  # per placed buffer (inner ones inside their host's)
        self.inner = inner
        self.placed = tuple(placed)
        self.copy_outputs = frozenset(copy_outputs)
        self.steps = steps
        self._lock = _thread.allocate_lock()
        self._free: list = []
        self.arenas = 0  # arenas allocated so far (one per concurrent run at most)

    def _new_arena(self) -> Arena:
        from minirt import native

        raw = _arena_memory(self.size + 64)
        # Every buffer is written by its step in the run, one page fault per page; backing the arena now
        # takes one call instead, and the declared plan's arena (made while the session loads) is then
        # no part of the first run (D92: with the dry warm-up, which writes nothing, magika's first run
        # was 1.6-1.9x a steady one with its 2,100 faults)
        native.prefault(raw)
        base = (-raw.ctypes.data) % 64
        outs = [None] * len(self.steps)
        calls = [step.call for step in self.steps]
        for (u, shape, dtype), off in zip(self.placed, self.offsets):
            # (the ndarray constructor over raw's memory: half the time of slicing, viewing and reshaping,
            # which counted for a 16,000-node graph's load)
            outs[u] = np.ndarray(shape, dtype, raw, base + off)
            calls[u] = functools.partial(calls[u], out=outs[u])
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

    def has_program(self) -> bool:
        """Whether an idle arena holds a recorded native program."""
        arenas = list(self._free)
        return bool(arenas) and arenas[-1].program is not None and not isinstance(arenas[-1].program, str)

    def program_summary(self) -> str | None:
        """The native program of an idle arena: ``"N native calls"``, why it has none, or None when
        no run recorded one yet (or every arena is in use)."""
        arenas = list(self._free)
        program = arenas[-1].program if arenas else None
        if program is None or isinstance(program, str):
            return program
        return f"{program.n} native calls"


def replays(summary: str | None) -> bool:
    """Whether a program summary (:meth:`ArenaPlan.program_summary`) is a recorded program, "N native
    calls", rather than why there is none (a reason may end with those words: "... nor all made by
    native calls", D176)."""
    return bool(summary) and summary.endswith(" native calls") and summary.split(" ", 1)[0].isdigit()


def _own_buffers(steps, placed, roots) -> tuple[dict, dict]:
    """(slot -> buffer index, for values that are a step's own buffer; step -> its buffer index)."""
    buffer_of, step_buffer = {}, {}
    for b, (u, _, _) in enumerate(placed):
        step_buffer[u] = b
        v0 = steps[u].outs[0]
        if roots.get(v0) == frozenset((b,)):
            buffer_of[v0] = b
    return buffer_of, step_buffer


# Ops whose kernel computes its result over its input when the plan's buffer for the result is the input's
# own (each element read before it is written): Softmax's native rows (minirt/native/rowops_impl.h).  A
# softmax over attention scores reads and writes the largest tensor of a transformer: Whisper-tiny's
# [6, 1500, 1500] (54 MB) took 15.3 ms into a buffer of its own, whose lines the CPU reads before writing
# them, and 10.0 ms over its input; the arena loses the second 54 MB (D143).
_IN_PLACE_OPS = frozenset({"Softmax"})


def _in_place_buffers(steps, placed, roots, buffers, taken) -> dict:
    """Results to place over their step's first input (see :class:`ArenaPlan`): buffer -> (the input's
    buffer, 0).  Both must be steps' own buffers of one shape and dtype, neither in ``taken`` (inside or
    host of a Concat's buffer) nor already part of such a pair, and the input's lifetime (which covers
    every value that may alias it) must end at this step."""
    buffer_of, step_buffer = _own_buffers(steps, placed, roots)
    found: dict = {}
    paired: set = set()
    for u, step in enumerate(steps):
        b = step_buffer.get(u)
        if step.op.op_type not in _IN_PLACE_OPS or b is None or not step.ins:
            continue
        a = buffer_of.get(step.ins[0])
        if (a is None or a in taken or b in taken or a in paired or b in paired or buffers[a][1] != u
                or placed[a][1:] != placed[b][1:]):
            continue
        found[b] = (a, 0)
        paired.update((a, b))
    return found


def _concat_inner_buffers(steps, placed, roots) -> dict:
    """Buffers to place inside a Concat's buffer (see :class:`ArenaPlan`): buffer -> (host buffer, byte
    offset of its piece).

    For each Concat step with a buffer whose result has only 1s before the concat axis (so each input is
    one contiguous piece of it), a buffer goes inside when it is an earlier step's own result (not a
    view, not a graph input or constant), not already inside or host of another buffer, and either one
    input of the Concat (appearing once) or split, by one Split along the same axis, into parts that are
    consecutive inputs of the Concat in order (YOLO's C2f: Concat(Split(a), ...)).  Pieces are located
    from the front (up to the first input whose size is unknown here) and from the back; other inputs
    stay copies.  Whatever this decides, the result is the same: the Concat kernel copies every input
    that is not exactly at its piece."""
    buffer_of, step_buffer = _own_buffers(steps, placed, roots)
    split_of = {}  # first output slot of a Split step -> that step
    for step in steps:
        if step.op.op_type == "Split" and step.outs and step.outs[0] >= 0:
            split_of[step.outs[0]] = step
    inner: dict = {}
    hosts: set = set()
    for u, step in enumerate(steps):
        host = step_buffer.get(u)
        if step.op.op_type != "Concat" or host is None or host in inner:
            continue
        _, shape, dtype = placed[host]
        ax = _axis_of(step, len(shape), 1)
        if ax is None or any(d != 1 for d in shape[:ax]):
            continue
        piece = math.prod(shape[ax + 1:]) * dtype.itemsize  # bytes per index along the axis

        def fits(b) -> bool:
            if b is None or b == host or b in inner or b in hosts or placed[b][0] >= u:
                return False
            _, b_shape, b_dtype = placed[b]
            return (b_dtype == dtype and len(b_shape) == len(shape) and b_shape[:ax] == shape[:ax]
                    and b_shape[ax + 1:] == shape[ax + 1:])

        # the inputs as units: (buffer or None when it cannot go inside, inputs it covers)
        units, i, ins = [], 0, step.ins
        while i < len(ins):
            v = ins[i]
            split = split_of.get(v)
            if split is not None and _axis_of(split, len(shape), 0) == ax and \
                    tuple(ins[i:i + len(split.outs)]) == tuple(split.outs) and split.ins:
                b = buffer_of.get(split.ins[0])
                units.append((b if fits(b) else None, len(split.outs)))
                i += len(split.outs)
                continue
            b = buffer_of.get(v)
            units.append((b if fits(b) and ins.count(v) == 1 else None, 1))
            i += 1
        found, offset, front = [], 0, 0
        for b, _ in units:  # from the front, while every size is known
            if b is None:
                break
            found.append((b, offset))
            offset += placed[b][1][ax] * piece
            front += 1
        end = math.prod(shape) * dtype.itemsize
        for b, _ in reversed(units[front:]):  # from the back, likewise
            if b is None:
                break
            end -= placed[b][1][ax] * piece
            found.append((b, end))
        if found and offset <= end:
            for b, off in found:
                inner[b] = (host, off)
            hosts.add(host)
    return inner


def _axis_of(step, rank: int, default: int) -> int | None:
    """The step's ``axis`` attribute (``default`` when absent), in [0, rank), or None."""
    axis = step.call.keywords.get("axis", default) if isinstance(step.call, functools.partial) else default
    if not isinstance(axis, int):
        return None
    axis = axis + rank if axis < 0 else axis
    return axis if 0 <= axis < rank else None
