"""Session / InferenceSession: the public API that loads an artifact and runs it.

The API mirrors onnxruntime's ``InferenceSession`` so that an existing script
changes one import::

    sess = minirt.InferenceSession("model.mrt")
    (logits,) = sess.run(None, {"image": batch})

This module holds what a caller sees: the options, the introspection
(``get_inputs``, ``get_modelmeta``, ...), the checks and binding of input
feeds, the copies of outputs, the choice of provider per partition, and the
per-session cache of static memory plans (D17).  Loading compiles each graph
into a :class:`minirt.plan.Plan` (the steps, their runs, the native-program
recording and replay, D32); running walks that plan's flat tuple of steps over
a list of slots: there is no graph walk, no name lookup and no dict access per
node at run time.
"""
from __future__ import annotations

import collections
import math
import os
import _thread  # (locks, thread ids: not threading, whose import costs ~0.5 ms of a cold start)
import time
import warnings
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from minirt.dtypes import ONNX_TO_NUMPY, onnx_type_name
from minirt.errors import (FileChanged, FormatError, InvalidArgument, KernelError, MissingFile, ResourceError,
                           RunTerminated, UnsupportedOperator)
from minirt.format import reader
from minirt.format import schema as S
from minirt import arena
from minirt import plan as plan_mod  # (MEMPLAN_CHECK is read through it, so that tests can switch it)
from minirt import providers as providers_mod
from minirt.kernels import _limits
from minirt import native as _native  # threads for the native kernels
from minirt.native import blas as _blas  # threads for numpy's BLAS
from minirt.native import program as _program  # planned runs replayed from C (D32)
from minirt.plan import BoundSubgraph, Cancellation, Plan, ReplayShortcut  # (BoundSubgraph: public)
from minirt.vocabulary import DELEGATED_PARTITION, MINIRT_DOMAIN, RANDOM


