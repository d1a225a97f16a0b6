"""Bounded fuzzing in the test suite, plus one regression test per bug the fuzzer found.

The contract under test: whatever bytes an artifact holds, ``minirt.Session``
and ``run`` end in success or a ``minirt.Error`` subclass; no other exception,
no hang, no crash, no multi-gigabyte allocation before failing.
"""
from __future__ import annotations

import math
import os
import random
import resource
import sys
import time

import numpy as np
import pytest

import minirt
from minirt.builder.writer import ArtifactWriter
from minirt.format import schema as S
from tests.fuzz.fuzz_artifacts import fuzz_pool, is_note, load_seeds, quiet_numpy, run_checked
from tests.fuzz.mutator import Mutator, assemble, decode_tensor_table, encode_tensor_table, split, walk_fields

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture(scope="module")
def seeds():
    return dict(load_seeds())


def _innermost_minirt_frame(tb: str) -> str:
    where = ""
    for line in tb.splitlines():
        line = line.strip()
        if line.startswith("File ") and "/minirt/" in line:
            path, _, func = line.partition(", in ")
            where = f"{os.path.basename(path.split(chr(34))[1])}:{func}"
    return where


# Bugs still open, as (exception type, innermost minirt frame); each would have
# a strict-xfail regression test below.  The bugs this fuzzer found are fixed and
# their regression tests run normally.
KNOWN_BUGS: set = set()  # (exception type, innermost minirt frame) of bugs still open: none


def _is_known(finding: dict) -> bool:
    return (finding["kind"], _innermost_minirt_frame(finding["traceback"])) in KNOWN_BUGS


def _describe(findings) -> str:
    return "\n\n".join(
        f"{f['kind']} (seed {f['seed']} iteration {f['iteration']}): {' | '.join(f['log'])}\n{f['traceback']}"
        for f in findings[:5]
    )


# --- the bounded run -----------------------------------------------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="worker isolation uses fork")
def test_bounded_fuzz_run_has_no_unknown_findings(seeds, tmp_path):
    quiet_numpy()
    t0 = time.monotonic()
    findings, outcomes, _elapsed = fuzz_pool(
        list(seeds.items()), seed=20240601, start=0, iterations=2000, workers=2, timeout=10.0, chunk=250,
        mem_limit_mb=2048, rss_jump_mb=1 << 20, findings_dir=str(tmp_path),
    )
    assert sum(outcomes.values()) == 2000
    real = [f for f in findings if not is_note(f)]
    unknown = [f for f in real if not _is_known(f)]
    assert not unknown, _describe(unknown)
    # The mutator must get most mutants past the checksums, or the run tests nothing.
    assert outcomes.get("ChecksumError", 0) < 400, outcomes
    assert outcomes.get("ran", 0) > 50, outcomes
    assert time.monotonic() - t0 < 60


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="worker isolation uses fork")
def test_bounded_fuzz_run_has_no_findings_at_all(seeds, tmp_path):
    quiet_numpy()
    findings, outcomes, _ = fuzz_pool(
        list(seeds.items()), seed=7, start=0, iterations=4000, workers=2, timeout=10.0, chunk=250,
        mem_limit_mb=2048, rss_jump_mb=1 << 20, findings_dir=str(tmp_path),
    )
    real = [f for f in findings if not is_note(f)]
    assert not real, _describe(real)


# --- the mutator itself --------------------------------------------------------------------


def test_mutator_is_deterministic(seeds):
    m = Mutator(list(seeds.items()))
    for i in range(50):
        assert m.mutate(random.Random(f"1:{i}")) == m.mutate(random.Random(f"1:{i}"))


def test_assemble_reproduces_the_writer_layout(seeds):
    for name, data in seeds.items():
        assert assemble(split(data)) == data, name


