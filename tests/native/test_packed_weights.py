"""Weights packed by the builder (``--weight-pack``; minirt/format/packed_weights.py, builder/prepack.py,
docs/decisions.md D61): the numpy packers give the native packers' bytes at every ISA level, the
builder's copy of the packed-path rule agrees with ``mrt_conv2d_uses_packed_w``, and a session seeds
the packs of its kernels' layout so that the first run packs nothing, with bit-identical results;
another layout, or another ISA selected later, falls back to packing lazily."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import minirt
from minirt.builder import build_bytes
from minirt import native
from minirt.format import packed_weights as P
from minirt.format import schema as S
from tests.native.conftest import requires_native


@pytest.mark.parametrize("m, cg, group, kh, kw", [(32, 8, 1, 3, 3), (64, 16, 1, 1, 1), (24, 3, 1, 3, 3), (70, 5, 1, 2, 3),
                                                  (64, 4, 2, 3, 3), (48, 6, 3, 1, 1), (1, 1, 1, 1, 1), (33, 7, 1, 5, 5)])
def test_numpy_conv_packer_gives_the_native_bytes(m, cg, group, kh, kw, every_isa):
    w = np.random.default_rng(m * 7 + cg).standard_normal((m, cg, kh, kw)).astype(np.float32)
    want = native.conv_pack_w(w, group)  # (w writeable: packed now, not from a cache)
    nr = native.packed_panel_width()
    assert nr == {"avx512": 32, "avx2": 16}.get(every_isa, 8)
    got = P.pack_conv_w(w, group, nr)
    assert got.size == P.conv_packed_floats(m, group, cg * kh * kw, nr)
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("k, n", [(1, 1), (3, 17), (64, 32), (300, 70), (320, 8), (321, 33), (600, 33), (1000, 129),
                                  (257, 300), (1152, 5)])
@pytest.mark.parametrize("transb", [0, 1])
def test_numpy_product_packer_gives_the_native_bytes(k, n, transb, every_isa):
    b = np.random.default_rng(k + n).standard_normal((n, k) if transb else (k, n)).astype(np.float32)
    _isa, want = native.sgemm_pack_b(b, transb, k if transb else n, k, n, owner=b)
    got = P.pack_sgemm_b(b, transb, native.packed_panel_width())
    assert got.size == P.sgemm_packed_floats(k, n, native.packed_panel_width())
    assert got.tobytes() == want.tobytes()


@requires_native
def test_packed_path_rule_agrees_with_the_native_one():
    lib = native._lib
    grid = itertools.product((1, 3, 16, 64, 96, 256), (8, 24, 32, 64, 96, 440, 1000), (1, 2, 4), ((1, 1), (3, 3), (1, 3), (5, 5)),
                             ((1, 1), (2, 2), (1, 2)), ((1, 1), (8, 8), (16, 16), (20, 20), (32, 32), (33, 31), (80, 80),
                                                             (1, 200), (1, 300)))
    checked = 0
    for c, m, group, (kh, kw), (sh, sw), (oh, ow) in grid:
        args = (c, m, group, kh, kw, sh, sw, oh, ow)
        geometry = native._ffi.new("mrt_conv_geometry *", dict(zip(("c", "m", "group", "kh", "kw", "sh", "sw", "oh",
                                                                    "ow"), args)))
        nr = native.packed_panel_width()
        assert P.conv_uses_packed_w(*args, nr) == bool(lib.mrt_conv2d_uses_packed_w(geometry)), args
        checked += 1
    assert checked > 5000


@requires_native
def test_winograd_rule_agrees_with_the_native_one(every_isa):
    grid = itertools.product((8, 16, 17, 64, 256, 257), (8, 16, 24, 64, 256, 300), (1, 2), ((3, 3), (1, 1), (5, 5)),
                             ((1, 1), (2, 2)), ((1, 1), (2, 2)), ((6, 8), (7, 7), (8, 6), (14, 14), (56, 56), (1, 100)))
    nr, checked, taken = native.packed_panel_width(), 0, 0
    for c, m, group, (kh, kw), (sh, sw), (dh, dw), (oh, ow) in grid:
        geometry = native._ffi.new("mrt_conv_geometry *", {"c": c, "m": m, "group": group, "kh": kh, "kw": kw, "sh": sh,
                                                           "sw": sw, "dh": dh, "dw": dw, "oh": oh, "ow": ow})
        native_rule = bool(native._lib.mrt_conv2d_uses_winograd(geometry))
        assert P.conv_uses_winograd(c, m, group, kh, kw, sh, sw, dh, dw, oh, ow, nr) == native_rule
        checked, taken = checked + 1, taken + native_rule
    assert checked > 3000 and (taken > 40) == (nr == 16)


@pytest.mark.parametrize("m, c", [(1, 1), (24, 64), (7, 33)])
def test_numpy_winograd_packer_gives_the_native_bytes(m, c):
    w = np.random.default_rng(m + c).standard_normal((m, c, 3, 3)).astype(np.float32)
    got = P.pack_winograd_w(w)
    assert got.size == 16 * m * c
    assert got.tobytes() == native.winograd_pack_w(w).tobytes()


def test_a_winograd_entry_decodes_and_a_tag_that_does_not_fit_is_refused():
    from minirt.errors import FormatError

    w = np.random.default_rng(1).standard_normal((24, 64, 3, 3)).astype(np.float32)
    rec = type("Rec", (), {"dtype": 1, "dims": w.shape})()
    for tag, ok in (((64, 1, 3, 3, 1, 1, 8, 8), True), ((64, 1, 3, 3, 1, 1, 0, 8), True),
                    ((64, 2, 3, 3, 1, 1, 8, 8), False), ((64, 1, 3, 3, 2, 2, 8, 8), False), ((32, 1, 3, 3, 1, 1, 8, 8), False)):
        payload = P.encode([(P.PACK_CONV_WINOGRAD, 0, 16, tag, P.pack_winograd_w(w))])
        if ok:
            (entry,) = P.decode(memoryview(payload), (rec,))
            assert entry.tag == native.WINOGRAD_PACK_TAG and entry.data.tobytes() == P.pack_winograd_w(w).tobytes()
        else:
            with pytest.raises(FormatError, match="packed_weights entry 0: Winograd conv tag"):
                P.decode(memoryview(payload), (rec,))


def test_k_blocks_follow_the_native_rule():
    assert [P.sgemm_kc(k) for k in (1, 256, 320, 321, 512, 513, 1000)] == [1, 256, 320, 161, 256, 171, 250]


# --------------------------------------------------------------------------- sessions


def _conv_model():
    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def conv(x, y, m, c, k, group=1, stride=1, pad=0):
        name = f"w{len(inits)}"
        inits.append(nh.from_array((rng.standard_normal((m, c // group, k, k)) / k).astype(np.float32), name))
        inits.append(nh.from_array(rng.standard_normal(m).astype(np.float32), name + "b"))
        nodes.append(h.make_node("Conv", [x, name, name + "b"], [y], group=group, strides=[stride, stride],
                                 pads=[pad] * 4))
        nodes.append(h.make_node("Relu", [y], [y + "r"]))
        return y + "r"

    t = conv("x", "a", 32, 3, 3, pad=1)            # 16x16, M 32, K 27: small plane -> packed
    t = conv(t, "b", 64, 32, 3, stride=2, pad=1)   # 8x8, K 288 -> packed
    t = conv(t, "c", 64, 64, 3, group=2, pad=1)    # two groups of 32 channels -> packed
    t = conv(t, "d", 24, 64, 3, pad=1)             # 24 channels, tiny plane -> packed
    t = conv(t, "e", 16, 24, 1)                    # 1x1, K 24 -> the GEMM, not packed
    graph = h.make_graph(nodes, "convs", [h.make_tensor_value_info("x", TP.FLOAT, [2, 3, 16, 16])],
                         [h.make_tensor_value_info(t, TP.FLOAT, [2, 16, 8, 8])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), {"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)}


def _conv1d_model():
    """1-D convs (audio front ends: Silero VAD, wav2vec2), which run as 2-D convs of one-row images."""
    rng = np.random.default_rng(2)
    w1 = (rng.standard_normal((64, 48, 3)) / 8).astype(np.float32)    # K 144, 40 outputs: small plane -> packed
    w2 = (rng.standard_normal((128, 64, 3)) / 8).astype(np.float32)   # stride 2: K 192 -> packed
    nodes = [h.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1]), h.make_node("Relu", ["a"], ["ar"]),
             h.make_node("Conv", ["ar", "w2"], ["y"], strides=[2], pads=[1, 1])]
    graph = h.make_graph(nodes, "convs1d", [h.make_tensor_value_info("x", TP.FLOAT, [1, 48, 40])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [1, 128, 20])],
                         [nh.from_array(w1, "w1"), nh.from_array(w2, "w2")])
    feed = {"x": rng.standard_normal((1, 48, 40)).astype(np.float32)}
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), feed


def _product_model():
    rng = np.random.default_rng(1)
    w1 = rng.standard_normal((700, 70)).astype(np.float32) / 10   # K 700: three k blocks
    w2 = rng.standard_normal((70, 700)).astype(np.float32) / 10   # Gemm transB: stored N x K
    w3 = rng.standard_normal((140, 33)).astype(np.float32) / 10
    nodes = [h.make_node("MatMul", ["x", "w1"], ["a"]),
             h.make_node("Gemm", ["x", "w2", "c2"], ["b"], transB=1),
             h.make_node("Concat", ["a", "b"], ["ab"], axis=1),
             h.make_node("Relu", ["ab"], ["abr"]),
             h.make_node("Gemm", ["abr", "w3"], ["y"])]
    inits = [nh.from_array(w1, "w1"), nh.from_array(w2, "w2"), nh.from_array(w3, "w3"),
             nh.from_array(rng.standard_normal(70).astype(np.float32), "c2")]
    graph = h.make_graph(nodes, "products", [h.make_tensor_value_info("x", TP.FLOAT, [5, 700])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [5, 33])], inits)
    feed = {"x": rng.standard_normal((5, 700)).astype(np.float32)}
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), feed


def _rnn_model():
    """A bidirectional LSTM and a GRU over one sequence: their input weights W (D, G*H, I) are packed
    for the input projection of every step (a batch of one: R is read unpacked)."""
    rng = np.random.default_rng(3)
    seq, inp = 7, 12
    lw = rng.standard_normal((2, 4 * 8, inp)).astype(np.float32) / 4
    lr = rng.standard_normal((2, 4 * 8, 8)).astype(np.float32) / 4
    lb = rng.standard_normal((2, 8 * 8)).astype(np.float32) / 4
    gw = rng.standard_normal((1, 3 * 6, inp)).astype(np.float32) / 4
    gr = rng.standard_normal((1, 3 * 6, 6)).astype(np.float32) / 4
    nodes = [h.make_node("LSTM", ["x", "lw", "lr", "lb"], ["ly"], hidden_size=8, direction="bidirectional"),
             h.make_node("GRU", ["x", "gw", "gr"], ["gy"], hidden_size=6, linear_before_reset=1)]
    graph = h.make_graph(nodes, "rnns", [h.make_tensor_value_info("x", TP.FLOAT, [seq, 1, inp])],
                         [h.make_tensor_value_info("ly", TP.FLOAT, [seq, 2, 1, 8]),
                          h.make_tensor_value_info("gy", TP.FLOAT, [seq, 1, 1, 6])],
                         [nh.from_array(a, n) for a, n in ((lw, "lw"), (lr, "lr"), (lb, "lb"), (gw, "gw"), (gr, "gr"))])
    feed = {"x": rng.standard_normal((seq, 1, inp)).astype(np.float32)}
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), feed


@pytest.fixture
def packs_made(monkeypatch):
    """The tags of the packs the native kernels make (not found in their cache), while the test runs."""
    made = []
    cached_pack = native._cached_pack

    def counting(owner, tag, pack):
        def packing():
            packed = pack()
            if packed is not None:  # (None: a conv that does not take the packed path)
                made.append(tag)
            return packed
        return cached_pack(owner, tag, packing)

    monkeypatch.setattr(native, "_cached_pack", counting)
    return made


@pytest.mark.parametrize("model, kinds, entries", [(_conv_model, "convs", 4), (_conv1d_model, {"conv_f32"}, 2),
                                                   (_product_model, {"sgemm_b"}, 3), (_rnn_model, {"sgemm_b"}, 2)])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_session_seeds_the_packs_of_its_layout(model, kinds, entries, threads, every_isa, packs_made):
    if kinds == "convs":  # (the 64 -> 24 3x3 conv over 8 x 8 takes the Winograd path with AVX2's panels of 16)
        kinds = {"conv_f32", "conv_winograd_f32"} if native.packed_panel_width() == 16 else {"conv_f32"}
    onnx_model, feed = model()
    plain = build_bytes(onnx_model)
    packed = build_bytes(onnx_model, weight_pack=native.packed_panel_width())
    other = build_bytes(onnx_model, weight_pack=8 if native.packed_panel_width() != 8 else 16)
    assert len(minirt.Session(packed).artifact.packed_weights) == entries

    want = minirt.Session(plain, threads=threads).run(None, feed)
    assert {tag[0] for tag in packs_made} == kinds and len(packs_made) == entries  # the builder packed them all
    packs_made.clear()
    session = minirt.Session(packed, threads=threads)
    for _ in range(2):
        got = session.run(None, feed)
        assert packs_made == []  # seeded: nothing packed on the first run
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    # another layout: ignored, packed lazily, same results
    got = minirt.Session(other, threads=threads).run(None, feed)
    assert len(packs_made) == entries
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("model, repacked", [(_conv_model, 0), (_product_model, 3)])
def test_another_isa_selected_after_load_falls_back(model, repacked, packs_made):
    """The seeded packs are dropped with the cache: products pack B anew for the new ISA; a conv
    prepared on the old one runs without packed weights (native.conv2d_call)."""
    if native.packed_panel_width() == 8:
        pytest.skip("needs an ISA with wider panels than the baseline's (AVX2 / AVX-512)")
    onnx_model, feed = model()
    session = minirt.Session(build_bytes(onnx_model, weight_pack=native.packed_panel_width()), threads=1)
    want = session.run(None, feed)
    assert packs_made == []
    before = native.isa
    try:
        native.select_isa("baseline")
        got = session.run(None, feed)
        assert len(packs_made) == repacked and all(tag[0] == "sgemm_b" for tag in packs_made)
    finally:
        native.select_isa(before)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-3)  # (another ISA: other roundings)


def test_a_mapped_file_is_seeded_in_place(tmp_path):
    onnx_model, _feed = _product_model()
    path = tmp_path / "m.mrt"
    path.write_bytes(build_bytes(onnx_model, weight_pack=native.packed_panel_width() or 8))
    session = minirt.Session(str(path))
    if not native.packed_panel_width():
        pytest.skip(f"native kernels not available: {native.reason}")
    for entry in session.artifact.packed_weights:
        assert entry.data.ctypes.data % 64 == 0
        cached = [packed for (_ref, packed) in native._qpacked.values() if packed is entry.data]
        assert len(cached) == 1  # the view of the file itself, no copy


def test_numpy_kernels_ignore_the_packs(monkeypatch):
    onnx_model, feed = _product_model()
    packed = build_bytes(onnx_model, weight_pack=8)
    want = minirt.Session(build_bytes(onnx_model)).run(None, feed)
    monkeypatch.setattr(native, "available", False)
    assert native.packed_panel_width() == 0
    got = minirt.Session(packed).run(None, feed)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_an_entry_with_other_k_blocks_is_ignored(packs_made):
    """A product packed with another K blocking than this runtime's (a file from a runtime whose rule
    differs) is not this runtime's layout: ignored, packed lazily, same results as without packs."""
    from tests.format.util import replace_section, section

    if not native.packed_panel_width():
        pytest.skip(f"native kernels not available: {native.reason}")
    onnx_model, feed = _product_model()
    data = build_bytes(onnx_model, weight_pack=native.packed_panel_width())
    off, length = section(data, S.SECTION_PACKED_WEIGHTS)
    payload = bytearray(data[off:off + length])
    fields = list(P.ENTRY.unpack_from(payload, P.HEADER.size))
    assert fields[0] == P.PACK_SGEMM_B and fields[3] == P.sgemm_kc(700)
    fields[3] -= 1
    P.ENTRY.pack_into(payload, P.HEADER.size, *fields)
    changed = replace_section(data, S.SECTION_PACKED_WEIGHTS, bytes(payload))
    want = minirt.Session(build_bytes(onnx_model)).run(None, feed)
    packs_made.clear()
    got = minirt.Session(changed).run(None, feed)
    assert len(packs_made) == 1  # the other two entries were seeded
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_the_host_target_packs_for_this_machine(packs_made):
    """``--target host`` stores the packs this machine's kernels read: its first run packs nothing."""
    from minirt.targets.profiles import get_target

    host = get_target("host")
    assert host.weight_pack == native.packed_panel_width() and host.name == "host"
    onnx_model, feed = _conv_model()
    session = minirt.Session(build_bytes(onnx_model, target="host"), threads=1)
    assert {e.nr for e in session.artifact.packed_weights} == {native.packed_panel_width()}
    session.run(None, feed)
    assert packs_made == []