# Recurrences (their input 4 is sequence_lens) and ops that pass a value's numbers on (warm-up feeds)
_RECURRENCES = frozenset({"LSTM", "GRU", "RNN"})
_PASS_THROUGH = frozenset({"Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})


def get_available_providers() -> list[str]:
    """Providers that can run on this device, in minirt's default priority order, spelled as
    onnxruntime spells them where it has the provider (``CPUExecutionProvider``), else minirt's name."""
    return [providers_mod.ort_spelling(n) for n in providers_mod.get_available_providers()]


class NodeArg:
    """An input or output of a session, shaped like onnxruntime's ``NodeArg``."""

    __slots__ = ("name", "shape", "type", "_dtype_code", "_kind")

    def __init__(self, name: str, dtype_code: int, shape: tuple | None, kind: int = S.VALUE_TENSOR):
        self.name = name
        self._dtype_code = dtype_code
        self._kind = kind
        # onnxruntime gives ints for fixed dims, strings for symbolic ones and
        # None for unknown ones.
        self.shape = list(shape) if shape is not None else None
        tensor = f"tensor({onnx_type_name(dtype_code)})" if dtype_code else "tensor(undefined)"
        # Type strings as onnxruntime spells them: seq(tensor(float)), optional(...).
        self.type = {
            S.VALUE_TENSOR: tensor,
            S.VALUE_SEQUENCE: f"seq({tensor})",
            S.VALUE_OPTIONAL: f"optional({tensor})",
            S.VALUE_OPTIONAL_SEQUENCE: f"optional(seq({tensor}))",
            S.VALUE_MAP_INT64: f"map(int64,{tensor})",
            S.VALUE_MAP_STRING: f"map(string,{tensor})",
            S.VALUE_SEQUENCE_MAP_INT64: f"seq(map(int64,{tensor}))",
            S.VALUE_SEQUENCE_MAP_STRING: f"seq(map(string,{tensor}))",
        }[kind]

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


class ModelMetadata:
    """Subset of onnxruntime's ``ModelMetadata`` plus minirt's typed metadata."""

    def __init__(self, metadata: dict):
        self.producer_name = str(metadata.get("source.producer_name", ""))
        self.graph_name = str(metadata.get("source.graph_name", ""))
        self.domain = str(metadata.get("source.domain", ""))
        self.description = str(metadata.get("source.doc_string", ""))
        try:
            self.version = int(metadata.get("source.model_version", 0) or 0)
        except (TypeError, ValueError, OverflowError):
            self.version = 0
        props = metadata.get("source.metadata_props", {})
        self.custom_metadata_map = {str(k): str(v) for k, v in props.items()} if isinstance(props, dict) else {}
        self.minirt = dict(metadata)


_NOT_RECORDED = object()  # no memory plan recorded yet for a signature (None: recorded, nothing to place)


def _node_arg(info: reader.ValueInfo) -> NodeArg:
    return NodeArg(info.name, info.dtype, info.shape, info.kind)


def _warn_skipped(name: str, why: str) -> None:
    warnings.warn(f"Specified provider {name!r} {why}; skipped. Available providers: "
                  f"{', '.join(get_available_providers())}", UserWarning, stacklevel=4)


def _normalise_providers(providers: Sequence, provider_options: Sequence | None = None,
                         explicit: bool = True) -> tuple[list[str], dict]:
    """(canonical provider names in priority order, the CPU last; {name: options}).

    As onnxruntime does, a provider this runtime does not know, or (``explicit``: the caller listed
    it) one that is not available on this device, is skipped with a warning naming the available
    ones: a script listing ``CUDAExecutionProvider`` first runs on the CPU.  The artifact's own
    default list (``explicit`` False) keeps its providers unprobed: availability is checked only
    for a partition that asks for one (``_delegate_partitions``)."""
    if isinstance(providers, str):
        providers = [providers]
    providers = list(providers)
    if provider_options is not None and len(provider_options) != len(providers):
        raise InvalidArgument(f"provider_options must have one dict per provider: {len(providers)} providers, "
                              f"{len(provider_options)} option dicts")
    out: list[str] = []
    options: dict[str, dict] = {}
    for i, p in enumerate(providers):
        name, opts = (p[0], p[1]) if isinstance(p, tuple) else (p, None)  # onnxruntime allows (name, options)
        if provider_options is not None:
            opts = provider_options[i]
        key = providers_mod.canonical_name(name)
        if key is None:
            _warn_skipped(name, "is not a provider minirt knows")
            continue
        if explicit and key != providers_mod.CPU:
            # known but not available here: warned as skipped, and left out of get_providers(); kept in
            # the list so that its partitions say "not available here" (get_partitions) and run on the CPU
            ok, reason = providers_mod.availability(key)
            if not ok:
                _warn_skipped(name, f"is not available on this device ({reason})")
        if key not in out:
            out.append(key)
            options[key] = {str(k): str(v) for k, v in (opts or {}).items()}
    if providers_mod.CPU not in out:
        out.append(providers_mod.CPU)  # the CPU is always the fallback for what no provider takes
        options[providers_mod.CPU] = {}
    return out, options


TRUSTED_KEYS_ENV = "MINIRT_TRUSTED_KEYS"  # paths of .pub files or folders of them, os.pathsep between
REQUIRE_SIGNATURE_ENV = "MINIRT_REQUIRE_SIGNATURE"  # 1/true/yes/on: every session requires a signature


def trusted_keys(verify_key: Any, require_signature: bool | None) -> Any:
    """What a session verifies signatures against (the device's trust policy, docs/runtime.md): the caller's
    ``verify_key``, else the keys ``MINIRT_TRUSTED_KEYS`` names; None when no signature is to be checked.
    Raises InvalidArgument when a signature is required and no key is trusted, or the options disagree."""
    if require_signature is not None and not isinstance(require_signature, bool):
        raise InvalidArgument(f"require_signature must be True, False or None, got {require_signature!r}")
    if require_signature is False:
        if verify_key is not None:
            raise InvalidArgument("require_signature=False with verify_key: a key to verify against asks for a "
                                  "signature; pass one or the other")
        return None
    if verify_key is not None:
        return verify_key
    env_keys = os.environ.get(TRUSTED_KEYS_ENV, "").strip()
    if env_keys:
        return [p for p in env_keys.split(os.pathsep) if p.strip()]
    required = require_signature or os.environ.get(REQUIRE_SIGNATURE_ENV, "").strip().lower() in (
        "1", "true", "yes", "on")
    if required:
        why = "require_signature=True" if require_signature else f"{REQUIRE_SIGNATURE_ENV} is set"
        raise InvalidArgument(f"{why}, but no key is trusted: pass verify_key=KEY.pub (a key, a folder of .pub "
                              f"files or a list) or set {TRUSTED_KEYS_ENV}=PATH[{os.pathsep}PATH...]")
    return None


class Session:
    """Run a .mrt artifact.  ``InferenceSession`` is the same class.

    :param path_or_bytes: path to a .mrt file or its bytes.
    :param providers: provider names in priority order (default: all available).
    :param threads: threads for native kernels and BLAS (None: all CPUs, BLAS default).
    :param verify_checksums: check every section's CRC-32 at load (default on).
    :param verify_key: require an Ed25519 signature by this public key (32 bytes, hex, a .pub path), by one
        of several (a folder of .pub files, or a list); None (default): the keys of ``MINIRT_TRUSTED_KEYS``
        when it is set, else no signature is checked.  See docs/runtime.md (trust policy).
    :param require_signature: True refuses to load without a signature by a trusted key (``verify_key`` or
        ``MINIRT_TRUSTED_KEYS``; neither is an error); None (default): required when ``MINIRT_TRUSTED_KEYS``
        or ``MINIRT_REQUIRE_SIGNATURE=1`` is set or ``verify_key`` is given; False: none checked (a
        development setting; it cannot be combined with ``verify_key``).
    :param memory_plan: reuse intermediate buffers through a static memory plan (default on, D17, D27): the
        first run with a given set of input shapes records every value's shape and lifetime, later runs with
        the same shapes write the results of out-capable kernels (conv, GEMM, elementwise, concat, int8 conv)
        into one preallocated arena at planned offsets (verified not to overlap while live); with fixed input
        shapes the first run already writes into an arena planned from the declared shapes.  Up to 4 shape
        signatures are kept (LRU); outputs returned never alias the arena.  On by default because a process
        that runs one model otherwise maps and faults in fresh pages for its big intermediates on every run
        (PP-OCR det: 16.7 -> 10.1 ms); it costs ~1 us per planned node on tiny models.  ``False`` turns it
        off; None (the default) reads ``MINIRT_MEMORY_PLAN`` (unset: on; 0/false/no/off: off).
        See docs/runtime.md.
    :param map_file: a path's file read into a private copy (False) or mapped (True); None (default):
        copied up to 256 MiB, mapped beyond.  A copy is not affected by anything done to the file afterwards;
        a mapping shares its pages with other processes, and a session refuses to run (``FileChanged``) once
        its file was truncated or rewritten: replace a mapped model by an atomic rename (``minirt install``).
        A signed load (``verify_key``) always copies.  See docs/runtime.md (D97).
    :param max_tensor_bytes: refuse (``ResourceError``) any tensor a kernel would size from input values
        beyond this many bytes (default: half the RAM, at most 16 GiB).  See docs/runtime.md.
    """

    def __init__(
        self,
        path_or_bytes: Any,
        sess_options: Any = None,
        providers: Sequence | None = None,
        threads: int | None = None,
        verify_checksums: bool = True,
        verify_key: Any = None,  # --- signing / memory guard (reliability issue) ---
        max_tensor_bytes: int | None = None,
        memory_plan: bool | None = None,
        native_program: bool | None = None,
        provider_options: Sequence[dict] | None = None,
        warm_up: bool | None = None,
        map_file: bool | None = None,
        require_signature: bool | None = None,
        **kwargs: Any,
    ):
        # onnxruntime's signature is (path_or_bytes, sess_options=None, providers=None, ...);
        # allow ``Session(path, ["cpu"])`` too, which is how minirt users call it.
        if isinstance(sess_options, (list, tuple)) and providers is None:
            providers, sess_options = sess_options, None
        if kwargs:
            raise InvalidArgument(f"unknown Session option(s): {sorted(kwargs)}")
        # onnxruntime's SessionOptions (ours or its own object; minirt.ort_compat): threads, the memory
        # plan, profiling, logging and, for an ONNX model, the builder's opt level.  Explicit minirt
        # arguments win over them.
        self._sess_options = sess_options
        self._profiling = None  # ORT-style profiling: {"prefix", "start_ns", "events"} (see end_profiling)
        opt_level = 2  # the builder's default, for an ONNX model given without session options
        if sess_options is not None:
            from minirt import ort_compat

            settings = ort_compat.session_settings(sess_options)
            if threads is None:
                threads = settings["threads"]
            if memory_plan is None:
                memory_plan = settings["memory_plan"]
            opt_level = settings["opt_level"]
            if settings["log_level"] is not None:
                import logging

                logging.getLogger("minirt").setLevel(settings["log_level"])
            if settings["profiling"] is not None:
                self._profiling = {"prefix": settings["profiling"], "start_ns": time.time_ns(), "events": []}
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise InvalidArgument(f"threads must be a positive integer, got {threads!r}")
        requested_providers = providers
        self.threads = threads
        # --- signing / memory guard (reliability issue): begin ---
        if max_tensor_bytes is None:
            max_tensor_bytes = _limits.DEFAULT_MAX_TENSOR_BYTES
        elif isinstance(max_tensor_bytes, bool) or not isinstance(max_tensor_bytes, int) or max_tensor_bytes < 1:
            raise InvalidArgument(f"max_tensor_bytes must be a positive integer, got {max_tensor_bytes!r}")
        self.max_tensor_bytes = max_tensor_bytes
        # ONNX in (minirt/onnx_in.py, imported only on this path): what fails the .mrt magic check and
        # is a .onnx path or reads as a ModelProto is built (or found in the cache); the content
        # decides, so an artifact saved under an application's model.onnx loads as the artifact
        self.built_from = None  # {"onnx", "cache", "cached"} when this session built an ONNX model
        verify_key = trusted_keys(verify_key, require_signature)
        if map_file is not None and not isinstance(map_file, bool):
            raise InvalidArgument(f"map_file must be True, False or None, got {map_file!r}")
        if map_file and verify_key is not None:
            raise InvalidArgument("map_file=True with a signature to verify: a signed artifact is always loaded as a "
                                  "private copy (what was verified is what runs); leave map_file unset")
        try:
            self._artifact = reader.load(path_or_bytes, verify_checksums=verify_checksums, verify_key=verify_key,
                                         map_file=map_file)
        except MissingFile:
            raise
        except FormatError:
            from minirt import onnx_in

            if not onnx_in.looks_like_onnx(path_or_bytes):
                raise
            path_or_bytes = self._from_onnx(path_or_bytes, opt_level)
            self._artifact = reader.load(path_or_bytes, verify_checksums=verify_checksums, verify_key=verify_key,
                                         map_file=map_file)
        self._mapped_file = self._artifact.mapped_file  # (checked before every run: _check_file)
        # --- signing / memory guard: end ---
        explicit = requested_providers is not None
        if requested_providers is None:
            # Default: the target's provider order recorded at build time.  No
            # provider is probed unless a partition asks for it.
            requested_providers = self._artifact.metadata_value("target.providers") or [providers_mod.CPU]
            if not isinstance(requested_providers, list):
                requested_providers = [providers_mod.CPU]
            requested_providers = [p for p in requested_providers if providers_mod.canonical_name(str(p))]
        self._providers, self._provider_options = _normalise_providers(
            requested_providers, provider_options, explicit)
        if any(self._provider_options.values()):
            warnings.warn(f"minirt reports but does not use provider options {self._provider_options}: a "
                          f"partition's options are fixed in the artifact at build time", UserWarning, stacklevel=2)
        self._fallback = True
        self._assignments: list[dict] = []
        self._plan = Plan(self._artifact, 0, None, self._delegate_partitions(0))
        graph = self._artifact.main_graph
        init_slots = {v for v, _ in graph.initializers}
        self._inputs = [
            _node_arg(graph.values[v])
            for v in graph.inputs
            if v not in init_slots
        ]
        self._overridable = [
            _node_arg(graph.values[v])
            for v in graph.inputs
            if v in init_slots
        ]
        self._outputs = [_node_arg(graph.values[v]) for v in graph.outputs]
        self._input_slot = {graph.values[v].name: v for v in graph.inputs}
        self._required = [a.name for a in self._inputs]
        self._output_slot = {graph.values[v].name: v for v in graph.outputs}
        self._produced = {v for n in graph.nodes for v in n.outputs if v >= 0}
        self._all_outputs = frozenset(graph.outputs)
        # --- static memory plan (D17): input signature -> arena.ArenaPlan (None: nothing to place), LRU
        if memory_plan is None:  # default on; MINIRT_MEMORY_PLAN=0 turns it off
            memory_plan = os.environ.get("MINIRT_MEMORY_PLAN", "").strip().lower() not in ("0", "false", "no", "off")
        self.memory_plan = bool(memory_plan)
        self._mplans: collections.OrderedDict = collections.OrderedDict()
        self._mplans_lock = _thread.allocate_lock()
        self._mplan_evictions = 0
        # signature -> the results (shapes, dtypes) its one run so far recorded, LRU: a signature's memory plan
        # is made when it comes again (_memory_plan_for), so a shape seen once costs no plan
        self._sightings: collections.OrderedDict = collections.OrderedDict()
        # (signature, plan) of the most recently used plan, while no other was used or stored since: the
        # steady state finds its plan there without the lock
        self._last_mplan = None
        # --- native programs (D32): a planned run whose nodes are all native calls, replayed from C
        if native_program is None:  # default on; MINIRT_NATIVE_PROGRAM=0 turns it off
            native_program = os.environ.get("MINIRT_NATIVE_PROGRAM", "").strip().lower() not in (
                "0", "false", "no", "off")
        self.native_program = bool(native_program)
        self._mplan_any = self._wants_memory_plans()
        # If / Loop / Scan bodies: memory plans and native programs of their own (D76)
        if self.memory_plan:
            for sub in self._plan.subgraph_plans():
                sub.memory = plan_mod.SubgraphMemory(self.native_program)
        # Every input a tensor of one fixed shape and dtype (checked by _bind_inputs): then every feed
        # has the same signature and computing it per run is wasted time.
        self._static_inputs = all(
            graph.values[v].kind == S.VALUE_TENSOR and graph.values[v].dtype and graph.values[v].shape is not None
            and all(isinstance(d, int) for d in graph.values[v].shape)
            for v in graph.inputs
        )
        self._make_declared_plan()
        # The layout of the last feed _bind_inputs accepted, when it was all numpy arrays for tensor inputs:
        # ((name, slot, dtype, shape) per array, its memory-plan signature), or None.  A feed with the same
        # layout passes the same checks, so _bind_known_feed binds it without repeating them.
        self._known_feed = None
        # The steady state of a model run as a native program (D32): see ReplayShortcut.
        self._shortcut = None
        # Inputs the builder specialised the graph for (--input-value): name -> the value runs must feed.
        # _pin_reasons: why the builder pinned an input itself (only one branch of an If can run with the
        # input shapes the artifact was built for): name -> the reason, which a refused feed is told
        pinned = self._artifact.metadata_value("pinned_inputs")
        self._pinned, self._pin_reasons = _pinned_values(pinned) if pinned else (None, {})
        # BLAS at 1 thread whenever the native kernels run (see _run), from now on: and OpenBLAS's idle
        # workers stopped, which spin for ~0.1 s after numpy's import and took a core from the warm-up
        # and the first runs (D136).
        if _native.available:
            _blas.set_threads(1)
            _blas.stop_idle_threads()
        # Warm-up (D90, D92): a fixed-shape model records its program here, so that its first run replays
        self._warming_up = False  # (while _warm_up runs: its run records the program in the same pass)
        asked = warm_up is True
        if warm_up is None:  # default: by the rule of _warms_up; MINIRT_WARM_UP=0 turns it off
            warm_up = (os.environ.get("MINIRT_WARM_UP", "").strip().lower() not in ("0", "false", "no", "off")
                       and self._warms_up())
        self.warmed_up = bool(warm_up) and self._warm_up(asked)
        # The kernels' worker threads now, as onnxruntime creates its pool with the session: created
        # during the first run's first layers, they were not yet running where the OS wanted them (D129).
        _native.start_threads(self.threads)

    # The warm-up's run (D92) is dry (no kernel runs) unless the builder estimates the model's run
    # (``build.flops``) at most WARM_UP_WET_FLOPS: then it runs for real, its cost a millisecond or two,
    # and the first touches of its kernels' code and buffers are not the first run's (a dry warm-up left
    # Silero VAD's first run 3.3x, a tagger BiLSTM's 2.0x a steady one).  A dry run that records no
    # program is followed by one for real up to WARM_UP_MAX_FLOPS (~5 ms at 1 thread on a 2020s x86-64
    # core, ~20 ms on a Raspberry Pi 5's), or when the caller asked for the warm-up.
    WARM_UP_WET_FLOPS = 2e8
    # A model of at most WARM_UP_REPLAY_FLOPS (a run of ~0.2 ms) also replays the program its warm-up
    # recorded, once: the recording ran node by node, and the program's first replay found its code and
    # data cold: Silero VAD's first run was 120 us of calls against 45 steady, 2.8x (each call 2-4x).
    WARM_UP_REPLAY_FLOPS = 2e7
    WARM_UP_MAX_FLOPS = 1.2e9
    # ... and none for a graph of more nodes than this: recording costs ~50 us a node (a 16,000-node chain:
    # 0.8 s), which would make loading a huge graph slow (issue 22: a 16k-node graph loads and plans in
    # well under a second, 0.65 s, and records its program on its second run instead).  The real models
    # of the benchmark set have at most 1,666 nodes.
    WARM_UP_MAX_NODES = 4096

    def _warms_up(self) -> bool:
        """Whether the session warms up by default (D90): a model of fixed input shapes whose declared
        memory plan exists (the warm-up's run records the native program its first run then replays),
        without If/Loop/Scan (their bodies are not recorded dry, nor estimated) or random ops (a run
        draws from their generator)."""
        return (isinstance(self._declared_plan, arena.ArenaPlan) and self.native_program
                and self._profiling is None and len(self._plan.steps) <= self.WARM_UP_MAX_NODES
                and not any(st.subgraphs or st.op.op_type in RANDOM for st in self._plan.steps))

    def _flops(self) -> float:
        """The builder's estimate of one run (``build.flops``); infinity when the artifact has none."""
        flops = self._artifact.metadata_value("build.flops")
        return float(flops) if isinstance(flops, (int, float)) and flops >= 0 else math.inf

    def _warm_up(self, asked: bool = False) -> bool:
        """Run once on a feed of zeros (pinned inputs: their values) as a first run would: it records the
        memory plan and the native program, so the caller's first run replays it (D90).  A run on zeros
        may fail where real data would not (a shape read from the data): then the session is as it was
        before, and runs record as usual.  Returns whether the run completed."""
        if not self._static_inputs:
            return False  # (no one feed stands for every run)
        feed = {}
        graph = self._artifact.main_graph
        for arg in self._inputs:
            dtype = ONNX_TO_NUMPY.get(graph.values[self._input_slot[arg.name]].dtype)
            if dtype is None or dtype.kind not in "biufc":
                return False
            if math.prod(arg.shape) * np.dtype(dtype).itemsize > self.max_tensor_bytes:
                return False  # (a declared shape no run could feed: the memory guard's limit; found by fuzzing)
            try:
                feed[arg.name] = np.zeros(arg.shape, dtype)
            except MemoryError:  # (under the limit, but not to be had here: an address-space limit; fuzzing)
                return False
        feed.update(self._full_lengths(feed))
        if self._pinned is not None:
            feed.update(self._pinned)
        # dry first (D92): the run records without running the recordable kernels, which is all the
        # first run needs when it records the whole program; else (a node it cannot record dry, or no
        # program) the run on zeros for real, for a model small enough (WARM_UP_* above) or when asked
        flops = self._flops()
        if flops <= self.WARM_UP_WET_FLOPS:
            if not self._warm_up_run(feed, dry=False):
                return False
            if flops <= self.WARM_UP_REPLAY_FLOPS and self._recorded_program():
                _native.start_threads(self.threads)
                self._warm_up_run(feed, dry=False)  # (a failure here leaves the session as before it)
            return True
        if self._warm_up_run(feed, dry=True):
            if self._recorded_program():
                return True
            self._forget_warm_up()
        return (asked or flops <= self.WARM_UP_MAX_FLOPS) and self._warm_up_run(feed, dry=False)

    def _warm_up_run(self, feed: dict, dry: bool) -> bool:
        """The warm-up's run on ``feed``, dry or not (see _warm_up); on any failure the session is left
        as before it.  Returns whether the run completed."""
        self._warming_up = True
        _native.set_dry_recording(dry)
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                self._run(None, feed, profile=None)
        except Exception:  # noqa: BLE001 - any failure: no warm-up, nothing kept from it
            self._forget_warm_up()
            return False
        finally:
            _native.set_dry_recording(False)
            self._warming_up = False
        return True

    def _forget_warm_up(self) -> None:
        """Drop what a warm-up's run kept (memory plans with their programs, the feed shortcut)."""
        with self._mplans_lock:
            self._mplans.clear()
            self._sightings.clear()
            self._last_mplan = None
        self._known_feed = self._shortcut = None

    def _recorded_program(self) -> bool:
        """Whether a memory plan holds a recorded native program (what a dry warm-up is for)."""
        with self._mplans_lock:
            plans = [p for p in self._mplans.values() if p is not None]
        return any(p.has_program() for p in plans)

    def _full_lengths(self, feed: dict) -> dict:
        """Warm-up inputs that are a recurrence's ``sequence_lens`` (directly or through a Cast, Reshape,
        Squeeze, Unsqueeze, Flatten or Identity), filled with the sequence's length instead of zeros:
        lengths of 0 would skip the recurrence, and its code and buffers would then be the caller's
        first run's page faults (a tagger's BiLSTM: ~190, half a steady run)."""
        graph = self._artifact.main_graph
        producer = {v: st for st in self._plan.steps for v in st.outs if v >= 0}
        name_of = {self._input_slot[a.name]: a.name for a in self._inputs}
        filled = {}
        for st in self._plan.steps:
            if st.op.op_type not in _RECURRENCES or len(st.ins) < 5 or st.ins[4] < 0:
                continue
            x_shape = graph.values[st.ins[0]].shape
            layout = st.node.attributes.get("layout")
            seq_axis = 1 if layout is not None and layout.value else 0
            if not x_shape or len(x_shape) != 3 or not isinstance(x_shape[seq_axis], int):
                continue
            v = st.ins[4]
            while v not in name_of and v in producer and producer[v].op.op_type in _PASS_THROUGH:
                v = producer[v].ins[0]
            name = name_of.get(v)
            if name is not None and feed[name].dtype.kind in "iu":
                filled[name] = np.full_like(feed[name], x_shape[seq_axis])
        return filled

    def _delegate_partitions(self, graph_index: int) -> dict:
        """Choose, per partition, the provider that runs it; compile those programs.

        A partition goes to its provider when the session lists that provider
        and it is available here and its program compiles; otherwise its CPU
        version (the nodes themselves) runs, and one log line says why.
        """
        delegated = {}
        for index, part in enumerate(self._artifact.partitions):
            if part.graph != graph_index:
                continue
            record = {"partition": index, "provider": part.provider, "nodes": part.node_count, "runs_on": providers_mod.CPU}
            if part.provider not in self._providers:
                record["reason"] = f"provider {part.provider!r} not in the session's providers {self._providers}"
            else:
                ok, why = providers_mod.availability(part.provider)
                if not ok:
                    record["reason"] = f"provider {part.provider!r} is not available here: {why}"
                elif part.blob < 0:
                    record["reason"] = "the artifact holds no program for this partition"
                else:
                    try:
                        call = providers_mod.get(part.provider).compile(
                            self._artifact.provider_blob(part.blob), part, self._artifact, dict(part.options)
                        )
                    except Exception as exc:  # noqa: BLE001 - any refusal means "run the CPU version"
                        record["reason"] = f"provider {part.provider!r} refused the program: {type(exc).__name__}: {exc}"
                    else:
                        delegated[part.first_node] = (part, call)
                        record["runs_on"] = part.provider
                        record["reason"] = "delegated"
            if record["runs_on"] == providers_mod.CPU:
                if self._without_cpu_version(part):
                    raise UnsupportedOperator(
                        f"partition {index} ({part.provider}) was built without its CPU version (minirt build "
                        f"--no-cpu-fallback), and this session cannot give it to {part.provider}: "
                        f"{record['reason']}; build without --no-cpu-fallback to run it elsewhere")
                providers_mod.log_info(
                    "minirt: partition %d (%d nodes) runs on the CPU: %s", index, part.node_count, record["reason"]
                )
            self._assignments.append(record)
        return delegated

    def _without_cpu_version(self, part) -> bool:
        """Whether a partition's nodes are the stand-in of a thin artifact (minirt/kernels/delegated.py)."""
        graph = self._artifact.graphs[part.graph]
        ops = self._artifact.operators
        return any(ops[n.op_index].op_type == DELEGATED_PARTITION and ops[n.op_index].domain == MINIRT_DOMAIN
                   for n in graph.nodes[part.first_node:part.first_node + part.node_count])

    def get_partitions(self) -> list[dict]:
        """Per partition: its provider, node count, where it runs in this session and why."""
        return [dict(r) for r in self._assignments]

    # --- introspection, as in onnxruntime ---------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        return list(self._overridable)

    def get_providers(self) -> list[str]:
        """The session's providers in priority order (the CPU last), as onnxruntime reports them: its
        spelling (``CPUExecutionProvider``), and only those available on this device."""
        return [providers_mod.ort_spelling(p) for p in self._providers
                if p == providers_mod.CPU or providers_mod.availability(p)[0]]

    def _from_onnx(self, source: Any, opt_level: int) -> Any:
        from minirt import onnx_in

        artifact, self.built_from = onnx_in.build_cached(source, opt_level)
        return artifact

    def get_modelmeta(self) -> ModelMetadata:
        return ModelMetadata(self._artifact.metadata)

    @property
    def artifact(self) -> reader.Artifact:
        """The decoded artifact (graphs, tensors, metadata, sections)."""
        return self._artifact

    @property
    def metadata(self) -> dict:
        return dict(self._artifact.metadata)

    # --- running ---------------------------------------------------------------
    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], run_options: Any = None) -> list[np.ndarray]:
        """Run the model; returns one array per requested output (all outputs for None).

        ``run_options`` (``minirt.RunOptions`` or onnxruntime's): its ``terminate`` flag, set from
        another thread, stops the run before its next node (``RunTerminated``, onnxruntime's ``Fail``).
        Such runs take the loop that checks it; runs without options pay nothing for it."""
        shortcut = self._shortcut
        if shortcut is not None and output_names is None and run_options is None and type(input_feed) is dict:
            if self._mapped_file is not None:  # (the shortcut skips _run, which checks every other path)
                self._check_file()
            if self._pinned is not None:  # (the shortcut skips _run, which checks every other path)
                self._check_pinned(input_feed)
            results = shortcut.run(input_feed)
            if results is not None:
                return results
        if run_options is None:
            return self._run(output_names, input_feed, profile=None)
        return self._run(output_names, input_feed, None, run_options)

    def _check_file(self) -> None:
        """Refuse to run on a mapped file that changed since it was loaded (``map_file``): its weights
        would be other numbers, or pages past its new end (a signal, not an error)."""
        how = self._mapped_file.changed()
        if how is not None:
            raise FileChanged(
                f"{self._mapped_file.path} {how}: this session maps that file (map_file), so it no longer runs; "
                f"create the session again.  To replace a model under running sessions, use `minirt install NEW "
                f"LIVE` (an atomic rename: loaded sessions keep the old file), or load with map_file=False")

    def run_profiled(self, input_feed: Mapping[str, Any]) -> tuple[list[np.ndarray], dict]:
        """Run once, timing every node.

        Returns ``(outputs, profile)`` where ``profile`` has ``total_s`` (wall
        time of the run), ``kernel_s`` (time inside kernels), ``nodes`` (a list
        of ``(node name, op_type, seconds)``) and ``overhead_per_node_s``: the
        run's time outside kernels divided by the node count, i.e. what the
        Python plan costs per node.
        """
        profile: dict = {}
        outputs = self._run(None, input_feed, profile=profile)
        return outputs, profile

    # --- onnxruntime's other run and session methods (docs/ort_compat.md) ---------------------------
    def run_with_ort_values(self, output_names: Sequence[str] | None, input_dict_ort_values: Mapping[str, Any],
                            run_options: Any = None) -> list:
        """``run`` on ``OrtValue`` inputs, returning ``OrtValue`` outputs (minirt.ort_compat.OrtValue)."""
        from minirt.ort_compat import OrtValue, unwrap

        feed = {k: unwrap(v) for k, v in input_dict_ort_values.items()}
        return [OrtValue(r) for r in self._run(output_names, feed, None, run_options)]

    def run_async(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], callback: Any,
                  user_data: Any, run_options: Any = None) -> None:
        """onnxruntime's ``run_async``: run on a new thread, then ``callback(outputs, user_data, err)``
        with ``err`` "" on success, else the error's message and ``outputs`` None."""
        def work() -> None:
            try:
                outputs = self._run(output_names, input_feed, None, run_options)
            except Exception as exc:  # noqa: BLE001 - reported to the callback, as onnxruntime does
                callback(None, user_data, f"{type(exc).__name__}: {exc}")
            else:
                callback(outputs, user_data, "")

        import threading

        threading.Thread(target=work, name="minirt-run-async", daemon=True).start()

    def io_binding(self) -> Any:
        """An ``IOBinding`` for this session (minirt.ort_compat.IOBinding)."""
        from minirt.ort_compat import IOBinding

        return IOBinding(self)

    def run_with_iobinding(self, iobinding: Any, run_options: Any = None) -> None:
        """Run on ``iobinding``'s bound inputs; results land in its bound output buffers or its outputs."""
        iobinding._run(run_options)

    def get_session_options(self) -> Any:
        """The session options given (a default ``SessionOptions`` when none were)."""
        if self._sess_options is None:
            from minirt.ort_compat import SessionOptions

            self._sess_options = SessionOptions()
        return self._sess_options

    def get_provider_options(self) -> dict:
        """{provider (onnxruntime's spelling): its options as strings}, as onnxruntime reports them."""
        return {providers_mod.ort_spelling(p): dict(self._provider_options.get(p, {})) for p in self._providers
                if p == providers_mod.CPU or providers_mod.availability(p)[0]}

    def set_providers(self, providers: Sequence | None = None, provider_options: Sequence[dict] | None = None) -> None:
        """Choose the providers again (warning about and skipping unknown / unavailable ones) and
        recompile the plan: the per-partition choice, memory plans and native programs start afresh."""
        if providers is None:
            providers = [providers_mod.CPU]
        self._providers, self._provider_options = _normalise_providers(providers, provider_options, True)
        self._assignments = []
        self._plan = Plan(self._artifact, 0, None, self._delegate_partitions(0))
        with self._mplans_lock:
            self._mplans.clear()
            self._sightings.clear()
            self._last_mplan = None
        self._mplan_any = self._wants_memory_plans()
        self._make_declared_plan()
        self._known_feed = None
        self._shortcut = None

    def disable_fallback(self) -> None:
        """Recorded only: minirt has no session-wide retry on the CPU to disable; a partition whose
        provider fails at load always runs its CPU version (get_partitions says which and why)."""
        self._fallback = False

    def enable_fallback(self) -> None:
        self._fallback = True

    def get_profiling_start_time_ns(self) -> int:
        return self._profiling["start_ns"] if self._profiling is not None else 0

    def end_profiling(self) -> str:
        """Write the profile of the runs since the session started (``SessionOptions.enable_profiling``)
        and return the file's name, ``{profile_file_prefix}_{date}_{time}.json``: a JSON list of
        chrome-trace "X" events as onnxruntime writes them (``cat`` "Session" per run, "Node" per node
        with ``args.op_name`` and ``args.provider``; ``ts``/``dur`` in microseconds from the session's
        start).  Returns "" when profiling is off, as onnxruntime does."""
        prof = self._profiling
        if prof is None:
            return ""
        import json

        name = f"{prof['prefix']}_{time.strftime('%Y-%m-%d_%H-%M-%S')}.json"
        with open(name, "w") as f:
            json.dump(prof["events"], f)
        prof["events"] = []
        return name

    def _run_recording_profile(self, output_names, input_feed, cancel, buffers) -> list:
        """A run of a profiling session: timed per node, appended to the events end_profiling writes.
        A node's ``ts`` is its run's start plus the kernel times before it (nodes laid end to end)."""
        prof = self._profiling
        profile: dict = {}
        start_us = (time.time_ns() - prof["start_ns"]) // 1000
        results = self._run(output_names, input_feed, profile, cancel)
        if buffers is not None:
            results = [_write_into(b, r, n) if b is not None else r for b, r, n in zip(buffers, results, output_names)]
        pid, tid = os.getpid(), _thread.get_ident()
        ts = start_us
        events = prof["events"]
        for node, op_type, seconds in profile["nodes"]:
            dur = int(seconds * 1e6)
            events.append({"cat": "Node", "pid": pid, "tid": tid, "dur": dur, "ts": ts, "ph": "X",
                           "name": f"{node}_kernel_time",
                           "args": {"op_name": op_type, "provider": providers_mod.ort_spelling(providers_mod.CPU)}})
            ts += dur
        events.append({"cat": "Session", "pid": pid, "tid": tid, "dur": int(profile["total_s"] * 1e6), "ts": start_us,
                       "ph": "X", "name": "model_run", "args": {}})
        return results

    def _run_into(self, output_names: Sequence[str], input_feed: Mapping[str, Any], buffers: list,
                  cancel: Any) -> list:
        """A run whose outputs go into the caller's arrays ``buffers`` (IOBinding; None: allocated).

        The node that computes a bound output, when its kernel takes ``out=``, writes straight into the
        caller's array (no copy); otherwise (a view op, a kernel without ``out=``, a buffer that does
        not fit the result exactly, the ``out=`` contract) the result is copied into it once.  Such runs
        take the memory plan of their input shapes, as plain runs do, and a native program of their own
        (D123): recorded on an arena without one, replayed while the caller binds the same output
        buffers (a KV cache updated in place through its past input must be that input's memory)."""
        if type(input_feed) is not dict and not isinstance(input_feed, Mapping):
            raise InvalidArgument(f"input feed must be a dict of input name -> array, got {type(input_feed).__name__}")
        out_slots = []
        for name in output_names:
            if name not in self._output_slot:
                raise InvalidArgument(f"unknown output name {name!r}; the model's outputs are {list(self._output_slot)}")
            out_slots.append(self._output_slot[name])
        steps = self._plan.steps
        env = self._plan.new_env()
        sig = self._bind_known_feed(env, input_feed)
        if sig is None:
            self._bind_inputs(env, input_feed)
            sig = self._signature(input_feed)
        aplan = arena = record = None
        if self.memory_plan and self._mplan_any:
            aplan, record = self._memory_plan_for(sig)
        if aplan is not None:
            arena = aplan.checkout()
        try:
            bound = _program.bound_key(out_slots, buffers, {id(env[v]) for v in self._plan.graph.inputs})
            program = arena.bound_programs.get(bound) if arena is not None else None
            if (type(program) is _program.Program and cancel is None and self.native_program
                    and program.usable(self.threads, bound)):
                results = self._replay_into(program, env, out_slots, buffers, output_names)
                if results is not None:
                    return results
            outs = list(arena.outs) if arena is not None else [None] * len(steps)
            producer = {v: i for i, st in enumerate(steps) if st.accepts_out for v in st.outs if v >= 0}
            several = {v: (i, j) for i, st in enumerate(steps) if st.accepts_outs for j, v in enumerate(st.outs)
                       if v >= 0}
            for slot, buf in zip(out_slots, buffers):
                if buf is not None and slot in producer:
                    outs[producer[slot]] = buf
                elif buf is not None and slot in several:  # (a tuple per step: a buffer or None per output)
                    i, j = several[slot]
                    bound_outs = list(outs[i]) if type(outs[i]) is tuple else [None] * len(steps[i].outs)
                    bound_outs[j] = buf
                    outs[i] = tuple(bound_outs)
            _native.set_threads(self.threads)
            _blas.set_threads(1 if _native.available else self.threads)
            # Record this binding's native program (D123) on its second run on this arena (the first one
            # only marks it: each new generator's prefill would pay a recording that is never replayed); a
            # decode step of minirt.genai (same shapes and bound KV cache every token) then replays from C.
            recording = (arena is not None and record is None and cancel is None and self.native_program
                         and not plan_mod.MEMPLAN_CHECK and (program is _ONCE or type(program) is _program.Program
                                                              and not program.usable(self.threads, bound)))
            if program is None and arena is not None and record is None:
                arena.keep_bound_program(bound, _ONCE)
            with _limits.limit(self.max_tensor_bytes):
                if recording:
                    arena.keep_bound_program(bound, self._plan.record_program(env, arena, self.threads, outs=outs,
                                                                              bound=bound))
                else:
                    self._plan._execute_planned(env, outs, record, None, cancel=cancel)
            if record is not None:
                # (bound runs plan on their first run, as before sightings: a generator's prefill and decode
                # steps keep the plans and programs the next generator of the same length reuses)
                self._store_memory_plan(sig, record, aplan, sighted=True)
            # (a recording's outputs made outside the arena are buffers its program keeps: all copied)
            copy_outputs = self._all_outputs if recording else aplan.copy_outputs if aplan is not None else ()
            results = []
            for slot, buf, name in zip(out_slots, buffers, output_names):
                if buf is None:
                    results.extend(self._collect([slot], env, input_feed, copy_outputs))
                elif env[slot] is buf:
                    results.append(buf)  # written in place by its node
                else:
                    results.append(_write_into(buf, env[slot], name))
        finally:
            if arena is not None:
                aplan.checkin(arena)
        return results

    def _replay_into(self, program: "_program.Program", env: list, out_slots, buffers, output_names) -> list | None:
        """An IOBinding run as its native program (D123), or None when the nodes must run: an input the
        program cannot take (not C-contiguous, data a kernel rejects), or a bound output that the
        program's calls update in place through an input (a KV cache) bound to another buffer than that
        input this time."""
        aliases = program.aliases
        for slot, buf in zip(out_slots, buffers):
            if buf is not None and slot in aliases and env[aliases[slot]] is not buf:
                return None  # (bound to an input, program.bound_key: the one the program updates in place)
        results = self._plan.replay(program, env, ())
        if results is None:
            return None
        results = []
        for slot, buf, name in zip(out_slots, buffers, output_names):
            a = env[aliases[slot]] if slot in aliases else program.outputs[slot]
            if buf is None:
                results.append(a.copy())  # (the program's buffers serve its next run)
            elif a is buf:
                results.append(buf)
            else:
                results.append(_write_into(buf, a, name))
        return results

    def _run(self, output_names, input_feed, profile: dict | None, cancel: Any = None,
             buffers: list | None = None) -> list[np.ndarray]:
        """The general run.  ``cancel``: run options whose ``terminate`` is read before each node (None:
        the plain loop).  ``buffers``: per requested output, a caller's array to write it into (None
        for one the run allocates); the result list then holds those arrays."""
        if cancel is not None and type(cancel) is not Cancellation:  # (its timeout counts from here)
            cancel = Cancellation(cancel)
            try:
                with cancel.watched():  # (the native kernels stop early too: plan.Cancellation)
                    results = self._run(output_names, input_feed, profile, cancel, buffers)
            except RunTerminated:
                cancel.check()  # (its own message: terminated, or the timeout's)
                raise
            cancel.check()  # a kernel it stopped early left its result incomplete: never returned
            return results
        if self._mapped_file is not None:
            self._check_file()
        if self._pinned is not None:  # (every entry but run's shortcut comes here: IOBinding, profiling)
            self._check_pinned(input_feed)
        if self._profiling is not None and profile is None:
            return self._run_recording_profile(output_names, input_feed, cancel, buffers)
        if buffers is not None:
            if profile is not None:
                results = self._run(output_names, input_feed, profile, cancel)
                return [_write_into(buf, r, name) if buf is not None else r
                        for buf, r, name in zip(buffers, results, output_names)]
            return self._run_into(output_names, input_feed, buffers, cancel)
        if cancel is not None:
            cancel.check()
        t_start = time.perf_counter() if profile is not None else 0.0
        if type(input_feed) is not dict and not isinstance(input_feed, Mapping):  # (the ABC check costs more)
            raise InvalidArgument(f"input feed must be a dict of input name -> array, got {type(input_feed).__name__}")
        if output_names is None:
            out_slots = self._artifact.main_graph.outputs
        else:
            if isinstance(output_names, str):
                raise InvalidArgument("output_names must be a list of names or None, not a single string")
            out_slots = []
            for name in output_names:
                if name not in self._output_slot:
                    raise InvalidArgument(f"unknown output name {name!r}; the model's outputs are {list(self._output_slot)}")
                out_slots.append(self._output_slot[name])
        env = self._plan.new_env()
        sig = self._bind_known_feed(env, input_feed)
        if sig is None:
            self._bind_inputs(env, input_feed)
            sig = self._signature(input_feed)
        aplan, record, arena = None, None, None
        if self.memory_plan and self._mplan_any:
            aplan, record = self._memory_plan_for(sig)
            if aplan is not None:
                arena = aplan.checkout()
                program = arena.program
                if (type(program) is _program.Program and profile is None and self.native_program
                        and program.usable(self.threads)):
                    try:  # (before the thread settings below: the recorded calls carry their thread count)
                        results = self._plan.replay(program, env, out_slots)
                    except BaseException:
                        aplan.checkin(arena)
                        raise
                    if results is not None:
                        aplan.checkin(arena)
                        known = self._known_feed
                        if output_names is None and known is not None and known[1] is sig:
                            self._shortcut = ReplayShortcut(self, known[0], aplan)
                        return results
        # Threads: native kernels take the count per Python thread.  BLAS (process-wide, cached) is
        # single-threaded when the native kernels run: they do every float product (1-3-row ones
        # on the native gemv, D54), BLAS only numpy's leftovers (Einsum, other dtypes), and
        # OpenBLAS's busy-waiting workers stall every kernel after them on a loaded machine (D28).
        # Without the native kernels BLAS is the only parallelism: it follows `threads` (None: its
        # own default).
        _native.set_threads(self.threads)
        _blas.set_threads(1 if _native.available else self.threads)
        try:
            recordable = arena is not None and profile is None and self.native_program and not plan_mod.MEMPLAN_CHECK
            # Record the program on this run: on an arena without one (or one made under another ISA /
            # thread count); or, on the run that records the declared plan's results, when it is the
            # warm-up's (D90: the caller's first run then replays; a caller's first run records no
            # program, which would cost it more than it saves the second, D82).
            if recordable and (self._warming_up if record is not None else (
                    arena.program is None
                    or type(arena.program) is _program.Program and not arena.program.usable(self.threads))):
                with _limits.limit(self.max_tensor_bytes):
                    program = self._plan.record_program(env, arena, self.threads, record)
                if record is not None:
                    self._store_memory_plan(sig, record, aplan)
                    if type(program) is not _program.Program or self._mplans.get(sig) is not aplan:
                        # kept only on the plan it was recorded on; a refusal on the warm-up is not final
                        # (a kernel's first call may do work its later ones do not: a first packing)
                        program = None
                arena.program = program
                # every output copied: those the memory plan would not copy (made outside the arena)
                # are buffers the program keeps and writes on every replay
                return self._collect(out_slots, env, input_feed, self._all_outputs)
            with _limits.limit(self.max_tensor_bytes):  # memory guard, per run (a contextvar: thread-safe)
                if cancel is not None:  # (run options given: the loop that reads their terminate flag)
                    nodes = [] if profile is not None else None
                    self._plan.execute_cancellable(env, arena, record, cancel, nodes)
                elif profile is None:
                    self._plan.execute(env, arena, record)
                else:
                    nodes = self._plan.execute_profiled(env, arena, record)
            if record is not None:
                self._store_memory_plan(sig, record, aplan)
            copy_outputs = aplan.copy_outputs if aplan is not None else ()
            results = self._collect(out_slots, env, input_feed, copy_outputs)
        finally:
            if arena is not None:
                aplan.checkin(arena)
        if profile is not None:
            total = time.perf_counter() - t_start
            kernel = sum(t for _, _, t in nodes)
            profile.update(
                total_s=total,
                kernel_s=kernel,
                nodes=nodes,
                overhead_per_node_s=(total - kernel) / max(len(nodes), 1),
            )
        return results

    # --- static memory plan (D17) -------------------------------------------------
    _MAX_MEMORY_PLANS = 4  # shape signatures kept (LRU)
    _MAX_MEMORY_PLAN_EVICTIONS = 32  # past this many evictions, new signatures run unplanned
    _MAX_SIGHTINGS = 32  # signatures seen once whose recorded results are kept (LRU)

    _STATIC_SIGNATURE = frozenset()  # the one signature of a model whose inputs all have fixed shapes

    def _signature(self, feed: Mapping) -> frozenset | None:
        if self._static_inputs:
            return self._STATIC_SIGNATURE
        try:
            return frozenset((k, a.shape, a.dtype) for k, a in feed.items())
        except AttributeError:  # a container (sequence/optional) input: not planned
            return None

    def _memory_plan_for(self, sig: frozenset | None) -> tuple:
        """(plan for this run's signature or None, record list when this run should record one)."""
        if sig is None:
            return None, None
        if sig is self._STATIC_SIGNATURE:
            # the only signature, never evicted: no LRU order to keep (a dict read is atomic)
            aplan = self._mplans.get(sig, _NOT_RECORDED)
            if aplan is not _NOT_RECORDED:
                return aplan, None
        last = self._last_mplan
        if last is not None and last[0] is sig:  # (the known feed's own signature object: the steady state)
            return last[1], None  # (already the most recently used)
        with self._mplans_lock:
            if sig in self._mplans:
                self._mplans.move_to_end(sig)
                self._last_mplan = (sig, self._mplans[sig])
                return self._mplans[sig], None
            if self._mplan_evictions >= self._MAX_MEMORY_PLAN_EVICTIONS:
                return None, None  # shapes change too often for plans to pay: plain allocation
            seen = self._sightings.pop(sig, None)
        if seen is not None:
            # the second run of these shapes: their plan now, from what the first one recorded (a plan costs
            # ~1-3 ms, which a shape that never comes back, a text crop of its own width, would not repay)
            self._store_memory_plan(sig, seen, sighted=True)
            with self._mplans_lock:
                if sig in self._mplans:
                    self._last_mplan = (sig, self._mplans[sig])
                    return self._mplans[sig], None
            return None, None
        record = [None] * len(self._plan.steps)
        if sig is self._STATIC_SIGNATURE:
            return self._declared_plan, record
        return None, record

    def _make_declared_plan(self) -> None:
        """With fixed input shapes, the memory plan of the declared shapes and its first arena, made with
        the session (and its plan) rather than on the first run, which uses them (ArenaPlan and the
        arena's bound calls: ~1.5 ms of a 150-node CNN's first run, D82).  ``_declared_plan`` is
        _NOT_RECORDED when the session has no such plan to make (memory plan off, nothing to place,
        inputs not all fixed); None when the declared shapes give none."""
        self._declared_plan = _NOT_RECORDED
        if self.memory_plan and self._mplan_any and self._static_inputs:
            self._declared_plan = self._declared_memory_plan()
            if self._declared_plan is not None:
                try:
                    self._declared_plan.checkin(self._declared_plan.checkout())
                except ResourceError:  # (its arena cannot be had: runs then plan from what they record)
                    self._declared_plan = None

    def _declared_memory_plan(self) -> "arena.ArenaPlan | None":
        """The memory plan of the shapes the graph declares (fixed input shapes), for the run that records
        the real ones; None when they are not all declared or nothing is placed.

        That first run then writes into one arena instead of a fresh allocation per result: in a new
        process every fresh page is a page fault (PP-OCR det: ~4,900 fewer on its first run, ~7 ms of
        its cold start; D57).  A kernel uses a buffer only when it fits its result exactly
        (the ``out=`` contract, minirt.kernels.registry), so a declared shape that is wrong costs that
        node a fresh array, never a wrong result; and the run records the real shapes, which replace
        the declared plan unless they are the same.  The declared shapes come from the file, not from
        arrays a kernel made: a plan whose arena the memory guard would refuse to a tensor
        (``max_tensor_bytes``) is not made (the run then allocates and records as before)."""
        results = self._plan.declared_results()
        if results is None or any(
                r is not None and math.prod(r[0]) * r[1].itemsize > self.max_tensor_bytes for r in results):
            return None
        aplan = arena.ArenaPlan(self._plan, results)
        return aplan if (aplan.placed or self._empty_arena_program()) and aplan.size <= self.max_tensor_bytes else None

    def _wants_memory_plans(self) -> bool:
        """Whether runs take memory plans: a step can write into a buffer placed for it, or the graph is one
        of those whose kernels place nothing but replay as a native program on an empty arena
        (:data:`_EMPTY_ARENA_OPS`: a tree ensemble's one node, votes and finish, D125)."""
        steps = self._plan.steps
        return any(st.accepts_out for st in steps) or self._empty_arena_program()

    def _empty_arena_program(self) -> bool:
        steps = self._plan.steps
        return (self.native_program and bool(steps)
                and all(st.op.op_type in _EMPTY_ARENA_OPS and not st.subgraphs for st in steps))

    def _store_memory_plan(self, sig: frozenset, record: list, declared: "arena.ArenaPlan | None" = None,
                           sighted: bool = False) -> None:
        """Keep the memory plan of ``record`` (the run's results) for ``sig``: ``declared`` (the plan that
        run used, made from the declared shapes) when it was made from the same results.  A run without a
        declared plan only keeps ``record`` (a sighting); its plan is made when the signature comes again
        (``sighted``, _memory_plan_for).  That holds for fixed input shapes too (D166): their declared plan
        is missing only where shapes follow the data (a detector's NonZero / TopK chains), and SSDlite's
        plan (517 buffers, 16-19 ms with its check) was then a third of its first run."""
        if not sighted and declared is None:
            with self._mplans_lock:
                if sig not in self._mplans:
                    self._sightings[sig] = record
                    self._sightings.move_to_end(sig)
                    while len(self._sightings) > self._MAX_SIGHTINGS:
                        self._sightings.popitem(last=False)
            return
        if declared is not None and declared.results == record:
            aplan = declared
        else:
            aplan = arena.ArenaPlan(self._plan, record)
            if not aplan.placed and not self._empty_arena_program():  # (nothing placed: kept for its program)
                aplan = None
        with self._mplans_lock:
            if sig in self._mplans:
                return
            self._mplans[sig] = aplan
            self._last_mplan = None  # (now the most recently used: the shortcut holds only for that one)
            while len(self._mplans) > self._MAX_MEMORY_PLANS:
                self._mplans.popitem(last=False)
                self._mplan_evictions += 1

    def memory_plans(self) -> list[dict]:
        """The cached memory plans, least recently used first: input shapes, arena bytes, buffers placed,
        the sum of their sizes, how many arenas (concurrent runs) were allocated, and the native program
        of an idle arena (D32): ``"N native calls"``, why there is none, or None before one was recorded."""
        with self._mplans_lock:
            items = list(self._mplans.items())
        out = []
        for sig, p in items:
            if sig is self._STATIC_SIGNATURE:  # fixed input shapes: the model's own
                info = {"inputs": {a.name: tuple(a.shape) for a in self._inputs}}
            else:
                info = {"inputs": {k: tuple(shape) for k, shape, _ in sorted(sig, key=lambda t: t[0])}}
            if p is None:
                info.update(arena_bytes=0, buffers=0, buffer_bytes=0, arenas=0, native_program=None)
            else:
                info.update(arena_bytes=p.size, buffers=len(p.buffers), buffer_bytes=sum(b[2] for b in p.buffers),
                            arenas=p.arenas, native_program=p.program_summary())
            out.append(info)
        return out

    def _observe_values(self, observer) -> None:
        """Call ``observer(name, array)`` with every node result of every later run, and with the formal
        inputs of every If / Loop / Scan body run, subgraphs included: what the builder's calibration
        reads (D95).  A planned run or a replay never holds its values one by one, so only a session
        made with ``memory_plan=False`` observes; ``None`` stops it.  Not a public API."""
        if self.memory_plan:
            raise ValueError("observing values needs a session made with memory_plan=False")
        for plan in (self._plan, *self._plan.subgraph_plans()):
            plan.observer = observer

    def native_program_status(self) -> str:
        """How this session's runs have run so far, in one line (``minirt bench``, benchmarks/run.py):
        "yes (N native calls)" when they replay one native program (D32); "partly: ..." when the main
        graph has no memory plan but If / Loop / Scan bodies replay their own programs (D76: a model whose
        whole body sits in an If, with dynamic input shapes); else "no: " and why (the node that stopped
        the recording, or that there is no memory plan)."""
        def replayed(summaries) -> str | None:  # the first "N native calls" among them
            return next((s for s in summaries if arena.replays(s)), None)

        summaries = [p["native_program"] for p in self.memory_plans()]
        done = replayed(summaries)
        if done:
            return f"yes ({done})"
        why = next((s for s in summaries if s), None)
        if why:
            return f"no: {why}"
        if summaries:
            return "no: no program recorded (no static memory plan)"
        bodies = {name: calls for name, programs in self.subgraph_programs().items()
                  if (calls := replayed(programs)) is not None}
        if not bodies:
            return "no: no memory plan (shapes not fixed)"
        ops = ", ".join(st.op.op_type for st in self._plan.steps)
        replayed = "; ".join(f"{name!r}: {calls}" for name, calls in bodies.items())
        return (f"partly: {len(bodies)} subgraph(s) replay one native program each ({replayed}); the main graph's "
                f"{len(self._plan.steps)} node(s) ({ops}) run from Python, without a memory plan")

    def subgraph_programs(self) -> dict:
        """Per If / Loop / Scan body (graph name): the native program of each input signature it ran
        with (D76): "N native calls", why there is none, or None (not recorded yet, or nothing placed)."""
        return {sub.graph.name: sub.memory.summary() for sub in self._plan.subgraph_plans() if sub.memory is not None}

    def _collect(self, out_slots, env, feed, copy_outputs) -> list:
        results = []
        graph = self._artifact.main_graph
        for v in out_slots:
            r = env[v]
            if graph.values[v].kind != S.VALUE_TENSOR:
                results.append(_copy_container(r))
                continue
            if r is None:
                raise KernelError(f"output {graph.values[v].name!r} was not produced by any node")
            if not isinstance(r, np.ndarray):
                r = np.asarray(r)
            elif (v not in self._produced or v in copy_outputs or not r.flags.writeable
                  or _shares_memory_with_any(r, feed.values())):
                # Inputs, initializers (views of the mapped file) and kernel
                # results that alias them (Identity, Reshape views) must not
                # leak out as buffers shared with the caller or the file; nor
                # may views of the memory plan's arena.
                r = r.copy()
            results.append(r)
        return results

    def _check_pinned(self, feed: Mapping[str, Any]) -> None:
        """Refuse a feed whose value for a pinned input (``--input-value``) is not the one the graph was
        specialised for: nothing reads that input any more, so another value would be silently ignored."""
        if not isinstance(feed, Mapping):
            return  # (the binding reports a feed that is not a mapping)
        for name, want in self._pinned.items():
            got = feed.get(name)
            if got is None:
                continue  # (the binding reports a missing input)
            arr = np.asarray(got)
            # (pinned values are a few scalars: compared as Python lists, which costs a microsecond where
            # np.array_equal's first call in a process cost 0.1 ms, most of a small model's first run)
            if arr.size != want.size or arr.reshape(-1).tolist() != want.reshape(-1).tolist():
                shown = arr.reshape(-1)[:8].tolist()
                reason = self._pin_reasons.get(name)
                if reason is not None:
                    raise InvalidArgument(
                        f"input {name!r}: this artifact was built for {name} = {want.reshape(-1).tolist()}, got "
                        f"{shown}{' ...' if arr.size > 8 else ''}: the builder pinned it ({reason}); the source "
                        f"model runs other values of {name} only with other input shapes")
                raise InvalidArgument(
                    f"input {name!r}: this artifact was built for {name} = {want.reshape(-1).tolist()} "
                    f"(--input-value {name}=...), got {shown}{' ...' if arr.size > 8 else ''}; build the model "
                    f"again without --input-value {name} to feed other values")

    def _bind_known_feed(self, env: list, feed: Mapping[str, Any]) -> frozenset | None:
        """Bind ``feed`` when it has the layout of the last feed :meth:`_bind_inputs` accepted (the same
        names, numpy arrays of the same dtypes and shapes: the steady state), one comparison per input;
        returns its memory-plan signature.  None otherwise: :meth:`_bind_inputs` then checks and binds
        everything, and says what is wrong."""
        known = self._known_feed
        if known is None or len(feed) != len(known[0]):
            return None
        for name, slot, dtype, shape in known[0]:
            arr = feed.get(name)
            if type(arr) is not np.ndarray or arr.shape != shape or arr.dtype != dtype:
                return None
            env[slot] = arr
        return known[1]

    def _bind_inputs(self, env: list, feed: Mapping[str, Any]) -> None:
        graph = self._artifact.main_graph
        symbols: dict[str, tuple[int, str]] = {}
        for name, value in feed.items():
            slot = self._input_slot.get(name)
            if slot is None:
                raise InvalidArgument(
                    f"unknown input name {name!r}; the model's inputs are {[a.name for a in self._inputs]}"
                )
            info = graph.values[slot]
            if info.kind != S.VALUE_TENSOR:
                env[slot] = _bind_container(name, info, value)
                continue
            expected = ONNX_TO_NUMPY.get(info.dtype) if info.dtype else None
            arr = value if isinstance(value, np.ndarray) else _as_array(name, value, expected)
            if info.dtype:
                if expected is not None and arr.dtype != expected and not (info.dtype == 8 and arr.dtype.kind in "OUS"):
                    raise InvalidArgument(
                        f"input {name!r}: expected dtype tensor({onnx_type_name(info.dtype)}) ({expected}), "
                        f"got {arr.dtype} with shape {list(arr.shape)}"
                    )
            if info.shape is not None:
                if arr.ndim != len(info.shape):
                    raise InvalidArgument(
                        f"input {name!r}: expected rank {len(info.shape)} with shape {_fmt_shape(info.shape)}, "
                        f"got rank {arr.ndim} with shape {list(arr.shape)}"
                    )
                for axis, (want, got) in enumerate(zip(info.shape, arr.shape)):
                    if isinstance(want, int) and want != got:
                        raise InvalidArgument(
                            f"input {name!r}: dimension {axis} must be {want} (expected shape {_fmt_shape(info.shape)}), "
                            f"got shape {list(arr.shape)}"
                        )
                    if isinstance(want, str):
                        seen = symbols.get(want)
                        if seen is None:
                            symbols[want] = (got, f"{name!r} dimension {axis}")
                        elif seen[0] != got:
                            raise InvalidArgument(
                                f"input {name!r}: dimension {axis} is symbol {want!r} = {got}, but {seen[1]} "
                                f"set {want!r} = {seen[0]}"
                            )
            env[slot] = arr
        missing = [n for n in self._required if n not in feed]
        if missing:
            raise InvalidArgument(
                f"missing input(s) {missing}; the model requires {[(a.name, a.type, a.shape) for a in self._inputs]}"
            )
        if all(type(v) is np.ndarray and graph.values[self._input_slot[k]].kind == S.VALUE_TENSOR
               for k, v in feed.items()):
            layout = tuple((k, self._input_slot[k], v.dtype, v.shape) for k, v in feed.items())
            self._known_feed = (layout, self._signature(feed))  # one assignment: atomic for concurrent runs


