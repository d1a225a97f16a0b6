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

import functools
import time
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from minirt.dtypes import ONNX_TO_NUMPY, onnx_type_name
from minirt.errors import Error, InvalidArgument, KernelError, UnsupportedOperator
from minirt.format import reader
from minirt.format import schema as S
from minirt.kernels.registry import NodeContext, lookup

# Provider names we accept, including onnxruntime's spellings so that
# ``providers=["CPUExecutionProvider"]`` from an existing script keeps working.
_PROVIDER_ALIASES = {
    "cpu": "cpu",
    "cpuexecutionprovider": "cpu",
}
_AVAILABLE_PROVIDERS = ("cpu",)


def get_available_providers() -> list[str]:
    """Providers that can run on this device, in minirt's default priority order."""
    return list(_AVAILABLE_PROVIDERS)


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
        self.version = int(metadata.get("source.model_version", 0) or 0)
        self.custom_metadata_map = dict(metadata.get("source.metadata_props", {}) or {})
        self.minirt = dict(metadata)


class _Step:
    """One node of a compiled plan."""

    __slots__ = ("call", "ins", "outs", "frees", "node", "op", "subgraphs")

    def __init__(self, call, ins, outs, frees, node, op, subgraphs):
        self.call = call  # kernel with attributes bound
        self.ins = ins  # tuple of slot indices, -1 for an absent optional input
        self.outs = outs  # tuple of slot indices, -1 for an unused optional output
        self.frees = frees  # slots whose last reader is this step
        self.node = node  # reader.Node, for error messages
        self.op = op  # reader.Operator
        self.subgraphs = subgraphs  # ((attribute name, _Plan), ...) for control flow


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