def test_field_walker_covers_the_grammar(seeds):
    labels = set()
    for data in seeds.values():
        for e in split(data):
            fields = walk_fields(e.kind, e.payload)
            labels |= {f.label for f in fields}
            if e.kind in (S.SECTION_GRAPHS, S.SECTION_TENSORS, S.SECTION_OPERATORS, S.SECTION_METADATA):
                # The walker understood the whole section: its last field ends the payload.
                last = fields[-1]
                assert last.offset + last.size == len(e.payload), (S.SECTION_NAMES[e.kind], last)
    for expected in ("tensor.dtype", "tensor.rank", "tensor.dim", "tensor.nbytes", "value.dtype", "value.rank",
                     "value.dim", "value.dim.symbol", "node.input", "node.output", "init.tensor", "capture",
                     "attr.kind", "attr.graph", "attr.graphs.item", "attr.tensors.item", "attr.strings.item",
                     "meta.kind", "op.opset", "sig.algorithm", "sig.signature"):
        assert expected in labels, expected


def test_most_mutants_get_past_the_checksums(seeds):
    quiet_numpy()
    m = Mutator(list(seeds.items()))
    checksum = 0
    for i in range(300):
        rng = random.Random(f"crc:{i}")
        data, _ = m.mutate(rng)
        try:
            minirt.Session(data)
        except minirt.ChecksumError:
            checksum += 1
        except BaseException:  # noqa: BLE001 - only counting checksum rejections here
            pass
    assert checksum < 0.15 * 300


def test_a_non_minirt_exception_is_reported_as_a_finding():
    outcome, finding = run_checked(b"\x00" * 10, random.Random(0), 5.0)
    assert outcome == "FormatError" and finding is None
    # A feed the harness cannot build is its own problem, but a kernel raising
    # something odd must surface: simulate with a monkeypatched Session.
    orig = minirt.Session
    try:
        minirt.Session = lambda *a, **k: (_ for _ in ()).throw(KeyError("boom"))  # type: ignore[assignment]
        outcome, finding = run_checked(b"", random.Random(0), 5.0, seed=1, i=2, log=["x"])
    finally:
        minirt.Session = orig
    assert outcome == "KeyError" and finding["iteration"] == 2 and "boom" in finding["traceback"]


@pytest.mark.skipif(not hasattr(__import__("signal"), "setitimer"), reason="needs SIGALRM")
def test_the_watchdog_reports_a_hang():
    orig = minirt.Session

    def slow(*a, **k):
        while True:
            time.sleep(0.01)

    try:
        minirt.Session = slow  # type: ignore[assignment]
        outcome, finding = run_checked(b"", random.Random(0), 0.2, seed=1, i=3)
    finally:
        minirt.Session = orig
    assert outcome == "hang" and finding["kind"] == "hang"


# --- memory guards that hold today ------------------------------------------------------------


def _tiny(values_shape=(2,), out_shape=(2,), extra_tensor=None, op="Identity"):
    w = ArtifactWriter()
    w.opsets[""] = 17
    ident = w.operator("", op, 17)
    _, g = w.graph("g")
    x = g.value("x", 1, values_shape)
    g.inputs.append(x)
    y = g.value("y", 1, out_shape)
    g.add_node("n", ident, [x], [y], [])
    g.outputs.append(y)
    if extra_tensor is not None:
        t = w.tensor(extra_tensor)
        v = g.value("w", 1 if extra_tensor.dtype != object else 8, extra_tensor.shape)
        g.initializers.append((v, t))
    return w.to_bytes()


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_huge_declared_value_shapes_do_not_allocate():
    data = _tiny(values_shape=("N", 2**40), out_shape=(2**62, 2**62))
    before = _maxrss_mib()
    sess = minirt.Session(data)
    assert sess.get_inputs()[0].shape == ["N", 2**40]
    with pytest.raises(minirt.InvalidArgument):
        sess.run(None, {"x": np.zeros((1, 2), np.float32)})
    assert _maxrss_mib() - before < 64