def _pinned_values(entry: Any) -> tuple[dict, dict]:
    """The ``pinned_inputs`` metadata (name -> dtype, shape, values, and a reason when the builder pinned the
    input itself) as (name -> array, name -> reason); FormatError if malformed."""
    try:
        return ({str(name): np.array(v["values"], dtype=np.dtype(v["dtype"])).reshape(v["shape"])
                 for name, v in entry.items()},
                {str(name): str(v["reason"]) for name, v in entry.items() if "reason" in v})
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise FormatError(f"metadata 'pinned_inputs' is malformed ({exc}); rebuild the artifact") from None


def _shares_memory_with_any(r: np.ndarray, values: Iterable) -> bool:
    """Whether ``r`` may share memory with one of the arrays among ``values``."""
    for a in values:
        if isinstance(a, np.ndarray) and np.may_share_memory(r, a):
            return True
    return False


def _bind_container(name: str, info: reader.ValueInfo, value: Any) -> Any:
    """Check a sequence (list of arrays), optional (None or value) or map (dict, list of dicts) input."""
    if info.kind in S.MAP_KINDS:
        return _bind_map_input(name, info, value)
    optional = info.kind in (S.VALUE_OPTIONAL, S.VALUE_OPTIONAL_SEQUENCE)
    if value is None:
        if optional:
            return None
        raise InvalidArgument(f"input {name!r}: got None, but it is a {_node_arg(info).type}, not an optional")
    if info.kind in (S.VALUE_SEQUENCE, S.VALUE_OPTIONAL_SEQUENCE):
        if not isinstance(value, (list, tuple)):
            raise InvalidArgument(
                f"input {name!r}: expected a list of arrays ({_node_arg(info).type}), got {type(value).__name__}"
            )
        items = [v if isinstance(v, np.ndarray) else _as_array(f"{name}[{i}]", v) for i, v in enumerate(value)]
    else:
        items = [value if isinstance(value, np.ndarray) else _as_array(name, value)]
    expected = ONNX_TO_NUMPY.get(info.dtype) if info.dtype else None
    for i, arr in enumerate(items):
        if expected is not None and arr.dtype != expected:
            raise InvalidArgument(
                f"input {name!r}: element {i} has dtype {arr.dtype}, expected {expected} ({_node_arg(info).type})"
            )
    return items if info.kind in (S.VALUE_SEQUENCE, S.VALUE_OPTIONAL_SEQUENCE) else items[0]


