"""An artifact's graphs as an ONNX file that Netron opens (``minirt inspect --onnx OUT.onnx``).

What the builder made, not the source model: the optimized graph with minirt's fused ops
(``com.minirt`` domain: FusedConv, FusedMatMul, QConv, ...), every value with its dtype and shape
(Netron shows them on the edges), the weights as initializers, subgraphs of If / Loop / Scan as
graph attributes.  Each node carries where it runs and in what precision, as node metadata
(``metadata_props``: ``minirt.provider``, ``minirt.partition``, ``minirt.precision``) and, for viewers
that show only the description, in its ``doc_string``.

The file is for looking at: minirt's own ops are not ONNX operators, so other runtimes do not run
it.  Needs the ``onnx`` package (the builder extra); imported only by this command.
"""
from __future__ import annotations

from minirt.format import schema as S
from minirt.vocabulary import CPU

# dtype codes whose tensors are quantized data (uint8, int8, int4, uint4)
_QUANT_CODES = {2, 3, 21, 22}


def export(art, out_path: str) -> str:
    """Write ``art`` (a loaded artifact) to ``out_path`` as ONNX; returns the path."""
    try:
        import onnx
        from onnx import helper, numpy_helper
    except ImportError:
        raise RuntimeError("--onnx needs the onnx package: pip install 'minirt[builder]'") from None
    where = {}  # (graph index, node index) -> (provider, partition index)
    for k, p in enumerate(art.partitions):
        for i in range(p.first_node, p.first_node + p.node_count):
            where[(p.graph, i)] = (p.provider, k)

    def value_info(v):
        shape = None if v.shape is None else [d if isinstance(d, (int, str)) else None for d in v.shape]
        return helper.make_tensor_value_info(v.name, v.dtype or onnx.TensorProto.UNDEFINED, shape)

    def attribute(name, attr):
        k, v = attr.kind, attr.value
        if k == S.ATTR_TENSOR:
            return helper.make_attribute(name, numpy_helper.from_array(art.tensor(v)))
        if k == S.ATTR_TENSORS:
            return helper.make_attribute(name, [numpy_helper.from_array(art.tensor(t)) for t in v])
        if k == S.ATTR_GRAPH:
            return helper.make_attribute(name, graph(v))
        if k == S.ATTR_GRAPHS:
            return helper.make_attribute(name, [graph(g) for g in v])
        if k == S.ATTR_STRINGS:
            return helper.make_attribute(name, list(v))
        if k in (S.ATTR_INTS, S.ATTR_FLOATS):
            return helper.make_attribute(name, list(v), attr_type=onnx.AttributeProto.INTS if k == S.ATTR_INTS
                                         else onnx.AttributeProto.FLOATS)
        return helper.make_attribute(name, v)

    def graph(index):
        g = art.graphs[index]
        values = g.values
        initialized = {v for v, _ in g.initializers}
        nodes = []
        for i, n in enumerate(g.nodes):
            op = art.operators[n.op_index]
            provider, partition = where.get((index, i), (CPU, None))
            codes = {values[v].dtype for v in (*n.inputs, *n.outputs) if v >= 0}
            precision = "int8" if codes & _QUANT_CODES else "float16" if 10 in codes else "float"
            meta = {"minirt.provider": provider, "minirt.precision": precision}
            if partition is not None:
                meta["minirt.partition"] = str(partition)
            node = helper.make_node(
                op.op_type, [values[v].name if v >= 0 else "" for v in n.inputs],
                [values[v].name if v >= 0 else "" for v in n.outputs], name=n.name, domain=op.domain,
                doc_string="; ".join(f"{k[len('minirt.'):]}: {v}" for k, v in meta.items()))
            node.attribute.extend(attribute(name, a) for name, a in sorted(n.attributes.items()))
            for key, value in meta.items():
                entry = node.metadata_props.add()
                entry.key, entry.value = key, value
            nodes.append(node)
        inits = [numpy_helper.from_array(art.tensor(t), values[v].name) for v, t in g.initializers]
        produced = {v for n in g.nodes for v in n.outputs if v >= 0}
        inner = [value_info(values[v]) for v in sorted(produced) if v not in g.outputs]
        return helper.make_graph(
            nodes, g.name or f"graph{index}", [value_info(values[v]) for v in g.inputs if v not in initialized],
            [value_info(values[v]) for v in g.outputs], inits, value_info=inner)

    versions: dict = {}  # domain -> the highest opset version of its operators in the file
    for op in art.operators:
        domain = "" if op.domain == "ai.onnx" else op.domain
        versions[domain] = max(versions.get(domain, 1), op.opset)
    versions.setdefault("", 17)
    imports = [helper.make_opsetid(d, v) for d, v in versions.items()]
    model = helper.make_model(graph(0), opset_imports=imports, producer_name="minirt",
                              producer_version=str(art.metadata.get("producer.version", "")))
    model.ir_version = max(model.ir_version, 10)  # (node metadata_props: IR 10)
    onnx.save(model, out_path)
    return out_path
