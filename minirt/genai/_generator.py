"""``GeneratorParams`` and ``Generator``: onnxruntime-genai's generation loop on a minirt session.

The loop is onnxruntime-genai's: ``append_tokens`` runs the model on the new tokens at once (the
prompt's prefill) and keeps the last position's logits; ``generate_next_token`` chooses a token from
those logits (minirt/genai/_search.py) and appends it; the next ``generate_next_token`` first runs the
model on that token (one decode step).  ``is_done`` is true once every sequence produced an EOS id
(``model.eos_token_id`` of genai_config.json; the EOS is returned by ``get_next_tokens`` and, as in
onnxruntime-genai, not appended to the sequence when it ends the last running sequence) or reached
``max_length`` tokens (prompt included).

KV cache.  With onnxruntime-genai's shared buffer (GroupQueryAttention models: genai_config's
``past_present_share_buffer``), each layer's key and value cache is one array of shape
``(batch, kv_heads, max_length, head_size)`` allocated when the Generator is created and never again:
memory is bounded by ``max_length``.  Every run binds it (minirt IOBinding) both as the input
``past_key_values.{i}.key`` and as the output ``present.{i}.key``; the attention kernel writes the
new positions into it in place.  The attention mask is then onnxruntime-genai's static one where the
graph allows it (``DecoderIO.static_mask``): ``(1, max_length)``, ones over the sequence's tokens, so
that every decode step has the same input shapes and the session replays it as one native program
(docs/decisions.md D123).  Models whose cache grows by Concat (torch exports) get their ``present.*``
outputs fed back as the next run's ``past_key_values.*``.

Batches (``batch_size`` > 1) run row by row on views of those arrays, each sequence with its own
length, so padding never enters a computation; leading pad ids of a padded prompt are dropped.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from minirt.genai import _search
from minirt.genai._config import SEARCH_DEFAULTS, GenAIError

_INT_OPTIONS = {"batch_size", "chunk_size", "max_length", "min_length", "no_repeat_ngram_size", "num_beams",
                "num_return_sequences", "random_seed", "top_k"}
_BOOL_OPTIONS = {"do_sample", "early_stopping", "past_present_share_buffer"}


class InvalidSearchOption(GenAIError, ValueError):
    """An unknown search option, or a value out of its range."""


class GeneratorParams:
    """onnxruntime-genai's ``GeneratorParams``: the search options of one generation."""

    def __init__(self, model: Any):
        self.model = model
        self.search = model.config.search()

    @staticmethod
    def _check_known(options: dict, where: str) -> None:
        unknown = sorted(set(options) - set(SEARCH_DEFAULTS))
        if unknown:
            raise InvalidSearchOption(f"{where}: unknown search option(s) {unknown}; known: {sorted(SEARCH_DEFAULTS)}")

    def set_search_options(self, options: dict | None = None, **kwargs: Any) -> None:
        """``set_search_options(max_length=..., do_sample=..., top_k=..., top_p=..., temperature=...,
        repetition_penalty=..., min_length=..., random_seed=..., batch_size=...)`` (or one dict)."""
        given = dict(options or {}, **kwargs)
        self._check_known(given, "set_search_options")
        for k, v in given.items():
            if k in _BOOL_OPTIONS:
                if not isinstance(v, (bool, int, float, np.bool_)):
                    raise InvalidSearchOption(f"search option {k} must be a boolean, got {v!r}")
                v = bool(v)
            elif k in _INT_OPTIONS:
                if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or float(v) != int(v):
                    raise InvalidSearchOption(f"search option {k} must be an integer, got {v!r}")
                v = int(v)
            else:
                if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                    raise InvalidSearchOption(f"search option {k} must be a number, got {v!r}")
                v = float(v)
            self.search[k] = v

    def get_search_options(self) -> dict:
        return dict(self.search)

    def set_guidance(self, *args: Any, **kwargs: Any) -> None:
        raise GenAIError("constrained decoding (set_guidance) is not supported by minirt.genai")

    def try_graph_capture_with_max_batch_size(self, *args: Any) -> None:
        """Accepted and ignored (no graph capture on the CPU)."""

    def use_graph_capture(self, *args: Any) -> None:
        """Accepted and ignored."""

    def set_max_batch_size(self, *args: Any) -> None:
        """Accepted and ignored."""