def _bind_map_input(name: str, info: reader.ValueInfo, value: Any) -> Any:
    """A map input (a dict, as onnxruntime takes it) or a sequence of maps (a list of dicts), checked
    and normalised: keys to Python int or str as the declared key type says, values to the declared
    value type.  Wrong kinds of keys or values are refused naming the input, the entry and the types."""
    arg_type = _node_arg(info).type
    string_keys = info.kind in (S.VALUE_MAP_STRING, S.VALUE_SEQUENCE_MAP_STRING)
    expected = ONNX_TO_NUMPY.get(info.dtype) if info.dtype else None

    def one(m: Any, where: str) -> dict:
        if not isinstance(m, Mapping):
            raise InvalidArgument(f"input {where}: expected a dict ({arg_type}), got {type(m).__name__}")
        out = {}
        for k, v in m.items():
            if string_keys:
                if not isinstance(k, str):
                    raise InvalidArgument(f"input {where}: key {k!r} is {type(k).__name__}; {arg_type} needs str keys")
            else:
                if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
                    raise InvalidArgument(f"input {where}: key {k!r} is {type(k).__name__}; {arg_type} needs int keys")
                k = int(k)
            if info.dtype == 8:
                if not isinstance(v, str):
                    raise InvalidArgument(f"input {where}: value {v!r} of key {k!r} is {type(v).__name__}; "
                                          f"{arg_type} needs str values")
            elif isinstance(v, (str, bytes)) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise InvalidArgument(f"input {where}: value {v!r} of key {k!r} is {type(v).__name__}; "
                                      f"{arg_type} needs numbers")
            elif expected is not None and expected.kind in "iu" and not float(v).is_integer():
                raise InvalidArgument(f"input {where}: value {v!r} of key {k!r} is not an integer ({arg_type})")
            out[k] = v if expected is None or info.dtype == 8 else expected.type(v).item()
        return out

    if info.kind in (S.VALUE_MAP_INT64, S.VALUE_MAP_STRING):
        return one(value, repr(name))
    if not isinstance(value, (list, tuple)):
        raise InvalidArgument(f"input {name!r}: expected a list of dicts ({arg_type}), got {type(value).__name__}")
    return [one(m, f"{name!r}[{i}]") for i, m in enumerate(value)]


