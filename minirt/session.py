"""Session / InferenceSession: load an artifact, compile a plan, run it.

The API mirrors onnxruntime's ``InferenceSession`` so that an existing script
changes one import::

    sess = minirt.InferenceSession("model.mrt")
    (logits,) = sess.run(None, {"image": batch})

Loading decodes and verifies the artifact once, then compiles each graph into
a :class:`_Plan`: a flat tuple of steps, each holding the kernel with its
attributes already bound and the integer slots of its inputs and outputs.
Running a plan walks that tuple over a list of slots: there is no graph walk,
no name lookup and no dict access per node at run time.
"""
from __future__ import annotations

import collections
import functools
import math
import operator
import os
import threading
import time
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from minirt.dtypes import ONNX_TO_NUMPY, onnx_type_name
from minirt.errors import Error, InvalidArgument, KernelError, UnsupportedOperator
from minirt.format import reader
from minirt.format import schema as S
from minirt import arena
from minirt import providers as providers_mod
from minirt.kernels.registry import NodeContext, lookup
from minirt.kernels import _limits
from minirt import native as _native  # threads for the native kernels
from minirt.native import blas as _blas  # threads for numpy's BLAS
from minirt.native import program as _program  # planned runs replayed from C (D32)


def get_available_providers() -> list[str]:
    """Providers that can run on this device, in minirt's default priority order."""
    return providers_mod.get_available_providers()


class NodeArg:
    """An input or output of a session, shaped like onnxruntime's ``NodeArg``."""

    __slots__ = ("name", "shape", "type", "_dtype_code", "_kind")

    def __init__(self, name: str, dtype_code: int, shape: tuple | None, kind: int = S.VALUE_TENSOR):
        self.name = name
        self._dtype_code = dtype_code
        self._kind = kind
        # onnxruntime gives ints for fixed dims, strings for symbolic ones and
        # None for unknown ones.
        self.shape = list(shape) if shape is not None else None
        tensor = f"tensor({onnx_type_name(dtype_code)})" if dtype_code else "tensor(undefined)"
        # Type strings as onnxruntime spells them: seq(tensor(float)), optional(...).
        self.type = {
            S.VALUE_TENSOR: tensor,
            S.VALUE_SEQUENCE: f"seq({tensor})",
            S.VALUE_OPTIONAL: f"optional({tensor})",
            S.VALUE_OPTIONAL_SEQUENCE: f"optional(seq({tensor}))",
        }[kind]

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


class ModelMetadata:
    """Subset of onnxruntime's ``ModelMetadata`` plus minirt's typed metadata."""

    def __init__(self, metadata: dict):
        self.producer_name = str(metadata.get("source.producer_name", ""))
        self.graph_name = str(metadata.get("source.graph_name", ""))
        self.domain = str(metadata.get("source.domain", ""))
        self.description = str(metadata.get("source.doc_string", ""))
        try:
            self.version = int(metadata.get("source.model_version", 0) or 0)
        except (TypeError, ValueError, OverflowError):
            self.version = 0
        props = metadata.get("source.metadata_props", {})
        self.custom_metadata_map = {str(k): str(v) for k, v in props.items()} if isinstance(props, dict) else {}
        self.minirt = dict(metadata)


class _Step:
    """One node of a compiled plan."""

    __slots__ = ("call", "ins", "fetch", "outs", "frees", "node", "op", "subgraphs", "accepts_out", "reads")

    def __init__(self, call, ins, outs, frees, node, op, subgraphs, accepts_out=False):
        self.call = call  # kernel with attributes bound
        self.ins = ins  # tuple of slot indices, -1 for an absent optional input
        self.fetch = None  # env -> the call's positional arguments (set by the plan: _Plan._fetcher)
        self.outs = outs  # tuple of slot indices, -1 for an unused optional output
        self.frees = frees  # slots whose last reader is this step
        self.node = node  # reader.Node, for error messages
        self.op = op  # reader.Operator
        self.subgraphs = subgraphs  # ((attribute name, _Plan), ...) for control flow
        self.accepts_out = accepts_out  # the kernel takes out= (a buffer for its single result)
        self.reads = ()  # slots read while it runs (inputs and subgraph captures), for the memory plan


class BoundSubgraph:
    """A subgraph attribute handed to a control-flow kernel, bound to the running scope.

    ``run(*inputs)`` executes the subgraph with its formal inputs set to
    ``inputs`` and its captured outer values read from the enclosing scope.
    """

    __slots__ = ("_plan", "_outer")

    def __init__(self, plan: "_Plan", outer: list):
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
        if len(inputs) != len(plan.graph.inputs):
            raise ValueError(f"subgraph {plan.graph.name!r} takes {len(plan.graph.inputs)} inputs, got {len(inputs)}")
        env = plan.new_env()
        for slot, outer_slot in plan.capture_map:
            env[slot] = self._outer[outer_slot]
        for slot, value in zip(plan.graph.inputs, inputs):
            env[slot] = value
        plan.execute(env)
        return [env[v] for v in plan.graph.outputs]


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


