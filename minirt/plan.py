"""The compiled plan: a graph turned into a flat tuple of steps over integer slots, and its runs.

:class:`Plan` compiles one graph of an artifact once, at session load: each step holds its kernel
with the attributes already decoded and bound, the integer slots of its inputs and outputs and
the slots whose last reader it is.  Running it walks that tuple over a list of slots (``env``):
no graph walk, no name lookup, no dict access per node.  Also here: the subgraphs handed to
control-flow kernels (:class:`BoundSubgraph`), the recording of a planned run as a native program
and its replay (D32), and the session's steady-state shortcut to that replay
(:class:`ReplayShortcut`).

The public session API (options, input checks, the memory-plan cache) is :mod:`minirt.session`;
this module is its engine and is not imported by users.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import operator
import os
import time
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from minirt.dtypes import ONNX_TO_NUMPY
from minirt.errors import (Error, InvalidArgument, KernelError, RunTerminated, UnsupportedOperator, kernel_error,
                           with_node)
from minirt.format import reader
from minirt.format import schema as S
from minirt import arena
from minirt.kernels.registry import NodeContext, lookup
from minirt import native as _native  # packed weights for the native kernels
from minirt.native import program as _program  # planned runs replayed from C (D32)

if TYPE_CHECKING:  # (annotations only: minirt.session imports this module)
    from minirt.session import Session

# MINIRT_MEMPLAN_CHECK=1 (tests): before each kernel call with an arena buffer, assert that the buffer
# overlaps none of the step's inputs nor any other live value (an independent check of the plan at run time).
# Read as a module global by the run loops here and by Session._run (which then records no native
# program), so one monkeypatch of ``minirt.plan.MEMPLAN_CHECK`` switches both.
MEMPLAN_CHECK = os.environ.get("MINIRT_MEMPLAN_CHECK", "").strip() not in ("", "0")


# onnxruntime's message for a run stopped by RunOptions.terminate (its class is Fail: RunTerminated)
TERMINATED_MESSAGE = "Exiting due to terminate flag being set to true."


class Cancellation:
    """What stops a run given run options: their ``terminate`` flag (set from another thread) and, a minirt
    extension, their ``timeout`` in seconds from the run's start (None: none).  :meth:`check` is called
    before every node of the graphs the run walks and before every run of an If / Loop / Scan body (an
    endless Loop stops within one iteration).  While the run is :meth:`watched`, the native kernels read
    the same two conditions between their work items, and a replayed program (D32) between its calls
    (``mrt_watch_cancel``): a long kernel stops too, its result incomplete, and the session checks again
    after the run, so that such a result is never returned.  The native side learns of ``terminate`` when
    the options are minirt's :class:`minirt.RunOptions` (its setter tells the runs in progress); with
    another object only the timeout reaches inside a kernel."""

    __slots__ = ("options", "timeout", "deadline")

    def __init__(self, options: Any):
        self.options = options
        timeout = getattr(options, "timeout", None)
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not timeout > 0):
            raise InvalidArgument(f"RunOptions.timeout must be a positive number of seconds or None, got {timeout!r}")
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout

    @contextlib.contextmanager
    def watched(self):
        """The run's native kernels stop early once :meth:`check` would raise (see the class docstring)."""
        c = _native.new_cancel(self.deadline)
        if c is None:  # (no native kernels)
            yield
            return
        attach = getattr(self.options, "_attach_run", None)
        if attach is not None:
            attach(c)
        try:
            with _native.watching(c):
                yield
        finally:
            if attach is not None:
                self.options._detach_run(c)

    def check(self) -> None:
        if self.options.terminate:
            raise RunTerminated(TERMINATED_MESSAGE)
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise RunTerminated(f"the run exceeded its timeout of {self.timeout:g} s (RunOptions.timeout) and "
                                f"was stopped")


