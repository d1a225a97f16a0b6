"""Native programs: a fixed-shape run replayed by one C call (docs/decisions.md D32).

With a static memory plan (fixed input shapes), every run of a model makes the same native calls
on the same buffers: the same prepared arguments, the same arena views, only the input arrays
differ.  A small model (the demo's digits CNN: five to seven nodes of a few microseconds each)
spends more time in Python between those calls than in them.  So a session records one run's calls
(:class:`Recorder`) and, when every node of the run was such a call, replays them from then on with
``mrt_program_run`` (``program_impl.h``), patching only the input pointers (:class:`Program`).

What makes a replay exact is the record/replay contract (kernels.h above ``mrt_arg``;
docs/runtime.md, "Native programs"): the wrappers of ``minirt/native/__init__.py`` record each call
and check what they can (``RECORDABLE`` there), :meth:`Recorder.end` checks each node and
:func:`build` the buffers.  While recording, else the run stays in Python:

* every call of the node is to an entry point a program replays (``native.RECORDABLE``);
* every node declared its result complete (``native.final``: the kernels do so only on the paths
  where the result is exactly what their native calls wrote, with no numpy work around them) and
  made at least one call; or it is a reshape-like node whose result is its input's memory, as is;
* every buffer a call reads is a model input (patched per run), an arena view, a buffer an earlier
  call wrote, or one of the model's constants; anything else (a numpy copy made on the way, say)
  refuses the program;
* no call writes into a model input, except a call that updates a whole input in place through the
  pointer it reads it by (a KV cache bound as past input and present output, D123: patched, so the
  replay writes into that run's input); buffers written outside the arena are kept by the program
  (the same ones every run) and the graph outputs are copied out of it;
* scalars (quantization scales, thread count) are constants of the recorded calls: a kernel whose
  scalars come from the data (dynamic quantization) never declares its result final.

A program belongs to one arena (its pointers are that arena's), is used by one run at a time (an
arena is checked out per run) and is discarded when the ISA in use or the thread count changes.
"""
from __future__ import annotations

import numpy as np

import bisect
import contextlib
import functools

from minirt import native as _native
from minirt.errors import RunTerminated
from minirt.vocabulary import RANDOM, RESHAPES

# The two cffi entry points a replay calls (looked up once: a replay of a small model is a few us).
_from_buffer = _native._ffi.from_buffer if _native._ffi is not None else None
_program_run = getattr(_native._lib, "mrt_program_run", None)
_program_run_timed = getattr(_native._lib, "mrt_program_run_timed", None)

# Nodes whose result may be a view of their input (same memory, nothing computed): a program skips them.
VIEW_OPS = RESHAPES | {"Identity"}
# ... and nodes whose results may be views of parts of their input (Split along an axis whose parts
# are contiguous, e.g. channels of one image; a Slice of such a part).
PART_VIEW_OPS = frozenset({"Split", "Slice"})
# ... and nodes whose result may need no call at all: a Concat whose inputs the memory plan placed in
# its result (minirt/arena.py) and whose kernel declared it final after copying none of them.
IN_PLACE_OPS = frozenset({"Concat"})
# Nodes whose result is fixed by the input shapes alone, which are the same on every run of a program
# (a program belongs to one input signature's memory plan): Shape / Size.  A node without native calls
# whose array inputs are all such results or the model's constants is fixed too ("derived"), unless
# its op draws random numbers or keeps state: the shape arithmetic of dynamic-shape graphs (Shape ->
# Gather -> Concat -> Reshape, ConstantOfShape for an RNN's initial state) then costs a replay nothing.
SHAPE_OPS = frozenset({"Shape", "Size"})
@functools.cache
def _not_derived() -> frozenset:
    """Ops whose result is never fixed: random draws, state kept across runs (the kernel index, read on
    the first recording: importing minirt does not load it)."""
    from minirt.kernels._index import INDEX
    return RANDOM | {"Dropout"} | {op for (_, op), families in INDEX.items()
                                   if "stateful" in families or "randomness" in families}
# A derived result is kept as a read-only copy outside the arena, for the program's life: at most this
# big (shape arithmetic is a few int64 values; a larger result is data, left to the rules above).
DERIVED_MAX_BYTES = 256 * 1024


class DryRecordingRefused(RuntimeError):
    """A dry recording (a warm-up, D92) met a value it would have to compute: the warm-up runs for real."""


