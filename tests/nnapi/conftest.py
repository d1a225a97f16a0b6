"""Fixtures: the validating fake NNAPI library (built with gcc), a TFLite interpreter check."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "fake_nnapi.c")


def _build(tmp_dir, name: str, *flags: str) -> str:
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler to build the fake NNAPI library")
    out = os.path.join(str(tmp_dir), name)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", *flags, "-o", out, SOURCE], check=True)
    return out


@pytest.fixture(scope="session")
def fake_nnapi_paths(tmp_path_factory):
    """{"api30": path, "api27": path}: the fake library with and without ANeuralNetworksExecution_compute."""
    d = tmp_path_factory.mktemp("fake_nnapi")
    return {"api30": _build(d, "libfake_nnapi.so"), "api27": _build(d, "libfake_nnapi27.so", "-DFAKE_NO_COMPUTE")}


class FakeLib:
    """The fake's own bookkeeping, read through cffi."""

    def __init__(self, path):
        import cffi

        self.ffi = cffi.FFI()
        self.ffi.cdef("int fake_nnapi_error_count(void); const char* fake_nnapi_last_error(void);"
                      "int fake_nnapi_live_handles(void); long fake_nnapi_computes(void); long fake_nnapi_calls(void);"
                      "void fake_nnapi_reset(void);")
        self.lib = self.ffi.dlopen(path)
        self.path = path

    @property
    def errors(self) -> int:
        return self.lib.fake_nnapi_error_count()

    @property
    def last_error(self) -> str:
        return self.ffi.string(self.lib.fake_nnapi_last_error()).decode()

    @property
    def live(self) -> int:
        return self.lib.fake_nnapi_live_handles()

    @property
    def computes(self) -> int:
        return self.lib.fake_nnapi_computes()


def _use(monkeypatch, path):
    from minirt import providers

    monkeypatch.setenv("MINIRT_NNAPI_LIBRARY", path)
    providers._instances.pop("nnapi", None)
    providers.unregister("nnapi")
    lib = FakeLib(path)
    lib.lib.fake_nnapi_reset()
    return lib


@pytest.fixture
def fake_nnapi(monkeypatch, fake_nnapi_paths):
    """The provider "nnapi" loads the fake library (API 30 flavour)."""
    return _use(monkeypatch, fake_nnapi_paths["api30"])


@pytest.fixture
def fake_nnapi27(monkeypatch, fake_nnapi_paths):
    """The provider "nnapi" loads the API 27-28 flavour (no ANeuralNetworksExecution_compute)."""
    return _use(monkeypatch, fake_nnapi_paths["api27"])


@pytest.fixture(scope="session")
def tflite_interpreter():
    from minirt.providers.tflite import _interpreter_module

    mod = _interpreter_module()
    if mod is None:
        pytest.skip("no TFLite interpreter (pip install ai-edge-litert; tflite-runtime with numpy 1.x)")
    return mod


@pytest.fixture
def nnapi_on_tflite(tflite_interpreter):
    """The test provider "nnapi" (NNAPI programs run through their TFLite translation), registered."""
    from minirt import providers
    from tests.nnapi.helpers import NNAPIOnTFLite

    p = NNAPIOnTFLite()
    providers.register(p)
    yield p
    providers.unregister("nnapi")
