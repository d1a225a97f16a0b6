"""genai_config.json: the model folder's description, as onnxruntime-genai reads it (``og.Config``).

Only what a decoder-only text model needs is interpreted (model type, token ids, context length,
the decoder's file, input/output names and session options, the default search options); the rest
is kept and ignored.  Errors name the file and the key.
"""
from __future__ import annotations

import copy
import json
import os
from typing import Any

from minirt.errors import Error, NoSuchFile

CONFIG_NAME = "genai_config.json"

# The search options onnxruntime-genai knows (genai_config.json "search" and set_search_options), with
# onnxruntime-genai's defaults.  Options marked below as not implemented are accepted with their
# default value only.
SEARCH_DEFAULTS: dict[str, Any] = {
    "batch_size": 1,
    "chunk_size": 0,
    "diversity_penalty": 0.0,
    "do_sample": False,
    "early_stopping": True,
    "length_penalty": 1.0,
    "max_length": 0,  # 0: the model's context_length
    "min_length": 0,
    "no_repeat_ngram_size": 0,
    "num_beams": 1,
    "num_return_sequences": 1,
    "past_present_share_buffer": True,
    "random_seed": -1,
    "repetition_penalty": 1.0,
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
}


class GenAIError(Error, RuntimeError):
    """A generation-layer error (minirt.genai).  A RuntimeError, as onnxruntime-genai raises."""


class ConfigError(GenAIError, ValueError):
    """genai_config.json is missing, unreadable or describes something minirt.genai cannot run."""


class MissingConfig(ConfigError, NoSuchFile):
    """The model folder has no genai_config.json (or the folder does not exist)."""


def _merge(base: dict, over: dict) -> dict:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = copy.deepcopy(v)
    return base


class Config:
    """onnxruntime-genai's ``Config``: a model folder's genai_config.json, with overlays.

    ``Config(path)``: ``path`` is the model folder (or the genai_config.json file itself).
    Providers other than the CPU are refused (minirt.genai runs minirt's CPU kernels)."""

    def __init__(self, path: str | os.PathLike):
        path = os.fspath(path)
        if os.path.isfile(path) and os.path.basename(path) == CONFIG_NAME:
            path = os.path.dirname(path) or "."
        if not os.path.isdir(path):
            raise MissingConfig(f"{path}: no such model folder (expected a folder with {CONFIG_NAME}, model.onnx "
                                f"and the tokenizer files)")
        file = os.path.join(path, CONFIG_NAME)
        if not os.path.isfile(file):
            raise MissingConfig(f"{path}: no {CONFIG_NAME} in this folder; minirt.genai reads onnxruntime-genai's "
                                f"model folders (genai_config.json + model.onnx + tokenizer.json), as written by "
                                f"`python -m onnxruntime_genai.models.builder`")
        try:
            with open(file, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{file}: cannot read it as JSON ({exc})") from None
        if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
            raise ConfigError(f"{file}: no \"model\" object")
        self.path = os.path.abspath(path)
        self.file = file
        self.data = data
        self._providers: list[str] = []

    @classmethod
    def from_dict(cls, data: dict, folder: str) -> "Config":
        """A config that is not read from a file (a lone .mrt artifact: inferred from the model)."""
        self = cls.__new__(cls)
        self.path = os.path.abspath(folder)
        self.file = None
        self.data = data
        self._providers = []
        return self

    # --- onnxruntime-genai's Config methods ------------------------------------------------------
    def clear_providers(self) -> None:
        self._providers = []

    def append_provider(self, provider: str) -> None:
        if str(provider).lower() not in ("cpu", "cpuexecutionprovider"):
            raise GenAIError(f"provider {provider!r}: minirt.genai runs on the CPU only (minirt's kernels)")
        self._providers.append("cpu")

    def set_provider_option(self, provider: str, key: str, value: str) -> None:
        """Accepted and ignored (provider options of the CPU: none apply to minirt)."""

    def set_decoder_provider_options_hardware_device_type(self, *args: Any) -> None:
        """Accepted and ignored."""

    def overlay(self, json_text: str) -> None:
        """Merge a JSON object into the config (onnxruntime-genai's ``Config.overlay``)."""
        try:
            over = json.loads(json_text)
        except ValueError as exc:
            raise ConfigError(f"Config.overlay: not JSON ({exc})") from None
        if not isinstance(over, dict):
            raise ConfigError("Config.overlay: expected a JSON object")
        _merge(self.data, over)

    # --- what minirt.genai reads -----------------------------------------------------------------
    @property
    def where(self) -> str:
        return self.file or self.path

    @property
    def model(self) -> dict:
        return self.data["model"]

    @property
    def decoder(self) -> dict:
        d = self.model.get("decoder")
        if not isinstance(d, dict):
            raise ConfigError(f"{self.where}: no \"model.decoder\" object (minirt.genai runs decoder-only models)")
        return d

    def search(self) -> dict:
        """The search defaults: onnxruntime-genai's, overridden by the config's "search" object."""
        out = dict(SEARCH_DEFAULTS)
        for k, v in (self.data.get("search") or {}).items():
            if k in out:
                out[k] = v
        if not out["max_length"]:
            out["max_length"] = self.context_length
        return out

    @property
    def context_length(self) -> int:
        n = self.model.get("context_length")
        if not isinstance(n, int) or n <= 0:
            raise ConfigError(f"{self.where}: model.context_length must be a positive integer, got {n!r}")
        return n

    @property
    def eos_token_ids(self) -> list[int]:
        e = self.model.get("eos_token_id", [])
        ids = [e] if isinstance(e, int) else list(e or [])
        if not all(isinstance(i, int) for i in ids):
            raise ConfigError(f"{self.where}: model.eos_token_id must be an integer or a list of them, got {e!r}")
        return ids

    @property
    def pad_token_id(self) -> int:
        p = self.model.get("pad_token_id")
        if isinstance(p, list):
            p = p[0] if p else None
        if p is None:
            ids = self.eos_token_ids
            p = ids[0] if ids else 0
        return int(p)

    @property
    def bos_token_id(self) -> int | None:
        b = self.model.get("bos_token_id")
        return int(b) if isinstance(b, int) else None

    @property
    def vocab_size(self) -> int | None:
        v = self.model.get("vocab_size")
        return int(v) if isinstance(v, int) else None

    @property
    def model_type(self) -> str:
        return str(self.model.get("type", "decoder"))

    def decoder_file(self) -> str:
        name = self.decoder.get("filename")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{self.where}: model.decoder.filename is missing")
        return os.path.join(self.path, name)

    def threads(self) -> int | None:
        so = self.decoder.get("session_options") or {}
        n = so.get("intra_op_num_threads")
        try:
            n = int(n) if n is not None else 0
        except (TypeError, ValueError):
            raise ConfigError(f"{self.where}: session_options.intra_op_num_threads must be an integer, "
                              f"got {n!r}") from None
        return n if n > 0 else None
