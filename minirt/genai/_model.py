"""``minirt.genai.Model``: a genai model folder opened as a minirt session.

The decoder file named by genai_config.json runs as a minirt artifact:

* ``decoder.filename`` is a ``.mrt`` (or the Model is given a ``.mrt`` path): opened as is;
* it is an ``.onnx``: a ``<stem>.mrt`` beside it that was built from this very file (its
  ``source.sha256`` metadata) is opened; otherwise the model is built once with minirt's builder
  (the ``builder`` extra) into ``<folder>/.minirt/<stem>-<key>.mrt`` (the key: the ONNX file's
  sha256, the size and mtime of its external data files and the builder's version), or into the
  user cache (``$MINIRT_CACHE_DIR`` ...) when the folder is read-only.  Later starts load it.

:class:`DecoderIO` reads the session's inputs and outputs: which of input_ids, attention_mask,
position_ids, the sequence-length scalars and the per-layer KV cache the model takes, the cache's
layout, and whether the cache is onnxruntime-genai's shared past/present buffer (GroupQueryAttention
reading ``past_key_values.{i}.*`` and writing ``present.{i}.*`` of the same, max-length shape) or a
cache that grows by one Concat per step (torch exports).
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any

import numpy as np

from minirt.format.reader import sha256_file
from minirt.genai._config import Config, ConfigError, GenAIError

_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(bfloat16)": None,
           "tensor(int64)": np.int64, "tensor(int32)": np.int32}


def _external_files(onnx_path: str) -> list[str]:
    """The files beside the model that look like its external data (``<name>.data``, ``*.onnx.data``, ...)."""
    folder = os.path.dirname(onnx_path) or "."
    base = os.path.basename(onnx_path)
    out = []
    for name in sorted(os.listdir(folder)):
        if name != base and (name.startswith(base) or name.endswith((".data", ".onnx_data", ".bin"))):
            p = os.path.join(folder, name)
            if os.path.isfile(p):
                out.append(p)
    return out


def _artifact_source_sha(path: str) -> str | None:
    from minirt.format import reader

    try:
        art = reader.load(path, verify_checksums=False)
    except Exception:  # noqa: BLE001 - an unreadable sibling is simply not used
        return None
    return art.metadata.get("source.sha256")


def resolve_artifact(onnx_path: str, log=None) -> str:
    """The .mrt to run for ``onnx_path`` (see the module docstring); builds it when needed."""
    say = log or (lambda msg: None)
    if not os.path.isfile(onnx_path):
        raise ConfigError(f"{onnx_path}: no such file (the decoder named by genai_config.json)")
    sha = sha256_file(onnx_path)
    sibling = os.path.splitext(onnx_path)[0] + ".mrt"
    if os.path.isfile(sibling) and _artifact_source_sha(sibling) == sha:
        return sibling
    try:
        from minirt import builder
        from minirt.onnx_in import _builder_fingerprint, cache_dir
    except ImportError as exc:
        raise GenAIError(
            f"{onnx_path} is an ONNX model and minirt's builder is not installed here ({exc}): build it where "
            f"the builder is (`pip install 'minirt[builder]'`) with `minirt build {onnx_path} -o {sibling}` and "
            f"copy the .mrt into the model folder (or name it in genai_config.json's decoder.filename)") from None
    key = hashlib.sha256(sha.encode())
    for p in _external_files(onnx_path):
        st = os.stat(p)
        key.update(f"{os.path.basename(p)}:{st.st_size}:{st.st_mtime_ns}".encode())
    key.update(_builder_fingerprint(builder).encode())
    # The float products' weights packed for this machine's native kernels (--weight-pack, D61): the
    # runtime then reads the packs mapped from the file and never the original weights, which it would
    # otherwise read once to pack them into memory of its own (fp32 decoders: both copies resident).
    from minirt import native

    pack = native.packed_panel_width() if native.available else 0
    key.update(f"weight_pack:{pack}".encode())
    stem = os.path.splitext(os.path.basename(onnx_path))[0]
    name = f"{stem}-{key.hexdigest()[:20]}.mrt"
    folders = [os.path.join(os.path.dirname(os.path.abspath(onnx_path)), ".minirt"),
               os.path.join(cache_dir(), "genai")]
    for folder in folders:
        if os.path.isfile(os.path.join(folder, name)):
            return os.path.join(folder, name)
    say(f"minirt.genai: building {onnx_path} into a .mrt artifact (once; kept in {folders[0]})")
    report = builder.build(onnx_path, None, weight_pack=pack)
    for folder in folders:
        try:
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(report.data)
                os.replace(tmp, os.path.join(folder, name))
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            continue  # read-only: the next place
        for old in os.listdir(folder):  # older builds of the same model: superseded
            if old.startswith(stem + "-") and old.endswith(".mrt") and old != name:
                try:
                    os.unlink(os.path.join(folder, old))
                except OSError:
                    pass
        return os.path.join(folder, name)
    raise GenAIError(f"cannot write the artifact built from {onnx_path} into any of {folders}")


class DecoderIO:
    """How to feed one decoder session: names, dtypes and the KV cache layout (see module docstring)."""

    def __init__(self, session: Any, config: Config):
        self.session = session
        where = config.where
        dec = config.decoder
        names_in = dict(dec.get("inputs") or {})
        names_out = dict(dec.get("outputs") or {})
        inputs = {a.name: a for a in session.get_inputs()}
        outputs = {a.name: a for a in session.get_outputs()}
        if "past_names" in names_in or "present_names" in names_out:
            raise ConfigError(f"{where}: a combined KV cache (past_names / present_names: key and value in one "
                              f"tensor) is not supported by minirt.genai; re-export with separate key/value caches")
        self.input_ids = names_in.get("input_ids", "input_ids")
        if self.input_ids not in inputs:
            raise ConfigError(f"{where}: the model has no input {self.input_ids!r} (its inputs: {sorted(inputs)}); "
                              f"input embeddings instead of token ids are not supported")
        self.ids_dtype = _dtype(inputs[self.input_ids], where)
        used = {self.input_ids}

        def optional(key: str, default: str) -> str | None:
            name = names_in.get(key, default)
            if name in inputs:
                used.add(name)
                return name
            return None

        self.attention_mask = optional("attention_mask", "attention_mask")
        self.position_ids = optional("position_ids", "position_ids")
        self.mask_dtype = _dtype(inputs[self.attention_mask], where) if self.attention_mask else None
        self.pos_dtype = _dtype(inputs[self.position_ids], where) if self.position_ids else None
        # scalar/vector sequence-length inputs some exports take instead of (or besides) the mask
        self.scalars = {}
        for key in ("seqlens_k", "total_sequence_length", "past_sequence_length", "current_sequence_length"):
            name = optional(key, key)
            if name is not None:
                self.scalars[key] = (name, _dtype(inputs[name], where))
        pk = names_in.get("past_key_names", "past_key_values.%d.key")
        pv = names_in.get("past_value_names", "past_key_values.%d.value")
        ok = names_out.get("present_key_names", "present.%d.key")
        ov = names_out.get("present_value_names", "present.%d.value")
        self.logits = names_out.get("logits", "logits")
        if self.logits not in outputs:
            raise ConfigError(f"{where}: the model has no output {self.logits!r} (its outputs: {sorted(outputs)})")
        layers = []
        i = 0
        while _fmt(pk, i) in inputs:
            names = (_fmt(pk, i), _fmt(pv, i), _fmt(ok, i), _fmt(ov, i))
            for n, table, what in ((names[1], inputs, "input"), (names[2], outputs, "output"),
                                   (names[3], outputs, "output")):
                if n not in table:
                    raise ConfigError(f"{where}: layer {i} has input {names[0]!r} but no {what} {n!r}")
            layers.append(names)
            used.update(names[:2])
            i += 1
        self.layers = layers
        unknown = sorted(set(inputs) - used)
        if unknown:
            raise ConfigError(f"{where}: the model's input(s) {unknown} are not ones minirt.genai knows how to feed "
                              f"(input_ids, attention_mask, position_ids, seqlens_k, total_sequence_length, "
                              f"past_sequence_length, current_sequence_length and the KV cache named by "
                              f"genai_config.json)")
        # The cache's geometry: the config, else the declared input shape.
        self.kv_heads = self.head_size = None
        self.kv_dtype = np.float32
        if layers:
            arg = inputs[layers[0][0]]
            self.kv_dtype = _dtype(arg, where)
            shape = arg.shape or []
            if len(shape) != 4:
                raise ConfigError(f"{where}: KV cache input {arg.name!r} has shape {shape}; expected 4-D "
                                  f"[batch, kv_heads, sequence, head_size]")
            self.kv_heads = dec.get("num_key_value_heads") if isinstance(shape[1], str) or shape[1] is None \
                else shape[1]
            self.head_size = dec.get("head_size") if isinstance(shape[3], str) or shape[3] is None else shape[3]
            if not isinstance(self.kv_heads, int) or not isinstance(self.head_size, int):
                kvh, head = _gqa_geometry(session)  # (a lone .mrt: GroupQueryAttention's attributes)
                self.kv_heads = self.kv_heads if isinstance(self.kv_heads, int) else kvh
                self.head_size = self.head_size if isinstance(self.head_size, int) else head
            if not isinstance(self.kv_heads, int) or not isinstance(self.head_size, int):
                raise ConfigError(f"{where}: cannot tell the KV cache's heads / head size (input shape {shape}; "
                                  f"decoder.num_key_value_heads / head_size in genai_config.json)")
        # Shared past/present buffer: every past input read by GroupQueryAttention (its present
        # output is then the same max-length buffer).  Else the cache grows by Concat: fed back.
        self.gqa = bool(layers) and _past_read_by_gqa(session, [n for l in layers for n in l[:2]])
        self.share_buffer = self.gqa and bool(config.search().get("past_present_share_buffer", True))
        # Layers whose cache is a ring of their local window (GroupQueryAttention sliding_window_cache=1, the
        # builder's default for Gemma 2's sliding-window layers): layer -> window, its cache that long.
        self.windows = _ring_windows(session, layers) if self.gqa else {}
        if self.windows and not self.share_buffer:
            raise ConfigError(f"{where}: layers {sorted(self.windows)} keep a windowed KV cache (sliding_window_cache), "
                              "which needs search.past_present_share_buffer true")
        # With the shared buffer, the mask may be onnxruntime-genai's static one: [batch, max_length], ones
        # over each sequence's tokens, zeros after.  Every decode step then has the same input shapes, so
        # it runs as one native program (D123).  Only when the graph reads the mask for lengths alone
        # (ReduceSum: the tokens, Shape: the buffer length), as genai's builder writes it.
        self.static_mask = bool(self.share_buffer and self.attention_mask
                                and _mask_read_for_lengths(session, self.attention_mask))

    def scalar_feed(self, past: int, cur: int) -> dict:
        """The sequence-length inputs of a run of ``cur`` tokens after ``past`` cached ones."""
        total = past + cur
        values = {"seqlens_k": np.array([total - 1]), "total_sequence_length": np.array(total),
                  "past_sequence_length": np.array(past), "current_sequence_length": np.array(cur)}
        return {name: values[key].astype(dt) for key, (name, dt) in self.scalars.items()}


def _fmt(pattern: str, i: int) -> str:
    return pattern % i if "%" in pattern else pattern.replace("{}", str(i))


def _dtype(arg: Any, where: str) -> Any:
    dt = _DTYPES.get(arg.type)
    if dt is None:
        raise ConfigError(f"{where}: input {arg.name!r} is {arg.type}, which minirt.genai does not feed")
    return dt


def _gqa_geometry(session: Any) -> tuple[int | None, int | None]:
    """(kv heads, head size) of the first GroupQueryAttention node: its attributes and the width of its
    query input (packed QKV when the key input is absent); (None, None) when not known."""
    art = session.artifact
    graph = art.main_graph
    for node in graph.nodes:
        if art.operators[node.op_index].op_type != "GroupQueryAttention":
            continue
        attrs = {k: a.value for k, a in node.attributes.items()}
        heads, kvh = attrs.get("num_heads"), attrs.get("kv_num_heads")
        shape = graph.values[node.inputs[0]].shape or ()
        width = shape[-1] if shape else None
        if not (isinstance(heads, int) and isinstance(kvh, int) and isinstance(width, int)):
            return None, None
        packed = len(node.inputs) < 2 or node.inputs[1] < 0
        return kvh, width // (heads + 2 * kvh if packed else heads)
    return None, None


def _past_read_by_gqa(session: Any, past_names: list[str]) -> bool:
    art = session.artifact
    graph = art.main_graph
    idx = {graph.values[v].name: v for v in graph.inputs}
    wanted = {idx[n] for n in past_names if n in idx}
    read = set()
    for node in graph.nodes:
        if art.operators[node.op_index].op_type == "GroupQueryAttention":
            read.update(v for v in node.inputs if v in wanted)
    return read == wanted


def _ring_windows(session: Any, layers: list) -> dict:
    """{layer: local window} of the layers whose GroupQueryAttention keeps its cache as a ring of the window
    (sliding_window_cache=1; minirt/kernels/decoder.py, _ring_attention)."""
    art = session.artifact
    graph = art.main_graph
    slot = {graph.values[v].name: v for v in graph.inputs}
    layer_of = {slot[names[0]]: i for i, names in enumerate(layers) if names[0] in slot}
    windows = {}
    for node in graph.nodes:
        if art.operators[node.op_index].op_type != "GroupQueryAttention" or len(node.inputs) < 4:
            continue
        attrs = {k: a.value for k, a in node.attributes.items()}
        if attrs.get("sliding_window_cache") and node.inputs[3] in layer_of:
            window = attrs.get("local_window_size")
            if not isinstance(window, int) or window <= 0:
                raise ConfigError(f"{node.name}: sliding_window_cache=1 without a local_window_size (got {window!r})")
            windows[layer_of[node.inputs[3]]] = window
    return windows


def _mask_read_for_lengths(session: Any, mask_name: str) -> bool:
    """Whether every node that reads the input ``mask_name`` is a ReduceSum or a Shape (genai's builder:
    seqlens_k = ReduceSum(mask) - 1, total_sequence_length = Shape(mask)[1], both for GroupQueryAttention)."""
    art = session.artifact
    graph = art.main_graph
    slot = next((v for v in graph.inputs if graph.values[v].name == mask_name), None)
    readers = [art.operators[n.op_index].op_type for n in graph.nodes if slot in n.inputs]
    return slot is not None and bool(readers) and all(op in ("ReduceSum", "Shape") for op in readers)


def _rotary_positions(session: Any) -> int | None:
    """Rows of the first GroupQueryAttention's cos cache (the positions the model was built for)."""
    art = session.artifact
    graph = art.main_graph
    tensors = dict(graph.initializers)
    for node in graph.nodes:
        if art.operators[node.op_index].op_type == "GroupQueryAttention" and len(node.inputs) > 7:
            t = tensors.get(node.inputs[7])
            if t is not None and art.tensors[t].dims:
                return int(art.tensors[t].dims[0])
    return None


