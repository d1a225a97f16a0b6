"""Provider partitioning: which runs of the main graph an accelerator executes.

Called by ``builder/build.py`` after optimisation and before lowering::

    plan = plan_partitions(model_ir, profile, {"input_shapes": shapes})
    lower_model(model_ir, writer)
    apply_plan(plan, writer)          # blobs, golden tensors, partition records

Steps of :func:`plan_partitions` (``targets/providers.py`` defines the
provider interface it drives):

1. **Assignment.**  For each provider of ``profile.providers`` in priority
   order ("cpu" excluded), the nodes no earlier provider kept are asked
   ``spec.supports(node, ctx)``.  Only main-graph nodes are candidates; a
   node holding a subgraph stays on the CPU.
2. **Growth.**  Supported nodes are grouped into maximal partitions: a node
   joins the partition of one of its producers, partitions of the same
   provider are merged when possible.  Every merge keeps the graph
   *schedulable*: contracting every partition to one node leaves the graph
   acyclic (so no path leaves a partition and comes back, and all partitions
   can be laid out as contiguous runs at the same time).
3. **Cost model.**  A partition costs one provider call (``dispatch_cost``)
   plus a copy and layout change of each non-constant input and output
   (``boundary_cost``); it stays with the provider only when its FLOPs pay
   for that (``spec.keep_partition``).  Dropped nodes may still be taken by
   the next provider in the priority list.
4. **Layout.**  The main graph's nodes are reordered (topological order kept)
   so each partition is a contiguous run; the partition's nodes stay in the
   artifact as its CPU version.
5. **Lowering** of each partition with ``spec.lower`` (a failure keeps the
   partition on the CPU with the error as the reason).
6. **Golden outputs**: the model is lowered CPU-only, run with minirt's
   kernels on a seeded random reference input (symbolic dims: the
   ``input_shapes`` option, else 1) and the partition boundary values are
   kept as the partition's golden inputs/outputs (``minirt verify``).

The plan's :meth:`PartitionPlan.report` lists every partition (provider,
nodes, share of the model's FLOPs) and every node left on the CPU with its
reason.
"""
from __future__ import annotations

import dataclasses
import heapq
import logging
import time
from typing import Any

import numpy as np
import onnx_ir as ir

from minirt import vocabulary
from minirt.builder import ir_helpers as irh
# A module reference, not names: ``targets.providers`` imports ``builder.ir_helpers``, which runs
# this package's ``__init__`` (build -> partition); when a target module is imported first,
# ``targets.providers`` is still half-initialised here, and only a module reference survives that
# circle (its attributes are read at call time).
from minirt.targets import flops as flops_mod
from minirt.targets import providers as target_providers

log = logging.getLogger("minirt.builder")

CPU = vocabulary.CPU  # the provider table's CPU (minirt/vocabulary.py)


@dataclasses.dataclass
class PlannedPartition:
    index: int
    provider: str
    ir: target_providers.PartitionIR
    flops: float
    flops_share: float
    boundary_cost: float
    blob: bytes | None = None
    options: dict = dataclasses.field(default_factory=dict)
    golden_inputs: list | None = None  # arrays, one per ir.inputs
    golden_outputs: list | None = None  # arrays, one per ir.outputs
    source_nodes: int | None = None  # the nodes it took when drop_cpu_versions left one stand-in node
    # weights the program takes from the artifact's tensors instead of a copy (apply_plan: share_weights),
    # and the program as lowered (its references depend on the writer's tensor indices: each apply_plan
    # shares from this one)
    shared: dict | None = None
    lowered_blob: bytes | None = None

    def as_dict(self) -> dict:
        return {
            "index": self.index,
            "provider": self.provider,
            "nodes": self.source_nodes if self.source_nodes is not None else len(self.ir.nodes),
            "cpu_version": self.source_nodes is None,  # (False: a thin artifact, drop_cpu_versions)
            "node_names": [n.name for n in self.ir.nodes],
            "ops": _histogram(self.ir.nodes),
            "inputs": [v.name for v in self.ir.inputs],
            "outputs": [v.name for v in self.ir.outputs],
            "flops": self.flops,
            "flops_share": self.flops_share,
            "blob_bytes": len(self.blob) if self.blob is not None else 0,
            "golden_bytes": sum(a.nbytes for a in (self.golden_inputs or []) + (self.golden_outputs or [])),
            "options": self.options,
            "golden": self.golden_outputs is not None,
            # program constants stored as references to the CPU version's weights: same bytes, transposed
            "shared_bytes": int((self.shared or {}).get("shared_bytes", 0)),
            "relayout_bytes": int((self.shared or {}).get("relayout_bytes", 0)),
        }


