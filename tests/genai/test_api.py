"""minirt.genai's API: search options, sampling, stop tokens, lengths, the KV cache, errors, tokenizer."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import minirt
import minirt.genai as mg
from tests.genai import make_decoders as md
from tests.genai.conftest import generate, lib_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --------------------------------------------------------------------------- sampling


def test_sampling_with_a_seed_is_reproducible(models, prompt):
    model = models("llama", "int4")
    opts = dict(do_sample=True, top_k=20, top_p=0.95, temperature=1.3)
    a, _, _ = generate(mg, model, prompt, 48, random_seed=7, **opts)
    b, _, _ = generate(mg, model, prompt, 48, random_seed=7, **opts)
    c, _, _ = generate(mg, model, prompt, 48, random_seed=8, **opts)
    assert a == b
    assert a != c


@pytest.mark.parametrize("top_k,top_p,temperature", [(5, 1.0, 1.0), (3, 1.0, 4.0), (0, 0.6, 1.0), (8, 0.5, 2.0)])
def test_sampling_draws_only_from_the_truncated_distribution(models, prompt, top_k, top_p, temperature):
    """Every token drawn is among the top_k largest logits and inside the top_p nucleus (of the
    temperature-scaled softmax, within the top-k when both are given) of the step it was drawn at."""
    model = models("qwen2", "fp32")
    tokens, logits, _ = generate(mg, model, prompt, 120, logits=True, do_sample=True, top_k=top_k, top_p=top_p,
                                 temperature=temperature, random_seed=3)
    distinct = set()
    for t, lg in zip(tokens, logits):
        order = np.argsort(-lg.astype(np.float64), kind="stable")
        allowed = order[:top_k] if top_k > 1 else order
        if 0 < top_p < 1:
            x = lg[allowed].astype(np.float64) / temperature
            p = np.exp(x - x.max())
            p /= p.sum()
            keep = int(np.searchsorted(np.cumsum(p), top_p) + 1)
            allowed = allowed[:keep]
        # (a logit equal to the last allowed one may take its place: ties at the boundary)
        assert t in set(allowed.tolist()) or lg[t] == lg[allowed[-1]], (t, allowed)
        distinct.add(t)
    assert len(distinct) > 3  # it does sample


def test_temperature_zero_or_top_k_one_is_greedy(models, prompt):
    model = models("phi3", "fp32")
    greedy, _, _ = generate(mg, model, prompt, 40)
    assert generate(mg, model, prompt, 40, do_sample=True, temperature=0.0, random_seed=1)[0] == greedy
    assert generate(mg, model, prompt, 40, do_sample=True, top_k=1, random_seed=1)[0] == greedy


@pytest.mark.parametrize("arch", ["llama", "gemma"])
def test_repetition_penalty_and_min_length_match_onnxruntime_genai(models, prompt, arch):
    """Deterministic logits processing (greedy): the same tokens as onnxruntime-genai."""
    opts = dict(repetition_penalty=1.5, max_length=len(prompt) + 64, min_length=len(prompt) + 32)
    ours, _, _ = generate(mg, models(arch, "fp32"), prompt, **opts)
    theirs, _, _ = generate(lib_of("ort"), models(arch, "fp32", "ort"), prompt, **opts)
    assert ours == theirs
    plain, _, _ = generate(mg, models(arch, "fp32"), prompt, 64)
    assert ours != plain  # the penalty changed something
    assert len(set(ours)) > len(set(plain))


# --------------------------------------------------------------------------- stop tokens and lengths


def _with_eos(folder: str, eos: list[int], tmp_path) -> str:
    """A copy of ``folder`` whose genai_config.json has these EOS ids (the built .mrt comes along: the
    copy keeps the files' times, so minirt.genai's cache key is the same)."""
    out = tmp_path / f"eos-{'-'.join(map(str, eos))}"
    if not out.exists():
        shutil.copytree(folder, out)
        cfg = json.loads((out / "genai_config.json").read_text())
        cfg["model"]["eos_token_id"] = eos
        (out / "genai_config.json").write_text(json.dumps(cfg))
    return str(out)


def _first_new(tokens, prompt, at_least: int) -> int:
    """A token that first appears at index >= at_least of ``tokens`` and not in the prompt."""
    return next(t for i, t in enumerate(tokens) if i >= at_least and t not in tokens[:i] and t not in prompt)


def test_stop_tokens_stop_like_onnxruntime_genai(decoders, prompt, tmp_path):
    folder = decoders[("llama", "fp32")]
    free, _, _ = generate(mg, mg.Model(_with_eos(folder, [511], tmp_path)), prompt, max_length=len(prompt) + 40)
    assert len(free) == 40
    stop = _first_new(free, prompt, 8)
    at = free.index(stop)
    for lib in (mg, lib_of("ort")):
        model = lib.Model(_with_eos(folder, [511, stop], tmp_path))  # (a list: any of them stops)
        tokens, _, gen = generate(lib, model, prompt, max_length=len(prompt) + 40)
        assert tokens == free[:at + 1], lib.__name__
        assert gen.is_done()
        # the EOS is returned by get_next_tokens but, ending the search, not appended to the sequence
        assert list(gen.get_sequence(0)) == list(prompt) + free[:at], lib.__name__


def test_min_length_holds_back_the_stop_token(decoders, prompt, tmp_path):
    folder = decoders[("llama", "fp32")]
    free, _, _ = generate(mg, mg.Model(_with_eos(folder, [511], tmp_path)), prompt, max_length=len(prompt) + 40)
    stop = _first_new(free, prompt, 5)
    model = mg.Model(_with_eos(folder, [stop], tmp_path))
    assert generate(mg, model, prompt, max_length=len(prompt) + 40)[0] == free[:free.index(stop) + 1]
    tokens, _, _ = generate(mg, model, prompt, max_length=len(prompt) + 40, min_length=len(prompt) + 30)
    assert len(tokens) >= 30 and stop not in tokens[:29]


def test_config_overlay(decoders):
    config = mg.Config(decoders[("llama", "fp32")])
    config.overlay(json.dumps({"search": {"max_length": 77, "top_k": 3}, "model": {"eos_token_id": [5, 6]}}))
    model = mg.Model(config)
    assert model.config.eos_token_ids == [5, 6]
    assert mg.GeneratorParams(model).get_search_options()["max_length"] == 77
    config.clear_providers()
    config.append_provider("cpu")
    with pytest.raises(mg.GenAIError, match="CPU only"):
        config.append_provider("cuda")


def test_max_length_bounds_the_sequence(models, prompt):
    model = models("gemma", "int4")
    for extra in (1, 9):
        tokens, _, gen = generate(mg, model, prompt, max_length=len(prompt) + extra, min_length=len(prompt) + extra)
        assert len(tokens) == extra and gen.token_count() == len(prompt) + extra and gen.is_done()
        with pytest.raises(mg.GenAIError, match="max_length"):
            gen.generate_next_token()


def test_max_length_defaults_to_the_config(models):
    params = mg.GeneratorParams(models("llama", "fp32"))
    assert params.get_search_options()["max_length"] == md.SIZES["tiny"]["context"]


# --------------------------------------------------------------------------- KV cache


def test_kv_cache_is_allocated_once_and_written_in_place(models, prompt):
    model = models("qwen2", "fp32")
    params = mg.GeneratorParams(model)
    max_length = len(prompt) + 48
    params.set_search_options(max_length=max_length, min_length=max_length)
    gen = mg.Generator(model, params)
    assert model.io.share_buffer
    cache = gen.kv_cache
    layers = len(model.io.layers)
    assert len(cache) == layers == md.SIZES["tiny"]["layers"]
    shape = (1, md.SIZES["tiny"]["kv_heads"], max_length, md.SIZES["tiny"]["hidden"] // md.SIZES["tiny"]["heads"])
    identity = [(id(k), k.ctypes.data, id(v), v.ctypes.data) for k, v in cache]
    assert all(k.shape == shape and v.shape == shape for k, v in cache)
    gen.append_tokens(prompt)
    steps = 0
    while not gen.is_done():
        gen.generate_next_token()
        steps += 1
        assert gen.kv_cache is cache
        assert [(id(k), k.ctypes.data, id(v), v.ctypes.data) for k, v in gen.kv_cache] == identity
        assert all(k.shape == shape and v.shape == shape for k, v in gen.kv_cache)
        present = gen.get_output("present.0.key")  # the run's present output is the cache array itself
        assert np.shares_memory(present, cache[0][0])
    assert steps == 48
    # positions [0, length - 1) hold computed keys (the last token is never run), the rest is untouched
    filled = len(prompt) + 48 - 1
    k = cache[0][0]
    assert np.abs(k[0, :, :filled]).min(axis=-1).max() > 0
    assert not k[0, :, filled:].any()
    # the bytes: layers x (key, value) x batch x kv_heads x max_length x head_size x 4
    assert sum(k.nbytes + v.nbytes for k, v in cache) == layers * 2 * int(np.prod(shape)) * 4


def test_torch_export_feeds_the_cache_back(models, prompt):
    model = models("llama", "torch")
    assert not model.io.share_buffer and model.io.position_ids
    tokens, _, gen = generate(mg, model, prompt, 12)
    assert gen.kv_cache is None
    assert gen.past[0][0][0].shape[2] == len(prompt) + 12 - 1


# --------------------------------------------------------------------------- continuation, rewind, batch


def _second_turn(lib, folder, prompt, more) -> list:
    """The sequence of a generator that ran ``prompt`` to its EOS, then ``more`` and up to 12 tokens."""
    model = lib.Model(folder)
    params = lib.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + 60)
    gen = lib.Generator(model, params)
    gen.append_tokens(prompt)
    while not gen.is_done():
        gen.generate_next_token()
    gen.append_tokens(more)
    steps = 0
    while not gen.is_done() and steps < 12:
        gen.generate_next_token()
        steps += 1
    return list(gen.get_sequence(0))


def test_a_second_turn_after_eos_continues_like_onnxruntime_genai(decoders, prompt, tmp_path):
    """A chat's second turn: the reply ended with an EOS (not appended), then the next message is
    appended to the same generator: its KV cache continues.  (The random test model's tokenizer is
    trained on docs/, so which message makes it say something before its EOS again changes with the
    docs: the first of a few messages that does is compared.  On the fp32 model: the int4 one's
    continuation met a near-tie with the docs of 2026-12-06 (its two best logits 2.0610 / 2.0575 at one
    step, whose order our int4 products and onnxruntime-genai's round apart), which says nothing about the
    cache; the int4 model's own agreement with onnxruntime-genai is tested on first turns.)"""
    folder = decoders[("llama", "fp32")]
    free, _, _ = generate(mg, mg.Model(_with_eos(folder, [511], tmp_path)), prompt, max_length=len(prompt) + 40)
    stop = _first_new(free, prompt, 6)
    eos_folder = _with_eos(folder, [stop], tmp_path)
    for more in ([300, 301, 302, 303, 60, 61], [120, 121, 122, 40], [7, 8, 9, 10, 11], [450, 12, 200]):
        more = np.array(more, np.int32)
        a, b = (_second_turn(lib, eos_folder, prompt, more) for lib in (mg, lib_of("ort")))
        assert a == b, more
        if len(a) > len(prompt) + free.index(stop) + len(more):
            return
    pytest.fail("no second message made the model generate before its EOS: nothing of the continuation compared")


def test_append_after_an_unfinished_reply_feeds_the_last_token(models, prompt):
    """Appending before the reply ended: the last generated token (never run yet) is run with the new
    ones, so the cache has no hole (onnxruntime-genai runs the new tokens only: docs/genai.md)."""
    model = models("llama", "fp32")
    params = mg.GeneratorParams(model)
    params.set_search_options(max_length=80, min_length=80)
    gen = mg.Generator(model, params)
    gen.append_tokens(prompt)
    for _ in range(5):
        gen.generate_next_token()
    more = [300, 301, 302]
    gen.append_tokens(more)
    gen.generate_next_token()
    whole = list(gen.get_sequence(0))
    ref = mg.Generator(model, params)
    ref.append_tokens(whole[:-1])
    ref.generate_next_token()
    assert list(ref.get_sequence(0)) == whole


def test_rewind_then_generate_again(models, prompt):
    model = models("phi3", "fp32")
    params = mg.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + 40, min_length=len(prompt) + 40)
    gen = mg.Generator(model, params)
    gen.append_tokens(prompt)
    first = []
    for _ in range(20):
        gen.generate_next_token()
        first.append(int(gen.get_next_tokens()[0]))
    gen.rewind_to(len(prompt) + 5)
    assert gen.token_count() == len(prompt) + 5
    again = []
    for _ in range(15):
        gen.generate_next_token()
        again.append(int(gen.get_next_tokens()[0]))
    assert again == first[5:20]
    gen.rewind_to(0)
    gen.append_tokens(prompt)
    gen.generate_next_token()
    assert int(gen.get_next_tokens()[0]) == first[0]
    with pytest.raises(mg.GenAIError, match="greater"):
        gen.rewind_to(10_000)


def test_batch_rows_match_single_runs(models):
    model = models("gemma", "fp32")
    tok = mg.Tokenizer(model)
    texts = ["The builder checks an ONNX model and turns it into one compact artifact", "minirt runs it"]
    prompts = [tok.encode(t) for t in texts]
    params = mg.GeneratorParams(model)
    params.set_search_options(batch_size=2, max_length=60, min_length=60)
    gen = mg.Generator(model, params)
    gen.append_tokens(tok.encode_batch(texts))  # (left-padded: the pad ids are dropped)
    while not gen.is_done():
        gen.generate_next_token()
    for i, p in enumerate(prompts):
        single, _, g1 = generate(mg, model, p, max_length=60, min_length=60)
        assert list(gen.get_sequence(i)) == list(g1.get_sequence(0))


def test_batch_of_equal_prompts_matches_onnxruntime_genai(models, prompt):
    batch = np.stack([prompt, prompt[::-1].copy()])
    batch[1, 0] = md.BOS_ID
    seqs = {}
    for lib, model in ((mg, models("llama", "fp32")), (lib_of("ort"), models("llama", "fp32", "ort"))):
        params = lib.GeneratorParams(model)
        params.set_search_options(batch_size=2, max_length=len(prompt) + 30, min_length=len(prompt) + 30)
        gen = lib.Generator(model, params)
        gen.append_tokens(batch)
        while not gen.is_done():
            gen.generate_next_token()
        seqs[lib.__name__] = [list(gen.get_sequence(i)) for i in range(2)]
    a, b = seqs.values()
    assert a == b


# --------------------------------------------------------------------------- model files


def test_model_opens_its_mrt_and_a_lone_mrt(models, prompt, tmp_path):
    model = models("llama", "int4")
    ref, _, _ = generate(mg, model, prompt, 20)
    same = mg.Model(model.artifact_path)  # (its folder's genai_config.json, found from the .mrt's parent)
    lone = tmp_path / "model.mrt"
    shutil.copy(model.artifact_path, lone)
    alone = mg.Model(str(lone))  # no genai_config.json: names and sizes read from the model
    assert alone.vocab_size == md.SIZES["tiny"]["vocab"] and alone.io.share_buffer
    assert alone.config.context_length == md.SIZES["tiny"]["context"]  # (the rotary cache's positions)
    assert alone.config.eos_token_ids == []  # (no tokenizer files beside it)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(model.path, name), tmp_path / name)
    with_tokenizer = mg.Model(str(lone))  # (still no genai_config.json: only the EOS ids come from its files)
    assert with_tokenizer.config.eos_token_ids == [md.EOS_ID]
    # The same tokens as the folder's model, both knowing EOS (min_length keeps it out of both). Without
    # the tokenizer files the lone model does not know EOS, so it may pick it where the folder's model takes
    # the next best: whether this random model's argmax ever is EOS depended on the prompt's ids, which come
    # from a tokenizer trained on docs/ and README.md (a README edit made it so).
    assert generate(mg, with_tokenizer, prompt, 20)[0] == ref


def test_decoder_filename_may_name_an_mrt(models, decoders, prompt, tmp_path):
    model = models("qwen2", "int4")
    folder = tmp_path / "qwen2-mrt"
    folder.mkdir()
    for name in ("genai_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(decoders[("qwen2", "int4")], name), folder / name)
    shutil.copy(model.artifact_path, folder / "decoder.mrt")
    cfg = json.loads((folder / "genai_config.json").read_text())
    cfg["model"]["decoder"]["filename"] = "decoder.mrt"
    (folder / "genai_config.json").write_text(json.dumps(cfg))
    other = mg.Model(str(folder))
    assert other.artifact_path == str(folder / "decoder.mrt")
    assert generate(mg, other, prompt, 16)[0] == generate(mg, model, prompt, 16)[0]


def test_a_sibling_mrt_built_from_the_onnx_is_used(decoders, tmp_path):
    src = decoders[("phi3", "fp32")]
    folder = tmp_path / "phi3"
    shutil.copytree(src, folder, ignore=shutil.ignore_patterns(".minirt"))
    from minirt.builder import build

    build(str(folder / "model.onnx"), str(folder / "model.mrt"))
    model = mg.Model(str(folder))
    assert model.artifact_path == str(folder / "model.mrt")
    assert not (folder / ".minirt").exists()


# --------------------------------------------------------------------------- errors


def test_missing_genai_config(tmp_path):
    with pytest.raises(mg.MissingConfig, match="no genai_config.json") as info:
        mg.Model(str(tmp_path))
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, minirt.Error)
    with pytest.raises(mg.MissingConfig, match="no such model folder"):
        mg.Model(str(tmp_path / "nope"))


def test_prompt_longer_than_max_length(models, prompt):
    model = models("llama", "fp32")
    params = mg.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) - 1)
    gen = mg.Generator(model, params)
    with pytest.raises(mg.GenAIError, match=r"input_ids size \(\d+\) \+ current sequence length \(0\) exceeds max "
                                            r"length \(\d+\)"):
        gen.append_tokens(prompt)