def test_a_huge_fixed_input_shape_skips_the_warm_up():
    """Found by `make fuzz` (seed 7, iterations 65549 and four more: a graph's input dim set to 2^40 - 255):
    the warm-up fed zeros of the declared input shape, np.zeros raised numpy's MemoryError from Session().
    A declared input over max_tensor_bytes gets no warm-up; runs check their feeds as always."""
    w = ArtifactWriter()
    w.opsets[""] = 17
    conv, relu = w.operator("", "Conv", 17), w.operator("", "Relu", 14)
    _, g = w.graph("g")
    x = g.value("x", 1, (2**40, 3, 6, 6))  # (the rest declared as one image: a declared memory plan exists)
    g.inputs.append(x)
    wv = g.value("w", 1, (2, 3, 1, 1))
    g.initializers.append((wv, w.tensor(np.ones((2, 3, 1, 1), np.float32))))
    t, y = g.value("t", 1, (1, 2, 6, 6)), g.value("y", 1, (1, 2, 6, 6))
    g.add_node("conv", conv, [x, wv], [t], [])
    g.add_node("relu", relu, [t], [y], [])
    g.outputs.append(y)
    before = _maxrss_mib()
    sess = minirt.Session(w.to_bytes())
    assert not sess.warmed_up
    with pytest.raises(minirt.InvalidArgument):
        sess.run(None, {"x": np.zeros((1, 3, 6, 6), np.float32)})
    assert _maxrss_mib() - before < 64


def test_a_warm_up_feed_that_cannot_be_allocated_skips_the_warm_up(monkeypatch):
    """Found by `make fuzz` (seed 31, iterations 21449 and 90208: an input dim of 16,056,323, 2.15 GiB,
    under the default bound but not to be had under the fuzzer's address-space limit): np.zeros raised
    numpy's MemoryError from Session().  The warm-up is skipped instead."""
    real_zeros = np.zeros

    def zeros(shape, dtype=float, *args, **kwargs):
        if math.prod(shape) >= 1 << 24:
            raise MemoryError("Unable to allocate (simulated address-space limit)")
        return real_zeros(shape, dtype, *args, **kwargs)

    monkeypatch.setattr(np, "zeros", zeros)
    data = _relu_chain(shape=(1, 1 << 24))
    sess = minirt.Session(data)
    assert not sess.warmed_up
    monkeypatch.setattr(np, "zeros", real_zeros)
    x = np.ones((1, 1 << 24), np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x)


def _relu_chain(t_dtype: int = 1, shape: tuple = (1, 4)) -> bytes:
    """x -> Relu -> t -> Relu -> y, all of ``shape``, t declared of dtype code ``t_dtype``."""
    w = ArtifactWriter()
    w.opsets[""] = 17
    relu = w.operator("", "Relu", 14)
    _, g = w.graph("g")
    x, t, y = g.value("x", 1, shape), g.value("t", t_dtype, shape), g.value("y", 1, shape)
    g.inputs.append(x)
    g.add_node("r1", relu, [x], [t], [])
    g.add_node("r2", relu, [t], [y], [])
    g.outputs.append(y)
    return w.to_bytes()


def test_a_string_typed_intermediate_is_not_placed_in_the_declared_plan():
    """Found by `make fuzz` (seed 11, iteration 183600: a node output index copied over a value's dtype):
    the declared memory plan viewed arena bytes as the value's object dtype, numpy's TypeError from
    Session().  Object dtypes are never placed."""
    sess = minirt.Session(_relu_chain(t_dtype=8))
    try:
        sess.run(None, {"x": np.ones((1, 4), np.float32)})
    except minirt.Error:
        pass  # (the run may refuse the mistyped value; it must not raise anything else)


def test_an_arena_that_cannot_be_allocated_is_a_resource_error(monkeypatch):
    """Found by `make fuzz` under its address-space limit (seed 11, iterations 142828 and 182442): mmap's
    OSError (ENOMEM) from the declared plan's arena escaped Session().  The session loads without that plan;
    a run whose own plan cannot get its arena fails with minirt.ResourceError."""
    from minirt import arena

    def no_memory(nbytes, dtype=None):
        raise MemoryError(f"cannot allocate {nbytes} bytes")

    monkeypatch.setattr(arena.np, "empty", no_memory)
    with pytest.raises(minirt.ResourceError, match="arena of .* could not be allocated"):
        arena._arena_memory(1 << 20)
    monkeypatch.undo()
    monkeypatch.setattr(arena, "_arena_memory", lambda nbytes: (_ for _ in ()).throw(
        minirt.ResourceError("the memory plan's arena could not be allocated")))
    sess = minirt.Session(_relu_chain(), warm_up=False)  # (the declared plan's arena fails: no plan)
    x = np.ones((1, 4), np.float32)
    try:
        out = sess.run(None, {"x": x})[0]
    except minirt.ResourceError:
        return
    np.testing.assert_array_equal(out, x)