@dataclasses.dataclass
class PartitionPlan:
    target: str
    providers: list  # provider names tried, in priority order
    partitions: list  # PlannedPartition, in graph order
    cpu_nodes: dict  # node name -> reason (nodes left on the CPU, graph order)
    cpu_ops: dict  # node name -> op type
    total_flops: float
    notes: list = dataclasses.field(default_factory=list)  # provider-level remarks
    golden_input: dict = dataclasses.field(default_factory=dict)  # model input name -> shape used
    timings: dict = dataclasses.field(default_factory=dict)
    nodes: int = 0  # nodes of the graph, partitioned or not
    # nodes whose FLOPs are unknown (targets.flops.estimate is None): name -> (op type, where it runs);
    # the FLOPs shares count the known estimates only, and the report says so
    unknown_cost: dict = dataclasses.field(default_factory=dict)

    def provider_share(self, provider: str | None = None) -> float:
        return float(sum(p.flops_share for p in self.partitions if provider is None or p.provider == provider))

    def report(self) -> dict:
        """JSON-serialisable summary (stored as the ``build.partitions`` metadata)."""
        return {
            "target": self.target,
            "providers": list(self.providers),
            "total_flops": self.total_flops,
            "accelerated_share": self.provider_share(),
            "nodes": self.nodes,
            "accelerated_nodes": sum(p.as_dict()["nodes"] for p in self.partitions),
            "unknown_cost_nodes": [{"node": name, "op": op, "runs_on": where}
                                   for name, (op, where) in self.unknown_cost.items()],
            "partitions": [p.as_dict() for p in self.partitions],
            "cpu_nodes": [
                {"node": name, "op": self.cpu_ops.get(name, "?"), "reason": reason} for name, reason in self.cpu_nodes.items()
            ],
            "notes": list(self.notes),
            "golden_input_shapes": {k: list(v) for k, v in self.golden_input.items()},
        }


def _histogram(nodes) -> dict:
    out: dict = {}
    for n in nodes:
        out[n.op_type] = out.get(n.op_type, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def _has_subgraph(node: ir.Node) -> bool:
    return any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values())


# --- dependency structure ---------------------------------------------------------


class _Graph:
    """Main-graph dependencies as index lists (subgraph captures included)."""

    def __init__(self, graph: ir.Graph):
        from minirt.builder.lower import free_value_names

        self.nodes: list = list(graph)
        self.pos = {id(n): i for i, n in enumerate(self.nodes)}
        producer_by_name = {}
        for i, n in enumerate(self.nodes):
            for o in n.outputs:
                if o.name:
                    producer_by_name[o.name] = i
        self.preds: list[set] = [set() for _ in self.nodes]
        self.succs: list[set] = [set() for _ in self.nodes]
        for i, n in enumerate(self.nodes):
            names = {v.name for v in n.inputs if v is not None}
            for attr in n.attributes.values():
                if attr.type == ir.AttributeType.GRAPH:
                    names |= free_value_names(attr.value)
                elif attr.type == ir.AttributeType.GRAPHS:
                    for g in attr.value:
                        names |= free_value_names(g)
            for name in names:
                j = producer_by_name.get(name)
                if j is not None and j != i:
                    self.preds[i].add(j)
                    self.succs[j].add(i)

    def acyclic(self, group_of: list) -> bool:
        """True when contracting each group (group_of[i]; None = own node) leaves a DAG."""
        key = [("g", g) if g is not None else ("n", i) for i, g in enumerate(group_of)]
        indeg: dict = {}
        edges: dict = {}
        for k in key:
            indeg.setdefault(k, 0)
        for i, ss in enumerate(self.succs):
            a = key[i]
            for j in ss:
                b = key[j]
                if a == b:
                    continue
                e = edges.setdefault(a, set())
                if b not in e:
                    e.add(b)
                    indeg[b] += 1
        ready = [k for k, d in indeg.items() if d == 0]
        seen = 0
        while ready:
            k = ready.pop()
            seen += 1
            for b in edges.get(k, ()):
                indeg[b] -= 1
                if indeg[b] == 0:
                    ready.append(b)
        return seen == len(indeg)

    def contiguous_order(self, group_of: list) -> list[int]:
        """A topological order of node indices in which every group is one contiguous run.

        Among ready units, the one whose first node came first in the
        original order goes first, so the order changes as little as possible.
        """
        members: dict = {}
        for i, g in enumerate(group_of):
            k = ("g", g) if g is not None else ("n", i)
            members.setdefault(k, []).append(i)
        key_of = [("g", g) if g is not None else ("n", i) for i, g in enumerate(group_of)]
        indeg = {k: 0 for k in members}
        edges: dict = {k: set() for k in members}
        for i, ss in enumerate(self.succs):
            for j in ss:
                a, b = key_of[i], key_of[j]
                if a != b and b not in edges[a]:
                    edges[a].add(b)
                    indeg[b] += 1
        heap = [(members[k][0], k) for k, d in indeg.items() if d == 0]
        heapq.heapify(heap)
        order: list[int] = []
        while heap:
            _, k = heapq.heappop(heap)
            order.extend(sorted(members[k]))
            for b in edges[k]:
                indeg[b] -= 1
                if indeg[b] == 0:
                    heapq.heappush(heap, (members[b][0], b))
        if len(order) != len(self.nodes):
            raise RuntimeError("partition layout: the contracted graph has a cycle")
        return order