# The Cancellation of the run in progress in this context, for the If / Loop / Scan bodies it runs: their
# kernels call BoundSubgraph.run, which checks it first (set by Plan._execute_planned for a run given one).
RUN_CANCEL: contextvars.ContextVar = contextvars.ContextVar("minirt_run_cancel", default=None)


class _Step:
    """One node of a compiled plan."""

    __slots__ = ("call", "ins", "fetch", "outs", "frees", "node", "op", "subgraphs", "accepts_out", "accepts_outs",
                 "reads")

    def __init__(self, call, ins, outs, frees, node, op, subgraphs, accepts_out=False, accepts_outs=False):
        self.call = call  # kernel with attributes bound
        self.ins = ins  # tuple of slot indices, -1 for an absent optional input
        self.fetch = None  # env -> the call's positional arguments (set by the plan: Plan._fetcher)
        self.outs = outs  # tuple of slot indices, -1 for an unused optional output
        self.frees = frees  # slots whose last reader is this step
        self.node = node  # reader.Node, for error messages
        self.op = op  # reader.Operator
        self.subgraphs = subgraphs  # ((attribute name, Plan), ...) for control flow
        self.accepts_out = accepts_out  # the kernel takes out= (a buffer for its single result)
        self.accepts_outs = accepts_outs  # the kernel takes out= (a tuple: a buffer or None per output)
        self.reads = ()  # slots read while it runs (inputs and subgraph captures), for the memory plan


class BoundSubgraph:
    """A subgraph attribute handed to a control-flow kernel, bound to the running scope.

    ``run(*inputs)`` executes the subgraph with its formal inputs set to
    ``inputs`` and its captured outer values read from the enclosing scope.
    """

    __slots__ = ("_plan", "_outer")

    def __init__(self, plan: "Plan", outer: list):
        self._plan = plan
        self._outer = outer

    @property
    def input_names(self) -> list[str]:
        return [self._plan.graph.values[v].name for v in self._plan.graph.inputs]

    @property
    def output_names(self) -> list[str]:
        return [self._plan.graph.values[v].name for v in self._plan.graph.outputs]

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        plan = self._plan
        cancel = RUN_CANCEL.get()
        if cancel is not None:  # (a Loop's every iteration comes here: an endless one stops too)
            cancel.check()
        if len(inputs) != len(plan.graph.inputs):
            raise ValueError(f"subgraph {plan.graph.name!r} takes {len(plan.graph.inputs)} inputs, got {len(inputs)}")
        env = plan.new_env()
        for slot, outer_slot in plan.capture_map:
            env[slot] = self._outer[outer_slot]
        for slot, value in zip(plan.graph.inputs, inputs):
            env[slot] = value
        if plan.memory is None:
            plan.execute(env)
            return [env[v] for v in plan.graph.outputs]
        return plan.memory.run(plan, env)