class _Plan:
    """A graph compiled into steps over integer slots (slot = value index)."""

    def __init__(
        self, artifact: reader.Artifact, graph_index: int, parent: "_Plan | None", delegated: Mapping | None = None
    ):
        self.artifact = artifact
        # first node index -> (Partition, provider callable) for runs a provider executes
        self.delegated = dict(delegated or {})
        self.graph = graph = artifact.graphs[graph_index]
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
            cmap = []
            for v in graph.captures:
                name = graph.values[v].name
                if name not in names:
                    raise Error(f"subgraph {graph.name!r} captures {name!r}, which its enclosing graph does not define")
                cmap.append((v, names[name]))
            self.capture_map = tuple(cmap)
        self.steps = self._compile(graph_index)
        self.calls = tuple(step.call for step in self.steps)  # the unplanned call of every step, in order

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
        last_use: dict[int, int] = {}
        for u, (_, unit) in enumerate(units):
            for v in self._reads(unit, slot_of):
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
            step.reads = tuple(self._reads(unit, slot_of))
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

    def _node_step(self, node: reader.Node, frees: tuple) -> _Step:
        art, graph = self.artifact, self.graph
        op = art.operators[node.op_index]
        opset = art.opsets.get(op.domain, op.opset) if op.domain in art.opsets else op.opset
        entry = lookup(op.domain, op.op_type, opset)
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
                subgraphs.append((name, _Plan(art, attr.value, self)))
            elif attr.kind == S.ATTR_GRAPHS:
                raise UnsupportedOperator(f"node {node.name!r}: graph-list attribute {name!r} is not supported")
            else:
                attrs[name] = _attribute_value(art, attr)
        if entry.context:
            out_dtypes = tuple(ONNX_TO_NUMPY.get(graph.values[v].dtype) if v >= 0 else None for v in node.outputs)
            attrs["ctx"] = NodeContext(node.name, op.op_type, len(node.outputs), out_dtypes, opset)
        call = functools.partial(entry.fn, **attrs) if attrs else entry.fn
        accepts_out = entry.accepts_out and len(node.outputs) == 1 and not subgraphs
        return _Step(call, node.inputs, node.outputs, frees, node, op, tuple(subgraphs), accepts_out)

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
        if record is not None or (arena is not None and _MEMPLAN_CHECK):
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
            raise _with_node(step, exc) from None
        except Error:
            raise
        except Exception as exc:
            raise _kernel_error(step, env, exc) from exc

    def _execute_planned(self, env: list, outs, record, timings, recorder=None) -> None:
        """:meth:`execute` with arena buffers (``outs``), result recording, timings and/or a
        native program ``recorder`` (``minirt.native.program.Recorder``).

        :meth:`execute` keeps its own copy of the plain loop: it is the hot path
        and must not pay for these branches per node.
        """
        clock = time.perf_counter
        step = None
        try:
            for i, step in enumerate(self.steps):
                args = step.fetch(env)
                o = outs[i] if outs is not None else None
                if timings is not None:
                    t0 = clock()
                if recorder is not None:
                    recorder.begin()
                if o is not None:
                    if _MEMPLAN_CHECK:
                        arena.check_out(self, i, step, args, o, env)
                    result = step.call(*args, out=o)
                elif step.subgraphs:
                    result = step.call(*args, **{name: BoundSubgraph(p, env) for name, p in step.subgraphs})
                else:
                    result = step.call(*args)
                if timings is not None:
                    timings.append((step.node.name, step.op.op_type, clock() - t0))
                if recorder is not None:
                    recorder.end(step, args, result)
                if record is not None and step.accepts_out:
                    record[i] = (result.shape, result.dtype) if type(result) is np.ndarray else None
                outs_ = step.outs
                if type(result) is tuple:
                    for v, r in zip(outs_, result):
                        if v >= 0:
                            env[v] = r
                elif outs_[0] >= 0:
                    env[outs_[0]] = result
                for v in step.frees:
                    env[v] = None
        except KernelError as exc:
            raise _with_node(step, exc) from None
        except Error:
            raise
        except Exception as exc:
            raise _kernel_error(step, env, exc) from exc

    def record_program(self, env: list, arena: "minirt.arena.Arena", threads: int | None) -> "_program.Program | str":
        """Run every step over ``env`` with ``arena``'s buffers, recording the native calls they make;
        returns the native program that replays them, or why there is none (D32).  ``threads``: the
        session's setting the calls were made with."""
        inputs = {v: env[v] for v in self.graph.inputs}  # (the run frees them after their last reader)
        with _program.Recorder() as recorder:
            self._execute_planned(env, arena.outs, None, None, recorder)
        return _program.build(recorder, inputs, {v: env[v] for v in self.graph.outputs},
                              [a for _, a in self.constants], arena.span, threads)

    def execute_profiled(self, env: list, arena: "minirt.arena.Arena | None" = None, record: list | None = None
                         ) -> list[tuple[str, str, float]]:
        """Like :meth:`execute`, timing each kernel call: [(node name, op_type, seconds)].

        Profiling is not the hot path, so it shares the general loop.
        """
        timings: list = []
        self._execute_planned(env, arena.outs if arena is not None else None, record, timings)
        return timings


