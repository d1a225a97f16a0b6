"""Weights shared between an NNAPI program and its partition's CPU version (issue 27 part 5,
targets/nnapi/share.py): a program constant equal to a CPU-version initializer (the same bytes, or a
transpose of it) is a reference to that artifact tensor; the outputs do not change, the artifact
shrinks, a corrupted reference is refused with a clear error, thin artifacts still work."""
from __future__ import annotations

import gc
import json
import os
import struct

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import minirt
from minirt import cli
from minirt.builder.lower import lower_model
from minirt.builder.partition import apply_plan
from minirt.builder.writer import ArtifactWriter
from minirt.providers.nnapi import NNAPIError, decode_blob
from minirt.targets.nnapi.model import NNModel
from minirt.targets.nnapi.share import share_weights
from tests.nnapi.helpers import build_partitioned, random_feeds

REAL_CACHE = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", ".cache", "real")


def _small_model():
    """Conv (filters re-laid out OIHW -> OHWI), depthwise Conv ([1, kh, kw, C]), Gemm transB=1 (FC weights
    byte for byte), MatMul with a [K, N] constant (transposed to [N, K]), biases (same bytes)."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((32, 8, 3, 3)).astype(np.float32)
    b1 = rng.standard_normal(32).astype(np.float32)
    wd = rng.standard_normal((32, 1, 3, 3)).astype(np.float32)
    wg = rng.standard_normal((256, 32)).astype(np.float32)  # Gemm transB=1: [N, K] as FULLY_CONNECTED reads it
    bg = rng.standard_normal(256).astype(np.float32)
    wm = rng.standard_normal((256, 32)).astype(np.float32)  # MatMul: [K, N]
    inits = [numpy_helper.from_array(a, n) for a, n in
             ((w1, "w1"), (b1, "b1"), (wd, "wd"), (wg, "wg"), (bg, "bg"), (wm, "wm"))]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "wd"], ["c2"], group=32, strides=[1, 1]),
        helper.make_node("GlobalAveragePool", ["c2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),  # (H = W = 1: the Gemm's columns keep their order)
        helper.make_node("Gemm", ["f", "wg", "bg"], ["g"], transB=1),
        helper.make_node("MatMul", ["g", "wm"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "shared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), {"x": (1, 8, 8, 8)}


def _refs(art_bytes):
    art = minirt.Session(art_bytes, providers=["cpu"]).artifact
    blob = bytes(art.provider_blob(art.partitions[0].blob))
    _, hlen = struct.unpack_from("<II", blob, 8)
    header = json.loads(blob[16:16 + hlen])
    return art, blob, [o["r"] for o in header["operands"] if "r" in o]


def test_constants_refer_to_the_cpu_versions_weights_and_outputs_do_not_change(nnapi_on_tflite):
    import onnxruntime as ort

    model, shapes = _small_model()
    shared, plan, _ = build_partitioned(model, "android-api34", shapes)
    copied, _, _ = build_partitioned(model, "android-api34", shapes, share_weights=False)
    p = plan.report()["partitions"][0]
    assert p["nodes"] == len(plan.report()["partitions"][0]["node_names"]) >= 6
    assert p["shared_bytes"] > 0 and p["relayout_bytes"] > 0
    art, blob, refs = _refs(shared)
    exact = [r for r in refs if len(r) == 1]
    moved = {tuple(r[1]) for r in refs if len(r) == 2}
    assert exact and (0, 2, 3, 1) in moved and (1, 2, 3, 0) in moved and (1, 0) in moved, refs
    # every weight is stored once: the file shrinks by (about) the bytes the references stand for
    saved = p["shared_bytes"] + p["relayout_bytes"]
    assert len(copied) - len(shared) >= saved - 4096
    # the program read with its artifact is the program that held copies
    a = NNModel.from_bytes(blob, art)
    b = NNModel.from_bytes(bytes(minirt.Session(copied, providers=["cpu"]).artifact.provider_blob(0)))
    for oa, ob in zip(a.operands, b.operands):
        if isinstance(ob.value, np.ndarray):
            np.testing.assert_array_equal(oa.value, ob.value)
    feeds = random_feeds(shapes)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for art_bytes in (shared, copied):
        sess = minirt.Session(art_bytes, providers=["nnapi", "cpu"])
        assert sess.get_partitions()[0]["runs_on"] == "nnapi", sess.get_partitions()
        np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)


def test_only_exact_values_are_shared():
    """A constant that differs in one element (or by -0.0 vs 0.0) from every tensor keeps its copy."""
    m = NNModel()
    w = np.arange(512, dtype=np.float32).reshape(32, 16)
    i0 = m.const(w)
    i1 = m.const(np.ascontiguousarray(w.T))
    near = w.copy()
    near[3, 3] += 1
    i2 = m.const(near)
    zero = np.zeros(512, np.float32)
    i3 = m.const(-zero)  # bitwise -0.0: no match for +0.0
    m.outputs = [i0, i1, i2, i3]
    blob, stats = share_weights(m.to_bytes(), {5: w, 6: zero})
    d = json.loads(blob[16:16 + struct.unpack_from("<I", blob, 12)[0]])
    recs = [d["operands"][i] for i in (i0, i1, i2, i3)]
    assert recs[0]["r"] == [5] and recs[1]["r"] == [5, [1, 0]] and "v" in recs[2] and "v" in recs[3]
    assert stats["shared_bytes"] == 2048 and stats["relayout_bytes"] == 2048 and stats["shared_operands"] == 2


def test_gemm_columns_permuted_behind_a_flatten_are_shared():
    """FULLY_CONNECTED weights whose columns the lowering put in (H, W, C) order (a Gemm behind a Flatten
    of an NCHW map): the CPU weight [N, C*H*W] seen as [N, C, H*W], transposed [0, 2, 1]."""
    w = np.random.default_rng(1).standard_normal((8, 3 * 4 * 4)).astype(np.float32)
    m = NNModel()
    op = m.const(np.ascontiguousarray(w.reshape(8, 3, 4, 4).transpose(0, 2, 3, 1).reshape(8, 48)))
    m.outputs = [op]
    blob, stats = share_weights(m.to_bytes(), {2: w}, min_bytes=256)
    d = json.loads(blob[16:16 + struct.unpack_from("<I", blob, 12)[0]])
    assert d["operands"][op]["r"] == [2, [0, 2, 1], [8, 3, 16]] and stats["relayout_bytes"] == w.nbytes

    class Art:  # the two things decode_blob asks of an artifact
        tensors = [None, None, None]

        @staticmethod
        def tensor(i):
            return w

    np.testing.assert_array_equal(decode_blob(blob, Art)["operands"][op]["value"],
                                  NNModel.from_bytes(m.to_bytes()).operands[op].value)
    bad = blob.replace(b"[8,3,16]", b"[8,3,17]")
    with pytest.raises(NNAPIError, match="not a shape of its 384 elements"):
        decode_blob(bad, Art)


def _tamper_ref(blob: bytes, edit) -> bytes:
    mv = memoryview(blob)
    version, hlen = struct.unpack_from("<II", mv, 8)
    header = json.loads(bytes(mv[16:16 + hlen]))
    base = 16 + hlen + ((-(16 + hlen)) % 16)
    rec = next(o for o in header["operands"] if "r" in o and len(o["r"]) == 2)
    edit(rec, header)
    hj = json.dumps(header, separators=(",", ":")).encode()
    head = b"MRTNNAPI" + struct.pack("<II", version, len(hj)) + hj
    head += b"\0" * ((-len(head)) % 16)
    return head + bytes(mv[base:])


BAD = [
    (lambda r, h: r.update(r=[10 ** 6, r["r"][1]]), "out of range"),
    (lambda r, h: r.update(r=[-1]), "out of range"),
    (lambda r, h: r.update(d=[r["d"][0] + 1] + r["d"][1:]), "elements"),
    (lambda r, h: r.update(t=4), "dtype"),
    (lambda r, h: r.update(r=[r["r"][0], [0, 0, 1, 2]]), "not a permutation"),
    (lambda r, h: r.update(r=["7"]), "malformed tensor reference"),
    (lambda r, h: r.update(r=[r["r"][0], [0, 1, 2, 3], [1], 9]), "malformed tensor reference"),
    (lambda r, h: r.update(r=[r["r"][0], [0, 1, 2, 3], 9]), "not a shape"),
]


@pytest.mark.parametrize("edit, message", BAD, ids=["index", "negative", "size", "dtype", "perm", "type", "arity", "shape"])
def test_a_corrupted_reference_is_refused(edit, message):
    model, shapes = _small_model()
    shared, _, _ = build_partitioned(model, "android-api34", shapes)
    art, blob, _ = _refs(shared)
    bad = _tamper_ref(blob, edit)
    with pytest.raises(NNAPIError, match=message):
        decode_blob(bad, art)
    with pytest.raises(NNAPIError, match="read without its artifact"):
        decode_blob(blob)
    # a constant's [offset, length] outside the program's data is refused too
    def outside(r, h):
        o = next(o for o in h["operands"] if "v" in o)
        o["v"] = [o["v"][0] + 10 ** 7, o["v"][1]]
    with pytest.raises(NNAPIError, match="does not fit"):
        decode_blob(_tamper_ref(blob, outside), art)


def _writer_with_blob(model, shapes, edit, cpu_fallback=True):
    """Artifact bytes whose NNAPI program's first transposed reference went through ``edit``."""
    from minirt.builder.load import load_model
    from minirt.builder.partition import drop_cpu_versions, plan_partitions
    from minirt.builder.passes import optimize
    from minirt.targets.profiles import get_target

    m, _ = load_model(model)
    optimize(m, 2, input_shapes=shapes)
    plan = plan_partitions(m, get_target("android-api34"), {"input_shapes": shapes})
    if not cpu_fallback:
        drop_cpu_versions(m, plan)
    w = ArtifactWriter()
    lower_model(m, w)
    apply_plan(plan, w)
    w.provider_blobs[0] = _tamper_ref(w.provider_blobs[0], edit) if edit is not None else w.provider_blobs[0]
    return w.to_bytes()


