"""The native ABI as cffi reads it (minirt/native/kernels.h) against what the Python side uses.

kernels.h declares the interface once: entry points, parameter structs, the activation enum, the
ABI version.  minirt/native/__init__.py builds the structs and calls the entry points without
repeating any of it, so these checks are the only place a drift between the two shows before a
crash: every entry point and struct field Python names exists, the version Python expects is the
compiled one, the activation names of minirt/vocabulary.py are exactly the enum's, and no entry
point takes more than MAX_PARAMS parameters.  Each check is a function tested on a violation too
(the ``*_catches_*`` tests), so a check that could not fail would show.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from cffi import FFI

from minirt import native
from minirt.vocabulary import ACTIVATIONS

ROOT = Path(__file__).resolve().parents[2]
NATIVE_PY = ROOT / "minirt" / "native" / "__init__.py"
MAX_PARAMS = 8

pytestmark = pytest.mark.skipif(not native.available, reason="native kernels not available")


# --------------------------------------------------------------------------- the checks


def entry_points_named(sources) -> set[str]:
    """The ``mrt_*`` entry points the Python sources call (``_lib.mrt_x``) or list (``"mrt_x"`` strings)."""
    names = set()
    for text in sources:
        names |= set(re.findall(r"_lib\.(mrt_\w+)", text)) | set(re.findall(r"\"(mrt_[a-z0-9_]+)\"", text))
    return names


def signatures(ffi, lib) -> dict:
    """Entry point -> its C function type, for every ``mrt_*`` function of the compiled module."""
    return {name: ffi.typeof(getattr(lib, name)) for name in dir(lib)
            if name.startswith("mrt_") and callable(getattr(lib, name))}


def missing_entry_points(names, sigs) -> list[str]:
    return sorted(set(names) - set(sigs))


def struct_fields_set(source: str) -> dict[str, set[str]]:
    """struct type -> the fields the source sets in ``_new("mrt_x *", {...})`` / ``_share(key, "mrt_x *",
    {...})`` / ``ffi.new("mrt_x *", {...})`` calls (the dict literal's keys)."""
    found: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        for i, arg in enumerate(node.args[:-1]):
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("mrt_"):
                fields = node.args[i + 1]
                if isinstance(fields, ast.Dict):
                    keys = {k.value for k in fields.keys if isinstance(k, ast.Constant)}
                    found.setdefault(arg.value.rstrip(" *"), set()).update(keys)
    return found


def unknown_fields(struct: str, fields, ffi) -> list[str]:
    known = {name for name, _ in ffi.typeof(struct).fields}
    return sorted(set(fields) - known)


def too_many_params(sigs, limit: int = MAX_PARAMS) -> dict[str, int]:
    """Entry point -> its parameter count, for those taking more than ``limit``."""
    return {name: len(t.args) for name, t in sigs.items() if len(t.args) > limit}


def activation_mismatches(activations, lib) -> tuple[list[str], list[str]]:
    """(vocabulary natives the module lacks, MRT_ACT_* constants of the module the vocabulary lacks)."""
    named = {a.native for a in activations.values() if a.native is not None}
    compiled = {n for n in dir(lib) if n.startswith("MRT_ACT_")}
    return sorted(named - compiled), sorted(compiled - named)


# --------------------------------------------------------------------------- the ABI


def test_every_entry_point_python_names_exists():
    sources = [p.read_text() for p in (ROOT / "minirt").rglob("*.py")]
    names = entry_points_named(sources)
    assert {"mrt_conv2d_f32", "mrt_qconv2d", "mrt_sgemm_f32", "mrt_program_run"} <= names
    assert missing_entry_points(names, signatures(native._ffi, native._lib)) == []


def test_every_struct_field_python_sets_exists():
    found = struct_fields_set(NATIVE_PY.read_text())
    assert {"mrt_conv_geometry", "mrt_epilogue", "mrt_quant"} <= set(found)
    for struct, fields in found.items():
        assert unknown_fields(struct, fields, native._ffi) == [], struct
    # the field tuples the shared structs are built from
    assert unknown_fields("mrt_conv_geometry", native._GEOMETRY_FIELDS, native._ffi) == []
    assert unknown_fields("mrt_gemm_shape", native._GEMM_FIELDS, native._ffi) == []
    assert len(native._GEOMETRY_FIELDS) == len(native._ffi.typeof("mrt_conv_geometry").fields)
    assert len(native._GEMM_FIELDS) == len(native._ffi.typeof("mrt_gemm_shape").fields)


def test_abi_version_is_the_headers():
    """The version Python expects is a constant of its own (the device wheel ships no header), equal to the
    header's when both are current; the compiled module reports the header it was built from."""
    header = (Path(native.__file__).parent / "kernels.h").read_text(encoding="utf-8")
    (declared,) = re.findall(r"^#define MRT_ABI_VERSION (\d+)", header, re.M)
    assert native.ABI_VERSION == int(declared) == native._lib.MRT_ABI_VERSION == native._lib.mrt_abi_version()


def test_a_stale_module_is_refused(monkeypatch):
    """A module whose version is not the one this Python code expects is not used, and ``reason`` says so."""
    monkeypatch.setattr(native, "ABI_VERSION", native.ABI_VERSION + 1)
    monkeypatch.setattr(native, "available", False)
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_ffi", None)
    monkeypatch.setattr(native, "reason", None)
    native._load()
    assert not native.available and "stale build" in native.reason, native.reason


def test_activations_are_the_vocabularys():
    assert activation_mismatches(ACTIVATIONS, native._lib) == ([], [])
    assert native.ACTIVATION_CODES == {a.name: getattr(native._lib, a.native) for a in ACTIVATIONS.values()
                                       if a.native is not None}
    assert native.ACTIVATION_CODES[""] == 0  # (a zeroed mrt_epilogue means no activation)


def test_no_entry_point_takes_more_than_eight_parameters():
    sigs = signatures(native._ffi, native._lib)
    assert len(sigs) > 30 and too_many_params(sigs) == {}


def test_every_recordable_entry_point_has_a_program_case():
    lib, ffi = native._lib, native._ffi
    codes = {n for n in dir(lib) if n.startswith("MRT_CALL_")}
    assert codes == {"MRT_CALL_" + name[len("mrt_"):].upper() for name in native.RECORDABLE}
    for name, (reads, writes) in native.RECORDABLE.items():
        params = ffi.typeof(getattr(lib, name)).args
        for pos in reads + writes:  # (data positions: pointers, the last parameter the thread count)
            assert params[pos].kind == "pointer" and pos < len(params) - 1, (name, pos)
        assert params[-1].cname == "int", name


# --------------------------------------------------------------------------- the checks catch a violation


def test_the_checks_catch_a_violation():
    ffi = FFI()
    ffi.cdef("typedef struct { int n, c; } mrt_conv_geometry;")
    sigs = {"mrt_wide": ffi.typeof("void(*)(int, int, int, int, int, int, int, int, int)"),
            "mrt_narrow": ffi.typeof("void(*)(mrt_conv_geometry *)")}
    assert too_many_params(sigs) == {"mrt_wide": 9}
    assert too_many_params(sigs, limit=9) == {}
    assert missing_entry_points({"mrt_narrow", "mrt_gone"}, sigs) == ["mrt_gone"]
    lib = SimpleNamespace(MRT_ACT_EXTRA=10)
    assert unknown_fields("mrt_conv_geometry", {"n", "group"}, ffi) == ["group"]
    assert activation_mismatches(ACTIVATIONS, lib)[1] == ["MRT_ACT_EXTRA"]
    assert "MRT_ACT_RELU" in activation_mismatches(ACTIVATIONS, lib)[0]
    source = 'g = _new("mrt_conv_geometry *", {"n": 1, "typo": 2})\ne = ffi.new("mrt_epilogue *", {"act": 1})'
    assert struct_fields_set(source) == {"mrt_conv_geometry": {"n", "typo"}, "mrt_epilogue": {"act"}}
    assert entry_points_named(['_lib.mrt_a(x)', 'RECORDABLE = {"mrt_b": ()}']) == {"mrt_a", "mrt_b"}