_NOT_RECORDED = object()  # no memory plan recorded yet for a signature (None: recorded, nothing to place)


class _ReplayShortcut:
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
            return program.results(self.outputs)
        finally:
            aplan.checkin(arena)


# MINIRT_MEMPLAN_CHECK=1 (tests): before each kernel call with an arena buffer, assert that the buffer
# overlaps none of the step's inputs nor any other live value (an independent check of the plan at run time).
_MEMPLAN_CHECK = os.environ.get("MINIRT_MEMPLAN_CHECK", "").strip() not in ("", "0")


def _as_tuple_result(call):
    """Wrap a provider callable so that a single array result still reads as one output."""

    def run(*args):
        result = call(*args)
        return tuple(result) if isinstance(result, (list, tuple)) else (result,)

    return run


def _node_arg(info: reader.ValueInfo) -> NodeArg:
    return NodeArg(info.name, info.dtype, info.shape, info.kind)


def _with_node(step: "_Step | None", exc: KernelError) -> KernelError:
    """A kernel's own minirt error (e.g. ResourceError), prefixed with the node that raised it."""
    if step is None or str(exc).startswith("node "):
        return exc
    op = step.op
    return type(exc)(f"node {step.node.name!r} ({op.domain or 'ai.onnx'}::{op.op_type}): {exc}")


def _kernel_error(step: _Step | None, env: list, exc: Exception) -> KernelError:
    if step is None:
        return KernelError(f"execution failed before the first node: {exc}")
    node, op = step.node, step.op
    described = []
    for v in step.ins:
        if v < 0:
            described.append("<absent>")
            continue
        x = env[v]
        if isinstance(x, np.ndarray):
            described.append(f"{x.dtype}{list(x.shape)}")
        else:
            described.append(type(x).__name__)
    return KernelError(
        f"node {node.name!r} ({op.domain or 'ai.onnx'}::{op.op_type}, opset {op.opset}) failed on inputs "
        f"({', '.join(described)}) with attributes {sorted(node.attributes)}: {type(exc).__name__}: {exc}"
    )


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


def _normalise_providers(providers: Sequence) -> list[str]:
    if isinstance(providers, str):
        providers = [providers]
    out = []
    for p in providers:
        name = p[0] if isinstance(p, tuple) else p  # onnxruntime allows (name, options)
        key = providers_mod.canonical_name(name)
        if key is None:
            raise InvalidArgument(
                f"unknown execution provider {name!r}; known providers: {providers_mod.known_providers()}"
            )
        if key not in out:
            out.append(key)
    if providers_mod.CPU not in out:
        out.append(providers_mod.CPU)  # the CPU is always the fallback for what no provider takes
    return out


