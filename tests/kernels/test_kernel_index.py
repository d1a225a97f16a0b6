"""The generated kernel index (minirt/kernels/_index.py) and lazy family imports."""
from __future__ import annotations

import json
import subprocess
import sys

from minirt.kernels import _index


def test_index_matches_the_registry():
    fresh = _index.compute()  # a full alphabetical import of every family, in a fresh process
    if fresh != _index.INDEX:
        missing = sorted(set(fresh) - set(_index.INDEX))
        extra = sorted(set(_index.INDEX) - set(fresh))
        changed = sorted(k for k in set(fresh) & set(_index.INDEX) if fresh[k] != _index.INDEX[k])
        raise AssertionError(
            f"minirt/kernels/_index.py is stale: missing {missing[:10]}, extra {extra[:10]}, changed {changed[:10]}. "
            "Regenerate it with: python -m minirt.kernels._index"
        )


def test_lazy_lookup_registers_the_same_kernels():
    # Every key looked up on its own in a fresh process resolves to the same
    # functions as the eager import, whatever order the families load in.
    code = (
        "import json, random\n"
        "from minirt.kernels import registry\n"
        "from minirt.kernels._index import INDEX\n"
        "keys = sorted(INDEX); random.Random(0).shuffle(keys)\n"
        "out = {}\n"
        "for d, op in keys:\n"
        "    e = registry.lookup(d, op, 10**6)\n"
        "    out[json.dumps([d, op])] = None if e is None else [e.fn.__module__, e.fn.__qualname__, e.since]\n"
        "print(json.dumps(out))\n"
    )

    def run(env_index):
        env = {"MINIRT_KERNEL_INDEX": env_index}
        import os

        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={**os.environ, **env})
        return json.loads(proc.stdout.strip().splitlines()[-1])

    lazy, eager = run("1"), run("0")
    assert lazy == eager
    assert all(v is not None for v in lazy.values())


def test_import_loads_no_kernel_family():
    code = (
        "import sys, minirt\n"
        "fams = sorted(m for m in sys.modules if m.startswith('minirt.kernels.') and not m.split('.')[-1].startswith('_')"
        " and m != 'minirt.kernels.registry')\n"
        "print(','.join(fams))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == ""