class SubgraphMemory:
    """Memory plans and native programs of one If / Loop / Scan body (D76), as the session keeps them
    for its main graph (D17, D32): per signature of the body's inputs and captures (shapes, dtypes),
    the first run records the shapes, the next ones run on an arena (``ArenaPlan``), the one after
    records the native program, and later runs replay it: a Loop of fixed-shape iterations runs its
    body from C.  Anything that is not a numpy array (sequences, optionals) runs the nodes plainly.
    At most ``MAX_SIGNATURES`` signatures are kept (then new ones run plainly)."""

    __slots__ = ("native_program", "_plans", "_lock")
    MAX_SIGNATURES = 8

    def __init__(self, native_program: bool):
        import _thread

        self.native_program = native_program
        self._plans: dict = {}  # signature -> ArenaPlan, or None (nothing to place)
        self._lock = _thread.allocate_lock()

    def summary(self) -> list:
        """Per kept signature: the program of an idle arena ("N native calls" or why not), or None."""
        return [None if a is None else a.program_summary() for a in list(self._plans.values())]

    def run(self, plan: "Plan", env: list) -> list:
        slots = plan.graph.inputs + tuple(v for v, _ in plan.capture_map)
        sig = []
        for v in slots:
            a = env[v]
            if type(a) is not np.ndarray:
                plan.execute(env)
                return [env[v] for v in plan.graph.outputs]
            sig.append((a.shape, a.dtype))
        sig = tuple(sig)
        aplan = self._plans.get(sig, _NOT_PLANNED)
        if aplan is _NOT_PLANNED:
            if len(self._plans) >= self.MAX_SIGNATURES:
                plan.execute(env)
                return [env[v] for v in plan.graph.outputs]
            record = [None] * len(plan.steps)
            plan.execute(env, None, record)
            placed = any(r is not None for r in record)
            with self._lock:
                self._plans.setdefault(sig, arena.ArenaPlan(plan, record) if placed else None)
            return [env[v] for v in plan.graph.outputs]
        if aplan is None:
            plan.execute(env)
            return [env[v] for v in plan.graph.outputs]
        box = aplan.checkout()
        try:
            program = box.program
            threads = _native.threads()
            if type(program) is _program.Program and self.native_program and program.usable(threads):
                results = plan.replay(program, env, plan.graph.outputs)
                if results is not None:
                    return results
            if self.native_program and not MEMPLAN_CHECK and (
                    program is None or type(program) is _program.Program and not program.usable(threads)):
                box.program = plan.record_program(env, box, threads)
                # every output copied: the buffers a program writes outside the arena are its own
                return [np.array(env[v], copy=True) for v in plan.graph.outputs]
            plan.execute(env, box, None)
            return [np.array(env[v], copy=True) if v in aplan.copy_outputs else env[v] for v in plan.graph.outputs]
        finally:
            aplan.checkin(box)


_NOT_PLANNED = object()


def _seed_packed_weights(artifact: reader.Artifact, initializers, constants) -> None:
    """Hand the native kernels the builder's packed weights (``--weight-pack``; the packed_weights
    section) for this graph's constant arrays ``constants``, so the first run packs nothing.

    Only entries in the layout of the kernels in use are seeded: the panel width the loaded module
    reports and the K blocking of this runtime (minirt/format/packed_weights.py); the others (another
    ISA, numpy kernels) are ignored and the kernels pack lazily as without them.  A later
    ``native.select_isa`` empties the cache, with the same fallback."""
    width = _native.packed_panel_width()
    if not width:
        return
    from minirt.format.packed_weights import PACK_SGEMM_B, sgemm_kc

    array_of = {t: arr for (_v, t), (_v2, arr) in zip(initializers, constants)}  # tensor index -> its array
    for entry in artifact.packed_weights:
        owner = array_of.get(entry.tensor)  # (None: a tensor of another graph)
        k = entry.tag[2] if entry.kind == PACK_SGEMM_B else 0  # (tag: "sgemm_b", transb, K, N)
        if owner is None or entry.nr != width or entry.kind == PACK_SGEMM_B and entry.kc != sgemm_kc(k):
            continue
        _native.seed_pack(owner, entry.tag, entry.data)