def _validated(model: Any, s: dict) -> dict:
    ctx = model.config.context_length
    if s["max_length"] <= 0:
        raise InvalidSearchOption(f"max_length must be positive, got {s['max_length']}")
    if s["max_length"] > ctx:
        raise InvalidSearchOption(f"max_length ({s['max_length']}) cannot be greater than the model's context_length "
                                  f"({ctx})")
    if not 1 <= s["batch_size"] <= 32:
        raise InvalidSearchOption(f"batch_size ({s['batch_size']}) must be in [1, 32]")
    if s["num_beams"] != 1:
        raise InvalidSearchOption(f"num_beams={s['num_beams']}: beam search is not supported by minirt.genai "
                                  f"(greedy and sampling are)")
    if s["num_return_sequences"] != 1:
        raise InvalidSearchOption(f"num_return_sequences={s['num_return_sequences']}: only 1 is supported")
    if s["repetition_penalty"] <= 0:
        raise InvalidSearchOption(f"repetition_penalty must be positive, got {s['repetition_penalty']}")
    if s["min_length"] < 0:
        raise InvalidSearchOption(f"min_length must be >= 0, got {s['min_length']}")
    if s["do_sample"] and not _search.is_greedy(s):
        if not 0.0 <= s["top_p"] <= 1.0:
            raise InvalidSearchOption(f"top_p must be between 0.0 and 1.0, got {s['top_p']}")
        if s["top_k"] < 0:
            raise InvalidSearchOption(f"top_k must be 0 or greater, got {s['top_k']}")
        vocab = model.vocab_size
        if vocab is not None and s["top_k"] > vocab:
            raise InvalidSearchOption(f"top_k ({s['top_k']}) must be less than or equal to vocab_size ({vocab})")
        if s["temperature"] < 0:
            raise InvalidSearchOption(f"temperature must be >= 0, got {s['temperature']}")
    # (diversity_penalty, early_stopping, length_penalty: beam-search options, without effect here as in
    # onnxruntime-genai's greedy search)
    return s