class Session:
    """Run a .mrt artifact.  ``InferenceSession`` is the same class.

    :param path_or_bytes: path to a .mrt file (memory-mapped) or its bytes.
    :param providers: provider names in priority order (default: all available).
    :param threads: threads for native kernels and BLAS (None: all CPUs, BLAS default).
    :param verify_checksums: check every section's CRC-32 at load (default on).
    :param verify_key: require an Ed25519 signature by this public key (32 bytes, hex, or a .pub path);
        None (default) does not check signatures.  See docs/runtime.md.
    :param memory_plan: reuse intermediate buffers through a static memory plan (default on, D17, D27): the
        first run with a given set of input shapes records every value's shape and lifetime, later runs with
        the same shapes write the results of out-capable kernels (conv, GEMM, elementwise, concat, int8 conv)
        into one preallocated arena at planned offsets (verified not to overlap while live); with fixed input
        shapes the first run already writes into an arena planned from the declared shapes.  Up to 4 shape
        signatures are kept (LRU); outputs returned never alias the arena.  On by default because a process
        that runs one model otherwise maps and faults in fresh pages for its big intermediates on every run
        (PP-OCR det: 16.7 -> 10.1 ms); it costs ~1 us per planned node on tiny models.  ``False`` turns it
        off; None (the default) reads ``MINIRT_MEMORY_PLAN`` (unset: on; 0/false/no/off: off).
        See docs/runtime.md.
    :param max_tensor_bytes: refuse (``ResourceError``) any tensor a kernel would size from input values
        beyond this many bytes (default: half the RAM, at most 16 GiB).  See docs/runtime.md.
    """

    def __init__(
        self,
        path_or_bytes: Any,
        sess_options: Any = None,
        providers: Sequence | None = None,
        threads: int | None = None,
        verify_checksums: bool = True,
        verify_key: Any = None,  # --- signing / memory guard (reliability issue) ---
        max_tensor_bytes: int | None = None,
        memory_plan: bool | None = None,
        native_program: bool | None = None,
        **kwargs: Any,
    ):
        # onnxruntime's signature is (path_or_bytes, sess_options=None, providers=None, ...);
        # allow ``Session(path, ["cpu"])`` too, which is how minirt users call it.
        if isinstance(sess_options, (list, tuple)) and providers is None:
            providers, sess_options = sess_options, None
        if kwargs:
            raise InvalidArgument(f"unknown Session option(s): {sorted(kwargs)}")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise InvalidArgument(f"threads must be a positive integer, got {threads!r}")
        requested_providers = providers
        self.threads = threads
        # --- signing / memory guard (reliability issue): begin ---
        if max_tensor_bytes is None:
            max_tensor_bytes = _limits.DEFAULT_MAX_TENSOR_BYTES
        elif isinstance(max_tensor_bytes, bool) or not isinstance(max_tensor_bytes, int) or max_tensor_bytes < 1:
            raise InvalidArgument(f"max_tensor_bytes must be a positive integer, got {max_tensor_bytes!r}")
        self.max_tensor_bytes = max_tensor_bytes
        self._artifact = reader.load(path_or_bytes, verify_checksums=verify_checksums, verify_key=verify_key)
        # --- signing / memory guard: end ---
        if requested_providers is None:
            # Default: the target's provider order recorded at build time.  No
            # provider is probed unless a partition asks for it.
            requested_providers = self._artifact.metadata.get("target.providers") or [providers_mod.CPU]
            if not isinstance(requested_providers, list):
                requested_providers = [providers_mod.CPU]
            requested_providers = [p for p in requested_providers if providers_mod.canonical_name(str(p))]
        self._providers = _normalise_providers(requested_providers)
        self._assignments: list[dict] = []
        self._plan = _Plan(self._artifact, 0, None, self._delegate_partitions(0))
        graph = self._artifact.main_graph
        init_slots = {v for v, _ in graph.initializers}
        self._inputs = [
            _node_arg(graph.values[v])
            for v in graph.inputs
            if v not in init_slots
        ]
        self._overridable = [
            _node_arg(graph.values[v])
            for v in graph.inputs
            if v in init_slots
        ]
        self._outputs = [_node_arg(graph.values[v]) for v in graph.outputs]
        self._input_slot = {graph.values[v].name: v for v in graph.inputs}
        self._required = [a.name for a in self._inputs]
        self._output_slot = {graph.values[v].name: v for v in graph.outputs}
        self._produced = {v for n in graph.nodes for v in n.outputs if v >= 0}
        self._all_outputs = frozenset(graph.outputs)
        # --- static memory plan (D17): input signature -> arena.ArenaPlan (None: nothing to place), LRU
        if memory_plan is None:  # default on; MINIRT_MEMORY_PLAN=0 turns it off
            memory_plan = os.environ.get("MINIRT_MEMORY_PLAN", "").strip().lower() not in ("0", "false", "no", "off")
        self.memory_plan = bool(memory_plan)
        self._mplans: collections.OrderedDict = collections.OrderedDict()
        self._mplans_lock = threading.Lock()
        self._mplan_evictions = 0
        # (signature, plan) of the most recently used plan, while no other was used or stored since: the
        # steady state finds its plan there without the lock
        self._last_mplan = None
        self._mplan_any = any(st.accepts_out for st in self._plan.steps)
        # --- native programs (D32): a planned run whose nodes are all native calls, replayed from C
        if native_program is None:  # default on; MINIRT_NATIVE_PROGRAM=0 turns it off
            native_program = os.environ.get("MINIRT_NATIVE_PROGRAM", "").strip().lower() not in (
                "0", "false", "no", "off")
        self.native_program = bool(native_program)
        # Every input a tensor of one fixed shape and dtype (checked by _bind_inputs): then every feed
        # has the same signature and computing it per run is wasted time.
        self._static_inputs = all(
            graph.values[v].kind == S.VALUE_TENSOR and graph.values[v].dtype and graph.values[v].shape is not None
            and all(isinstance(d, int) for d in graph.values[v].shape)
            for v in graph.inputs
        )
        # The layout of the last feed _bind_inputs accepted, when it was all numpy arrays for tensor inputs:
        # ((name, slot, dtype, shape) per array, its memory-plan signature), or None.  A feed with the same
        # layout passes the same checks, so _bind_known_feed binds it without repeating them.
        self._known_feed = None
        # The steady state of a model run as a native program (D32): see _ReplayShortcut.
        self._shortcut = None

    def _delegate_partitions(self, graph_index: int) -> dict:
        """Choose, per partition, the provider that runs it; compile those programs.

        A partition goes to its provider when the session lists that provider
        and it is available here and its program compiles; otherwise its CPU
        version (the nodes themselves) runs, and one log line says why.
        """
        delegated = {}
        for index, part in enumerate(self._artifact.partitions):
            if part.graph != graph_index:
                continue
            record = {"partition": index, "provider": part.provider, "nodes": part.node_count, "runs_on": "cpu"}
            if part.provider not in self._providers:
                record["reason"] = f"provider {part.provider!r} not in the session's providers {self._providers}"
            else:
                ok, why = providers_mod.availability(part.provider)
                if not ok:
                    record["reason"] = f"provider {part.provider!r} is not available here: {why}"
                elif part.blob < 0:
                    record["reason"] = "the artifact holds no program for this partition"
                else:
                    try:
                        call = providers_mod.get(part.provider).compile(
                            self._artifact.provider_blob(part.blob), part, self._artifact, dict(part.options)
                        )
                    except Exception as exc:  # noqa: BLE001 - any refusal means "run the CPU version"
                        record["reason"] = f"provider {part.provider!r} refused the program: {type(exc).__name__}: {exc}"
                    else:
                        delegated[part.first_node] = (part, call)
                        record["runs_on"] = part.provider
                        record["reason"] = "delegated"
            if record["runs_on"] == "cpu":
                providers_mod.log_info(
                    "minirt: partition %d (%d nodes) runs on the CPU: %s", index, part.node_count, record["reason"]
                )
            self._assignments.append(record)
        return delegated

    def get_partitions(self) -> list[dict]:
        """Per partition: its provider, node count, where it runs in this session and why."""
        return [dict(r) for r in self._assignments]

    # --- introspection, as in onnxruntime ---------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        return list(self._overridable)

    def get_providers(self) -> list[str]:
        """The session's providers in priority order (the CPU last), as onnxruntime reports them."""
        return list(self._providers)

    def get_modelmeta(self) -> ModelMetadata:
        return ModelMetadata(self._artifact.metadata)

    @property
    def artifact(self) -> reader.Artifact:
        """The decoded artifact (graphs, tensors, metadata, sections)."""
        return self._artifact

    @property
    def metadata(self) -> dict:
        return dict(self._artifact.metadata)

    # --- running ---------------------------------------------------------------
    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], run_options: Any = None) -> list[np.ndarray]:
        """Run the model; returns one array per requested output (all outputs for None)."""
        shortcut = self._shortcut
        if shortcut is not None and output_names is None and type(input_feed) is dict:
            results = shortcut.run(input_feed)
            if results is not None:
                return results
        return self._run(output_names, input_feed, profile=None)

    def run_profiled(self, input_feed: Mapping[str, Any]) -> tuple[list[np.ndarray], dict]:
        """Run once, timing every node.

        Returns ``(outputs, profile)`` where ``profile`` has ``total_s`` (wall
        time of the run), ``kernel_s`` (time inside kernels), ``nodes`` (a list
        of ``(node name, op_type, seconds)``) and ``overhead_per_node_s``: the
        run's time outside kernels divided by the node count, i.e. what the
        Python plan costs per node.
        """
        profile: dict = {}
        outputs = self._run(None, input_feed, profile=profile)
        return outputs, profile

    def _run(self, output_names, input_feed, profile: dict | None) -> list[np.ndarray]:
        t_start = time.perf_counter() if profile is not None else 0.0
        if type(input_feed) is not dict and not isinstance(input_feed, Mapping):  # (the ABC check costs more)
            raise InvalidArgument(f"input feed must be a dict of input name -> array, got {type(input_feed).__name__}")
        if output_names is None:
            out_slots = self._artifact.main_graph.outputs
        else:
            if isinstance(output_names, str):
                raise InvalidArgument("output_names must be a list of names or None, not a single string")
            out_slots = []
            for name in output_names:
                if name not in self._output_slot:
                    raise InvalidArgument(f"unknown output name {name!r}; the model's outputs are {list(self._output_slot)}")
                out_slots.append(self._output_slot[name])
        env = self._plan.new_env()
        sig = self._bind_known_feed(env, input_feed)
        if sig is None:
            self._bind_inputs(env, input_feed)
            sig = self._signature(input_feed)
        aplan, record, arena = None, None, None
        if self.memory_plan and self._mplan_any:
            aplan, record = self._memory_plan_for(sig)
            if aplan is not None:
                arena = aplan.checkout()
                program = arena.program
                if (type(program) is _program.Program and profile is None and self.native_program
                        and program.usable(self.threads)):
                    try:  # (before the thread settings below: the recorded calls carry their thread count)
                        results = self._replay(program, env, out_slots)
                    except BaseException:
                        aplan.checkin(arena)
                        raise
                    if results is not None:
                        aplan.checkin(arena)
                        known = self._known_feed
                        if output_names is None and known is not None and known[1] is sig:
                            self._shortcut = _ReplayShortcut(self, known[0], aplan)
                        return results
        # Threads: native kernels take the count per Python thread.  BLAS (process-wide, cached) is
        # single-threaded when the native kernels run: they do every float product (1-3-row ones
        # on the native gemv, D-cnn-gap), BLAS only numpy's leftovers (Einsum, other dtypes), and
        # OpenBLAS's busy-waiting workers stall every kernel after them on a loaded machine (D28).
        # Without the native kernels BLAS is the only parallelism: it follows `threads` (None: its
        # own default).
        _native.set_threads(self.threads)
        _blas.set_threads(1 if _native.available else self.threads)
        try:
            # (a run that records its results, on the declared plan of fixed shapes, records no program:
            # the program is recorded on the run after the plan is settled, as for every plan)
            if (arena is not None and record is None and profile is None and self.native_program
                    and not _MEMPLAN_CHECK
                    and (arena.program is None
                         or type(arena.program) is _program.Program and not arena.program.usable(self.threads))):
                # not recorded yet on this arena, or under another ISA / thread count: record it now
                with _limits.limit(self.max_tensor_bytes):
                    arena.program = self._plan.record_program(env, arena, self.threads)
                # every output copied: those the memory plan would not copy (made outside the arena)
                # are buffers the program keeps and writes on every replay
                return self._collect(out_slots, env, input_feed, self._all_outputs)
            with _limits.limit(self.max_tensor_bytes):  # memory guard, per run (a contextvar: thread-safe)
                if profile is None:
                    self._plan.execute(env, arena, record)
                else:
                    nodes = self._plan.execute_profiled(env, arena, record)
            if record is not None:
                self._store_memory_plan(sig, record, aplan)
            copy_outputs = aplan.copy_outputs if aplan is not None else ()
            results = self._collect(out_slots, env, input_feed, copy_outputs)
        finally:
            if arena is not None:
                aplan.checkin(arena)
        if profile is not None:
            total = time.perf_counter() - t_start
            kernel = sum(t for _, _, t in nodes)
            profile.update(
                total_s=total,
                kernel_s=kernel,
                nodes=nodes,
                overhead_per_node_s=(total - kernel) / max(len(nodes), 1),
            )
        return results

    def _replay(self, program: "_program.Program", env: list, out_slots) -> list | None:
        """The outputs of ``program`` (recorded on this run's arena, D32) run on the inputs in ``env``,
        or None when it cannot take these inputs (one is not C-contiguous): the nodes then run."""
        failed = program.run(env)
        if failed == -1:
            return program.results(out_slots)
        if failed >= 0:
            raise _kernel_error(self._plan.steps[failed], env, MemoryError(
                f"native kernel returned {program.rc[0]} (could not allocate its scratch memory)"))
        return None

    # --- static memory plan (D17) -------------------------------------------------
    _MAX_MEMORY_PLANS = 4  # shape signatures kept (LRU)
    _MAX_MEMORY_PLAN_EVICTIONS = 32  # past this many evictions, new signatures run unplanned

    _STATIC_SIGNATURE = frozenset()  # the one signature of a model whose inputs all have fixed shapes

    def _signature(self, feed: Mapping) -> frozenset | None:
        if self._static_inputs:
            return self._STATIC_SIGNATURE
        try:
            return frozenset((k, a.shape, a.dtype) for k, a in feed.items())
        except AttributeError:  # a container (sequence/optional) input: not planned
            return None

    def _memory_plan_for(self, sig: frozenset | None) -> tuple:
        """(plan for this run's signature or None, record list when this run should record one)."""
        if sig is None:
            return None, None
        if sig is self._STATIC_SIGNATURE:
            # the only signature, never evicted: no LRU order to keep (a dict read is atomic)
            aplan = self._mplans.get(sig, _NOT_RECORDED)
            if aplan is not _NOT_RECORDED:
                return aplan, None
        last = self._last_mplan
        if last is not None and last[0] is sig:  # (the known feed's own signature object: the steady state)
            return last[1], None  # (already the most recently used)
        with self._mplans_lock:
            if sig in self._mplans:
                self._mplans.move_to_end(sig)
                self._last_mplan = (sig, self._mplans[sig])
                return self._mplans[sig], None
            if self._mplan_evictions >= self._MAX_MEMORY_PLAN_EVICTIONS:
                return None, None  # shapes change too often for plans to pay: plain allocation
        record = [None] * len(self._plan.steps)
        if sig is self._STATIC_SIGNATURE:
            return self._declared_memory_plan(), record
        return None, record

    def _declared_memory_plan(self) -> "arena.ArenaPlan | None":
        """The memory plan of the shapes the graph declares (fixed input shapes), for the run that records
        the real ones; None when they are not all declared or nothing is placed.

        That first run then writes into one arena instead of a fresh allocation per result: in a new
        process every fresh page is a page fault (PP-OCR det: ~4,900 fewer on its first run, ~7 ms of
        its cold start; D-cold-start).  A kernel uses a buffer only when it fits its result exactly
        (the ``out=`` contract, minirt.kernels.registry), so a declared shape that is wrong costs that
        node a fresh array, never a wrong result; and the run records the real shapes, which replace
        the declared plan unless they are the same.  The declared shapes come from the file, not from
        arrays a kernel made: a plan whose arena the memory guard would refuse to a tensor
        (``max_tensor_bytes``) is not made (the run then allocates and records as before)."""
        results = self._plan.declared_results()
        if results is None or any(
                r is not None and math.prod(r[0]) * r[1].itemsize > self.max_tensor_bytes for r in results):
            return None
        aplan = arena.ArenaPlan(self._plan, results)
        return aplan if aplan.placed and aplan.size <= self.max_tensor_bytes else None

    def _store_memory_plan(self, sig: frozenset, record: list, declared: "arena.ArenaPlan | None" = None) -> None:
        """Keep the memory plan of ``record`` (the run's results) for ``sig``: ``declared`` (the plan that
        run used, made from the declared shapes) when it was made from the same results."""
        if declared is not None and declared.results == record:
            aplan = declared
        else:
            aplan = arena.ArenaPlan(self._plan, record)
            if not aplan.placed:
                aplan = None
        with self._mplans_lock:
            if sig in self._mplans:
                return
            self._mplans[sig] = aplan
            self._last_mplan = None  # (now the most recently used: the shortcut holds only for that one)
            while len(self._mplans) > self._MAX_MEMORY_PLANS:
                self._mplans.popitem(last=False)
                self._mplan_evictions += 1

    def memory_plans(self) -> list[dict]:
        """The cached memory plans, least recently used first: input shapes, arena bytes, buffers placed,
        the sum of their sizes, how many arenas (concurrent runs) were allocated, and the native program
        of an idle arena (D32): ``"N native calls"``, why there is none, or None before one was recorded."""
        with self._mplans_lock:
            items = list(self._mplans.items())
        out = []
        for sig, p in items:
            if sig is self._STATIC_SIGNATURE:  # fixed input shapes: the model's own
                info = {"inputs": {a.name: tuple(a.shape) for a in self._inputs}}
            else:
                info = {"inputs": {k: tuple(shape) for k, shape, _ in sorted(sig, key=lambda t: t[0])}}
            if p is None:
                info.update(arena_bytes=0, buffers=0, buffer_bytes=0, arenas=0, native_program=None)
            else:
                info.update(arena_bytes=p.size, buffers=len(p.buffers), buffer_bytes=sum(b[2] for b in p.buffers),
                            arenas=p.arenas, native_program=p.program_summary())
            out.append(info)
        return out

    def _collect(self, out_slots, env, feed, copy_outputs) -> list:
        results = []
        graph = self._artifact.main_graph
        for v in out_slots:
            r = env[v]
            if graph.values[v].kind != S.VALUE_TENSOR:
                results.append(_copy_container(r))
                continue
            if r is None:
                raise KernelError(f"output {graph.values[v].name!r} was not produced by any node")
            if not isinstance(r, np.ndarray):
                r = np.asarray(r)
            elif (v not in self._produced or v in copy_outputs or not r.flags.writeable
                  or _shares_memory_with_any(r, feed.values())):
                # Inputs, initializers (views of the mapped file) and kernel
                # results that alias them (Identity, Reshape views) must not
                # leak out as buffers shared with the caller or the file; nor
                # may views of the memory plan's arena.
                r = r.copy()
            results.append(r)
        return results

    def _bind_known_feed(self, env: list, feed: Mapping[str, Any]) -> frozenset | None:
        """Bind ``feed`` when it has the layout of the last feed :meth:`_bind_inputs` accepted (the same
        names, numpy arrays of the same dtypes and shapes: the steady state), one comparison per input;
        returns its memory-plan signature.  None otherwise: :meth:`_bind_inputs` then checks and binds
        everything, and says what is wrong."""
        known = self._known_feed
        if known is None or len(feed) != len(known[0]):
            return None
        for name, slot, dtype, shape in known[0]:
            arr = feed.get(name)
            if type(arr) is not np.ndarray or arr.shape != shape or arr.dtype != dtype:
                return None
            env[slot] = arr
        return known[1]

    def _bind_inputs(self, env: list, feed: Mapping[str, Any]) -> None:
        graph = self._artifact.main_graph
        symbols: dict[str, tuple[int, str]] = {}
        for name, value in feed.items():
            slot = self._input_slot.get(name)
            if slot is None:
                raise InvalidArgument(
                    f"unknown input name {name!r}; the model's inputs are {[a.name for a in self._inputs]}"
                )
            info = graph.values[slot]
            if info.kind != S.VALUE_TENSOR:
                env[slot] = _bind_container(name, info, value)
                continue
            arr = value if isinstance(value, np.ndarray) else _as_array(name, value)
            if info.dtype:
                expected = ONNX_TO_NUMPY.get(info.dtype)
                if expected is not None and arr.dtype != expected and not (info.dtype == 8 and arr.dtype.kind in "OUS"):
                    raise InvalidArgument(
                        f"input {name!r}: expected dtype tensor({onnx_type_name(info.dtype)}) ({expected}), "
                        f"got {arr.dtype} with shape {list(arr.shape)}"
                    )
            if info.shape is not None:
                if arr.ndim != len(info.shape):
                    raise InvalidArgument(
                        f"input {name!r}: expected rank {len(info.shape)} with shape {_fmt_shape(info.shape)}, "
                        f"got rank {arr.ndim} with shape {list(arr.shape)}"
                    )
                for axis, (want, got) in enumerate(zip(info.shape, arr.shape)):
                    if isinstance(want, int) and want != got:
                        raise InvalidArgument(
                            f"input {name!r}: dimension {axis} must be {want} (expected shape {_fmt_shape(info.shape)}), "
                            f"got shape {list(arr.shape)}"
                        )
                    if isinstance(want, str):
                        seen = symbols.get(want)
                        if seen is None:
                            symbols[want] = (got, f"{name!r} dimension {axis}")
                        elif seen[0] != got:
                            raise InvalidArgument(
                                f"input {name!r}: dimension {axis} is symbol {want!r} = {got}, but {seen[1]} "
                                f"set {want!r} = {seen[0]}"
                            )
            env[slot] = arr
        missing = [n for n in self._required if n not in feed]
        if missing:
            raise InvalidArgument(
                f"missing input(s) {missing}; the model requires {[(a.name, a.type, a.shape) for a in self._inputs]}"
            )
        if all(type(v) is np.ndarray and graph.values[self._input_slot[k]].kind == S.VALUE_TENSOR
               for k, v in feed.items()):
            layout = tuple((k, self._input_slot[k], v.dtype, v.shape) for k, v in feed.items())
            self._known_feed = (layout, self._signature(feed))  # one assignment: atomic for concurrent runs


