"""Draw an artifact's main graph with nodes coloured by provider (``minirt inspect --graph``).

Each box shows the op type and its result's dtype and shape; hovering a node (SVG) gives its name,
inputs and outputs with their shapes.

SVG is written by hand (no graphviz): nodes are placed in layers by longest
path from the inputs, edges are straight lines, and each node is coloured by
the provider of the partition that holds it (CPU nodes grey).  ``.png`` is
produced from the same layout with matplotlib when it is installed.
"""
from __future__ import annotations

import html
import os

from minirt.vocabulary import CPU

# one colour per provider of the table (minirt/vocabulary.py; tests/test_vocabulary.py checks the keys);
# a provider registered at run time takes one of _EXTRA
COLOURS = {CPU: "#d9d9d9", "coreml": "#7fb3ff", "nnapi": "#8fd18f", "tflite": "#ffb870"}
_EXTRA = ["#c9a0ff", "#ff9aa8", "#ffe680"]
BOX_W, BOX_H, GAP_X, GAP_Y = 170, 40, 20, 34


def _shape_text(v) -> str:
    """A value's dtype and shape as the box's second line, e.g. ``f32 1x32x112x112``."""
    from minirt.dtypes import ONNX_TO_NUMPY

    dtype = ONNX_TO_NUMPY.get(v.dtype)
    short = {"float32": "f32", "float16": "f16", "float64": "f64", "uint8": "u8", "int8": "i8", "int32": "i32",
             "int64": "i64", "bool": "bool"}.get(getattr(dtype, "__name__", str(dtype)), "?")
    if v.shape is None:
        return f"{short} ?"
    return f"{short} " + ("x".join("?" if d is None else str(d) for d in v.shape) or "scalar")


def _layout(art):
    graph = art.graphs[0]
    producer = {}
    for i, node in enumerate(graph.nodes):
        for v in node.outputs:
            if v >= 0:
                producer[v] = i
    provider = [CPU] * len(graph.nodes)
    for p in art.partitions:
        if p.graph == 0:
            for i in range(p.first_node, p.first_node + p.node_count):
                provider[i] = p.provider
    layer = [0] * len(graph.nodes)
    edges = []
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            j = producer.get(v)
            if j is not None:
                layer[i] = max(layer[i], layer[j] + 1)
                edges.append((j, i))
    rows: dict[int, list[int]] = {}
    for i, l in enumerate(layer):
        rows.setdefault(l, []).append(i)
    pos = {}
    width = max((len(r) for r in rows.values()), default=1)
    for l, members in rows.items():
        offset = (width - len(members)) * (BOX_W + GAP_X) / 2
        for k, i in enumerate(members):
            pos[i] = (20 + offset + k * (BOX_W + GAP_X), 40 + l * (BOX_H + GAP_Y))
    size = (40 + width * (BOX_W + GAP_X), 80 + (max(rows, default=0) + 1) * (BOX_H + GAP_Y))
    return graph, provider, pos, edges, size


_ASSIGNED: dict[str, str] = {}  # providers outside the table, coloured on first sight (COLOURS stays the table's)


def _colour(name, seen):
    if name in COLOURS:
        return COLOURS[name]
    if name not in _ASSIGNED:
        _ASSIGNED[name] = _EXTRA[len(seen) % len(_EXTRA)]
    return _ASSIGNED[name]


def render(art, out_path: str) -> str:
    ext = os.path.splitext(out_path)[1].lower()
    if ext == ".svg":
        with open(out_path, "w", encoding="utf-8") as f:
            f.write(svg(art))
    elif ext == ".png":
        _png(art, out_path)
    else:
        raise ValueError(f"--graph: write a .svg or .png file, not {out_path!r}")
    return out_path


def svg(art) -> str:
    graph, provider, pos, edges, (w, h) = _layout(art)
    ops = art.operators
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0f}" height="{h:.0f}" font-family="sans-serif" font-size="11">']
    seen = []
    for p in dict.fromkeys(provider):
        seen.append(p)
    legend_x = 20
    for p in seen:
        out.append(f'<rect x="{legend_x}" y="8" width="14" height="14" fill="{_colour(p, seen)}" stroke="#333"/>'
                   f'<text x="{legend_x + 18}" y="20">{html.escape(p)}</text>')
        legend_x += 30 + 7 * len(p)
    for a, b in edges:
        (x1, y1), (x2, y2) = pos[a], pos[b]
        out.append(f'<line x1="{x1 + BOX_W / 2:.0f}" y1="{y1 + BOX_H:.0f}" x2="{x2 + BOX_W / 2:.0f}" y2="{y2:.0f}" stroke="#888"/>')
    for i, node in enumerate(graph.nodes):
        x, y = pos[i]
        op = ops[node.op_index].op_type
        out_v = graph.values[node.outputs[0]] if node.outputs and node.outputs[0] >= 0 else None
        shape = _shape_text(out_v) if out_v is not None else ""
        ins = ", ".join(graph.values[v].name for v in node.inputs if v >= 0)
        outs = ", ".join(f"{graph.values[v].name}: {_shape_text(graph.values[v])}" for v in node.outputs if v >= 0)
        title = html.escape(f"{node.name} ({op}) on {provider[i]}\nin: {ins}\nout: {outs}")
        out.append(f'<g><title>{title}</title><rect x="{x:.0f}" y="{y:.0f}" width="{BOX_W}" height="{BOX_H}" rx="5" '
                   f'fill="{_colour(provider[i], seen)}" stroke="#333"/>'
                   f'<text x="{x + BOX_W / 2:.0f}" y="{y + 16:.0f}" text-anchor="middle">{html.escape(op[:24])}</text>'
                   f'<text x="{x + BOX_W / 2:.0f}" y="{y + 31:.0f}" text-anchor="middle" font-size="9" fill="#333">'
                   f'{html.escape(shape[:30])}</text></g>')
    out.append("</svg>")
    return "\n".join(out)


def _png(art, out_path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import FancyBboxPatch
    except ImportError:
        raise ValueError("--graph out.png needs matplotlib (pip install matplotlib); write .svg instead") from None
    graph, provider, pos, edges, (w, h) = _layout(art)
    fig = plt.figure(figsize=(max(w, 200) / 100, max(h, 200) / 100), dpi=100)
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(0, w)
    ax.set_ylim(h, 0)
    ax.axis("off")
    seen = list(dict.fromkeys(provider))
    for a, b in edges:
        (x1, y1), (x2, y2) = pos[a], pos[b]
        ax.plot([x1 + BOX_W / 2, x2 + BOX_W / 2], [y1 + BOX_H, y2], color="#888", lw=0.6)
    for i, node in enumerate(graph.nodes):
        x, y = pos[i]
        op = art.operators[node.op_index].op_type
        ax.add_patch(FancyBboxPatch((x, y), BOX_W, BOX_H, boxstyle="round,pad=0,rounding_size=5",
                                    fc=_colour(provider[i], seen), ec="#333", lw=0.6))
        ax.text(x + BOX_W / 2, y + 14, op[:24], ha="center", va="center", fontsize=7)
        if node.outputs and node.outputs[0] >= 0:
            ax.text(x + BOX_W / 2, y + 29, _shape_text(graph.values[node.outputs[0]])[:30], ha="center", va="center",
                    fontsize=6, color="#333")
    fig.savefig(out_path)
    plt.close(fig)