# --- planning -----------------------------------------------------------------------


def _grow(g: _Graph, candidates: list[int], group_of: list, next_group: int, flops: list[float]) -> int:
    """Group the candidate node indices (one provider) into maximal schedulable partitions."""
    cand = set(candidates)
    mine: dict[int, list[int]] = {}
    for i in sorted(cand):
        # Join a producer's group (the one with most FLOPs first), then merge the others in.
        producer_groups = sorted(
            {group_of[p] for p in g.preds[i] if p in cand and group_of[p] in mine},
            key=lambda gid: -sum(flops[m] for m in mine[gid]),
        )
        joined = None
        for gid in producer_groups:
            group_of[i] = gid
            if g.acyclic(group_of):
                joined = gid
                break
            group_of[i] = None
        if joined is None:
            joined = next_group
            next_group += 1
            group_of[i] = joined
            mine[joined] = []
        mine[joined].append(i)
        for gid in producer_groups:
            if gid != joined and gid in mine:
                _try_merge(g, group_of, mine, joined, gid)
    # Second sweep: merge any two groups of this provider whose union stays schedulable.
    changed = True
    while changed:
        changed = False
        ids = sorted(mine, key=lambda gid: mine[gid][0])
        for a_pos, a in enumerate(ids):
            if a not in mine:
                continue
            for b in ids[a_pos + 1:]:
                if b in mine and a in mine and _try_merge(g, group_of, mine, a, b):
                    changed = True
    return next_group


def _try_merge(g: _Graph, group_of: list, mine: dict, keep: int, other: int) -> bool:
    for m in mine[other]:
        group_of[m] = keep
    if g.acyclic(group_of):
        mine[keep].extend(mine.pop(other))
        mine[keep].sort()
        return True
    for m in mine[other]:
        group_of[m] = other
    return False