class Recorder:
    """Records a run's native calls, node by node (:meth:`begin`, :meth:`end`), on this thread.

    Use as a context manager around the run.  ``steps`` gets, per node, its calls, or None for a
    view node or a constant one (its result in ``constants``: ``native.constant_result``, or derived
    from the input shapes and the model's constants: SHAPE_OPS); ``refused`` is the first reason the
    run cannot be a program (None while it can).  ``model_constants``: the graph's constant arrays;
    ``output_slots``: its outputs."""

    def __init__(self, model_constants=(), output_slots=()):
        self.steps: list = []
        self.nodes: list = []  # per step, "node 'name' (OpType)": what build() names when a buffer refuses
        self.constants: list = []
        self.refused: str | None = None
        self._first = 0
        self._outer = (None, None, None)
        # the arrays fixed for every run of the program, by id (held here, so that no id is reused): the
        # model's constants, derived results and views of them
        self._fixed = {id(a): a for a in model_constants}
        self._outputs = frozenset(output_slots)  # (a graph output must come from the program's calls)

    def __enter__(self):
        # (recordings nest: an If / Loop body records its own program while the enclosing graph's run
        # records, D76; the enclosing one's state comes back on exit)
        rec = _native._recording
        self._outer = (rec.calls, rec.final, rec.constant)
        rec.calls = []
        rec.final = rec.constant = None
        return self

    def __exit__(self, *exc):
        rec = _native._recording
        rec.calls, rec.final, rec.constant = self._outer
        return False

    def begin(self) -> None:
        self._first = len(_native._recording.calls)
        _native._recording.final = _native._recording.constant = None

    def end(self, step, args, result):
        """After a node ran: keep its calls, or say why it cannot be replayed.  Returns the node's
        result for the run to go on with: ``result``, or its read-only copy when it is derived."""
        if self.refused is not None:
            return result
        calls = _native._recording.calls[self._first:]
        name = f"node {step.node.name!r} ({step.op.op_type})"
        self.nodes.append(name)
        if self._derived(step, args, result, calls):  # (its calls, if any, need not run again)
            self.steps.append(None)
            return self.constants[-1]
        unreplayable = next((call[0] for call in calls if call[1] is None), None)
        if unreplayable is not None:
            self.refused = f"{name} is not one native call with nothing around it ({unreplayable}: not replayed)"
            self.steps.append(None)
            return result
        x = args[0] if args else None
        if not calls and step.op.op_type in PART_VIEW_OPS and all(
                _is_part_of(r, x) for r in (result if type(result) is tuple else (result,))):
            if not all(a is None or not getattr(getattr(a, "flags", None), "writeable", True) for a in args[1:]):
                # parts chosen by computed sizes or starts (a Loop's iteration number): a replay would
                # read this run's parts
                self.refused = f"{name} takes parts chosen by computed values"
            self._note_views(result, x)
            self.steps.append(None)
            return result
        if step.subgraphs:
            self.refused = f"{name} has subgraphs"
        elif calls and _native._recording.final is result:
            # (a kernel of several outputs declares their tuple: every part written by its calls)
            self.steps.append(calls)
            return result
        elif len(step.outs) != 1:
            self.refused = f"{name} has several outputs, neither parts of its input nor all made by native calls"
        elif not calls and step.op.op_type in IN_PLACE_OPS and _native._recording.final is result:
            self.steps.append(None)  # every input was at its place in the result already
            return result
        elif not calls and step.op.op_type in VIEW_OPS and _is_view_of(result, args[0] if args else None):
            self._note_views(result, x)
            self.steps.append(None)
            return result
        elif (not calls and _native._recording.constant is result and type(result) is np.ndarray
              and not result.flags.writeable):
            self.constants.append(result)
            self._fixed[id(result)] = result
            self.steps.append(None)
            return result
        else:
            self.refused = f"{name} is not one native call with nothing around it"
        self.steps.append(None)
        return result

    def is_fixed(self, a) -> bool:
        """Whether ``a`` is the same array on every run of the program (a constant, a derived result or
        a view of one): an If whose condition is fixed may have its branch recorded inline (D94)."""
        return type(a) is np.ndarray and id(a) in self._fixed

    def mark(self) -> int:
        """Where the steps of an inlined branch will start (:meth:`end_inlined`)."""
        return len(self.steps)

    @contextlib.contextmanager
    def inlined(self):
        """While an If's branch records into this recorder: the branch's slots are not the graph's,
        so none of them is one of its outputs (whether the If's results may be is :func:`build`'s check
        of every graph output)."""
        outputs, self._outputs = self._outputs, frozenset()
        try:
            yield
        finally:
            self._outputs = outputs

    def end_inlined(self, step, mark: int, result):
        """After an If whose branch ran inline (its nodes' steps from ``mark`` on): those steps become
        the If's one step (a failing call then names the If)."""
        if self.refused is not None:
            return result
        inner = self.steps[mark:]
        del self.steps[mark:]
        del self.nodes[mark:]
        self.nodes.append(f"node {step.node.name!r} (If)")
        self.steps.append([call for s in inner if s for call in s] or None)
        return result

    def _derived(self, step, args, result, calls=()) -> bool:
        """Whether the node's result is fixed for the program (see SHAPE_OPS); if so it is kept as a
        read-only copy (the last of ``constants``), which later nodes read instead.  A dry recording
        (``_native._recording.dry``) did not run the node's native ``calls``: it cannot keep their
        result, and stops (:class:`DryRecordingRefused`)."""
        op = step.op.op_type
        if _native._recording.constant is result:
            return False  # (declared constant by its kernel: kept as it is, below, not copied)
        if (type(result) is not np.ndarray or result.nbytes > DERIVED_MAX_BYTES or op in _not_derived()
                or step.subgraphs or any(v in self._outputs for v in step.outs)):
            return False
        if op not in SHAPE_OPS and not all(a is None or (type(a) is np.ndarray and id(a) in self._fixed)
                                           for a in args):
            return False
        if calls and _native._recording.dry:
            raise DryRecordingRefused(f"node {step.node.name!r} ({op}) is fixed for the program and computed "
                                      "by native calls, which a dry recording does not run")
        fixed = _aligned_copy(result)
        fixed.flags.writeable = False
        self._fixed[id(fixed)] = fixed
        self.constants.append(fixed)
        return True

    def _note_views(self, result, x) -> None:
        """A view node's results (views or parts of x) are fixed when x is."""
        if type(x) is np.ndarray and id(x) in self._fixed:
            for r in result if type(result) is tuple else (result,):
                self._fixed[id(r)] = r