def test_the_session_and_verify_refuse_a_bad_reference(nnapi_on_tflite, tmp_path, capsys):
    model, shapes = _small_model()
    bad = _writer_with_blob(model, shapes, BAD[0][0])
    sess = minirt.Session(bad, providers=["nnapi", "cpu"])  # the CPU version runs, one log line says why
    part = sess.get_partitions()[0]
    assert part["runs_on"] == "cpu" and "out of range" in part["reason"], part
    path = tmp_path / "bad.mrt"
    path.write_bytes(bad)
    capsys.readouterr()
    assert cli.main(["verify", str(path)]) == 1
    assert "out of range" in capsys.readouterr().out


def test_the_nnapi_provider_passes_shared_weights_by_reference(fake_nnapi):
    """Through the validating fake library: the exact references point into the artifact's memory."""
    model, shapes = _small_model()
    shared, _, _ = build_partitioned(model, "android-api34", shapes)
    sess = minirt.Session(shared, providers=["nnapi", "cpu"])
    assert sess.get_partitions()[0]["runs_on"] == "nnapi", sess.get_partitions()
    sess.run(None, random_feeds(shapes))
    assert fake_nnapi.errors == 0, fake_nnapi.last_error
    art = sess.artifact
    desc = decode_blob(art.provider_blob(0), art)
    exact = [o for o in desc["operands"] if o.get("ref") is not None and len(o["ref"]) == 1]
    assert exact and all(np.shares_memory(o["value"], art.tensor(o["ref"][0])) for o in exact)
    del sess
    gc.collect()
    assert fake_nnapi.live == 0


