"""The runtime needs numpy and nothing else: loading and running an artifact imports no builder/ONNX code.

Also the layering of the desktop side: ``targets/`` (the provider lowerings)
imports only the public modules of ``builder/``, never a private one.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from minirt import builder

# (the builder and the target lowerings are installed as minirt.builder / minirt.targets; the bare
# folder names are listed too, for a checkout run from its root)
FORBIDDEN = ("onnx", "onnxruntime", "coremltools", "onnx_ir", "minirt.builder", "minirt.targets", "builder", "targets",
             "torch", "tflite_runtime")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = textwrap.dedent(
    """
    import sys
    before = set(sys.modules)  # interpreter start-up (site, .pth hooks), not the runtime's doing
    import json, os, sysconfig
    import minirt
    import numpy as np

    sess = minirt.InferenceSession(sys.argv[1])
    (y,) = sess.run(None, {"x": np.array([[-1.0, 2.0, 3.0]], np.float32)})

    def site_root(path):
        for key in ("purelib", "platlib"):
            root = sysconfig.get_paths()[key]
            if path.startswith(root + os.sep):
                return path[len(root) + 1 :].split(os.sep)[0]
        return None

    third_party = set()
    for name, mod in list(sys.modules.items()):
        if name in before:
            continue
        path = getattr(mod, "__file__", None) or ""
        top = site_root(os.path.realpath(path)) if path else None
        if top is not None:
            third_party.add(name.split(".")[0])
    print(json.dumps({
        "y": y.tolist(),
        "modules": sorted(sys.modules),
        "new_modules": sorted(set(sys.modules) - before),
        "third_party": sorted(third_party),
        "minirt_file": minirt.__file__,
    }))
    """
)


@pytest.fixture(scope="module")
def child_report(tmp_path_factory):
    b = nh.from_array(np.array([1.0, -2.0, 0.5], np.float32), "b")
    model = h.make_model(
        h.make_graph(
            [h.make_node("Add", ["x", "b"], ["s"]), h.make_node("Relu", ["s"], ["y"])],
            "g",
            [h.make_tensor_value_info("x", TP.FLOAT, ["N", 3])],
            [h.make_tensor_value_info("y", TP.FLOAT, ["N", 3])],
            [b],
        ),
        opset_imports=[h.make_opsetid("", 17)],
    )
    path = tmp_path_factory.mktemp("imports") / "m.mrt"
    builder.build(model, path)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_runs_in_subprocess(child_report):
    assert child_report["y"] == [[0.0, 0.0, 3.5]]


@pytest.mark.parametrize("name", FORBIDDEN)
def test_forbidden_module_not_imported(child_report, name):
    mods = child_report["modules"]
    assert not [m for m in mods if m == name or m.startswith(name + ".")], f"the runtime imported {name}"


def test_only_numpy_from_site_packages(child_report):
    # minirt itself may be installed into site-packages (non-editable installs); it is ours, not a dependency.
    third = set(child_report["third_party"]) - {"minirt"}
    # _cffi_backend (from the cffi package) is the loader of the optional native
    # kernels; it is imported only when they were compiled (docs/decisions.md D7).
    allowed = {"numpy", "_cffi_backend"}
    assert third <= allowed, f"third-party modules imported by the runtime: {sorted(third - allowed)}"
    assert "numpy" in child_report["third_party"]
    assert "minirt.session" in child_report["new_modules"]


def test_only_numpy_and_stdlib_overall(child_report):
    stdlib = set(getattr(sys, "stdlib_module_names", ()))
    if not stdlib:
        pytest.skip("needs Python 3.10+ for sys.stdlib_module_names")
    tops = {m.split(".")[0] for m in child_report["new_modules"]}
    other = {t for t in tops if t not in stdlib and t not in ("minirt", "numpy") and not t.startswith("_")}
    assert not other, f"modules that are neither stdlib, numpy nor minirt: {sorted(other)}"


def _builder_imports(path: str):
    """(line, module) of every import of a ``builder`` module in the file at ``path``."""
    tree = ast.parse(open(path, encoding="utf-8").read(), filename=path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
            for alias in node.names:  # ``from builder import _private`` names a module too
                yield node.lineno, f"{node.module}.{alias.name}"


def test_targets_import_no_private_builder_module():
    offences = []
    for folder, _, files in os.walk(os.path.join(ROOT, "targets")):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            for line, module in _builder_imports(path):
                parts = module.split(".")
                if parts[:2] == ["minirt", "builder"] and any(p.startswith("_") for p in parts[2:]):
                    offences.append(f"{os.path.relpath(path, ROOT)}:{line} imports {module}")
    assert not offences, "targets/ imports private builder modules:\n" + "\n".join(offences)
