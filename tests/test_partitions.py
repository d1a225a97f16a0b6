"""Partitions: provider delegation, CPU fallback, verification of the partition table."""
from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

from minirt import builder
import minirt
from minirt.builder.load import load_model
from minirt.builder.lower import lower_model
from minirt.builder.writer import ArtifactWriter, PartitionRecord
from minirt import providers


class DoublingProvider:
    """Test provider whose 'program' is a float multiplier stored in the blob."""

    name = "doubler"

    def __init__(self, available=True, refuse=False):
        self._available = available
        self._refuse = refuse
        self.calls = 0

    def available(self):
        return (True, "test") if self._available else (False, "no doubler hardware here")

    def compile(self, blob, partition, artifact, options):
        if self._refuse:
            raise RuntimeError("driver rejected the model")
        factor = float(bytes(blob).decode())

        def run(x):
            self.calls += 1
            return (np.maximum(x * factor, 0).astype(np.float32),)

        return run


def _artifact(factor_blob: bytes = b"1.0") -> bytes:
    """y = Relu(x * 1) + 1, with the Mul+Relu run (nodes 0-1) delegated to 'doubler'."""
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "one"], ["m"]),
            helper.make_node("Relu", ["m"], ["r"]),
            helper.make_node("Add", ["r", "one"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        initializer=[one],
    )
    model_ir, _ = load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    w = ArtifactWriter()
    lower_model(model_ir, w)
    g = w.graphs[0]
    x, r = g.value("x"), g.value("r")
    blob = w.add_blob(factor_blob)
    w.partitions.append(PartitionRecord("doubler", 0, 0, 2, [x], [r], blob, {"note": "test"}))
    return w.to_bytes()


@pytest.fixture
def doubler():
    p = DoublingProvider()
    providers.register(p)
    yield p
    providers.unregister("doubler")


def test_partition_is_read_back():
    art = minirt.Session(_artifact(), providers=["cpu"]).artifact
    (part,) = art.partitions
    assert (part.provider, part.first_node, part.node_count, part.options) == ("doubler", 0, 2, {"note": "test"})
    assert bytes(art.provider_blob(part.blob)) == b"1.0"


def test_available_provider_runs_the_partition(doubler):
    x = np.array([[-1, 2, -3, 4]], np.float32)
    sess = minirt.Session(_artifact(b"2.0"), providers=["doubler", "cpu"])
    (y,) = sess.run(None, {"x": x})
    # The provider's program (x*2) ran instead of the CPU version (x*1).
    np.testing.assert_array_equal(y, np.maximum(x * 2, 0) + 1)
    assert doubler.calls == 1
    assert sess.get_partitions()[0]["runs_on"] == "doubler"


def test_cpu_version_runs_when_provider_not_listed(doubler, caplog):
    x = np.array([[-1, 2, -3, 4]], np.float32)
    with caplog.at_level(logging.INFO, logger="minirt"):
        sess = minirt.Session(_artifact(b"2.0"), providers=["cpu"])
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, np.maximum(x, 0) + 1)
    assert doubler.calls == 0
    assert "runs on the CPU" in caplog.text and "not in the session's providers" in caplog.text


@pytest.mark.parametrize(
    "provider, reason",
    [(DoublingProvider(available=False), "not available here"), (DoublingProvider(refuse=True), "refused the program")],
)
def test_fallback_to_cpu_with_one_log_line(provider, reason, caplog):
    providers.register(provider)
    try:
        with caplog.at_level(logging.INFO, logger="minirt"), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sess = minirt.Session(_artifact(b"2.0"), providers=["doubler", "cpu"])
        # an unavailable provider is skipped with onnxruntime's warning; one that refuses is not warned about
        warned = [str(w.message) for w in caught if "doubler" in str(w.message)]
        if reason == "not available here":
            assert len(warned) == 1 and warned[0].startswith(
                "Specified provider 'doubler' is not available on this device (no doubler hardware here); skipped.")
        else:
            assert warned == []
        x = np.ones((2, 4), np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x + 1)
        lines = [r for r in caplog.records if "partition 0" in r.getMessage()]
        assert len(lines) == 1 and reason in lines[0].getMessage()
        assert sess.get_partitions()[0]["runs_on"] == "cpu"
    finally:
        providers.unregister("doubler")


def test_unknown_provider_name_warns_and_is_skipped():
    with pytest.warns(UserWarning, match="Specified provider 'tpu' is not a provider minirt knows"):
        assert minirt.Session(_artifact(), providers=["tpu"]).get_providers() == ["CPUExecutionProvider"]


def test_available_providers_end_with_cpu():
    names = minirt.get_available_providers()
    assert names[-1] == "CPUExecutionProvider"


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda p: setattr(p, "node_count", 5), "covers nodes"),
        (lambda p: setattr(p, "outputs", (0,)), "is not produced by its nodes"),
        (lambda p: setattr(p, "blob", 3), "provider blob index 3 is out of range"),
        (lambda p: setattr(p, "golden_inputs", (0, 0)), "golden tensors do not match"),
    ],
)
def test_verifier_rejects_bad_partitions(mutate, message):
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        initializer=[one],
    )
    model_ir, _ = load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    w = ArtifactWriter()
    lower_model(model_ir, w)
    g = w.graphs[0]
    part = PartitionRecord("doubler", 0, 0, 1, [g.value("x")], [g.value("y")], w.add_blob(b"1"))
    mutate(part)
    w.partitions.append(part)
    with pytest.raises(minirt.FormatError, match=message):
        minirt.Session(w.to_bytes())


def test_builder_artifacts_have_no_partitions_by_default(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    data = builder.build_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert minirt.Session(data).artifact.partitions == ()