def _special_ids(folder: str) -> dict:
    """bos / eos / pad token ids from the folder's tokenizer_config.json and tokenizer.json (read as
    JSON: no tokenizer package needed), where they are there."""
    import json

    try:
        with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        with open(os.path.join(folder, "tokenizer.json"), encoding="utf-8") as f:
            tok = json.load(f)
    except (OSError, ValueError):
        return {}
    ids = {t.get("content"): t.get("id") for t in tok.get("added_tokens", []) if isinstance(t, dict)}
    vocab = (tok.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        ids = {**vocab, **ids}
    out = {}
    for key in ("bos_token", "eos_token", "pad_token"):
        v = cfg.get(key)
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(ids.get(v), int):
            out[key + "_id"] = ids[v]
    return out


def _infer_config(session: Any, folder: str) -> dict:
    """A genai_config for a lone .mrt: onnxruntime-genai's builder's names, the context from the rotary
    cache (else 4096), the special tokens from tokenizer files beside it (else no EOS)."""
    inputs = [a.name for a in session.get_inputs()]
    outputs = {a.name: a for a in session.get_outputs()}
    pk = [n for n in inputs if n.startswith("past_key_values.") and n.endswith(".key")]
    logits = outputs.get("logits")
    vocab = logits.shape[-1] if logits is not None and logits.shape and isinstance(logits.shape[-1], int) else None
    ctx = _rotary_positions(session) or 4096
    special = _special_ids(folder)
    model = {"type": "decoder", "context_length": ctx, "vocab_size": vocab,
             "eos_token_id": [special["eos_token_id"]] if "eos_token_id" in special else [],
             "decoder": {"filename": "", "num_hidden_layers": len(pk)}}
    for key in ("bos_token_id", "pad_token_id"):
        if key in special:
            model[key] = special[key]
    return {"model": model, "search": {"max_length": ctx}}


class Model:
    """onnxruntime-genai's ``Model``: ``Model(folder)``, ``Model(Config)`` or ``Model(path.mrt)``.

    ``threads``: minirt's kernel threads (None: genai_config's session_options.intra_op_num_threads,
    else every CPU).  ``log``: a callable that receives progress messages (e.g. the one-off build)."""

    def __init__(self, config: Any, device: Any = None, *, threads: int | None = None, log=None):
        from minirt.session import Session

        artifact = None
        if isinstance(config, Config):
            cfg = config
        else:
            path = os.fspath(config)
            if os.path.isfile(path) and path.lower().endswith(".mrt"):
                artifact = path
                folder = os.path.dirname(os.path.abspath(path))
                cfg = Config(folder) if os.path.isfile(os.path.join(folder, "genai_config.json")) else None
            else:
                cfg = Config(path)
        if artifact is None:
            file = cfg.decoder_file()
            artifact = file if file.lower().endswith(".mrt") else resolve_artifact(file, log)
        if threads is None and cfg is not None:
            threads = cfg.threads()
        # (mapped, not copied: a decoder's weights are most of its memory, and with the float products'
        # weights packed in the file (resolve_artifact) the originals are never read, so never resident;
        # a file changed while mapped is refused by the session, D97)
        self.session = Session(artifact, threads=threads, map_file=True)
        if cfg is None:
            cfg = Config.from_dict(_infer_config(self.session, os.path.dirname(os.path.abspath(artifact))),
                                   os.path.dirname(os.path.abspath(artifact)))
        self.config = cfg
        self.artifact_path = artifact
        self.io = DecoderIO(self.session, cfg)
        vocab = cfg.vocab_size
        out = {a.name: a for a in self.session.get_outputs()}[self.io.logits]
        if vocab is None and out.shape and isinstance(out.shape[-1], int):
            vocab = out.shape[-1]
        self.vocab_size = vocab
        self.threads = threads

    @property
    def type(self) -> str:
        return self.config.model_type

    @property
    def device_type(self) -> str:
        return "CPU"

    @property
    def path(self) -> str:
        return self.config.path

    def create_multimodal_processor(self) -> Any:
        raise GenAIError("minirt.genai runs text-only decoders: no multimodal processor")

    def __repr__(self) -> str:
        return (f"minirt.genai.Model({self.path!r}, type={self.type!r}, layers={len(self.io.layers)}, "
                f"kv_cache={'shared past/present buffer' if self.io.share_buffer else 'fed back'})")