def _aligned_copy(a: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``a`` starting on a 64-byte boundary, as the artifact's own constants do:
    a derived value may be a weight that kernels read in place (an RNN's recurrent product read weights
    at numpy's 16-byte offset 1.4x slower)."""
    out = _native.aligned_empty(a.shape, a.dtype)
    out[...] = a
    return out


def _is_view_of(result, x) -> bool:
    """Whether ``result`` is ``x``'s memory as is (both C-contiguous arrays on the same bytes)."""
    return (type(result) is np.ndarray and type(x) is np.ndarray and result.flags.c_contiguous
            and x.flags.c_contiguous and result.nbytes == x.nbytes
            and (result.nbytes == 0 or result.ctypes.data == x.ctypes.data))


def _is_part_of(part, x) -> bool:
    """Whether ``part`` is a C-contiguous view of bytes inside ``x``'s memory (x C-contiguous)."""
    if type(part) is not np.ndarray or type(x) is not np.ndarray or not (part.flags.c_contiguous
                                                                          and x.flags.c_contiguous):
        return False
    if part.nbytes == 0:
        return True
    lo, hi = _span(x)
    return lo <= part.ctypes.data and part.ctypes.data + part.nbytes <= hi


def _span(a: np.ndarray) -> tuple[int, int]:
    lo = a.ctypes.data
    return lo, lo + a.nbytes


def _within(span, regions) -> bool:
    lo, hi = span
    return any(rlo <= lo and hi <= rhi for rlo, rhi in regions)


def _overlaps(span, regions) -> bool:
    lo, hi = span
    return any(lo < rhi and rlo < hi for rlo, rhi in regions)


class _Spans:
    """A fixed set of address ranges [lo, hi) that answers :func:`_within` and :func:`_overlaps` in
    O(log n): sorted by start, with the running maximum of the ends (ranges may overlap: views of
    one another).  A model's constants are hundreds of ranges, checked against every recorded call."""

    def __init__(self, spans):
        spans = sorted(spans)
        self.los = [lo for lo, _ in spans]
        self.max_hi = []
        top = -1
        for _, hi in spans:
            top = max(top, hi)
            self.max_hi.append(top)

    def contains(self, span) -> bool:
        """Whether one range holds all of ``span``: among those starting at or before it, the furthest end."""
        i = bisect.bisect_right(self.los, span[0])
        return i > 0 and self.max_hi[i - 1] >= span[1]

    def overlaps(self, span) -> bool:
        """Whether a range shares a byte with ``span``: among those starting before its end, one ends after its start."""
        i = bisect.bisect_left(self.los, span[1])
        return i > 0 and self.max_hi[i - 1] > span[0]


class Program:
    """One arena's recorded run (see the module docstring), built by :func:`build`."""

    __slots__ = ("isa", "threads", "calls", "n", "args", "keep", "patches", "targets", "outputs", "aliases",
                 "step_of_call", "rc", "bound")

    def run(self, env, ns=None) -> int:
        """Run the calls for the inputs in ``env`` (indexed by input slot: the session's slots, or a
        dict).  Returns -1 when every call succeeded, -2 when this program cannot run these inputs
        (one is not C-contiguous: the caller runs the nodes instead), else the index of the node
        whose call failed (its code in ``self.rc[0]``).  ``ns``: a float64 array of ``self.n`` to which
        each call's elapsed nanoseconds are added (``mrt_program_run_timed``; the node of call i is
        ``step_of_call[i]``), for per-call profiles of a replay (benchmarks/program_calls.py)."""
        if ns is not None and (ns.dtype != np.float64 or ns.size != self.n or not ns.flags.c_contiguous):
            raise ValueError(f"Program.run: ns must be {self.n} contiguous float64 values")
        pinned = []  # the cffi views of the inputs, alive until the calls return
        for target, slot in self.targets:
            try:
                p = _from_buffer("char[]", env[slot])
            except ValueError:  # (cffi takes C-contiguous buffers only)
                return -2
            pinned.append(p)
            target.p = p
        if ns is None:
            failed = _program_run(self.calls, self.n, self.rc)
        else:
            failed = _program_run_timed(self.calls, self.n, self.rc, _from_buffer("double[]", ns))
        if failed >= 0 and self.rc[0] == _native.CANCELLED:  # (a watched run stopped: plan.Cancellation)
            raise RunTerminated("the run was stopped (RunOptions.terminate or its timeout) while its native "
                                "program ran")
        return -1 if failed < 0 else self.step_of_call[failed]

    def results(self, slots, env=None) -> list:
        """Copies of the graph outputs ``slots`` after a run (the program's buffers serve the next run).
        An output that is one of the inputs as is (``aliases``: a Loop body's condition passed through)
        is taken from this run's inputs ``env``."""
        outputs = self.outputs
        if self.aliases:
            return [(env[self.aliases[v]] if v in self.aliases else outputs[v]).copy() for v in slots]
        if len(slots) == 1:  # (the common case, without a comprehension's frame: ~0.2 us)
            return [outputs[slots[0]].copy()]
        return [outputs[v].copy() for v in slots]

    def usable(self, threads, bound=()) -> bool:
        """Whether it may run for a session whose thread setting is ``threads``: the native module
        state and the setting it was recorded under still hold (its calls carry both); and for a run
        whose caller's output buffers are ``bound`` (:func:`bound_key`; none for a plain run): its
        calls write into the buffers of the run it was recorded on."""
        return self.threads == threads and self.bound == bound and _native.isa == self.isa and _native.available


def bound_key(out_slots, buffers, input_ids) -> tuple:
    """The caller's output buffers of an IOBinding run, as a program recorded on such a run must find
    them again to be replayed: per bound output, its slot and its buffer's address, shape and dtype (the
    program writes there); or its slot alone when the buffer is one of the run's inputs (``input_ids``:
    their ids), which the program patches per run: a KV cache updated in place, whichever cache it is
    (each generator of minirt.genai has its own; the caller checks that the input is the same one)."""
    return tuple((v,) if id(b) in input_ids else (v, b.__array_interface__["data"][0], b.shape, b.dtype.str)
                 for v, b in zip(out_slots, buffers) if b is not None)


def build(recorder: Recorder, inputs: dict, outputs: dict, constants, arena_span, threads=None,
          bound=()) -> "Program | str":
    """The program of a recorded run, or why there is none.

    ``inputs`` / ``outputs``: the run's graph inputs and outputs, slot -> value; ``constants``: the
    graph's constant arrays; ``arena_span``: (first, past-the-end) address of the arena's memory;
    ``threads``: the session's thread setting during the run; ``bound``: the run's caller's output
    buffers (:func:`bound_key`, IOBinding: the program's calls write into them)."""
    if recorder.refused is not None:
        return recorder.refused
    feeds = {v: _span(a) for v, a in inputs.items() if type(a) is np.ndarray and a.nbytes}  # slot -> span
    constant_spans = _Spans(_span(a) for a in list(constants) + recorder.constants
                            if type(a) is np.ndarray and a.nbytes)
    written = [arena_span]  # memory whose contents the program itself makes
    keep, patches, flat, step_of_call = [], [], [], []
    for u, calls in enumerate(recorder.steps):
        for name, args, reads, writes in calls or ():
            j = len(flat)
            for pos, a in reads:
                if a is None or not a.nbytes:
                    continue
                span = _span(a)
                slot = next((v for v, f in feeds.items() if f[0] == span[0] and span[1] <= f[1]), None)
                if slot is not None and a.flags.c_contiguous:
                    patches.append((j, pos, slot))
                elif _overlaps(span, feeds.values()):
                    return f"{recorder.nodes[u]}: call {name} reads part of a model input"
                elif not (_within(span, written) or constant_spans.contains(span)):
                    return f"{recorder.nodes[u]}: call {name} reads a buffer made outside the recorded calls"
            in_place = {pos for jj, pos, _ in patches if jj == j}  # (this call's patched inputs)
            for pos, a in writes:
                if a is None or not a.nbytes:
                    continue
                span = _span(a)
                if pos in in_place and a.flags.c_contiguous and any(f == span for f in feeds.values()):
                    # an input the call updates in place, patched as it reads it: a KV cache bound as
                    # both past input and present output (IOBinding, D123); the caller's memory, not kept
                    continue
                if _overlaps(span, feeds.values()) or constant_spans.overlaps(span):
                    return f"{recorder.nodes[u]}: call {name} writes into a model input or constant"
                if not _within(span, written):
                    written.append(span)
                    keep.append(a)  # a buffer of its own (not in the arena): the same one every run
            flat.append((name, args))
            step_of_call.append(u)
    aliases = {}  # output slot -> input slot, for an output that is an input as is
    for v, a in outputs.items():
        same = next((i for i, x in inputs.items() if x is a), None) if type(a) is np.ndarray else None
        if same is not None:
            aliases[v] = same
        elif type(a) is not np.ndarray or (a.nbytes and not _within(_span(a), written)):
            return f"graph output {v} is not made by the recorded calls"
    if not flat:
        return "no native calls"
    # the program's own buffers are written on every run: backed now, not page by page in the first
    # replay (a dry recording, D92, wrote none of them)
    for span in written[1:]:
        _native.prefault_span(*span)
    prog = Program()
    prog.isa, prog.threads, prog.bound = _native.isa, threads, bound
    prog.calls, prog.args = _c_calls(flat)
    prog.n = len(flat)
    # The recorded arguments hold the cffi pointers, and these their arrays: kept, except the inputs of
    # the recorded run (patched on every run; holding them would keep the caller's arrays alive).
    patched = {(j, pos) for j, pos, _ in patches}
    prog.keep = (keep, [tuple(None if (j, k) in patched else a for k, a in enumerate(args))
                        for j, (_, args) in enumerate(flat)])
    prog.patches = tuple(patches)
    prog.targets = tuple((prog.args[j] + pos, slot) for j, pos, slot in patches)  # (mrt_arg *, input slot)
    prog.outputs = outputs
    prog.aliases = aliases
    prog.step_of_call = tuple(step_of_call)
    prog.rc = _native._ffi.new("int *")
    return prog


def _c_calls(flat) -> tuple:
    """The ``mrt_call`` array of the recorded calls, and the ``mrt_arg`` array of each: every
    argument stored in the union member of its parameter's C type (as ``program_impl.h`` reads it)."""
    ffi, lib = _native._ffi, _native._lib
    calls = ffi.new("mrt_call[]", len(flat))
    arg_arrays = []
    for i, (name, args) in enumerate(flat):
        params = ffi.typeof(getattr(lib, name)).args
        if len(params) != len(args):  # (a recording bug: the C side would read garbage)
            raise AssertionError(f"native program: {name} takes {len(params)} arguments, {len(args)} recorded")
        arr = ffi.new("mrt_arg[]", len(args))
        for k, (value, ctype) in enumerate(zip(args, params)):
            setattr(arr[k], "p" if ctype.kind == "pointer" else _MEMBER[ctype.cname], value)
        calls[i].entry = getattr(lib, "MRT_CALL_" + name[len("mrt_"):].upper())
        calls[i].args = arr
        arg_arrays.append(arr)
    return calls, arg_arrays


_MEMBER = {"int": "i", "long": "l", "float": "f"}  # mrt_arg member of each scalar parameter type
