"""Tests for initializer_dedup: equal data shares one initializer; different data or dtype does not."""
import numpy as np
from onnx import helper as h

from minirt.builder.passes import testing as T
from minirt.builder.passes.initializer_dedup import InitializerDeduplication


def _m(a, b):
    nodes = [h.make_node("Add", ["x", "a"], ["t"]), h.make_node("Mul", ["t", "b"], ["y"])]
    return T.make_model(nodes, [T.vinfo("x", [3])], [T.vinfo("y", [3])], [T.tensor("a", a), T.tensor("b", b)])


def test_shares_equal_initializers():
    m = T.load(_m(np.arange(3, dtype=np.float32), np.arange(3, dtype=np.float32)))
    assert InitializerDeduplication()(m).modified
    assert len(m.graph.initializers) == 1
    T.run_both(_m(np.arange(3, dtype=np.float32), np.arange(3, dtype=np.float32)), {"x": np.ones(3, np.float32)}, opt_level=1)


def test_different_data_kept():
    m = T.load(_m(np.arange(3, dtype=np.float32), np.arange(1, 4, dtype=np.float32)))
    assert not InitializerDeduplication()(m).modified
    assert len(m.graph.initializers) == 2
