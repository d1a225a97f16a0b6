"""Cold start (docs/decisions.md D57): what ``import minirt`` pays for in a fresh process.

A fresh interpreter imports numpy first (every user of minirt does), then minirt; the modules minirt
adds are what its import costs.  Those that only some paths need stay out of it."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy
    before = set(sys.modules)
    import minirt
    print(json.dumps(sorted(set(sys.modules) - before)))
    """
)

# Modules `import minirt` must not import: dataclasses (and copy, which it imports) cost ~0.5 ms per
# class defined; the kernel families load per operator a model uses (minirt/kernels/_index.py); the
# rest serve only some sessions (signatures, providers, the CLI, the tools).
NOT_AT_IMPORT = (
    "dataclasses",
    "copy",
    "inspect",
    "ctypes",
    "minirt.kernels.nn",
    "minirt.kernels.tensor",
    "minirt.kernels.elementwise",
    "minirt.kernels._index",
    "minirt.format.signature",
    "minirt.format.ed25519",
    "minirt.providers.coreml",
    "minirt.providers.tflite",
    "minirt.providers.nnapi",
    "minirt.cli",
    "minirt.tools",
    "minirt.builder",
    "minirt.targets",
)


def test_import_minirt_imports_only_what_every_session_needs():
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    added = set(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert "minirt.session" in added
    # (a module numpy itself imported is not in `added`: the check is about minirt's own imports)
    loaded = sorted(m for m in added if any(m == name or m.startswith(name + ".") for name in NOT_AT_IMPORT))
    assert not loaded, f"import minirt imported {loaded}"


SESSION_CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    before = set(sys.modules)  # (numpy itself imports inspect, for one)
    import minirt
    sess = minirt.Session(sys.argv[1])
    sess.run(None, {"x": np.ones((1, 3, 8, 8), np.float32)})
    print(sorted(m for m in ("json", "inspect", "zlib", "dataclasses") if m in sys.modules and m not in before))
    """
)


def test_a_cpu_session_reads_no_json_and_inspects_no_signature(tmp_path):
    # json (~1.2 ms) was a tenth of a small model's cold start (D165): the session of a plain CPU artifact
    # decodes no JSON metadata (target.providers is a list of names, read without json); its kernels'
    # parameters are read from their code objects, not with inspect (which numpy imports, but not all do).
    import numpy as np
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx import numpy_helper as nh

    from minirt import builder

    rng = np.random.default_rng(0)
    w = nh.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    g = nh.from_array(rng.standard_normal((4, 2)).astype(np.float32), "g")
    graph = h.make_graph(
        [h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["r"]),
         h.make_node("GlobalAveragePool", ["r"], ["p"]), h.make_node("Flatten", ["p"], ["f"]),
         h.make_node("Gemm", ["f", "g"], ["y"])],
        "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 8, 8])], [h.make_tensor_value_info("y", TP.FLOAT, [1, 2])],
        [w, g])
    path = tmp_path / "m.mrt"
    builder.build(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), path)
    proc = subprocess.run([sys.executable, "-c", SESSION_CHILD, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
