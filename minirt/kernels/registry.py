"""Kernel registry: maps (domain, op_type, since-version) to a CPU kernel.

A kernel is a plain function.  ONNX inputs arrive positionally (``None`` for
an absent optional input), ONNX attributes arrive as keyword arguments whose
Python defaults are the schema defaults.  A kernel returns one ``np.ndarray``
or a tuple of them (one per ONNX output, in order).

Registration is explicit::

    @kernel("Relu", since=6)
    def relu(x):
        return np.maximum(x, x.dtype.type(0))

Lookup for a model whose opset for the domain is ``v`` takes the entry with
the largest ``since`` that is not above ``v`` (the same rule ONNX uses to pick
an operator schema), so a later opset that changed semantics registers a new
function with a higher ``since`` and older models keep the old behaviour.

Family modules are imported lazily: :func:`lookup` imports only the
module(s) that the generated index ``minirt/kernels/_index.py`` names for
``(domain, op_type)`` (regenerate it with ``python -m minirt.kernels._index``
after adding or moving kernels; a test fails while it is stale).  A kernel
whose key the index gives to another module is not registered (that is the
"first family in alphabetical order wins" rule of ``kernel_if_absent``, made
independent of import order).  A key missing from the index (a stale index)
falls back to importing every family.  ``MINIRT_KERNEL_INDEX=0`` disables the
index (every family is imported at the first lookup, as before).

Kernels that need to know about the node itself (how many outputs it has,
the declared dtypes of its outputs) register with ``context=True`` and
receive a :class:`NodeContext` as the keyword argument ``ctx``.

Kernels that can write their (single) result into a buffer the session
provides register with ``out=True`` and take a keyword-only ``out=None``
parameter (not an ONNX attribute: it is left out of :attr:`KernelEntry.attributes`).
Such a kernel uses ``out`` only when it has exactly the result's shape and
dtype (it is C-contiguous), and returns either ``out`` or a fresh array: never
a view of one of its inputs.  The session's memory plan (D17) relies on that.

Kernels with several results that can write them into caller's buffers register with ``outs=True``
and take a keyword-only ``out=None`` too: when given, a tuple with one entry per node output, the
caller's array or None (only IOBinding runs with bound outputs give it, ``Session._run_into``).
Such a kernel returns, for each output, that array (written in place: the session then copies
nothing) or a fresh one (which the session copies into the buffer).  GroupQueryAttention uses it to
append to a KV cache in place when the bound present buffer is the past input's memory.
"""
from __future__ import annotations

import importlib
import os
from typing import Callable, Iterable

KernelFn = Callable[..., object]


class NodeContext:
    """What a ``context=True`` kernel learns about the node it runs.

    A plain class, not a dataclass: defining a dataclass compiles generated methods, which
    ``import minirt`` would pay on every cold start (docs/decisions.md D57).  Treat the
    fields as read-only; only ``memo`` changes."""

    __slots__ = ("name", "op_type", "n_outputs", "output_dtypes", "opset", "memo")

    def __init__(self, name: str, op_type: str, n_outputs: int, output_dtypes: tuple, opset: int):
        self.name = name
        self.op_type = op_type
        self.n_outputs = n_outputs
        self.output_dtypes = output_dtypes  # numpy dtypes (or None where unknown), one per output
        self.opset = opset
        # Per node, for the kernel's own use: values it derives from its attributes (and input shapes),
        # kept across runs so that a hot kernel does not re-derive them per call.  Never input values:
        # the same node runs on many inputs, from several threads (a dict's item get/set is atomic).
        self.memo: dict = {}

    def __repr__(self) -> str:
        return (f"NodeContext(name={self.name!r}, op_type={self.op_type!r}, n_outputs={self.n_outputs}, "
                f"output_dtypes={self.output_dtypes!r}, opset={self.opset})")


def is_constant(*arrays) -> bool:
    """Whether every one of ``arrays`` (None counts) is read-only, as the model's constants are (the
    artifact's weights are mapped read-only; DequantizeWeights marks what it materializes).  Only
    then may a kernel key what it derives from an array (packed weights, a converted bias) on the
    array's identity: a computed value is writeable, and the memory plan hands a node the same
    buffer object on every run with new contents in it."""
    for a in arrays:
        if a is not None and getattr(getattr(a, "flags", None), "writeable", True):
            return False
    return True


def remember(memo: dict | None, key, value) -> None:
    """Keep ``value`` in a node's memo (``NodeContext.memo``, or None: nothing kept) under ``key``
    (input shapes); shapes that keep changing start it over rather than grow it."""
    if memo is not None:
        if len(memo) > 64:
            memo.clear()
        memo[key] = value


class KernelEntry:
    """One registered kernel.  ``attributes`` and ``required_inputs`` come from
    the function's signature, computed on first use (not at import: most
    kernels of a family are never looked up by a given model)."""

    __slots__ = ("domain", "op_type", "since", "fn", "context", "accepts_out", "accepts_outs", "_sig")

    def __init__(self, domain: str, op_type: str, since: int, fn: KernelFn, context: bool, accepts_out: bool = False,
                 accepts_outs: bool = False):
        self.domain = domain
        self.op_type = op_type
        self.since = since
        self.fn = fn
        self.context = context
        self.accepts_out = accepts_out  # takes out= (a buffer for its result); see the module docstring
        self.accepts_outs = accepts_outs  # takes out= (a tuple of buffers, one per output); the module docstring
        self._sig = None

    def _signature_facts(self) -> tuple:
        if self._sig is None:
            attrs = _accepted_attributes(self.fn, self.context)
            if attrs is not None and (self.accepts_out or self.accepts_outs):
                attrs = attrs - {"out"}
            self._sig = (attrs, _required_inputs(self.fn))
        return self._sig

    @property
    def attributes(self) -> frozenset | None:
        """Names of keyword parameters the function accepts (the ONNX attributes it
        understands); ``None`` means it takes **kwargs and accepts anything."""
        return self._signature_facts()[0]

    @property
    def required_inputs(self) -> int:
        """Leading positional parameters without a default: ONNX inputs that must be present."""
        return self._signature_facts()[1]

    def __repr__(self) -> str:
        return f"KernelEntry({self.domain or 'ai.onnx'}::{self.op_type} since {self.since}, {self.fn.__module__})"


