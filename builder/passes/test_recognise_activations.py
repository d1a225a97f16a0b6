"""Tests for recognise_activations: decomposed HardSwish/SiLU/Gelu become one Activation."""
import math

import numpy as np
from onnx import helper as h

from minirt.builder.passes import testing as T
from minirt.builder.passes.recognise_activations import RecogniseActivations

R = np.random.default_rng(5)
X = {"x": (R.standard_normal((2, 8)) * 4).astype(np.float32)}
C = [T.tensor("three", np.float32(3)), T.tensor("zero", np.float32(0)), T.tensor("six", np.float32(6)),
     T.tensor("sixth", np.float32(1 / 6)), T.tensor("half", np.float32(0.5)), T.tensor("one", np.float32(1)),
     T.tensor("sqrt2", np.float32(math.sqrt(2))), T.tensor("five", np.float32(5)),
     T.tensor("k3", np.float32(0.044715)), T.tensor("s2pi", np.float32(math.sqrt(2 / math.pi))),
     T.tensor("one111", np.ones((1, 1, 1), np.float32)), T.tensor("k3_off", np.float32(0.05))]


def _m(nodes):
    return T.make_model([h.make_node("Neg", ["x"], ["v"])] + nodes, [T.vinfo("x", [2, 8])], [T.vinfo("y", [2, 8])], C, opset=13)


PATTERNS = {
    "hardswish_div": [h.make_node("Add", ["v", "three"], ["a"]), h.make_node("Clip", ["a", "zero", "six"], ["c"]),
                      h.make_node("Mul", ["v", "c"], ["m"]), h.make_node("Div", ["m", "six"], ["y"])],
    "hardswish_inner_div": [h.make_node("Add", ["three", "v"], ["a"]), h.make_node("Clip", ["a", "zero", "six"], ["c"]),
                            h.make_node("Div", ["c", "six"], ["d"]), h.make_node("Mul", ["d", "v"], ["y"])],
    "hardswish_hsig": [h.make_node("HardSigmoid", ["v"], ["s"], alpha=1 / 6, beta=0.5), h.make_node("Mul", ["v", "s"], ["y"])],
    "silu": [h.make_node("Sigmoid", ["v"], ["s"]), h.make_node("Mul", ["s", "v"], ["y"])],
    "gelu": [h.make_node("Div", ["v", "sqrt2"], ["d"]), h.make_node("Erf", ["d"], ["e"]), h.make_node("Add", ["e", "one"], ["a"]),
             h.make_node("Mul", ["v", "a"], ["m"]), h.make_node("Mul", ["m", "half"], ["y"])],
    "gelu_half_first": [h.make_node("Mul", ["v", "half"], ["hv"]), h.make_node("Div", ["v", "sqrt2"], ["d"]), h.make_node("Erf", ["d"], ["e"]),
                        h.make_node("Add", ["e", "one"], ["a"]), h.make_node("Mul", ["hv", "a"], ["y"])],
    # magika's jax2tf export: 0.044715 * x, then * x twice; the constants' operands first
    "gelu_tanh_jax": [h.make_node("Mul", ["k3", "v"], ["c1"]), h.make_node("Mul", ["v", "c1"], ["c2"]),
                      h.make_node("Mul", ["v", "c2"], ["c3"]), h.make_node("Add", ["v", "c3"], ["i"]),
                      h.make_node("Mul", ["s2pi", "i"], ["u"]), h.make_node("Tanh", ["u"], ["t"]),
                      h.make_node("Add", ["one", "t"], ["a"]), h.make_node("Mul", ["half", "a"], ["g"]),
                      h.make_node("Mul", ["v", "g"], ["y"])],
    # torch's GELU(approximate="tanh") before opset 20: Pow(x, 3), the half applied to x first
    "gelu_tanh_pow": [h.make_node("Mul", ["v", "half"], ["hv"]), h.make_node("Pow", ["v", "three"], ["p"]),
                      h.make_node("Mul", ["p", "k3"], ["c3"]), h.make_node("Add", ["v", "c3"], ["i"]),
                      h.make_node("Mul", ["i", "s2pi"], ["u"]), h.make_node("Tanh", ["u"], ["t"]),
                      h.make_node("Add", ["t", "one"], ["a"]), h.make_node("Mul", ["hv", "a"], ["y"])],
}


def test_patterns_recognised():
    for name, nodes in PATTERNS.items():
        m, _, _ = T.run_both(_m(nodes), X, rtol=1e-5, atol=1e-5)
        assert T.ops(m) == {"Neg": 1, "com.minirt::Activation": 1}, name


def test_near_misses():
    wrong_const = [h.make_node("Add", ["v", "three"], ["a"]), h.make_node("Clip", ["a", "zero", "six"], ["c"]),
                   h.make_node("Mul", ["v", "c"], ["m"]), h.make_node("Div", ["m", "five"], ["y"])]
    other_x = [h.make_node("Sigmoid", ["v"], ["s"]), h.make_node("Mul", ["s", "x"], ["y"])]  # x * sigmoid(-x): not SiLU
    hsig_default = [h.make_node("HardSigmoid", ["v"], ["s"]), h.make_node("Mul", ["v", "s"], ["y"])]  # alpha 0.2: not HardSwish
    def gelu_tanh(k3):
        return [h.make_node("Pow", ["v", "three"], ["p"]), h.make_node("Mul", ["p", k3], ["c3"]),
                h.make_node("Add", ["v", "c3"], ["i"]), h.make_node("Mul", ["i", "s2pi"], ["u"]),
                h.make_node("Tanh", ["u"], ["t"]), h.make_node("Add", ["t", "one"], ["a"]),
                h.make_node("Mul", ["v", "a"], ["m"]), h.make_node("Mul", ["m", "half"], ["y"])]
    # (a cube coefficient that is not 0.044715)
    for nodes in (wrong_const, other_x, hsig_default, gelu_tanh("k3_off")):
        m = T.load(_m(nodes))
        assert not RecogniseActivations()(m).modified
        T.run_both(_m(nodes), X)


def test_gelu_tanh_not_taken_when_a_constant_raises_the_rank():
    nodes = [h.make_node("Pow", ["v", "three"], ["p"]), h.make_node("Mul", ["p", "k3"], ["c3"]),
             h.make_node("Add", ["v", "c3"], ["i"]), h.make_node("Mul", ["i", "s2pi"], ["u"]),
             h.make_node("Tanh", ["u"], ["t"]), h.make_node("Add", ["t", "one111"], ["a"]),
             h.make_node("Mul", ["v", "a"], ["m"]), h.make_node("Mul", ["m", "half"], ["y"])]
    model = T.make_model([h.make_node("Neg", ["x"], ["v"])] + nodes, [T.vinfo("x", [2, 8])], [T.vinfo("y", [1, 2, 8])],
                         C, opset=13)
    m = T.load(model)
    assert not RecogniseActivations()(m).modified
    T.run_both(model, X)
