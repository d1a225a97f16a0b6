"""Every op, activation and provider registry agrees with the one table in ``minirt/vocabulary.py``.

A registry that must equal the vocabulary is compared for equality; one that legitimately covers
less (the activations a lowering handles, the ops a pass walks through) is checked to be a subset
of the family it draws from.  The docs' tables count as registries too (docs/fused_ops.md,
docs/format.md), as do the strings the lowerings compare an activation against.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper as h

from minirt import builder  # noqa: F401  (first: importing targets.* before builder meets an import cycle of theirs)
from minirt import vocabulary as V

ROOT = Path(__file__).resolve().parents[1]


def _import(spec: str):
    """The object a ``"module:Attr"`` string names."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


# --- fused activations ------------------------------------------------------------------------


def test_activation_table_shape():
    assert "" in V.ACTIVATIONS and V.ACTIVATIONS[""].params == 0  # "" is "no activation"
    for name, a in V.ACTIVATIONS.items():
        assert a.name == name
        assert a.onnx_op is None or a.onnx_op in V.ACTIVATION_OPS, name
    assert V.FUSABLE_ACTIVATION_OPS <= V.ACTIVATION_OPS
    assert V.NATIVE_ACTIVATIONS == {n for n, a in V.ACTIVATIONS.items() if a.native}


def test_fused_kernels_compute_exactly_the_vocabulary_activations():
    from minirt.kernels import fused

    assert set(fused._FUNCTIONS) == set(V.ACTIVATIONS)
    assert {n: p for n, (p, _fn) in fused.ACTIVATIONS.items()} == {n: a.params for n, a in V.ACTIVATIONS.items()}
    for name, fn in fused._FUNCTIONS.items():
        positional = [p for p in inspect.signature(fn).parameters.values() if p.default is p.empty]
        assert len(positional) - 1 == V.ACTIVATIONS[name].params, f"{name}: fn takes x and {len(positional) - 1} params"


def _header_activation_codes() -> dict[str, int]:
    text = (ROOT / "minirt" / "native" / "kernels.h").read_text()
    # the members of the ``mrt_act`` enum (``MRT_ACT_RELU = 1,``), as cffi reads them
    enum = re.search(r"typedef\s+enum\s*{(.*?)}\s*mrt_act\s*;", text, re.S)
    assert enum is not None, "kernels.h declares no 'typedef enum { ... } mrt_act;'"
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"(MRT_ACT_\w+)\s*=\s*(\d+)", enum.group(1))}


def test_native_activation_members_exist_in_kernels_h():
    codes = _header_activation_codes()
    native = {a.native for a in V.ACTIVATIONS.values() if a.native is not None}
    assert native == set(codes), "kernels.h's MRT_ACT_* and the vocabulary's native members differ"
    assert len(set(codes.values())) == len(codes)


def test_native_epilogue_table_matches_vocabulary():
    from minirt.kernels import nn

    codes = _header_activation_codes()
    table = nn._NATIVE_ACTIVATIONS
    assert set(table) == set(V.NATIVE_ACTIVATIONS)
    for name, spec in table.items():
        code, params = (spec[0], spec[1]) if isinstance(spec, tuple) else (spec, V.ACTIVATIONS[name].params)
        assert params == V.ACTIVATIONS[name].params, name
        assert int(code) == codes[V.ACTIVATIONS[name].native], f"{name}: code {code} is not kernels.h's"