@pytest.mark.parametrize("target, width", [("x86-64-v3", 16), ("x86-64-v4", 32), ("rpi4", 8), ("macos", 8),
                                           ("android-api30", 8), ("generic", 0)])
def test_targets_of_a_known_cpu_pack_by_default(target, width):
    from minirt.targets.profiles import get_target

    assert get_target(target).build_defaults()["weight_pack"] == width


@requires_native
def test_a_dynamic_width_packs_each_conv_weight_once(packs_made):
    """A model with a dynamic input width (a text recognizer fed crops of every width) packs each conv
    weight once, on its first run: the packed panels depend on the weight and its group, not on the
    layer's output size (each new width used to pack every layer again)."""
    onnx_model, _ = _conv_model()
    onnx_model.graph.input[0].type.tensor_type.shape.dim[3].dim_param = "width"
    onnx_model.graph.output[0].type.tensor_type.shape.dim[3].dim_param = "out_width"
    artifact = build_bytes(onnx_model)
    rng = np.random.default_rng(5)
    feeds = [rng.standard_normal((2, 3, 16, width)).astype(np.float32) for width in (16, 24, 32, 20)]
    wants = [minirt.Session(artifact, threads=1).run(None, {"x": x})[0] for x in feeds]  # a session per width
    packs_made.clear()
    session = minirt.Session(artifact, threads=1)
    for x, want in zip(feeds, wants):
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], want)
    # (the 64 -> 24 3x3 conv over 8 x width / 2 takes the Winograd path with AVX2's panels of 16: its own pack)
    winograd = {native.WINOGRAD_PACK_TAG} if native.packed_panel_width() == 16 else set()
    assert len(packs_made) == 4 and set(packs_made) == {native.conv_pack_tag(1), native.conv_pack_tag(2)} | winograd