def test_thin_artifacts_still_build_run_and_verify(tmp_path, capsys):
    """--no-cpu-fallback: the partition's weights are not in the CPU graph, so the program keeps its
    own copies (nothing to share) and verifies off-device."""
    pytest.importorskip("ai_edge_litert")
    model, shapes = _small_model()
    src = tmp_path / "m.onnx"
    src.write_bytes(model.SerializeToString())
    out = tmp_path / "thin.mrt"
    capsys.readouterr()
    assert cli.main(["build", str(src), "-o", str(out), "--target", "android-api34", "--input-shape", "x=1x8x8x8",
                     "--no-cpu-fallback", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert all(p["shared_bytes"] == 0 and p["relayout_bytes"] == 0 for p in report["partitions"]["partitions"])
    assert cli.main(["verify", str(out)]) == 0
    full = tmp_path / "full.mrt"
    assert cli.main(["build", str(src), "-o", str(full), "--target", "android-api34", "--input-shape", "x=1x8x8x8"]) == 0
    capsys.readouterr()
    assert cli.main(["verify", str(full)]) == 0 and "-> ok" in capsys.readouterr().out


def test_a_real_model_shrinks_and_matches_onnxruntime(nnapi_on_tflite):
    import onnxruntime as ort

    path, feed_path = os.path.join(REAL_CACHE, "mobilenet_v2.onnx"), os.path.join(REAL_CACHE, "mobilenet_v2.feed.npz")
    if not (os.path.exists(path) and os.path.exists(feed_path)):
        pytest.skip("mobilenet_v2 is not in benchmarks/.cache/real (the benchmark scripts export it)")
    feeds = dict(np.load(feed_path))
    shapes = {k: v.shape for k, v in feeds.items()}
    shared, plan, _ = build_partitioned(path, "android-api34", shapes)
    copied, _, _ = build_partitioned(path, "android-api34", shapes, share_weights=False)
    p = plan.report()["partitions"][0]
    weights = p["shared_bytes"] + p["relayout_bytes"]
    assert weights > 13 * 2**20  # (MobileNetV2: 13.3 MiB of float weights, all of them shared)
    assert len(copied) - len(shared) >= weights - 2**16
    sess = minirt.Session(shared, providers=["nnapi", "cpu"])
    assert sess.get_partitions()[0]["runs_on"] == "nnapi"
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(sess.run(None, feeds), want):
        assert float(np.abs(g - w).max()) <= 1e-4 * max(1.0, float(np.abs(w).max()))
    ref = minirt.Session(copied, providers=["nnapi", "cpu"]).run(None, feeds)
    for g, r in zip(sess.run(None, feeds), ref):
        np.testing.assert_array_equal(g, r)  # the same program: bit for bit the same outputs


def test_a_plan_written_twice_refers_to_each_writers_tensors(nnapi_on_tflite):
    """apply_plan shares from the program as lowered, so a second writer (other tensor indices) gets
    references to its own tensors; share_weights=False gives the copies back."""
    from minirt.builder.load import load_model
    from minirt.builder.partition import plan_partitions
    from minirt.builder.passes import optimize
    from minirt.targets.profiles import get_target

    model, shapes = _small_model()
    m, _ = load_model(model)
    optimize(m, 2, input_shapes=shapes)
    plan = plan_partitions(m, get_target("android-api34"), {"input_shapes": shapes})
    arts = []
    for extra, share in ((0, True), (3, True), (0, False)):
        w = ArtifactWriter()
        for _ in range(extra):  # tensors nothing reads: the weights get other indices
            w.tensor(np.zeros(7, np.float32))
        lower_model(m, w)
        apply_plan(plan, w, share_weights=share)
        arts.append(w.to_bytes())
    assert len(arts[2]) > len(arts[0]) and _refs(arts[0])[2] != _refs(arts[1])[2] and not _refs(arts[2])[2]
    feeds = random_feeds(shapes)
    outs = []
    for art in arts:
        sess = minirt.Session(art, providers=["nnapi", "cpu"])
        assert sess.get_partitions()[0]["runs_on"] == "nnapi", sess.get_partitions()
        outs.append(sess.run(None, feeds)[0])
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])
