"""Execution providers: who runs a partition of the graph.

The CPU provider is the session's own plan of kernels and is always there.
Accelerator providers (Core ML, NNAPI, TFLite) each live in their own module
and are imported only when a session asks for them, so ``import minirt``
never pulls in coremltools or a delegate library.

A provider module defines a class with:

* ``name`` -- the provider's short name ("coreml", "nnapi", "tflite");
* ``available() -> (bool, reason)`` -- cheap: may look for a library or a
  package, must not load heavy ones;
* ``compile(blob, partition, artifact, options) -> callable`` -- turns the
  partition's stored program into a function taking the partition's input
  arrays (in ``partition.inputs`` order) and returning a tuple of its output
  arrays (in ``partition.outputs`` order).  Raising here makes the session
  fall back to the partition's CPU version with one log line.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

from minirt.vocabulary import CPU, PROVIDERS


def log_info(message: str, *args: Any) -> None:
    """One line on the "minirt" logger (imported on first use: it costs start-up time)."""
    import logging

    logging.getLogger("minirt").info(message, *args)

# ``CPU`` (re-exported here for the session) and every name below come from the provider table in
# minirt/vocabulary.py.
# provider name -> "module:Class", imported on first use (the CPU has none: the session runs it).
_PROVIDER_CLASSES: dict[str, str] = {p.name: p.runtime for p in PROVIDERS.values() if p.runtime is not None}
# onnxruntime spellings, any case, so ``providers=["CPUExecutionProvider"]`` keeps working.
_ALIASES: dict[str, str] = {p.ort_name.lower(): p.name for p in PROVIDERS.values() if p.ort_name is not None}
_instances: dict[str, Any] = {}
# Providers registered at run time (tests, plug-ins): name -> instance.
_registered: dict[str, Any] = {}


def canonical_name(name: str) -> str | None:
    key = str(name).lower()
    key = _ALIASES.get(key, key)
    if key == CPU or key in _PROVIDER_CLASSES or key in _registered:
        return key
    return None


def known_providers() -> list[str]:
    return [CPU, *sorted(set(_PROVIDER_CLASSES) | set(_registered))]


def register(provider: Any) -> None:
    """Register a provider instance (an object with ``name``, ``available``, ``compile``)."""
    _registered[provider.name] = provider


def unregister(name: str) -> None:
    _registered.pop(name, None)


def get(name: str) -> Any | None:
    """The provider object for ``name`` (None for the CPU, which the session runs itself)."""
    if name == CPU:
        return None
    if name in _registered:
        return _registered[name]
    if name not in _instances:
        module_name, _, cls_name = _PROVIDER_CLASSES[name].partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), cls_name)
        except ImportError as exc:
            _instances[name] = _Unavailable(name, f"provider module {module_name} is not installed ({exc})")
        else:
            _instances[name] = cls()
    return _instances[name]


def availability(name: str) -> tuple[bool, str]:
    """(available, reason) for provider ``name`` on this device."""
    if name == CPU:
        return True, "always available"
    provider = get(name)
    try:
        return provider.available()
    except Exception as exc:  # noqa: BLE001 - a broken probe means "not available", said plainly
        return False, f"availability check failed: {type(exc).__name__}: {exc}"


def get_available_providers() -> list[str]:
    """Providers that can run on this device, accelerators first, the CPU last."""
    names = [n for n in known_providers() if n != CPU and availability(n)[0]]
    return names + [CPU]


class _Unavailable:
    def __init__(self, name: str, reason: str):
        self.name = name
        self._reason = reason

    def available(self) -> tuple[bool, str]:
        return False, self._reason

    def compile(self, *args: Any, **kwargs: Any) -> Callable:
        raise RuntimeError(self._reason)


# onnxruntime's spelling of each provider (the ``ort_name`` column of the provider table), else ours.
_ORT_SPELLING: dict[str, str] = {p.name: p.ort_name or p.name for p in PROVIDERS.values()}


def ort_spelling(name: str) -> str:
    """``name`` (a canonical provider name) as onnxruntime spells it, or as minirt does when onnxruntime
    has no such provider (``tflite``, providers registered at run time)."""
    return _ORT_SPELLING.get(name, name)