def plan_partitions(model_ir: ir.Model, profile: Any, options: dict | None = None) -> PartitionPlan:
    """Plan (and lower) the provider partitions of ``model_ir`` for ``profile``.

    Reorders ``model_ir.graph``'s nodes so every partition is a contiguous
    run.  ``options``: ``input_shapes`` (name -> shape, for the golden
    reference input), ``golden`` (default True), ``seed`` (default 0).
    """
    options = dict(options or {})
    t0 = time.perf_counter()
    ctx = target_providers.SupportContext(model_ir, profile, options)
    provider_names = [p for p in profile.providers if p != CPU]
    g = _Graph(model_ir.graph)
    n = len(g.nodes)
    flops = [0.0] * n
    reasons: dict[int, list[str]] = {i: [] for i in range(n)}
    group_of: list = [None] * n
    group_provider: dict[int, str] = {}
    specs: dict[str, target_providers.ProviderSpec] = {}
    notes: list[str] = []
    next_group = 0
    tried: list[str] = []

    for pname in provider_names:
        try:
            spec = target_providers.get_spec(pname)
            ok, why = spec.builder_available(ctx)
            if not ok:
                raise target_providers.ProviderNotOffered(why)
        except target_providers.ProviderNotOffered as exc:
            notes.append(f"{pname} not offered by this builder: {exc}")
            for i in range(n):
                if group_of[i] is None:
                    reasons[i].append(f"{pname} not offered by this builder")
            continue
        specs[pname] = spec
        tried.append(pname)
        if not any(flops):
            flops = [float(spec.node_cost(node, ctx)) for node in g.nodes]
        candidates = []
        for i, node in enumerate(g.nodes):
            if group_of[i] is not None:
                continue
            if _has_subgraph(node):
                reasons[i].append("holds a subgraph (control flow stays on the CPU)")
                continue
            try:
                ok, why = spec.supports(node, ctx)
            except Exception as exc:  # noqa: BLE001 - a broken rule must not break the build
                ok, why = False, f"{pname} support check failed: {type(exc).__name__}: {exc}"
            if ok:
                candidates.append(i)
            else:
                reasons[i].append(why or f"{node.op_type} is not supported by {pname}")
        first_new = next_group
        # Nodes of different ``group_key``s (optional on a spec; None for most nodes) never share a
        # partition: each key's candidates are grown apart (a Core ML classical model is one node alone).
        by_key: dict = {}
        key_of = getattr(spec, "group_key", None)
        for i in candidates:
            by_key.setdefault(key_of(g.nodes[i], ctx) if key_of is not None else None, []).append(i)
        for members_of_key in by_key.values():
            next_group = _grow(g, members_of_key, group_of, next_group, flops)
        # Cost model on this provider's new groups.
        members: dict[int, list[int]] = {}
        for i in candidates:
            if group_of[i] is not None and group_of[i] >= first_new:
                members.setdefault(group_of[i], []).append(i)
        for gid, idxs in sorted(members.items(), key=lambda kv: kv[1][0]):
            part = target_providers.PartitionIR.from_nodes(pname, [g.nodes[i] for i in sorted(idxs)])
            pf = sum(flops[i] for i in idxs)
            boundary = sum(spec.boundary_cost(v, ctx) for v in part.inputs + part.outputs)
            keep, why = (False, f"{pname} partition has no run-time input") if not part.inputs else spec.keep_partition(
                part, pf, boundary, ctx
            )
            if keep:
                group_provider[gid] = pname
            else:
                for i in idxs:
                    group_of[i] = None
                    reasons[i].append(why)

    # Layout: contiguous runs, topological order kept.
    order = g.contiguous_order(group_of)
    if order != list(range(n)):
        graph = model_ir.graph
        nodes = [g.nodes[i] for i in order]
        graph.remove(list(graph), safe=False)
        graph.extend(nodes)
    total = float(sum(flops))
    runs: list[tuple[int, list[int]]] = []
    for i in order:
        gid = group_of[i]
        if gid is None:
            continue
        if runs and runs[-1][0] == gid:
            runs[-1][1].append(i)
        else:
            runs.append((gid, [i]))
    planned: list[PlannedPartition] = []
    for gid, idxs in runs:
        pname = group_provider[gid]
        spec = specs[pname]
        part = target_providers.PartitionIR.from_nodes(pname, [g.nodes[i] for i in idxs], index=len(planned))
        if not part.inputs:
            for i in idxs:
                group_of[i] = None
                reasons[i].append(f"{pname} partition has no run-time input")
            continue
        pf = float(sum(flops[i] for i in idxs))
        boundary = float(sum(spec.boundary_cost(v, ctx) for v in part.inputs + part.outputs))
        try:
            blob, popts = spec.lower(part, ctx)
        except Exception as exc:  # noqa: BLE001 - any lowering failure keeps the run on the CPU
            why = f"{pname} lowering failed: {type(exc).__name__}: {exc}"
            log.warning("partition of %d nodes stays on the CPU: %s", len(idxs), why)
            for i in idxs:
                group_of[i] = None
                reasons[i].append(why)
            continue
        planned.append(
            PlannedPartition(
                len(planned), pname, part, pf, pf / total if total else 0.0, boundary, bytes(blob), dict(popts or {})
            )
        )
    t_lower = time.perf_counter()

    plan = PartitionPlan(
        target=profile.name,
        providers=tried,
        partitions=planned,
        cpu_nodes={},
        cpu_ops={},
        total_flops=total,
        notes=notes,
    )
    plan.nodes = n
    runs_on = {node.name: p.provider for p in planned for node in p.ir.nodes}
    for i in order:
        node = g.nodes[i]
        if flops_mod.estimate(node) is None:
            plan.unknown_cost[node.name] = (node.op_type, runs_on.get(node.name, CPU))
        if group_of[i] is None:
            why = "; ".join(dict.fromkeys(reasons[i])) or "no accelerator provider on this target"
            plan.cpu_nodes[node.name] = why
            plan.cpu_ops[node.name] = node.op_type
    if planned and options.get("golden", True):
        try:
            _golden(model_ir, plan, options)
        except Exception as exc:  # noqa: BLE001 - golden outputs are a convenience, never a build failure
            plan.notes.append(f"golden outputs not stored: {type(exc).__name__}: {exc}")
    plan.timings = {"partition": t_lower - t0, "golden": time.perf_counter() - t_lower}
    return plan