def _copy_container(value: Any) -> Any:
    """An output sequence/optional, with arrays copied so none aliases internal state (maps are the
    kernels' fresh dicts of Python numbers: returned as they are)."""
    if value is None:
        return None
    if isinstance(value, dict) or (isinstance(value, list) and value and isinstance(value[0], dict)):
        return value
    if isinstance(value, (list, tuple)):
        return [np.array(v, copy=True) for v in value]
    return np.array(value, copy=True)


def _as_array(name: str, value: Any, expected: Any = None) -> np.ndarray:
    """A feed value that is not an array (a Python list, a scalar, an OrtValue) as an array.  As
    onnxruntime does, a list takes the input's declared dtype when numpy's own reading of it
    converts to that dtype within its kind (float64 -> float32, int64 -> float32 or int32); a float
    list for an integer input stays float64 and fails the dtype check, naming both."""
    if type(value).__name__ == "OrtValue" and hasattr(value, "numpy"):
        value = value.numpy()
    try:
        arr = np.asarray(value)
    except Exception as exc:  # noqa: BLE001 - anything numpy refuses is the caller's input error
        raise InvalidArgument(f"input {name!r}: cannot convert {type(value).__name__} to an array ({exc})") from None
    if (expected is not None and arr.dtype != expected and arr.dtype.kind in "biuf"
            and np.can_cast(arr.dtype, expected, "same_kind")):
        arr = arr.astype(expected)
    return arr