class Generator:
    """onnxruntime-genai's ``Generator(model, params)`` (see the module docstring)."""

    def __init__(self, model: Any, params: GeneratorParams):
        if params.model is not model:
            raise GenAIError("Generator(model, params): params were made for another Model")
        self.model = model
        self.io = io = model.io
        self.opts = _validated(model, dict(params.search))
        self.batch = b = self.opts["batch_size"]
        self.max_length = n = self.opts["max_length"]
        seed = self.opts["random_seed"]
        self.rng = np.random.default_rng(None if seed < 0 else seed)
        self.eos = model.config.eos_token_ids
        vocab = model.vocab_size
        for e in self.eos:
            if vocab is not None and not 0 <= e < vocab:
                raise GenAIError(f"eos_token_id ({e}) must be in range [0, {vocab}) (vocab_size)")
        self.pad = model.config.pad_token_id
        self.sequences = np.zeros((b, n), np.int32)  # tokens of each row: [0, length[r])
        self.length = [0] * b
        self.kv_len = [0] * b  # positions of the cache that hold computed keys/values
        self.done = [False] * b  # EOS seen, or max_length reached
        self.next_tokens = np.full(b, self.pad, np.int32)
        self.logits: np.ndarray | None = None  # [batch, vocab] of the last positions, until chosen from
        self.last_outputs: list[dict] = [{} for _ in range(b)]
        self.session = model.session
        if io.share_buffer:
            from minirt.ort_compat import OrtValue

            # allocated once: never resized or replaced while this generator lives (a windowed layer's: its
            # window, a ring the attention writes position p at row p % window)
            shapes = [(b, io.kv_heads, io.windows.get(i, n), io.head_size) for i in range(len(io.layers))]
            self.kv_cache = [(np.zeros(shape, io.kv_dtype), np.zeros(shape, io.kv_dtype)) for shape in shapes]
            self.mask = np.zeros((1, n), io.mask_dtype) if io.static_mask else None  # (reused by every run)
            self.bindings = []
            self._bound: list[str] = []  # the bound outputs, in the order get_outputs() returns them
            for r in range(b):
                binding = self.session.io_binding()
                for (pk, pv, ok, ov), (k, v) in zip(io.layers, self.kv_cache):
                    kr, vr = k[r:r + 1], v[r:r + 1]  # (contiguous views of the row)
                    binding.bind_cpu_input(pk, kr)
                    binding.bind_cpu_input(pv, vr)
                    binding.bind_ortvalue_output(ok, OrtValue(kr))
                    binding.bind_ortvalue_output(ov, OrtValue(vr))
                binding.bind_output(io.logits)
                if not r:
                    self._bound = [name for layer in io.layers for name in layer[2:]] + [io.logits]
                self.bindings.append(binding)
        else:
            self.kv_cache = self.mask = None
            empty = np.zeros((1, io.kv_heads or 0, 0, io.head_size or 0), io.kv_dtype)
            self.past = [[(empty, empty) for _ in io.layers] for _ in range(b)]

    # --- running the model -----------------------------------------------------------------------
    def _run(self, r: int, tokens: np.ndarray) -> np.ndarray:
        """Run row ``r`` on ``tokens`` (after its kv_len cached positions); returns the last logits."""
        io = self.io
        past, cur = self.kv_len[r], len(tokens)
        total = past + cur
        feed = {io.input_ids: np.asarray(tokens, io.ids_dtype).reshape(1, cur)}
        if self.mask is not None:
            self.mask[0, :total] = 1
            self.mask[0, total:] = 0
            feed[io.attention_mask] = self.mask
        elif io.attention_mask:
            feed[io.attention_mask] = np.ones((1, total), io.mask_dtype)
        if io.position_ids:
            feed[io.position_ids] = np.arange(past, total, dtype=io.pos_dtype).reshape(1, cur)
        if io.scalars:
            feed.update(io.scalar_feed(past, cur))
        if self.kv_cache is not None:
            binding = self.bindings[r]
            for name, value in feed.items():
                binding.bind_cpu_input(name, value)
            self.session.run_with_iobinding(binding)
            outs = {name: v.numpy() for name, v in zip(self._bound, binding.get_outputs())}
        else:
            for (pk, pv, _, _), (k, v) in zip(io.layers, self.past[r]):
                feed[pk] = k
                feed[pv] = v
            names = [io.logits] + [n for layer in io.layers for n in layer[2:]]
            values = self.session.run(names, feed)
            outs = dict(zip(names, values))
            self.past[r] = [(outs[ok], outs[ov]) for (_, _, ok, ov) in io.layers]
        self.kv_len[r] = total
        self.last_outputs[r] = outs
        logits = outs[io.logits]
        if logits.ndim == 3:
            logits = logits[0, -1]
        elif logits.ndim == 2:
            logits = logits[-1]
        return np.array(logits, np.float32)

    def _compute_logits(self) -> None:
        vocab = None
        rows = []
        for r in range(self.batch):
            if self.done[r]:
                rows.append(None)
                continue
            start = min(self.kv_len[r], self.length[r] - 1)  # (after rewind_to: the last token again)
            if start < self.kv_len[r]:
                self._rewind_cache(r, start)
            rows.append(self._run(r, self.sequences[r, start:self.length[r]]))
            vocab = rows[-1].shape[-1]
        if vocab is None:
            raise GenAIError("no running sequence to compute logits for")
        self.logits = np.stack([x if x is not None else np.zeros(vocab, np.float32) for x in rows])

    def _rewind_cache(self, r: int, n: int) -> None:
        self.kv_len[r] = n
        if self.kv_cache is None:
            self.past[r] = [(k[:, :, :n], v[:, :, :n]) for k, v in self.past[r]]

    # --- onnxruntime-genai's API -------------------------------------------------------------------
    def append_tokens(self, tokens: Any) -> None:
        """Append tokens to every sequence and run the model on them (the prompt's prefill).  ``tokens``:
        a 1-D sequence (batch 1, or batch * n flattened), or a 2-D [batch, n] array (leading pad ids of
        a padded row are dropped)."""
        if hasattr(tokens, "as_numpy"):
            tokens = tokens.as_numpy()
        arr = np.asarray(tokens)
        if arr.size == 0:
            raise GenAIError("append_tokens: no tokens (input_ids is empty)")
        if arr.dtype.kind not in "iu":
            raise GenAIError(f"append_tokens: token ids must be integers, got {arr.dtype}")
        b = self.batch
        if arr.ndim == 1:
            if arr.size % b:
                raise GenAIError(f"append_tokens: {arr.size} tokens do not split into batch_size={b} rows")
            arr = arr.reshape(b, -1)
        if arr.ndim != 2 or arr.shape[0] != b:
            raise GenAIError(f"append_tokens: expected {b} row(s) of tokens (batch_size), got shape {arr.shape}")
        rows = []
        for r in range(b):
            row = arr[r]
            if b > 1:
                nz = np.flatnonzero(row != self.pad)
                row = row[nz[0]:] if nz.size else row[-1:]
            rows.append(row)
        if b > 1 and any(self.length):
            raise GenAIError("append_tokens can only be called once for batch_size > 1; call rewind_to(0) first")
        vocab = self.model.vocab_size
        for r, row in enumerate(rows):
            if self.length[r] + len(row) > self.max_length:
                raise GenAIError(f"input_ids size ({len(row)}) + current sequence length ({self.length[r]}) exceeds "
                                 f"max length ({self.max_length}): shorten the prompt or raise max_length "
                                 f"(set_search_options(max_length=...), at most context_length "
                                 f"{self.model.config.context_length})")
            if vocab is not None and (row.min() < 0 or row.max() >= vocab):
                raise GenAIError(f"append_tokens: token id {int(row.max() if row.max() >= vocab else row.min())} "
                                 f"is outside the vocabulary [0, {vocab})")
        logits = []
        for r, row in enumerate(rows):
            n0 = self.length[r]
            self.sequences[r, n0:n0 + len(row)] = row
            self.length[r] = n0 + len(row)
            self.done[r] = False
            start = min(self.kv_len[r], n0)
            if start < self.kv_len[r]:
                self._rewind_cache(r, start)
            logits.append(self._run(r, self.sequences[r, start:self.length[r]]))
        self.logits = np.stack(logits)

    def is_done(self) -> bool:
        if self.logits is not None:
            return False
        return all(self.done) or not any(self.length)

    def generate_next_token(self) -> None:
        if not any(self.length):
            raise GenAIError("generate_next_token called with no prior state: call append_tokens first")
        if self.logits is None:
            if all(self.done):
                raise GenAIError(f"generate_next_token called with sequence length already at max_length "
                                 f"({self.max_length}) or after EOS: check is_done()")
            self._compute_logits()
        opts = self.opts
        logits, self.logits = self.logits, None
        running = [r for r in range(self.batch) if not self.done[r]]
        for r in range(self.batch):
            if self.done[r]:
                self.next_tokens[r] = self.pad
                continue
            row = logits[r]
            seq = self.sequences[r, :self.length[r]]
            _search.apply_min_length(row, self.length[r], opts["min_length"], self.eos)
            _search.apply_repetition_penalty(row, seq, opts["repetition_penalty"])
            _search.apply_no_repeat_ngram(row, seq, opts["no_repeat_ngram_size"])
            self.next_tokens[r] = _search.choose(row, opts, self.rng)
        ended = [r for r in running if int(self.next_tokens[r]) in self.eos]
        all_ended = len(ended) == len(running)
        for r in running:
            if r in ended:
                self.done[r] = True
                if all_ended:
                    continue  # (onnxruntime-genai: the EOS that ends the search is not appended)
            self.sequences[r, self.length[r]] = self.next_tokens[r]
            self.length[r] += 1
            if self.length[r] >= self.max_length:
                self.done[r] = True

    def get_next_tokens(self) -> np.ndarray:
        return self.next_tokens.copy()

    def get_sequence(self, index: int) -> np.ndarray:
        if not 0 <= index < self.batch:
            raise GenAIError(f"get_sequence({index}): batch_size is {self.batch}")
        return self.sequences[index, :self.length[index]].copy()

    def token_count(self) -> int:
        return max(self.length)

    def get_logits(self) -> np.ndarray:
        """The logits the next token is chosen from, [batch, 1, vocab] (computed now if needed)."""
        if self.logits is None:
            self._compute_logits()
        return self.logits[:, None, :].copy()

    def set_logits(self, logits: Any) -> None:
        arr = np.asarray(logits, np.float32)
        self.logits = arr.reshape(self.batch, -1).copy()

    def get_output(self, name: str) -> np.ndarray:
        """Output ``name`` of the last run (of row 0; a KV cache output: the whole cache array)."""
        outs = self.last_outputs[0]
        if name not in outs:
            raise GenAIError(f"get_output({name!r}): the last run has outputs {sorted(outs)}")
        return outs[name]

    def rewind_to(self, new_length: int) -> None:
        """Shorten every sequence to ``new_length`` tokens (the cache keeps its first positions)."""
        if new_length < 0 or new_length > max(self.length):
            raise GenAIError(f"cannot rewind to a length ({new_length}) greater than the current sequence length "
                             f"({max(self.length)})")
        if self.batch > 1 and new_length != 0:
            raise GenAIError("rewind_to must be called with new_length=0 when batch_size > 1")
        window = min(self.io.windows.values(), default=None)
        if window is not None and new_length != 0 and max(self.kv_len) > window:
            raise GenAIError(f"rewind_to({new_length}): the model's windowed KV cache keeps the last {window} positions "
                             f"only, and {max(self.kv_len)} were computed (positions before the rewind point are gone); "
                             "rewind to 0 and append the tokens again")
        for r in range(self.batch):
            self.length[r] = min(self.length[r], new_length)
            if self.kv_len[r] > self.length[r]:
                self._rewind_cache(r, self.length[r])
            self.done[r] = self.length[r] >= self.max_length
        self.logits = None

    def set_runtime_option(self, key: str, value: str) -> None:
        """Accepted and ignored (onnxruntime-genai's terminate_session has no meaning here)."""

    def set_inputs(self, *args: Any) -> None:
        raise GenAIError("set_inputs is for multimodal models; use append_tokens for a text decoder")

    def set_model_input(self, name: str, value: Any) -> None:
        raise GenAIError(f"set_model_input({name!r}): extra model inputs are not supported by minirt.genai")