class Plan:
    """A graph compiled into steps over integer slots (slot = value index)."""

    def __init__(
        self, artifact: reader.Artifact, graph_index: int, parent: "Plan | None", delegated: Mapping | None = None
    ):
        self.artifact = artifact
        # first node index -> (Partition, provider callable) for runs a provider executes
        self.delegated = dict(delegated or {})
        self.graph = graph = artifact.graphs[graph_index]
        self.is_body = parent is not None  # an If / Loop / Scan body (not the main graph)
        self.n_slots = len(graph.values)
        # One slot past the values that always holds None: absent optional inputs read it.
        self.none_slot = self.n_slots
        self.constants = tuple((v, artifact.tensor(t)) for v, t in graph.initializers)
        self._env_template = [None] * (self.n_slots + 1)  # (+ the None slot)
        for v, arr in self.constants:
            self._env_template[v] = arr
        if artifact.packed_weights:
            _seed_packed_weights(artifact, graph.initializers, self.constants)
        # Captured values resolve by name against the enclosing graph, which
        # the builder guarantees defines (or itself captures) each of them.
        self.capture_map: tuple = ()
        if graph.captures:
            if parent is None:
                raise Error(f"main graph {graph.name!r} cannot capture outer values")
            names = {info.name: i for i, info in enumerate(parent.graph.values)}
            cmap, captured_constants = [], []
            for v in graph.captures:
                name = graph.values[v].name
                if name not in names:
                    raise Error(f"subgraph {graph.name!r} captures {name!r}, which its enclosing graph does not define")
                outer = parent._env_template[names[name]]
                if outer is not None:
                    # a constant of the enclosing graph (or one it captured itself): the same array on every
                    # run, so a constant here too, not a capture bound per run (a body's signature and its
                    # program's patched inputs would otherwise count every weight it reads, D94)
                    captured_constants.append((v, outer))
                    self._env_template[v] = outer
                else:
                    cmap.append((v, names[name]))
            self.capture_map = tuple(cmap)
            self.constants += tuple(captured_constants)
        self._kernels: dict = {}  # operator index -> (Operator, opset, KernelEntry | None): _kernel_of
        self.steps = self._compile(graph_index)
        self.calls = tuple(step.call for step in self.steps)  # the unplanned call of every step, in order
        # a subgraph's memory plans and programs (SubgraphMemory), set by the session: None runs it plainly
        self.memory: "SubgraphMemory | None" = None
        # observer(name, array) called with every node result, subgraphs' included (the builder's
        # calibration reads values inside If / Loop / Scan bodies so: Session._observe_values, D95)
        self.observer = None

    def subgraph_plans(self):
        """Every subgraph plan under this one (depth first)."""
        for step in self.steps:
            for _name, sub in step.subgraphs:
                yield sub
                yield from sub.subgraph_plans()

    def new_env(self) -> list:
        """A fresh list of slots for one run: the constants in place, None elsewhere (and in the None slot)."""
        return self._env_template.copy()

    def _units(self) -> list[tuple[int, object]]:
        """The plan's units in order: (node index, Node) or (first node index, Partition)."""
        units, i, nodes = [], 0, self.graph.nodes
        while i < len(nodes):
            if i in self.delegated:
                part = self.delegated[i][0]
                units.append((i, part))
                i += part.node_count
            else:
                units.append((i, nodes[i]))
                i += 1
        return units

    def _reads(self, unit: object, slot_of: dict) -> list[int]:
        """Slots a unit reads while it runs (inputs, and captures of its subgraphs)."""
        if isinstance(unit, reader.Partition):
            return list(unit.inputs)
        reads = [v for v in unit.inputs if v >= 0]
        # A subgraph reads its captures from this graph's slots while the
        # node holding it runs, so they stay alive until then.
        for attr in unit.attributes.values():
            if attr.kind == S.ATTR_GRAPH:
                subs = (attr.value,)
            elif attr.kind == S.ATTR_GRAPHS:
                subs = attr.value
            else:
                continue
            for si in subs:
                sub = self.artifact.graphs[si]
                reads.extend(slot_of[sub.values[v].name] for v in sub.captures if sub.values[v].name in slot_of)
        return reads

    def _compile(self, graph_index: int) -> tuple:
        graph = self.graph
        units = self._units()
        slot_of = {info.name: j for j, info in enumerate(graph.values)}
        reads = [tuple(self._reads(unit, slot_of)) for _, unit in units]
        last_use: dict[int, int] = {}
        for u, unit_reads in enumerate(reads):
            for v in unit_reads:
                last_use[v] = u
        keep = set(graph.outputs) | {v for v, _ in graph.initializers} | set(graph.captures)
        frees_at: dict[int, list[int]] = {}
        for v, u in last_use.items():
            if v not in keep:
                frees_at.setdefault(u, []).append(v)
        steps = []
        for u, (_, unit) in enumerate(units):
            frees = tuple(frees_at.get(u, ()))
            if isinstance(unit, reader.Partition):
                step = self._partition_step(unit, frees)
            else:
                step = self._node_step(unit, frees)
            step.reads = reads[u]
            step.fetch = self._fetcher(step.ins)
            steps.append(step)
        self.last_use = last_use
        return tuple(steps)

    def _fetcher(self, ins: tuple):
        """env -> a step's positional arguments, as one C-level call (``operator.itemgetter``): a
        tuple for two or more inputs, a one- or zero-element list (a slice) otherwise; an absent
        input (-1) reads the None slot."""
        slots = tuple(self.none_slot if v < 0 else v for v in ins)
        if len(slots) >= 2:
            return operator.itemgetter(*slots)
        return operator.itemgetter(slice(slots[0], slots[0] + 1) if slots else slice(0, 0))

    def _partition_step(self, part: reader.Partition, frees: tuple) -> _Step:
        _, call = self.delegated[part.first_node]
        node = reader.Node(
            f"partition@{part.first_node}+{part.node_count} ({part.provider})", -1, part.inputs, part.outputs, {}
        )
        op = reader.Operator("minirt.provider", part.provider, 1)
        return _Step(_as_tuple_result(call), part.inputs, part.outputs, frees, node, op, ())

    def _kernel_of(self, op_index: int) -> tuple:
        """(Operator, opset, KernelEntry or None) of an operator-table index, looked up once per
        operator rather than once per node."""
        found = self._kernels.get(op_index)
        if found is None:
            art = self.artifact
            op = art.operators[op_index]
            opset = art.opsets.get(op.domain, op.opset) if op.domain in art.opsets else op.opset
            found = self._kernels[op_index] = (op, opset, lookup(op.domain, op.op_type, opset))
        return found

    def _node_step(self, node: reader.Node, frees: tuple) -> _Step:
        art, graph = self.artifact, self.graph
        op, opset, entry = self._kernel_of(node.op_index)
        if entry is None:
            raise UnsupportedOperator(
                f"node {node.name!r}: no CPU kernel for {op.domain or 'ai.onnx'}::{op.op_type} at opset {opset}"
            )
        required = entry.required_inputs
        if len(node.inputs) < required or any(v < 0 for v in node.inputs[:required]):
            raise UnsupportedOperator(
                f"node {node.name!r} ({op.op_type}): has {len(node.inputs)} input(s) {list(node.inputs)}, but the "
                f"CPU kernel needs its first {required} input(s) present"
            )
        attrs, subgraphs = {}, []
        for name, attr in node.attributes.items():
            if entry.attributes is not None and name not in entry.attributes:
                raise UnsupportedOperator(
                    f"node {node.name!r} ({op.op_type}): attribute {name!r} is not supported by the CPU kernel "
                    f"(accepted: {sorted(entry.attributes)})"
                )
            if attr.kind == S.ATTR_GRAPH:
                subgraphs.append((name, Plan(art, attr.value, self)))
            elif attr.kind == S.ATTR_GRAPHS:
                raise UnsupportedOperator(f"node {node.name!r}: graph-list attribute {name!r} is not supported")
            else:
                attrs[name] = _attribute_value(art, attr)
        if entry.context:
            out_dtypes = tuple(ONNX_TO_NUMPY.get(graph.values[v].dtype) if v >= 0 else None for v in node.outputs)
            attrs["ctx"] = NodeContext(node.name, op.op_type, len(node.outputs), out_dtypes, opset)
        call = functools.partial(entry.fn, **attrs) if attrs else entry.fn
        accepts_out = entry.accepts_out and len(node.outputs) == 1 and not subgraphs
        accepts_outs = entry.accepts_outs and not subgraphs
        return _Step(call, node.inputs, node.outputs, frees, node, op, tuple(subgraphs), accepts_out, accepts_outs)

    def declared_results(self) -> list | None:
        """What :meth:`execute` records (the shape and dtype of every ``accepts_out`` step's result, None
        elsewhere) as the graph declares it: the builder's shape inference, for fixed input shapes.  None
        when a result's shape or dtype is not fully declared."""
        values = self.graph.values
        results: list = [None] * len(self.steps)
        for i, step in enumerate(self.steps):
            if step.accepts_out and step.outs[0] >= 0:
                info = values[step.outs[0]]
                dtype = ONNX_TO_NUMPY.get(info.dtype)
                if (info.kind != S.VALUE_TENSOR or dtype is None or info.shape is None
                        or not all(type(d) is int for d in info.shape)):
                    return None
                results[i] = (info.shape, dtype)
        return results

    def execute(self, env: list, arena: "minirt.arena.Arena | None" = None, record: list | None = None) -> None:
        """Run every step over ``env``.

        ``arena`` (memory plan): its ``calls`` are the steps' calls with their
        arena views bound as ``out=``.  ``record``: filled with the
        (shape, dtype) of every ``accepts_out`` step's result (None elsewhere).
        """
        if record is not None or (arena is not None and MEMPLAN_CHECK) or self.observer is not None:
            self._execute_planned(env, arena.outs if arena is not None else None, record, None)
            return
        step = None
        try:
            for step, call in zip(self.steps, self.calls if arena is None else arena.calls):
                if step.subgraphs:
                    result = call(*step.fetch(env), **{name: BoundSubgraph(p, env) for name, p in step.subgraphs})
                else:
                    result = call(*step.fetch(env))
                outs = step.outs
                if type(result) is tuple:
                    for v, r in zip(outs, result):
                        if v >= 0:
                            env[v] = r
                elif outs[0] >= 0:
                    env[outs[0]] = result
                for v in step.frees:
                    env[v] = None
        except KernelError as exc:
            raise with_node(step, exc) from None
        except Error:
            raise
        except Exception as exc:
            raise kernel_error(step, env, exc) from exc

    def execute_cancellable(self, env: list, arena: "minirt.arena.Arena | None", record: list | None,
                            run_options: Any, timings: list | None = None) -> None:
        """:meth:`execute` (or :meth:`execute_profiled` with ``timings``) that reads
        ``run_options.terminate`` before every node and raises :class:`RunTerminated` (onnxruntime's
        ``Fail``, with its message) once another thread set it.  Only runs given run options take
        this loop: :meth:`execute` stays free of the check."""
        self._execute_planned(env, arena.outs if arena is not None else None, record, timings,
                              cancel=run_options)

    def _execute_planned(self, env: list, outs, record, timings, recorder=None, cancel: Any = None) -> None:
        """:meth:`execute` with arena buffers (``outs``), result recording, timings, a native
        program ``recorder`` (``minirt.native.program.Recorder``) and/or run options ``cancel``
        whose ``terminate`` flag is read before each node.

        :meth:`execute` keeps its own copy of the plain loop: it is the hot path
        and must not pay for these branches per node.
        """
        clock = time.perf_counter
        step = None
        token = RUN_CANCEL.set(cancel) if cancel is not None else None
        if self.observer is not None and self.is_body:
            for v in self.graph.inputs:  # (a body's formal inputs: a Loop's carried state, a Scan's slices)
                self.observer(self.graph.values[v].name, env[v])
        try:
            for i, step in enumerate(self.steps):
                if cancel is not None:
                    cancel.check()
                args = step.fetch(env)
                o = outs[i] if outs is not None else None
                if timings is not None:
                    t0 = clock()
                if recorder is not None:
                    recorder.begin()
                inlined = None
                if o is not None:
                    if MEMPLAN_CHECK and type(o) is not tuple:  # (a tuple: an accepts_outs step's bound buffers)
                        arena.check_out(self, i, step, args, o, env)
                    result = step.call(*args, out=o)
                elif step.subgraphs:
                    if recorder is not None and step.op.op_type == "If" and recorder.is_fixed(args[0]):
                        inlined = recorder.mark()
                        result = self._record_branch(step, args[0], env, recorder)
                    else:
                        result = step.call(*args, **{name: BoundSubgraph(p, env) for name, p in step.subgraphs})
                else:
                    result = step.call(*args)
                if timings is not None:
                    timings.append((step.node.name, step.op.op_type, clock() - t0))
                if inlined is not None:
                    result = recorder.end_inlined(step, inlined, result)
                elif recorder is not None:
                    result = recorder.end(step, args, result)
                if record is not None and step.accepts_out:
                    record[i] = (result.shape, result.dtype) if type(result) is np.ndarray else None
                outs_ = step.outs
                if type(result) is tuple:
                    for v, r in zip(outs_, result):
                        if v >= 0:
                            env[v] = r
                elif outs_[0] >= 0:
                    env[outs_[0]] = result
                if self.observer is not None:
                    for v in outs_:
                        if v >= 0:
                            self.observer(self.graph.values[v].name, env[v])
                for v in step.frees:
                    env[v] = None
        except KernelError as exc:
            raise with_node(step, exc) from None
        except Error:
            raise
        except Exception as exc:
            raise kernel_error(step, env, exc) from exc
        finally:
            if token is not None:
                RUN_CANCEL.reset(token)

    def _record_branch(self, step: _Step, cond: np.ndarray, env: list, recorder: "_program.Recorder") -> tuple:
        """Run the branch an If takes, its nodes recorded into the enclosing graph's ``recorder`` as if
        they were its own: ``cond`` is fixed for the program (derived from the input shapes and the
        model's constants, D78), so every replay would take the same branch (D94).  The branch runs
        without an arena (its results are buffers the program keeps); its own Ifs inline the same way.
        Returns the If's results."""
        branch = dict(step.subgraphs)["then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"]
        benv = branch.new_env()
        for slot, outer_slot in branch.capture_map:
            benv[slot] = env[outer_slot]
        with recorder.inlined():
            branch._execute_planned(benv, None, None, None, recorder)
        return tuple(benv[v] for v in branch.graph.outputs)

    def record_program(self, env: list, arena: "minirt.arena.Arena", threads: int | None,
                       record: list | None = None, outs: list | None = None,
                       bound: tuple = ()) -> "_program.Program | str | None":
        """Run every step over ``env`` with ``arena``'s buffers, recording the native calls they make;
        returns the native program that replays them, or why there is none (D32), or None when a
        cancellation stopped the run's kernels (a later run records again).  ``threads``: the
        session's setting the calls were made with.  ``record``: also filled as :meth:`execute` fills
        it (the run on a declared plan that records its results, D90).  ``outs``: the steps' buffers
        when not the arena's (an IOBinding run's, with the caller's among them; ``bound`` their key,
        program.bound_key)."""
        # (the run frees them after their last reader; a subgraph's captures are inputs of its runs too)
        inputs = {v: env[v] for v in (*self.graph.inputs, *(c for c, _ in self.capture_map))}
        constants = [a for _, a in self.constants]
        with _program.Recorder(constants, self.graph.outputs) as recorder:
            self._execute_planned(env, arena.outs if outs is None else outs, record, None, recorder)
        if _native.watched_stopped():
            # a cancellation (Cancellation.watched) may have stopped a kernel early: the results this
            # program would keep as fixed for every replay may be incomplete; a later run records again
            return None
        return _program.build(recorder, inputs, {v: env[v] for v in self.graph.outputs}, constants, arena.span,
                              threads, bound)

    def execute_profiled(self, env: list, arena: "minirt.arena.Arena | None" = None, record: list | None = None
                         ) -> list[tuple[str, str, float]]:
        """Like :meth:`execute`, timing each kernel call: [(node name, op_type, seconds)].

        Profiling is not the hot path, so it shares the general loop.
        """
        timings: list = []
        self._execute_planned(env, arena.outs if arena is not None else None, record, timings)
        return timings

    def replay(self, program: "_program.Program", env: list, out_slots) -> list | None:
        """The outputs of ``program`` (recorded on this run's arena, D32) run on the inputs in ``env``,
        or None when it cannot take these inputs (one is not C-contiguous): the nodes then run."""
        failed = program.run(env)
        if failed == -1:
            return program.results(out_slots, env)
        if failed >= 0 and program.rc[0] in _BAD_DATA:
            return None  # (the nodes run again, one by one, and the node's own kernel reports the data)
        if failed >= 0:
            raise kernel_error(self.steps[failed], env, MemoryError(
                f"native kernel returned {program.rc[0]} (could not allocate its scratch memory)"))
        return None