# --- golden outputs -------------------------------------------------------------------


def reference_inputs(model_ir: ir.Model, input_shapes: dict | None = None, seed: int = 0) -> dict:
    """A seeded random input per model input (symbolic dims: ``input_shapes`` or 1)."""
    from minirt.dtypes import ONNX_TO_NUMPY

    rng = np.random.default_rng(seed)
    feeds = {}
    input_shapes = dict(input_shapes or {})
    initializers = set(model_ir.graph.initializers)
    for v in model_ir.graph.inputs:
        if v.name in initializers:
            continue
        given = input_shapes.get(v.name)
        if given is not None:
            shape = tuple(int(d) for d in given)
        else:
            shape = tuple(d if isinstance(d, int) and d >= 0 else 1 for d in (v.shape or ()))
        dtype = ONNX_TO_NUMPY.get(int(v.dtype.value)) if v.dtype is not None else np.dtype(np.float32)
        dtype = np.dtype(dtype)
        if dtype.kind == "f":
            arr = rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
        elif dtype.kind in "iu":
            arr = rng.integers(0, _index_bound(v, 4), size=shape).astype(dtype)
        elif dtype.kind == "b":
            arr = rng.integers(0, 2, size=shape).astype(bool)
        else:
            raise ValueError(f"input {v.name!r}: no reference data for dtype {dtype}")
        feeds[v.name] = arr
    return feeds


def _index_bound(value: ir.Value, bound: int) -> int:
    """``bound``, lowered to the size of the axis a Gather reads with ``value`` as indices (an embedding
    table of 2 token types takes ids 0 and 1 only: a larger one makes the reference run fail)."""
    for use in value.uses():
        node, index = use[0], use[1]
        if node.op_type == "Gather" and index == 1 and node.inputs[0] is not None:
            shape = irh.static_shape(node.inputs[0])
            if shape:
                axis = int(irh.attr(node, "axis", 0) or 0) % len(shape)
                bound = max(1, min(bound, shape[axis]))
    return bound


def _reference_values(source: Any, names: list[str], feeds: dict) -> dict:
    """The values ``names`` that the source ONNX model (path, bytes or ModelProto: ``options["source"]``)
    computes under onnxruntime for ``feeds``: those of its node outputs that kept their name through
    the builder's passes (a fused node's output keeps its last node's).  {} without onnxruntime, or when
    onnxruntime cannot run the source model (its failure is the caller's note)."""
    import onnx

    try:
        import onnxruntime as ort
    except ImportError:
        return {}
    from minirt.builder.load import _read_proto

    proto = onnx.ModelProto()
    proto.CopyFrom(_read_proto(source)[0])  # (outputs are added below: never to the caller's model)
    produced = {o for node in proto.graph.node for o in node.output if o}
    known = {o.name for o in proto.graph.output}
    outputs = [n for n in names if n in produced or n in known]
    graph_inputs = {i.name for i in proto.graph.input}
    proto.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in outputs if n not in known)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    # (no graph optimization: onnxruntime's fusions could drop the intermediate values asked for)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    results = session.run(outputs, {k: v for k, v in feeds.items() if k in graph_inputs})
    return dict(zip(outputs, results))


