"""``Tokenizer`` and ``TokenizerStream``: the model folder's tokenizer.json through the ``tokenizers``
package (the ``genai`` extra), imported when a Tokenizer is created, never by ``import minirt``.

* ``encode`` applies the tokenizer's own post-processor (a BOS where tokenizer.json adds one, as
  transformers' tokenizers do) and returns int32 ids; ``decode`` drops special tokens.
* ``create_stream().decode(token)`` returns the text a new token adds, and "" while a token ends
  inside a multi-byte character (byte-level BPE) so that streamed text is never garbled.
* ``apply_chat_template`` renders the chat template of tokenizer_config.json ("chat_template") or
  chat_template.jinja with jinja2 (imported only then), as transformers does.
"""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from minirt.genai._config import GenAIError


def _special(cfg: dict, key: str) -> str | None:
    v = cfg.get(key)
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


class Tokenizer:
    """onnxruntime-genai's ``Tokenizer(model)`` (also ``Tokenizer(folder)``)."""

    def __init__(self, model: Any):
        folder = model if isinstance(model, (str, os.PathLike)) else model.path
        folder = os.fspath(folder)
        file = os.path.join(folder, "tokenizer.json")
        if not os.path.isfile(file):
            raise GenAIError(f"{folder}: no tokenizer.json (minirt.genai reads Hugging Face fast-tokenizer files)")
        try:
            import tokenizers
        except ImportError as exc:
            raise GenAIError(f"the Tokenizer needs the `tokenizers` package: pip install 'minirt[genai]' ({exc})") from None
        self._tok = tokenizers.Tokenizer.from_file(file)
        self.folder = folder
        cfg = {}
        path = os.path.join(folder, "tokenizer_config.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                cfg = json.load(f)
        self.config = cfg
        self._model = None if isinstance(model, (str, os.PathLike)) else model
        self._chat_template = cfg.get("chat_template")
        jinja = os.path.join(folder, "chat_template.jinja")
        if not self._chat_template and os.path.isfile(jinja):
            with open(jinja, encoding="utf-8") as f:
                self._chat_template = f.read()
        specials = [t.content for t in self._tok.get_added_tokens_decoder().values() if t.special]
        self._special_ids = {self._tok.token_to_id(t) for t in specials} - {None}

    # --- token ids -------------------------------------------------------------------------------
    def _id_of(self, key: str) -> int | None:
        tok = _special(self.config, key)
        return self._tok.token_to_id(tok) if tok is not None else None

    @property
    def bos_token_id(self) -> int:
        if self._model is not None and self._model.config.bos_token_id is not None:
            return self._model.config.bos_token_id
        i = self._id_of("bos_token")
        return -1 if i is None else i

    @property
    def eos_token_ids(self) -> np.ndarray:
        if self._model is not None and self._model.config.eos_token_ids:
            return np.array(self._model.config.eos_token_ids, np.int32)
        i = self._id_of("eos_token")
        return np.array([] if i is None else [i], np.int32)

    @property
    def pad_token_id(self) -> int:
        if self._model is not None:
            return self._model.config.pad_token_id
        i = self._id_of("pad_token")
        return -1 if i is None else i

    def to_token_id(self, text: str) -> int:
        i = self._tok.token_to_id(text)
        if i is None:
            raise GenAIError(f"to_token_id({text!r}): not a token of this vocabulary")
        return i

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    # --- text <-> ids ----------------------------------------------------------------------------
    def encode(self, text: str) -> np.ndarray:
        if not isinstance(text, str):
            raise GenAIError(f"encode: expected a string, got {type(text).__name__}")
        return np.array(self._tok.encode(text, add_special_tokens=True).ids, np.int32)

    def encode_batch(self, texts: list[str]) -> np.ndarray:
        """[len(texts), longest] int32, shorter rows left-padded with the pad id."""
        rows = [self.encode(t) for t in texts]
        if not rows:
            raise GenAIError("encode_batch: no texts")
        width = max(len(r) for r in rows)
        out = np.full((len(rows), width), self.pad_token_id, np.int32)
        for i, r in enumerate(rows):
            out[i, width - len(r):] = r
        return out

    def decode(self, tokens: Any) -> str:
        ids = [int(t) for t in np.asarray(tokens).reshape(-1)]
        return self._tok.decode(ids, skip_special_tokens=True)

    def decode_batch(self, tokens: Any) -> list[str]:
        return [self.decode(row) for row in tokens]

    def create_stream(self) -> "TokenizerStream":
        return TokenizerStream(self)

    def update_options(self, **options: Any) -> None:
        """Accepted and ignored (onnxruntime-extensions' tokenizer options)."""

    # --- chat template ---------------------------------------------------------------------------
    def apply_chat_template(self, messages: Any, *, template_str: str | None = None, tools: Any = None,
                            add_generation_prompt: bool = True) -> str:
        """The prompt text of ``messages`` (a JSON string, as onnxruntime-genai takes, or a list of
        {"role", "content"} dicts) through the model's chat template (or ``template_str``)."""
        if isinstance(messages, str):
            try:
                messages = json.loads(messages)
            except ValueError as exc:
                raise GenAIError(f"apply_chat_template: messages is not JSON ({exc})") from None
        if isinstance(tools, str):
            tools = json.loads(tools) if tools.strip() else None
        template = template_str or self._chat_template
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        if not template:
            raise GenAIError(f"{self.folder}: the tokenizer has no chat template (tokenizer_config.json "
                             f"\"chat_template\" or chat_template.jinja); pass template_str")
        try:
            import jinja2
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as exc:
            raise GenAIError(f"apply_chat_template needs jinja2 (pip install jinja2): {exc}") from None

        def raise_exception(message: str):
            raise jinja2.exceptions.TemplateError(message)

        def strftime_now(fmt: str) -> str:
            import datetime

            return datetime.datetime.now().strftime(fmt)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
            x, indent=indent, ensure_ascii=ensure_ascii)
        env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
        specials = {k: _special(self.config, k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
        try:
            return env.from_string(template).render(messages=messages, tools=tools,
                                                    add_generation_prompt=add_generation_prompt,
                                                    **{k: v for k, v in specials.items() if v is not None})
        except jinja2.exceptions.TemplateError as exc:
            raise GenAIError(f"chat template: {exc}") from None


class TokenizerStream:
    """Incremental detokenization: ``decode(token)`` returns the text the token adds (see module)."""

    def __init__(self, tokenizer: Tokenizer):
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # ids[prefix:read] decode to text already returned ...
        self._read = 0  # ... and ids[read:] to what is pending

    def decode(self, token: Any) -> str:
        self._ids.append(int(token))
        prefix_text = self._tok.decode(self._ids[self._prefix:self._read])
        text = self._tok.decode(self._ids[self._prefix:])
        if len(text) > len(prefix_text) and not text.endswith("\ufffd"):
            new = text[len(prefix_text):]
            # the ids before the new prefix are never decoded again: dropped
            self._ids = self._ids[self._read:]
            self._prefix, self._read = 0, len(self._ids)
            return new
        return ""