@requires_native
def test_a_dynamic_width_is_packed_by_the_builder_and_packs_nothing_on_the_device(packs_made):
    """A conv whose output width is dynamic in the file is packed when the kernels' rule takes the packed
    path at some width (its tag's OW 0): a session seeds it and packs nothing at any width, with the bits
    of an unpacked build."""
    onnx_model, _ = _conv_model()
    onnx_model.graph.input[0].type.tensor_type.shape.dim[3].dim_param = "width"
    onnx_model.graph.output[0].type.tensor_type.shape.dim[3].dim_param = "out_width"
    packed = build_bytes(onnx_model, weight_pack=native.packed_panel_width())
    entries = minirt.Session(packed).artifact.packed_weights
    if native.packed_panel_width() == 16:  # (the 64 -> 24 conv: Winograd from 7 output columns, the packed
        # channel-vector path on fewer: both packs)
        assert len(entries) == 5 and sorted(e.kind for e in entries) == [P.PACK_CONV_F32] * 4 + [P.PACK_CONV_WINOGRAD]
    else:
        assert len(entries) == 4 and all(e.kind == P.PACK_CONV_F32 for e in entries)
    plain = build_bytes(onnx_model)
    rng = np.random.default_rng(6)
    feeds = [rng.standard_normal((2, 3, 16, width)).astype(np.float32) for width in (16, 40, 8, 64)]
    wants = [minirt.Session(plain, threads=1).run(None, {"x": x})[0] for x in feeds]
    packs_made.clear()
    session = minirt.Session(packed, threads=1)
    for x, want in zip(feeds, wants):
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], want)
    assert packs_made == []


