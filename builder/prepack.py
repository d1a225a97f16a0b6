"""Store weights packed for the target's native kernels (``--weight-pack N``; docs/decisions.md D61).

The native float kernels read a conv's weights on the channel-vector path, and a MatMul / Gemm's
constant right operand, in panels of ``N`` output channels / columns (``N`` = G_NR, 2 x the vector
width: 8 on the Raspberry Pi's NEON).  Without this the runtime packs them on each layer's first run;
with it the builder stores the packed forms in the optional packed_weights section and a runtime
whose kernels use panels of ``N`` seeds its cache with views of them at load (minirt/session.py),
so the first run packs nothing.  Packing is numpy (minirt/format/packed_weights.py): it needs no
native library and packs for any panel width.

Which convs to pack are the geometry rules of ``mrt_conv2d_uses_winograd`` and
``mrt_conv2d_uses_packed_w``, copied in ``packed_weights.conv_uses_winograd`` / ``conv_uses_packed_w``
(tested against the C); a layer the rules leave on the GEMM path would store a pack nothing reads.  A
conv whose output size is not fixed in the file (a dynamic dimension, e.g. a text recognizer's width) is
packed when a rule takes its packed path at some size (its tag then has 0 for that size): a pack cached
by weight serves every size the runtime sees.
"""
from __future__ import annotations

import numpy as np

from minirt.builder.writer import ArtifactWriter
from minirt.format import packed_weights as P
from minirt.vocabulary import FUSED_FORMS, MINIRT_DOMAIN


def _with_fused_form(op_type: str) -> frozenset:
    """The (domain, op_type) keys of a standard op and its com.minirt fused form."""
    return frozenset({("", op_type), (MINIRT_DOMAIN, FUSED_FORMS[op_type])})


_CONV_OPS = _with_fused_form("Conv")
_MATMUL_OPS = _with_fused_form("MatMul")
_GEMM_OPS = _with_fused_form("Gemm")
_RNN_OPS = frozenset({("", "LSTM"), ("", "GRU")})


def add_packed_weights(writer: ArtifactWriter, nr: int) -> int:
    """Pack, for panel width ``nr``, every weight of ``writer``'s graphs the native kernels read packed
    (float convs on the channel-vector path, constant 2-D float B of MatMul / Gemm, LSTM / GRU input
    weights) into
    ``writer.packed_weights``; returns the number of entries.

    Nodes of a partition with a provider program are left out: they are its CPU version, which runs
    only when the provider cannot (it then packs on its first run, as without this section), and their
    packs would be a third copy of the weights next to the initializers and the program's constants
    (ResNet-18 for android-api34: 44.4 of its 89.6 MiB).  Call it after the partitions are applied."""
    if nr not in P.PANEL_WIDTHS:
        raise ValueError(f"weight pack panel width must be one of {P.PANEL_WIDTHS} (0: off), got {nr}")
    delegated = {(p.graph, k) for p in writer.partitions if p.blob >= 0
                 for k in range(p.first_node, p.first_node + p.node_count)}
    seen = set()
    for g, graph in enumerate(writer.graphs):
        tensor_of = dict(graph.initializers)  # value index -> tensor index
        for k, (_name, op_index, inputs, outputs, attributes) in enumerate(graph.nodes):
            if (g, k) in delegated:
                continue
            domain, op_type, _opset = writer.operators[op_index]
            attrs = {name: value for name, _kind, value in attributes}
            found = []
            if (domain, op_type) in _CONV_OPS:
                found = _conv_entries(writer, graph, tensor_of, inputs, outputs, attrs, nr)
            elif (domain, op_type) in _MATMUL_OPS | _GEMM_OPS:
                found = [_product_entry(writer, tensor_of, inputs, attrs, gemm=(domain, op_type) in _GEMM_OPS)]
            elif (domain, op_type) in _RNN_OPS:
                found = [_rnn_input_entry(writer, tensor_of, inputs)]
            for kind, tensor, tag in (f for f in found if f is not None):
                key = (kind, tensor, P.cache_tag(kind, tag))  # (one conv pack per weight and group, whatever the geometry)
                if key in seen:
                    continue
                seen.add(key)
                w = writer.tensors[tensor]
                if kind == P.PACK_CONV_F32:
                    packed = P.pack_conv_w(w, tag[1], nr)
                elif kind == P.PACK_CONV_WINOGRAD:
                    packed = P.pack_winograd_w(w)
                else:  # (an RNN's W (D, G*H, I): its D*G*H rows of I floats, B transposed)
                    packed = P.pack_sgemm_b(w.reshape(-1, w.shape[-1]), tag[0], nr)
                writer.packed_weights.append((kind, tensor, nr, tag, packed))
    return len(writer.packed_weights)


def _rnn_input_entry(writer, tensor_of, inputs):
    """(kind, tensor, tag) of an LSTM / GRU's input weights W (D, G*H, I), a float32 constant, or None: the
    native layer projects every step's input at once by the product with W's D*G*H rows transposed
    (``minirt.native.rnn_prepare``: K = I, N = D*G*H, transb)."""
    t = _float_weight(writer, tensor_of, inputs, 1, 3)
    if t is None:
        return None
    dirs, gh, k = writer.tensors[t].shape
    return P.PACK_SGEMM_B, t, (1, k, dirs * gh)