# Return codes of native calls that reject the data (kernels.h: -2 bad sizes or lengths, e.g.
# mrt_rnn_f32's sequence lengths; -3 an index out of range, mrt_gather_rows), not a lack of memory
_BAD_DATA = (-2, -3)


def _as_tuple_result(call):
    """Wrap a provider callable so that a single array result still reads as one output."""

    def run(*args):
        result = call(*args)
        return tuple(result) if isinstance(result, (list, tuple)) else (result,)

    return run


def _attribute_value(art: reader.Artifact, attr: reader.Attribute) -> Any:
    k, v = attr.kind, attr.value
    if k == S.ATTR_STRING:
        return v.decode("utf-8", errors="replace")
    if k == S.ATTR_STRINGS:
        return tuple(s.decode("utf-8", errors="replace") for s in v)
    if k == S.ATTR_TENSOR:
        return art.tensor(v)
    if k == S.ATTR_TENSORS:
        return tuple(art.tensor(t) for t in v)
    if k == S.ATTR_FLOAT:
        return float(v)
    return v  # int, ints (tuple), floats (tuple)


class ReplayShortcut:
    """``Session.run`` in the steady state of a model that runs as a native program (D32): for feeds
    with the layout of the last one (the names, numpy arrays of the same dtypes and shapes, as
    ``Session._bind_known_feed`` checks it) and all outputs, the program of a checked-out arena of
    ``aplan`` runs straight on the feed's arrays.  Its ``run`` returns None whenever anything
    differs (another layout, an arena without a usable program, a setting changed, an input that
    is not C-contiguous): the session then takes its general path, which also reports any error.
    It saves the general path's bookkeeping, about 1 us of the demo model's 6-10 us."""

    __slots__ = ("session", "layout", "aplan", "outputs")

    def __init__(self, session: "Session", layout: tuple, aplan):
        self.session = session
        self.layout = layout  # ((name, slot, dtype, shape), ...)
        self.aplan = aplan
        self.outputs = session._artifact.main_graph.outputs

    def run(self, feed: dict) -> list | None:
        layout = self.layout
        if len(feed) != len(layout):
            return None
        env = {}  # slot -> array: all that Program.run reads
        for name, slot, dtype, shape in layout:
            arr = feed.get(name)
            if type(arr) is not np.ndarray or arr.shape != shape or arr.dtype != dtype:
                return None
            env[slot] = arr
        session = self.session
        aplan = self.aplan
        arena = aplan.checkout()
        try:
            program = arena.program
            if (type(program) is not _program.Program or not session.native_program or not session.memory_plan
                    or not program.usable(session.threads)):
                return None
            if program.run(env) != -1:
                return None  # (the general path runs the nodes, or raises the failure naming its node)
            return program.results(self.outputs, env)
        finally:
            aplan.checkin(arena)