def _with_tensor_record(data: bytes, index: int, **changes) -> bytes:
    entries = split(data)
    for e in entries:
        if e.kind == S.SECTION_TENSORS:
            recs = decode_tensor_table(e.payload)
            dtype, dims, offset, nbytes = recs[index]
            rec = {"dtype": dtype, "dims": dims, "offset": offset, "nbytes": nbytes}
            rec.update(changes)
            recs[index] = (rec["dtype"], rec["dims"], rec["offset"], rec["nbytes"])
            e.payload = encode_tensor_table(recs)
    return assemble(entries)


@pytest.mark.parametrize(
    "changes",
    [
        {"dims": [2**62], "nbytes": 2**64 - 8},  # nbytes far past the data section
        {"dims": [2**40, 2**40]},  # dims disagree with nbytes
        {"dims": [2**32, 2**32], "nbytes": 0},  # product wraps to 0 in 64 bits
        {"nbytes": 2**63},
    ],
)
def test_initializer_records_with_huge_shapes_fail_before_allocating(changes):
    data = _with_tensor_record(_tiny(extra_tensor=np.arange(4, dtype=np.float32)), 0, **changes)
    before = _maxrss_mib()
    with pytest.raises(minirt.FormatError):
        minirt.Session(data)
    assert _maxrss_mib() - before < 64


def test_string_tensor_claiming_many_items_fails_fast():
    data = _tiny(extra_tensor=np.array(["a", "b"], dtype=object))
    data = _with_tensor_record(data, 0, dims=[10**12])
    t0 = time.monotonic()
    before = _maxrss_mib()
    with pytest.raises(minirt.FormatError):
        minirt.Session(data)
    assert time.monotonic() - t0 < 1 and _maxrss_mib() - before < 64


# --- regression tests for the bugs the fuzzer found (all fixed) -------------


@pytest.mark.parametrize("dims", [[0, 2**62], [0, 2**63 - 1], [2**62, 0, 2**62, 2**62]])
def test_empty_initializer_with_huge_dims(dims):
    data = _with_tensor_record(_tiny(extra_tensor=np.arange(4, dtype=np.float32)), 0, dims=dims, nbytes=0)
    try:
        minirt.Session(data)
    except minirt.Error:
        pass


@pytest.mark.parametrize("dims", [[2**32, 2**32], [0, 2**62], [2**63 - 1, 2]])
def test_string_initializer_with_bad_dims(dims):
    data = _tiny(extra_tensor=np.array(["a", "b"], dtype=object))
    data = _with_tensor_record(data, 0, dims=dims)
    try:
        minirt.Session(data)
    except minirt.Error:
        pass


def test_deeply_nested_json_metadata():
    w = ArtifactWriter()
    w.metadata["deep"] = (S.META_JSON, "[" * 100_000 + "]" * 100_000)
    w.opsets[""] = 17
    op = w.operator("", "Identity", 17)
    _, g = w.graph("g")
    x = g.value("x", 1, (1,))
    g.inputs.append(x)
    g.outputs.append(x)
    data = w.to_bytes()
    try:
        minirt.Session(data)
    except minirt.Error:
        pass


def _with_metadata(**meta) -> bytes:
    w = ArtifactWriter()
    for k, v in meta.items():
        w.set_metadata(k.replace("__", "."), v)
    w.opsets[""] = 17
    _, g = w.graph("g")
    x = g.value("x", 1, (1,))
    g.inputs.append(x)
    g.outputs.append(x)
    return w.to_bytes()


@pytest.mark.parametrize(
    "meta",
    [
        {"source__model_version": "fuzz-seed"},
        {"source__model_version": float("nan")},
        {"source__model_version": float("inf")},
        {"source__model_version": [1]},
        {"source__metadata_props": [1, 2]},
        {"source__metadata_props": "ab"},
    ],
    ids=["version-str", "version-nan", "version-inf", "version-list", "props-list", "props-str"],
)
def test_get_modelmeta_on_mistyped_metadata(meta):
    sess = minirt.Session(_with_metadata(**meta))
    try:
        sess.get_modelmeta()
    except minirt.Error:
        pass