def _float_weight(writer: ArtifactWriter, tensor_of: dict, inputs: tuple, i: int, rank: int) -> int | None:
    """The tensor index of input ``i`` when it is a float32 constant of ``rank`` dimensions, else None."""
    t = tensor_of.get(inputs[i]) if len(inputs) > i and inputs[i] >= 0 else None
    if t is None:
        return None
    w = writer.tensors[t]
    return t if w.dtype == np.float32 and w.ndim == rank and w.size else None


# Output heights / widths tried for a dimension the file leaves dynamic (_conv_entries): the sizes where
# the geometry rule's thresholds change (rows of 1, planes of 256 / 1024 / 2048 pixels) and around them.
_SIZES_TRIED = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096)


def _conv_entries(writer, graph, tensor_of, inputs, outputs, attrs, nr):
    """[(kind, tensor, tag)] of a float conv that takes a packed path: the Winograd pack where the rule of
    ``mrt_conv2d_uses_winograd`` takes it, the channel-vector pack where ``mrt_conv2d_uses_packed_w`` does
    (both for a dynamic output size that reaches both); [] for none.  A 1-D conv (weight (M, C/group, K),
    output (N, M, L)) runs as the 2-D conv of (N, C, 1, W) by a 1 x K kernel: its tag says so (kh 1, oh 1)."""
    t = _float_weight(writer, tensor_of, inputs, 1, 4)
    one_d = t is None
    if one_d:
        t = _float_weight(writer, tensor_of, inputs, 1, 3)
    if t is None or not outputs or outputs[0] < 0:
        return []
    dims = writer.tensors[t].shape
    m, cg, kh, kw = (dims[0], dims[1], 1, dims[2]) if one_d else dims
    group = int(attrs.get("group", 1))
    c = cg * group
    y_shape = graph.values[outputs[0]][2]
    if y_shape is None or len(y_shape) != (3 if one_d else 4):
        return []
    # an output size not fixed in the file (a dynamic dimension) is 0 in the tag; the layer is packed when
    # the kernels' rule takes the packed path at some size of it (_SIZES_TRIED): the runtime seeds the
    # pack whatever the size (by weight and group), and a run at a size the rule sends to the GEMM path
    # just leaves it unread
    oh, ow = (1, y_shape[2]) if one_d else y_shape[2:]
    oh, ow = (d if isinstance(d, int) and d > 0 else 0 for d in (oh, ow))
    strides = tuple(attrs.get("strides") or ())
    sh, sw = (1, (strides + (1,))[0]) if one_d else (strides + (1, 1))[:2]
    x_shape = graph.values[inputs[0]][2] if inputs and inputs[0] >= 0 else None
    pads = tuple(attrs.get("pads") or (0, 0, 0, 0))
    if (not one_d and x_shape is not None and len(x_shape) == 4 and len(pads) == 4
            and attrs.get("auto_pad", "NOTSET") in ("NOTSET", "VALID")
            and P.runs_down_a_column(x_shape[3], kw, ow, pads[1])):
        kh, kw, sh, sw, oh, ow = 1, kh, 1, sh, 1, oh  # (the 1-D conv along H the runtime runs)
    if group == c and cg == 1 and m == c and kh * kw > 1:
        return []  # depthwise: its own kernel, unpacked weights
    dilations = tuple(attrs.get("dilations") or ())
    dh, dw = (1, (dilations + (1,))[0]) if one_d else (dilations + (1, 1))[:2]
    sizes = [(h, w) for h in ((oh,) if oh else _SIZES_TRIED) for w in ((ow,) if ow else _SIZES_TRIED)]
    winograd = [P.conv_uses_winograd(c, m, group, kh, kw, sh, sw, dh, dw, h, w, nr) for h, w in sizes]
    tag = (c, group, kh, kw, int(sh), int(sw), oh, ow)
    entries = [(P.PACK_CONV_WINOGRAD, t, tag)] if any(winograd) else []
    if any(not wino and P.conv_uses_packed_w(c, m, group, kh, kw, sh, sw, h, w, nr)
           for (h, w), wino in zip(sizes, winograd)):
        entries.append((P.PACK_CONV_F32, t, tag))
    return entries


def _product_entry(writer, tensor_of, inputs, attrs, gemm: bool):
    """(kind, tensor, tag) of a MatMul / Gemm whose B the runtime packs (a 2-D float32 constant, with a
    constant bias when it has one; Gemm: transA = 0, alpha = 1), or None."""
    if gemm and (attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0):
        return None
    t = _float_weight(writer, tensor_of, inputs, 1, 2)
    if t is None or len(inputs) > 2 and inputs[2] >= 0 and inputs[2] not in tensor_of:
        return None  # (a computed bias: the runtime does not keep the product prepared)
    transb = int(attrs.get("transB", 0)) if gemm else 0
    rows, cols = writer.tensors[t].shape
    k, n = (cols, rows) if transb else (rows, cols)
    return P.PACK_SGEMM_B, t, (transb, k, n)