class _Plan:
    """A graph compiled into steps over integer slots (slot = value index)."""

    def __init__(self, artifact: reader.Artifact, graph_index: int, parent: "_Plan | None"):
        self.artifact = artifact
        self.graph = graph = artifact.graphs[graph_index]
        self.n_slots = len(graph.values)
        self.constants = tuple((v, artifact.tensor(t)) for v, t in graph.initializers)
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

    def new_env(self) -> list:
        env = [None] * self.n_slots
        for v, arr in self.constants:
            env[v] = arr
        return env

    def _compile(self, graph_index: int) -> tuple:
        art, graph = self.artifact, self.graph
        keep = set(graph.outputs)
        last_use: dict[int, int] = {}
        slot_of = {info.name: j for j, info in enumerate(graph.values)}
        for i, node in enumerate(graph.nodes):
            for v in node.inputs:
                if v >= 0:
                    last_use[v] = i
            # A subgraph reads its captures from this graph's slots while the
            # node holding it runs, so they stay alive until then.
            for attr in node.attributes.values():
                if attr.kind == S.ATTR_GRAPH:
                    subs = (attr.value,)
                elif attr.kind == S.ATTR_GRAPHS:
                    subs = attr.value
                else:
                    continue
                for si in subs:
                    sub = art.graphs[si]
                    for v in sub.captures:
                        slot = slot_of.get(sub.values[v].name)
                        if slot is not None:
                            last_use[slot] = i
        frees_at: dict[int, list[int]] = {}
        constant_slots = {v for v, _ in graph.initializers} | set(graph.captures)
        for v, i in last_use.items():
            if v not in keep and v not in constant_slots:
                frees_at.setdefault(i, []).append(v)

        steps = []
        for i, node in enumerate(graph.nodes):
            op = art.operators[node.op_index]
            opset = art.opsets.get(op.domain, op.opset) if op.domain in art.opsets else op.opset
            entry = lookup(op.domain, op.op_type, opset)
            if entry is None:
                raise UnsupportedOperator(
                    f"node {node.name!r}: no CPU kernel for {op.domain or 'ai.onnx'}::{op.op_type} at opset {opset}"
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
                out_dtypes = tuple(
                    ONNX_TO_NUMPY.get(graph.values[v].dtype) if v >= 0 else None for v in node.outputs
                )
                attrs["ctx"] = NodeContext(node.name, op.op_type, len(node.outputs), out_dtypes, opset)
            call = functools.partial(entry.fn, **attrs) if attrs else entry.fn
            steps.append(
                _Step(call, node.inputs, node.outputs, tuple(frees_at.get(i, ())), node, op, tuple(subgraphs))
            )
        return tuple(steps)

    def execute(self, env: list) -> None:
        step = None
        try:
            for step in self.steps:
                args = [env[v] if v >= 0 else None for v in step.ins]
                if step.subgraphs:
                    result = step.call(*args, **{name: BoundSubgraph(p, env) for name, p in step.subgraphs})
                else:
                    result = step.call(*args)
                outs = step.outs
                if type(result) is tuple:
                    for v, r in zip(outs, result):
                        if v >= 0:
                            env[v] = r
                else:
                    env[outs[0]] = result
                for v in step.frees:
                    env[v] = None
        except Error:
            raise
        except Exception as exc:
            raise _kernel_error(step, env, exc) from exc

    def execute_profiled(self, env: list) -> list[tuple[str, str, float]]:
        """Like :meth:`execute`, timing each kernel call: [(node name, op_type, seconds)]."""
        clock = time.perf_counter
        timings = []
        step = None
        try:
            for step in self.steps:
                args = [env[v] if v >= 0 else None for v in step.ins]
                t0 = clock()
                if step.subgraphs:
                    result = step.call(*args, **{name: BoundSubgraph(p, env) for name, p in step.subgraphs})
                else:
                    result = step.call(*args)
                timings.append((step.node.name, step.op.op_type, clock() - t0))
                if type(result) is tuple:
                    for v, r in zip(step.outs, result):
                        if v >= 0:
                            env[v] = r
                else:
                    env[step.outs[0]] = result
                for v in step.frees:
                    env[v] = None
        except Error:
            raise
        except Exception as exc:
            raise _kernel_error(step, env, exc) from exc
        return timings


def _node_arg(info: reader.ValueInfo) -> NodeArg:
    return NodeArg(info.name, info.dtype, info.shape, info.kind)


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


def _normalise_providers(providers: Sequence | None) -> list[str]:
    if providers is None:
        return list(_AVAILABLE_PROVIDERS)
    if isinstance(providers, str):
        providers = [providers]
    out = []
    for p in providers:
        name = p[0] if isinstance(p, tuple) else p  # onnxruntime allows (name, options)
        key = _PROVIDER_ALIASES.get(str(name).lower())
        if key is None:
            raise InvalidArgument(
                f"unknown execution provider {name!r}; known providers: {sorted(set(_PROVIDER_ALIASES.values()))}"
            )
        if key not in out:
            out.append(key)
    if "cpu" not in out:
        out.append("cpu")  # the CPU is always the fallback for what no provider takes
    return out


class Session:
    """Run a .mrt artifact.  ``InferenceSession`` is the same class.

    :param path_or_bytes: path to a .mrt file (memory-mapped) or its bytes.
    :param providers: provider names in priority order (default: all available).
    :param threads: worker threads for kernels (None: library defaults).
    :param verify_checksums: check every section's CRC-32 at load (default on).
    """

    def __init__(
        self,
        path_or_bytes: Any,
        sess_options: Any = None,
        providers: Sequence | None = None,
        threads: int | None = None,
        verify_checksums: bool = True,
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
        self._providers = _normalise_providers(providers)
        self.threads = threads
        self._artifact = reader.load(path_or_bytes, verify_checksums=verify_checksums)
        self._plan = _Plan(self._artifact, 0, None)
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

    # --- introspection, as in onnxruntime ---------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        return list(self._overridable)

    def get_providers(self) -> list[str]:
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
        t_start = time.perf_counter()
        if not isinstance(input_feed, Mapping):
            raise InvalidArgument(f"input feed must be a dict of input name -> array, got {type(input_feed).__name__}")
        if output_names is None:
            out_slots = list(self._artifact.main_graph.outputs)
        else:
            if isinstance(output_names, str):
                raise InvalidArgument("output_names must be a list of names or None, not a single string")
            out_slots = []
            for name in output_names:
                if name not in self._output_slot:
                    raise InvalidArgument(f"unknown output name {name!r}; the model's outputs are {list(self._output_slot)}")
                out_slots.append(self._output_slot[name])
        env = self._plan.new_env()
        self._bind_inputs(env, input_feed)
        fed = [a for a in input_feed.values() if isinstance(a, np.ndarray)]
        if profile is None:
            self._plan.execute(env)
        else:
            nodes = self._plan.execute_profiled(env)
        results = []
        graph = self._artifact.main_graph
        for v in out_slots:
            r = env[v]
            if graph.values[v].kind != S.VALUE_TENSOR:
                results.append(_copy_container(r))
                continue
            if not isinstance(r, np.ndarray):
                r = np.asarray(r)
            elif v not in self._produced or not r.flags.writeable or any(np.may_share_memory(r, a) for a in fed):
                # Inputs, initializers (views of the mapped file) and kernel
                # results that alias them (Identity, Reshape views) must not
                # leak out as buffers shared with the caller or the file.
                r = r.copy()
            results.append(r)
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
