"""ai.onnx.preview.training optimizer kernels against the onnx reference evaluator
(onnxruntime's CPU build has no kernels for this domain)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

from minirt.kernels import lookup
from tests.kernels import reference as ref_mod
from tests.kernels.test_elementwise import assert_same

TRAINING = "ai.onnx.preview.training"
RNG = np.random.default_rng(9)


def opt_check(op, inputs, attrs, n_outputs):
    model = ref_mod.single_node_model(op, inputs, attrs, n_outputs, 1, domain=TRAINING)
    model.opset_import.append(helper.make_opsetid("", 19))
    expected = ReferenceEvaluator(model).run(None, {f"in{i}": x for i, x in enumerate(inputs)})
    actual = lookup(TRAINING, op, 1).fn(*inputs, **attrs)
    assert len(actual) == n_outputs
    for a, e in zip(actual, expected):
        assert_same(a, np.asarray(e).astype(a.dtype), rtol=1e-5, atol=1e-6)


def _tensors(n_state, shapes):
    groups = [[RNG.uniform(-1, 1, s).astype(np.float32) for s in shapes] for _ in range(2 + n_state)]
    for st in groups[2:]:
        for i, a in enumerate(st):
            st[i] = np.abs(a)  # accumulated squares are non-negative
    return [x for g in groups for x in g]


R = np.array(0.1, np.float32)


@pytest.mark.parametrize("t", [0, 3])
@pytest.mark.parametrize("shapes", [[(3,)], [(2,), (2, 3)]])
def test_adagrad(t, shapes):
    inputs = [R, np.array(t, np.int64)] + _tensors(1, shapes)
    opt_check("Adagrad", inputs, {"decay_factor": 0.1, "epsilon": 1e-5, "norm_coefficient": 0.01}, 2 * len(shapes))


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("t", [0, 2])
@pytest.mark.parametrize("shapes", [[(4,)], [(1,), (2, 2)]])
def test_momentum(mode, t, shapes):
    inputs = [R, np.array(t, np.int64)] + _tensors(1, shapes)
    attrs = {"alpha": 0.9, "beta": 0.5, "mode": mode, "norm_coefficient": 0.01}
    opt_check("Momentum", inputs, attrs, 2 * len(shapes))


@pytest.mark.parametrize("t", [0, 5])
@pytest.mark.parametrize("shapes", [[(3,)], [(2,), (3, 1)]])
def test_adam(t, shapes):
    inputs = [R, np.array(t, np.int64)] + _tensors(2, shapes)
    attrs = {"alpha": 0.9, "beta": 0.99, "epsilon": 1e-6, "norm_coefficient": 0.01, "norm_coefficient_post": 0.02}
    opt_check("Adam", inputs, attrs, 3 * len(shapes))