@pytest.mark.parametrize("options,match", [
    ({"top_kk": 5}, r"unknown search option\(s\) \['top_kk'\]"),
    ({"top_k": "5"}, "top_k must be an integer"),
    ({"temperature": None}, "temperature must be a number"),
])
def test_bad_search_options(models, options, match):
    params = mg.GeneratorParams(models("llama", "fp32"))
    with pytest.raises(mg.InvalidSearchOption, match=match) as info:
        params.set_search_options(**options)
    assert isinstance(info.value, RuntimeError)


@pytest.mark.parametrize("options,match", [
    ({"max_length": 100_000}, r"max_length \(100000\) cannot be greater than the model's context_length \(512\)"),
    ({"num_beams": 2}, "beam search is not supported"),
    ({"do_sample": True, "top_p": 1.5}, "top_p must be between"),
    ({"do_sample": True, "top_k": 100_000}, "top_k .* vocab_size"),
    ({"batch_size": 0}, "batch_size"),
])
def test_options_checked_at_generator_creation(models, options, match):
    model = models("llama", "fp32")
    params = mg.GeneratorParams(model)
    params.set_search_options(**options)
    with pytest.raises(mg.GenAIError, match=match):
        mg.Generator(model, params)


def test_bad_tokens(models, prompt):
    model = models("llama", "fp32")
    gen = mg.Generator(model, mg.GeneratorParams(model))
    with pytest.raises(mg.GenAIError, match="call append_tokens first"):
        gen.generate_next_token()
    with pytest.raises(mg.GenAIError, match="empty"):
        gen.append_tokens([])
    with pytest.raises(mg.GenAIError, match="outside the vocabulary"):
        gen.append_tokens([1, 2, 100_000])
    with pytest.raises(mg.GenAIError, match="integers"):
        gen.append_tokens([1.5])


