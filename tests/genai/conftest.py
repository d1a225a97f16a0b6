"""Fixtures of the minirt.genai tests: small decoders of real architectures made locally
(tests/genai/make_decoders.py: transformers configs, random weights, a tokenizer trained on the
repository's docs; converted by onnxruntime-genai's model builder and by torch's exporter).

The models are made once per test session in a temporary folder (about 10 s), or kept in
``$MINIRT_GENAI_TEST_CACHE`` when that is set (then made once).  Each model folder also receives the
.mrt minirt.genai builds from it (``<folder>/.minirt/``)."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from tests.genai import make_decoders as md

NEEDED = ("onnxruntime_genai", "transformers", "torch", "tokenizers")


@pytest.fixture(scope="session")
def decoders(tmp_path_factory):
    """{(arch, kind): model folder} for every architecture of make_decoders and every kind."""
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (pip install -e '.[dev]')")
    cache = os.environ.get("MINIRT_GENAI_TEST_CACHE") or str(tmp_path_factory.mktemp("genai-models"))
    return md.make(cache, md.ARCHS, md.KINDS, size="tiny")


@pytest.fixture(scope="session")
def models(decoders):
    """get(arch, kind, lib="minirt"|"ort") -> a Model, each opened once per session."""
    import minirt.genai as mg

    opened: dict = {}

    def get(arch: str, kind: str = "fp32", lib: str = "minirt"):
        key = (arch, kind, lib)
        if key not in opened:
            path = decoders[(arch, kind)]
            if lib == "minirt":
                opened[key] = mg.Model(path)
            else:
                import onnxruntime_genai as og

                opened[key] = og.Model(path)
        return opened[key]

    return get


@pytest.fixture(scope="session")
def prompt(decoders):
    """A prompt of ~20 tokens (the models' own tokenizer), BOS first."""
    import minirt.genai as mg

    tok = mg.Tokenizer(decoders[("llama", "fp32")])
    ids = tok.encode("The builder checks an ONNX model and turns it into one compact artifact")
    assert 10 <= len(ids) <= 40
    return np.concatenate([[md.BOS_ID], ids]).astype(np.int32)


def lib_of(name: str):
    if name == "minirt":
        import minirt.genai as lib
    else:
        import onnxruntime_genai as lib
    return lib


def generate(lib, model, prompt, new: int | None = None, logits: bool = False, **options):
    """Run a generation loop as onnxruntime-genai's examples do; returns (new tokens, the logits each
    was chosen from (when asked), the generator).  ``new``: exactly that many tokens (max_length and
    min_length = prompt + new: EOS cannot stop it)."""
    params = lib.GeneratorParams(model)
    opts = dict(options)
    if new is not None:
        opts.setdefault("max_length", len(prompt) + new)
        opts.setdefault("min_length", len(prompt) + new)
    params.set_search_options(**opts)
    gen = lib.Generator(model, params)
    gen.append_tokens(np.asarray(prompt, np.int32))
    tokens, seen = [], []
    while not gen.is_done():
        if logits:
            seen.append(np.array(gen.get_logits()).reshape(-1).copy())
        gen.generate_next_token()
        tokens.append(int(gen.get_next_tokens()[0]))
    return tokens, seen, gen