# Ops of the graphs that take memory plans with nothing to place, for their native program alone (D125): the
# tree ensembles (their votes and outputs are two recordable native calls) and the view ops around them.
# (Other graphs without a placed buffer keep running their nodes: their kernels' recordable paths were
# never replayed from an empty arena; enabling every graph failed 140 tests, Clip / LSTM / GRU among them.)
_EMPTY_ARENA_OPS = frozenset({"FlatTreeEnsemble", "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze"})

# An IOBinding run's binding seen once on an arena: the next run with it records its program (_run_into).
_ONCE = "binding seen once: its next run records the program"


def _write_into(buffer: np.ndarray, result: Any, name: str) -> np.ndarray:
    """Copy output ``name`` into the caller's ``buffer`` (IOBinding), which must fit it exactly."""
    if not isinstance(result, np.ndarray) or result.shape != buffer.shape or result.dtype != buffer.dtype:
        got = f"{result.dtype}{list(result.shape)}" if isinstance(result, np.ndarray) else type(result).__name__
        raise InvalidArgument(f"output {name!r}: the bound buffer is {buffer.dtype}{list(buffer.shape)}, "
                              f"the result is {got}")
    np.copyto(buffer, result)
    return buffer


def _fmt_shape(shape: Iterable) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


InferenceSession = Session
