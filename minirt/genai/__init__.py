"""minirt.genai: text generation with onnxruntime-genai's Python API on minirt (issue 24).

``import minirt.genai as og`` in place of ``import onnxruntime_genai as og`` runs onnxruntime-genai's
generation scripts on minirt::

    import minirt.genai as og

    model = og.Model("phi3-mini-int4")           # genai_config.json + model.onnx (+ .data) + tokenizer
    tokenizer = og.Tokenizer(model)
    stream = tokenizer.create_stream()
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=256, do_sample=True, top_k=40, top_p=0.9, temperature=0.7)
    generator = og.Generator(model, params)
    generator.append_tokens(tokenizer.encode("What is the capital of France?"))
    while not generator.is_done():
        generator.generate_next_token()
        print(stream.decode(generator.get_next_tokens()[0]), end="", flush=True)

The model folder is onnxruntime-genai's (``python -m onnxruntime_genai.models.builder``) or any
decoder with ``past_key_values.*`` / ``present.*`` and a genai_config.json.  The .onnx is built once
into a .mrt artifact (minirt's builder; cached in ``<folder>/.minirt/``); a .mrt works directly.
Search: greedy, top-k, top-p, temperature, repetition penalty, min/max length, EOS ids.  The KV
cache is preallocated per layer ([batch, kv_heads, max_length, head_size]) at Generator creation.
See docs/genai.md.  Nothing here is imported by ``import minirt``; ``tokenizers`` and ``jinja2`` are
imported only when a tokenizer or a chat template is used.
"""
from __future__ import annotations

from minirt.genai._config import Config, ConfigError, GenAIError, MissingConfig
from minirt.genai._generator import Generator, GeneratorParams, InvalidSearchOption
from minirt.genai._model import Model
from minirt.genai._tokenizer import Tokenizer, TokenizerStream


class DeviceType:
    """onnxruntime-genai's device names (only the CPU runs here)."""

    CPU = "cpu"
    Auto = "cpu"


def is_cuda_available() -> bool:
    return False


def is_dml_available() -> bool:
    return False


def is_rocm_available() -> bool:
    return False


def is_qnn_available() -> bool:
    return False


def is_openvino_available() -> bool:
    return False


def is_webgpu_available() -> bool:
    return False


def set_log_options(**options) -> None:
    """Accepted and ignored (onnxruntime-genai's logging switches)."""


def set_log_callback(callback) -> None:
    """Accepted and ignored."""


def disable_telemetry_events() -> None:
    """Nothing to do: minirt sends no telemetry."""


def enable_telemetry_events() -> None:
    """Nothing to do: minirt sends no telemetry."""


def register_execution_provider_library(name: str, path: str) -> None:
    raise GenAIError(f"register_execution_provider_library({name!r}): minirt.genai runs minirt's CPU kernels only")


__all__ = [
    "Config", "ConfigError", "DeviceType", "GenAIError", "Generator", "GeneratorParams", "InvalidSearchOption",
    "MissingConfig", "Model", "Tokenizer", "TokenizerStream", "disable_telemetry_events", "enable_telemetry_events",
    "is_cuda_available", "is_dml_available", "is_openvino_available", "is_qnn_available", "is_rocm_available",
    "is_webgpu_available", "register_execution_provider_library", "set_log_callback", "set_log_options",
]
