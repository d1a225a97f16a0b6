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