def test_path_through_a_file_is_a_minirt_error(tmp_path):
    f = tmp_path / "model.mrt"
    f.write_bytes(_tiny())
    try:
        minirt.Session(str(f / "inner.mrt"))
    except minirt.Error:
        pass


def _absent_output_artifact() -> bytes:
    """y = Identity(x); then Neg(x) with its only output absent (-1)."""
    w = ArtifactWriter()
    w.opsets[""] = 17
    ident = w.operator("", "Identity", 17)
    neg = w.operator("", "Neg", 17)
    _, g = w.graph("g")
    x = g.value("x", 1, (2,))
    g.inputs.append(x)
    y = g.value("y", 1, (2,))
    g.add_node("copy", ident, [x], [y], [])
    g.add_node("dropped", neg, [x], [-1], [])
    g.outputs.append(y)
    return w.to_bytes()


def test_absent_single_output_does_not_clobber_the_last_value():
    sess = minirt.Session(_absent_output_artifact())
    x = np.array([1.0, 2.0], np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, x)


def test_absent_required_input_is_an_error():
    w = ArtifactWriter()
    w.opsets[""] = 17
    ident = w.operator("", "Identity", 17)
    _, g = w.graph("g")
    x = g.value("x", 1, (2,))
    g.inputs.append(x)
    y = g.value("y", 1, (2,))
    g.add_node("copy", ident, [-1], [y], [])
    g.outputs.append(y)
    # Refused when the plan is compiled, naming the node: never a run that "succeeds".
    with pytest.raises(minirt.UnsupportedOperator, match="node 'copy' \\(Identity\\).*first 1 input"):
        minirt.Session(w.to_bytes())


def _nested_if(depth: int, shared: bool) -> bytes:
    """Graph k (k < depth) holds an If whose then-branch is graph k+1.

    ``shared``: the else-branch is graph k+1 as well (the reader accepts such a
    DAG today); otherwise it is a leaf graph of its own, so the graphs form a tree.
    """
    w = ArtifactWriter()
    w.opsets[""] = 17
    if_op = w.operator("", "If", 17)
    ident = w.operator("", "Identity", 17)
    n_graphs = depth + 1 if shared else 2 * depth + 1
    for k in range(n_graphs):
        _, g = w.graph(f"g{k}")
        c = g.value("c", 9, ())
        x = g.value("x", 1, (1,))
        (g.inputs if k == 0 else g.captures).extend([c, x])
        o = g.value(f"o{k}", 1, (1,))
        if k < depth:
            other = k + 1 if shared else depth + 1 + k
            g.add_node(f"if{k}", if_op, [c], [o], [("then_branch", S.ATTR_GRAPH, k + 1), ("else_branch", S.ATTR_GRAPH, other)])
        else:
            g.add_node("leaf", ident, [x], [o], [])
        g.outputs.append(o)
    return w.to_bytes()


def _load_and_run_nested(depth: int, timeout: float, shared: bool = False) -> tuple[str, dict | None]:
    data = _nested_if(depth, shared)

    def run():
        sess = minirt.Session(data)
        return sess.run(None, {"c": np.array(True), "x": np.ones(1, np.float32)})

    import tests.fuzz.fuzz_artifacts as fa

    orig = fa.exercise
    try:
        fa.exercise = lambda *a, **k: (run(), "ran")[1]
        return run_checked(data, random.Random(0), timeout)
    finally:
        fa.exercise = orig


@pytest.mark.parametrize("depth", [1, 4, 12])
def test_nested_if_within_limits_runs(depth):
    outcome, finding = _load_and_run_nested(depth, 10.0)
    assert outcome == "ran", finding and finding["traceback"]


def test_deeply_nested_subgraphs_are_a_minirt_error():
    outcome, finding = _load_and_run_nested(600, 10.0)
    assert finding is None, finding["traceback"][-600:]


def test_subgraph_shared_by_many_attributes_does_not_hang():
    t0 = time.monotonic()
    outcome, finding = _load_and_run_nested(40, 3.0, shared=True)
    assert finding is None and time.monotonic() - t0 < 3.0, outcome
