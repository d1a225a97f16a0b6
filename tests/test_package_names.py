"""The installed import names are unambiguous: one top-level package, ``minirt``.

The folders ``builder/`` and ``targets/`` (the layout of the design card) are installed as
``minirt.builder`` and ``minirt.targets`` (pyproject.toml's ``package-dir``, setup.py's package
list): a generic top-level ``builder`` or ``targets`` would collide with other packages of that
name in a user's environment.  So no code of the project may import them by their folder names
(that works only from a checkout's root), and the installed distribution names ``minirt`` alone.
"""
from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_FOLDER_NAMES = ("builder", "targets")
_SOURCE_DIRS = ("minirt", "builder", "targets", "tests", "benchmarks", "examples", "scripts")


def _folder_name_imports(path: Path) -> list[str]:
    """``file:line module`` of every import that names ``builder`` / ``targets`` as a top-level package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        else:
            continue
        found += [f"{path.relative_to(ROOT)}:{node.lineno} {m}" for m in modules if m.split(".")[0] in _FOLDER_NAMES]
    return found


def test_no_code_imports_the_folder_names():
    offences = []
    for folder in _SOURCE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            offences += _folder_name_imports(path)
    assert not offences, "import minirt.builder / minirt.targets, not the folder names:\n" + "\n".join(offences)


def test_the_check_sees_a_folder_name_import(tmp_path, monkeypatch):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom builder.passes import optimize\nimport targets.profiles\nfrom minirt.builder import build\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert [line.split(" ", 1)[1] for line in _folder_name_imports(bad)] == ["builder.passes", "targets.profiles"]


def test_installed_distribution_has_one_top_level_name():
    try:
        dist = importlib.metadata.distribution("minirt")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a checkout run without installing
        pytest.skip("minirt is not installed")
    top_level = (dist.read_text("top_level.txt") or "").split()
    assert top_level == ["minirt"], f"installed top-level names: {top_level}"


def test_builder_and_targets_import_under_minirt():
    # a fresh process from outside the checkout, so that the folder names are not on sys.path
    code = ("import minirt.builder, minirt.targets.profiles, sys\n"
            "assert 'builder' not in sys.modules and 'targets' not in sys.modules, 'folder names imported'\n"
            "print(minirt.builder.build.__module__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "minirt.builder.build"


def test_every_target_module_imports_first():
    # importing a target lowering before anything else must not hit the builder <-> targets import circle
    modules = sorted("minirt.targets." + ".".join(p.relative_to(ROOT / "targets").with_suffix("").parts)
                     for p in (ROOT / "targets").rglob("*.py") if p.name != "__init__.py")
    code = ("import importlib, subprocess, sys\n"
            "bad = []\n"
            "for m in sys.argv[1:]:\n"
            "    r = subprocess.run([sys.executable, '-c', f'import {m}'], capture_output=True, text=True)\n"
            "    if r.returncode:\n"
            "        bad.append(m + ': ' + r.stderr.strip().splitlines()[-1])\n"
            "print('\\n'.join(bad))\n")
    proc = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True, text=True, cwd="/", timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", "modules that fail to import first:\n" + proc.stdout