def test_unknown_model_inputs_are_named(tmp_path, decoders):
    folder = tmp_path / "m"
    shutil.copytree(decoders[("llama", "fp32")], folder, ignore=shutil.ignore_patterns(".minirt"))
    cfg = json.loads((folder / "genai_config.json").read_text())
    cfg["model"]["decoder"]["inputs"]["input_ids"] = "tokens"
    (folder / "genai_config.json").write_text(json.dumps(cfg))
    with pytest.raises(mg.ConfigError, match="no input 'tokens'"):
        mg.Model(str(folder))


# --------------------------------------------------------------------------- tokenizer


def test_tokenizer_round_trip_and_stream(models):
    tok = mg.Tokenizer(models("llama", "fp32"))
    text = "minirt läuft auf dem Pi: 4-bit Gewichte, KV-Cache — schnell ✓ 🍓"
    ids = tok.encode(text)
    assert ids.dtype == np.int32 and tok.bos_token_id == md.BOS_ID
    assert tok.decode(np.concatenate([[md.BOS_ID], ids])) == text  # (special tokens are dropped)
    stream = tok.create_stream()
    pieces = [stream.decode(t) for t in [md.BOS_ID, *ids]]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)  # (multi-byte characters come out whole)
    assert list(tok.eos_token_ids) == [md.EOS_ID] and tok.pad_token_id == md.EOS_ID
    assert tok.to_token_id("<|user|>") == md.SPECIAL.index("<|user|>")
    batch = tok.encode_batch(["a b c d e f", "a"])
    assert batch.shape[0] == 2 and batch[1, 0] == tok.pad_token_id and batch[1, -1] == tok.encode("a")[-1]
    assert tok.decode_batch(batch) == ["a b c d e f", "a"]