def _golden(model_ir: ir.Model, plan: PartitionPlan, options: dict) -> None:
    """Keep every partition's boundary values on a seeded reference input, as golden tensors: computed
    by onnxruntime on the source model (``options["source"]``) where the value exists there, else by
    minirt's CPU kernels on the built graph (a value that the passes created); a note says how many came
    from each."""
    from minirt.builder.lower import lower_model
    from minirt.builder.writer import ArtifactWriter
    import minirt

    writer = ArtifactWriter()
    lower_model(model_ir, writer)
    rec = writer.graphs[0]
    wanted: list[str] = []
    for p in plan.partitions:
        for v in p.ir.inputs + p.ir.outputs:
            if v.name not in wanted:
                wanted.append(v.name)
    graph_outputs = [rec.values[i][0] for i in rec.outputs]
    extra = [name for name in wanted if name not in graph_outputs and rec.has_value(name)]
    rec.outputs.extend(rec.value(name) for name in extra)
    feeds = reference_inputs(model_ir, options.get("input_shapes"), int(options.get("seed", 0)))
    plan.golden_input = {k: tuple(a.shape) for k, a in feeds.items()}
    sess = minirt.Session(writer.to_bytes(), providers=[CPU])
    names = graph_outputs + extra
    results = dict(zip(names, sess.run(names, feeds)))
    values = {**feeds, **results}
    if options.get("source") is not None:
        try:
            # (an input pinned at build time (--input-value) is fed its value: the source model still
            # takes it, and another value would take another path, e.g. Silero VAD's 8 kHz branch)
            reference = _reference_values(options["source"], wanted, {**feeds, **options.get("pinned", {})})
        except Exception as exc:  # noqa: BLE001 - onnxruntime refuses the source: minirt's values stand
            reference = {}
            plan.notes.append(f"golden outputs: onnxruntime could not run the source model "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0][:160]})")
        values.update(reference)
        computed = [n for n in wanted if n not in feeds]
        if computed:
            plan.notes.append(f"golden outputs: {sum(n in reference for n in computed)} of {len(computed)} "
                              f"boundary values computed by onnxruntime on the source model, the others by "
                              f"minirt's CPU kernels (values the optimizer created)")
    for p in plan.partitions:
        p.golden_inputs = [np.asarray(values[v.name]) for v in p.ir.inputs]
        p.golden_outputs = [np.asarray(values[v.name]) for v in p.ir.outputs]


# --- thin artifacts: no CPU version of the partitions -------------------------------------

def drop_cpu_versions(model_ir: ir.Model, plan: PartitionPlan) -> int:
    """Replace each planned partition's nodes by one ``com.minirt::DelegatedPartition`` node (after the
    golden outputs were computed from them; it reads the partition's inputs and makes its outputs, its
    CPU kernel only refuses to run: minirt/kernels/delegated.py), and drop the initializers no node reads any more: an
    accelerator artifact without the CPU fallback (``--no-cpu-fallback``).  Returns the bytes of the
    initializers dropped."""
    graph = model_ir.graph
    replaced: dict[int, ir.Value] = {}  # id(an earlier partition's output) -> its stand-in's output
    for p in plan.partitions:
        p.source_nodes = len(p.ir.nodes)
        p.ir.inputs = [replaced.get(id(v), v) for v in p.ir.inputs]
        outs = [ir.Value(name=None, shape=v.shape, type=v.type) for v in p.ir.outputs]
        attributes = [ir.AttrString("provider", p.provider), ir.AttrInt64("partition", p.index),
                      ir.AttrInt64("nodes", len(p.ir.nodes))]
        node = ir.Node(vocabulary.MINIRT_DOMAIN, vocabulary.DELEGATED_PARTITION, list(p.ir.inputs), attributes, outputs=outs,
                       version=1, name=f"{p.provider}_partition_{p.index}")
        graph.insert_before(p.ir.nodes[0], node)
        for old, new in zip(p.ir.outputs, outs):
            replaced[id(old)] = new
            name = old.name
            if old.is_graph_output():
                graph.outputs[[o is old for o in graph.outputs].index(True)] = new
            old.replace_all_uses_with(new)
            old.name = None
            new.name = name
        graph.remove(list(reversed(p.ir.nodes)), safe=True)
        p.ir.nodes = [node]
        p.ir.outputs = outs
    irh.ensure_minirt_opset(model_ir)
    read = {id(v) for n in ir.traversal.RecursiveGraphIterator(graph) for v in n.inputs if v is not None}
    dropped = 0
    for name, v in list(graph.initializers.items()):
        if id(v) not in read and not v.is_graph_output() and not v.is_graph_input():
            dropped += v.const_value.nbytes if v.const_value is not None else 0
            del graph.initializers[name]
    return dropped