def test_fused_ops_doc_table_matches_vocabulary():
    text = (ROOT / "docs" / "fused_ops.md").read_text()
    section = text.split("## Activations", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\|\s*`([^`]*)`\s*\|[^|]*\|\s*([^|]*?)\s*\|\s*$", section, re.M)
    documented = {("" if name == '""' else name): (0 if params in ("—", "-", "") else len(params.split(",")))
                  for name, params in rows if name != "activation"}  # (the header row)
    assert documented == {n: a.params for n, a in V.ACTIVATIONS.items()}


def test_coreml_lowers_every_activation_it_claims():
    from minirt.targets.coreml import rules

    assert rules.ACTIVATIONS <= set(V.ACTIVATIONS)

    class FakeMIL:  # records the MIL ops apply_activation asks for
        def __getattr__(self, op):
            return lambda **kwargs: (op, kwargs)

    for name in rules.ACTIVATIONS:
        rules.apply_activation(FakeMIL(), "x", name, [0.5] * V.ACTIVATIONS[name].params, "n")  # raises if missing


# where a module's functions return an activation name inside a tuple
RETURNED_AT = {"recognise_activations.py": 1, "fuse_activation.py": 0}


def _activation_strings(path: Path) -> set[str]:
    """String constants an activation variable is compared with or set to in ``path``, or returned."""
    names = {"act", "activation"}
    found = set()

    def strings(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, ast.IfExp):
            return strings(node.body) | strings(node.orelse)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return set().union(*(strings(e) for e in node.elts if not isinstance(e, (ast.Tuple, ast.List))))
        return set()

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id in names:
            for c in node.comparators:
                found |= strings(c)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names for t in node.targets):
            found |= strings(node.value)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and node.args[0].value == "activation" and len(node.args) > 1:
            found |= strings(node.args[1])  # ir.AttrString("activation", "SiLU")
        elif isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple) and path.name in RETURNED_AT \
                and len(node.value.elts) > RETURNED_AT[path.name]:
            found |= strings(node.value.elts[RETURNED_AT[path.name]])  # (x, "HardSwish", last, nodes)
    return found


# files that name fused activations, and one name each must mention (so the scan cannot go blind)
ACTIVATION_READERS = {
    "targets/coreml/rules.py": "GeluTanh",
    "targets/nnapi/emitter.py": "HardSwish",
    "targets/flops.py": "LeakyRelu",
    "builder/passes/fuse_activation.py": "GeluTanh",
    "builder/passes/recognise_activations.py": "SiLU",
}


@pytest.mark.parametrize("path", sorted(ACTIVATION_READERS))
def test_every_activation_name_a_lowering_or_pass_uses_is_in_the_vocabulary(path):
    found = _activation_strings(ROOT / path) - {"none", "tanh"}  # Gelu's ``approximate`` values, not activations
    assert ACTIVATION_READERS[path] in found, f"the scan of {path} found {sorted(found)}"
    assert found <= set(V.ACTIVATIONS), f"{path} names activations the vocabulary lacks: {sorted(found - set(V.ACTIVATIONS))}"


def _activation_model():
    """One node per ONNX activation op (both Gelu forms), reading x; Clip's bounds are constants."""
    from minirt.builder.passes import testing as T

    nodes = []
    for i, op in enumerate(sorted(V.ACTIVATION_OPS)):
        ins = ["x", "slope"] if op == "PRelu" else ["x", "lo", "hi"] if op == "Clip" else ["x"]
        nodes.append(h.make_node(op, ins, [f"y{i}"]))
    nodes.append(h.make_node("Gelu", ["x"], ["gt"], approximate="tanh"))
    outs = [T.vinfo(n.output[0], [2, 3]) for n in nodes]
    inits = [T.tensor("slope", np.full((3,), 0.1, np.float32)), T.tensor("lo", np.float32(0)),
             T.tensor("hi", np.float32(6))]
    return T.load(T.make_model(nodes, [T.vinfo("x", [2, 3])], outs, inits, opset=20))


def test_fuse_activation_folds_exactly_the_fusable_ops():
    from minirt.builder.passes.fuse_activation import activation_of

    model = _activation_model()
    folded = {}
    for node in model.graph:
        got = activation_of(model, node)
        if node.op_type not in V.FUSABLE_ACTIVATION_OPS:
            assert got is None, f"fuse_activation folds {node.op_type}, which FUSABLE_ACTIVATION_OPS lacks"
            continue
        assert got is not None and got[0] is not None, f"fuse_activation does not fold {node.op_type}"
        name, params = got
        assert name in V.ACTIVATIONS and V.ACTIVATIONS[name].onnx_op == node.op_type, (node.op_type, name)
        assert len(params) == V.ACTIVATIONS[name].params, (name, params)
        folded[name] = node.op_type
    assert set(folded) == {n for n, a in V.ACTIVATIONS.items() if a.onnx_op is not None}


def test_rnn_gate_activations_match_vocabulary():
    from minirt.kernels import rnn

    want = {n.lower() for n in V.RNN_ACTIVATIONS}
    assert set(rnn._FUNCTIONS) == want
    assert set(rnn._ACTIVATIONS) == want


# --- op families ------------------------------------------------------------------------------


def test_runtime_has_a_kernel_for_every_op_of_every_family():
    from minirt.kernels._index import INDEX

    for family, ops in V.FAMILIES.items():
        missing = sorted(op for op in ops if ("", op) not in INDEX)
        assert not missing, f"{family}: no kernel for {missing}"
    ours = set(V.FUSED_FORMS.values()) | {"Activation"}
    assert not sorted(op for op in ours if (V.MINIRT_DOMAIN, op) not in INDEX)
    assert all(("", op) in INDEX for op in V.FUSED_FORMS)


def test_families_nest():
    assert V.ARITHMETIC <= V.BINARY_MATH <= V.ELEMENTWISE
    for family in (V.COMPARISON, V.LOGICAL, V.UNARY_MATH, V.ACTIVATION_OPS):
        assert family <= V.ELEMENTWISE


def test_random_family_is_the_runtime_randomness_kernels():
    from minirt.kernels._index import INDEX

    assert V.RANDOM == {op for (domain, op), modules in INDEX.items() if "randomness" in modules and domain == ""}


def test_builder_passes_read_the_families():
    from minirt.builder import ir_helpers as irh
    from minirt.builder import prepack
    from minirt.builder.passes import constant_folding, cse, fuse_activation, recognise_attention
    from minirt.builder.quantize import bias_correction

    assert cse._NONDETERMINISTIC == V.RANDOM
    assert constant_folding._NEVER_FOLD == V.RANDOM | {"Constant"}
    assert fuse_activation._FUSED == V.FUSED_FORMS
    assert set(fuse_activation._SIMPLE) <= V.FUSABLE_ACTIVATION_OPS
    # a subset: the ops through which the attention pattern follows a rank
    assert recognise_attention._ELEMENTWISE <= V.ELEMENTWISE | V.SOFTMAX | {"Identity"}
    assert irh.MINIRT_DOMAIN == V.MINIRT_DOMAIN
    for op, keys in (("Conv", prepack._CONV_OPS), ("MatMul", prepack._MATMUL_OPS), ("Gemm", prepack._GEMM_OPS),
                     ("Conv", bias_correction._CONV), ("Gemm", bias_correction._GEMM)):
        assert set(keys) == {("", op), (V.MINIRT_DOMAIN, V.FUSED_FORMS[op])}


def test_runtime_registries_read_the_families():
    from minirt import native
    from minirt.kernels import elementwise, fused, qlinear
    from minirt.native import program

    assert set(native.BINARY_OPS) == V.ARITHMETIC
    assert set(elementwise._BINARY_UFUNC) == V.ARITHMETIC
    assert program.VIEW_OPS == V.RESHAPES | {"Identity"}
    assert fused.DOMAIN == qlinear.DOMAIN == V.MINIRT_DOMAIN


def test_target_op_sets_are_vocabulary_families_or_subsets():
    from minirt.targets import flops
    from minirt.targets.coreml import rules
    from minirt.targets.nnapi import shapes

    # FLOPs: every elementwise op gets a cost; the cost classes draw from the families
    assert V.ELEMENTWISE <= flops._ELEMENTWISE_1 | flops._ELEMENTWISE_4
    assert flops._ELEMENTWISE_4 - {"Activation"} <= V.ELEMENTWISE
    assert flops._ELEMENTWISE_1 <= V.ELEMENTWISE | V.NORMALIZATION
    assert flops._NORM <= V.SOFTMAX | V.NORMALIZATION and flops._REDUCE == V.REDUCE
    # Core ML: what it lowers, a subset of each family
    assert set(rules._BINARY) <= V.BINARY_MATH
    assert set(rules._UNARY) <= V.UNARY_MATH | V.ACTIVATION_OPS | {"Identity"}
    assert set(rules._REDUCE) <= V.REDUCE
    assert all(("", op) in rules.RULES for op in V.RESHAPES)
    assert rules.MINIRT == V.MINIRT_DOMAIN
    # NNAPI shape inference: the same-shape ops and the broadcasting ones it handles
    one_input = V.UNARY_MATH | V.ACTIVATION_OPS | V.SOFTMAX | V.NORMALIZATION
    assert shapes._SAME_SHAPE <= one_input | {"Identity", "Dropout", "QuantizeLinear", "DequantizeLinear", "Activation"}
    assert shapes._BINARY <= V.BINARY_MATH


# --- providers --------------------------------------------------------------------------------


def test_provider_table_shape():
    assert V.CPU in V.PROVIDERS and V.ACCELERATORS == tuple(n for n in V.PROVIDERS if n != V.CPU)
    assert [n for n, p in V.PROVIDERS.items() if p.always_available] == [V.CPU]
    for name, p in V.PROVIDERS.items():
        assert p.name == name and name == name.lower()
        assert (p.runtime is None) == (p.spec is None) == (name == V.CPU)


def test_runtime_provider_registry_matches_table():
    from minirt import providers

    assert providers.CPU == V.CPU
    assert providers._PROVIDER_CLASSES == {n: p.runtime for n, p in V.PROVIDERS.items() if p.runtime}
    assert set(providers.known_providers()) == set(V.PROVIDERS)
    for name, p in V.PROVIDERS.items():
        if p.runtime:
            assert _import(p.runtime).name == name
        if p.ort_name:
            assert providers.canonical_name(p.ort_name) == name
            assert providers.canonical_name(p.ort_name.upper()) == name
    assert set(providers._ALIASES.values()) == {n for n, p in V.PROVIDERS.items() if p.ort_name}
    assert providers.availability(V.CPU)[0]


def test_builder_provider_registries_match_table():
    from minirt.builder import coverage, partition
    from minirt.targets import providers as tp

    build = importlib.import_module("builder.build")
    assert tp.SPEC_CLASSES == {n: p.spec for n, p in V.PROVIDERS.items() if p.spec}
    for name, p in V.PROVIDERS.items():
        if p.spec:
            assert _import(p.spec).name == name
    assert set(build._BUILD_PROVIDERS) == set(V.PROVIDERS) and build._BUILD_PROVIDERS[-1] == V.CPU
    assert partition.CPU == V.CPU
    assert set(coverage._PROVIDER_OPS) == set(V.ACCELERATORS)


def test_target_profiles_name_only_table_providers():
    from minirt.targets import profiles

    for name in profiles.target_names():
        prof = profiles.get_target(name)
        assert set(prof.providers) <= set(V.PROVIDERS), name
        assert prof.providers[-1] == V.CPU, f"{name}: the CPU must come last"
        assert set(prof.provider_info) <= set(V.ACCELERATORS), name


def test_graph_render_colours_every_table_provider():
    from minirt.tools import graph_render

    assert set(graph_render.COLOURS) == set(V.PROVIDERS)


def test_cli_and_format_doc_name_the_table_providers():
    from minirt import cli

    parser = cli.build_parser()
    build = next(a for a in parser._subparsers._group_actions if a.choices).choices["build"]
    help_text = next(a.help for a in build._actions if "--providers" in a.option_strings)
    listed = re.search(r"names: ([^)]*)\)", help_text).group(1)
    assert [n.strip() for n in listed.split(",")] == [*V.ACCELERATORS, V.CPU]

    line = next(ln for ln in (ROOT / "docs" / "format.md").read_text().splitlines() if "provider: str" in ln)
    assert re.findall(r'"(\w+)"', line) == list(V.ACCELERATORS)


@pytest.mark.parametrize("name", [n for n in V.PROVIDERS if n != V.CPU])
def test_provider_is_unavailable_without_its_required_packages(name, monkeypatch):
    """With every module of ``requires`` missing, the provider says it is unavailable and names one."""
    from minirt import providers

    required = V.PROVIDERS[name].requires
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda mod, *a, **k: None if mod.split(".")[0] in required else real_find_spec(mod, *a, **k))
    for mod in required:
        monkeypatch.setitem(sys.modules, mod, None)  # ``import mod`` raises ImportError
    monkeypatch.setattr(sys, "platform", "darwin")  # past Core ML's OS check, to its package check
    ok, why = providers.availability(name)
    assert not ok
    assert any(mod in why.replace("-", "_") for mod in required), f"{name}: {why!r} names none of {required}"


def test_tflite_interpreter_modules_are_the_table_requirements():
    from minirt.providers import tflite

    assert {m.split(".")[0] for m in tflite._MODULES} == set(V.PROVIDERS["tflite"].requires)