def _shares_memory_with_any(r: np.ndarray, values: Iterable) -> bool:
    """Whether ``r`` may share memory with one of the arrays among ``values``."""
    for a in values:
        if isinstance(a, np.ndarray) and np.may_share_memory(r, a):
            return True
    return False


def _bind_container(name: str, info: reader.ValueInfo, value: Any) -> Any:
    """Check a sequence (list of arrays) or optional (None or value) input."""
    optional = info.kind in (S.VALUE_OPTIONAL, S.VALUE_OPTIONAL_SEQUENCE)
    if value is None:
        if optional:
            return None
        raise InvalidArgument(f"input {name!r}: got None, but it is a {_node_arg(info).type}, not an optional")
    if info.kind in (S.VALUE_SEQUENCE, S.VALUE_OPTIONAL_SEQUENCE):
        if not isinstance(value, (list, tuple)):
            raise InvalidArgument(
                f"input {name!r}: expected a list of arrays ({_node_arg(info).type}), got {type(value).__name__}"
            )
        items = [v if isinstance(v, np.ndarray) else _as_array(f"{name}[{i}]", v) for i, v in enumerate(value)]
    else:
        items = [value if isinstance(value, np.ndarray) else _as_array(name, value)]
    expected = ONNX_TO_NUMPY.get(info.dtype) if info.dtype else None
    for i, arr in enumerate(items):
        if expected is not None and arr.dtype != expected:
            raise InvalidArgument(
                f"input {name!r}: element {i} has dtype {arr.dtype}, expected {expected} ({_node_arg(info).type})"
            )
    return items if info.kind in (S.VALUE_SEQUENCE, S.VALUE_OPTIONAL_SEQUENCE) else items[0]


def _copy_container(value: Any) -> Any:
    """An output sequence/optional, with arrays copied so none aliases internal state."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [np.array(v, copy=True) for v in value]
    return np.array(value, copy=True)


def _as_array(name: str, value: Any) -> np.ndarray:
    try:
        return np.asarray(value)
    except Exception as exc:  # noqa: BLE001 - anything numpy refuses is the caller's input error
        raise InvalidArgument(f"input {name!r}: cannot convert {type(value).__name__} to an array ({exc})") from None


def _fmt_shape(shape: Iterable) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


InferenceSession = Session