def test_tokenizer_agrees_with_onnxruntime_genai(models):
    ours, theirs = mg.Tokenizer(models("llama", "fp32")), lib_of("ort").Tokenizer(models("llama", "fp32", "ort"))
    texts = ["The builder checks an ONNX model", "minirt läuft auf dem Pi: 4-bit ✓ 🍓",
             "<|user|>What is minirt?<|end|><|assistant|>", "  two  spaces\nnewline\ttab"]
    for text in texts:
        ids = ours.encode(text)
        assert list(ids) == list(theirs.encode(text)), text
        assert ours.decode(ids) == theirs.decode(ids)
    ids = ours.encode(texts[1])
    a, b = ours.create_stream(), theirs.create_stream()
    assert "".join(a.decode(t) for t in ids) == "".join(b.decode(t) for t in ids) == texts[1]


def test_chat_template(models):
    tok = mg.Tokenizer(models("llama", "fp32"))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(json.dumps(messages), add_generation_prompt=True)
    assert text == "<|system|>Be brief.<|end|><|user|>Hi<|end|><|assistant|>"
    assert tok.apply_chat_template(messages, template_str="{{ messages[0]['content'] }}") == "Be brief."


def test_importing_minirt_genai_imports_no_tokenizer_or_onnx():
    code = ("import sys, minirt, minirt.genai\n"
            "bad = [m for m in ('tokenizers', 'onnx', 'onnxruntime', 'onnxruntime_genai', 'jinja2', 'torch',"
            " 'transformers', 'minirt.builder') if m in sys.modules]\n"
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- onnxruntime-genai scripts


SCRIPT = '''
import sys
import {module} as og

model = og.Model(sys.argv[1])
tokenizer = og.Tokenizer(model)
stream = tokenizer.create_stream()
search_options = {{"max_length": 48, "min_length": 48, "do_sample": False, "batch_size": 1}}
params = og.GeneratorParams(model)
params.set_search_options(**search_options)
generator = og.Generator(model, params)
messages = '[{{"role": "user", "content": "What is minirt?"}}]'
prompt = tokenizer.apply_chat_template(messages=messages, add_generation_prompt=True)
input_tokens = tokenizer.encode(prompt)
generator.append_tokens(input_tokens)
text = ""
while not generator.is_done():
    generator.generate_next_token()
    new_token = generator.get_next_tokens()[0]
    text += stream.decode(new_token)
print(list(generator.get_sequence(0)))
print(generator.token_count())
'''


def test_an_onnxruntime_genai_script_runs_with_one_import_changed(decoders, tmp_path):
    folder = decoders[("llama", "int4")]
    outputs = {}
    for module in ("onnxruntime_genai", "minirt.genai"):
        path = tmp_path / f"qa_{module.replace('.', '_')}.py"
        path.write_text(SCRIPT.format(module=module))
        proc = subprocess.run([sys.executable, str(path), folder], capture_output=True, text=True, timeout=300,
                              cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
        assert proc.returncode == 0, proc.stderr
        outputs[module] = proc.stdout.splitlines()[-2:]
    assert outputs["minirt.genai"] == outputs["onnxruntime_genai"]
    assert outputs["minirt.genai"][1] == "48"