# (domain, op_type) -> entries sorted by ascending ``since``
_REGISTRY: dict[tuple[str, str], list[KernelEntry]] = {}


def _parameters(fn: KernelFn) -> tuple[tuple, int, bool]:
    """(the names an attribute may bind to, leading positional parameters without a default, whether
    ``fn`` takes **kwargs).  Attribute names: keyword-only parameters and positional-or-keyword ones with
    a default.

    Read from the code object, not with inspect.signature: a session looks up every operator of its
    model on creation, and inspect (its import and its signature objects) was ~1 ms of a cold start
    (docs/decisions.md D165).  Only a callable that is not a plain function (a functools.partial, a
    wrapper carrying ``__wrapped__``) goes through inspect."""
    code = getattr(fn, "__code__", None)
    if code is None or hasattr(fn, "__wrapped__"):
        import inspect

        P = inspect.Parameter
        params = list(inspect.signature(fn).parameters.values())
        required = 0
        for p in params:
            if p.kind not in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD) or p.default is not P.empty:
                break
            required += 1
        names = tuple(p.name for p in params if p.kind is P.KEYWORD_ONLY
                      or p.kind is P.POSITIONAL_OR_KEYWORD and p.default is not P.empty)
        return names, required, any(p.kind is P.VAR_KEYWORD for p in params)
    n_positional = code.co_argcount  # (positional-only ones included, first)
    required = n_positional - len(fn.__defaults__ or ())
    names = code.co_varnames[max(required, code.co_posonlyargcount) : n_positional + code.co_kwonlyargcount]
    return names, required, bool(code.co_flags & _CO_VARKEYWORDS)


_CO_VARKEYWORDS = 0x08  # (code.co_flags: the function takes **kwargs)


def _accepted_attributes(fn: KernelFn, context: bool) -> frozenset | None:
    """Names of the attributes ``fn`` accepts; None when it takes **kwargs (it accepts anything)."""
    names, _, var_keyword = _parameters(fn)
    if var_keyword:
        return None
    accepted = set(names)
    if context:
        accepted.discard("ctx")
    return frozenset(accepted)


def _required_inputs(fn: KernelFn) -> int:
    """Leading positional parameters without a default."""
    return _parameters(fn)[1]


def kernel(
    op_type: str, since: int = 1, domain: str = "", context: bool = False, out: bool = False, outs: bool = False
) -> Callable[[KernelFn], KernelFn]:
    """Register ``fn`` as the CPU kernel for ``domain::op_type`` from opset ``since``
    (``out=True``: it takes a keyword-only ``out`` buffer; ``outs=True``: a tuple of them, one per
    output; see the module docstring)."""

    def register(fn: KernelFn) -> KernelFn:
        index = _index()
        if index:
            owners = index.get((domain, op_type))
            if owners is not None and fn.__module__.rpartition(".")[2] not in owners:
                return fn  # another family provides this operator (see the module docstring)
        entry = KernelEntry(domain, op_type, since, fn, context, out, outs)
        entries = _REGISTRY.setdefault((domain, op_type), [])
        if any(e.since == since for e in entries):
            raise RuntimeError(f"kernel {domain or 'ai.onnx'}::{op_type} since {since} registered twice")
        entries.append(entry)
        entries.sort(key=lambda e: e.since)
        return fn

    return register


def _normalise_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


# (domain, op_type) -> family module names (minirt/kernels/_index.py); {} when disabled
_INDEX: dict | None = None
_ALL_IMPORTED = False
_PACKAGE = __name__.rpartition(".")[0]


def _index() -> dict:
    global _INDEX
    if _INDEX is None:
        if os.environ.get("MINIRT_KERNEL_INDEX", "").strip() == "0":
            _INDEX = {}
        else:
            try:
                from minirt.kernels._index import INDEX
            except ImportError:  # pragma: no cover - the index ships with the package
                INDEX = {}
            _INDEX = INDEX
    return _INDEX


def _import_all() -> None:
    """Import every family module (coverage tables, keys the index does not know)."""
    global _ALL_IMPORTED
    if _ALL_IMPORTED:
        return
    from minirt import kernels

    kernels._import_families()
    _ALL_IMPORTED = True


def _load(key: tuple) -> None:
    owners = _index().get(key)
    if not owners:
        _import_all()
        return
    for name in owners:
        importlib.import_module(f"{_PACKAGE}.{name}")


def lookup(domain: str, op_type: str, opset: int) -> KernelEntry | None:
    """The kernel for ``op_type`` at ``opset``, or ``None`` if there is none."""
    key = (_normalise_domain(domain), op_type)
    entries = _REGISTRY.get(key)
    if not entries:
        _load(key)
        entries = _REGISTRY.get(key)
        if not entries:
            return None
    best = None
    for entry in entries:
        if entry.since <= opset:
            best = entry
    return best


def registered() -> Iterable[KernelEntry]:
    """Every registered kernel, in a stable order (for the coverage table)."""
    _import_all()

    for key in sorted(_REGISTRY):
        yield from _REGISTRY[key]