def test_an_entry_with_a_dynamic_output_size_decodes_and_others_stay_refused():
    """OH / OW 0 in a conv tag (a size the file leaves dynamic) is valid; 0 in another field, or a
    negative size, is a format error naming the entry."""
    from minirt.errors import FormatError

    w = np.zeros((32, 8, 3, 3), np.float32)
    rec = type("Rec", (), {"dtype": 1, "dims": w.shape})()
    for tag, ok in (((8, 1, 3, 3, 1, 1, 0, 0), True), ((8, 1, 3, 3, 1, 1, 16, 0), True),
                    ((8, 1, 3, 3, 0, 1, 16, 16), False), ((8, 1, 3, 3, 1, 1, -1, 16), False)):
        payload = P.encode([(P.PACK_CONV_F32, 0, 8, tag, P.pack_conv_w(w, 1, 8))])
        if ok:
            (entry,) = P.decode(memoryview(payload), (rec,))
            assert entry.tag == native.conv_pack_tag(1)
        else:
            with pytest.raises(FormatError, match="packed_weights entry 0: conv tag"):
                P.decode(memoryview(payload), (rec,))


def test_the_conv_cache_key_of_a_file_entry_is_the_runtimes():
    """A packed_weights entry of a conv is seeded under the key conv2d_prepare looks up."""
    assert P.cache_tag(P.PACK_CONV_F32, (64, 2, 3, 3, 1, 1, 8, 8)) == native.conv_pack_tag(2)
