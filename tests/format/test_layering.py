"""The format package is the runtime's lowest layer: it imports nothing from the tools or the builder.

``minirt/format`` is what a device loads an artifact with; ``minirt/tools`` holds the command-line
helpers and ``builder`` the desktop side.  An import the other way (the reader once took the key-file
loader from ``minirt/tools``) ties the runtime to code it does not need.
"""
from __future__ import annotations

import ast
from pathlib import Path

FORMAT_DIR = Path(__file__).resolve().parents[2] / "minirt" / "format"
FORBIDDEN = ("minirt.tools", "minirt.cli", "minirt.session", "minirt.builder", "minirt.targets", "builder", "targets")


def _imported_modules(path: Path) -> set[str]:
    """Every module an ``import`` / ``from ... import`` in ``path`` names, at any depth (lazy imports too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_format_package_imports_no_tool_or_builder_module():
    offenders = {}
    for path in sorted(FORMAT_DIR.glob("*.py")):
        bad = sorted(m for m in _imported_modules(path) if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
        if bad:
            offenders[path.name] = bad
    assert not offenders, f"minirt/format imports from higher layers: {offenders}"