# --- writing ----------------------------------------------------------------------------


def _share_weights(plan: PartitionPlan, writer) -> None:
    """Let each program whose provider can (``spec.share_weights``: NNAPI) take the constants that equal
    initializers already in ``writer`` (the CPU version's weights) from those tensors instead of a copy;
    a note gives the bytes shared."""
    tensors = {t: writer.tensors[t] for g in writer.graphs for _, t in g.initializers}
    for p in plan.partitions:
        try:
            spec = target_providers.get_spec(p.provider)
        except Exception:  # noqa: BLE001 - a provider without a builder spec here: nothing to share
            continue
        share = getattr(spec, "share_weights", None)
        if share is None or p.blob is None:
            continue
        if p.lowered_blob is None:
            p.lowered_blob = p.blob
        try:
            p.blob, p.shared = share(p.lowered_blob, tensors)
        except Exception as exc:  # noqa: BLE001 - sharing saves space only: the program keeps its copies
            p.blob, p.shared = p.lowered_blob, None
            plan.notes.append(f"{p.provider} partition {p.index}: weights not shared ({type(exc).__name__}: {exc})")
            continue
        st = p.shared
        if st.get("constant_bytes") and not st["shared_bytes"] + st["relayout_bytes"]:
            plan.notes.append(f"{p.provider} partition {p.index}: its {_size(st['constant_bytes'])} of constants are "
                              f"in the program only (no CPU-version weight equals one of them)")
        elif st.get("constant_bytes"):
            plan.notes.append(
                f"{p.provider} partition {p.index}: {_size(st['shared_bytes'] + st['relayout_bytes'])} of its "
                f"{_size(st['constant_bytes'])} of constants are the CPU version's weights, stored once "
                f"({_size(st['shared_bytes'])} the same bytes, {_size(st['relayout_bytes'])} transposed when the "
                f"program is compiled)")


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def apply_plan(plan: PartitionPlan, writer, graph_index: int = 0, metadata: bool = True,
               share_weights: bool = True) -> None:
    """Add the plan's blobs, golden tensors and partition records to ``writer``.

    Call after ``lower_model(model_ir, writer)`` (which wrote the reordered
    graph).  Nodes are matched by name; each partition must be a contiguous
    run of the written graph.  With ``share_weights`` a program's constants
    that equal the CPU version's initializers refer to those tensors
    (``_share_weights``).  With ``metadata`` the report is stored as the
    ``build.partitions`` metadata entry.
    """
    from minirt.builder.writer import PartitionRecord

    rec = writer.graphs[graph_index]
    node_index = {node[0]: i for i, node in enumerate(rec.nodes)}
    if share_weights:
        _share_weights(plan, writer)
    else:
        for p in plan.partitions:
            if p.lowered_blob is not None:  # (an earlier apply_plan shared: its references are not this writer's)
                p.blob, p.shared = p.lowered_blob, None
    for p in plan.partitions:
        idxs = [node_index[n.name] for n in p.ir.nodes]
        first = idxs[0]
        if idxs != list(range(first, first + len(idxs))):
            raise RuntimeError(f"partition {p.index} ({p.provider}) is not a contiguous run of the written graph")
        inputs = [rec.value(v.name) for v in p.ir.inputs]
        outputs = [rec.value(v.name) for v in p.ir.outputs]
        blob = writer.add_blob(p.blob) if p.blob is not None else -1
        golden_in = [writer.tensor(a) for a in p.golden_inputs] if p.golden_inputs is not None else []
        golden_out = [writer.tensor(a) for a in p.golden_outputs] if p.golden_outputs is not None else []
        writer.partitions.append(
            PartitionRecord(p.provider, graph_index, first, len(idxs), inputs, outputs, blob, p.options, golden_in, golden_out)
        )
    if metadata:
        writer.set_metadata("build.partitions", plan.report())
